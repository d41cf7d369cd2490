"""Certificates bind (role, name); policies decide by them, default deny. Pure parts: no
sockets (a fake servicer context stands in for a TLS connection's auth context)."""

from __future__ import annotations

import datetime as dt
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from service.common.authz import ADMIN, ANYONE, Authorizer, allow
from service.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from service.common.pki import (
    CertificateAuthority,
    ClusterPki,
    Identity,
    IdentityFiles,
    identity_of,
)
from service.common.tls import INSECURE_PEER, Credentials, SecuritySettings, peer_identity


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


class FakeContext:
    def __init__(self, pem: bytes | None) -> None:
        self.pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self.pem]} if self.pem else {}


def test_a_certificate_binds_role_and_name(ca: CertificateAuthority) -> None:
    cert, _key = ca.issue("tserver", "ts-1")
    assert identity_of(cert) == Identity("tserver", "ts-1")
    parsed = x509.load_pem_x509_certificate(cert)
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"tessera", "tserver.tessera"}
    assert parsed.issuer == x509.load_pem_x509_certificate(ca.cert_pem).subject
    user, _ = ca.issue("user", "alice")
    assert identity_of(user) == Identity("user", "alice")
    with pytest.raises(x509.ExtensionNotFound):  # people get no server names
        x509.load_pem_x509_certificate(user).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
    with pytest.raises(InvalidArgument, match="role"):
        ca.issue("root", "x")
    with pytest.raises(InvalidArgument, match="name"):
        ca.issue("user", "a,b")
    with pytest.raises(InvalidArgument, match="certificate"):
        identity_of(b"not a cert")
    assert "key" not in repr(ca)


def test_cluster_pki_is_idempotent_and_owner_only(tmp_path: Path) -> None:
    pki = ClusterPki(tmp_path / "pki")
    first = pki.files("master", "m-1")
    again = ClusterPki(tmp_path / "pki").files("master", "m-1")
    assert first.cert_file.read_bytes() == again.cert_file.read_bytes()
    for p in (first.key_file, first.cert_file, tmp_path / "pki" / "ca.key"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE((tmp_path / "pki").stat().st_mode) == 0o700
    creds = Credentials.from_files(pki.export("admin", "root", tmp_path / "creds"))
    assert creds.identity == Identity("admin", "root")
    os.chmod(tmp_path / "creds" / "key.pem", 0o640)
    with pytest.raises(InvalidArgument, match="chmod 600"):
        Credentials.from_files(IdentityFiles.in_dir(tmp_path / "creds"))


def test_settings_default_to_the_data_dir_and_name_missing_files(tmp_path: Path) -> None:
    SecuritySettings(mode="insecure").validate()
    SecuritySettings().validate()  # secure is the default; files default under data_dir
    with pytest.raises(InvalidArgument, match=r"security\.mode"):
        SecuritySettings(mode="tls").validate()
    assert Credentials.load(SecuritySettings(mode="insecure"), tmp_path) is None
    files = SecuritySettings().files(tmp_path)
    assert files.cert_file == tmp_path / "credentials" / "cert.pem"
    with pytest.raises(InvalidArgument, match=r"credentials/key\.pem.*tessera security provision"):
        Credentials.load(SecuritySettings(), tmp_path)
    ClusterPki(tmp_path / "pki").export("master", "m-1", tmp_path / "credentials")
    creds = Credentials.load(SecuritySettings(), tmp_path)
    assert creds is not None and creds.identity == Identity("master", "m-1")


def test_authorizer_default_deny_roles_and_request_checks(ca: CertificateAuthority) -> None:
    def own(req: Any, who: Identity) -> str | None:
        return None if req == who.name else f"the request is for {req!r}"

    policy = {"Ddl": ADMIN, "Read": ANYONE, "Beat": allow("tserver", check=own)}
    authz = Authorizer(policy, secure=True)

    def ctx(role: str, name: str) -> Any:
        return FakeContext(ca.issue(role, name)[0])

    authz.check("Ddl", None, ctx("admin", "root"))
    authz.check("Read", None, ctx("user", "alice"))
    authz.check("Beat", "ts-1", ctx("tserver", "ts-1"))
    with pytest.raises(PermissionDenied, match=r"Ddl: user 'alice' may not call it; .*admin"):
        authz.check("Ddl", None, ctx("user", "alice"))
    with pytest.raises(PermissionDenied, match="the request is for 'ts-2'"):
        authz.check("Beat", "ts-2", ctx("tserver", "ts-1"))
    with pytest.raises(PermissionDenied, match="no rule; default deny"):
        authz.check("Unlisted", None, ctx("admin", "root"))
    with pytest.raises(Unauthenticated):
        authz.check("Read", None, FakeContext(None))
    # Insecure: everyone is INSECURE_PEER and every call passes.
    loose = Authorizer(policy, secure=False)
    loose.check("Unlisted", None, FakeContext(None))
    assert peer_identity(FakeContext(None), secure=False) is INSECURE_PEER  # type: ignore[arg-type]


def test_an_expired_certificate_is_still_parsed_but_not_valid(ca: CertificateAuthority) -> None:
    """Expiry is the TLS handshake's to enforce (tests/integration/test_security.py); the
    identity parser only reads names."""
    old, _ = ca.issue(
        "user", "old", now=dt.datetime.now(dt.UTC) - dt.timedelta(days=10),
        validity=dt.timedelta(days=1),
    )  # fmt: skip
    parsed = x509.load_pem_x509_certificate(old)
    assert parsed.not_valid_after_utc < dt.datetime.now(dt.UTC)
    assert identity_of(old) == Identity("user", "old")


def test_a_calls_identity_is_read_from_its_certificate_once(ca: CertificateAuthority) -> None:
    """Each read of the peer certificate copies the connection's auth context: the admission
    check and the handler share one read per call (each call runs in its own asyncio task)."""
    import asyncio

    class Counting(FakeContext):
        reads = 0

        def auth_context(self) -> dict[str, list[bytes]]:
            Counting.reads += 1
            return super().auth_context()

    authz = Authorizer({"M": ANYONE}, secure=True)
    alice, bob = ca.issue("user", "alice")[0], ca.issue("user", "bob")[0]

    async def call(pem: bytes) -> list[Identity]:
        ctx = Counting(pem)
        authz.check("M", object(), ctx)  # type: ignore[arg-type]
        return [authz.identity(ctx), authz.identity(ctx)]  # type: ignore[arg-type]

    async def main() -> list[list[Identity]]:
        return list(await asyncio.gather(call(alice), call(bob), call(alice)))

    got = asyncio.run(main())
    assert [who[0].name for who in got] == ["alice", "bob", "alice"]
    assert all(a == b for a, b in got) and Counting.reads == 3

    async def two_calls_one_task() -> tuple[Identity, Identity]:
        return authz.identity(Counting(alice)), authz.identity(Counting(bob))  # type: ignore[arg-type]

    assert [w.name for w in asyncio.run(two_calls_one_task())] == ["alice", "bob"]
