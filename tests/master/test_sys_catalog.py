"""sys.catalog's replicated state machine: one logical operation per entry, compare-and-set,
exactly-once request ids, snapshots, determinism across replicas, invariants on apply."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.common.errors import Corruption, FailedPrecondition, Internal
from service.common.ids import TableId, TabletId
from service.common.schema import AddColumn, ColumnType
from service.consensus.node import StateMachine
from service.master import sys_catalog
from service.master.catalog_records import (
    CatalogWrite,
    CertAuthorityRecord,
    Delete,
    Insert,
    Precondition,
    RecordType,
    RequestId,
    RowKey,
    RowOp,
    TableState,
    TabletRecord,
    TabletState,
    TokenSigningKeyRecord,
    Update,
    Upsert,
    record_key,
    tsk_entry_id,
)
from service.master.sys_catalog import (
    ApplyResult,
    CatalogChange,
    Restored,
    SysCatalogState,
    _KeyOrder,
)
from service.pb import master_pb2
from tests.helpers.sys_catalog import (
    SCHEMA,
    Ids,
    apply_ok,
    create_table_write,
    make_consensus,
    make_table,
    make_tablets,
    refusal_of,
)

ROOT = Path(__file__).resolve().parents[2]


def rows_of(state: SysCatalogState) -> list[object]:
    return list(state.rows())


# --- create ----------------------------------------------------------------------------------


def test_state_machine_protocol() -> None:
    sm: StateMachine = SysCatalogState()
    assert sm.snapshot()


def test_create_table_and_its_tablets_in_one_write() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids(), "orders", buckets=4, splits=2)
    tablets = make_tablets(table, ids)
    assert len(tablets) == 8
    result = apply_ok(state, 5, create_table_write(table, tablets))

    assert result.index == 5
    assert len(result.written) == 9
    assert {r.version for r in result.written} == {5}
    assert [r.key for r in result.written] == [record_key(table)] + [record_key(t) for t in tablets]
    assert state.applied_index == 5
    assert len(state) == 9

    row = state.table(table.table_id)
    assert row is not None and row.version == 5
    assert row.record.name == "orders"
    assert row.record.schema == SCHEMA
    assert row.record.state is TableState.RUNNING
    assert row.record.schema_version == 0
    assert state.table_by_name("orders") == row
    got = state.tablets_of(table.table_id)
    assert [t.record.tablet_id for t in got] == [t.tablet_id for t in tablets]  # key order
    assert all(t.record.state is TabletState.PREPARING for t in got)
    assert state.tablet(tablets[3].tablet_id) == got[3]
    assert state.tables() == [row]
    assert state.tablets_of(ids()) == []


def test_update_bumps_the_row_version_only_for_rows_written() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids())
    tablets = make_tablets(table, ids)
    apply_ok(state, 1, create_table_write(table, tablets))
    creating = dataclasses.replace(
        tablets[0], state=TabletState.CREATING, consensus=make_consensus([ids(), ids(), ids()])
    )
    result = apply_ok(
        state,
        2,
        CatalogWrite(ops=(Update(creating),), expected=(Precondition(record_key(tablets[0]), 1),)),
    )
    assert [r.version for r in result.written] == [2]
    tablet_row = state.tablet(tablets[0].tablet_id)
    table_row = state.table(table.table_id)
    assert tablet_row is not None and table_row is not None
    assert tablet_row.version == 2 and tablet_row.record.state is TabletState.CREATING
    assert table_row.version == 1


# --- compare-and-set and atomicity -----------------------------------------------------------


def test_failed_precondition_changes_nothing() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids(), "t1")
    apply_ok(state, 1, create_table_write(table, make_tablets(table, ids)))
    altered = dataclasses.replace(table, name="t1-renamed", altered_time_us=2)
    apply_ok(
        state,
        2,
        CatalogWrite(ops=(Update(altered),), expected=(Precondition(record_key(table), 1),)),
    )
    before = rows_of(state)
    snapshot_rows = master_pb2.SysCatalogSnapshotPB.FromString(state.snapshot()).rows

    # A deposed leader read version 1; the row is at version 2 now.
    stale = dataclasses.replace(table, state=TableState.REMOVED)
    request = RequestId("client-a", 1)
    write = CatalogWrite(
        ops=(Update(stale),),
        expected=(Precondition(record_key(table), 1),),
        request_id=request,
        operation="DeleteTable",
    )
    code, message = refusal_of(state, 3, write)
    assert code == "ABORTED"
    assert table.table_id in message and "version 1" in message and "version 2" in message

    assert rows_of(state) == before
    after = master_pb2.SysCatalogSnapshotPB.FromString(state.snapshot())
    assert after.rows == snapshot_rows
    assert after.applied_index == 3  # the index was consumed, nothing else changed
    assert state.remembered("client-a", 1) is None  # a refused write leaves no request id
    assert state.table_by_name("t1") is None and state.table_by_name("t1-renamed") is not None

    # "Must not exist" on an existing row fails the same way.
    code, _ = refusal_of(
        state, 4, CatalogWrite(ops=(), expected=(Precondition.absent(record_key(table)),))
    )
    assert code == "ABORTED"

    # With a fresh read the same request id goes through: the refusal did not consume it.
    fresh = dataclasses.replace(altered, state=TableState.REMOVED)
    ok = apply_ok(
        state,
        5,
        dataclasses.replace(
            write, ops=(Update(fresh),), expected=(Precondition(record_key(table), 2),)
        ),
    )
    assert ok.duplicate_of is None and len(ok.written) == 1


def test_a_write_takes_effect_whole_or_not_at_all() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids())
    tablets = make_tablets(table, ids)
    orphan = dataclasses.replace(tablets[-1], table_id=TableId(ids()))  # names no table
    code, message = refusal_of(state, 1, create_table_write(table, [*tablets[:-1], orphan]))
    assert code == "NOT_FOUND"
    assert orphan.tablet_id in message and orphan.table_id in message
    assert len(state) == 0
    assert state.table(table.table_id) is None
    assert state.table_by_name(table.name) is None


# --- exactly-once ----------------------------------------------------------------------------


def test_same_request_id_twice_applies_once_and_answers_the_same() -> None:
    ids = Ids()
    state = SysCatalogState()
    seen: list[CatalogChange] = []
    state.add_listener(seen.append)
    request = RequestId("client-1", 7)
    table = make_table(ids(), "events")
    write = create_table_write(table, make_tablets(table, ids), request)
    first = apply_ok(state, 10, write)
    rows = rows_of(state)

    # The same entry proposed again (the client retried while the first was in flight).
    again = apply_ok(state, 11, write)
    assert again.duplicate_of == 10
    assert again.response == first.response
    assert master_pb2.CreateTableResponsePB.FromString(again.response).table_id == table.table_id
    assert again.written == ()

    # A new leader re-ran the request after failover with fresh ids: still the original answer.
    other = make_table(ids(), "events")
    retry = create_table_write(other, make_tablets(other, ids), request)
    third = apply_ok(state, 12, retry)
    assert third.duplicate_of == 10 and third.response == first.response
    assert state.table(other.table_id) is None

    assert rows_of(state) == rows  # applied once
    assert len(seen) == 1 and seen[0] == first
    remembered = state.remembered("client-1", 7)
    assert remembered is not None and remembered.index == 10
    assert remembered.operation == "CreateTable"


def test_request_id_reused_for_another_operation_is_refused() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids())
    apply_ok(state, 1, create_table_write(table, make_tablets(table, ids), RequestId("c", 1)))
    code, message = refusal_of(
        state, 2, CatalogWrite(request_id=RequestId("c", 1), operation="DeleteTable")
    )
    assert code == "INVALID_ARGUMENT" and "CreateTable" in message


def test_request_ids_are_bounded_per_client_and_refused_as_stale() -> None:
    state = SysCatalogState(max_results_per_client=2)
    for seq in (1, 2, 3):
        apply_ok(state, seq, CatalogWrite(request_id=RequestId("c", seq), operation="Op"))
    assert state.remembered("c", 1) is None  # the lowest was forgotten
    assert state.remembered("c", 3) is not None
    code, message = refusal_of(state, 4, CatalogWrite(request_id=RequestId("c", 1), operation="Op"))
    assert code == "FAILED_PRECONDITION" and "stale" in message
    # The client says every request below 3 was answered: 2 is forgotten early.
    apply_ok(state, 5, CatalogWrite(request_id=RequestId("c", 4, 3), operation="Op"))
    assert state.remembered("c", 2) is None and state.remembered("c", 3) is not None
    code, _ = refusal_of(state, 6, CatalogWrite(request_id=RequestId("c", 2), operation="Op"))
    assert code == "FAILED_PRECONDITION"


def test_request_ids_are_forgotten_by_age_in_log_index() -> None:
    state = SysCatalogState(request_retention_entries=3)
    apply_ok(state, 1, CatalogWrite(request_id=RequestId("old", 1), operation="Op"))
    apply_ok(state, 2, CatalogWrite(request_id=RequestId("new", 1), operation="Op"))
    apply_ok(state, 3, CatalogWrite())
    assert state.remembered("old", 1) is not None
    apply_ok(state, 4, CatalogWrite())  # index 1 is now 3 entries old
    assert state.remembered("old", 1) is None
    assert state.remembered("new", 1) is not None
    snap = master_pb2.SysCatalogSnapshotPB.FromString(state.snapshot())
    assert [c.client_id for c in snap.clients] == ["new"]  # the idle client is gone entirely


def test_bad_request_ids_are_refused() -> None:
    state = SysCatalogState()
    for request in (RequestId("", 1), RequestId("c", 0), RequestId("c", 3, 4)):
        code, _ = refusal_of(state, state.applied_index + 1, CatalogWrite(request_id=request))
        assert code == "INVALID_ARGUMENT"


# --- invariants ------------------------------------------------------------------------------


def test_bad_records_are_refused_naming_the_id() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids(), "t")
    tablets = make_tablets(table, ids)
    apply_ok(state, 1, create_table_write(table, tablets))
    index = iter(range(2, 100))

    def refused(*ops: RowOp) -> tuple[str, str]:
        return refusal_of(state, next(index), CatalogWrite(ops=ops))

    # Unknown table for a tablet.
    stray = dataclasses.replace(tablets[0], tablet_id=TabletId(ids()), table_id=TableId(ids()))
    code, message = refused(Insert(stray))
    assert code == "NOT_FOUND" and stray.tablet_id in message and stray.table_id in message

    # Duplicate ids: an existing table or tablet id, or one id twice in a write.
    code, message = refused(Insert(dataclasses.replace(table, name="other")))
    assert code == "ALREADY_EXISTS" and table.table_id in message
    code, message = refused(Insert(tablets[1]))
    assert code == "ALREADY_EXISTS" and tablets[1].tablet_id in message
    twin = dataclasses.replace(tablets[0], tablet_id=TabletId(ids()))
    code, message = refused(Insert(twin), Upsert(twin))
    assert code == "INVALID_ARGUMENT" and twin.tablet_id in message and "twice" in message

    # A live name is unique; a REMOVED table frees its name.
    second = make_table(ids(), "t")
    code, message = refused(Insert(second))
    assert code == "ALREADY_EXISTS" and "'t'" in message and table.table_id in message

    # Update or delete of a missing row; tables and tablets are never deleted.
    code, message = refused(Update(make_table(ids(), "x")))
    assert code == "NOT_FOUND"
    code, message = refused(Delete(record_key(tablets[0])))
    assert code == "FAILED_PRECONDITION" and tablets[0].tablet_id in message

    # A tablet cannot move to another table, nor change its partition.
    code, message = refused(Update(dataclasses.replace(tablets[0], table_id=second.table_id)))
    assert code == "INVALID_ARGUMENT" and tablets[0].tablet_id in message
    code, message = refused(Update(dataclasses.replace(tablets[0], partition=tablets[1].partition)))
    assert code == "INVALID_ARGUMENT" and "partition" in message

    # replaced_by must name a tablet of the same table.
    replaced = dataclasses.replace(
        tablets[0], state=TabletState.REPLACED, replaced_by=TabletId(ids())
    )
    code, message = refused(Update(replaced))
    assert code == "NOT_FOUND" and tablets[0].tablet_id in message

    # Ids in canonical form only: two spellings must never make two rows.
    upper = dataclasses.replace(table, table_id=TableId(table.table_id.upper()), name="u")
    code, message = refused(Insert(upper))
    assert code == "INVALID_ARGUMENT" and table.table_id.upper() in message

    # Garbage and empty ops.
    code, _ = refusal_of(state, next(index), b"\xff\xff not a protobuf")
    assert code == "INVALID_ARGUMENT"
    bad = master_pb2.CatalogWritePB()
    bad.ops.add(kind=master_pb2.CatalogRowOpPB.INSERT)
    code, message = refusal_of(state, next(index), bad.SerializeToString())
    assert code == "INVALID_ARGUMENT" and "ops[0]" in message

    # A record whose schema does not decode is refused with the table id and the field.
    broken = master_pb2.CatalogWritePB()
    op = broken.ops.add(kind=master_pb2.CatalogRowOpPB.INSERT)
    op.table.CopyFrom(CatalogWrite(ops=(Insert(make_table(ids(), "b")),)).to_pb().ops[0].table)
    op.table.schema.columns[1].type = 99  # type: ignore[assignment]
    code, message = refusal_of(state, next(index), broken.SerializeToString())
    assert code == "INVALID_ARGUMENT"
    assert op.table.table_id in message and "schema.columns[1].type" in message

    assert len(state) == 1 + len(tablets)  # nothing of the above was applied


def test_state_transitions_are_one_way() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids(), "t")
    tablets = make_tablets(table, ids)
    apply_ok(state, 1, create_table_write(table, tablets))
    removed = dataclasses.replace(table, state=TableState.REMOVED)
    deleted = [dataclasses.replace(t, state=TabletState.DELETED) for t in tablets]
    apply_ok(state, 2, CatalogWrite(ops=(Update(removed), *(Update(t) for t in deleted))))
    assert state.table_by_name("t") is None
    row = state.table(table.table_id)
    assert row is not None and row.record.state is TableState.REMOVED  # still recorded

    code, message = refusal_of(state, 3, CatalogWrite(ops=(Update(table),)))
    assert code == "FAILED_PRECONDITION" and table.table_id in message and "REMOVED" in message
    code, message = refusal_of(state, 4, CatalogWrite(ops=(Update(tablets[0]),)))
    assert code == "FAILED_PRECONDITION" and "DELETED" in message
    late = TabletRecord(
        TabletId(ids()), table.table_id, tablets[0].partition, TabletState.PREPARING
    )
    code, message = refusal_of(state, 5, CatalogWrite(ops=(Insert(late),)))
    assert code == "FAILED_PRECONDITION" and "no new tablets" in message

    # The name is free again for a new table.
    apply_ok(state, 6, CatalogWrite(ops=(Insert(make_table(ids(), "t")),)))


def test_live_names_are_unique_after_every_write() -> None:
    ids = Ids()
    state = SysCatalogState()
    a, b = make_table(ids(), "a"), make_table(ids(), "b")
    apply_ok(state, 1, CatalogWrite(ops=(Insert(a), Insert(b))))
    # Two tables swap names in one write: legal, the names are unique afterwards.
    a2, b2 = dataclasses.replace(a, name="b"), dataclasses.replace(b, name="a")
    apply_ok(state, 2, CatalogWrite(ops=(Update(a2), Update(b2))))
    row = state.table_by_name("a")
    assert row is not None and row.record.table_id == b.table_id
    # Two new tables claiming one name in one write: refused.
    c, d = make_table(ids(), "c"), make_table(ids(), "c")
    code, message = refusal_of(state, 3, CatalogWrite(ops=(Insert(c), Insert(d))))
    assert code == "ALREADY_EXISTS" and d.table_id in message and c.table_id in message
    # Renaming onto a live name: refused; onto the name of a table REMOVED in the same write: ok.
    code, _ = refusal_of(state, 4, CatalogWrite(ops=(Update(dataclasses.replace(a2, name="a")),)))
    assert code == "ALREADY_EXISTS"
    removed = dataclasses.replace(b2, state=TableState.REMOVED)
    apply_ok(
        state, 5, CatalogWrite(ops=(Update(removed), Update(dataclasses.replace(a2, name="a"))))
    )
    row = state.table_by_name("a")
    assert row is not None and row.record.table_id == a.table_id
    assert state.table_by_name("b") is None


def test_schema_version_and_consensus_state_never_go_back() -> None:
    ids = Ids()
    state = SysCatalogState()
    table = make_table(ids())
    tablets = make_tablets(table, ids, servers=[ids() for _ in range(3)])
    apply_ok(state, 1, create_table_write(table, tablets))
    v1 = dataclasses.replace(table, schema=SCHEMA.apply([AddColumn("x", ColumnType.INT32)]))
    apply_ok(state, 2, CatalogWrite(ops=(Update(v1),)))
    code, message = refusal_of(state, 3, CatalogWrite(ops=(Update(table),)))
    assert code == "FAILED_PRECONDITION" and "schema version 0" in message

    cs = tablets[0].consensus
    assert cs is not None
    newer = dataclasses.replace(cs, term=5, config_index=40)
    running = dataclasses.replace(tablets[0], state=TabletState.RUNNING, consensus=newer)
    apply_ok(state, 4, CatalogWrite(ops=(Update(running),)))
    for term, config_index in ((4, 40), (6, 39)):
        old = dataclasses.replace(newer, term=term, config_index=config_index)
        code, message = refusal_of(
            state,
            state.applied_index + 1,
            CatalogWrite(ops=(Update(dataclasses.replace(running, consensus=old)),)),
        )
        assert code == "FAILED_PRECONDITION" and tablets[0].tablet_id in message


def test_non_monotonic_index_is_a_bug() -> None:
    state = SysCatalogState()
    apply_ok(state, 3, CatalogWrite())
    with pytest.raises(Internal):
        state.apply(3, CatalogWrite().encode())


# --- CA and signing keys ---------------------------------------------------------------------


def test_cert_authority_and_signing_keys() -> None:
    state = SysCatalogState()
    ca = CertAuthorityRecord(b"-----BEGIN CERTIFICATE-----", b"-----BEGIN PRIVATE KEY-----")
    keys = [TokenSigningKeyRecord(seq, 10**15 + seq, b"key-%d" % seq) for seq in (12, 3, 100)]
    apply_ok(state, 1, CatalogWrite(ops=(Insert(ca), *(Insert(k) for k in keys))))
    row = state.cert_authority()
    assert row is not None and row.record == ca
    assert "PRIVATE" not in repr(row) and "key-3" not in repr(state.signing_keys())
    assert [r.record.key_seq for r in state.signing_keys()] == [3, 12, 100]
    # Two leaders racing to create the CA: the second INSERT is refused.
    code, _ = refusal_of(state, 2, CatalogWrite(ops=(Insert(ca),)))
    assert code == "ALREADY_EXISTS"
    # Expired keys are purged.
    apply_ok(
        state, 3, CatalogWrite(ops=(Delete(RowKey(RecordType.TOKEN_SIGNING_KEY, tsk_entry_id(3))),))
    )
    assert [r.record.key_seq for r in state.signing_keys()] == [12, 100]
    code, _ = refusal_of(
        state, 4, CatalogWrite(ops=(Delete(RowKey(RecordType.TOKEN_SIGNING_KEY, tsk_entry_id(3))),))
    )
    assert code == "NOT_FOUND"


# --- snapshots and determinism ---------------------------------------------------------------


def random_writes(seed: int, n: int) -> list[bytes]:
    """A mixed history of `n` entries: creates (some retried), alters, tablet reports, deletes,
    signing keys, and writes that are refused (stale preconditions, taken names, unknown
    tables). A shadow replica tracks the real state so most writes are valid."""
    rng = random.Random(seed)
    ids = Ids(seed)
    servers = [ids() for _ in range(5)]
    shadow = SysCatalogState()
    out: list[bytes] = []
    seq = 0
    while len(out) < n:
        choice = rng.random()
        tables = shadow.tables()
        live = [t for t in tables if not t.record.is_removed]
        write: CatalogWrite
        if choice < 0.25 or not live:
            seq += 1
            table = make_table(ids(), f"table-{rng.randrange(30)}", buckets=rng.randrange(2, 5))
            ts = make_tablets(table, ids, servers=servers if rng.random() < 0.5 else None)
            write = create_table_write(table, ts, RequestId(f"c{seq % 3}", seq))
            if rng.random() < 0.2:  # the same request again, as a retry after failover
                shadow.apply(len(out) + 1, write.encode())
                out.append(write.encode())
        elif choice < 0.45:
            row = rng.choice(live)
            new = dataclasses.replace(row.record, altered_time_us=len(out), state_msg="altered")
            version = row.version if rng.random() < 0.8 else row.version - 1
            write = CatalogWrite(ops=(Update(new),), expected=(Precondition(row.key, version),))
        elif choice < 0.75:
            rows = shadow.tablets_of(rng.choice(tables).record.table_id)
            t = rng.choice(rows).record
            if t.consensus is not None and not t.state.is_terminal:
                cs = dataclasses.replace(t.consensus, term=t.consensus.term + rng.randrange(-1, 2))
                t = dataclasses.replace(t, state=TabletState.RUNNING, consensus=cs)
            write = CatalogWrite(ops=(Upsert(t),))
        elif choice < 0.85:
            row = rng.choice(live)
            removed = dataclasses.replace(row.record, state=TableState.REMOVED)
            tablets = [
                dataclasses.replace(t.record, state=TabletState.DELETED)
                for t in shadow.tablets_of(row.record.table_id)
            ]
            write = CatalogWrite(
                ops=(Update(removed), *(Update(t) for t in tablets)),
                request_id=RequestId("dropper", len(out) + 1),
                operation="DeleteTable",
            )
        elif choice < 0.9:
            orphan = make_tablets(make_table(ids()), ids)[:1]  # names a table never created
            write = CatalogWrite(ops=(Insert(orphan[0]),))
        else:
            key = TokenSigningKeyRecord(len(out), 10**15 + len(out), rng.randbytes(32))
            write = CatalogWrite(ops=(Insert(key),))
        shadow.apply(len(out) + 1, write.encode())
        out.append(write.encode())
    return out[:n]


def test_replicas_fed_the_same_writes_make_identical_snapshots() -> None:
    writes = random_writes(11, 200)
    a, b = SysCatalogState(), SysCatalogState()
    results_a = [a.apply(i, w) for i, w in enumerate(writes, start=1)]
    results_b = [b.apply(i, w) for i, w in enumerate(writes, start=1)]
    assert results_a == results_b
    refused = sum(1 for r in results_a if not r.ok)
    retried = sum(1 for r in results_a if r.duplicate_of is not None)
    assert 10 < refused < len(writes) // 3  # the history exercised every path
    assert retried > 0 and len(a) > 100
    assert a.snapshot() == b.snapshot()


def replay_digest(seed: int = 11, n: int = 200) -> str:
    state = SysCatalogState()
    for i, w in enumerate(random_writes(seed, n), start=1):
        state.apply(i, w)
    return hashlib.sha256(state.snapshot()).hexdigest()


def test_replicas_in_other_processes_make_identical_snapshots() -> None:
    """Replicas are separate processes: a different hash seed (set and str-hash order) must not
    change a single byte."""
    code = "from tests.master.test_sys_catalog import replay_digest; print(replay_digest())"
    digests = set()
    for hash_seed in ("1", "4242"):
        r = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(r.stdout.strip())
    assert digests == {replay_digest()}


def test_snapshot_restore_round_trip_is_exact() -> None:
    writes = random_writes(5, 150)
    a = SysCatalogState()
    for i, w in enumerate(writes, start=1):
        a.apply(i, w)
    apply_ok(a, len(writes) + 1, CatalogWrite(ops=(Insert(CertAuthorityRecord(b"c", b"k")),)))
    snap = a.snapshot()
    keys = [
        (r.entry_type, r.entry_id) for r in master_pb2.SysCatalogSnapshotPB.FromString(snap).rows
    ]
    assert keys == sorted(keys)  # canonical order, whatever the order of the history
    b = SysCatalogState()
    b.restore(snap)
    assert b.snapshot() == snap
    assert b.applied_index == a.applied_index
    assert list(b.rows()) == list(a.rows())
    assert b.tables() == a.tables()
    for t in a.tables():
        assert b.tablets_of(t.record.table_id) == a.tablets_of(t.record.table_id)
        live = b.table_by_name(t.record.name)
        assert live == a.table_by_name(t.record.name)
    assert b.cert_authority() == a.cert_authority()
    assert b.signing_keys() == a.signing_keys()
    assert b._requests.clients == a._requests.clients


def test_each_tables_tablets_stay_in_partition_order_as_rows_apply_and_restore() -> None:
    """`tablets_of` (and the view `DumpCatalog` reads) keep each table's tablets in partition
    order as rows apply, instead of sorting them on every read: after a random history, and
    after a restore, each table lists exactly its tablets (every state, none twice), in the
    order a sort of all tablet rows by (partition key start, tablet id) gives."""
    a = SysCatalogState()
    for i, w in enumerate(random_writes(11, 300), start=1):
        a.apply(i, w)
    b = SysCatalogState()
    b.restore(a.snapshot())
    tablets = a.all_tablets()
    assert len({t.record.table_id for t in tablets}) > 5
    for state in (a, b):
        view = state.tablets_view()
        for table in state.tables():
            table_id = table.record.table_id
            want = sorted(
                (t for t in tablets if t.record.table_id == table_id),
                key=lambda r: (r.record.partition.partition_key_start, r.record.tablet_id),
            )
            assert state.tablets_of(table_id) == want
            assert view.tablets_of(table_id) == want
    # A view is a copy: rows applied after it do not show in it.
    table = make_table(Ids(99)(), "late")
    before = a.tablets_view()
    apply_ok(a, a.applied_index + 1, create_table_write(table, make_tablets(table, Ids(98))))
    assert before.tablets_of(table.table_id) == [] and len(a.tablets_of(table.table_id)) > 0


def test_snapshot_bytes_are_the_messages_own_encoding() -> None:
    """`snapshot` assembles the message from rows encoded when they were written; the bytes
    must be exactly what protobuf makes of the same message (any replica, any reader), with
    rows of every length class (1-, 2- and 3-byte lengths) and deleted or rewritten rows."""
    writes = random_writes(7, 150)
    a = SysCatalogState()
    for i, w in enumerate(writes, start=1):
        a.apply(i, w)
    big = CertAuthorityRecord(b"c" * 20_000, b"k" * 300)
    apply_ok(a, len(writes) + 1, CatalogWrite(ops=(Insert(big),)))
    snap = a.snapshot()
    decoded = master_pb2.SysCatalogSnapshotPB.FromString(snap)
    assert decoded.SerializeToString(deterministic=True) == snap
    sizes = [len(r.SerializeToString()) for r in decoded.rows]
    assert min(sizes) < 128 and any(128 <= n < 16_384 for n in sizes) and max(sizes) >= 16_384
    assert decoded.applied_index == a.applied_index == len(writes) + 1
    assert len(decoded.rows) == len(a) and decoded.clients
    by_key = {(r.entry_type, r.entry_id): r for r in decoded.rows}
    for row in a.rows():
        got = by_key[(row.key.entry_type.value, row.key.entry_id)]
        assert got.version == row.version


def test_snapshots_list_exactly_the_rows_in_key_order_between_writes() -> None:
    """The row order is kept between snapshots (added keys merged, dropped ones removed, a key
    dropped and written again listed once), not sorted from scratch: every snapshot of a
    random history, restored ones too, lists exactly the current rows in (type, id) order."""
    writes = random_writes(11, 400)
    a = SysCatalogState()
    b: SysCatalogState | None = None
    for i, w in enumerate(writes, start=1):
        a.apply(i, w)
        if b is not None:
            b.apply(i, w)
        if i % 37 == 0:
            snap = a.snapshot()
            rows = master_pb2.SysCatalogSnapshotPB.FromString(snap).rows
            listed = [(r.entry_type, r.entry_id) for r in rows]
            assert listed == sorted((r.key.entry_type.value, r.key.entry_id) for r in a.rows())
            if b is not None:
                assert b.snapshot() == snap
            if i == 37 * 3:
                b = SysCatalogState()
                b.restore(snap)
    assert b is not None


@pytest.mark.parametrize("seed", range(20))
def test_the_kept_key_order_matches_sorting_after_any_adds_and_drops(seed: int) -> None:
    """`_KeyOrder` against a model (a dict sorted from scratch): keys added, dropped, dropped
    and added back, between and across calls."""
    rng = random.Random(seed)
    order, present = _KeyOrder(), {}
    for _ in range(30):
        for _ in range(rng.randrange(40)):
            key = f"k{rng.randrange(60):02d}"
            if key in present and rng.random() < 0.5:
                del present[key]
                order.drop(key)
            elif key not in present:
                present[key] = b""
                order.add(key)
        assert order.sorted_keys(present) == sorted(present)


def test_a_sliced_snapshot_is_the_same_bytes_and_refuses_a_state_that_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`snapshot_sliced` gathers rows a slice at a time with the loop running: the bytes are
    `snapshot`'s; an entry applied between two slices (the node holds applies, so a bug) is
    an Internal error, not a snapshot of two states."""
    monkeypatch.setattr(sys_catalog, "SNAPSHOT_SLICE_ROWS", 7)
    writes = random_writes(5, 200)
    a = SysCatalogState()
    for i, w in enumerate(writes[:150], start=1):
        a.apply(i, w)

    async def main() -> None:
        assert await a.snapshot_sliced() == a.snapshot()
        taking = asyncio.ensure_future(a.snapshot_sliced())
        await asyncio.sleep(0)
        a.apply(151, writes[150])
        with pytest.raises(Internal, match="applied during the snapshot"):
            await taking

    asyncio.run(main())


