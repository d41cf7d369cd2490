"""The internal root CA and the token signing keys (docs/design/security.md).

Theory of operation
-------------------
docs/design/security.md#R2, #R3: sys.catalog holds the root CA certificate with its private key, and
the token signing keys (TSKs) used to sign authz tokens. The leader master stores the CA the
cluster was provisioned with (or a new one when it has none) when it becomes leader and finds no
CA, generates TSKs ahead of use, and lazily purges expired ones; a new leader loads what is
stored. This module is that policy and its crypto (the `cryptography` package). Who uses it:
`cert_issuer` signs certificates with the CA, `table_access` signs authz tokens with the TSKs,
and tablet servers verify those with the keys' public halves (`service/common/tokens.py`).

* The root CA (`generate_ca`, `load_ca`): a self-signed X.509 certificate on an EC P-256 key
  (fast to generate, small), valid `CA_VALIDITY` (10 years) from an hour before `now` (slack for
  skewed clocks among masters and tablet servers), with basic constraints CA=true and key usage
  keyCertSign/cRLSign. Stored as PEM (certificate, unencrypted PKCS#8 key).

* Token signing keys (`TokenSigningKeys`): Ed25519 keys, stored as PKCS#8 DER, each with a
  strictly increasing `key_seq` and an `expire_time_us`. With V the key validity and R the
  rotation interval (defaults 7 days and 1 day), a key may *sign* until its `sign_deadline_us`
  = expire - (V - R), and tokens live at most `max_token_ttl_us` = V - R: a token never outlives
  the key that verifies it, so purging a key at its expiry never invalidates a live token. The
  key that signs (`current_key`) is the lowest-seq key still before its sign deadline, so each
  key signs for R and then hands over to the next. `plan(keys, now)` keeps the current key plus
  `keys_ahead` (default 1) more generated ahead of use -- the next key is in the catalog, on
  every master, long before it signs anything -- each expiring R after the one before it, and
  purges expired keys. Every function takes `now` (microseconds since the epoch, the unit of
  `expire_time_us`); none reads a clock.

* Tokens (`sign_token`, `verify_token`): signed with a key's private half, verified with its
  public half (`public_key`, which masters send to tablet servers). The byte format and what
  verification refuses are `service/common/tokens.py`'s, shared with the tablet servers.

* `ensure_security(sys_catalog, replicate, now)`, run by the leader after its catalog is loaded
  and then periodically: inserts the CA if absent (with a "row absent" precondition, so of two
  leaders racing, sys.catalog applies the first and refuses the second identically on every
  replica), then writes the TSK plan as ONE CatalogWrite (inserts with "absent" preconditions,
  deletes with "at the version read" preconditions), then purges the records of join
  credentials that have expired (`cert_issuer.join_use_purge_write`, docs/design/security.md#R10),
  one more write. A write that has nothing to do is not proposed, so repeating it is a no-op.

Private key material never appears in a repr (`CertAuthorityRecord`, `TokenSigningKeyRecord`,
`LoadedCA`) nor in a log line.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from service.common import tokens
from service.common.errors import Corruption, InvalidArgument, NotReady, TesseraError
from service.common.pki import BACKDATE, CA_VALIDITY, CertificateAuthority
from service.common.tokens import MAX_PAYLOAD_BYTES, TOKEN_FORMAT_VERSION, VerifyingKey
from service.master.catalog_manager import Replicate
from service.master.catalog_records import (
    CatalogWrite,
    CertAuthorityRecord,
    Delete,
    Insert,
    Precondition,
    RecordType,
    RowKey,
    RowOp,
    TokenSigningKeyRecord,
    record_key,
    tsk_entry_id,
)
from service.master.cert_issuer import join_use_purge_write
from service.master.sys_catalog import SysCatalogState

__all__ = [
    "CA_BACKDATE",
    "CA_COMMON_NAME",
    "CA_VALIDITY",
    "DAY_US",
    "MAX_PAYLOAD_BYTES",
    "TOKEN_FORMAT_VERSION",
    "LoadedCA",
    "Payload",
    "SecurityReport",
    "TokenSigningKeys",
    "ca_write",
    "ensure_security",
    "generate_ca",
    "generate_signing_key",
    "load_ca",
    "public_key",
    "sign_token",
    "tsk_write",
    "verify_token",
]

log = logging.getLogger(__name__)

SECOND_US = 1_000_000
DAY_US = 86_400 * SECOND_US
"""The root CA's validity: about 10 years (Kudu's default for its internal CA)."""
CA_BACKDATE = BACKDATE
"""The CA is valid from this long before `now`: slack for clocks skewed among the servers."""
CA_COMMON_NAME = "Tessera internal root CA"

Payload = tokens.Payload


def _utc(now_us: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(now_us / SECOND_US, tz=datetime.UTC)


# --- the root CA -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedCA:
    """The root CA in usable form (the leader loads it into memory,
    docs/design/security.md#R2)."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey = field(repr=False)


def generate_ca(now_us: int) -> CertAuthorityRecord:
    """A new self-signed root CA (module docstring), valid from `now_us` - CA_BACKDATE for
    CA_VALIDITY (`service.common.pki.CertificateAuthority.create`, the one place certificates
    are built). The key comes from the OS's random source; nothing else is random but the
    serial number."""
    ca = CertificateAuthority.create(now=_utc(now_us), common_name=CA_COMMON_NAME)
    return CertAuthorityRecord(certificate_pem=ca.cert_pem, private_key_pem=ca.key_pem)


def load_ca(record: CertAuthorityRecord) -> LoadedCA:
    """The stored CA, checked: both PEMs parse, the key is EC and matches the certificate, and
    the certificate is a self-signed CA. A record that fails is `Corruption` (it came from
    sys.catalog, written by `generate_ca`)."""
    try:
        cert = x509.load_pem_x509_certificate(record.certificate_pem)
        key = serialization.load_pem_private_key(record.private_key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise Corruption(f"root CA: does not load: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise Corruption(f"root CA: private key is {type(key).__name__}, not an EC key")
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        raise Corruption("root CA: the private key does not match the certificate")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise Corruption("root CA: certificate has no basic constraints") from None
    if not constraints.ca:
        raise Corruption("root CA: certificate is not a CA (basic constraints CA=false)")
    try:
        cert.verify_directly_issued_by(cert)
    except (ValueError, TypeError, InvalidSignature):
        raise Corruption("root CA: certificate is not self-signed") from None
    return LoadedCA(cert, key)


def ca_write(record: CertAuthorityRecord) -> CatalogWrite:
    """The write inserting the CA, refused at apply if a CA row exists by then."""
    return CatalogWrite(
        ops=(Insert(record),),
        expected=(Precondition.absent(record_key(record)),),
        operation="EnsureCertAuthority",
    )


# --- token signing keys ----------------------------------------------------------------------


def generate_signing_key() -> bytes:
    """A new Ed25519 private key as PKCS#8 DER (the form `TokenSigningKeyRecord` stores)."""
    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _private_key(key: TokenSigningKeyRecord) -> ed25519.Ed25519PrivateKey:
    try:
        loaded = serialization.load_der_private_key(key.private_key_der, password=None)
    except (ValueError, TypeError):
        loaded = None
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise Corruption(
            f"token signing key {key.key_seq}: private_key_der is not an Ed25519 PKCS#8 key"
        )
    return loaded


@dataclass(frozen=True)
class TokenSigningKeys:
    """The TSK policy (module docstring). Times in microseconds. Pure: every method takes the
    committed keys and `now_us`; only `plan` generates key material."""

    key_validity_us: int = 7 * DAY_US
    rotation_interval_us: int = DAY_US
    keys_ahead: int = 1

    def __post_init__(self) -> None:
        if self.rotation_interval_us <= 0:
            raise InvalidArgument("token signing keys: rotation interval must be > 0")
        if self.key_validity_us <= self.rotation_interval_us:
            raise InvalidArgument(
                "token signing keys: key validity must exceed the rotation interval (tokens "
                "may live for their difference)"
            )
        if self.keys_ahead < 0:
            raise InvalidArgument("token signing keys: keys_ahead must be >= 0")

    @property
    def max_token_ttl_us(self) -> int:
        """The longest a token may live: validity - rotation, so it never outlives its key."""
        return self.key_validity_us - self.rotation_interval_us

    def sign_deadline_us(self, key: TokenSigningKeyRecord) -> int:
        """The key signs only before this time (tokens it signs then expire before it)."""
        return key.expire_time_us - self.max_token_ttl_us

    def _signing(
        self, keys: Iterable[TokenSigningKeyRecord], now_us: int
    ) -> list[TokenSigningKeyRecord]:
        """Keys that may sign at `now_us`, by key_seq."""
        usable = [
            k for k in keys if k.expire_time_us > now_us and self.sign_deadline_us(k) > now_us
        ]
        return sorted(usable, key=lambda k: k.key_seq)

    def current_key(
        self, keys: Iterable[TokenSigningKeyRecord], now_us: int
    ) -> TokenSigningKeyRecord:
        """The key that signs at `now_us`: the lowest-seq key before its sign deadline.
        `NotReady` if there is none (the leader has not run `ensure_security` yet)."""
        usable = self._signing(keys, now_us)
        if not usable:
            raise NotReady(f"no token signing key is usable at {_utc(now_us).isoformat()}")
        return usable[0]

    def plan(
        self, keys: Iterable[TokenSigningKeyRecord], now_us: int
    ) -> tuple[list[TokenSigningKeyRecord], list[int]]:
        """(keys to insert, key_seqs to delete) so that after the write there are a current key
        and `keys_ahead` keys after it, and no expired key. New keys take key_seqs above every
        committed one (expired ones included: the newest key is never purged without a newer
        one inserted in the same write, so a seq is never reused). The first new key, when no
        key can sign, expires `key_validity_us` after `now_us`; each next one
        `rotation_interval_us` after the key before it. ([], []) when nothing is to do."""
        keys = list(keys)
        to_delete = sorted(k.key_seq for k in keys if k.expire_time_us <= now_us)
        usable = self._signing(keys, now_us)
        next_seq = max((k.key_seq for k in keys), default=0) + 1
        to_insert: list[TokenSigningKeyRecord] = []
        while len(usable) < 1 + self.keys_ahead:
            if usable:
                expire = max(k.expire_time_us for k in usable) + self.rotation_interval_us
            else:
                expire = now_us + self.key_validity_us
            new = TokenSigningKeyRecord(next_seq, expire, generate_signing_key())
            next_seq += 1
            usable.append(new)
            to_insert.append(new)
        return to_insert, to_delete


def _tsk_key(key_seq: int) -> RowKey:
    return RowKey(RecordType.TOKEN_SIGNING_KEY, tsk_entry_id(key_seq))


def tsk_write(
    to_insert: Iterable[TokenSigningKeyRecord],
    to_delete: Iterable[int],
    versions: Mapping[int, int],
) -> CatalogWrite:
    """The ONE write of a TSK plan: inserts expect the row absent, deletes expect the row at
    the version read (`versions` by key_seq), so a plan made from stale state is refused."""
    ops: list[RowOp] = []
    expected: list[Precondition] = []
    for key in to_insert:
        ops.append(Insert(key))
        expected.append(Precondition.absent(_tsk_key(key.key_seq)))
    for seq in to_delete:
        ops.append(Delete(_tsk_key(seq)))
        expected.append(Precondition(_tsk_key(seq), versions[seq]))
    return CatalogWrite(
        ops=tuple(ops), expected=tuple(expected), operation="RotateTokenSigningKeys"
    )


# --- tokens ----------------------------------------------------------------------------------


def public_key(key: TokenSigningKeyRecord) -> VerifyingKey:
    """The public half of a signing key, as masters hand it to tablet servers."""
    raw = (
        _private_key(key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return VerifyingKey(key.key_seq, key.expire_time_us, raw)


def sign_token(key: TokenSigningKeyRecord, payload: Payload, now_us: int, ttl_us: int) -> bytes:
    """A token carrying `payload`, signed by `key`, expiring at `now_us + ttl_us`
    (`service.common.tokens.sign`, which says what is refused)."""
    return tokens.sign(_private_key(key), key.key_seq, key.expire_time_us, payload, now_us, ttl_us)


def verify_token(keys: Iterable[TokenSigningKeyRecord], token: bytes, now_us: int) -> Payload:
    """The payload of `token` if it is well formed, signed by one of `keys` and not expired at
    `now_us`; otherwise `PermissionDenied` saying which check failed (`tokens.verify`)."""
    public = {k.key_seq: _private_key(k).public_key() for k in keys}
    return tokens.verify(public, token, now_us)[0]


# --- the leader's step -----------------------------------------------------------------------


@dataclass(frozen=True)
class SecurityReport:
    """What one `ensure_security` wrote: the CA (if this call created it), TSK seqs."""

    ca_created: bool = False
    inserted: tuple[int, ...] = ()
    deleted: tuple[int, ...] = ()
    join_uses_purged: int = 0


async def _propose(
    replicate: Replicate, write: CatalogWrite, timeout_s: float
) -> TesseraError | None:
    """Replicate `write`; its refusal as an error (None if applied). Replication errors
    propagate."""
    result = await replicate(write.encode(), timeout_s)
    return result.refusal.exception() if result.refusal is not None else None


async def ensure_security(
    sys_catalog: SysCatalogState,
    replicate: Replicate,
    now_us: int,
    *,
    policy: TokenSigningKeys | None = None,
    timeout_s: float = 10.0,
    provisioned: CertAuthorityRecord | None = None,
) -> SecurityReport:
    """The leader's step (module docstring): CA if absent, the TSK plan as ONE write, then the
    purge of expired join credentials' records.

    The CA stored is `provisioned` when given (the CA the cluster was provisioned with, whose
    key this master holds: then sys.catalog's CA is the one every certificate chains to, and
    any leader can sign with it), else a new one.

    `replicate` must return after the entry is applied to `sys_catalog` (RaftNode.propose
    does). Idempotent: a call with nothing to do proposes nothing. A CA insert refused because
    another leader's CA committed first is success (that CA is the CA). A TSK write refused by
    a racing write is re-planned once from the new state; a second refusal is raised, as are
    replication errors (the caller retries later)."""
    policy = policy or TokenSigningKeys()
    ca_created = False
    if sys_catalog.cert_authority() is None:
        record = provisioned if provisioned is not None else generate_ca(now_us)
        refusal = await _propose(replicate, ca_write(record), timeout_s)
        if refusal is None:
            ca_created = True
            how = "the provisioned CA" if provisioned is not None else "a new root CA"
            log.info("sys.catalog: stored %s", how)
        elif sys_catalog.cert_authority() is None:
            raise refusal
        else:
            log.info("sys.catalog: another leader stored the root CA first (%s)", refusal)

    report = SecurityReport(ca_created)
    for attempt in (1, 2):
        rows = sys_catalog.signing_keys()
        to_insert, to_delete = policy.plan([r.record for r in rows], now_us)
        if not to_insert and not to_delete:
            break
        versions = {r.record.key_seq: r.version for r in rows}
        refusal = await _propose(replicate, tsk_write(to_insert, to_delete, versions), timeout_s)
        if refusal is None:
            inserted = tuple(k.key_seq for k in to_insert)
            log.info(
                "sys.catalog: token signing keys generated %s, purged %s",
                list(inserted),
                to_delete,
            )
            report = SecurityReport(ca_created, inserted, tuple(to_delete))
            break
        if attempt == 2:
            raise refusal
        log.info("sys.catalog: token signing key write refused (%s); planning again", refusal)

    purge = join_use_purge_write(sys_catalog.join_credential_uses(), now_us)
    if purge is not None:
        # Refused only if another write changed a row meanwhile: raised, the caller retries.
        refusal = await _propose(replicate, purge, timeout_s)
        if refusal is not None:
            raise refusal
        log.info("sys.catalog: purged %d expired join credentials' records", len(purge.ops))
        report = dataclasses.replace(report, join_uses_purged=len(purge.ops))
    return report
