"""Grants in sys.catalog (the writes, their invariants, snapshots) and the master's per-table
decisions and authz tokens (table_access), without processes."""

from __future__ import annotations

import dataclasses

import pytest

from service.common.errors import InvalidArgument, PermissionDenied
from service.common.pki import Identity
from service.common.tls import INSECURE_PEER
from service.common.tokens import AuthzClaim, Privilege, TokenVerifier
from service.master.catalog_records import (
    CatalogWrite,
    GrantRecord,
    RequestId,
    TableState,
    Update,
    grant_from_pb,
    grant_to_pb,
)
from service.master.grants import GrantChange, grant_change_write, grant_deletes
from service.master.security import TokenSigningKeys, public_key, tsk_write
from service.master.sys_catalog import SysCatalogState
from service.master.table_access import ALL_PRIVILEGES, TableAccess
from service.pb import master_pb2 as pb
from tests.helpers.sys_catalog import (
    Ids,
    apply_ok,
    create_table_write,
    make_table,
    make_tablets,
    refusal_of,
)

READ, WRITE, ALTER = Privilege.READ, Privilege.WRITE, Privilege.ALTER
ALICE = Identity("user", "alice")


def _catalog() -> tuple[SysCatalogState, str, int]:
    ids = Ids(1)
    state = SysCatalogState()
    table = make_table(ids())
    apply_ok(state, 1, create_table_write(table, make_tablets(table, ids)))
    return state, table.table_id, 1


def _change(
    state: SysCatalogState, index: int, table_id: str, change: GrantChange, seq: int
) -> pb.GrantPB:
    current = state.grant(table_id, change.user)
    write = grant_change_write(table_id, "t", current, change, RequestId("admin", seq))
    result = apply_ok(state, index, write)
    return pb.GrantPrivilegesResponsePB.FromString(result.response).grant


def test_grant_adds_revoke_removes_and_an_empty_grant_is_deleted() -> None:
    state, table_id, i = _catalog()
    g = _change(state, i + 1, table_id, GrantChange("alice", frozenset({READ}), False), 1)
    assert list(g.privileges) == [pb.PRIVILEGE_READ]
    g = _change(state, i + 2, table_id, GrantChange("alice", frozenset({WRITE, ALTER}), False), 2)
    assert list(g.privileges) == [pb.PRIVILEGE_READ, pb.PRIVILEGE_WRITE, pb.PRIVILEGE_ALTER]
    row = state.grant(table_id, "alice")
    assert row is not None and row.record.privileges == {READ, WRITE, ALTER}
    g = _change(state, i + 3, table_id, GrantChange("alice", frozenset({READ, WRITE}), True), 3)
    assert list(g.privileges) == [pb.PRIVILEGE_ALTER]
    g = _change(state, i + 4, table_id, GrantChange("alice", frozenset({ALTER}), True), 4)
    assert list(g.privileges) == [] and state.grant(table_id, "alice") is None
    # Revoking what nobody holds writes nothing but still answers (and remembers the id).
    g = _change(state, i + 5, table_id, GrantChange("bob", frozenset({READ}), True), 5)
    assert list(g.privileges) == [] and state.grants() == []


def test_a_grant_write_from_stale_state_is_refused() -> None:
    state, table_id, i = _catalog()
    change = GrantChange("alice", frozenset({READ}), False)
    stale = grant_change_write(table_id, "t", None, change, RequestId("a", 1))
    apply_ok(state, i + 1, grant_change_write(table_id, "t", None, change, RequestId("b", 1)))
    code, message = refusal_of(state, i + 2, stale)
    assert code == "ABORTED" and "precondition failed" in message


def test_grants_need_a_live_table_and_go_with_it() -> None:
    state, table_id, i = _catalog()
    unknown = grant_change_write(
        "0" * 31 + "9", "x", None, GrantChange("alice", frozenset({READ}), False), RequestId("a", 1)
    )
    code, message = refusal_of(state, i + 1, unknown)
    assert code == "NOT_FOUND" and "unknown table" in message
    _change(state, i + 2, table_id, GrantChange("alice", frozenset({READ}), False), 2)
    _change(state, i + 3, table_id, GrantChange("bob", frozenset({WRITE}), False), 3)
    assert [r.record.user for r in state.grants_of(table_id)] == ["alice", "bob"]
    # DeleteTable's write deletes them with the table.
    table = state.table(table_id)
    assert table is not None
    ops, expected = grant_deletes(state.grants_of(table_id))
    removed = dataclasses.replace(table.record, state=TableState.REMOVED)
    apply_ok(state, i + 4, CatalogWrite(ops=(Update(removed), *ops), expected=tuple(expected)))
    assert state.grants() == []
    late = grant_change_write(
        table_id, "t", None, GrantChange("carol", frozenset({READ}), False), RequestId("a", 9)
    )
    code, message = refusal_of(state, i + 5, late)
    assert code == "FAILED_PRECONDITION" and "REMOVED" in message


