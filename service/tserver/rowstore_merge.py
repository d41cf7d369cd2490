"""Merging row store sources into live rows in key order, and hashing them for checksums.

`merge_sources` is the read path shared by scans, compaction and checksums. Given the sources
of a snapshot, oldest first, it yields physical tables (see `rowstore_files`) of the live rows
in a key range, newest version per key, tombstones dropped, optionally filtered by an Arrow
expression. With one source the batches come straight from it (memory-mapped for a file).
Otherwise the range is cut into windows, each holding at most `BATCH_ROWS` rows of any source
(which bounds the memory of each step) and cut as well at the first and last key of every
source:

* a window that only one source has rows in is passed through as it is, no merge and no copy:
  the common case when files hold mostly disjoint key ranges (rows written in key order, even
  by concurrent writers, whose files overlap only at their edges);
* in the others the sources' slices, each already sorted, are merged by a stable sort (for
  fixed-width keys numpy's timsort, about linear on presorted runs), the newest version of each
  key kept, and the rows gathered as zero-copy slices when they come in long runs (see
  `_merge_window`).

Nothing here loops over rows in Python. A scan used to concatenate, sort (Arrow, on binary
keys) and `take` every window whenever a tablet had more than one source; that was most of
the time of a scan of a freshly written tablet.

`merge_versions` is compaction's: every version of every key of the sources, the newest per
key as the merged file's rows and the others as its history, less the versions no snapshot
that may still be read can see (docs/design/tablets.md#R5).

`emit_batches` turns merged tables into the record batches a scan returns (projected columns,
current names, a row limit), each with the encoded key of its last row so a scan can resume.

`hash_array` feeds a column into a checksum as canonical value streams (validity, fixed-width
values with nulls zeroed, lengths and bytes of variable-width values), so that a digest does not
depend on how rows are split among files, memstores or batches.
"""

from __future__ import annotations

import decimal
import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.common.schema import ColumnSchema, ColumnType
from service.tserver.rowstore_files import (
    BATCH_ROWS,
    DEL_COL,
    KEY_COL,
    TS_COL,
    Source,
    conform,
    phys_name,
)

__all__ = ["emit_batches", "hash_array", "merge_sources", "merge_versions"]

MIN_RUN_ROWS = 1024
"""A merged window is returned as zero-copy slices of its sources when its runs of consecutive
rows average at least this many rows; below that one `take` copies the rows (many tiny slices
would cost more downstream, in every batch and IPC message, than the copy)."""


def merge_sources(
    sources: Sequence[Source],
    cols: Sequence[ColumnSchema],
    lo: bytes,
    hi: bytes,
    expr: pc.Expression | None,
    *,
    with_deleted: bool = False,
) -> Iterator[pa.Table]:
    """Live rows of `sources` (oldest first) with lo <= key < hi (hi b"" = none), newest
    version per key, filtered by `expr`: physical tables (k, d, c<id> for `cols`) in key
    order. A generator over data captured by the caller: later writes are not seen.

    `with_deleted` (diff scans): tombstones are kept too, and the tables carry each row's
    commit timestamp (k, d, t, c<id>...); `expr` then filters live rows only."""
    slices = []
    for src in sources:
        a = src.index.left(lo) if lo else 0
        b = src.index.left(hi) if hi else src.num_rows
        if b > a:
            slices.append((src, a, b))
    if not slices:
        return
    if len(slices) == 1:
        src, a, b = slices[0]
        yield from _straight(src, a, b, cols, expr, with_deleted)
        return
    # Windows hold at most BATCH_ROWS rows of each source (which bounds the memory of a merge)
    # and are also cut where a source's rows start and end, so that where sources do not
    # overlap, a window has one source and needs no merge.
    bounds = _window_bounds(slices, lo, hi)
    for w in range(len(bounds) - 1):
        wlo, whi = bounds[w], bounds[w + 1]
        parts = []
        for src, a, b in slices:
            sa = max(a, src.index.left(wlo)) if wlo else a
            sb = min(b, src.index.left(whi)) if whi else b
            if sb > sa:
                parts.append((src, sa, sb))
        if len(parts) == 1:
            yield from _straight(*parts[0], cols, expr, with_deleted)
        elif parts:
            t = _merge_window(parts, cols, with_deleted)
            if expr is not None and t.num_rows:
                t = _filter(t, expr, with_deleted)
            if t.num_rows:
                yield t


