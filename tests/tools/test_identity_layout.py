"""Each service holds only its own identity; the CA's key only where a master needs it
(docs/design/security.md#R14).

`tessera security provision` writes one directory per party (the layout docker-compose.yml
mounts, checked against the compose file in tests/test_deployment.py), and `tessera cluster up`
lays out a local cluster the same way: these tests look at the files, and at what each running
tablet server process was actually given (its command line and working directory), for any
CA key.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from service.common.errors import InvalidArgument
from service.common.pki import ClusterPki, Identity, identity_of
from service.master.master import master_uuid
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER
from service.tools import cli, local_cluster
from service.tools.local_cluster import (
    DEFAULT_MASTER_CONF,
    DEFAULT_TSERVER_CONF,
    ClusterRecord,
    ServerRecord,
    down,
    up,
)
from service.tools.security_cmd import provision

CREDENTIALS = ["ca.pem", "cert.pem", "key.pem"]


def _assert_owner_only(root: Path) -> None:
    """Directories 0700 and files 0600, `root` included."""
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def _identity(directory: Path) -> Identity:
    return identity_of((directory / "cert.pem").read_bytes())


# --- tessera security provision ------------------------------------------------------------------


def test_provision_writes_one_directory_per_party_and_the_ca_key_only_for_masters(
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    written = provision(
        pki,
        masters=["master-1:7051", "master-2:7051"],
        tservers=["tserver-1", "tserver-2"],
        admins=["admin"],
        users=["alice"],
    )
    names = ["master-1", "master-2", "tserver-1", "tserver-2", "admin", "alice"]
    assert written == [pki / n for n in names]
    assert sorted(p.name for p in pki.iterdir()) == sorted(["ca", *names])
    for m in ("master-1", "master-2"):
        assert sorted(p.name for p in (pki / m).iterdir()) == ["ca.key", *CREDENTIALS]
        assert _identity(pki / m) == Identity("master", master_uuid(f"{m}:7051"))
        assert (pki / m / "ca.key").read_bytes() == (pki / "ca" / "ca.key").read_bytes()
    for name, role in (("tserver-1", "tserver"), ("admin", "admin"), ("alice", "user")):
        assert sorted(p.name for p in (pki / name).iterdir()) == CREDENTIALS
        assert _identity(pki / name) == Identity(role, name)
    keys = sorted(str(p.relative_to(pki)) for p in pki.rglob("ca.key"))
    assert keys == ["ca/ca.key", "master-1/ca.key", "master-2/ca.key"]
    _assert_owner_only(pki)


def test_provision_is_idempotent_and_keeps_the_ca(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    provision(pki, masters=["m:7051"], tservers=["t"])
    before = {p: p.read_bytes() for p in pki.rglob("*") if p.is_file()}
    provision(pki, masters=["m:7051"], tservers=["t"])
    assert {p: p.read_bytes() for p in pki.rglob("*") if p.is_file()} == before


def test_provision_takes_the_masters_directory_names_when_they_share_a_host(
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    with pytest.raises(InvalidArgument, match="would share the directory"):
        provision(pki, masters=["10.0.0.1:7051", "10.0.0.1:7052"])
    assert not pki.exists()  # refused before anything was written
    provision(pki, masters=["m1=10.0.0.1:7051", "m2=10.0.0.1:7052"])
    assert _identity(pki / "m2") == Identity("master", master_uuid("10.0.0.1:7052"))
    assert (pki / "m2" / "ca.key").is_file()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tservers": ["ca"]}, "the CA's own"),
        ({"admins": [".."]}, "not a plain"),
        ({"masters": ["ca:7051"]}, "the CA's own"),
        ({"tservers": ["x"], "users": ["x"]}, "would share the directory"),
        ({"masters": ["nohost"]}, "expected \\[NAME=\\]HOST:PORT"),
    ],
)
def test_provision_refuses_names_that_would_mix_identities(
    tmp_path: Path, kwargs: dict[str, list[str]], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        provision(tmp_path / "pki", **kwargs)


def test_a_ca_key_left_in_a_directory_that_is_no_masters_is_removed(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    provision(pki, tservers=["t"])
    (pki / "t" / "ca.key").write_bytes((pki / "ca" / "ca.key").read_bytes())
    provision(pki, tservers=["t"])
    assert not (pki / "t" / "ca.key").exists()


def test_security_commands_print_the_layout_and_issue_refuses_the_ca_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tmp_path / "pki"
    argv = ["security", "provision", "--pki", str(pki), "--master", "m:7051", "--tserver", "t"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"credentials in {pki / 'm'} (with the CA's key: a master)" in out
    assert f"credentials in {pki / 't'}\n" in out
    assert f"the CA in {pki / 'ca'}: give this directory to no server" in out
    argv = ["security", "issue", "--pki", str(pki), "--role", "user", "--name", "bob"]
    assert cli.main([*argv, "--out", str(pki / "ca")]) != 0
    assert (pki / "ca" / "ca.key").is_file()
    assert cli.main([*argv, "--out", str(tmp_path / "bob")]) == 0
    assert sorted(p.name for p in (tmp_path / "bob").iterdir()) == CREDENTIALS


# --- tessera cluster up ----------------------------------------------------------------------


def _given(pid: int) -> list[Path]:
    """Every directory and file a server process was started with: its working directory and
    each absolute path on its command line (in `--set key=PATH` too)."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    paths = [Path(os.readlink(f"/proc/{pid}/cwd"))]
    for raw in cmdline:
        arg = raw.decode()
        value = arg.partition("=")[2] if "=" in arg else arg
        if value.startswith("/"):
            paths.append(Path(value))
    return paths