def test_a_restored_replica_continues_identically() -> None:
    writes = random_writes(23, 240)
    a = SysCatalogState(request_retention_entries=50)
    for i, w in enumerate(writes[:120], start=1):
        a.apply(i, w)
    b = SysCatalogState(request_retention_entries=50)
    b.restore(a.snapshot())
    for i, w in enumerate(writes[120:], start=121):
        assert a.apply(i, w) == b.apply(i, w)
    assert a.snapshot() == b.snapshot()


def test_restore_refuses_corrupt_snapshots_and_other_bounds() -> None:
    ids = Ids()
    a = SysCatalogState()
    table = make_table(ids())
    apply_ok(a, 1, create_table_write(table, make_tablets(table, ids)))
    snap = a.snapshot()
    b = SysCatalogState()
    with pytest.raises(Corruption):
        b.restore(b"\x08\x01\x12garbage")
    orphan = master_pb2.SysCatalogSnapshotPB.FromString(snap)
    del orphan.rows[0]  # the table row: its tablets now name an unknown table
    with pytest.raises(Corruption, match="unknown table"):
        b.restore(orphan.SerializeToString())
    with pytest.raises(FailedPrecondition):
        SysCatalogState(max_results_per_client=3).restore(snap)
    assert len(b) == 0 and b.applied_index == 0  # unchanged by the failed restores
    b.restore(snap)
    assert b.snapshot() == snap


