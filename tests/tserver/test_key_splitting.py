"""Key splitting (SplitKeyRange's core): split keys picked by rank from a row store's sorted
sources must tile the range exactly, whatever the layout (files, frozen and active memstores,
tombstones, updated keys), with chunks of about the target size.

Ground truth is the store's own scan: the live keys, encoded, in order.
"""

from __future__ import annotations

import bisect
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from service.common.errors import InvalidArgument
from service.common.keys import encode_key, encode_keys_arrow
from service.common.predicates import ScanSpec
from service.common.schema import ColumnType, Schema
from service.tserver import key_splitting
from service.tserver.key_splitting import (
    KeySplit,
    check_split_args,
    column_ids,
    split_key_range,
)
from service.tserver.row_ops import RowOp
from service.tserver.rowstore import RowStore
from tests.helpers.rowstore import Writer

T = ColumnType
SCHEMA = Schema.build([("id", T.INT64), ("s", T.STRING), ("x", T.DOUBLE)], "id")
ALL = tuple(c.id for c in SCHEMA.columns)


@pytest.fixture
def store(tmp_path: Path) -> RowStore:
    return RowStore.create(tmp_path / "t", SCHEMA)


def row(i: int, tag: str = "") -> dict[str, Any]:
    return {"id": i, "s": f"s{i}{tag}", "x": i / 2}


def live_keys(store: RowStore) -> list[bytes]:
    """Every live row's encoded key, in key order (from a scan: the ground truth)."""
    out: list[bytes] = []
    names = [c.name for c in store.schema.key_columns]
    for b in store.scan(ScanSpec(projection=tuple(names))):
        out.extend(encode_keys_arrow(store.schema.key_columns, b))
    return out


def k(i: int) -> bytes:
    return encode_key(SCHEMA.key_columns, [i])


def split(store: RowStore, start: bytes = b"", stop: bytes = b"", **kw: Any) -> KeySplit:
    kw.setdefault("column_ids", ALL)
    return split_key_range(store.split_view(), start, stop, **kw)


def actual_sizes(store: RowStore, sp: KeySplit, start: bytes = b"", stop: bytes = b"") -> list[int]:
    """Check the tiling invariants of `sp` over [start, stop) and return each chunk's real rows.

    Every live key of the range falls in exactly one chunk (the chunks' scans together give
    the range's scan, no gap, no overlap), split keys increase strictly and lie strictly inside.
    """
    keys = list(sp.split_keys)
    assert len(sp.chunks) == len(keys) + 1
    assert all(a < b for a, b in itertools.pairwise(keys))
    assert all(key > start and (not stop or key < stop) for key in keys)
    live = [x for x in live_keys(store) if x >= start and (not stop or x < stop)]
    bounds = [start, *keys, stop]
    sizes = []
    pieces: list[bytes] = []
    for lo, hi in itertools.pairwise(bounds):
        spec = ScanSpec(projection=("id",), lower_key=lo, upper_key=hi)
        got = [x for b in store.scan(spec) for x in encode_keys_arrow(SCHEMA.key_columns, b)]
        sizes.append(len(got))
        pieces.extend(got)
    assert pieces == live
    # The same through positions in the live keys (independent of the scan's own bounds).
    cuts = [0] + [bisect.bisect_left(live, x) for x in keys] + [len(live)]
    assert sizes == [b - a for a, b in itertools.pairwise(cuts)]
    return sizes


# --- shapes ----------------------------------------------------------------------------------


def test_empty_tablet_is_one_chunk(store: RowStore) -> None:
    sp = split(store, target_rows=10)
    assert sp.split_keys == () and len(sp.chunks) == 1
    assert (sp.chunks[0].rows, sp.chunks[0].bytes) == (0, 0)
    assert split(store, k(5), k(9), target_rows=1).split_keys == ()


def test_one_row_is_never_split(store: RowStore) -> None:
    Writer(store)([row(7)])
    for target in (1, 2, 1000):
        sp = split(store, target_rows=target)
        assert sp.split_keys == ()
        assert sp.chunks[0].rows == 1
    store.flush()
    assert split(store, target_rows=1).split_keys == ()


def test_one_file_is_split_exactly_by_rank(store: RowStore) -> None:
    Writer(store)([row(i) for i in range(10_000)])
    store.flush()
    sp = split(store, target_rows=1000)
    assert sp.split_keys == tuple(k(i) for i in range(1000, 10_000, 1000))
    assert actual_sizes(store, sp) == [1000] * 10
    assert [c.rows for c in sp.chunks] == [1000] * 10
    # Balanced: 10,000 rows by 3,000 make 4 chunks of 2,500, not 3 of 3,000 and a remainder.
    sp = split(store, target_rows=3000)
    assert actual_sizes(store, sp) == [2500] * 4


def test_memstore_only_is_split_exactly(store: RowStore) -> None:
    w = Writer(store)
    order = list(range(0, 5000, 5))
    random.Random(3).shuffle(order)  # the memstore is a dict in arrival order
    w([row(i) for i in order])
    sp = split(store, target_rows=100)
    assert actual_sizes(store, sp) == [100] * 10


