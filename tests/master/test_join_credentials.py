"""A join credential enrolls exactly one server (docs/design/security.md#R10), and a master
renews only its own certificate (#R11): the rules (`cert_issuer`), the record in sys.catalog
(never rewritten, across snapshot/restore) and its purge by the leader's security step.

`FakeRaft` (tests/helpers/sys_catalog.py) applies proposals straight to a real
`SysCatalogState`; the integration tests (tests/integration/test_join_single_use.py) run the
same through real masters and a failover."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from cryptography import x509

from service.common.errors import FailedPrecondition, PermissionDenied
from service.common.pki import CertificateAuthority, Identity, new_request
from service.master.catalog_records import (
    CatalogWrite,
    CertAuthorityRecord,
    JoinCredentialUseRecord,
    Upsert,
)
from service.master.cert_issuer import (
    LIMITS,
    CertIssuer,
    check_request,
    join_use,
    join_use_purge_write,
    join_use_write,
)
from service.master.security import ensure_security
from service.master.sys_catalog import SysCatalogState
from tests.helpers.sys_catalog import FakeRaft

HOUR_US = 3600 * 1_000_000
MASTER = Identity("master", "master-127.0.0.1-7051")


def _none(_: str) -> bool:
    return False


def _join_cert(ca: CertificateAuthority, hours: float = 1) -> bytes:
    cert, _ = ca.issue("join", "join-1", validity=dt.timedelta(hours=hours))
    return cert


def _issuer() -> tuple[CertIssuer, FakeRaft, CertificateAuthority]:
    ca = CertificateAuthority.create()
    raft = FakeRaft(SysCatalogState())
    issuer = CertIssuer(raft.state, ca.cert_pem, raft, ca)
    return issuer, raft, ca


# --- a master renews only its own certificate --------------------------------------------------


def test_a_master_may_sign_only_its_own_master_certificate() -> None:
    days = LIMITS["master"][1] // 86_400
    assert check_request(MASTER, "master", MASTER.name, 0, _none) == dt.timedelta(days=days)
    with pytest.raises(PermissionDenied, match="only its own"):
        check_request(MASTER, "master", "master-other", 0, _none)
    with pytest.raises(PermissionDenied, match="provisioning"):
        check_request(Identity("admin", "root"), "master", MASTER.name, 0, _none)
    with pytest.raises(PermissionDenied, match="provisioning"):
        check_request(Identity("tserver", "ts-1"), "master", "ts-1", 0, _none)


def test_renew_own_signs_with_the_provisioned_ca_until_sys_catalog_holds_it() -> None:
    issuer, raft, ca = _issuer()
    _, csr = new_request()
    issued = issuer.renew_own(MASTER, csr)  # no CA stored yet: the provisioned one
    cert = x509.load_pem_x509_certificate(issued.certificate_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    life = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=364) < life <= dt.timedelta(days=365)
    # Once sys.catalog holds another CA than the one this master trusts, it signs nothing.
    other = CertificateAuthority.create()
    asyncio.run(
        ensure_security(
            raft.state,
            raft,
            1_700_000_000 * 1_000_000,
            provisioned=CertAuthorityRecord(other.cert_pem, other.key_pem),
        )
    )
    with pytest.raises(FailedPrecondition, match="not the CA"):
        issuer.renew_own(MASTER, csr)


# --- a join credential enrolls one server ----------------------------------------------------


def test_first_use_is_recorded_a_retry_passes_and_any_other_use_is_refused() -> None:
    issuer, raft, ca = _issuer()
    join = _join_cert(ca)
    _, csr = new_request()
    first = join_use(join, "ts-new", csr)
    assert not issuer.join_retry(first)
    asyncio.run(issuer.record_join_use(first, 5.0))
    row = raft.state.join_credential_use(first.credential_sha256)
    assert row is not None and row.record == first
    # The same enrollment again (a lost response): passes, nothing written.
    proposals = raft.proposals
    assert issuer.join_retry(join_use(join, "ts-new", csr))
    assert raft.proposals == proposals
    # Another uuid, or another key: refused, naming the use.
    _, other_csr = new_request()
    for use in (join_use(join, "ts-other", csr), join_use(join, "ts-new", other_csr)):
        with pytest.raises(PermissionDenied, match="already used to enroll tablet server 'ts-new'"):
            issuer.join_retry(use)
    assert raft.state.join_credential_use(first.credential_sha256) == row
    # Another join credential is another row.
    assert not issuer.join_retry(join_use(_join_cert(ca), "ts-other", other_csr))


def test_racing_enrollments_with_one_credential_the_first_committed_wins() -> None:
    issuer, raft, ca = _issuer()
    join = _join_cert(ca)
    _, csr_a = new_request()
    _, csr_b = new_request()
    a, b = join_use(join, "ts-a", csr_a), join_use(join, "ts-b", csr_b)
    # Both checked the credential unused; a commits first, then b's insert is refused at apply.
    assert not issuer.join_retry(b)
    raft.other_leader_first.append(join_use_write(a).encode())
    with pytest.raises(PermissionDenied, match="'ts-a'"):
        asyncio.run(issuer.record_join_use(b, 5.0))
    # The same race between two copies of one enrollment: both are answered.
    asyncio.run(issuer.record_join_use(a, 5.0))


def test_a_used_credentials_record_is_never_rewritten() -> None:
    issuer, raft, ca = _issuer()
    use = join_use(_join_cert(ca), "ts-new", new_request()[1])
    asyncio.run(issuer.record_join_use(use, 5.0))
    forged = JoinCredentialUseRecord(
        use.credential_sha256, "ts-evil", use.public_key_sha256, use.expire_time_us
    )
    result = raft.apply(CatalogWrite(ops=(Upsert(forged),)).encode())
    assert result.refusal is not None and "never rewritten" in result.refusal.message
    row = raft.state.join_credential_use(use.credential_sha256)
    assert row is not None and row.record == use


def test_records_survive_snapshot_restore_and_are_purged_an_hour_after_expiry() -> None:
    issuer, raft, ca = _issuer()
    use = join_use(_join_cert(ca, hours=1), "ts-new", new_request()[1])
    asyncio.run(issuer.record_join_use(use, 5.0))
    other = SysCatalogState()
    other.restore(raft.state.snapshot())
    assert [r.record for r in other.join_credential_uses()] == [use]
    # Expired, but not for longer than certificates are backdated: kept.
    rows = raft.state.join_credential_uses()
    assert join_use_purge_write(rows, use.expire_time_us + HOUR_US - 1) is None
    now = use.expire_time_us + HOUR_US
    report = asyncio.run(ensure_security(raft.state, raft, now))
    assert report.join_uses_purged == 1
    assert raft.state.join_credential_uses() == []
    assert asyncio.run(ensure_security(raft.state, raft, now)).join_uses_purged == 0