# --- listeners -------------------------------------------------------------------------------


def test_listeners_see_applied_writes_and_restores() -> None:
    ids = Ids()
    state = SysCatalogState()
    seen: list[CatalogChange] = []

    def broken(change: CatalogChange) -> None:
        raise RuntimeError("listener bug")

    state.add_listener(broken)  # logged, does not stop the apply or the others
    remove = state.add_listener(seen.append)
    table = make_table(ids())
    tablets = make_tablets(table, ids)
    first = apply_ok(state, 1, create_table_write(table, tablets))
    refusal_of(state, 2, create_table_write(table, tablets))  # refused: no call
    state.restore(state.snapshot())
    remove()
    apply_ok(state, 3, CatalogWrite())
    assert seen == [first, Restored(2)]
    assert [r.key.entry_type for r in first.written] == [RecordType.TABLE] + [
        RecordType.TABLET
    ] * len(tablets)


# --- size of the big entry -------------------------------------------------------------------


def test_create_table_of_1000_tablets_is_one_modest_entry() -> None:
    """docs/design/catalog.md#R4: Kudu measured about 117 KB for CreateTable with 1,000 tablets x 3
    replicas."""
    ids = Ids()
    servers = [ids() for _ in range(30)]
    table = make_table(ids(), "big", buckets=10, splits=100)
    preparing = make_tablets(table, ids)
    assert len(preparing) == 1000
    request = RequestId(ids(), 1)
    entry = create_table_write(table, preparing, request).encode()

    # With replicas chosen up front (the tablets CREATING with a 3-voter config each).
    placed = make_tablets(table, ids, servers=servers, replicas=3)
    placed_entry = create_table_write(table, placed, request).encode()
    per = (len(placed_entry) - len(entry)) / 1000
    print(
        f"\nCreateTable 1,000 tablets: {len(entry):,} bytes as one entry (PREPARING, as Kudu "
        f"writes it); {len(placed_entry):,} bytes with 3 replicas chosen per tablet "
        f"(+{per:.0f} B/tablet); Kudu measured ~117 KB"
    )
    assert len(entry) < 256 * 1024
    assert len(placed_entry) < 1 << 20

    state = SysCatalogState()
    t0 = time.perf_counter()
    result = state.apply(1, placed_entry)
    elapsed = time.perf_counter() - t0
    assert result.ok and len(result.written) == 1001
    assert len(state.tablets_of(table.table_id)) == 1000
    snap = state.snapshot()
    print(f"applied in {elapsed * 1000:.0f} ms; snapshot {len(snap):,} bytes")
    assert len(snap) < 1 << 20