def test_many_files_and_memstores(store: RowStore) -> None:
    """Interleaved keys in 4 files, a frozen memstore and the active one: ranks are exact."""
    w = Writer(store)
    for phase in range(4):
        w([row(i) for i in range(phase, 24_000, 6)])
        store.flush()
    w([row(i) for i in range(4, 24_000, 6)])
    frozen = store.freeze()  # frozen, not yet written: still a memstore
    assert frozen is not None
    w([row(i) for i in range(5, 24_000, 6)])
    assert len(store.split_view().files) == 4 and len(store.split_view().memstores) == 2
    sp = split(store, target_rows=2000)
    sizes = actual_sizes(store, sp)
    assert len(sizes) == 12
    assert all(1750 <= s <= 2250 for s in sizes), sizes
    assert sum(c.rows for c in sp.chunks) == 24_000
    # Uneven sources: one big file, a small overlapping memstore.
    store.write_frozen(frozen)
    store.install(frozen)
    store.compact()
    w([row(i, "new") for i in range(30_000, 31_000)])
    sizes = actual_sizes(store, split(store, target_rows=5000))
    assert all(3500 <= s <= 6500 for s in sizes), sizes


def test_updates_and_deletes_keep_tiling_and_sizes(store: RowStore) -> None:
    """Updated keys have versions in several sources and deleted ones leave tombstones
    (flushed and in memory): sizes stay near the target, the tiling exact."""
    w = Writer(store)
    w([row(i) for i in range(20_000)])
    store.flush()
    w([row(i, "u") for i in range(10_000, 20_000, 2)], RowOp.UPSERT)  # 2 versions each
    store.flush()
    w([{"id": i} for i in range(2_000, 6_000)], RowOp.DELETE)  # a hole: tombstones, flushed
    store.flush()
    w([{"id": i} for i in range(7_000, 8_000)], RowOp.DELETE)  # tombstones in memory
    w(
        [row(i) for i in range(30_000, 30_500)] + [{"id": i} for i in range(30_000, 30_500)],
        ops=[RowOp.INSERT] * 500 + [RowOp.DELETE] * 500,
    )  # inserted and deleted in memory
    assert store.row_count() == 15_000
    sp = split(store, target_rows=1000)
    sizes = actual_sizes(store, sp)
    assert len(sizes) == 15
    # Within a factor: the updated upper half holds two versions per key until compaction, so
    # its chunks come out smaller, and the global correction (f) makes the others larger.
    assert all(700 <= s <= 1400 for s in sizes), sizes
    assert abs(sum(c.rows for c in sp.chunks) - 15_000) <= 15
    # Once compacted the tombstones are gone and the split is exact again.
    store.flush()
    store.compact()
    assert actual_sizes(store, split(store, target_rows=1000)) == [1000] * 15


def test_deleting_updated_keys_only_shrinks_chunks(store: RowStore) -> None:
    """The approximation's worst case: keys updated (two live versions) and then deleted still
    weigh one row each until compaction, so chunks over them come out small, never large."""
    w = Writer(store)
    w([row(i) for i in range(20_000)])
    store.flush()
    w([row(i, "u") for i in range(0, 20_000, 2)], RowOp.UPSERT)
    store.flush()
    w([{"id": i} for i in range(5_000, 10_000)], RowOp.DELETE)
    sp = split(store, target_rows=1000)
    sizes = actual_sizes(store, sp)
    assert sum(sizes) == 15_000 and len(sizes) == 15
    assert max(sizes) <= 1200, sizes


def test_everything_deleted_is_one_chunk(store: RowStore) -> None:
    w = Writer(store)
    w([row(i) for i in range(100)])
    store.flush()
    w([{"id": i} for i in range(100)], RowOp.DELETE)
    sp = split(store, target_rows=10)
    assert sp.split_keys == () and sp.chunks[0].rows == 0
    actual_sizes(store, sp)


