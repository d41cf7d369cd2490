"""RowStore: writes, scans, flush, restart, alters, compaction, checksums and snapshots.

Real files and real fsync in tmp_path; every scenario checks the logical contents through scan.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from service.common.errors import AlreadyExists, Corruption, InvalidArgument, NotFound
from service.common.keys import encode_key
from service.common.partition import HashBucketSchema, Partition, PartitionSchema, RangeSchema
from service.common.predicates import ColumnPredicate, ScanSpec
from service.common.schema import AddColumn, ColumnType, DropColumn, RenameColumn, Schema
from service.tserver import rowstore_memstore
from service.tserver.row_ops import RowOp, WriteBatch, decode_write
from service.tserver.rowstore import (
    MANIFEST,
    OUTSIDE_SAMPLE_KEYS,
    AppliedWrite,
    Checksum,
    RowStore,
)
from service.tserver.rowstore_files import KeyIndex, KeyQuery
from tests.helpers.rowstore import Writer

T = ColumnType


@pytest.fixture
def schema() -> Schema:
    return Schema.build([("id", T.INT64), ("s", T.STRING), ("x", T.DOUBLE)], "id")


@pytest.fixture
def store(tmp_path: Path, schema: Schema) -> RowStore:
    return RowStore.create(tmp_path / "t", schema)


def rows(store: RowStore, spec: ScanSpec | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in store.scan(spec or ScanSpec()):
        out.extend(b.to_pylist())
    return out


def r(i: int, s: str | None = None, x: float | None = None) -> dict[str, Any]:
    return {"id": i, "s": s if s is not None else f"s{i}", "x": x if x is not None else i / 2}


def key(store: RowStore, *values: object) -> bytes:
    return encode_key(store.schema, list(values))


# --- writes --------------------------------------------------------------------------------


def test_insert_scan_and_duplicate_per_row_error(store: RowStore) -> None:
    w = Writer(store)
    assert w([r(3), r(1), r(2)]) == AppliedWrite(3, ())
    res = w([r(4), r(2, "dup"), r(5)])
    assert res.rows_applied == 2
    assert [i for i, _ in res.errors] == [1]
    err = res.errors[0][1]
    assert isinstance(err, AlreadyExists) and "key (id=2) already exists" in err.message
    assert rows(store) == [r(1), r(2), r(3), r(4), r(5)]
    assert store.row_count() == 5


def test_insert_ignore_skips_existing(store: RowStore) -> None:
    w = Writer(store)
    w([r(1)])
    res = w([r(1, "new"), r(2)], RowOp.INSERT_IGNORE)
    assert res == AppliedWrite(1, ())
    assert rows(store) == [r(1), r(2)]


def test_upsert_and_update_partial_columns(store: RowStore) -> None:
    w = Writer(store)
    w([r(1), r(2)])
    store.flush()  # the old versions now live in a file
    # UPSERT: an existing row keeps absent columns; a new row gets null.
    assert w([{"id": 1, "s": "one"}, {"id": 9, "s": "nine"}], RowOp.UPSERT).rows_applied == 2
    # UPDATE changes only the present columns; a missing key is NotFound.
    res = w([{"id": 2, "x": 20.0}, {"id": 7, "x": 1.0}], RowOp.UPDATE)
    assert res.rows_applied == 1 and isinstance(res.errors[0][1], NotFound)
    assert res.errors[0][0] == 1 and "key (id=7) not found" in res.errors[0][1].message
    assert rows(store) == [r(1, "one"), r(2, x=20.0), {"id": 9, "s": "nine", "x": None}]
    # Null in a present column sets null.
    w([{"id": 1, "s": None}], RowOp.UPDATE)
    assert rows(store)[0] == {"id": 1, "s": None, "x": 0.5}


def test_partial_update_of_many_rows_in_several_files_merges_each_live_version(
    store: RowStore,
) -> None:
    # The live versions a partial write merges over are read from files with one take per
    # file; each row must still come from its newest source.
    w = Writer(store)
    w([r(i, "file1", x=1.0) for i in range(0, 3000)])
    store.flush()
    w([r(i, "file2", x=2.0) for i in range(0, 3000, 2)], RowOp.UPSERT)
    w([{"id": i} for i in range(0, 3000, 5)], RowOp.DELETE)
    store.flush()
    w([r(i, "frozen", x=3.0) for i in range(0, 3000, 3)], RowOp.UPSERT)
    assert store.freeze() is not None
    w([r(i, "mem", x=None) for i in range(0, 3000, 7)], RowOp.UPSERT)
    res = w([{"id": i, "x": -float(i)} for i in range(3000)], RowOp.UPDATE)

    def newest(i: int) -> str | None:
        if i % 7 == 0:
            return "mem"
        if i % 3 == 0:
            return "frozen"
        if i % 5 == 0:
            return None
        return "file2" if i % 2 == 0 else "file1"

    live = [i for i in range(3000) if newest(i) is not None]
    assert res.rows_applied == len(live) and len(res.errors) == 3000 - len(live)
    assert rows(store) == [{"id": i, "s": newest(i), "x": -float(i)} for i in live]


def test_delete_then_reinsert_and_missing_delete(store: RowStore) -> None:
    w = Writer(store)
    w([r(1), r(2)])
    store.flush()
    res = w([{"id": 1}, {"id": 3}], RowOp.DELETE)
    assert res.rows_applied == 1 and isinstance(res.errors[0][1], NotFound)
    assert rows(store) == [r(2)]
    assert w([r(1, "again")]) == AppliedWrite(1, ())
    assert rows(store) == [r(1, "again"), r(2)]
    assert store.row_count() == 2


def test_rows_in_one_batch_apply_in_order(store: RowStore) -> None:
    w = Writer(store)
    ops = [RowOp.INSERT, RowOp.UPDATE, RowOp.DELETE, RowOp.INSERT, RowOp.INSERT]
    res = w([r(1), r(1, "u"), r(1), r(1, "back"), r(1, "dup")], ops=[int(o) for o in ops])
    assert res.rows_applied == 4 and [i for i, _ in res.errors] == [4]
    assert rows(store) == [r(1, "back")]


def test_replayed_indexes_are_skipped(store: RowStore, schema: Schema) -> None:
    w = Writer(store)
    w([r(1)])
    batch = decode_write(schema, _ipc(pa.Table.from_pylist([r(2)])), RowOp.INSERT, [])
    assert store.apply_write(1, batch) == AppliedWrite(skipped=True)
    store.note_index(5)
    assert store.applied_index == 5
    assert store.apply_write(5, batch).skipped
    assert store.apply_write(6, batch) == AppliedWrite(1, ())
    assert store.apply_write(7, WriteBatch.decode(batch.encode(), schema)).errors


def _ipc(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return bytes(sink.getvalue().to_pybytes())


def test_newest_version_wins_across_files_frozen_and_memstore(store: RowStore) -> None:
    w = Writer(store)
    w([r(i, "file1") for i in range(10)])
    store.flush()
    w([r(i, "file2") for i in range(0, 10, 2)], RowOp.UPSERT)
    store.flush()
    w([r(i, "frozen") for i in range(0, 10, 3)], RowOp.UPSERT)
    frozen = store.freeze()
    assert frozen is not None
    w([r(i, "mem") for i in range(0, 10, 4)], RowOp.UPSERT)
    w([{"id": 5}], RowOp.DELETE)
    expected = {
        0: "mem",
        1: "file1",
        2: "file2",
        3: "frozen",
        4: "mem",
        6: "frozen",
        7: "file1",
        8: "mem",
        9: "frozen",
    }
    assert [(x["id"], x["s"]) for x in rows(store)] == sorted(expected.items())
    before = store.checksum()
    store.write_frozen(frozen)
    assert [(x["id"], x["s"]) for x in rows(store)] == sorted(expected.items())
    store.install(frozen)
    assert store.checksum() == before
    assert store.row_count() == 9
    # INSERT sees keys wherever they live, and a tombstone in the memstore hides the file.
    res = w([r(1), r(3), r(5)])
    assert [i for i, _ in res.errors] == [0, 1] and res.rows_applied == 1


# --- durability ----------------------------------------------------------------------------


def test_restart_after_flush_recovers_rows(tmp_path: Path, store: RowStore) -> None:
    w = Writer(store)
    w([r(i) for i in range(100)])
    w([{"id": 5}], RowOp.DELETE)
    store.flush()
    assert store.flushed_index == 2
    w([r(1000)])  # not flushed: the WAL replay would bring it back
    expected = store.checksum()
    store.close()
    again = RowStore.open(tmp_path / "t")
    assert again.flushed_index == again.applied_index == 2
    assert again.row_count() == 99
    assert len(rows(again)) == 99
    Writer(again)([r(1000)])
    assert again.checksum() == expected


def test_flush_with_only_noops_advances_flushed_index(tmp_path: Path, store: RowStore) -> None:
    store.note_index(4)
    store.flush()
    assert RowStore.open(tmp_path / "t").flushed_index == 4


def test_after_a_failed_apply_nothing_reaches_the_files(tmp_path: Path, store: RowStore) -> None:
    """What the memstore holds after an entry failed half way must never be made durable: the
    manifest would say that entry is in the files and the replay would skip it."""
    w = Writer(store)
    w([r(i) for i in range(10)])
    store.flush()
    w([r(10)])  # as if the next entry raised after its first row went in
    store.fail("tablet t: log entry 2 could not be applied: a bug")
    manifest = (tmp_path / "t" / MANIFEST).read_bytes()
    for write in (store.flush, store.freeze):
        with pytest.raises(Corruption, match="nothing is written after a failed apply"):
            write()
    store.note_index(4)
    with pytest.raises(Corruption):
        store.flush()  # even one that would only advance flushed_index
    assert (tmp_path / "t" / MANIFEST).read_bytes() == manifest
    assert RowStore.open(tmp_path / "t").flushed_index == 1
    assert len(rows(store)) == 11  # still readable (the status pages count its rows)


def test_files_not_in_manifest_are_removed(tmp_path: Path, store: RowStore) -> None:
    w = Writer(store)
    w([r(1)])
    store.flush()
    w([r(2)])
    f = store.freeze()
    assert f is not None
    store.write_frozen(f)  # crash before install: the file is not in the manifest
    (tmp_path / "t" / "MANIFEST.tmp").write_bytes(b"half")
    (tmp_path / "t" / "other.txt").write_bytes(b"not ours")
    orphan = f.file_name
    store.close()
    again = RowStore.open(tmp_path / "t")
    names = sorted(os.listdir(tmp_path / "t"))
    assert orphan not in names and "MANIFEST.tmp" not in names and "other.txt" in names
    assert rows(again) == [r(1)]
    assert sorted(again.data_files()) == sorted(n for n in names if n != "other.txt")


def test_corrupt_or_missing_files(tmp_path: Path, store: RowStore) -> None:
    Writer(store)([r(1)])
    store.flush()
    d = tmp_path / "t"
    data = store.data_files()[1]
    store.close()
    with pytest.raises(AlreadyExists):
        RowStore.create(d, store.schema)
    (d / data).write_bytes(b"not arrow")
    with pytest.raises(Corruption, match=data):
        RowStore.open(d)
    (d / data).unlink()
    with pytest.raises(Corruption, match=f"{data}: missing"):
        RowStore.open(d)
    manifest = (d / MANIFEST).read_bytes()
    (d / MANIFEST).write_bytes(manifest[:-3] + b"xyz")
    with pytest.raises(Corruption, match="MANIFEST: checksum mismatch"):
        RowStore.open(d)
    (d / MANIFEST).unlink()
    with pytest.raises(Corruption, match="MANIFEST"):
        RowStore.open(d)


# --- schema evolution ----------------------------------------------------------------------


def test_alter_add_drop_rename_reads_old_files(
    tmp_path: Path, store: RowStore, schema: Schema
) -> None:
    w = Writer(store)
    w([r(1), r(2)])
    store.flush()
    w([r(3)])  # stays in the memstore across the alter
    s1 = store.schema.apply(
        [
            AddColumn("n", T.INT32, nullable=False, default=42),
            AddColumn("maybe", T.STRING),
            DropColumn("x"),
            RenameColumn("s", "label"),
        ]
    )
    store.alter_schema(store.applied_index + 1, s1)
    assert store.schema == s1
    expect_old = [{"id": i, "label": f"s{i}", "n": 42, "maybe": None} for i in (1, 2, 3)]
    assert rows(store) == expect_old
    w([{"id": 4, "label": "four", "n": 7, "maybe": "m"}])
    expected = [*expect_old, {"id": 4, "label": "four", "n": 7, "maybe": "m"}]
    assert rows(store) == expected
    # The manifest holds the new schema at once; old files are read through it after a restart.
    store.flush()
    store.close()
    again = RowStore.open(tmp_path / "t")
    assert again.schema == s1
    assert rows(again) == expected
    again.compact()
    assert rows(again) == expected
    # An alter to a version the store already runs (WAL replay) is a no-op.
    again.alter_schema(again.applied_index + 1, schema.apply([AddColumn("zz", T.BOOL)]))
    assert again.schema == s1


def test_alter_that_changes_the_key_is_refused(store: RowStore, schema: Schema) -> None:
    other = Schema.build([("k", T.STRING), ("s", T.STRING)], "k", version=5)
    with pytest.raises(InvalidArgument, match="key columns changed"):
        store.alter_schema(1, other)


def test_alter_while_frozen(store: RowStore) -> None:
    w = Writer(store)
    w([r(1)])
    f = store.freeze()
    assert f is not None
    store.alter_schema(store.applied_index + 1, store.schema.apply([DropColumn("s")]))
    # An UPDATE of a row that lives in the old-layout frozen memstore.
    w([{"id": 1, "x": 9.0}], RowOp.UPDATE)
    store.write_frozen(f)
    store.install(f)
    assert rows(store) == [{"id": 1, "x": 9.0}]


# --- scans ---------------------------------------------------------------------------------


def test_projection_bounds_start_after_and_limit(store: RowStore) -> None:
    w = Writer(store)
    w([r(i) for i in range(0, 20, 2)])
    store.flush()
    w([r(i) for i in range(1, 20, 2)])
    proj = ScanSpec(projection=("x", "id"))
    assert rows(store, proj)[:2] == [{"x": 0.0, "id": 0}, {"x": 0.5, "id": 1}]
    b = next(store.scan(proj))
    assert b.schema.names == ["x", "id"] and b.schema.field("id").nullable is False
    lo, hi = key(store, 5), key(store, 9)
    assert [x["id"] for x in rows(store, ScanSpec(lower_key=lo, upper_key=hi))] == [5, 6, 7, 8]
    after = ScanSpec(lower_key=lo, start_after_key=key(store, 6))
    assert [x["id"] for x in rows(store, after)][:3] == [7, 8, 9]
    assert [x["id"] for x in rows(store, ScanSpec(limit=3, lower_key=lo))] == [5, 6, 7]
    # Predicates on columns outside the projection.
    spec = ScanSpec(projection=("id",), predicates=(ColumnPredicate("x", "GE", (9.0,)),))
    assert rows(store, spec) == [{"id": 18}, {"id": 19}]
    with pytest.raises(InvalidArgument, match="unknown column 'nope'"):
        store.scan(ScanSpec(projection=("id", "nope")))


def test_scan_with_keys_resumes(store: RowStore) -> None:
    w = Writer(store)
    w([r(i) for i in range(50)])
    store.flush()
    w([r(i, "m") for i in range(25, 75)], RowOp.UPSERT)
    seen: list[int] = []
    last: bytes | None = None
    while True:
        it = store.scan_with_keys(ScanSpec(projection=("id",), start_after_key=last, limit=7))
        got = list(it)
        if not got:
            break
        for b, k in got:
            seen.extend(b.column("id").to_pylist())
            last = k
        assert last == key(store, seen[-1])
    assert seen == list(range(75))


def test_scan_is_a_snapshot(store: RowStore) -> None:
    w = Writer(store)
    w([r(1), r(2)])
    it = store.scan(ScanSpec())
    w([r(3)])
    w([{"id": 1}], RowOp.DELETE)
    store.flush()
    store.compact()
    assert [x["id"] for b in it for x in b.to_pylist()] == [1, 2]
    assert [x["id"] for x in rows(store)] == [2, 3]


def test_predicates_on_all_kinds(tmp_path: Path) -> None:
    schema = Schema.build(
        [
            ("k", T.STRING),
            ("ts", T.TIMESTAMP),
            AddColumn("d", T.DECIMAL, precision=8, scale=3),
            ("b", T.BINARY),
            ("dt", T.DATE),
        ],
        "k",
    )
    store = RowStore.create(tmp_path / "p", schema)
    w = Writer(store)
    when = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    w(
        [
            {
                "k": "ab",
                "ts": when,
                "d": decimal.Decimal("1.5"),
                "b": b"\x00",
                "dt": dt.date(2024, 1, 1),
            },
            {"k": "abc", "ts": None, "d": decimal.Decimal("-2"), "b": b"\xff", "dt": None},
            {"k": "b", "ts": when + dt.timedelta(days=1), "d": None, "b": None, "dt": None},
        ]
    )
    store.flush()
    w([{"k": "a\x00", "ts": when, "d": decimal.Decimal("0.001"), "b": b"", "dt": None}])

    def keys(*preds: ColumnPredicate) -> list[str]:
        return [x["k"] for x in rows(store, ScanSpec(predicates=preds))]

    assert keys() == ["a\x00", "ab", "abc", "b"]
    assert keys(ColumnPredicate("k", "PREFIX", ("ab",))) == ["ab", "abc"]
    assert keys(ColumnPredicate("ts", "EQ", (when,))) == ["a\x00", "ab"]
    assert keys(ColumnPredicate("ts", "IS_NULL")) == ["abc"]
    assert keys(ColumnPredicate("d", "LT", (decimal.Decimal("1.5"),))) == ["a\x00", "abc"]
    assert keys(ColumnPredicate("d", "IN", (decimal.Decimal("1.500"), 7))) == ["ab"]
    assert keys(ColumnPredicate("b", "PREFIX", (b"\xff",))) == ["abc"]
    assert keys(ColumnPredicate("dt", "IS_NOT_NULL")) == ["ab"]
    assert keys(ColumnPredicate("k", "GT", ("a",)), ColumnPredicate("k", "LT", ("b",))) == [
        "a\x00",
        "ab",
        "abc",
    ]
    # String keys go through the variable-width key index: bounds and existence checks.
    spec = ScanSpec(lower_key=encode_key(schema, ["ab"]), upper_key=encode_key(schema, ["b"]))
    assert [x["k"] for x in rows(store, spec)] == ["ab", "abc"]
    res = w([{"k": "ab"}, {"k": "zz"}], RowOp.DELETE)
    assert res.rows_applied == 1 and [i for i, _ in res.errors] == [1]


# --- compaction and checksums --------------------------------------------------------------


def test_compaction_drops_tombstones_and_keeps_contents(tmp_path: Path, store: RowStore) -> None:
    w = Writer(store)
    w([r(i) for i in range(100)])
    store.flush()
    w([{"id": i} for i in range(0, 100, 3)], RowOp.DELETE)
    w([r(i, "v2") for i in range(0, 100, 5)], RowOp.UPSERT)
    store.flush()
    before_rows, before_sum = rows(store), store.checksum()
    old_files = store.data_files()[1:]
    assert len(old_files) == 2
    store.compact()
    files = store.data_files()[1:]
    assert len(files) == 1 and files[0] not in old_files
    for f in old_files:
        assert not (tmp_path / "t" / f).exists()
    assert rows(store) == before_rows and store.checksum() == before_sum
    # The merged file holds live rows only.
    merged = pa.ipc.open_file(str(tmp_path / "t" / files[0])).read_all()
    assert merged.num_rows == store.row_count() == len(before_rows)
    assert not any(merged.column("d").to_pylist())
    store.close()
    assert rows(RowStore.open(tmp_path / "t")) == before_rows


def test_compaction_split_with_concurrent_flush(store: RowStore) -> None:
    w = Writer(store)
    w([r(i) for i in range(10)])
    store.flush()
    w([{"id": 1}], RowOp.DELETE)
    store.flush()
    c = store.prepare_compaction()
    assert c is not None
    w([r(1, "new")])
    store.flush()  # a newer file arrives while the compaction runs
    store.write_compaction(c)
    store.install_compaction(c)
    assert len(store.data_files()) == 3
    assert rows(store)[1] == r(1, "new")


def test_compacting_everything_away(store: RowStore) -> None:
    w = Writer(store)
    w([r(1)])
    store.flush()
    w([{"id": 1}], RowOp.DELETE)
    store.flush()
    store.compact()
    assert store.data_files() == [MANIFEST] and rows(store) == []


def test_checksum_independent_of_flush_history(tmp_path: Path, schema: Schema) -> None:
    a = RowStore.create(tmp_path / "a", schema)
    b = RowStore.create(tmp_path / "b", schema)
    wa, wb = Writer(a), Writer(b)
    wa([r(i) for i in range(30)])
    wa([{"id": 3, "s": None}], RowOp.UPDATE)
    wa([{"id": 4}], RowOp.DELETE)
    # b reaches the same contents through other writes, flushes and batch splits.
    wb([r(i, "old") for i in range(0, 30, 2)])
    b.flush()
    wb([r(i) for i in range(0, 30, 2)], RowOp.UPSERT)
    wb([r(i) for i in range(1, 30, 2)])
    b.flush()
    wb([{"id": 4}], RowOp.DELETE)
    wb([{"id": 3, "s": None}], RowOp.UPDATE)
    assert a.checksum() == b.checksum()
    b.compact()
    assert a.checksum() == b.checksum()
    wb([{"id": 7, "x": 1.25}], RowOp.UPDATE)
    assert a.checksum() != b.checksum()
    assert a.checksum().rows == 29


def _outside_of(ps: PartitionSchema, schema: Schema, tablet: int) -> tuple[Any, Partition]:
    partition = ps.create_partitions(schema)[tablet]
    return functools.partial(ps.rows_outside, schema, partition), partition


@pytest.mark.parametrize("layout", ["memstore", "file", "files and memstore"])
def test_checksum_counts_rows_outside_the_partition_in_the_same_pass(
    tmp_path: Path, layout: str
) -> None:
    """The predicate sees live rows (deleted and overwritten versions are not counted), by
    column name although the row store names columns by id (the key column was renamed, so
    name and id differ): the count and the first 10 encoded keys in key order are what the
    partition itself says, row by row, and the digest is the one taken without the check."""
    base = Schema.build([("id", T.INT64), ("s", T.STRING), ("x", T.DOUBLE)], "id")
    schema = base.apply([RenameColumn("id", "pk")])
    ps = PartitionSchema(hash=(HashBucketSchema(("pk",), 4),), range=RangeSchema(()))
    outside, partition = _outside_of(ps, schema, 1)
    store = RowStore.create(tmp_path / "t", schema)
    w = Writer(store)
    w([{"pk": i, "s": f"s{i}", "x": i / 2} for i in range(300)])
    if layout != "memstore":
        store.flush()
    w([{"pk": i} for i in range(0, 300, 7)], RowOp.DELETE)
    w([{"pk": i, "s": "v2"} for i in range(0, 300, 5)], RowOp.UPSERT)
    if layout == "file":
        store.flush()
        store.compact()
    live = sorted(set(range(300)) - set(range(0, 300, 7)) | set(range(0, 300, 5)))
    away = [i for i in live if not partition.contains(ps.partition_key_for_row(schema, {"pk": i}))]
    assert 0 < len(away) < len(live)
    keys = sorted(encode_key(schema, [i]) for i in away)

    got = store.checksum(outside)
    assert got.rows == len(live) and got.outside_rows == len(away)
    assert got.outside_sample_keys == tuple(keys[:OUTSIDE_SAMPLE_KEYS])
    assert (got.rows, got.digest) == (store.checksum().rows, store.checksum().digest)
    assert store.checksum() == Checksum(got.rows, got.digest)  # no predicate: nothing counted


def test_checksum_of_rows_all_inside_or_with_a_range_partition(tmp_path: Path) -> None:
    """A range partition [100, 200): rows below and above are outside, in key order; a
    tablet whose rows are all inside reports none."""
    schema = Schema.build([("id", T.INT64), ("s", T.STRING)], "id")
    ps = PartitionSchema(range=RangeSchema(("id",)), split_rows=((100,), (200,)))
    middle, _ = _outside_of(ps, schema, 1)
    store = RowStore.create(tmp_path / "t", schema)
    Writer(store)([{"id": i, "s": "a"} for i in (5, 150, 199, 200, 250, 99, 100)])
    got = store.checksum(middle)
    assert got.outside_rows == 4
    assert got.outside_sample_keys == tuple(encode_key(schema, [i]) for i in (5, 99, 200, 250))
    inside = RowStore.create(tmp_path / "u", schema)
    Writer(inside)([{"id": i, "s": "a"} for i in (100, 150, 199)])
    assert inside.checksum(middle).outside_rows == 0
    assert inside.checksum(middle).outside_sample_keys == ()


# --- snapshots and accounting ---------------------------------------------------------------


def test_linked_manifest_and_files_reopen_as_the_store_was_despite_later_compaction(
    tmp_path: Path, store: RowStore
) -> None:
    """What a tablet copy session relies on (tablet_copy.py): hard links to `data_files()`
    taken right after a flush are the store at its flushed index, whatever flushes and
    compactions do to the store afterwards."""
    w = Writer(store)
    w([r(i) for i in range(20)])
    store.flush()
    w([{"id": 0}], RowOp.DELETE)
    w([r(i, x=2.0) for i in range(10, 30)], RowOp.UPSERT)
    store.flush()
    expected, flushed = rows(store), store.flushed_index
    image = tmp_path / "image"
    image.mkdir()
    for name in store.data_files():
        os.link(store.directory / name, image / name)
    w([r(i) for i in range(100, 110)])  # then the source moves on: a write, a flush...
    store.flush()
    store.compact()  # ...and a compaction that deletes the linked inputs
    assert all(not (store.directory / n).exists() for n in os.listdir(image) if n != "MANIFEST")
    copy = RowStore.open(image)
    assert copy.flushed_index == copy.applied_index == flushed
    assert rows(copy) == expected
    copy.close()


def test_write_frozen_in_a_thread_while_applying_and_scanning(store: RowStore) -> None:
    w = Writer(store)
    w([r(i) for i in range(5000)])
    f = store.freeze()
    assert f is not None
    worker = threading.Thread(target=store.write_frozen, args=(f,))
    worker.start()
    for i in range(20):
        assert w([r(5000 + i)]).rows_applied == 1
        assert w([r(i, "dup")]).errors  # the key check sees the frozen memstore
        assert sum(b.num_rows for b in store.scan(ScanSpec(projection=("id",)))) == 5001 + i
    worker.join()
    store.install(f)
    assert store.flushed_index == 1 and store.row_count() == 5020
    assert [x["id"] for x in rows(store)] == list(range(5020))


def test_install_order_is_enforced(store: RowStore) -> None:
    w = Writer(store)
    w([r(1)])
    f1 = store.freeze()
    w([r(2)])
    f2 = store.freeze()
    assert f1 is not None and f2 is not None
    store.write_frozen(f2)
    with pytest.raises(InvalidArgument, match="freeze order"):
        store.install(f2)
    with pytest.raises(InvalidArgument, match="write_frozen has not completed"):
        store.install(f1)
    store.write_frozen(f1)
    store.install(f1)
    store.install(f2)
    assert store.flushed_index == 2 and rows(store) == [r(1), r(2)]


def test_sizes_and_counts(store: RowStore) -> None:
    w = Writer(store)
    assert store.memstore_rows() == 0 and store.memstore_bytes() == 0
    w([r(i) for i in range(10)])
    assert store.memstore_rows() == 10 and store.memstore_bytes() > 0
    small = store.on_disk_bytes()
    store.flush()
    assert store.memstore_rows() == 0 and store.on_disk_bytes() > small
    assert store.freeze() is None


def test_many_rows_merge_across_windows(store: RowStore) -> None:
    # More rows than one merge window, in several overlapping sources.
    w = Writer(store)
    n = 150_000
    ids = np.arange(n)
    t = pa.table({"id": ids, "s": pa.nulls(n, pa.string()), "x": ids * 1.0})
    batch = decode_write(store.schema, _ipc(t), RowOp.INSERT, [])
    store.apply_write(store.applied_index + 1, batch)
    store.flush()
    w([r(i, "m") for i in range(0, n, 1000)], RowOp.UPSERT)
    w([{"id": i} for i in range(1, n, 1000)], RowOp.DELETE)
    got = pa.Table.from_batches(list(store.scan(ScanSpec(projection=("id", "s")))))
    assert got.num_rows == n - 150 == store.row_count()
    got_ids = got.column("id").to_numpy()
    assert bool((np.diff(got_ids) > 0).all())
    assert got.column("s").null_count == n - 300


def test_a_staged_install_changes_reads_and_the_flushed_index_only_once_durable(
    tmp_path: Path, store: RowStore
) -> None:
    """rowstore.py, Installs: the manifest is written apart (a worker thread in a tablet);
    until it is, the WAL's anchor (flushed_index) and reads stay where they were, and a crash
    after the write finds the file."""
    w = Writer(store)
    w([r(1), r(2)])
    f = store.freeze()
    assert f is not None
    store.write_frozen(f)
    store.stage_install(f)
    assert store.install_pending and store.flushed_index == 0
    assert store.data_files() == [MANIFEST]
    with pytest.raises(InvalidArgument, match="under way"):
        store.stage_install(f)
    w([r(3)])  # applies go on meanwhile
    assert rows(store) == [r(1), r(2), r(3)]
    store.write_manifest()
    assert store.flushed_index == 0  # durable, not yet published
    crashed = RowStore.open(tmp_path / "t")  # what a crash now would find
    assert crashed.flushed_index == 1 and rows(crashed) == [r(1), r(2)]
    store.finish_install(f)
    assert not store.install_pending and store.flushed_index == 1
    assert len(store.data_files()) == 2 and rows(store) == [r(1), r(2), r(3)]


def test_an_alter_during_a_staged_install_writes_the_staged_state(
    tmp_path: Path, store: RowStore
) -> None:
    """A manifest write always writes the newest staged state: an alter's (on the apply
    thread) between stage and finish keeps the new file, and the install's keeps the new
    schema, whichever runs last."""
    w = Writer(store)
    w([r(1)])
    f = store.freeze()
    assert f is not None
    store.write_frozen(f)
    store.stage_install(f)
    s1 = store.schema.apply([AddColumn("y", T.INT64)])
    store.alter_schema(store.applied_index + 1, s1)  # writes the manifest itself
    after_alter = RowStore.open(tmp_path / "t")
    assert after_alter.flushed_index == 1 and after_alter.schema.version == s1.version
    store.write_manifest()
    store.finish_install(f)
    reopened = RowStore.open(tmp_path / "t")
    assert reopened.schema.version == s1.version and reopened.flushed_index == 1
    assert rows(reopened) == [{**r(1), "y": None}]


def test_a_staged_compaction_deletes_its_inputs_only_after_the_manifest(
    tmp_path: Path, store: RowStore
) -> None:
    w = Writer(store)
    for i in range(3):
        w([r(i)])
        store.flush()
    c = store.prepare_compaction()
    assert c is not None
    store.write_compaction(c)
    store.stage_compaction(c)
    snap = store.snapshot()  # taken before the swap: reads the inputs
    store.write_manifest()
    assert all((tmp_path / "t" / name).exists() for name in c.inputs)
    store.finish_compaction(c)
    store.remove_compacted(c)
    assert not any((tmp_path / "t" / name).exists() for name in c.inputs)
    assert store.data_files() == [MANIFEST, c.file_name]
    assert snap.checksum() == store.checksum()  # unlinked inputs still read (memory-mapped)
    assert rows(RowStore.open(tmp_path / "t")) == [r(0), r(1), r(2)]


def test_a_snapshot_copies_no_rows_and_reads_the_state_it_was_taken_at(
    tmp_path: Path, store: RowStore, schema: Schema
) -> None:
    """Taken between applies, a snapshot builds nothing (the memstore's Arrow form is built when
    it is read, in a tablet server's worker thread); later writes, deletes, flushes and
    compactions do not change what it reads."""
    w = Writer(store)
    w([r(1), r(2)])
    store.flush()
    w([r(3)])
    snap = store.snapshot()
    mem = store._mem
    assert mem.cached_source(mem.version) is None  # nothing built yet
    w([r(4)])
    w([{"id": 1}, {"id": 3}], RowOp.DELETE)
    store.flush()
    store.compact()
    other = RowStore.create(tmp_path / "other", schema)
    Writer(other)([r(1), r(2), r(3)])
    assert snap.checksum() == other.checksum()
    assert snap.applied_index == 2 and store.applied_index == 4


@pytest.mark.parametrize("widths", ["int64", "five", "mixed"])
def test_a_memstore_becomes_a_source_sorted_by_key_whatever_its_keys_widths(widths: str) -> None:
    """The flush's Arrow form of a memstore (laid out in the dict's order, then sorted as
    columns) equals the rows sorted by their encoded bytes, tombstones and nulls included, for
    keys numpy sorts as integers, as fixed-width strings, and keys Arrow sorts."""
    rng = np.random.default_rng(5)
    if widths == "int64":
        keys = [int(v).to_bytes(8, "big") for v in rng.permutation(1 << 12)[:500]]
    elif widths == "five":
        keys = list(
            dict.fromkeys(bytes(rng.integers(0, 256, 5, dtype=np.uint8)) for _ in range(500))
        )
    else:  # prefixes of each other, zero bytes, and the empty key
        pool = [b"", b"a", b"a\x00", b"ab", b"b", b"\x00", b"\xff", b"a\x00\x00"]
        keys = pool + [
            bytes(rng.integers(0, 256, rng.integers(1, 9), dtype=np.uint8)) for _ in range(400)
        ]
        keys = list(dict.fromkeys(keys))
    rows: dict[bytes, tuple[object, ...] | None] = {}
    times: dict[bytes, int] = {}
    for i, k in enumerate(keys):
        rows[k] = None if i % 7 == 3 else (i, None if i % 5 == 0 else f"s{i}", i / 2)
        times[k] = 100 + i
    history: dict[bytes, rowstore_memstore.Versions] = {
        keys[0]: ((1, (0, "old", 0.0)), (2, None)),
        keys[-1]: ((3, (9, "x", 1.5)),),
    }
    types = [pa.int64(), pa.string(), pa.float64()]
    src = rowstore_memstore._to_source(rows, times, history, (1, 2, 3), types)
    ordered = sorted(keys)
    got = src.table.to_pydict()
    assert got["k"] == ordered
    assert got["d"] == [rows[k] is None for k in ordered]
    assert got["t"] == [times[k] for k in ordered]
    for j, name in enumerate(["c1", "c2", "c3"]):
        assert got[name] == [None if rows[k] is None else rows[k][j] for k in ordered]  # type: ignore[index]
    assert src.history is not None
    hist = src.history.to_pydict()
    want = sorted((k, -t, t, r) for k, vs in history.items() for t, r in vs)
    assert hist["k"] == [k for k, _, _, _ in want] and hist["t"] == [t for _, _, t, _ in want]
    assert hist["c2"] == [None if r is None else r[1] for _, _, _, r in want]


@pytest.mark.parametrize("seed", range(6))
def test_whole_row_writes_of_every_kind_match_a_model(store: RowStore, seed: int) -> None:
    """Batches of whole rows, one kind of operation per batch or mixed, keys new, live in the
    memstore, live or deleted in files, or twice in one batch, with flushes and compactions
    between: each row's outcome, the applied count, the live row count and the contents are
    those of a dict applying the rows one by one (batches of new keys take a bulk path)."""
    rng = np.random.default_rng(seed)
    w = Writer(store)
    model: dict[int, dict[str, Any]] = {}
    kinds = [RowOp.INSERT, RowOp.UPSERT, RowOp.INSERT_IGNORE, RowOp.UPDATE, RowOp.DELETE]
    for step in range(60):
        fresh = rng.random() < 0.4
        pool = range(1000 + step * 50, 1050 + step * 50) if fresh else range(200)
        keys = [int(k) for k in rng.choice(list(pool), int(rng.integers(1, 12)))]
        if rng.random() < 0.6:
            ops = [int(rng.choice([RowOp.INSERT, RowOp.UPSERT]))] * len(keys)
        else:
            ops = [int(rng.choice(kinds)) for _ in keys]
        batch = [r(k, f"v{step}", float(step)) for k in keys]  # a DELETE ignores the values
        want_errors, applied = [], 0
        for i, (k, op) in enumerate(zip(keys, ops, strict=True)):
            live = k in model
            if op in (RowOp.INSERT, RowOp.INSERT_IGNORE) and live:
                if op == RowOp.INSERT:
                    want_errors.append(i)
                continue
            if op in (RowOp.UPDATE, RowOp.DELETE) and not live:
                want_errors.append(i)
                continue
            if op == RowOp.DELETE:
                del model[k]
            else:
                model[k] = r(k, f"v{step}", float(step))
            applied += 1
        res = w(batch, ops=ops)
        assert [i for i, _ in res.errors] == want_errors, (seed, step, keys, ops)
        assert res.rows_applied == applied, (seed, step)
        assert store.row_count() == len(model), (seed, step)
        roll = rng.random()
        if roll < 0.2:
            store.flush()
        elif roll < 0.25:
            store.flush()
            store.compact()
    assert rows(store) == [model[k] for k in sorted(model)]


@pytest.mark.parametrize("stored", ["width 8", "width 3", "mixed widths"])
def test_a_key_query_finds_each_key_s_position_in_every_source(stored: str) -> None:
    """One `KeyQuery` looked up in several sources gives, for each of its keys (any order,
    any width, repeated), the key's position in each source or -1, as a plain search would;
    its keys are converted once, not once per source."""
    rng = np.random.default_rng(9)

    def key(width: int) -> bytes:
        return bytes(rng.integers(0, 256, width, dtype=np.uint8))

    sources = []
    for _ in range(3):
        if stored == "mixed widths":
            keys = {key(int(rng.integers(1, 6))) for _ in range(300)} | {b"a", b"a\x00"}
        else:
            keys = {key(8 if stored == "width 8" else 3) for _ in range(300)}
        sources.append(sorted(keys))
    asked = [k for s in sources for k in s[::7]] + [key(8), key(3), key(2), b"a", b"a\x00"]
    asked += asked[:5]  # repeated keys
    rng.shuffle(asked)  # type: ignore[arg-type]
    query = KeyQuery(asked)
    for keys in sources:
        index = KeyIndex(pa.array(keys, type=pa.binary()))
        at = {k: i for i, k in enumerate(keys)}
        assert index.find(query).tolist() == [at.get(k, -1) for k in asked]
        assert index.find(asked).tolist() == [at.get(k, -1) for k in asked]
