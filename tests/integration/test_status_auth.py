"""Status pages beyond loopback need the cluster's certificates (docs/design/security.md#R13).

A master and a tablet server whose status pages bind every interface (`0.0.0.0:0`, so the
default `http_auth = "auto"` turns TLS on) are asked for their pages the ways an outsider would:
without a certificate (403, naming nothing), with a certificate of another CA (the handshake
fails), over plain HTTP (the handshake fails); and with a user's certificate of the cluster,
which reads every page. /healthz answers anyone. Where this machine has an address other than
loopback, the pages are also fetched through it, the way another host would reach them.

The pure parts run without processes: the mode decision (bind address x `http_auth`), the
setting's validation, and an in-process server that serves a renewed certificate to the next
handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.common.config import ConfigError, MasterConfig, TServerConfig, from_mapping
from service.common.http_status import (
    PUBLIC_PATHS,
    StatusServer,
    is_loopback_bind,
    requires_client_certificates,
    status_server,
)
from service.common.metrics import MetricsRegistry
from service.common.pki import ClusterPki, IdentityFiles, identity_of
from service.common.tls import Credentials
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster
from tests.helpers.status_pages import create_table, parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "secret_payroll"
MASTER_PAGES = ("/", "/tables", "/tablets", "/tservers", "/tasks", "/metrics")
TSERVER_PAGES = ("/", "/tablets", "/tablet-copies", "/scans", "/metrics")


# --- a client that speaks HTTPS the way Prometheus does ---------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: str


def _context(ca_pem: bytes, identity: IdentityFiles | None) -> ssl.SSLContext:
    """Verify the server against the cluster CA (and its role's name); present `identity`."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    if identity is not None:
        ctx.load_cert_chain(identity.cert_file, identity.key_file)
    return ctx


def https_get(
    address: str, path: str, ctx: ssl.SSLContext, server_name: str, timeout: float = 10.0
) -> Answer:
    """GET over TLS, the server verified as `server_name` (its certificate names
    `<role>.tessera`, not an address: Prometheus's `tls_config.server_name`). Raises the
    handshake's or the connection's error when the server refuses."""
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {server_name}\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    if not data:
        raise ConnectionError("the server closed the connection without an answer")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return Answer(int(lines[0].split(" ")[1]), headers.get("content-type", ""), body.decode())


def plain_get(address: str, path: str) -> Answer:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as r:
            return Answer(r.status, r.headers["Content-Type"], r.read().decode())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.headers["Content-Type"], e.read().decode())


REFUSED = (ssl.SSLError, ConnectionError, OSError)
"""What a refused handshake raises on the client (an alert, a reset, a closed socket)."""


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (how another host reaches it)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the outgoing address
        found.add(s.getsockname()[0])
    return sorted(a for a in found if not a.startswith("127."))


# --- the cluster -----------------------------------------------------------------------------


@dataclass
class Setup:
    cluster: MiniCluster
    master: str
    """The master's status address (as its ready file says: 127.0.0.1:<port>)."""
    tserver: str
    tserver_uuid: str
    tablet_ids: list[str]
    ca_pem: bytes
    user: IdentityFiles
    foreign: IdentityFiles
    """An admin identity of another CA."""


@pytest.fixture(scope="module")
def s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base: Path = tmp_path_factory.mktemp("status-auth")
    everywhere = {"http_bind": "0.0.0.0:0"}  # http_auth stays "auto": TLS, as not loopback
    with MiniCluster(
        base,
        num_masters=1,
        num_tservers=1,
        master_overrides={**FAST_RAFT, **everywhere},
        tserver_overrides={**FAST_TSERVER, **everywhere},
    ) as cluster:
        _, _, locs = create_table(cluster, TABLE, buckets=2, replicas=1)
        (m,) = cluster.masters.masters.values()
        (ts,) = cluster.tservers.values()
        user_dir = cluster.credentials_dir("user", "reader")
        assert user_dir is not None
        other = ClusterPki(base / "other-ca")
        foreign = other.export("admin", "admin", base / "foreign-admin")
        yield Setup(
            cluster,
            m.http_address,
            ts.http_address,
            ts.uuid,
            [t.tablet_id for t in locs.tablet_locations],
            IdentityFiles.in_dir(Path(user_dir)).ca_file.read_bytes(),
            IdentityFiles.in_dir(Path(user_dir)),
            foreign,
        )


def _targets(s: Setup) -> list[tuple[str, str, tuple[str, ...]]]:
    """(status address, server name, pages) of the master and the tablet server."""
    return [
        (s.master, "master.tessera", MASTER_PAGES),
        (s.tserver, "tserver.tessera", TSERVER_PAGES),
    ]


def _secrets(s: Setup) -> list[str]:
    return [TABLE, s.tserver_uuid, *s.tablet_ids]