def test_bounds_are_respected(store: RowStore) -> None:
    w = Writer(store)
    w([row(i) for i in range(0, 10_000, 2)])
    store.flush()
    w([row(i) for i in range(1, 10_000, 2)])
    for lo, hi in [(k(1000), k(3000)), (b"", k(2001)), (k(8999), b""), (k(-50), k(10))]:
        sp = split(store, lo, hi, target_rows=300)
        sizes = actual_sizes(store, sp, lo, hi)
        total = sum(sizes)
        assert len(sizes) == max(1, -(-total // 300))
        assert all(s <= 330 for s in sizes), sizes
    # A range with no rows, and bounds that are not keys of the table.
    assert split(store, k(20_000), k(30_000), target_rows=1).split_keys == ()
    assert split(store, b"\x80", b"\x80\x00\x00\x00\x00\x00\x03\xe8\x01", target_rows=100).chunks


def test_variable_width_keys(tmp_path: Path) -> None:
    """String and composite keys go through the list index (no fixed-width numpy view)."""
    schema = Schema.build([("host", T.STRING), ("ts", T.INT64), ("v", T.DOUBLE)], ["host", "ts"])
    store = RowStore.create(tmp_path / "v", schema)
    w = Writer(store)
    hosts = [f"h{n}" * (n % 3 + 1) for n in range(40)]
    w([{"host": h, "ts": t, "v": 1.0} for h in hosts[:20] for t in range(100)])
    store.flush()
    w([{"host": h, "ts": t, "v": 2.0} for h in hosts[10:] for t in range(0, 100, 2)])
    lo = encode_key(schema.key_columns, ["h1", 0], allow_prefix=True)
    sp = split_key_range(store.split_view(), lo, b"", target_rows=250, column_ids=(3,))
    assert all(a < b for a, b in itertools.pairwise(sp.split_keys))
    assert all(x > lo for x in sp.split_keys)
    live: list[bytes] = []
    total = 0
    for b in store.scan(ScanSpec(projection=("host", "ts"), lower_key=lo)):
        live.extend(encode_keys_arrow(schema.key_columns, b))
        total += b.num_rows
    cuts = [0] + [bisect.bisect_left(live, x) for x in sp.split_keys] + [total]
    sizes = [b - a for a, b in itertools.pairwise(cuts)]
    assert sum(sizes) == total and len(sizes) == -(-total // 250)
    assert all(150 <= s <= 300 for s in sizes), sizes


def test_target_bytes_counts_the_requested_columns(store: RowStore) -> None:
    Writer(store)([{"id": i, "s": "x" * 96, "x": 0.0} for i in range(4000)])
    store.flush()
    ids = column_ids(SCHEMA, ["s"])
    sp = split(store, target_bytes=100 * 400, column_ids=ids)  # about 100 B per row of s
    sizes = actual_sizes(store, sp)
    assert len(sizes) == 10 and all(abs(s - 400) <= 20 for s in sizes), sizes
    assert all(abs(c.bytes - 40_000) <= 2_000 for c in sp.chunks)
    # Only the id column (8 B a row): the same byte target makes far fewer chunks.
    assert len(split(store, target_bytes=40_000, column_ids=column_ids(SCHEMA, ["id"])).chunks) == 1
    # Both targets: whichever cuts more.
    sp = split(store, target_rows=200, target_bytes=40_000, column_ids=ids)
    assert len(sp.chunks) == 20


def test_chunk_count_is_capped(store: RowStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key_splitting, "MAX_CHUNKS", 7)
    Writer(store)([row(i) for i in range(700)])
    sizes = actual_sizes(store, split(store, target_rows=1))
    assert sizes == [100] * 7


def test_random_layouts_always_tile(tmp_path: Path) -> None:
    """Random writes, deletes, flushes and compactions; random bounds and targets: the chunks
    always tile the range exactly, and sizes stay within a factor of the target."""
    for seed in range(12):
        rng = random.Random(seed)
        store = RowStore.create(tmp_path / f"r{seed}", SCHEMA)
        w = Writer(store)
        present: set[int] = set()
        for _ in range(rng.randint(3, 9)):
            action = rng.random()
            if action < 0.55:
                ids = rng.sample(range(5000), rng.randint(1, 1500))
                w([row(i, str(seed)) for i in ids], RowOp.UPSERT)
                present |= set(ids)
            elif action < 0.75 and present:
                gone = rng.sample(sorted(present), rng.randint(1, max(1, len(present) // 3)))
                w([{"id": i} for i in gone], RowOp.DELETE)
                present -= set(gone)
            elif action < 0.95:
                store.flush()
            else:
                store.compact()
        assert store.row_count() == len(present)
        a, b = sorted(rng.sample(range(-10, 5010), 2))
        lo = rng.choice([b"", k(a)])
        hi = rng.choice([b"", k(b)])
        target = rng.choice([3, 7, 50, 333, 2000])
        sp = split(store, lo, hi, target_rows=target)
        sizes = actual_sizes(store, sp, lo, hi)
        if sum(sizes) >= 4 * target and target >= 50:
            assert max(sizes) <= 2 * target and min(sizes) >= target // 4, (seed, target, sizes)


# --- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((b"", b"", 0, 0), "target_chunk_rows"),
        ((b"", b"", -5, 0), "target_chunk_rows"),
        ((b"", b"", 0, -1), "target_chunk_bytes"),
        ((b"b", b"a", 10, 0), "start_primary_key"),
        ((b"a", b"a", 10, 0), "start_primary_key"),
    ],
)
def test_bad_arguments_name_the_field(args: tuple[bytes, bytes, int, int], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        check_split_args(*args)


def test_open_bounds_and_unknown_columns() -> None:
    check_split_args(b"z", b"", 1, 0)  # stop open: any start
    check_split_args(b"", b"a", 0, 1)
    assert column_ids(SCHEMA, []) == ALL
    with pytest.raises(InvalidArgument, match="columns: no column 'nope'"):
        column_ids(SCHEMA, ["id", "nope"])
