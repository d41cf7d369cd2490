"""The physical layout of row store sources, their key index, and the data file helpers.

A *source* is a table sorted by encoded primary key in the physical layout: the key column `k`
(binary), the tombstone flag `d` (bool), then one column per table column named by the column's
*id* (`c3`, see `phys_name`), never its name. Data files are Arrow IPC files in that layout, written
in record batches of `BATCH_ROWS` rows and fsynced (`write_arrow_file`), and read back memory-mapped
with their column types checked against the schema (`open_arrow_file`); a materialized memstore is
the same layout in memory. `conform` reads a source written under an older schema as the current
one: columns are picked by id and a column added since comes out as its default (or null).

`KeyIndex` answers "where is this key" without scanning: encoded keys of fixed-width key columns
are viewed in place as a numpy `S{W}` array (memcmp order is key order) and searched with one
vectorized `searchsorted` per batch of keys; other keys fall back to a Python list and `bisect`.

Nothing here mutates shared state: all of it is safe in worker threads (`write_frozen`,
`write_compaction`).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.common.errors import Corruption
from service.common.schema import ColumnSchema, Schema

__all__ = [
    "BATCH_ROWS",
    "DEL_COL",
    "KEY_COL",
    "KeyIndex",
    "Source",
    "conform",
    "file_schema",
    "open_arrow_file",
    "phys_name",
    "write_arrow_file",
]

BATCH_ROWS = 65536
"""Rows per record batch in data files, and the size of merge windows in scans."""

KEY_COL = "k"
"""The encoded primary key column (binary) of the physical layout."""
DEL_COL = "d"
"""The tombstone flag column (bool) of the physical layout."""


def phys_name(column_id: int) -> str:
    """The physical column name of the table column with id `column_id`."""
    return f"c{column_id}"


# --- sorted key lookup -----------------------------------------------------------------------


class KeyIndex:
    """Binary search over the sorted encoded keys of one source.

    Encoded keys of fixed-width key columns (the common integer keys) all have the same length
    W; they are viewed as a numpy `S{W}` array, whose comparisons are memcmp on W bytes, so the
    order is the key order. Other keys fall back to a Python list and `bisect`.
    """

    __slots__ = ("_list", "_np", "_width", "n")

    def __init__(self, keys: pa.Array) -> None:
        self.n = len(keys)
        self._np: np.ndarray | None = None
        self._list: list[bytes] | None = None
        self._width = 0
        if self.n:
            bufs = keys.buffers()
            offsets = np.frombuffer(
                bufs[1], dtype=np.int32, count=self.n + 1, offset=keys.offset * 4
            )
            lengths = np.diff(offsets)
            width = int(lengths[0])
            if width > 0 and bool((lengths == width).all()):
                self._np = np.frombuffer(
                    bufs[2], dtype=f"S{width}", count=self.n, offset=int(offsets[0])
                )
                self._width = width
        if self._np is None:
            self._list = keys.to_pylist()

    def left(self, key: bytes) -> int:
        """The number of keys < `key`."""
        if self.n == 0:
            return 0
        if self._list is not None:
            return bisect.bisect_left(self._list, key)
        assert self._np is not None
        w = self._width
        if len(key) > w:
            # Stored keys equal to key[:w] are shorter than `key`, so they sort before it.
            return int(np.searchsorted(self._np, np.array(key[:w], dtype=f"S{w}"), "right"))
        return int(np.searchsorted(self._np, np.array(key.ljust(w, b"\x00"), dtype=f"S{w}")))

    def sortable(self, a: int, b: int) -> np.ndarray | None:
        """Keys [a, b) as a numpy `S{W}` view (no copy) whose order is the key order, or None
        when the keys are not all of one width."""
        return self._np[a:b] if self._np is not None else None

    def find(self, keys: Sequence[bytes]) -> np.ndarray:
        """Positions of `keys` in this source (int64), -1 where absent."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if self.n == 0 or not keys:
            return out
        if self._list is not None:
            lst = self._list
            for i, k in enumerate(keys):
                j = bisect.bisect_left(lst, k)
                if j < self.n and lst[j] == k:
                    out[i] = j
            return out
        assert self._np is not None
        w = self._width
        same = np.fromiter((len(k) == w for k in keys), dtype=bool, count=len(keys))
        idx = np.flatnonzero(same)
        if len(idx) == 0:
            return out
        q = np.array([keys[int(i)] for i in idx], dtype=f"S{w}")
        pos = np.searchsorted(self._np, q)
        inside = pos < self.n
        hit = np.zeros(len(q), dtype=bool)
        hit[inside] = self._np[pos[inside]] == q[inside]
        out[idx[hit]] = pos[hit]
        return out


