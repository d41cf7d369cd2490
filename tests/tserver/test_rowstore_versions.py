"""Versioned rows (docs/design/tablets.md#R3, #R5): a read at timestamp T sees exactly the
versions committed at or before T, across memstores, flushes, restarts and compactions, and a
compaction keeps what snapshots at or after its horizon can read.

The model checks: random writes of every kind at increasing timestamps, with random flushes,
compactions (with and without a horizon) and reopens, then reads at every timestamp of interest
compared with a plain dict model of each key's history; the last one adds what else a scan
asks (predicates, key bounds, a resume key, a limit, a projection) to those reads.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from service.common.keys import encode_key
from service.common.predicates import ColumnPredicate, ScanSpec
from service.common.schema import ColumnType, Schema
from service.tserver import rowstore_files
from service.tserver.row_ops import RowOp, WriteBatch, decode_write
from service.tserver.rowstore import RowStore

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], "id")
STRING_KEYS = Schema.build([("id", ColumnType.STRING), ("v", ColumnType.STRING)], "id")
"""Keys of several widths: the row store's slow paths for keys numpy cannot compare."""


def _batch(rows: list[dict[str, Any]], op: RowOp, schema: Schema = SCHEMA) -> WriteBatch:
    names = list(rows[0])
    arrow = schema.to_arrow()
    t = pa.Table.from_pylist(rows, schema=pa.schema([arrow.field(n) for n in names]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    batch = decode_write(schema, sink.getvalue().to_pybytes(), int(op), [])
    return WriteBatch.decode(batch.encode(), schema)


class Tablet:
    """A row store written the way a tablet writes it: increasing indexes and timestamps."""

    def __init__(self, path: Path, schema: Schema = SCHEMA) -> None:
        self.path = path
        self.schema = schema
        self.store = RowStore.create(path, schema)
        self.last_rows: list[dict[str, Any]] = []

    def write(self, ts: int, rows: list[dict[str, Any]], op: RowOp = RowOp.UPSERT) -> None:
        batch = _batch(rows, op, self.schema)
        self.last_rows = rows
        self.store.apply_write(self.store.applied_index + 1, batch, ts)

    def at(self, ts: int | None) -> dict[Any, str]:
        out: dict[Any, str] = {}
        for b in self.store.scan(ScanSpec(read_at=ts)):
            for row in b.to_pylist():
                out[row["id"]] = row["v"]
        return out

    def reopen(self) -> None:
        self.store.flush()
        self.store.close()
        self.store = RowStore.open(self.path)


def _history_of_one_key(t: Tablet) -> None:
    t.write(10, [{"id": 1, "v": "a"}], RowOp.INSERT)
    t.write(20, [{"id": 1, "v": "b"}], RowOp.UPDATE)
    t.write(30, [{"id": 1}], RowOp.DELETE)
    t.write(40, [{"id": 1, "v": "d"}], RowOp.INSERT)


EXPECTED = {5: {}, 10: {1: "a"}, 19: {1: "a"}, 20: {1: "b"}, 29: {1: "b"}, 30: {}, 39: {}}
EXPECTED |= {40: {1: "d"}, 99: {1: "d"}, None: {1: "d"}}


def test_a_read_at_t_sees_the_version_committed_at_or_before_t(tmp_path: Path) -> None:
    t = Tablet(tmp_path / "t")
    _history_of_one_key(t)
    for ts, want in EXPECTED.items():
        assert t.at(ts) == want, ts
    assert t.store.safe_time == 40


@pytest.mark.parametrize("where", ["flushed", "reopened", "compacted", "split"])
def test_versions_survive_flush_restart_and_compaction(tmp_path: Path, where: str) -> None:
    t = Tablet(tmp_path / "t")
    if where == "split":  # each version in its own file, merged by compaction
        for ts, rows, op in [
            (10, [{"id": 1, "v": "a"}], RowOp.INSERT),
            (20, [{"id": 1, "v": "b"}], RowOp.UPDATE),
            (30, [{"id": 1}], RowOp.DELETE),
            (40, [{"id": 1, "v": "d"}], RowOp.INSERT),
        ]:
            t.write(ts, rows, op)
            t.store.flush()
        assert len(t.store.data_files()) >= 5
        for ts, want in EXPECTED.items():
            assert t.at(ts) == want, ts
        t.store.compact()
    else:
        _history_of_one_key(t)
        t.store.flush()
        if where in ("reopened", "compacted"):
            t.reopen()
        if where == "compacted":
            t.write(50, [{"id": 2, "v": "x"}], RowOp.INSERT)
            t.store.flush()
            t.store.compact()
            t.reopen()
    for ts, want in EXPECTED.items():
        got = t.at(ts)
        got.pop(2, None)
        assert got == want, (where, ts)
    assert t.store.safe_time >= 40


def test_a_compaction_keeps_what_snapshots_after_its_horizon_read(tmp_path: Path) -> None:
    t = Tablet(tmp_path / "t")
    _history_of_one_key(t)
    t.write(12, [{"id": 7, "v": "gone"}], RowOp.INSERT)  # deleted before the horizon
    t.write(13, [{"id": 7}], RowOp.DELETE)
    t.store.flush()
    t.store.compact(horizon=25)
    assert t.store.history_horizon == 25
    for ts, want in EXPECTED.items():
        if ts is not None and ts < 25:
            continue
        assert t.at(ts) == want, ts
    # Of the versions at or before 25 only the newest ("b" at 20) is kept; key 7 is gone.
    hist = [src for src in t.store.snapshot().files if src.history is not None]
    kept = sum(src.history_rows + src.num_rows for src in t.store.snapshot().files)
    assert kept == 3 and hist  # d (base), the tombstone at 30, b at 20
    t.reopen()
    assert t.store.history_horizon == 25 and t.at(26) == {1: "b"}


def test_an_old_file_without_timestamps_reads_as_committed_at_zero(tmp_path: Path) -> None:
    t = Tablet(tmp_path / "t")
    t.write(0, [{"id": 1, "v": "old"}], RowOp.INSERT)  # what an entry without a stamp applies
    t.store.flush()
    t.write(10, [{"id": 1, "v": "new"}], RowOp.UPDATE)
    assert t.at(0) == {1: "old"} and t.at(5) == {1: "old"} and t.at(10) == {1: "new"}


def _churn(
    t: Tablet,
    rng: random.Random,
    stamps: list[int],
    horizon: int,
    bounds: tuple[float, float, float],
    move_horizon: float,
) -> int:
    """What a tablet does between writes, at random: a flush, a compaction (first moving the
    history horizon to a stamp already written, with chance `move_horizon`), a reopen, or
    nothing, as one roll falls below each of `bounds`. Returns the horizon."""
    roll = rng.random()
    if roll < bounds[0]:
        t.store.flush()
    elif roll < bounds[1]:
        t.store.flush()
        if rng.random() < move_horizon:
            horizon = max(horizon, rng.choice(stamps))
        t.store.compact(horizon=horizon)
    elif roll < bounds[2]:
        t.reopen()
    return horizon


@pytest.mark.parametrize("keys", ["int", "string"])
@pytest.mark.parametrize("seed", range(6))
def test_random_histories_match_a_model(tmp_path: Path, seed: int, keys: str) -> None:
    rng = random.Random(seed)
    if keys == "int":
        t = Tablet(tmp_path / "t")
        name: Any = int
    else:
        t = Tablet(tmp_path / "t", STRING_KEYS)

        def name(k: int) -> str:
            return "k" * (k % 3 + 1) + str(k)

    model: dict[Any, list[tuple[int, str | None]]] = {}  # key -> [(ts, value or None)]
    ts = 0
    horizon = 0
    stamps = [0]
    for step in range(120):
        ts += rng.choice([1, 1, 2, 5])
        keys = [name(k) for k in rng.sample(range(40), rng.randint(1, 6))]
        op = rng.choice([RowOp.UPSERT, RowOp.UPSERT, RowOp.INSERT, RowOp.UPDATE, RowOp.DELETE])
        live = {k for k in keys if model.get(k) and model[k][-1][1] is not None}
        if op is RowOp.INSERT:
            keys = [k for k in keys if k not in live]
        elif op in (RowOp.UPDATE, RowOp.DELETE):
            keys = [k for k in keys if k in live]
        if not keys:
            continue
        if op is RowOp.DELETE:
            t.write(ts, [{"id": k} for k in keys], op)
        else:
            t.write(ts, [{"id": k, "v": f"{k}@{ts}"} for k in keys], op)
        for k in keys:
            model.setdefault(k, []).append((ts, None if op is RowOp.DELETE else f"{k}@{ts}"))
        stamps.append(ts)
        horizon = _churn(t, rng, stamps, horizon, (0.15, 0.22, 0.25), 0.5)
        if step % 20 == 19 or step == 119:
            assert t.store.history_horizon == horizon
            for at in sorted({*rng.sample(stamps, min(8, len(stamps))), ts, ts + 1}):
                if at < horizon:
                    continue
                want = {}
                for k, versions in model.items():
                    seen = [v for when, v in versions if when <= at]
                    if seen and seen[-1] is not None:
                        want[k] = seen[-1]
                assert t.at(at) == want, (seed, step, at, horizon)
                since = rng.choice([s for s in stamps if s < at] or [0])
                if since >= horizon:
                    changed = {}
                    for k, versions in model.items():
                        seen = [(when, v) for when, v in versions if when <= at]
                        if seen and seen[-1][0] > since:
                            changed[k] = (seen[-1][1], seen[-1][1] is None)
                    assert _diff(t, since, at) == changed, (seed, step, since, at)
            latest = {k: v[-1][1] for k, v in model.items() if v[-1][1] is not None}
            assert t.at(None) == latest


@pytest.mark.parametrize("keys", ["int", "string"])
def test_snapshots_that_take_one_rank_or_several_of_a_history_read_exactly(
    tmp_path: Path, keys: str
) -> None:
    """A table updated in rounds, then compacted into one file with history. A snapshot
    between two rounds takes every key's version from one rank of the history, in key order
    (the no-copy path); keys whose rounds differ spread a snapshot over several ranks, and
    keys left alone come from the file's newest rows: each read must still be exact and in
    key order."""
    t = Tablet(tmp_path / "t", SCHEMA if keys == "int" else STRING_KEYS)

    def key(i: int) -> Any:
        return i if keys == "int" else "k" * (i % 3 + 1) + str(i)

    hot = range(0, 60)  # written every round
    warm = range(60, 80)  # every other round
    cold = range(80, 100)  # once
    ts = 0
    model: dict[Any, list[tuple[int, str]]] = {}
    stamps = []
    for rnd in range(8):
        ts += 10
        ids = [*hot, *(warm if rnd % 2 == 0 else []), *(cold if rnd == 0 else [])]
        t.write(ts, [{"id": key(i), "v": f"{i}@{ts}"} for i in ids])
        for i in ids:
            model.setdefault(key(i), []).append((ts, f"{i}@{ts}"))
        stamps.append(ts)
        t.store.flush()
    t.store.compact()
    files = t.store.snapshot().files
    assert len(files) == 1 and files[0].history is not None
    for at in [5, *stamps, *(s + 5 for s in stamps)]:
        want = {}
        for k, versions in model.items():
            seen = [v for when, v in versions if when <= at]
            if seen:
                want[k] = seen[-1]
        got = [row for b in t.store.scan(ScanSpec(read_at=at)) for row in b.to_pylist()]
        assert {r["id"]: r["v"] for r in got} == want, at
        ids = [r["id"] for r in got]  # ints, or ASCII strings: their order is the key order
        assert ids == sorted(ids), at  # as merges and resumed scans rely on


@pytest.mark.parametrize("keys", ["int", "string"])
def test_a_history_s_ranks_and_rank_blocks_follow_their_definition(
    tmp_path: Path, keys: str
) -> None:
    """A history row's rank is how many newer versions of its key the history holds; a rank's
    block is its rows in key order; rows chosen from a block come back as they are in the
    history, whether they form one run of it (a slice) or not (a take)."""
    t = Tablet(tmp_path / "t", SCHEMA if keys == "int" else STRING_KEYS)
    rng = random.Random(3)
    for ts in range(1, 9):
        ids = sorted(rng.sample(range(200), rng.randint(20, 200)))
        ids = ids if keys == "int" else [f"k{i:03d}" for i in ids]
        t.write(ts, [{"id": i, "v": f"{i}@{ts}"} for i in ids])
        t.store.flush()
    t.store.compact()
    (src,) = t.store.snapshot().files
    assert src.history is not None and src.history_index is not None
    by_rank = src._by_rank()
    hkeys = src.history_index.keys()
    want: list[int] = []
    for i, k in enumerate(hkeys):  # a key's versions are contiguous, newest first
        want.append(want[-1] + 1 if i and hkeys[i - 1] == k else 0)
    assert by_rank.ranks.tolist() == want and max(want) >= 5
    values = src.history.column("c1").to_pylist()  # physical name of "v"
    for rank in range(max(want) + 1):
        rows = [i for i, r in enumerate(want) if r == rank]
        positions, block = by_rank.block(rank)
        assert positions.tolist() == rows
        assert block.column("c1").to_pylist() == [values[i] for i in rows]
        for chosen in (rows, rows[1:-1], rows[::3], rows[-1:], rows[:1]):
            if not chosen:
                continue
            got = by_rank.gather(rank, np.asarray(chosen), ["c1"])
            assert got.column_names == ["c1"]
            assert got.column("c1").to_pylist() == [values[i] for i in chosen], (rank, chosen)


@pytest.mark.parametrize("counts", [[1], [3, 1, 2], [1, 1 << 16, 2], [2, (1 << 16) + 1, 1]])
def test_ranks_count_each_key_s_versions_from_zero(counts: list[int]) -> None:
    """Up to 2**16 versions of a key the ranks are uint16 (their running sum wraps and stays
    exact); one more and they are int64."""
    first = np.cumsum([0, *counts[:-1]])
    got = rowstore_files.ranks_of(first, sum(counts))
    assert got.tolist() == [r for c in counts for r in range(c)]
    assert got.dtype == (np.uint16 if max(counts) <= 1 << 16 else np.int64)


def _diff(t: Tablet, since: int, at: int) -> dict[int, tuple[str | None, bool]]:
    out: dict[int, tuple[str | None, bool]] = {}
    for b in t.store.scan(ScanSpec(read_at=at, diff_start=since)):
        for row in b.to_pylist():
            out[row["id"]] = (row["v"], row["__is_deleted"])
    return out


@pytest.mark.parametrize("flush", [False, True])
def test_a_diff_scan_returns_what_changed_in_the_window_deletes_flagged(
    tmp_path: Path, flush: bool
) -> None:
    t = Tablet(tmp_path / "t")
    t.write(10, [{"id": i, "v": f"{i}@10"} for i in range(5)], RowOp.INSERT)
    if flush:
        t.store.flush()
    t.write(20, [{"id": 1, "v": "1@20"}], RowOp.UPDATE)
    t.write(21, [{"id": 2}], RowOp.DELETE)
    t.write(22, [{"id": 9, "v": "9@22"}], RowOp.INSERT)
    t.write(23, [{"id": 9}], RowOp.DELETE)  # born and gone inside the window
    t.write(30, [{"id": 3, "v": "3@30"}], RowOp.UPDATE)  # after the window
    if flush:
        t.store.flush()
    assert _diff(t, 15, 25) == {1: ("1@20", False), 2: (None, True), 9: (None, True)}
    assert _diff(t, 0, 10) == {i: (f"{i}@10", False) for i in range(5)}
    assert _diff(t, 25, 35) == {3: ("3@30", False)}
    assert _diff(t, 30, 40) == {}


def _holds(op: str, value: str, cut: str) -> bool:
    """The model of a string predicate `value op cut`."""
    if op == "PREFIX":
        return value.startswith(cut)
    return {"GE": value >= cut, "LT": value < cut, "EQ": value == cut}[op]


@pytest.mark.parametrize("keys", ["int", "string"])
@pytest.mark.parametrize("seed", range(4))
def test_snapshot_reads_with_predicates_bounds_limits_and_projections_match_a_model(
    tmp_path: Path, seed: int, keys: str
) -> None:
    """Everything a scan can ask besides the timestamp applies to the rows as of it: a
    predicate on a value column judges the version the snapshot sees (not the newest), key
    bounds and a resume key cut that version's keys, a limit counts them in key order, and a
    projection returns their columns. Random histories of every kind of write, with flushes,
    compactions (a horizon included) and reopens, read through the rank path, the gathered
    path and the newest rows alike."""
    rng = random.Random(100 + seed)
    schema = SCHEMA if keys == "int" else STRING_KEYS
    t = Tablet(tmp_path / "t", schema)

    def name(k: int) -> Any:
        return k if keys == "int" else "k" * (k % 3 + 1) + str(k)

    model: dict[Any, list[tuple[int, str | None]]] = {}
    ts, horizon, stamps = 0, 0, [0]
    for step in range(160):
        ts += rng.choice([1, 2, 5])
        # Mostly whole rounds over a band of keys (one rank per snapshot), sometimes a few keys.
        if rng.random() < 0.5:
            lo = rng.randrange(0, 30)
            chosen = [name(k) for k in range(lo, lo + rng.randint(5, 30))]
        else:
            chosen = [name(k) for k in rng.sample(range(60), rng.randint(1, 6))]
        live = {k for k in chosen if model.get(k) and model[k][-1][1] is not None}
        op = rng.choice([RowOp.UPSERT, RowOp.UPSERT, RowOp.UPSERT, RowOp.DELETE])
        if op is RowOp.DELETE:
            chosen = [k for k in chosen if k in live]
            if not chosen:
                continue
            t.write(ts, [{"id": k} for k in chosen], op)
        else:
            t.write(ts, [{"id": k, "v": f"{rng.randrange(100):02d}@{ts}"} for k in chosen], op)
        for k, row in zip(chosen, t.last_rows, strict=True):
            model.setdefault(k, []).append((ts, row.get("v")))
        stamps.append(ts)
        horizon = _churn(t, rng, stamps, horizon, (0.15, 0.2, 0.22), 0.3)
        if step % 40 != 39:
            continue
        for at in sorted({*rng.sample(stamps, min(6, len(stamps))), ts, None}, key=str):
            if at is not None and at < horizon:
                continue
            state = {}
            for k, versions in model.items():
                seen = [v for when, v in versions if at is None or when <= at]
                if seen and seen[-1] is not None:
                    state[k] = seen[-1]
            ordered = sorted(state)  # ints, or ASCII strings: their order is the key order
            for _ in range(6):
                preds: list[ColumnPredicate] = []
                want = list(ordered)
                cut = f"{rng.randrange(100):02d}"
                kind = rng.choice(["GE", "LT", "PREFIX", "EQ", "none"])
                if kind == "EQ" and want:
                    cut = state[rng.choice(want)]
                if kind != "none":
                    preds.append(ColumnPredicate("v", kind, (cut,)))
                    want = [k for k in want if _holds(kind, state[k], cut)]
                lower = upper = b""
                after = None
                if rng.random() < 0.5 and ordered:
                    a, b = sorted(rng.sample(ordered, 2) if len(ordered) > 1 else ordered * 2)
                    lower, upper = (
                        encode_key(schema.key_columns, (a,)),
                        encode_key(schema.key_columns, (b,)),
                    )
                    want = [k for k in want if a <= k < b]
                if rng.random() < 0.3 and ordered:
                    c = rng.choice(ordered)
                    after = encode_key(schema.key_columns, (c,))
                    want = [k for k in want if k > c]
                limit = rng.choice([0, 0, 1, 3, 17])
                if limit:
                    want = want[:limit]
                projection = rng.choice([None, ("v",), ("id",)])
                spec = ScanSpec(
                    projection=projection,
                    predicates=tuple(preds),
                    lower_key=lower,
                    upper_key=upper,
                    start_after_key=after,
                    limit=limit,
                    read_at=at,
                )
                got = [row for b in t.store.scan(spec) for row in b.to_pylist()]
                where = (seed, step, at, kind, cut, lower, upper, after, limit, projection)
                if projection == ("v",):
                    assert [r["v"] for r in got] == [state[k] for k in want], where
                    assert all(set(r) == {"v"} for r in got), where
                elif projection == ("id",):
                    assert [r["id"] for r in got] == want, where
                else:
                    assert [(r["id"], r["v"]) for r in got] == [(k, state[k]) for k in want], where
