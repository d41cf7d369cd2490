"""Merging row store sources into live rows in key order, and hashing them for checksums.

`merge_sources` is the read path shared by scans, compaction and checksums. Given the sources
of a snapshot, oldest first, it yields physical tables (see `rowstore_files`) of the live rows
in a key range, newest version per key, tombstones dropped, optionally filtered by an Arrow
expression. With one source the batches come straight from it (memory-mapped for a file).
Otherwise the range is cut into windows of about `BATCH_ROWS` keys of the largest source, which
bound the memory of each step: within a window every source's slice is concatenated with its
rank (age), sorted by (key, rank descending) and the first row of each key kept.

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

_RANK = "r"
"""The source's rank (0 = oldest) added to rows while a merge window is sorted."""


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
        for rb in src.table.slice(a, b - a).to_batches(max_chunksize=BATCH_ROWS):
            t = conform(pa.Table.from_batches([rb]), cols)
            if src.has_tombstones:
                t = t.filter(pc.invert(t.column(DEL_COL)))
            if expr is not None:
                t = t.filter(expr)
            if t.num_rows:
                yield t
        return
    # Windows of about BATCH_ROWS keys of the largest slice bound the memory of each merge.
    driver, da, db = max(slices, key=lambda s: s[2] - s[1])
    dk = driver.table.column(KEY_COL)
    bounds: list[bytes] = [lo]
    for p in range(da + BATCH_ROWS, db, BATCH_ROWS):
        bounds.append(dk[p].as_py())
    bounds.append(hi)
    for w in range(len(bounds) - 1):
        wlo, whi = bounds[w], bounds[w + 1]
        parts = []
        for rank, (src, a, b) in enumerate(slices):
            sa = max(a, src.index.left(wlo)) if wlo else a
            sb = min(b, src.index.left(whi)) if whi else b
            if sb > sa:
                part = conform(src.table.slice(sa, sb - sa), cols)
                parts.append(part.append_column(_RANK, pa.array(np.full(sb - sa, rank, np.int32))))
        if not parts:
            continue
        if len(parts) == 1:
            t = parts[0]
        else:
            t = pa.concat_tables(parts)
            order = pc.sort_indices(t, sort_keys=[(KEY_COL, "ascending"), (_RANK, "descending")])
            t = _first_of_each_key(t.take(order))
        t = t.drop_columns([_RANK])
        t = t.filter(pc.invert(t.column(DEL_COL)))
        if expr is not None:
            t = t.filter(expr)
        if t.num_rows:
            yield t


def _first_of_each_key(t: pa.Table) -> pa.Table:
    """Rows of `t` sorted by key then newest first: keep the first row of each key."""
    n = t.num_rows
    if n <= 1:
        return t
    k = t.column(KEY_COL).combine_chunks()
    differs = pc.not_equal(k.slice(1), k.slice(0, n - 1))
    keep = pa.concat_arrays([pa.array([True]), differs])
    return t.filter(keep)


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
