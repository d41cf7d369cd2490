"""What a cluster is and how its masters and tablet servers are started: one command line for
the test clusters and `tessera cluster up`, managed settings first, overrides last, identity
from the launcher unless the overrides take security over, timing presets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from service.common.errors import InvalidArgument
from service.common.pki import IdentityFiles
from service.testing.cluster import Cluster, MasterCluster
from service.testing.mini_cluster import MiniCluster
from service.tools.cluster_spec import FAST_RAFT, FAST_TSERVER, MASTER_CONF, ClusterSpec
from service.tools.local_cluster import ClusterRecord, ServerRecord


def test_a_master_command_line_managed_settings_then_identity_then_timing_then_overrides(
    tmp_path: Path,
) -> None:
    spec = ClusterSpec(tmp_path, master_overrides=("raft.election_timeout_ms=900",))
    identity = IdentityFiles.in_dir(tmp_path / "id")
    args = spec.command(
        "master",
        data_dir=tmp_path / "m",
        address="127.0.0.1:7051",
        master_addresses=["127.0.0.1:7051", "127.0.0.1:7052"],
        identity=identity,
        ready=tmp_path / "m.ready",
        join=True,
    )
    assert args[:5] == [sys.executable, "-m", "service.master", "--conf", str(MASTER_CONF)]
    assert args[-2:] == ["--ready-file", str(tmp_path / "m.ready")]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert sets[:6] == [
        f"data_dir={tmp_path / 'm'}",
        "rpc_bind=127.0.0.1:7051",
        "advertised_address=127.0.0.1:7051",
        'master_addresses=["127.0.0.1:7051", "127.0.0.1:7052"]',
        "http_bind=127.0.0.1:0",
        "join_existing=true",
    ]
    assert f"security.cert_file={identity.cert_file}" in sets
    timing = [f"{k}={v}" for k, v in FAST_RAFT.items()]
    assert sets[-len(timing) - 1 :] == [*timing, "raft.election_timeout_ms=900"]  # last wins


def test_a_tablet_server_binds_port_0_until_it_has_an_address_and_insecure_says_so(
    tmp_path: Path,
) -> None:
    spec = ClusterSpec(tmp_path, security="insecure", timing="conf")
    sets = spec.settings(
        "tserver", data_dir="d", address="", master_addresses=["a:1"], identity=None
    )
    assert sets == [
        "data_dir=d",
        "rpc_bind=127.0.0.1:0",
        'master_addresses=["a:1"]',
        "http_bind=127.0.0.1:0",
        "security.mode=insecure",
    ]
    again = spec.settings(
        "tserver", data_dir="d", address="127.0.0.1:9", master_addresses=["a:1"], identity=None
    )
    assert again[1] == "rpc_bind=127.0.0.1:9"
    fast = ClusterSpec(tmp_path).settings(
        "tserver", data_dir="d", address="", master_addresses=["a:1"], identity=None
    )
    assert fast[-len(FAST_TSERVER) :] == [f"{k}={v}" for k, v in FAST_TSERVER.items()]


def test_a_test_may_override_a_managed_setting_its_override_comes_last(tmp_path: Path) -> None:
    spec = ClusterSpec(tmp_path, timing="conf", master_overrides=("http_bind=0.0.0.0:0",))
    sets = spec.settings(
        "master", data_dir="d", address="h:1", master_addresses=["h:1"], identity=None
    )
    assert sets.index("http_bind=127.0.0.1:0") < sets.index("http_bind=0.0.0.0:0") == len(sets) - 1


def test_overrides_that_set_security_take_it_over_from_the_launcher(tmp_path: Path) -> None:
    spec = ClusterSpec(tmp_path, timing="conf", tserver_overrides=("security.mode=insecure",))
    identity = IdentityFiles.in_dir(tmp_path)
    kw = {"data_dir": "d", "address": "", "master_addresses": ["a:1"], "identity": identity}
    assert spec.settings("tserver", **kw)[-1] == "security.mode=insecure"
    assert not any("cert_file" in s for s in spec.settings("tserver", **kw))
    assert any("cert_file" in s for s in spec.settings("master", **kw))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"masters": 0}, "need >= 1 master"),
        ({"tservers": -1}, "need >= 1 master"),
        ({"security": "tls"}, "security 'tls'"),
        ({"timing": "slow"}, "timing 'slow'"),
        ({"tserver_overrides": ("no-equals-sign",)}, "expected setting=value"),
    ],
)
def test_a_bad_spec_is_refused_naming_what_is_wrong(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ClusterSpec(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_mini_and_master_clusters_are_clusters_of_a_spec(tmp_path: Path) -> None:
    mini = MiniCluster(tmp_path / "mini", num_masters=1, num_tservers=2, secure=False)
    assert isinstance(mini, Cluster) and mini.pki is None
    assert (mini.spec.masters, mini.spec.tservers, mini.spec.security) == (1, 2, "insecure")
    assert list(mini.servers) == ["master-1", "ts-1", "ts-2"]
    assert list(mini.masters.masters) == ["master-1"] and list(mini.tservers) == ["ts-1", "ts-2"]
    assert mini.masters.overrides == dict(FAST_RAFT) and mini.tserver_overrides == FAST_TSERVER
    mini.tserver_overrides = {**mini.tserver_overrides, "quiesce_idle_ms": "0"}
    assert mini.spec.tserver_overrides[-1] == "quiesce_idle_ms=0"
    assert mini.credentials() is None and mini.credentials_dir() is None

    masters = MasterCluster(tmp_path / "masters", 2, overrides={}, secure=False)
    assert masters.cluster.masters is masters and masters.overrides == {}
    assert list(masters.masters) == ["master-1", "master-2"]
    first = masters.masters["master-1"]
    assert masters.by_address(first.address) is first
    assert (first.kind, first.ready) == ("master", tmp_path / "masters" / "master-1.ready")
    with pytest.raises(ValueError, match="master-1"):
        masters.add_master_slot("master-1")
    assert masters.add_master_slot("master-3").address not in masters.addresses[:2]
    assert masters.size == 3


def test_a_local_cluster_record_is_started_from_the_same_spec(tmp_path: Path) -> None:
    m = ServerRecord("master-1", "master", "127.0.0.1:7051", "d1", "l1")
    t = ServerRecord("tserver-1", "tserver", "", "d2", "l2")
    record = ClusterRecord(
        tmp_path, str(MASTER_CONF), "t.toml", ("a=1",), ("security.mode=insecure",), (m,), (t,)
    )
    spec = record.spec
    assert (spec.masters, spec.tservers, spec.timing, spec.security) == (1, 1, "conf", "insecure")
    assert (spec.master_overrides, spec.tserver_conf) == (("a=1",), Path("t.toml"))
