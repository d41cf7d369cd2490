"""Cutting a tablet's key range into chunks of about a target size (the SplitKeyRange RPC).

Theory of operation
-------------------
A scan of a large tablet is cut into key ranges that Spark reads in parallel (kudu-spark's
splitSizeBytes). Kudu picks the split keys on the tablet server from each rowset's statistics;
here every source of the row store (`rowstore`) is already sorted by encoded primary key, so the
split keys are picked from those sorted keys *by rank*, and no row is read out:

1. The view (`KeyView`, from `RowStore.split_view` on the apply thread): the data files
   (immutable, memory-mapped, each with its key index and tombstone flags), the frozen memstores
   (immutable), a shallow copy of the active memstore's dict, and the tablet's exact live row
   count. Everything after that runs on the view alone, so it may run in a worker thread.
2. Runs: each source restricted to [start, stop) by binary search. A file's run is a slice of
   its key column; a memstore's run is its keys in range, sorted (the only sort here: memstores
   are bounded by the flush threshold). A run counts the tombstones before any position with
   per-block prefix sums of its tombstone flags.
3. Weight: R(k) is the weight of the entries of all runs below key k (one binary search per
   run). A live entry weighs +1; a tombstone -1 in any run but the oldest one with entries in
   the range (it hides its key's older version), 0 in that one (nothing older to hide). A key
   inserted and later deleted weighs 0 wherever its versions are, except one inserted and
   deleted within one memstore above older data (-1). A key updated since its file was written
   weighs once per live version, so row estimates are scaled by f = live rows / the weight of
   the whole tablet: f = 1 when no key has two versions (the cold state: one compacted file).
4. Chunks: n = ceil(f * W / target) (at most `MAX_CHUNKS`; W: the weight of the range), cut at
   the ideal ranks W*j/n for j = 1..n-1, so chunks are balanced and none is a small remainder.
   With one run the key at each ideal rank is taken directly (exact). With several, candidate
   keys are sampled from every run every W/n/(8*runs) entries, their R computed exactly (and
   made non-decreasing: a tombstone of a key whose live version lies outside the range lowers
   it), and for each ideal rank the candidate of the nearest R is taken.
5. Estimates per chunk: rows = f * its weight; bytes = f * the sum over runs of the run's weight
   in the chunk times its bytes per row (the Arrow sizes of the requested columns in a file; a
   sample of rows in a memstore).

Sizes are exact for one source (one file, or only a memstore) and close when versions are
spread evenly; where updates or deletes of updated keys concentrate, chunks there come out
smaller and the others a little larger, until compaction merges the versions. Exactness of the
tiling never depends on any of it: split keys are taken in key order with strictly increasing
rank in (0, W), so they are strictly increasing and strictly inside (start, stop), and
[start, k1), [k1, k2), ..., [kn, stop) tile the range whatever the data holds.

Cost: no row is materialized. One binary search per run per ranked key (about 8 * runs * n
candidates), one sort of each memstore's keys in range and one pass over its rows, and for a
file with tombstones vectorized passes over its flags.
"""

from __future__ import annotations

import bisect
import decimal
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.common.errors import InvalidArgument
from service.common.schema import Schema
from service.tserver.rowstore_files import KEY_COL, Source, phys_name

__all__ = [
    "MAX_CHUNKS",
    "ChunkEstimate",
    "KeySplit",
    "KeyView",
    "MemRows",
    "check_split_args",
    "column_ids",
    "split_key_range",
]

MAX_CHUNKS = 10_000
"""The most chunks one split makes: a smaller target gets this many larger chunks (it bounds
the response and the work)."""

_CANDIDATES_PER_CHUNK = 8
"""Candidate keys sampled per chunk per run (step 4 of the module docstring)."""
_BLOCK = 4096
"""Entries per block of the tombstone prefix sums."""
_SAMPLE_ROWS = 64
"""Memstore rows sampled for its bytes per row."""


@dataclass(frozen=True)
class MemRows:
    """A memstore as the splitter reads it: rows by encoded key (None: a tombstone), laid out
    as `col_ids`. Never mutated while a split reads it."""

    rows: Mapping[bytes, tuple[object, ...] | None]
    col_ids: tuple[int, ...]


@dataclass(frozen=True)
class KeyView:
    """A tablet's sorted sources at one moment (step 1), oldest first."""

    files: tuple[Source, ...]
    memstores: tuple[MemRows, ...]
    live_rows: int
    """Live rows of the whole tablet, exactly."""


@dataclass(frozen=True)
class ChunkEstimate:
    rows: int
    bytes: int


@dataclass(frozen=True)
class KeySplit:
    """`split_keys` cut [start, stop) into len(split_keys) + 1 chunks, estimated in `chunks`."""

    split_keys: tuple[bytes, ...]
    chunks: tuple[ChunkEstimate, ...]


# --- arguments -------------------------------------------------------------------------------