def test_grants_round_trip_through_snapshots() -> None:
    state, table_id, i = _catalog()
    _change(state, i + 1, table_id, GrantChange("alice", frozenset({READ, ALTER}), False), 1)
    copy = SysCatalogState()
    copy.restore(state.snapshot())
    assert copy.snapshot() == state.snapshot()
    row = copy.grant(table_id, "alice")
    assert row is not None and row.record.privileges == {READ, ALTER}


def test_grant_records_are_validated() -> None:
    table_id = "0" * 32
    good = GrantRecord(table_id, "alice", frozenset({READ}))  # type: ignore[arg-type]
    assert grant_from_pb(grant_to_pb(good)) == good
    for bad, why in (
        (pb.GrantRecordPB(table_id=table_id, user="alice"), "empty"),
        (pb.GrantRecordPB(table_id=table_id, user="", privileges=[1]), "user: missing"),
        (pb.GrantRecordPB(table_id=table_id, user="a b", privileges=[1]), "spaces"),
        (pb.GrantRecordPB(table_id=table_id, user="a", privileges=[9]), "unknown privilege"),
        (pb.GrantRecordPB(table_id="nope", user="a", privileges=[1]), "table_id"),
    ):
        with pytest.raises(InvalidArgument, match=why):
            grant_from_pb(bad)
    with pytest.raises(InvalidArgument, match="at least one"):
        GrantChange.from_pb(pb.GrantPrivilegesRequestPB(user="alice"), revoke=False)


# --- table_access ----------------------------------------------------------------------------


def _access(state: SysCatalogState, clock: list[int], ttl_s: float = 10.0) -> TableAccess:
    return TableAccess(state, token_ttl_s=ttl_s, now_us=lambda: clock[0])


def _with_keys(state: SysCatalogState, index: int, now_us: int) -> int:
    to_insert, _ = TokenSigningKeys().plan([], now_us)
    apply_ok(state, index, tsk_write(to_insert, [], {}))
    return index + 1


def test_users_hold_what_they_were_granted_others_everything() -> None:
    state, table_id, i = _catalog()
    access = _access(state, [1_700_000_000_000_000])
    assert access.privileges(ALICE, table_id) == frozenset()
    for who in (Identity("admin", "root"), Identity("tserver", "ts-1"), INSECURE_PEER):
        assert access.privileges(who, table_id) == ALL_PRIVILEGES
        assert access.authz_token(who, table_id, "t") == b""
    with pytest.raises(PermissionDenied, match="holds no privilege on table 't'"):
        access.require(ALICE, table_id, "t")
    _change(state, i + 1, table_id, GrantChange("alice", frozenset({READ}), False), 1)
    assert access.require(ALICE, table_id, "t", READ) == {READ}
    with pytest.raises(PermissionDenied, match="lacks the 'write' privilege"):
        access.require(ALICE, table_id, "t", WRITE)


def test_authz_tokens_name_the_grant_are_reused_for_half_their_life_and_verify() -> None:
    state, table_id, i = _catalog()
    now = 1_700_000_000_000_000
    clock = [now]
    i = _with_keys(state, i + 1, now)
    _change(state, i, table_id, GrantChange("alice", frozenset({READ, WRITE}), False), 1)
    access = _access(state, clock, ttl_s=10.0)
    token = access.authz_token(ALICE, table_id, "t")
    verifier = TokenVerifier()
    verifier.update(public_key(r.record) for r in state.signing_keys())
    claim = verifier.authz(token, now)
    assert claim == AuthzClaim("alice", table_id, frozenset({READ, WRITE}))
    clock[0] = now + 4_000_000
    assert access.authz_token(ALICE, table_id, "t") == token  # under half its life: reused
    clock[0] = now + 6_000_000
    fresh = access.authz_token(ALICE, table_id, "t")
    assert fresh != token
    # A changed grant gets its own token at once.
    _change(state, i + 1, table_id, GrantChange("alice", frozenset({WRITE}), True), 2)
    narrowed = verifier.authz(access.authz_token(ALICE, table_id, "t"), clock[0])
    assert narrowed.privileges == {READ}