# --- partitions and replacements -------------------------------------------------------------


def content(state: SysCatalogState) -> bytes:
    """The snapshot without `applied_index` (which every entry advances, refused or not)."""
    snap = master_pb2.SysCatalogSnapshotPB.FromString(state.snapshot())
    snap.applied_index = 0
    return snap.SerializeToString(deterministic=True)


class Replacing:
    """A table of two CREATING tablets (two hash buckets, each unbounded in range: the second
    ends at b"", unbounded) and a fresh id for a replacement of the first."""

    def __init__(self) -> None:
        ids = Ids(21)
        self.ids = ids
        self.state = SysCatalogState()
        self.table = make_table(ids(), "t")
        self.tablets = make_tablets(self.table, ids, servers=[ids() for _ in range(3)])
        assert len(self.tablets) == 2 and self.tablets[1].partition.partition_key_end == b""
        apply_ok(self.state, 1, create_table_write(self.table, self.tablets))
        self.old = self.tablets[0]
        self.new_id = TabletId(ids())

    def replaced(self, by: str | None = None) -> TabletRecord:
        return dataclasses.replace(
            self.old, state=TabletState.REPLACED, replaced_by=TabletId(by or self.new_id)
        )

    def replacement(self, replaces: str | None = None, **changes: object) -> TabletRecord:
        record = TabletRecord(
            tablet_id=self.new_id,
            table_id=self.table.table_id,
            partition=self.old.partition,
            state=TabletState.PREPARING,
            replaces=TabletId(replaces or self.old.tablet_id),
        )
        return dataclasses.replace(record, **changes)  # type: ignore[arg-type]

    def ok(self, write: CatalogWrite) -> ApplyResult:
        return apply_ok(self.state, self.state.applied_index + 1, write)

    def refused(self, *ops: RowOp) -> tuple[str, str]:
        before = content(self.state)
        result = refusal_of(self.state, self.state.applied_index + 1, CatalogWrite(ops=ops))
        assert content(self.state) == before  # nothing changed at all
        return result


