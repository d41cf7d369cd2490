"""Certificates the master signs: users' short-lived credentials, tablet servers that join
with a join credential, tablet servers' renewals, and a master's renewal of its own.

Theory of operation
-------------------
The cluster's CA lives in sys.catalog (`security.ensure_security` stores the CA the masters
were provisioned with), so the leader can sign. A caller sends a certificate request (a public
key with proof it holds the private half; `pki.new_request`): the key never travels, and the
identity in the certificate is decided here, never taken from the request. Who may ask for
what:

  | caller   | may get                                      | validity (default, most)   |
  |----------|----------------------------------------------|----------------------------|
  | admin    | a `user` credential                          | 1 day, 7 days              |
  | admin    | an `admin` credential                        | 1 day, 30 days             |
  | admin    | a `join` credential (enrolls ONE server)     | 1 hour, 1 day              |
  | admin    | a `tserver` certificate                      | 365 days, 365 days         |
  | join     | ONE `tserver` certificate, for a NEW uuid    | 365 days, 365 days         |
  | tserver  | its own `tserver` certificate (renewal)      | 365 days, 365 days         |
  | master   | its own `master` certificate (renewal, local)| 365 days, 365 days         |

A user credential is what other systems call an authn token: short-lived, signed by the
cluster, refused once expired, and useless when tampered with or signed by anyone else (the
TLS handshake checks all three before any RPC exists). It is a certificate rather than a bearer
string because a gRPC Python server either requires a client certificate or requests none:
with client certificates required on every port, a token without one could not connect at all.

A join credential may name only a uuid no master knows (not registered, not in any tablet's
Raft config), so it cannot mint a certificate for a server that exists, and it enrolls exactly
one server (docs/design/security.md#R10): before answering, the leader records the credential
(its certificate's SHA-256), the uuid and the enrolled key's SHA-256 in sys.catalog with a
replicated write (`record_join_use`), so a new leader refuses reuse too. A retry of the same
enrollment (same credential, uuid and key: a response lost on the way) is signed again and
writes nothing; any other use is PERMISSION_DENIED saying the credential was already used. A
record outlives its credential by `BACKDATE` (the clock skew every certificate allows) and is
then purged by the leader's periodic security step (`join_use_purge_write`), where expired
token signing keys are purged too: no extra task, and nothing to do most of the time.

Master certificates come from provisioning, and a master renews its own by signing it locally
(`renew_own`, service/master/master.py says why): with the same CA as sys.catalog and under
the rules of this table (`check_request`), never through IssueCertificate, which no master may
call and which refuses to make master certificates for anyone.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from service.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from service.common.pki import BACKDATE, CertificateAuthority, Identity, request_public_key
from service.master.catalog_manager import Replicate
from service.master.catalog_records import (
    CatalogWrite,
    Delete,
    Insert,
    JoinCredentialUseRecord,
    Precondition,
    RowOp,
    record_key,
)
from service.master.sys_catalog import Row, SysCatalogState

__all__ = [
    "LIMITS",
    "CertIssuer",
    "Issued",
    "check_request",
    "join_use",
    "join_use_purge_write",
    "join_use_write",
]

_HOUR = 3600
_DAY = 86_400

LIMITS: dict[str, tuple[int, int]] = {
    "user": (_DAY, 7 * _DAY),
    "admin": (_DAY, 30 * _DAY),
    "join": (_HOUR, _DAY),
    "tserver": (365 * _DAY, 365 * _DAY),
    "master": (365 * _DAY, 365 * _DAY),
}
"""Validity in seconds by role: (default, most)."""

_MAY_ASK = {
    "admin": frozenset({"user", "admin", "join", "tserver"}),
    "join": frozenset({"tserver"}),
    "tserver": frozenset({"tserver"}),
    "master": frozenset({"master"}),
}
_RENEWS_ONLY_ITSELF = frozenset({"tserver", "master"})


def check_request(
    caller: Identity,
    role: str,
    name: str,
    validity_s: int,
    known_server: Callable[[str], bool],
) -> datetime.timedelta:
    """The validity to sign for if `caller` may get a certificate binding (role, name)
    (module docstring); PermissionDenied or InvalidArgument naming the problem otherwise."""
    if role == "master" and caller.role != "master":
        raise PermissionDenied(
            "master certificates come from provisioning (and a master's renewal of its own), "
            "never by request"
        )
    if role not in LIMITS:
        raise InvalidArgument(f"role: expected one of {', '.join(LIMITS)}, got {role!r}")
    if role not in _MAY_ASK.get(caller.role, frozenset()):
        raise PermissionDenied(f"{caller} may not get a {role} certificate")
    if caller.role in _RENEWS_ONLY_ITSELF and name != caller.name:
        raise PermissionDenied(f"{caller} may renew only its own certificate, not {name!r}")
    if caller.role == "join" and known_server(name):
        raise PermissionDenied(
            f"{name!r} is a tablet server this cluster knows; a join credential enrolls only a "
            "new one"
        )
    default, most = LIMITS[role]
    if validity_s < 0 or validity_s > most:
        raise InvalidArgument(
            f"validity_s: a {role} certificate lives at most {most} s, got {validity_s}"
        )
    return datetime.timedelta(seconds=validity_s or default)


# --- join credentials enroll one server (module docstring) -----------------------------------

_JOIN_OPERATION = "UseJoinCredential"
_PURGE_OPERATION = "PurgeJoinCredentialUses"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def join_use(join_cert_pem: bytes, name: str, csr_der: bytes) -> JoinCredentialUseRecord:
    """The enrollment a join credential (its certificate, as the TLS handshake verified it)
    asks for: `name` for the key of `csr_der` (InvalidArgument if the request is unusable)."""
    cert = x509.load_pem_x509_certificate(join_cert_pem)
    spki = request_public_key(csr_der).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return JoinCredentialUseRecord(
        credential_sha256=_sha256(cert.public_bytes(serialization.Encoding.DER)),
        tserver_uuid=name,
        public_key_sha256=_sha256(spki),
        expire_time_us=int(cert.not_valid_after_utc.timestamp() * 1_000_000),
    )


def _check_same_enrollment(used: JoinCredentialUseRecord, asked: JoinCredentialUseRecord) -> None:
    """Nothing if `asked` repeats the recorded enrollment `used`; PermissionDenied otherwise."""
    if used.tserver_uuid != asked.tserver_uuid:
        raise PermissionDenied(
            f"this join credential was already used to enroll tablet server "
            f"{used.tserver_uuid!r}; it enrolls one server only: ask an admin for a new one "
            "(tessera token create --join)"
        )
    if used.public_key_sha256 != asked.public_key_sha256:
        raise PermissionDenied(
            f"this join credential was already used to enroll tablet server "
            f"{used.tserver_uuid!r} with another key; only a retry with the same certificate "
            "request gets a certificate again"
        )


def join_use_write(use: JoinCredentialUseRecord) -> CatalogWrite:
    """The write recording `use`, refused at apply if the credential was recorded meanwhile."""
    return CatalogWrite(
        ops=(Insert(use),),
        expected=(Precondition.absent(record_key(use)),),
        operation=_JOIN_OPERATION,
    )


def join_use_purge_write(
    rows: Iterable[Row[JoinCredentialUseRecord]], now_us: int
) -> CatalogWrite | None:
    """ONE write deleting the records of credentials expired for longer than BACKDATE at
    `now_us` (they can no longer connect, even to a master whose clock is behind by as much as
    certificates allow), each at the version read; None when there is nothing to purge."""
    slack_us = int(BACKDATE.total_seconds() * 1_000_000)
    ops: list[RowOp] = []
    expected: list[Precondition] = []
    for row in rows:
        if row.record.expire_time_us + slack_us <= now_us:
            ops.append(Delete(row.key))
            expected.append(Precondition(row.key, row.version))
    if not ops:
        return None
    return CatalogWrite(ops=tuple(ops), expected=tuple(expected), operation=_PURGE_OPERATION)


@dataclass(frozen=True)
class Issued:
    certificate_pem: bytes
    ca_certificate_pem: bytes
    expire_time_us: int


class CertIssuer:
    """Signs with sys.catalog's CA, provided it is the CA this master trusts (the one its
    certificate and every peer's chain to): a catalog whose CA was generated before the
    cluster was provisioned cannot sign certificates anyone would accept.

    `replicate` records join credentials' uses (the leader's sys.catalog writes);
    `provisioned` is the CA this master was provisioned with, if it holds its key: only a
    master's renewal of its own certificate uses it, and only while sys.catalog holds no CA
    yet (it is the CA the first leader stores)."""

    def __init__(
        self,
        sys_catalog: SysCatalogState,
        trusted_ca_pem: bytes,
        replicate: Replicate | None = None,
        provisioned: CertificateAuthority | None = None,
    ) -> None:
        self._sys = sys_catalog
        self._trusted = trusted_ca_pem
        self._replicate = replicate
        self._provisioned = provisioned

    def authority(self, *, before_stored: bool = False) -> CertificateAuthority:
        """sys.catalog's CA, checked; with `before_stored`, the provisioned CA while
        sys.catalog holds none."""
        row = self._sys.cert_authority()
        if row is None and before_stored and self._provisioned is not None:
            return self._provisioned
        if row is None:
            raise FailedPrecondition("sys.catalog holds no CA yet (the leader stores it); retry")
        if row.record.certificate_pem.strip() != self._trusted.strip():
            raise FailedPrecondition(
                "sys.catalog's CA is not the CA this cluster's certificates chain to (it was "
                "stored before the cluster was provisioned): this master signs no certificates"
            )
        return CertificateAuthority(row.record.certificate_pem, row.record.private_key_pem)

    def known_server(self, name: str, registered: Callable[[str], bool]) -> bool:
        """Registered with this master, or a member of any tablet's Raft config."""
        if registered(name):
            return True
        for row in self._sys.all_tablets():
            consensus = row.record.consensus
            if consensus is not None and any(p.uuid == name for p in consensus.peers):
                return True
        return False

    def issue(
        self,
        role: str,
        name: str,
        csr_der: bytes,
        validity: datetime.timedelta,
        *,
        before_stored: bool = False,
    ) -> Issued:
        ca = self.authority(before_stored=before_stored)
        cert_pem = ca.sign(role, name, request_public_key(csr_der), validity=validity)
        cert = x509.load_pem_x509_certificate(cert_pem)
        expire_us = int(cert.not_valid_after_utc.timestamp() * 1_000_000)
        return Issued(cert_pem, ca.cert_pem, expire_us)

    def renew_own(self, me: Identity, csr_der: bytes) -> Issued:
        """A master's renewal of its own certificate, signed here (module docstring): the rules
        of `check_request` for `me` asking for itself, sys.catalog's CA (or, before a leader
        stored one, the provisioned CA, which is the one it will store)."""
        validity = check_request(me, me.role, me.name, 0, lambda _: False)
        return self.issue(me.role, me.name, csr_der, validity, before_stored=True)

    def join_retry(self, use: JoinCredentialUseRecord) -> bool:
        """Whether `use` repeats the enrollment its join credential made (answer it again,
        record nothing); False if the credential is unused; PermissionDenied if it enrolled
        another uuid or key."""
        row = self._sys.join_credential_use(use.credential_sha256)
        if row is None:
            return False
        _check_same_enrollment(row.record, use)
        return True

    async def record_join_use(self, use: JoinCredentialUseRecord, timeout_s: float) -> None:
        """Record `use` as its join credential's one enrollment, replicated and applied before
        this returns (the caller answers only then). Of two racing enrollments with one
        credential, sys.catalog applies the first; the second, refused, is re-judged against
        it: the same enrollment passes, another one is PermissionDenied."""
        assert self._replicate is not None, "the leader's CertIssuer replicates"
        result = await self._replicate(join_use_write(use).encode(), timeout_s)
        if result.refusal is None:
            return
        if self.join_retry(use):
            return
        raise result.refusal.exception()
