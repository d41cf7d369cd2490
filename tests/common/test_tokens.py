"""Token format, verification and the tablet servers' verifier (service/common/tokens.py)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from service.common.errors import InvalidArgument, InvalidAuthzToken, PermissionDenied
from service.common.tokens import (
    AuthzClaim,
    Privilege,
    TokenVerifier,
    VerifyingKey,
    sign,
)

NOW = 1_700_000_000_000_000
SECOND = 1_000_000


def _key(seq: int = 1) -> tuple[ed25519.Ed25519PrivateKey, VerifyingKey]:
    private = ed25519.Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return private, VerifyingKey(seq, NOW + 3600 * SECOND, raw)


def _claim(**kw: object) -> AuthzClaim:
    base: dict[str, object] = {
        "user": "alice",
        "table_id": "t1",
        "privileges": frozenset({Privilege.READ}),
    }
    base.update(kw)
    return AuthzClaim(**base)  # type: ignore[arg-type]


def test_a_verifier_checks_signature_key_and_expiry() -> None:
    private, public = _key()
    token = sign(private, 1, public.expire_time_us, _claim().payload(), NOW, 10 * SECOND)
    v = TokenVerifier()
    with pytest.raises(PermissionDenied, match="no token signing keys known here yet"):
        v.verify(token, NOW)
    v.update([public])
    assert v.authz(token, NOW) == _claim()
    assert v.authz(token, NOW + 10 * SECOND - 1) == _claim()  # from the memo, still in date
    with pytest.raises(InvalidAuthzToken, match="expired"):
        v.authz(token, NOW + 10 * SECOND)
    with pytest.raises(InvalidAuthzToken, match="no authz token"):
        v.authz(b"", NOW)
    other, _ = _key()
    forged = sign(other, 1, public.expire_time_us, _claim().payload(), NOW, SECOND)
    with pytest.raises(InvalidAuthzToken, match="does not verify"):
        v.authz(forged, NOW)
    unknown = sign(other, 7, public.expire_time_us, _claim().payload(), NOW, SECOND)
    with pytest.raises(InvalidAuthzToken, match="unknown token signing key 7"):
        v.authz(unknown, NOW)


def test_the_memo_is_dropped_when_keys_change() -> None:
    private, public = _key()
    token = sign(private, 1, public.expire_time_us, _claim().payload(), NOW, 10 * SECOND)
    v = TokenVerifier()
    v.update([public])
    v.authz(token, NOW)
    _, newer = _key(2)
    v.update([newer])  # key 1 purged: its tokens are refused, not answered from the memo
    with pytest.raises(InvalidAuthzToken, match="unknown token signing key 1"):
        v.authz(token, NOW)


def test_claims_and_privileges_are_parsed_strictly() -> None:
    assert Privilege.parse(" Write ") is Privilege.WRITE
    with pytest.raises(InvalidArgument, match="unknown privilege 'delete'"):
        Privilege.parse("delete")
    assert AuthzClaim.of(_claim().payload()) == _claim()
    for bad in (
        b"raw",
        {"kind": "authn", "user": "a"},
        {"kind": "authz", "user": 1, "table": "t"},
        {"kind": "authz", "user": "a", "table": "t", "privileges": ["own"]},
    ):
        with pytest.raises(PermissionDenied):
            AuthzClaim.of(bad)  # type: ignore[arg-type]


def test_a_token_never_outlives_its_key() -> None:
    private, public = _key()
    with pytest.raises(InvalidArgument, match="would outlive token signing key"):
        sign(private, 1, public.expire_time_us, b"x", NOW, 7200 * SECOND)