def test_a_replacement_marks_the_old_tablet_replaced_in_the_same_write() -> None:
    r = Replacing()
    r.ok(CatalogWrite(ops=(Update(r.replaced()), Insert(r.replacement()))))
    old, new = r.state.tablet(r.old.tablet_id), r.state.tablet(r.new_id)
    assert old is not None and old.record.state is TabletState.REPLACED
    assert new is not None and new.record.replaces == r.old.tablet_id
    live = {
        t.record.tablet_id
        for t in r.state.tablets_of(r.table.table_id)
        if not t.record.state.is_terminal
    }
    assert live == {r.new_id, r.tablets[1].tablet_id}

    # The replacement goes on as any tablet; its link is fixed, the old one's too.
    servers = [r.ids() for _ in range(3)]
    creating = dataclasses.replace(
        new.record, state=TabletState.CREATING, consensus=make_consensus(servers)
    )
    r.ok(CatalogWrite(ops=(Update(creating),)))
    code, message = r.refused(Update(dataclasses.replace(creating, replaces=None)))
    assert code == "INVALID_ARGUMENT" and "replaces is fixed" in message
    code, message = r.refused(Update(r.replaced(by=r.tablets[1].tablet_id)))
    assert code == "FAILED_PRECONDITION" and r.new_id in message

    # A replacement of the replacement: the same dance, one write.
    newer = TabletId(r.ids())
    r.ok(
        CatalogWrite(
            ops=(
                Update(
                    dataclasses.replace(creating, state=TabletState.REPLACED, replaced_by=newer)
                ),
                Insert(r.replacement(tablet_id=newer, replaces=r.new_id)),
            )
        ),
    )
    # DELETED may follow REPLACED (the record then names no replacement): the tablet that
    # replaced it stays writable, but no new tablet can claim to replace a DELETED one.
    gone = dataclasses.replace(r.replaced(), state=TabletState.DELETED, replaced_by=None)
    r.ok(CatalogWrite(ops=(Update(gone),)))
    row = r.state.tablet(r.new_id)
    assert row is not None
    r.ok(CatalogWrite(ops=(Update(dataclasses.replace(row.record, state_msg="x")),)))
    late = r.replacement(tablet_id=TabletId(r.ids()), state=TabletState.DELETED)
    code, message = r.refused(Insert(late))
    assert code == "INVALID_ARGUMENT" and late.tablet_id in message and r.old.tablet_id in message