def check_split_args(start: bytes, stop: bytes, target_rows: int, target_bytes: int) -> None:
    """InvalidArgument naming the request field that is wrong."""
    if target_rows < 0:
        raise InvalidArgument(f"target_chunk_rows: must be > 0, got {target_rows}")
    if target_bytes < 0:
        raise InvalidArgument(f"target_chunk_bytes: must be > 0, got {target_bytes}")
    if target_rows == 0 and target_bytes == 0:
        raise InvalidArgument("target_chunk_rows: must be > 0 (or set target_chunk_bytes > 0)")
    if start and stop and start >= stop:
        raise InvalidArgument(
            "start_primary_key: must be below stop_primary_key (the range [start, stop) is empty)"
        )


def column_ids(schema: Schema, names: Sequence[str]) -> tuple[int, ...]:
    """The ids of the columns `names` (every column when empty); InvalidArgument naming one
    that does not exist."""
    if not names:
        return tuple(c.id for c in schema.columns)
    out = []
    for name in names:
        if not schema.has_column(name):
            raise InvalidArgument(
                f"columns: no column {name!r} in the table (schema version {schema.version})"
            )
        out.append(schema.column(name).id)
    return tuple(out)


# --- runs ------------------------------------------------------------------------------------


class _Run:
    """One source's entries with start <= key < stop, sorted (step 2).

    `hides` says whether its tombstones weigh -1 (an older run has entries in the range) or 0.
    """

    def __init__(self, n: int, dead: np.ndarray | None, bytes_per_row: float) -> None:
        self.n = n
        self.bytes_per_row = bytes_per_row
        self.hides = False
        self._dead = dead if dead is not None and dead.any() else None
        self._block_dead: np.ndarray | None = None
        if self._dead is not None:
            sums = np.add.reduceat(self._dead, np.arange(0, n, _BLOCK), dtype=np.int64)
            self._block_dead = np.concatenate(([0], np.cumsum(sums)))

    def dead_before(self, p: int) -> int:
        """Tombstones among the first `p` entries."""
        if self._dead is None:
            return 0
        assert self._block_dead is not None
        b = p // _BLOCK
        return int(self._block_dead[b]) + int(np.count_nonzero(self._dead[b * _BLOCK : p]))

    def weight_before(self, p: int) -> int:
        """The weight (step 3) of the first `p` entries."""
        dead = self.dead_before(p)
        return p - dead - (dead if self.hides else 0)

    def position_of_weight(self, w: int) -> int:
        """The smallest position with weight `w` before it (`hides` off: monotone)."""
        lo, hi = w, self.n
        while lo < hi:
            mid = (lo + hi) // 2
            if self.weight_before(mid) >= w:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def left(self, key: bytes) -> int:
        """The number of entries < `key`."""
        raise NotImplementedError

    def keys_at(self, positions: list[int]) -> list[bytes]:
        raise NotImplementedError


class _FileRun(_Run):
    def __init__(self, src: Source, a: int, b: int, bytes_per_row: float) -> None:
        self._src = src
        self._a = a
        self._b = b
        self._keys = src.table.column(KEY_COL)
        self._starts = np.cumsum([0] + [len(c) for c in self._keys.chunks])
        dead = src.deleted[a:b] if src.deleted is not None else None
        super().__init__(b - a, dead, bytes_per_row)

    def left(self, key: bytes) -> int:
        return min(max(self._src.index.left(key), self._a), self._b) - self._a

    def keys_at(self, positions: list[int]) -> list[bytes]:
        # Key by key from the file's record batches: a `take` on the chunked column would
        # first concatenate every key of the file.
        out = []
        at = np.asarray(positions, dtype=np.int64) + self._a
        for p, c in zip(at.tolist(), np.searchsorted(self._starts, at, "right") - 1, strict=True):
            out.append(self._keys.chunk(int(c))[p - int(self._starts[c])].as_py())
        return out


class _MemRun(_Run):
    def __init__(self, keys: list[bytes], dead: np.ndarray, bytes_per_row: float) -> None:
        self._keys = keys
        super().__init__(len(keys), dead, bytes_per_row)

    def left(self, key: bytes) -> int:
        return bisect.bisect_left(self._keys, key)

    def keys_at(self, positions: list[int]) -> list[bytes]:
        return [self._keys[p] for p in positions]


def _file_run(src: Source, start: bytes, stop: bytes, ids: Sequence[int]) -> _FileRun:
    a = src.index.left(start) if start else 0
    b = src.index.left(stop) if stop else src.num_rows
    names = set(src.table.schema.names)
    nbytes = sum(src.table.column(phys_name(i)).nbytes for i in ids if phys_name(i) in names)
    return _FileRun(src, a, max(a, b), nbytes / src.num_rows if src.num_rows else 0.0)


def _value_bytes(v: object) -> int:
    """About what `v` takes in an Arrow column."""
    if v is None:
        return 0
    if isinstance(v, str | bytes):
        return len(v) + 4
    if isinstance(v, bool):
        return 1
    if isinstance(v, decimal.Decimal):
        return 16
    return 8