def _window_bounds(slices: Sequence[tuple[Source, int, int]], lo: bytes, hi: bytes) -> list[bytes]:
    """Window edges over `slices` (see `merge_sources`): at most BATCH_ROWS rows of any source
    per window, and a cut where each source's rows start and end."""
    cuts: set[bytes] = set()
    for src, a, b in slices:
        keys = src.table.column(KEY_COL)
        for p in range(a, b, BATCH_ROWS):
            cuts.add(keys[p].as_py())
        cuts.add(keys[b - 1].as_py() + b"\x00")  # the smallest key after the last one
    return [lo, *sorted(k for k in cuts if k > lo and (not hi or k < hi)), hi]


def merge_versions(
    sources: Sequence[Source], cols: Sequence[ColumnSchema], horizon: int
) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Every version of every key of `sources` (oldest source first), window by window in key
    order: (base, history) physical tables with timestamps (k, d, t, c<id> for `cols`), the
    newest version of each key in `base`, the others in `history` (by key, newest first).

    Versions no snapshot at or after `horizon` can see are dropped: of a key's versions
    committed at or before `horizon`, only the newest is kept, and only if it is not a
    tombstone (a snapshot at or after the horizon that finds no version of the key here sees
    it absent, as it was: the caller merges every source that holds these keys). So a key
    deleted before the horizon goes entirely, and a key that changed since keeps exactly the
    versions snapshots may still ask for.

    Sources are newer than the ones before them and versions within a source newer than its
    history, so laying the slices end to end newest source first, each source's base before
    its history, and sorting stably by key puts every key's versions newest first."""
    slices = [(src, 0, src.num_rows) for src in sources if src.num_rows]
    if not slices:
        return
    bounds = _window_bounds(slices, b"", b"")
    for w in range(len(bounds) - 1):
        wlo, whi = bounds[w], bounds[w + 1]
        pieces: list[pa.Table] = []
        for src, _, _ in reversed(slices):
            sa = src.index.left(wlo) if wlo else 0
            sb = src.index.left(whi) if whi else src.num_rows
            if sb > sa:
                pieces.append(conform(src.table.slice(sa, sb - sa), cols, with_ts=True))
            hist, hidx = src.history, src.history_index
            if hist is not None and hidx is not None:
                ha = hidx.left(wlo) if wlo else 0
                hb = hidx.left(whi) if whi else hidx.n
                if hb > ha:
                    pieces.append(conform(hist.slice(ha, hb - ha), cols, with_ts=True))
        if not pieces:
            continue
        table = pa.concat_tables(pieces)
        keys = table.column(KEY_COL)
        order = pc.sort_indices(keys).to_numpy(zero_copy_only=False)  # stable
        ordered = keys.take(pa.array(order)).combine_chunks()
        n = len(ordered)
        first = np.ones(n, dtype=bool)
        if n > 1:
            first[1:] = np.asarray(
                pc.not_equal(ordered.slice(1), ordered.slice(0, n - 1)).to_numpy(
                    zero_copy_only=False
                ),
                dtype=bool,
            )
        t = np.asarray(table.column(TS_COL).to_numpy(zero_copy_only=False), dtype=np.uint64)[order]
        deleted = np.asarray(table.column(DEL_COL).to_numpy(zero_copy_only=False), dtype=bool)[
            order
        ]
        group = np.cumsum(first) - 1
        old = t <= np.uint64(horizon)
        # The newest version at or before the horizon of each key: the first such in its group.
        old_pos = np.flatnonzero(old)
        newest_old = np.zeros(n, dtype=bool)
        if len(old_pos):
            _, firsts = np.unique(group[old_pos], return_index=True)
            newest_old[old_pos[firsts]] = True
        keep = ~old | (newest_old & ~deleted)
        kept = np.flatnonzero(keep)
        if not len(kept):
            continue
        kg = group[kept]
        head = np.ones(len(kept), dtype=bool)
        head[1:] = kg[1:] != kg[:-1]
        base = table.take(pa.array(order[kept[head]]))
        rest = order[kept[~head]]
        hist_out = table.take(pa.array(rest)) if len(rest) else table.slice(0, 0)
        yield base, hist_out


