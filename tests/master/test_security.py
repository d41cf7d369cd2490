"""The internal root CA and token signing keys (docs/design/security.md#R2, #R3): generated once by
the leader, generated ahead and rotated as (explicit) time advances, purged when expired, kept in
sys.catalog across snapshot/restore; tokens signed and verified, and every bad token refused.

`FakeRaft` (tests/helpers/sys_catalog.py) stands in for `RaftNode.propose`: it applies straight
to a real `SysCatalogState` with increasing indexes, optionally applying another leader's entries
first (a race). The last test starts one in-process MasterServer to check the wiring: its leader
stores the CA and keys, and `aclose` cancels the security task.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from service.common.config import MasterConfig
from service.common.errors import (
    Aborted,
    AlreadyExists,
    InvalidArgument,
    NotReady,
    PermissionDenied,
)
from service.common.tls import SecuritySettings
from service.master.catalog_records import CertAuthorityRecord, TokenSigningKeyRecord
from service.master.master import MasterServer
from service.master.security import (
    DAY_US,
    TOKEN_FORMAT_VERSION,
    TokenSigningKeys,
    ca_write,
    ensure_security,
    generate_ca,
    generate_signing_key,
    load_ca,
    sign_token,
    tsk_write,
    verify_token,
)
from service.master.sys_catalog import SysCatalogState
from tests.helpers.sys_catalog import FakeRaft

T0 = 1_700_000_000 * 1_000_000  # microseconds since the epoch
HOUR_US = 3600 * 1_000_000
POLICY = TokenSigningKeys()  # 7 days validity, 1 day rotation, 1 key ahead


def ensure(raft: FakeRaft, now_us: int, policy: TokenSigningKeys = POLICY) -> Any:
    return asyncio.run(ensure_security(raft.state, raft, now_us, policy=policy))


def keys_of(state: SysCatalogState) -> list[TokenSigningKeyRecord]:
    return [r.record for r in state.signing_keys()]


# --- the root CA -----------------------------------------------------------------------------


def test_ca_is_a_self_signed_ca_and_loads_back() -> None:
    record = generate_ca(T0)
    ca = load_ca(record)
    cert = ca.certificate
    cert.verify_directly_issued_by(cert)  # self-signed
    assert cert.issuer == cert.subject
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    assert start.timestamp() * 1_000_000 <= T0
    assert (end - start).days >= 3650
    assert record.private_key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")


def test_ca_load_refuses_mismatched_or_garbage_records() -> None:
    a, b = generate_ca(T0), generate_ca(T0)
    with pytest.raises(Exception, match="does not match the certificate"):
        load_ca(CertAuthorityRecord(a.certificate_pem, b.private_key_pem))
    with pytest.raises(Exception, match="does not load"):
        load_ca(CertAuthorityRecord(b"garbage", a.private_key_pem))


def test_private_key_material_not_in_repr() -> None:
    record = generate_ca(T0)
    assert b"PRIVATE" not in repr(record).encode()
    assert "private_key_pem" not in repr(record)
    ca = load_ca(record)
    assert "private_key" not in repr(ca)
    key = TokenSigningKeyRecord(1, T0 + DAY_US, generate_signing_key())
    assert repr(key) == f"TokenSigningKeyRecord(key_seq=1, expire_time_us={T0 + DAY_US})"
    assert key.private_key_der.hex() not in repr(key)


def test_ca_generated_once_second_ensure_is_a_noop() -> None:
    raft = FakeRaft(SysCatalogState())
    first = ensure(raft, T0)
    assert first.ca_created and first.inserted == (1, 2) and first.deleted == ()
    ca_row = raft.state.cert_authority()
    assert ca_row is not None
    proposals, index = raft.proposals, raft.state.applied_index

    second = ensure(raft, T0 + HOUR_US)
    assert not second.ca_created and second.inserted == () and second.deleted == ()
    assert raft.proposals == proposals and raft.state.applied_index == index  # nothing proposed
    assert raft.state.cert_authority() == ca_row


def test_racing_ca_insert_is_refused_and_changes_nothing() -> None:
    state = SysCatalogState()
    raft = FakeRaft(state)
    winner = raft.apply(ca_write(generate_ca(T0)).encode())
    assert winner.ok
    row = state.cert_authority()
    assert row is not None
    # A second leader that also saw no CA: its insert is refused at apply, on every replica.
    loser = raft.apply(ca_write(generate_ca(T0)).encode())
    assert loser.refusal is not None and loser.refusal.code == Aborted.code
    assert "expected absent" in loser.refusal.message
    assert state.cert_authority() == row


def test_ensure_losing_the_ca_race_keeps_the_winners_ca() -> None:
    state = SysCatalogState()
    raft = FakeRaft(state)
    other = generate_ca(T0)
    raft.other_leader_first.append(ca_write(other).encode())
    report = ensure(raft, T0)
    assert not report.ca_created
    row = state.cert_authority()
    assert row is not None and row.record == other
    assert report.inserted == (1, 2)  # the signing keys are still ensured


# --- token signing keys ----------------------------------------------------------------------


def test_keys_generated_ahead_rotated_and_purged_as_time_advances() -> None:
    raft = FakeRaft(SysCatalogState())
    ensure(raft, T0)
    keys = keys_of(raft.state)
    assert [(k.key_seq, k.expire_time_us) for k in keys] == [
        (1, T0 + 7 * DAY_US),
        (2, T0 + 8 * DAY_US),  # generated ahead of use
    ]
    assert POLICY.current_key(keys, T0).key_seq == 1

    # Within key 1's signing window: nothing to do.
    assert ensure(raft, T0 + DAY_US - 1).inserted == ()
    assert POLICY.current_key(keys_of(raft.state), T0 + DAY_US - 1).key_seq == 1

    # Key 1's window ends: key 2 signs, key 3 is generated ahead; key 1 still verifies.
    report = ensure(raft, T0 + DAY_US)
    assert report.inserted == (3,) and report.deleted == ()
    keys = keys_of(raft.state)
    assert POLICY.current_key(keys, T0 + DAY_US).key_seq == 2
    assert [k.key_seq for k in keys] == [1, 2, 3]
    assert keys[2].expire_time_us == T0 + 9 * DAY_US

    # Daily checks for a week: one new key a day, key 1 purged at its expiry.
    for day in range(2, 8):
        ensure(raft, T0 + day * DAY_US)
    keys = keys_of(raft.state)
    assert [k.key_seq for k in keys] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert POLICY.current_key(keys, T0 + 7 * DAY_US).key_seq == 8


def test_all_keys_expired_are_replaced_without_reusing_seqs() -> None:
    raft = FakeRaft(SysCatalogState())
    ensure(raft, T0)
    report = ensure(raft, T0 + 30 * DAY_US)  # the master was down for a month
    assert report.inserted == (3, 4) and report.deleted == (1, 2)
    keys = keys_of(raft.state)
    assert [(k.key_seq, k.expire_time_us) for k in keys] == [
        (3, T0 + 37 * DAY_US),
        (4, T0 + 38 * DAY_US),
    ]


def test_plan_is_pure_in_time() -> None:
    to_insert, to_delete = POLICY.plan([], T0)
    assert [k.key_seq for k in to_insert] == [1, 2] and to_delete == []
    assert POLICY.plan(to_insert, T0) == ([], [])
    with pytest.raises(NotReady, match="no token signing key"):
        POLICY.current_key([], T0)
    with pytest.raises(InvalidArgument):
        TokenSigningKeys(key_validity_us=DAY_US, rotation_interval_us=DAY_US)


def test_stale_tsk_plan_is_refused_and_ensure_replans() -> None:
    state = SysCatalogState()
    raft = FakeRaft(state)
    # Another leader's keys commit between our read and our write: our inserts of seq 1 and 2
    # are refused, we plan again from the new state, and find nothing to do.
    theirs, _ = POLICY.plan([], T0)
    raft.other_leader_first.append(tsk_write(theirs, [], {}).encode())
    report = ensure(raft, T0)
    assert report.inserted == ()
    assert keys_of(state) == theirs
    # Replaying a stale write directly: refused, nothing changes.
    index = state.applied_index
    result = raft.apply(tsk_write(POLICY.plan([], T0)[0], [], {}).encode())
    assert not result.ok and result.refusal is not None
    assert keys_of(state) == theirs and state.applied_index == index + 1


def test_keys_and_ca_survive_snapshot_restore() -> None:
    raft = FakeRaft(SysCatalogState())
    ensure(raft, T0)
    ensure(raft, T0 + DAY_US)
    snapshot = raft.state.snapshot()
    other = SysCatalogState()
    other.restore(snapshot)
    assert keys_of(other) == keys_of(raft.state)
    assert other.cert_authority() == raft.state.cert_authority()
    row = other.cert_authority()
    assert row is not None
    load_ca(row.record)
    # A token signed before the "failover" verifies with the restored keys.
    token = sign_token(POLICY.current_key(keys_of(raft.state), T0 + DAY_US), b"x", T0 + DAY_US, 1)
    assert verify_token(keys_of(other), token, T0 + DAY_US) == b"x"
    # The new leader has nothing to generate.
    follower = FakeRaft(other)
    follower.index = other.applied_index
    assert ensure(follower, T0 + DAY_US).inserted == ()


# --- tokens ----------------------------------------------------------------------------------


def signed(payload: Any = b"user=alice", ttl: int = HOUR_US) -> tuple[list[Any], bytes]:
    keys, _ = POLICY.plan([], T0)
    return keys, sign_token(POLICY.current_key(keys, T0), payload, T0, ttl)


def test_sign_verify_round_trip_bytes_and_dict() -> None:
    keys, token = signed()
    assert token[0] == TOKEN_FORMAT_VERSION
    assert verify_token(keys, token, T0) == b"user=alice"
    assert verify_token(keys, token, T0 + HOUR_US - 1) == b"user=alice"
    payload = {"user": "alice", "roles": ["admin"], "n": 3}
    keys, token = signed(payload)
    assert verify_token(keys, token, T0) == payload


def test_expired_token_refused() -> None:
    keys, token = signed()
    with pytest.raises(PermissionDenied, match="token expired at"):
        verify_token(keys, token, T0 + HOUR_US)


def test_unknown_key_refused() -> None:
    keys, token = signed()
    with pytest.raises(PermissionDenied, match="unknown token signing key 1"):
        verify_token(keys[1:], token, T0)


def test_bad_signature_refused() -> None:
    keys, token = signed()
    forged = bytearray(token)
    forged[-70] ^= 1  # a payload byte
    with pytest.raises(PermissionDenied, match="signature does not verify"):
        verify_token(keys, bytes(forged), T0)
    # A longer expiry written in: the signature catches it before the expiry is trusted.
    later = token[:9] + struct.pack(">Q", T0 + 100 * DAY_US) + token[17:]
    with pytest.raises(PermissionDenied, match="signature does not verify"):
        verify_token(keys, later, T0 + 2 * HOUR_US)
    # Signed by another key under key 1's seq.
    impostor = TokenSigningKeyRecord(1, T0 + 7 * DAY_US, generate_signing_key())
    with pytest.raises(PermissionDenied, match="signature does not verify"):
        verify_token(keys, sign_token(impostor, b"user=alice", T0, HOUR_US), T0)


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda t: b"", "too short"),
        (lambda t: t[:40], "too short"),
        (lambda t: t[:-1], "its length does not match"),
        (lambda t: t + b"\x00", "its length does not match"),
        (lambda t: bytes([9]) + t[1:], "unknown format version 9"),
        (lambda t: t[:17] + bytes([7]) + t[18:], "unknown payload kind 7"),
    ],
)
def test_malformed_token_refused(mangle: Any, reason: str) -> None:
    keys, token = signed()
    with pytest.raises(PermissionDenied, match=f"token is malformed: {reason}"):
        verify_token(keys, mangle(token), T0)


def test_sign_refuses_tokens_outliving_their_key_and_bad_payloads() -> None:
    keys, _ = signed()
    key = POLICY.current_key(keys, T0)
    assert sign_token(key, b"", T0, POLICY.max_token_ttl_us)  # the longest allowed
    with pytest.raises(InvalidArgument, match="would outlive token signing key 1"):
        sign_token(key, b"", T0 + DAY_US + 1, POLICY.max_token_ttl_us)
    with pytest.raises(InvalidArgument, match="ttl must be > 0"):
        sign_token(key, b"", T0, 0)
    with pytest.raises(InvalidArgument, match="not JSON-serializable"):
        sign_token(key, {"x": object()}, T0, HOUR_US)
    with pytest.raises(InvalidArgument, match="more than"):
        sign_token(key, b"x" * 70_000, T0, HOUR_US)


def test_current_key_tokens_always_verifiable_until_they_expire() -> None:
    # Over two weeks of hourly rotation checks, every token signed at the longest ttl by the
    # current key still verifies at its last valid microsecond (its key is not yet purged).
    raft = FakeRaft(SysCatalogState())
    issued: list[tuple[bytes, int]] = []
    for hour in range(0, 14 * 24, 5):
        now = T0 + hour * HOUR_US
        ensure(raft, now)
        keys = keys_of(raft.state)
        for token, expire in issued:
            if now < expire:
                assert verify_token(keys, token, now) == b"t"
        key = POLICY.current_key(keys, now)
        issued.append(
            (sign_token(key, b"t", now, POLICY.max_token_ttl_us), now + POLICY.max_token_ttl_us)
        )


def test_insert_twice_refused_by_sys_catalog() -> None:
    state = SysCatalogState()
    raft = FakeRaft(state)
    keys, _ = POLICY.plan([], T0)
    assert raft.apply(tsk_write(keys, [], {}).encode()).ok
    again = raft.apply(tsk_write(keys, [], {}).encode())
    assert again.refusal is not None
    assert again.refusal.code in (Aborted.code, AlreadyExists.code)


# --- the master wires it ---------------------------------------------------------------------


def test_single_master_leader_generates_ca_and_keys(tmp_path: Path) -> None:
    async def go() -> None:
        config = MasterConfig(
            data_dir=tmp_path,
            rpc_bind="127.0.0.1:0",
            http_bind="",
            security=SecuritySettings(mode="insecure"),  # the CA in sys.catalog is the subject
        )
        server = MasterServer(config)
        await server.start()
        try:
            state = server._sys_catalog
            assert state is not None
            for _ in range(400):
                if state.cert_authority() is not None and len(state.signing_keys()) == 2:
                    break
                await asyncio.sleep(0.025)
            row = state.cert_authority()
            assert row is not None
            load_ca(row.record)
            assert [r.record.key_seq for r in state.signing_keys()] == [1, 2]
            task = server._security_task
            assert task is not None and not task.done()
        finally:
            await server.aclose()
        assert task.done()  # cancelled by aclose

    asyncio.run(go())