def _mem_run(
    mem: MemRows, dead_keys: list[bytes], start: bytes, stop: bytes, ids: Sequence[int]
) -> _MemRun:
    rows = mem.rows
    if start or stop:
        keys = sorted(k for k in rows if k >= start and (not stop or k < stop))
    else:
        keys = sorted(rows)
    dead = np.zeros(len(keys), dtype=bool)
    for k in dead_keys:  # usually few: positions by binary search, not a pass over the rows
        p = bisect.bisect_left(keys, k)
        if p < len(keys) and keys[p] == k:
            dead[p] = True
    wanted = set(ids)
    slots = [j for j, cid in enumerate(mem.col_ids) if cid in wanted]
    sampled = total = 0
    for r in rows.values():
        if r is not None:
            total += sum(_value_bytes(r[j]) for j in slots)
            sampled += 1
            if sampled == _SAMPLE_ROWS:
                break
    return _MemRun(keys, dead, total / sampled if sampled else 0.0)


def _tablet_weight(view: KeyView, mem_dead: list[list[bytes]]) -> int:
    """The weight (step 3) of every source, whole."""
    w = 0
    for age, src in enumerate(view.files):
        dead = int(np.count_nonzero(src.deleted)) if src.deleted is not None else 0
        w += src.num_rows - dead - (dead if age else 0)
    for age, (mem, keys) in enumerate(zip(view.memstores, mem_dead, strict=True), len(view.files)):
        w += len(mem.rows) - len(keys) - (len(keys) if age else 0)
    return w


# --- the split -------------------------------------------------------------------------------


def split_key_range(
    view: KeyView,
    start: bytes,
    stop: bytes,
    *,
    target_rows: int = 0,
    target_bytes: int = 0,
    column_ids: Sequence[int] = (),
) -> KeySplit:
    """Split keys cutting [start, stop) (b"": open) into chunks of about `target_rows` live
    rows and/or `target_bytes` bytes of the columns `column_ids` (module docstring)."""
    check_split_args(start, stop, target_rows, target_bytes)
    runs: list[_Run] = [_file_run(src, start, stop, column_ids) for src in view.files]
    mem_dead = [[k for k, r in m.rows.items() if r is None] for m in view.memstores]
    runs += [
        _mem_run(m, dead, start, stop, column_ids)
        for m, dead in zip(view.memstores, mem_dead, strict=True)
    ]
    runs = [r for r in runs if r.n]  # oldest first
    for r in runs[1:]:
        r.hides = True
    weights = [r.weight_before(r.n) for r in runs]
    total = sum(weights)
    if total <= 0:
        return KeySplit((), (ChunkEstimate(max(0, total), 0),))
    whole = _tablet_weight(view, mem_dead)
    f = view.live_rows / whole if whole > 0 else 1.0
    per_row = max(0.0, sum(w * r.bytes_per_row for r, w in zip(runs, weights, strict=True)))
    per_row /= total
    targets = [float(target_rows)] if target_rows else []
    if target_bytes and per_row > 0:
        targets.append(target_bytes / per_row)
    n = math.ceil(f * total / max(1.0, min(targets))) if targets else 1
    n = max(1, min(n, MAX_CHUNKS, total))
    ideal = [total * j / n for j in range(1, n)]

    # Candidate keys, sorted, with their exact ranks made non-decreasing (steps 3 and 4).
    if len(runs) == 1:
        (run,) = runs
        cands = run.keys_at([run.position_of_weight(round(t)) for t in ideal])
    else:
        step = max(1, int(total / n / (_CANDIDATES_PER_CHUNK * len(runs))))
        pool: set[bytes] = set()
        for run in runs:
            pool.update(run.keys_at(list(range(step, run.n, step))))
        cands = sorted(pool)
    ranks = list(
        itertools.accumulate(
            (sum(r.weight_before(r.left(k)) for r in runs) for k in cands), max, initial=0
        )
    )[1:]

    chosen: list[bytes] = []
    prev = 0
    for t in ideal:
        i = bisect.bisect_left(ranks, t)
        if i > 0 and (i == len(ranks) or t - ranks[i - 1] <= ranks[i] - t):
            i -= 1
        if i < len(ranks) and ranks[i] <= prev:
            i = bisect.bisect_right(ranks, prev)
        if i >= len(ranks) or ranks[i] >= total:
            break
        chosen.append(cands[i])
        prev = ranks[i]

    # Estimates per chunk (step 5).
    bounds = [[0] + [r.left(k) for k in chosen] + [r.n] for r in runs]
    chunks = []
    for j in range(len(chosen) + 1):
        rows = 0.0
        nbytes = 0.0
        for r, pos in zip(runs, bounds, strict=True):
            w = r.weight_before(pos[j + 1]) - r.weight_before(pos[j])
            rows += w
            nbytes += w * r.bytes_per_row
        chunks.append(ChunkEstimate(max(0, round(f * rows)), max(0, round(f * nbytes))))
    return KeySplit(tuple(chosen), tuple(chunks))
