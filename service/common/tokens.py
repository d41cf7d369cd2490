"""Signed tokens: their byte format, signing, verification, and the authz claims they carry.

Theory of operation
-------------------
The leader master signs tokens with the current token signing key (TSK, an Ed25519 key kept in
sys.catalog; `service/master/security.py` rotates them). Whoever holds a key's public half can
verify what it signed without asking a master: every master reads the keys from its own copy of
sys.catalog, and tablet servers receive the public halves in heartbeat responses
(`TokenVerifier.update`). This is Kudu's design for authn and authz tokens
(https://kudu.apache.org/docs/security.html#tokens).

The format, big-endian, in this order::

    version    1 byte   TOKEN_FORMAT_VERSION (1)
    key_seq    8 bytes  the signing key's sequence number
    expire_us  8 bytes  the token's expiry, microseconds since the epoch
    kind       1 byte   0: payload is raw bytes; 1: payload is a JSON object (UTF-8, sorted
                        keys, no spaces)
    length     4 bytes  payload length, at most MAX_PAYLOAD_BYTES
    payload    length bytes
    signature  64 bytes Ed25519 over every byte before it

Verification refuses, with `PermissionDenied` naming the reason: malformed bytes (length,
version, kind), a key seq not among the known keys, a signature that does not verify (checked
before the expiry, so a forged expiry is a bad signature), an expired token.

Authz tokens (`AuthzClaim`): the master hands one out with a table's locations to a caller with
a *user* identity, naming the user, the table id and the privileges the user holds on it. A
tablet server admits a user's Write or Scan only with a token that verifies, is unexpired, names
the caller, the tablet's table and the privilege the call needs. A revoked grant therefore stops
working when the last token issued before the revocation expires: the authz token lifetime
(the master's `authz_token_ttl_ms`, 5 minutes by default) bounds it.
"""

from __future__ import annotations

import datetime
import enum
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from service.common.errors import InvalidArgument, InvalidAuthzToken, PermissionDenied

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "TOKEN_FORMAT_VERSION",
    "AuthzClaim",
    "Payload",
    "Privilege",
    "TokenVerifier",
    "VerifyingKey",
    "sign",
    "verify",
]

TOKEN_FORMAT_VERSION = 1
MAX_PAYLOAD_BYTES = 64 * 1024
"""Largest token payload; a token is a credential, not a data channel."""
_HEADER = struct.Struct(">BQQBI")  # version, key_seq, expire_us, kind, payload length
_SIGNATURE_BYTES = 64
_KIND_BYTES = 0
_KIND_JSON = 1
_SECOND_US = 1_000_000

Payload: TypeAlias = bytes | dict[str, Any]
"""A token's payload: raw bytes, or a JSON object (returned as a dict by `verify`)."""


def _when(us: int) -> str:
    return datetime.datetime.fromtimestamp(us / _SECOND_US, tz=datetime.UTC).isoformat()


@dataclass(frozen=True)
class VerifyingKey:
    """The public half of a token signing key: what verifies the tokens it signed."""

    key_seq: int
    expire_time_us: int
    public_key: bytes
    """Raw Ed25519 public key, 32 bytes."""


def sign(
    private_key: ed25519.Ed25519PrivateKey,
    key_seq: int,
    key_expire_us: int,
    payload: Payload,
    now_us: int,
    ttl_us: int,
) -> bytes:
    """A token carrying `payload`, signed by key `key_seq`, expiring at `now_us + ttl_us`.
    Refused (InvalidArgument) if the token would outlive its key (`key_expire_us`), or the
    payload is too large or (a dict) not JSON-serializable."""
    if ttl_us <= 0:
        raise InvalidArgument(f"token ttl must be > 0, got {ttl_us} us")
    expire_us = now_us + ttl_us
    if expire_us > key_expire_us:
        raise InvalidArgument(
            f"a token expiring at {_when(expire_us)} would outlive token signing key "
            f"{key_seq}, which expires at {_when(key_expire_us)}"
        )
    if isinstance(payload, bytes):
        kind, body = _KIND_BYTES, payload
    elif isinstance(payload, dict):
        try:
            text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"token payload is not JSON-serializable: {e}") from None
        kind, body = _KIND_JSON, text.encode("utf-8")
    else:
        raise InvalidArgument(
            f"token payload must be bytes or a dict, not {type(payload).__name__}"
        )
    if len(body) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            f"token payload is {len(body)} bytes, more than the {MAX_PAYLOAD_BYTES} allowed"
        )
    signed = _HEADER.pack(TOKEN_FORMAT_VERSION, key_seq, expire_us, kind, len(body)) + body
    return signed + private_key.sign(signed)