def test_a_wildcard_bind_serves_tls_and_a_user_certificate_reads_every_page(s: Setup) -> None:
    ctx = _context(s.ca_pem, s.user)
    for address, name, pages in _targets(s):
        for path in pages:
            a = https_get(address, path, ctx, name)
            assert a.status == 200, (address, path, a.body[:300])
    tables = https_get(s.master, "/tables", ctx, "master.tessera").body
    assert TABLE in tables
    tablets = https_get(s.master, "/tablets", ctx, "master.tessera").body
    assert all(t in tablets for t in s.tablet_ids)
    # The master's page links the tablet server's pages with its own scheme.
    tservers = https_get(s.master, "/tservers", ctx, "master.tessera").body
    assert f'href="https://{s.tserver}/"' in tservers
    hosted = https_get(s.tserver, "/tablets", ctx, "tserver.tessera").body
    assert all(t in hosted for t in s.tablet_ids)
    for address, name, _ in _targets(s):
        metrics = https_get(address, "/metrics", ctx, name)
        assert metrics.content_type.startswith("text/plain; version=0.0.4")
        assert "tessera_raft_term" in parse_metrics(metrics.body)


def test_without_a_certificate_every_page_but_healthz_is_refused_naming_nothing(
    s: Setup,
) -> None:
    anonymous = _context(s.ca_pem, None)
    for address, name, pages in _targets(s):
        for path in (*pages, "/no-such-page", "/tablets?table=x"):
            a = https_get(address, path, anonymous, name)
            assert a.status == 403, (address, path, a.status)
            assert a.content_type.startswith("text/plain")
            assert "client certificate" in a.body
            for secret in _secrets(s):
                assert secret not in a.body, (path, secret)
            assert "tessera_" not in a.body


def test_a_certificate_of_another_ca_fails_the_handshake(s: Setup) -> None:
    foreign = _context(s.ca_pem, s.foreign)
    for address, name, _ in _targets(s):
        for path in ("/tables", "/tablets", "/metrics"):
            with pytest.raises(REFUSED):
                https_get(address, path, foreign, name)


def test_plain_http_gets_nothing(s: Setup) -> None:
    for address, _, _ in _targets(s):
        for path in ("/tables", "/tablets", "/metrics", "/healthz"):
            with pytest.raises(REFUSED):
                plain_get(address, path)


def test_healthz_answers_anyone_who_speaks_tls(s: Setup) -> None:
    assert frozenset({"/healthz"}) == PUBLIC_PATHS
    for address, name, _ in _targets(s):
        for ctx in (_context(s.ca_pem, None), _context(s.ca_pem, s.user)):
            a = https_get(address, "/healthz", ctx, name)
            assert (a.status, a.body) == (200, "ok\n")
        # A prober that does not verify the server (a load balancer) is answered too.
        blind = ssl.create_default_context()
        blind.check_hostname = False
        blind.verify_mode = ssl.CERT_NONE
        assert https_get(address, "/healthz", blind, name).status == 200
        assert https_get(address, "/tables", blind, name).status == 403


def test_through_a_non_loopback_address_the_same_rules_hold(s: Setup) -> None:
    others = _other_addresses()
    if not others:
        pytest.skip("this machine has no address but loopback")
    user, anonymous = _context(s.ca_pem, s.user), _context(s.ca_pem, None)
    for ip in others:
        for address, name, _ in _targets(s):
            port = address.rpartition(":")[2]
            there = f"{ip}:{port}"
            assert https_get(there, "/tables", anonymous, name).status == 403
            assert https_get(there, "/metrics", anonymous, name).status == 403
            assert https_get(there, "/healthz", anonymous, name).status == 200
            assert https_get(there, "/tablets", user, name).status == 200
            with pytest.raises(REFUSED):
                https_get(there, "/tables", _context(s.ca_pem, s.foreign), name)


def test_the_servers_log_their_https_pages_and_no_refusal_as_an_error(s: Setup) -> None:
    (m,) = s.cluster.masters.masters.values()
    (ts,) = s.cluster.tservers.values()
    for log in (m.log.read_text(), ts.log.read_text()):
        assert "status pages https://127.0.0.1:" in log
        assert "Traceback" not in log


# --- the mode decision and the setting (no processes) -----------------------------------------


@pytest.mark.parametrize(
    ("bind", "auth", "tls"),
    [
        ("127.0.0.1:8051", "auto", False),
        ("127.1.2.3:0", "auto", False),
        ("localhost:8050", "auto", False),
        ("[::1]:8050", "auto", False),
        ("0.0.0.0:8051", "auto", True),
        ("[::]:8051", "auto", True),
        ("192.0.2.7:8051", "auto", True),
        ("master-1:8051", "auto", True),  # a name may resolve anywhere
        ("127.0.0.1:8051", "tls", True),
        ("0.0.0.0:8051", "tls", True),
        ("0.0.0.0:8051", "none", False),
        ("127.0.0.1:8051", "none", False),
    ],
)
def test_which_binds_need_client_certificates(bind: str, auth: str, tls: bool) -> None:
    assert requires_client_certificates(bind, auth) is tls


