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
    Source,
    conform,
    phys_name,
)

__all__ = ["emit_batches", "hash_array", "merge_sources"]

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
) -> Iterator[pa.Table]:
    """Live rows of `sources` (oldest first) with lo <= key < hi (hi b"" = none), newest
    version per key, filtered by `expr`: physical tables (k, d, c<id> for `cols`) in key
    order. A generator over data captured by the caller: later writes are not seen."""
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
        yield from _straight(src, a, b, cols, expr)
        return
    # Windows hold at most BATCH_ROWS rows of each source (which bounds the memory of a merge)
    # and are also cut where a source's rows start and end, so that where sources do not
    # overlap, a window has one source and needs no merge.
    cuts: set[bytes] = set()
    for src, a, b in slices:
        keys = src.table.column(KEY_COL)
        for p in range(a, b, BATCH_ROWS):
            cuts.add(keys[p].as_py())
        cuts.add(keys[b - 1].as_py() + b"\x00")  # the smallest key after the last one
    bounds = [lo, *sorted(k for k in cuts if k > lo and (not hi or k < hi)), hi]
    for w in range(len(bounds) - 1):
        wlo, whi = bounds[w], bounds[w + 1]
        parts = []
        for src, a, b in slices:
            sa = max(a, src.index.left(wlo)) if wlo else a
            sb = min(b, src.index.left(whi)) if whi else b
            if sb > sa:
                parts.append((src, sa, sb))
        if len(parts) == 1:
            yield from _straight(*parts[0], cols, expr)
        elif parts:
            t = _merge_window(parts, cols)
            if expr is not None and t.num_rows:
                t = t.filter(expr)
            if t.num_rows:
                yield t


def _straight(
    src: Source, a: int, b: int, cols: Sequence[ColumnSchema], expr: pc.Expression | None
) -> Iterator[pa.Table]:
    """Rows [a, b) of one source, tombstones dropped: no merge, and no copy unless a filter
    (tombstones, `expr`) has something to drop."""
    for rb in src.table.slice(a, b - a).to_batches(max_chunksize=BATCH_ROWS):
        t = conform(pa.Table.from_batches([rb]), cols)
        if src.has_tombstones:
            t = t.filter(pc.invert(t.column(DEL_COL)))
        if expr is not None:
            t = t.filter(expr)
        if t.num_rows:
            yield t


def _merge_window(
    parts: Sequence[tuple[Source, int, int]], cols: Sequence[ColumnSchema]
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
    if any(d is not None for d in deleted):
        flags = np.concatenate(
            [
                d if d is not None else np.zeros(b - a, dtype=bool)
                for d, (_, a, b) in zip(deleted, newest_first, strict=True)
            ]
        )
        keep &= ~flags[order]
    idx = order[keep] if not bool(keep.all()) else order
    table = pa.concat_tables(
        [conform(src.table.slice(a, b - a), cols) for src, a, b in newest_first]
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
) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    remaining = limit if limit > 0 else -1
    names = [phys_name(c.id) for c in cols]
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