def verify(
    keys: Mapping[int, ed25519.Ed25519PublicKey], token: bytes, now_us: int
) -> tuple[Payload, int]:
    """(payload, expiry in us) of `token` if it is well formed, signed by one of `keys` (by
    key_seq) and not expired at `now_us`; otherwise `PermissionDenied` saying which check
    failed (module docstring)."""
    if not isinstance(token, bytes) or len(token) < _HEADER.size + _SIGNATURE_BYTES:
        raise PermissionDenied("token is malformed: too short")
    version, key_seq, expire_us, kind, length = _HEADER.unpack_from(token)
    if version != TOKEN_FORMAT_VERSION:
        raise PermissionDenied(f"token is malformed: unknown format version {version}")
    if kind not in (_KIND_BYTES, _KIND_JSON):
        raise PermissionDenied(f"token is malformed: unknown payload kind {kind}")
    if length > MAX_PAYLOAD_BYTES or len(token) != _HEADER.size + length + _SIGNATURE_BYTES:
        raise PermissionDenied("token is malformed: its length does not match its header")
    key = keys.get(key_seq)
    if key is None:
        raise PermissionDenied(
            f"token is signed by unknown token signing key {key_seq} (never issued, or expired "
            "and purged)"
        )
    signed, signature = token[:-_SIGNATURE_BYTES], token[-_SIGNATURE_BYTES:]
    try:
        key.verify(signature, signed)
    except InvalidSignature:
        raise PermissionDenied(
            f"token signature does not verify with token signing key {key_seq}"
        ) from None
    if now_us >= expire_us:
        raise PermissionDenied(f"token expired at {_when(expire_us)}")
    body = signed[_HEADER.size :]
    if kind == _KIND_BYTES:
        return bytes(body), expire_us
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise PermissionDenied("token is malformed: its JSON payload does not decode") from None
    if not isinstance(value, dict):
        raise PermissionDenied("token is malformed: its JSON payload is not an object")
    return value, expire_us


class Privilege(enum.Enum):
    """What a user may do to one table (granted per table, stored in sys.catalog)."""

    READ = "read"
    """Scan, checksum and split key ranges; see the table's schema and locations."""
    WRITE = "write"
    """Insert, update, upsert and delete rows."""
    ALTER = "alter"
    """AlterTable."""

    @classmethod
    def parse(cls, text: str) -> Privilege:
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise InvalidArgument(f"unknown privilege {text!r} (one of: {names})") from None


@dataclass(frozen=True)
class AuthzClaim:
    """What an authz token says: `user` holds `privileges` on table `table_id`."""

    user: str
    table_id: str
    privileges: frozenset[Privilege]

    def payload(self) -> dict[str, Any]:
        return {
            "kind": "authz",
            "user": self.user,
            "table": self.table_id,
            "privileges": sorted(p.value for p in self.privileges),
        }

    @classmethod
    def of(cls, payload: Payload) -> AuthzClaim:
        """The claim in a verified payload; PermissionDenied if it is not an authz token."""
        if not isinstance(payload, dict) or payload.get("kind") != "authz":
            raise PermissionDenied("the token is not an authz token")
        user, table, privileges = (payload.get(k) for k in ("user", "table", "privileges"))
        if not isinstance(user, str) or not isinstance(table, str):
            raise PermissionDenied("authz token is malformed: no user or table")
        if not isinstance(privileges, list) or not all(isinstance(p, str) for p in privileges):
            raise PermissionDenied("authz token is malformed: privileges are not a list")
        try:
            parsed = frozenset(Privilege(p) for p in privileges)
        except ValueError:
            raise PermissionDenied("authz token is malformed: an unknown privilege") from None
        return cls(user, table, parsed)


_MAX_CACHED = 10_000


class TokenVerifier:
    """Verifies tokens against the token signing keys known here, which whoever owns it keeps
    current with `update` (a master from sys.catalog, a tablet server from heartbeats).

    A verified token is remembered (by its bytes) until it expires, so a client's many Writes
    and Scans with one authz token cost one signature check: Ed25519 verification is tens of
    microseconds, on the event loop, per call. The memo is cleared when the keys change, so a
    token of a purged key is checked (and refused) afresh."""

    def __init__(self) -> None:
        self._keys: dict[int, ed25519.Ed25519PublicKey] = {}
        self._known: tuple[VerifyingKey, ...] = ()
        self._verified: dict[bytes, tuple[Payload, int]] = {}

    @property
    def keys(self) -> tuple[VerifyingKey, ...]:
        return self._known

    def update(self, keys: Iterable[VerifyingKey]) -> None:
        """Replace the known keys (a no-op when they are the ones known)."""
        known = tuple(sorted(keys, key=lambda k: k.key_seq))
        if known == self._known:
            return
        loaded: dict[int, ed25519.Ed25519PublicKey] = {}
        for k in known:
            try:
                loaded[k.key_seq] = ed25519.Ed25519PublicKey.from_public_bytes(k.public_key)
            except ValueError:
                continue  # not a key; tokens it "signed" are refused as unknown-key
        self._keys, self._known = loaded, known
        self._verified.clear()

    def verify(self, token: bytes, now_us: int) -> Payload:
        """`verify` against the known keys, remembering success until the token expires."""
        hit = self._verified.get(token)
        if hit is not None:
            payload, expire_us = hit
            if now_us < expire_us:
                return payload
            del self._verified[token]
        if not self._keys:
            raise PermissionDenied(
                "no token signing keys known here yet (a tablet server learns them from the "
                "leader master's heartbeat responses); retry"
            )
        payload, expire_us = verify(self._keys, token, now_us)
        if len(self._verified) >= _MAX_CACHED:
            self._verified.clear()
        self._verified[token] = (payload, expire_us)
        return payload

    def authz(self, token: bytes, now_us: int) -> AuthzClaim:
        """The verified claim of an authz token; InvalidAuthzToken (the client fetches a fresh
        one and retries) when it is missing or does not verify."""
        if not token:
            raise InvalidAuthzToken(
                "no authz token: a user's Write and Scan carry the token that came with the "
                "table's locations (GetTableLocations)"
            )
        try:
            return AuthzClaim.of(self.verify(token, now_us))
        except PermissionDenied as e:
            raise InvalidAuthzToken(f"authz token refused: {e.message}") from None