def _ca_keys_in(path: Path) -> list[Path]:
    """CA keys `path` is, or contains, or sits beside (a file's directory is given with it)."""
    where = path if path.is_dir() else path.parent
    return sorted(where.rglob("ca.key"))


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="reads /proc")
def test_cluster_up_gives_no_tablet_server_a_ca_key(tmp_path: Path) -> None:
    d = tmp_path / "cluster"
    record = None
    try:
        record = up(
            d,
            1,
            2,
            master_overrides=[f"{k}={v}" for k, v in FAST_RAFT.items()],
            tserver_overrides=[f"{k}={v}" for k, v in FAST_TSERVER.items()],
            timeout=30,
        )
        pki = d / "pki"
        assert sorted(p.name for p in pki.iterdir()) == ["ca", "master-1", "tserver-1", "tserver-2"]
        assert (pki / "ca" / "ca.key").is_file()  # the key exists: none below means something
        for ts in record.tservers:
            assert ts.pid is not None
            given = _given(ts.pid)
            own = pki / ts.name
            assert own / "key.pem" in given and Path(ts.data_dir) in given, given
            assert d not in given, "the cluster directory (the CA's parent) is no server's cwd"
            for path in given:
                assert not any(p == path or path in p.parents for p in pki.rglob("ca.key")), path
                assert _ca_keys_in(path) == [], (ts.name, path)
            assert sorted(p.name for p in own.iterdir()) == CREDENTIALS
            assert _identity(own) == Identity("tserver", ts.uuid)
        (m,) = record.masters
        assert m.pid is not None and pki / m.name / "ca.pem" in _given(m.pid)
        assert sorted(p.name for p in (pki / m.name).iterdir()) == ["ca.key", *CREDENTIALS]
        _assert_owner_only(pki)
        _assert_owner_only(d / "credentials")
    finally:
        if record is not None or (d / "cluster.json").exists():
            down(d, grace=5)


def test_a_cluster_directory_of_the_flat_layout_moves_its_ca_into_pki_ca(
    tmp_path: Path,
) -> None:
    """Clusters made before each server had its own directory kept the CA in DIR/pki itself:
    the next `up` moves it (with what it issued) to DIR/pki/ca, so the cluster keeps its CA."""
    old = ClusterPki(tmp_path / "pki")
    old.files("tserver", "ts-1")
    ca_pem = old.ca.cert_pem
    record = ClusterRecord(dir=tmp_path, master_conf="m.toml", tserver_conf="t.toml")
    pki = local_cluster._pki(record)
    assert pki.directory == tmp_path / "pki" / "ca"
    assert pki.ca.cert_pem == ca_pem
    assert sorted(p.name for p in (tmp_path / "pki").iterdir()) == ["ca"]
    assert (tmp_path / "pki" / "ca" / "tserver-ts-1.key").is_file()


def test_cluster_up_names_the_scheme_of_status_pages_by_http_auth(tmp_path: Path) -> None:
    """`up` binds status pages to loopback: plain HTTP unless `http_auth=tls` is set
    (docs/design/security.md#R13)."""
    m = ServerRecord("master-1", "master", "127.0.0.1:7051", str(tmp_path / "m"), "log")
    ts = ServerRecord("tserver-1", "tserver", "", str(tmp_path / "t"), "log")
    record = ClusterRecord(
        dir=tmp_path,
        master_conf=str(DEFAULT_MASTER_CONF),
        tserver_conf=str(DEFAULT_TSERVER_CONF),
        masters=(m,),
        tservers=(ts,),
    )
    assert local_cluster.http_scheme(record, m) == "http"
    assert local_cluster.http_scheme(record, ts) == "http"
    tls = replace(record, tserver_overrides=("http_auth=tls",))
    assert local_cluster.http_scheme(tls, ts) == "https"
    assert local_cluster.http_scheme(tls, m) == "http"