def _filter(t: pa.Table, expr: pc.Expression, with_deleted: bool) -> pa.Table:
    """`t` filtered by `expr`; with tombstones kept (`with_deleted`), only live rows are."""
    if not with_deleted:
        return t.filter(expr)
    return t.filter(pc.field(DEL_COL) | expr)


def _straight(
    src: Source,
    a: int,
    b: int,
    cols: Sequence[ColumnSchema],
    expr: pc.Expression | None,
    with_deleted: bool = False,
) -> Iterator[pa.Table]:
    """Rows [a, b) of one source, tombstones dropped: no merge, and no copy unless a filter
    (tombstones, `expr`) has something to drop."""
    for rb in src.table.slice(a, b - a).to_batches(max_chunksize=BATCH_ROWS):
        t = conform(pa.Table.from_batches([rb]), cols, with_ts=with_deleted)
        if src.has_tombstones and not with_deleted:
            t = t.filter(pc.invert(t.column(DEL_COL)))
        if expr is not None:
            t = _filter(t, expr, with_deleted)
        if t.num_rows:
            yield t


def _merge_window(
    parts: Sequence[tuple[Source, int, int]],
    cols: Sequence[ColumnSchema],
    with_deleted: bool = False,
) -> pa.Table:
    """The live rows of `parts` (slices of sources, oldest first, all within one window) in
    key order, newest version per key.

    Every source is sorted by key and holds a key at most once, so the merge is a sort of runs
    that are already sorted. The slices are laid end to end newest first and sorted with a
    stable sort, which puts the newest version of a key first among its equals; the first of
    each key is kept and tombstones dropped. Fixed-width keys (the common integer keys) sort as
    numpy byte strings or, 8 bytes wide, as big-endian unsigned integers: numpy's stable sort
    is a timsort, which merges presorted runs in about linear time. Other keys go through
    Arrow's (stable) sort.

    The rows are then gathered: when the merged order is made of long runs of consecutive
    rows of one slice (rows written in key order by one writer, or one file's key range
    barely overlapping the next one's), the result is those runs as zero-copy slices;
    otherwise one `take` copies the rows out.
    """
    newest_first = list(reversed(parts))
    order, keep = _stable_order(newest_first)
    deleted = [src.deleted[a:b] if src.deleted is not None else None for src, a, b in newest_first]
    if not with_deleted and any(d is not None for d in deleted):
        flags = np.concatenate(
            [
                d if d is not None else np.zeros(b - a, dtype=bool)
                for d, (_, a, b) in zip(deleted, newest_first, strict=True)
            ]
        )
        keep &= ~flags[order]
    idx = order[keep] if not bool(keep.all()) else order
    table = pa.concat_tables(
        [
            conform(src.table.slice(a, b - a), cols, with_ts=with_deleted)
            for src, a, b in newest_first
        ]
    )
    if len(idx) == 0:
        return table.slice(0, 0)
    starts = np.flatnonzero(np.diff(idx) != 1) + 1
    if (len(starts) + 1) * MIN_RUN_ROWS <= len(idx):
        bounds = np.concatenate(([0], starts, [len(idx)])).tolist()
        first = idx[bounds[:-1]].tolist()
        return pa.concat_tables(
            [table.slice(f, e - s) for f, s, e in zip(first, bounds[:-1], bounds[1:], strict=True)]
        )
    return table.take(pa.array(idx))