def test_overlapping_live_tablets_of_one_table_are_refused() -> None:
    r = Replacing()
    t0, t1 = r.tablets

    # A second tablet for the first one's partition, the first left CREATING.
    twin = r.replacement(replaces=None)
    twin = dataclasses.replace(twin, replaces=None)
    code, message = r.refused(Insert(twin))
    assert code == "FAILED_PRECONDITION"
    assert t0.tablet_id in message and twin.tablet_id in message and r.table.table_id in message
    assert "REPLACED in the same write" in message

    # Two new ones overlapping each other in one write (the old one properly REPLACED).
    other = dataclasses.replace(twin, tablet_id=TabletId(r.ids()))
    old_gone = dataclasses.replace(t0, state=TabletState.DELETED)
    code, message = r.refused(Update(old_gone), Insert(twin), Insert(other))
    assert code == "FAILED_PRECONDITION" and twin.tablet_id in message
    assert other.tablet_id in message

    # A replacement whose partition runs on to the end (b"": unbounded) meets the second tablet,
    # though the tablet it replaces is REPLACED.
    wide = r.replacement(partition=dataclasses.replace(t0.partition, partition_key_end=b""))
    code, message = r.refused(Update(r.replaced()), Insert(wide))
    assert code == "FAILED_PRECONDITION" and t1.tablet_id in message and r.new_id in message
    assert "unbounded" in message

    # Tablets of another table, REPLACED or DELETED ones, do not count.
    second = make_table(r.ids(), "u")
    r.ok(create_table_write(second, make_tablets(second, r.ids)))
    r.ok(CatalogWrite(ops=(Update(old_gone),)))
    r.ok(CatalogWrite(ops=(Insert(twin),)))
    assert len(r.state.tablets_of(r.table.table_id)) == 3