class Source:
    """A sorted physical table (k, d, c<id>...) with its key index: one file or memstore."""

    __slots__ = ("deleted", "has_tombstones", "index", "table")

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        k = table.column(KEY_COL)
        self.index = KeyIndex(k.combine_chunks() if k.num_chunks != 1 else k.chunk(0))
        d = table.column(DEL_COL)
        self.has_tombstones = bool(pc.any(d).as_py()) if len(d) else False
        self.deleted: np.ndarray | None = (
            np.asarray(d.to_numpy(zero_copy_only=False), dtype=bool)
            if self.has_tombstones
            else None
        )

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


# --- schema conformance and data files -------------------------------------------------------


def _constant(col: ColumnSchema, n: int) -> pa.Array:
    """`n` copies of `col`'s default (or nulls): what rows that predate the column hold."""
    t = col.arrow_type()
    nulls = pa.nulls(n, type=t)
    if col.default is None:
        return nulls
    return pc.fill_null(nulls, pa.scalar(col.default, type=t))


def conform(table: pa.Table, cols: Sequence[ColumnSchema]) -> pa.Table:
    """`table` (physical) reduced to k, d and the columns `cols` (by id), missing ids filled."""
    names = table.schema.names
    arrays = [table.column(KEY_COL), table.column(DEL_COL)]
    out_names = [KEY_COL, DEL_COL]
    n = table.num_rows
    for c in cols:
        name = phys_name(c.id)
        if name in names:
            arrays.append(table.column(name))
        else:
            arrays.append(pa.chunked_array([_constant(c, n)]))
        out_names.append(name)
    return pa.Table.from_arrays(arrays, names=out_names)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_arrow_file(path: Path, tables: Iterator[pa.Table], schema: pa.Schema) -> int:
    """Write `tables` as one Arrow IPC file at `path` and fsync it; the rows written."""
    rows = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for t in tables:
            if t.num_rows:
                writer.write_table(t.cast(schema), max_chunksize=BATCH_ROWS)
                rows += t.num_rows
    _fsync_path(path)
    return rows


def open_arrow_file(path: Path, schema: Schema | None) -> Source:
    """Open a data file (memory-mapped) and check its layout against `schema`; Corruption."""
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (OSError, pa.ArrowException) as e:
        raise Corruption(f"row store data file {path}: unreadable: {e}") from None
    fields = {f.name: f.type for f in table.schema}
    if fields.get(KEY_COL) != pa.binary() or fields.get(DEL_COL) != pa.bool_():
        raise Corruption(f"row store data file {path}: missing key or tombstone column")
    for c in schema.columns if schema is not None else ():
        t = fields.get(phys_name(c.id))
        if t is not None and t != c.arrow_type():
            raise Corruption(
                f"row store data file {path}: column {c.name!r} (id {c.id}) is {t}, "
                f"expected {c.arrow_type()}"
            )
    return Source(table)


def file_schema(cols: Sequence[ColumnSchema]) -> pa.Schema:
    return pa.schema(
        [pa.field(KEY_COL, pa.binary(), False), pa.field(DEL_COL, pa.bool_(), False)]
        + [pa.field(phys_name(c.id), c.arrow_type()) for c in cols]
    )
