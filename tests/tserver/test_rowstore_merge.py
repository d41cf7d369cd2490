"""The merged read path against a model: random writes spread over several files, a frozen and
an active memstore, scanned whole and by key ranges, for every kind of key the merge sorts
differently (8-byte keys as integers, other fixed widths as byte strings, variable-width keys
through Arrow), with rows laid out so that both the zero-copy runs and the `take` of a merge
window are exercised; then compaction of overlapping files only."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from service.common.keys import encode_key, encode_keys_arrow
from service.common.predicates import ColumnPredicate, ScanSpec
from service.common.schema import ColumnType, Schema
from service.tserver.row_ops import RowOp
from service.tserver.rowstore import RowStore
from service.tserver.rowstore_files import BATCH_ROWS, DEL_COL, KEY_COL, Source, phys_name
from service.tserver.rowstore_merge import MIN_RUN_ROWS, merge_sources
from tests.helpers.rowstore import Writer

T = ColumnType

KEYS: dict[str, tuple[list[tuple[str, ColumnType]], list[str]]] = {
    "int64": ([("k", T.INT64)], ["k"]),
    "int32+int64": ([("a", T.INT32), ("k", T.INT64)], ["a", "k"]),
    "string": ([("k", T.STRING)], ["k"]),
}


def _schema(kind: str) -> Schema:
    cols, key = KEYS[kind]
    return Schema.build([*cols, ("v", T.INT64), ("s", T.STRING)], key)


def _key_of(kind: str, i: int) -> dict[str, Any]:
    if kind == "int64":
        return {"k": i - 500}  # negative keys too
    if kind == "int32+int64":
        return {"a": i % 3, "k": i}
    return {"k": f"key-{i:07d}"[: 5 + i % 6] + str(i)}  # varied widths and shared prefixes


def _check(store: RowStore, model: dict[bytes, dict[str, Any]], rng: random.Random) -> None:
    schema = store.schema
    ordered = [model[k] for k in sorted(model)]
    got = [row for b in store.scan(ScanSpec()) for row in b.to_pylist()]
    assert got == ordered
    assert store.row_count() == len(model)
    keys = sorted(model)
    for _ in range(5):
        lo, hi = sorted(rng.sample(range(len(keys) + 1), 2))
        lower = keys[lo] if lo < len(keys) else b""
        upper = keys[hi] if hi < len(keys) else b""
        spec = ScanSpec(lower_key=lower, upper_key=upper)
        got = [row for b in store.scan(spec) for row in b.to_pylist()]
        assert got == [model[k] for k in keys[lo : hi if upper else len(keys)]]
        after = keys[lo] if lo < len(keys) else None
        if after is not None:
            spec = ScanSpec(start_after_key=after, projection=tuple(schema.key))
            got_keys = [
                encode_key(schema, [row[c] for c in schema.key])
                for b in store.scan(spec)
                for row in b.to_pylist()
            ]
            assert got_keys == keys[lo + 1 :]
    pred = ScanSpec(predicates=(ColumnPredicate("v", "GE", (0,)),), projection=("v",))
    got_v = [row["v"] for b in store.scan(pred) for row in b.to_pylist()]
    assert got_v == [r["v"] for r in ordered if r["v"] >= 0]


@pytest.mark.parametrize("kind", list(KEYS))
@pytest.mark.parametrize("layout", ["blocks", "random"])
def test_merged_scans_match_a_model(tmp_path: Path, kind: str, layout: str) -> None:
    """`blocks`: each write is a run of consecutive keys (files overlap in long runs: the
    merge gathers zero-copy slices); `random`: keys all over (short runs: one `take`)."""
    rng = random.Random(f"{kind}/{layout}")
    store = RowStore.create(tmp_path / "t", _schema(kind))
    schema = store.schema
    w = Writer(store)
    model: dict[bytes, dict[str, Any]] = {}
    universe = 6000
    version = 0
    for step in range(24):
        if layout == "blocks":
            start = rng.randrange(universe - 1500)
            ids = list(range(start, start + rng.randrange(200, 1500)))
        else:
            ids = sorted(rng.sample(range(universe), rng.randrange(50, 600)))
        op = rng.choice([RowOp.UPSERT, RowOp.UPSERT, RowOp.DELETE])
        version += 1
        batch = []
        for i in ids:
            key = _key_of(kind, i)
            k = encode_key(schema, [key[c] for c in schema.key])
            if op == RowOp.DELETE:
                if k in model:
                    batch.append(key)
                    del model[k]
                continue
            row = {**key, "v": (i * 7 + version) % 101 - 50, "s": f"s{version}" if i % 4 else None}
            batch.append(row)
            model[k] = row
        if batch:
            assert w(batch, op).errors == ()
        if step % 5 == 4:
            store.flush()
    frozen = store.freeze()  # a frozen memstore, still unflushed, then an active one
    w([{**_key_of(kind, universe + 1), "v": 1, "s": "late"}], RowOp.UPSERT)
    late = _key_of(kind, universe + 1)
    model[encode_key(schema, [late[c] for c in schema.key])] = {**late, "v": 1, "s": "late"}
    assert len(store.data_files()) >= 5
    _check(store, model, rng)
    checksum = store.checksum()
    assert frozen is not None
    store.write_frozen(frozen)
    store.install(frozen)
    store.flush()
    while (c := store.prepare_compaction(overlapping=True)) is not None:
        store.write_compaction(c)
        store.install_compaction(c)
    assert store.overlapping_files() == []
    _check(store, model, rng)
    assert store.checksum() == checksum
    store.compact()
    assert len(store.data_files()) == 2
    _check(store, model, rng)
    assert store.checksum() == checksum


def test_windows_bound_merges_on_long_overlapping_files(tmp_path: Path) -> None:
    """Two files covering the same keys (every key in both) over more than one window."""
    store = RowStore.create(tmp_path / "t", _schema("int64"))
    w = Writer(store)
    n = BATCH_ROWS + 5000
    w([{"k": i, "v": 0, "s": None} for i in range(0, n)])
    store.flush()
    w([{"k": i, "v": 1, "s": "new"} for i in range(0, n, 2)], RowOp.UPSERT)
    store.flush()
    got = [row for b in store.scan(ScanSpec(projection=("k", "v"))) for row in b.to_pylist()]
    assert got == [{"k": i, "v": 1 - i % 2} for i in range(n)]


def test_only_overlapping_files_are_compacted(tmp_path: Path) -> None:
    store = RowStore.create(tmp_path / "t", _schema("int64"))
    w = Writer(store)

    def block(lo: int, hi: int, v: int) -> None:
        w([{"k": i, "v": v, "s": None} for i in range(lo, hi)], RowOp.UPSERT)
        store.flush()

    block(0, 100, 1)  # file 0
    block(200, 300, 1)  # file 1: disjoint
    block(250, 400, 2)  # file 2: overlaps file 1
    block(500, 600, 1)  # file 3: disjoint
    block(550, 560, 3)  # file 4: inside file 3
    block(390, 395, 4)  # file 5: overlaps file 2 only (so file 1 through 2)
    assert store.overlapping_files() == [[1, 2, 5], [3, 4]]
    expect = [row for b in store.scan(ScanSpec()) for row in b.to_pylist()]
    names = store.data_files()[1:]
    c = store.prepare_compaction(overlapping=True)
    assert c is not None and c.inputs == (names[1], names[2], names[5])  # the larger group
    store.write_compaction(c)
    store.install_compaction(c)
    assert store.overlapping_files() == [[2, 3]]  # the merged file comes first
    assert [row for b in store.scan(ScanSpec()) for row in b.to_pylist()] == expect
    c = store.prepare_compaction(overlapping=True)
    assert c is not None and c.inputs == (names[3], names[4])
    store.write_compaction(c)
    store.install_compaction(c)
    assert store.overlapping_files() == [] and store.prepare_compaction(overlapping=True) is None
    assert len(store.data_files()) == 4  # the manifest, files 0, 1+2+5 and 3+4
    assert [row for b in store.scan(ScanSpec()) for row in b.to_pylist()] == expect
    store.close()
    reopened = RowStore.open(tmp_path / "t")
    assert [row for b in reopened.scan(ScanSpec()) for row in b.to_pylist()] == expect


def _source(schema: Schema, ids: list[int], v: int, deleted: bool = False) -> Source:
    t = pa.table({"k": pa.array(ids, pa.int64())})
    cols = {c.name: c for c in schema.columns}
    return Source(
        pa.table(
            {
                KEY_COL: pa.array(encode_keys_arrow(schema.key_columns, t), pa.binary()),
                DEL_COL: pa.array([deleted] * len(ids), pa.bool_()),
                phys_name(cols["k"].id): pa.array(ids, pa.int64()),
                phys_name(cols["v"].id): pa.array([v] * len(ids), pa.int64()),
                phys_name(cols["s"].id): pa.nulls(len(ids), pa.string()),
            }
        )
    )


def test_long_runs_of_one_source_are_gathered_as_zero_copy_slices() -> None:
    """Blocks written by concurrent writers: files overlap in long runs. The overlapping
    window comes out as slices of the sources (one chunk per run), not as a copy."""
    schema = _schema("int64")
    old = _source(schema, [*range(0, 10_000), *range(20_000, 30_000)], v=1)
    new = _source(schema, [*range(10_000, 20_000), *range(25_000, 26_000)], v=2)
    gone = _source(schema, [*range(29_000, 29_500)], v=0, deleted=True)
    pieces = list(merge_sources([old, new, gone], schema.columns, b"", b"", None))
    k = phys_name(schema.column("k").id)
    v = phys_name(schema.column("v").id)
    got_k = [x for t in pieces for x in t.column(k).to_pylist()]
    got_v = [x for t in pieces for x in t.column(v).to_pylist()]
    expect = [i for i in range(30_000) if not 29_000 <= i < 29_500]
    assert got_k == expect
    assert got_v == [2 if 10_000 <= i < 20_000 or 25_000 <= i < 26_000 else 1 for i in expect]
    merged = [t for t in pieces if t.column(k).num_chunks > 1]
    assert merged and all(t.num_rows >= MIN_RUN_ROWS for t in merged)
    # The runs are slices of the sources' own buffers.
    old_buf = old.table.column(k).chunk(0).buffers()[1]
    assert any(
        c.buffers()[1].address == old_buf.address for t in merged for c in t.column(k).chunks
    )