def test_loopback_binds() -> None:
    assert is_loopback_bind("127.0.0.1:1") and is_loopback_bind("LOCALHOST:1")
    assert not is_loopback_bind("0.0.0.0:1") and not is_loopback_bind("10.0.0.1:1")


def test_an_unknown_mode_is_refused_by_the_decision_too() -> None:
    with pytest.raises(Exception, match="http_auth: expected one of 'auto', 'tls', 'none'"):
        requires_client_certificates("0.0.0.0:1", "TLS")


@pytest.mark.parametrize("cls", [MasterConfig, TServerConfig])
def test_http_auth_setting_is_validated_naming_it(cls: type[MasterConfig | TServerConfig]) -> None:
    ok = from_mapping(cls, {"data_dir": "/d"})
    assert ok.http_auth == "auto"
    for value in ("auto", "tls", "none"):
        from_mapping(cls, {"data_dir": "/d", "http_auth": value}).validate()
    with pytest.raises(ConfigError) as bad:
        from_mapping(cls, {"data_dir": "/d", "http_auth": "mtls"}).validate()
    assert bad.value.key == "http_auth"
    assert str(bad.value.message).startswith("http_auth: expected one of 'auto', 'tls', 'none'")
    assert "'mtls'" in bad.value.message
    insecure = {"data_dir": "/d", "http_auth": "tls", "security": {"mode": "insecure"}}
    with pytest.raises(ConfigError, match=r"http_auth: 'tls' needs security\.mode = 'secure'"):
        from_mapping(cls, insecure).validate()
    # "auto" off loopback with an insecure server is allowed: it serves plain HTTP and warns.
    loose = {"data_dir": "/d", "http_bind": "0.0.0.0:0", "security": {"mode": "insecure"}}
    from_mapping(cls, loose).validate()


# --- in-process: renewal and the insecure fallback --------------------------------------------


def test_a_renewed_certificate_is_served_to_the_next_handshake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = ClusterPki(tmp_path / "pki")
    first = Credentials.from_files(pki.files("master", "m-1"))
    current = [first]
    user = pki.export("user", "u", tmp_path / "user")

    async def main() -> None:
        http = StatusServer("127.0.0.1:0", MetricsRegistry(), title="t", tls=lambda: current[0])
        await http.start()
        try:
            ctx = _context(first.ca_pem, user)

            def served_cert() -> bytes:
                host, _, port = http.address.rpartition(":")
                with (
                    socket.create_connection((host, int(port)), timeout=5) as raw,
                    ctx.wrap_socket(raw, server_hostname="master.tessera") as tls,
                ):
                    der = tls.getpeercert(binary_form=True)
                    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    while tls.recv(65536):
                        pass
                assert der is not None
                return ssl.DER_cert_to_PEM_cert(der).encode()

            assert identity_of(await asyncio.to_thread(served_cert)).name == "m-1"
            cert, key = pki.ca.issue("master", "m-1-renewed")
            current[0] = Credentials.from_pems(first.ca_pem, cert, key)
            assert identity_of(await asyncio.to_thread(served_cert)).name == "m-1-renewed"
            # A certificate whose key does not fit is not served: the last good pair stays.
            bad_cert, _ = pki.ca.issue("master", "m-1-broken")
            current[0] = Credentials.from_pems(first.ca_pem, bad_cert, first.key_pem)
            assert identity_of(await asyncio.to_thread(served_cert)).name == "m-1-renewed"
            assert identity_of(await asyncio.to_thread(served_cert)).name == "m-1-renewed"
            assert http.scheme == "https"
            refused = http.refused

            def anonymous_page() -> int:
                return https_get(
                    http.address, "/metrics", _context(first.ca_pem, None), "master.tessera"
                ).status

            assert await asyncio.to_thread(anonymous_page) == 403
            assert http.refused == refused + 1
        finally:
            await http.aclose()

    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert caplog.text.count("cannot serve the renewed certificate") == 1


def test_an_insecure_server_off_loopback_serves_plain_http_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        http = status_server("0.0.0.0:0", "auto", MetricsRegistry(), title="t", credentials=None)
        assert http.scheme == "http"
        await http.start()
        try:
            status = await asyncio.to_thread(
                lambda: plain_get(f"127.0.0.1:{http.port}", "/healthz").status
            )
            assert status == 200
        finally:
            await http.aclose()

    with caplog.at_level("WARNING"):
        asyncio.run(main())
    assert "served without authentication: security.mode is 'insecure'" in caplog.text