def _stable_order(parts: Sequence[tuple[Source, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(order, first): a stable sort by key of the slices laid end to end, and for each
    position in that order whether it is the first row of its key."""
    arrays = [src.index.sortable(a, b) for src, a, b in parts]
    fixed = [x for x in arrays if x is not None]
    if len(fixed) == len(arrays) and len({x.dtype for x in fixed}) == 1:
        keys: np.ndarray = np.concatenate(fixed)
        if keys.dtype.itemsize == 8:
            keys = keys.view(">u8").astype(np.uint64)
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        first = np.empty(len(order), dtype=bool)
        first[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
        return order, first
    chunks = pa.chunked_array([src.table.column(KEY_COL).slice(a, b - a) for src, a, b in parts])
    order_arr = pc.sort_indices(chunks)  # stable: the newest of equal keys stays first
    ordered = chunks.take(order_arr).combine_chunks()
    n = len(ordered)
    first = np.empty(n, dtype=bool)
    first[:1] = True
    if n > 1:
        diff = pc.not_equal(ordered.slice(1), ordered.slice(0, n - 1))
        first[1:] = diff.to_numpy(zero_copy_only=False)
    return order_arr.to_numpy(zero_copy_only=False).astype(np.int64), first


def emit_batches(
    pieces: Iterator[pa.Table],
    cols: Sequence[ColumnSchema],
    out_schema: pa.Schema,
    limit: int,
    *,
    deleted_column: bool = False,
) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """Record batches of `out_schema` from merged physical tables; `deleted_column` (a diff
    scan): the tombstone flag as the last column."""
    remaining = limit if limit > 0 else -1
    names = [phys_name(c.id) for c in cols] + ([DEL_COL] if deleted_column else [])
    for t in pieces:
        if remaining == 0:
            return
        if 0 < remaining < t.num_rows:
            t = t.slice(0, remaining)
        for rb in t.to_batches():
            if rb.num_rows == 0:
                continue
            arrays = [rb.column(name) for name in names]
            out = pa.RecordBatch.from_arrays(arrays, schema=out_schema)
            yield out, rb.column(KEY_COL)[rb.num_rows - 1].as_py()
        if remaining > 0:
            remaining -= t.num_rows


def hash_array(arr: pa.Array, col: ColumnSchema, hs: list[hashlib.blake2b]) -> None:
    """Feed `arr` into (validity, values, lengths) hashers in a split-independent form."""
    valid, values, lengths = hs
    n = len(arr)
    if n == 0:
        return
    valid.update(
        np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8).tobytes()
    )
    t = col.type
    if t in (ColumnType.STRING, ColumnType.BINARY):
        filled = pc.fill_null(arr.cast(pa.binary()), b"")
        bufs = filled.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=filled.offset * 4)
        lengths.update(np.diff(offsets).astype("<i8").tobytes())
        data = bufs[2]
        if data is not None:
            values.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        return
    if t is ColumnType.DECIMAL:
        zero = pa.scalar(decimal.Decimal(0), type=arr.type)
        filled = pc.fill_null(arr, zero) if arr.null_count else arr
        buf = filled.buffers()[1]
        values.update(memoryview(buf)[filled.offset * 16 : (filled.offset + n) * 16])
        return
    if t is ColumnType.BOOL:
        arr = arr.cast(pa.uint8())
    elif t is ColumnType.TIMESTAMP:
        arr = arr.cast(pa.int64())
    elif t is ColumnType.DATE:
        arr = arr.cast(pa.int32())
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(0, type=arr.type))
    values.update(np.ascontiguousarray(arr.to_numpy(zero_copy_only=False)).tobytes())