def test_replaces_and_replaced_by_must_name_each_other() -> None:
    r = Replacing()
    t0, t1 = r.tablets
    # The old tablet left CREATING (or only DELETED) while the new one claims to replace it.
    code, message = r.refused(Insert(r.replacement()))
    assert code == "INVALID_ARGUMENT" and r.new_id in message and t0.tablet_id in message
    assert r.table.table_id in message and "CREATING" in message
    deleted = dataclasses.replace(t0, state=TabletState.DELETED)
    code, message = r.refused(Update(deleted), Insert(r.replacement()))
    assert code == "INVALID_ARGUMENT" and "DELETED" in message
    # REPLACED without naming the new one, or naming another.
    no_link = dataclasses.replace(t0, state=TabletState.REPLACED)
    code, message = r.refused(Update(no_link), Insert(r.replacement()))
    assert code == "INVALID_ARGUMENT" and "replaced_by None" in message
    code, message = r.refused(Update(r.replaced(by=t1.tablet_id)), Insert(r.replacement()))
    assert code == "INVALID_ARGUMENT" and t1.tablet_id in message
    # The old one names the new one, which does not name it back.
    unlinked = dataclasses.replace(r.replacement(), replaces=None)
    code, message = r.refused(Update(r.replaced()), Insert(unlinked))
    assert code == "INVALID_ARGUMENT" and "replaces None" in message
    # Replacing a tablet of another table, or one that does not exist.
    second = make_table(r.ids(), "u")
    theirs = make_tablets(second, r.ids)
    r.ok(create_table_write(second, theirs))
    code, message = r.refused(Insert(r.replacement(replaces=theirs[0].tablet_id)))
    assert code == "INVALID_ARGUMENT" and "another table" in message
    code, message = r.refused(Insert(r.replacement(replaces=r.ids())))
    assert code == "NOT_FOUND"
    # Two tablets cannot replace one.
    ok = CatalogWrite(ops=(Update(r.replaced()), Insert(r.replacement())))
    r.ok(ok)
    rival = r.replacement(tablet_id=TabletId(r.ids()), state=TabletState.DELETED)
    code, message = r.refused(Insert(rival))
    assert code == "INVALID_ARGUMENT" and rival.tablet_id in message


