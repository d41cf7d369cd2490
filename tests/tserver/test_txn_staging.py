"""A participant's staging of transactions (service/tserver/txn_staging.py), on a real row store:
staged rows decided like plain writes and invisible, a commit that applies the kept attempts at
the commit timestamp, write conflicts against the transaction's snapshot, the safe-time cap of a
prepared transaction, the WAL anchor, the entries' encoding (hostile bytes included) and the
leader's row locks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from service.common.errors import Aborted
from service.common.keys import encode_key
from service.common.predicates import ScanSpec
from service.common.schema import ColumnType, Schema
from service.tserver import txn_staging as txns
from service.tserver.row_ops import RowOp, WriteBatch, decode_write
from service.tserver.rowstore import RowStore
from service.tserver.txn_staging import RowLocks, TabletTxns

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("v", ColumnType.STRING), ("n", ColumnType.INT64)], "id"
)


def _batch(rows: list[dict[str, Any]], op: RowOp) -> WriteBatch:
    names = list(rows[0])
    arrow = SCHEMA.to_arrow()
    t = pa.Table.from_pylist(rows, schema=pa.schema([arrow.field(n) for n in names]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return decode_write(SCHEMA, sink.getvalue().to_pybytes(), int(op), [])


def _rows(store: RowStore, at: int | None = None) -> dict[int, tuple[Any, Any]]:
    return {
        r["id"]: (r["v"], r["n"]) for b in store.scan(ScanSpec(read_at=at)) for r in b.to_pylist()
    }


@pytest.fixture
def store(tmp_path: Path) -> RowStore:
    s = RowStore.create(tmp_path / "t", SCHEMA)
    s.apply_write(1, _batch([{"id": i, "v": f"c{i}", "n": i} for i in range(5)], RowOp.UPSERT), 10)
    return s


def _stage(
    store: RowStore,
    t: TabletTxns,
    txn: int,
    rows: list[dict[str, Any]],
    op: RowOp,
    attempt: str = "a",
) -> Any:
    index = store.applied_index + 1
    state = t.stage(txn)
    assert not isinstance(state, txns.TxnRefusal)
    mem = t.scratch(state, attempt, SCHEMA, index)
    store.note_index(index)
    result, live = store.stage_write(_batch(rows, op), mem)
    state.live_delta[attempt] = state.live_delta.get(attempt, 0) + live
    return result


def test_staged_rows_are_decided_like_a_write_and_invisible(store: RowStore) -> None:
    t = TabletTxns()
    t.begin(2, 7, "user:u", 10)
    res = _stage(
        store, t, 7, [{"id": 0, "v": "x", "n": 0}, {"id": 9, "v": "x", "n": 9}], RowOp.INSERT
    )
    assert res.rows_applied == 1 and [i for i, _ in res.errors] == [0]  # 0 exists
    res = _stage(store, t, 7, [{"id": 1, "n": 100}], RowOp.UPDATE)  # a partial update
    assert res.rows_applied == 1
    res = _stage(store, t, 7, [{"id": 9, "n": 99}], RowOp.UPDATE)  # over its own staged row
    assert res.rows_applied == 1
    res = _stage(store, t, 7, [{"id": 2}], RowOp.DELETE)
    assert res.rows_applied == 1
    assert _rows(store) == {i: (f"c{i}", i) for i in range(5)}  # nothing shows
    assert t.locked_keys() == {encode_key(SCHEMA.key_columns, (k,)): 7 for k in (1, 2, 9)}
    state = t.txns[7]
    state.prepare_ts = 20
    items, layout = state.commit_write(None)
    assert len(items) == 3  # 9, 1 and 2 (its deletion): one image per key staged
    store.apply_staged(store.applied_index + 1, items, layout, 25, state.kept_live_delta(None))
    after = _rows(store)
    assert after[1] == ("c1", 100) and after[9] == ("x", 99) and 2 not in after
    assert _rows(store, 24) == {i: (f"c{i}", i) for i in range(5)}
    assert _rows(store, 25) == after


def test_a_commit_keeps_only_the_named_attempts_later_ones_winning(store: RowStore) -> None:
    t = TabletTxns()
    t.begin(2, 7, "user:u", 10)
    _stage(store, t, 7, [{"id": 20, "v": "first", "n": 1}], RowOp.UPSERT, "task-1")
    _stage(store, t, 7, [{"id": 21, "v": "failed", "n": 1}], RowOp.UPSERT, "task-2")
    _stage(store, t, 7, [{"id": 20, "v": "retry", "n": 2}], RowOp.UPSERT, "task-3")
    items, layout = t.txns[7].commit_write(["task-1", "task-3"])
    store.apply_staged(store.applied_index + 1, items, layout, 30, 1)
    got = _rows(store)
    assert got[20] == ("retry", 2) and 21 not in got
    t.begin(9, 8, "user:u", 10)
    _stage(store, t, 8, [{"id": 22, "v": "x", "n": 1}], RowOp.UPSERT, "task-1")
    assert t.txns[8].commit_write([]) == ([], ())  # kept nothing: nothing to write


def test_write_conflicts_against_the_snapshot(store: RowStore) -> None:
    store.apply_write(2, _batch([{"id": 3, "v": "later", "n": 3}], RowOp.UPSERT), 50)
    store.apply_write(3, _batch([{"id": 4}], RowOp.DELETE), 60)
    own = [{encode_key(SCHEMA.key_columns, (4,)): None}]
    for start, key, conflict in [(40, 3, True), (50, 3, False), (55, 4, True), (10, 1, False)]:
        found = store.write_conflict(_batch([{"id": key}], RowOp.DELETE), start)
        assert (found is not None) == conflict, (start, key)
    # The transaction's own staged keys never conflict with themselves.
    assert store.write_conflict(_batch([{"id": 4}], RowOp.DELETE), 55, own) is None
    # Versions in flushed files count as well.
    store.flush()
    assert store.write_conflict(_batch([{"id": 3}], RowOp.DELETE), 40) is not None
    # Sources older than the snapshot are not even looked at: nothing newer, no conflict.
    assert store.write_conflict(_batch([{"id": 3}], RowOp.DELETE), 60) is None


def test_the_prepared_transaction_caps_the_safe_time_and_pins_the_log() -> None:
    t = TabletTxns()
    t.begin(5, 1, "u", 0)
    assert t.safe_time_cap() is None and t.first_index() == 5
    assert t.prepare(7, 1, 1000) == 1000
    assert t.prepare(8, 1, 2000) == 1000  # repeated: the first prepare stands
    assert t.safe_time_cap() == 999
    assert t.prepare(9, 2, 900) == 900  # nothing staged here: prepared empty all the same
    assert t.safe_time_cap() == 899
    assert isinstance(t.stage(2), txns.TxnRefusal)  # a write after the prepare is refused
    state = t.resolve(1)
    assert state is not None
    t.pin(state, 12)  # committed, not flushed: the log stays from its first entry
    t.resolve(2)
    assert t.safe_time_cap() is None and t.first_index() == 5
    t.unpin(11)
    assert t.first_index() == 5
    t.unpin(12)
    assert t.first_index() is None
    assert isinstance(t.stage(1), txns.TxnRefusal) and 1 in t.recently_ended


@pytest.mark.parametrize(
    "entry",
    [
        txns.begin_entry(5, 77, "user:alice"),
        txns.stage_entry(5, "attempt-é", b"W" + b"rows"),
        txns.prepare_entry(5, 123),
        txns.commit_entry(5, 456, ["a", "b"]),
        txns.commit_entry(5, 456, None, 20_000, 40_000, False),
        txns.abort_entry(5),
    ],
)
def test_entries_round_trip(entry: bytes) -> None:
    e = txns.decode_entry(entry)
    assert e.txn_id == 5 and e.kind == entry[:1]
    if e.kind == txns.BEGIN:
        assert (e.ts, e.owner) == (77, "user:alice")
    if e.kind == txns.STAGE:
        assert (e.attempt, e.write) == ("attempt-é", b"rows")
    if e.kind == txns.COMMIT:
        assert e.ts == 456 and e.kept in (("a", "b"), None)
        assert (e.start, e.end, e.final) in ((0, 0, True), (20_000, 40_000, False))


@pytest.mark.parametrize(
    "data",
    [
        b"B",
        b"T\x00\x00",
        b"P" + b"\x00" * 9,
        b"C" + b"\x00" * 16 + b"{",
        b"C" + b"\x00" * 33 + b"[1, 2]",
        b"C" + b"\x00" * 23 + b"\x09" + b"\x00" * 8 + b"\x01null",
        b"Q" + b"\x00" * 8,
        b"T" + b"\x00" * 8 + b"\xff\xff",
    ],
)
def test_hostile_entries_raise_and_never_crash(data: bytes) -> None:
    """An entry that does not decode fails the replica that applies it (tablet.py) with a
    Python error, never a crash of the process."""
    with pytest.raises(ValueError):
        txns.decode_entry(data)


def test_row_locks_wait_then_fail_naming_the_key_and_holder() -> None:
    async def main() -> None:
        locks = RowLocks()
        await locks.acquire([b"k1", b"k2"], 1, 1.0, lambda k: k.decode())
        await locks.acquire([b"k1"], 1, 1.0, lambda k: k.decode())  # its own: free
        with pytest.raises(Aborted, match="k1 is locked by transaction 1"):
            await locks.acquire([b"k1"], 2, 0.1, lambda k: k.decode())
        # A plain write waits, and goes once the holder is done.
        waiter = asyncio.create_task(locks.acquire([b"k2"], None, 5.0, lambda k: k.decode()))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        locks.release(1)
        await asyncio.wait_for(waiter, 1.0)
        assert locks.held == {}  # a plain write takes no lock
        locks.rebuild({b"x": 9})
        assert locks.conflict([b"x"], 3) == (b"x", 9) and locks.conflict([b"x"], 9) is None

    asyncio.run(main())