def test_overlap_of_partition_key_intervals() -> None:
    from service.common.partition import Partition
    from service.master.sys_catalog import _overlap

    def tablet(start: bytes, end: bytes) -> TabletRecord:
        p = Partition((), start, end, start, end)
        return TabletRecord(TabletId("0" * 32), TableId("1" * 32), p, TabletState.PREPARING)

    cases = [
        ((b"", b"m"), (b"m", b""), False),  # adjacent: [.., m) and [m, ..)
        ((b"", b"m"), (b"l", b"n"), True),
        ((b"a", b""), (b"z", b""), True),
        ((b"", b""), (b"q", b"r"), True),  # one tablet owning everything
        ((b"b", b"c"), (b"d", b"e"), False),
        ((b"d", b""), (b"a", b"d"), False),
    ]
    for a, b, expected in cases:
        assert _overlap(tablet(*a), tablet(*b)) is expected, (a, b)
        assert _overlap(tablet(*b), tablet(*a)) is expected, (b, a)


def test_the_overlap_check_agrees_with_brute_force_and_its_index_survives_restore() -> None:
    """The overlap check reads a sorted index of each table's live tablets instead of sorting
    the table per write (a replacement round over a 10,000-tablet table). Random inserts of
    live tablets with random bounds, some replacing a live one in the same write: the write
    is refused exactly when, after it, two live tablets would overlap (counted by brute
    force); and the index equals one rebuilt from the rows, also after a restore."""
    from service.common.partition import Partition
    from service.master.sys_catalog import _overlap

    rng = random.Random(5)
    ids = Ids(33)
    state = SysCatalogState()
    table = make_table(ids(), "t", buckets=4, splits=4)
    tablets = make_tablets(table, ids, servers=[ids() for _ in range(3)])
    index = 1
    apply_ok(state, index, create_table_write(table, tablets))
    points = sorted({rng.randbytes(3) for _ in range(40)})

    def live_rows() -> list[TabletRecord]:
        return [
            r.record for r in state.tablets_of(table.table_id) if not r.record.state.is_terminal
        ]

    def index_is_exact() -> bool:
        want = sorted((t.partition.partition_key_start, t.tablet_id) for t in live_rows())
        return state._live_starts.get(table.table_id, []) == want

    refused = accepted = 0
    for _ in range(300):
        a, b = sorted(rng.sample([*points, b""], 2))
        start, end = (b, a) if a == b"" else (a, b)  # b"" only as an (unbounded) end
        prefix = b"\x00\x00\x00\x00"  # hash bucket 0
        partition = Partition((0,), start, end, prefix + start, prefix + end if end else b"")
        new = TabletRecord(
            tablet_id=TabletId(ids()),
            table_id=table.table_id,
            partition=partition,
            state=TabletState.PREPARING,
        )
        ops: list[RowOp] = [Insert(new)]
        live = live_rows()
        if live and rng.random() < 0.5:  # replace a live one in the same write
            old = rng.choice(live)
            new = dataclasses.replace(new, partition=old.partition, replaces=old.tablet_id)
            gone = dataclasses.replace(old, state=TabletState.REPLACED, replaced_by=new.tablet_id)
            ops = [Update(gone), Insert(new)]
            live = [t for t in live if t.tablet_id != old.tablet_id]
        expect_refusal = any(_overlap(t, new) for t in live)
        index += 1
        result = state.apply(index, CatalogWrite(ops=tuple(ops)).encode())
        if expect_refusal:
            assert result.refusal is not None and result.refusal.code == "FAILED_PRECONDITION"
            refused += 1
        else:
            assert result.ok, result.refusal
            accepted += 1
        assert index_is_exact()
    assert refused > 20 and accepted > 20
    restored = SysCatalogState()
    restored.restore(state.snapshot())
    assert restored._live_starts == state._live_starts
