"""The in-memory half of a row store: memstores, and how a replicated write changes one.

Theory of operation
-------------------
A `MemStore` holds the newest version of every row written since the last flush: a dict from
encoded primary key (`keys.encode_key`) to the row as a tuple of values laid out as the
memstore's `col_ids`, or None for a tombstone, with the commit timestamp of that version in
`times`; a version superseded while in this memstore moves to `history`, where the snapshots
that may still need it read it (docs/design/tablets.md#R3). Raft-applied writes go to the
active memstore only (`apply_batch`); `RowStore.freeze` turns it into a `Frozen` one,
immutable from then on, so a worker thread can write it to a data file while the next memstore
takes writes.

Why this is its own module: everything here is about one batch of row operations meeting the
newest versions of its keys. A row's outcome (INSERT of a live key refused, UPDATE of a missing
one refused, a partial UPDATE/UPSERT merged over the live version) depends only on that
version, wherever it lives: the active memstore, a frozen one, or a data file (`OlderVersions`,
which finds keys with one vectorized `searchsorted` per file and materializes a file's row only
when a partial update needs it). The durable side (manifest, files, flush, compaction, scans,
snapshots) is `rowstore`; the sorted merge behind reads is `rowstore_merge`.

Every replica applies every write, so the common ones skip the per-row loop: a batch of whole
rows whose keys the memstore does not hold, all INSERTs of new keys or all UPSERTs, is one dict
update (`_apply_new_keys`), and a flush builds its Arrow columns from whole lists
(`_to_source`). Both give exactly what the loop gives; a model test holds them to it.

The memstore is read by scans as a sorted Arrow source (the same physical layout as a data
file), built once per version and cached until the next mutation. A scan or checksum takes a
`MemSnapshot` between two applies (a copy of the dict) and builds the source from it in a worker
thread, so the event loop that runs applies does not build it.

Thread safety: the active memstore is mutated only by the apply thread. A frozen memstore is
never mutated, so its `source()` may be built in a worker thread, as may a `MemSnapshot`'s
(taken on the apply thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.common.errors import AlreadyExists, InvalidArgument, NotFound, TesseraError
from service.common.keys import decode_key, encode_keys_arrow
from service.common.schema import ColumnSchema, ColumnType, Schema
from service.tserver.row_ops import RowOp, WriteBatch
from service.tserver.rowstore_files import (
    DEL_COL,
    KEY_COL,
    TS_COL,
    KeyIndex,
    KeyQuery,
    Source,
    conform,
    phys_name,
)

__all__ = [
    "Frozen",
    "MemSnapshot",
    "MemStore",
    "OlderVersions",
    "apply_batch",
    "merge_staged",
    "py_values",
]

_MISSING = object()
ROW_OVERHEAD = 96
"""Dict entry, tuple header, key bytes object: a rough per-row estimate of memory use."""

Row = tuple[object, ...]
Versions = tuple[tuple[int, "Row | None"], ...]
"""Superseded versions of one key: (commit timestamp, row or None for a tombstone), oldest
first."""


class MemStore:
    """Newest row versions by encoded key; rows are tuples laid out as `col_ids`.

    Invariants: `rows[k]` is None for a tombstone; `version` increases on every mutation (it
    keys the cached Arrow form); once frozen, nothing mutates it.
    """

    __slots__ = (
        "_cache",
        "col_ids",
        "history",
        "last_index",
        "last_ts",
        "max_time",
        "nbytes",
        "rows",
        "times",
        "types",
        "version",
    )

    def __init__(self, schema: Schema, last_index: int) -> None:
        self.col_ids: tuple[int, ...] = tuple(c.id for c in schema.columns)
        self.types: tuple[pa.DataType, ...] = tuple(c.arrow_type() for c in schema.columns)
        self.rows: dict[bytes, Row | None] = {}
        self.times: dict[bytes, int] = {}
        """The commit timestamp of each key's version in `rows` (same keys)."""
        self.history: dict[bytes, Versions] = {}
        """Versions superseded in this memstore, by key, oldest first; never mutated in place
        (replaced), so a snapshot's shallow copy of the dict stays what it was."""
        self.max_time = 0
        """The newest commit timestamp of a version here."""
        self.last_ts = 0
        """The newest commit timestamp of the entries up to `last_index` (writes and
        timestamp entries: the store's safe time once this memstore is flushed)."""
        self.last_index = last_index
        self.nbytes = 0
        self.version = 0
        self._cache: tuple[int, Source] | None = None

    def source(self) -> Source:
        """This memstore as a sorted Arrow source (cached until the next mutation). Only from
        the apply thread, or on a frozen memstore; elsewhere use a `MemSnapshot`."""
        return MemSnapshot(self, frozen=True).source()

    def cached_source(self, version: int) -> Source | None:
        """The Arrow form of this memstore as of `version`, if it was built already."""
        cache = self._cache
        return cache[1] if cache is not None and cache[0] == version else None

    def file_schema(self) -> pa.Schema:
        """The physical schema of the data file this memstore flushes to (its own layout)."""
        return pa.schema(
            [
                pa.field(KEY_COL, pa.binary(), False),
                pa.field(DEL_COL, pa.bool_(), False),
                pa.field(TS_COL, pa.uint64(), False),
            ]
            + [pa.field(phys_name(cid), t) for cid, t in zip(self.col_ids, self.types, strict=True)]
        )

    def relaid_out(self, schema: Schema) -> MemStore:
        """A copy of this memstore laid out for `schema` (an alter: columns matched by id, a
        new column takes its default). Alters are rare and memstores bounded."""
        mem = MemStore(schema, self.last_index)
        pos = {cid: j for j, cid in enumerate(self.col_ids)}
        plan = [(pos.get(c.id), c.default) for c in schema.columns]

        def relay(r: Row | None) -> Row | None:
            return None if r is None else tuple(r[j] if j is not None else d for j, d in plan)

        for k, r in self.rows.items():
            mem.rows[k] = relay(r)
        mem.times = dict(self.times)
        mem.history = {k: tuple((t, relay(r)) for t, r in v) for k, v in self.history.items()}
        mem.max_time = self.max_time
        mem.last_ts = self.last_ts
        mem.nbytes = self.nbytes
        return mem


class MemSnapshot:
    """A memstore's rows as of one moment, turned into a sorted Arrow source later, anywhere.

    Taking one is cheap and happens on the apply thread, between two entries: the Arrow form
    of the memstore (sorting its keys, building a column from every row tuple) costs far more
    than copying its dict, and the copy is all a snapshot needs, since row tuples are never
    mutated (`apply_batch` replaces them). So a scan or checksum copies the dict where applies
    run and builds the source in a worker thread (`source`), while applies go on. A frozen
    memstore is never mutated and is not copied; one whose Arrow form is cached as of this
    version is not copied either.
    """

    __slots__ = ("_history", "_mem", "_rows", "_times", "_version")

    def __init__(self, mem: MemStore, *, frozen: bool = False) -> None:
        self._mem = mem
        self._version = mem.version
        self._rows: dict[bytes, Row | None] | None = None
        self._times: dict[bytes, int] | None = None
        self._history: dict[bytes, Versions] | None = None
        if mem.cached_source(self._version) is None:
            self._rows = mem.rows if frozen else dict(mem.rows)
            self._times = mem.times if frozen else dict(mem.times)
            self._history = mem.history if frozen or not mem.history else dict(mem.history)

    @property
    def max_time(self) -> int:
        return self._mem.max_time

    def source(self) -> Source:
        """The snapshot as a sorted Arrow source; safe in any thread. Cached on the memstore
        while its version has not moved on."""
        mem, version = self._mem, self._version
        cached = mem.cached_source(version)
        if cached is not None:
            return cached
        assert self._rows is not None and self._times is not None and self._history is not None
        src = _to_source(self._rows, self._times, self._history, mem.col_ids, mem.types)
        if mem.version == version:  # else a newer form may be cached: keep that one
            mem._cache = (version, src)
        return src


def _columns(
    keys: pa.Array,
    times: list[int],
    values: list[Row | None],
    col_ids: tuple[int, ...],
    types: Sequence[pa.DataType],
) -> pa.Table:
    """Rows as Arrow columns laid out as `col_ids` (a None row: a tombstone, nulls in every
    value column), in the order given. Each column is taken from the row tuples by one `map`
    of an `itemgetter`, which runs in C: a comprehension per column cost five times as much,
    and `zip(*rows)` ten."""
    deleted = np.zeros(len(values), dtype=bool)
    full = cast(list[Row], values)
    if None in values:
        nones = (None,) * len(types)
        deleted = np.fromiter((r is None for r in values), dtype=bool, count=len(values))
        full = [nones if r is None else r for r in values]
    arrays: list[pa.Array] = [keys, pa.array(deleted), pa.array(times, type=pa.uint64())]
    names = [KEY_COL, DEL_COL, TS_COL]
    for j, (cid, t) in enumerate(zip(col_ids, types, strict=True)):
        arrays.append(pa.array(list(map(itemgetter(j), full)), type=t))
        names.append(phys_name(cid))
    return pa.Table.from_arrays(arrays, names=names)


def _key_order(keys: pa.Array) -> np.ndarray:
    """The positions of `keys` (distinct encoded keys) in key order: by numpy on the keys'
    fixed-width form when they have one (`KeyIndex.ordered`: an int64 key's 8 bytes as an
    integer), else by Arrow; either is a fraction of what sorting the bytes objects costs."""
    ordered = KeyIndex(keys).ordered()
    if ordered is not None:
        return np.argsort(ordered)
    return np.asarray(pc.sort_indices(keys))


def _to_source(
    rows: dict[bytes, Row | None],
    times: dict[bytes, int],
    history: dict[bytes, Versions],
    col_ids: tuple[int, ...],
    types: Sequence[pa.DataType],
) -> Source:
    """A memstore's dicts as a sorted Arrow source laid out as `col_ids`, with its history
    (sorted by key, newest first) when it has any. Every replica builds one per flush, so
    this is most of a write's cost after its apply: the rows are laid out in the dict's own
    order and then sorted as Arrow columns (`_key_order`), never row by row in Python."""
    keys = list(rows)
    arrow_keys = pa.array(keys, type=pa.binary())
    base = _columns(
        arrow_keys, list(map(times.__getitem__, keys)), list(rows.values()), col_ids, types
    )
    base = base.take(_key_order(arrow_keys))
    if not history:
        return Source(base)
    hk: list[bytes] = []
    ht: list[int] = []
    hv: list[Row | None] = []
    for k in sorted(history):
        for t, r in reversed(history[k]):
            hk.append(k)
            ht.append(t)
            hv.append(r)
    hist = _columns(pa.array(hk, type=pa.binary()), ht, hv, col_ids, types)
    return Source(base, hist)


class Frozen:
    """A memstore being flushed: immutable rows, the file they go to, and the state it closes.

    `last_index` is the highest Raft index reflected in it (and in everything older);
    `live_rows` the tablet's live row count at that point, which becomes the manifest's.
    """

    def __init__(self, mem: MemStore, file_name: str, live_rows: int) -> None:
        self.mem = mem
        self.file_name = file_name
        self.last_index = mem.last_index
        self.last_ts = mem.last_ts
        """The newest commit timestamp among the entries up to `last_index`."""
        self.live_rows = live_rows
        self.written: Source | None = None
        """Set by `write_frozen`: the file, opened."""


def py_values(arr: pa.Array | pa.ChunkedArray, col: ColumnSchema) -> list[object]:
    """Values of `arr` as Python objects in the memstore's convention (`pa.array` of them with
    the column's type round-trips): ints for TIMESTAMP and DATE, the natural type otherwise."""
    t = col.type
    if t is ColumnType.TIMESTAMP:
        arr = arr.cast(pa.int64())
    elif t is ColumnType.DATE:
        arr = arr.cast(pa.int32())
    if arr.null_count == 0 and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return list(arr.to_numpy(zero_copy_only=False).tolist())
    return list(arr.to_pylist())


# --- versions older than the active memstore -------------------------------------------------


class HoldsMem(Protocol):
    """A memstore older than the one being written (a `Frozen`, or the active memstore under
    a transaction's scratch memstore)."""

    @property
    def mem(self) -> MemStore: ...


class OlderVersions:
    """Live versions of keys in the frozen memstores and data files under the active memstore,
    laid out for `schema` (the current one). Sources are given oldest first."""

    def __init__(
        self,
        schema: Schema,
        current: MemStore,
        frozen: Sequence[HoldsMem],
        files: Sequence[Source],
    ) -> None:
        self.schema = schema
        self.current = current
        self.frozen = frozen
        self.files = files

    def lookup(self, keys: list[bytes]) -> dict[bytes, Row | tuple[Source, int]]:
        """The live versions of `keys` in frozen memstores and files (newest wins).

        Values are a row tuple (laid out for the current schema) from a frozen memstore, or
        (source, position) in a file, materialized only if an UPDATE/UPSERT needs it.
        Keys absent or deleted in the older sources are not in the result.
        """
        found: dict[bytes, Row | tuple[Source, int]] = {}
        if not keys:
            return found
        pending = keys
        schema = self.schema
        for fz in reversed(self.frozen):
            frows = fz.mem.rows
            rest = []
            plan: list[tuple[int | None, object]] | None = None
            for k in pending:
                r = frows.get(k, _MISSING)
                if r is _MISSING:
                    rest.append(k)
                elif r is not None:
                    assert isinstance(r, tuple)
                    if fz.mem.col_ids != self.current.col_ids:
                        if plan is None:
                            pos = {cid: j for j, cid in enumerate(fz.mem.col_ids)}
                            plan = [(pos.get(c.id), c.default) for c in schema.columns]
                        r = tuple(r[j] if j is not None else d for j, d in plan)
                    found[k] = r
            pending = rest
            if not pending:
                return found
        query = KeyQuery(pending)
        alive = np.ones(len(pending), dtype=bool)  # not yet found in a newer file
        for src in reversed(self.files):
            pos_arr = src.index.find(query)
            hits = np.flatnonzero((pos_arr >= 0) & alive)
            if len(hits) == 0:
                continue
            alive[hits] = False
            for h, p in zip(hits.tolist(), pos_arr[hits].tolist(), strict=True):
                if src.deleted is None or not src.deleted[p]:
                    found[pending[h]] = (src, p)
            if not alive.any():
                break
        return found

    def newest_times(self, keys: list[bytes]) -> dict[bytes, int]:
        """The commit timestamp of the newest version (a row or a deletion) of each of `keys`
        in the frozen memstores and files; keys with no version there are not in the result
        (a transaction's write-conflict check, rowstore.py `write_conflict`)."""
        out: dict[bytes, int] = {}
        pending = keys
        for fz in reversed(self.frozen):
            times = fz.mem.times
            rest = []
            for k in pending:
                t = times.get(k)
                if t is None:
                    rest.append(k)
                else:
                    out[k] = t
            pending = rest
            if not pending:
                return out
        query = KeyQuery(pending)
        alive = np.ones(len(pending), dtype=bool)  # not yet found in a newer file
        for src in reversed(self.files):
            pos_arr = src.index.find(query)
            hits = np.flatnonzero((pos_arr >= 0) & alive)
            if len(hits) == 0:
                continue
            alive[hits] = False
            stamps = src.table.column(TS_COL) if TS_COL in src.table.column_names else None
            for h, p in zip(hits.tolist(), pos_arr[hits].tolist(), strict=True):
                out[pending[h]] = int(stamps[p].as_py()) if stamps is not None else 0
            if not alive.any():
                break
        return out

    def materialize(self, ref: object) -> Row:
        """The row a `lookup` value stands for, laid out for the current schema."""
        assert isinstance(ref, tuple)
        if not (len(ref) == 2 and isinstance(ref[0], Source)):
            return ref
        src, pos = ref
        assert isinstance(pos, int)
        piece = conform(src.table.slice(pos, 1), self.schema.columns)
        return tuple(py_values(piece.column(phys_name(c.id)), c)[0] for c in self.schema.columns)

    def materialize_all(self, found: dict[bytes, Row | tuple[Source, int]]) -> None:
        """Replace every file reference among `found`'s values by its row (as `materialize`),
        with one `take` per file: one row at a time costs tens of microseconds each, and a
        partial UPDATE of a write's worth of rows that live in files then held the event loop
        for seconds."""
        by_src: dict[int, tuple[Source, list[bytes], list[int]]] = {}
        for k, ref in found.items():
            if len(ref) == 2 and isinstance(ref[0], Source):
                src, pos = ref[0], ref[1]
                assert isinstance(pos, int)
                entry = by_src.setdefault(id(src), (src, [], []))
                entry[1].append(k)
                entry[2].append(pos)
        cols = self.schema.columns
        for src, keys, positions in by_src.values():
            piece = conform(src.table.take(pa.array(positions, pa.int64())), cols)
            values = [py_values(piece.column(phys_name(c.id)), c) for c in cols]
            for k, row in zip(keys, zip(*values, strict=True), strict=True):
                found[k] = row


# --- applying a write ------------------------------------------------------------------------


def apply_batch(
    mem: MemStore, schema: Schema, batch: WriteBatch, older: OlderVersions, ts: int = 0
) -> tuple[int, list[tuple[int, TesseraError]], int]:
    """Apply `batch`'s rows in order to the active memstore `mem` (deterministic: same state
    and batch, same outcome), as versions committed at `ts`. Returns (rows applied, per-row
    errors, change of the live row count). A refused row (INSERT of a live key:
    AlreadyExists; UPDATE or DELETE of a missing one: NotFound) is reported and the others
    still apply. A version this write supersedes in `mem` moves to its history, unless it was
    committed at `ts` too (two rows of one write for one key: only the last ever shows)."""
    n = batch.num_rows
    table = batch.table
    keys = encode_keys_arrow(schema.key_columns, table)
    slot = {cid: j for j, cid in enumerate(mem.col_ids)}
    width = len(mem.col_ids)
    present: list[tuple[int, list[object]]] = []
    for name in table.column_names:
        col = schema.column(name)
        present.append((slot[col.id], py_values(table.column(name), col)))
    complete = len(present) == width
    if complete:
        present.sort(key=lambda p: p[0])
        full_rows: list[Row] = list(zip(*(v for _, v in present), strict=True))
    template = [c.default for c in schema.columns]

    rows = mem.rows
    times = mem.times
    history = mem.history
    distinct = dict.fromkeys(keys)
    ops = batch.ops
    first = int(ops[0]) if n else -1
    bulk = (
        complete
        and (first == RowOp.INSERT or first == RowOp.UPSERT)
        and len(distinct) == n
        and bool((ops == first).all())
        and rows.keys().isdisjoint(distinct)
    )
    found = older.lookup(keys if bulk else [k for k in distinct if k not in rows])
    if bulk and (first == RowOp.UPSERT or not found):
        return _apply_new_keys(mem, keys, full_rows, ts, n - len(found), table.nbytes)
    if not complete:
        older.materialize_all(found)  # a partial UPDATE/UPSERT merges over these
    errors: list[tuple[int, TesseraError]] = []
    applied = 0
    live_delta = 0
    nbytes = 0
    for i in range(n):
        k = keys[i]
        op = int(ops[i])
        cur = rows.get(k, _MISSING)
        if cur is _MISSING:
            old = found.get(k)
            live = old is not None
        else:
            old = None
            live = cur is not None
        if op == RowOp.INSERT or op == RowOp.INSERT_IGNORE:
            if live:
                if op == RowOp.INSERT:
                    errors.append((i, AlreadyExists(f"{key_text(schema, k)} already exists")))
                continue
            new = full_rows[i] if complete else _assemble(list(template), present, i)
            live_delta += 1
        elif op == RowOp.UPSERT or op == RowOp.UPDATE:
            if not live:
                if op == RowOp.UPDATE:
                    errors.append((i, NotFound(f"{key_text(schema, k)} not found")))
                    continue
                new = full_rows[i] if complete else _assemble(list(template), present, i)
                live_delta += 1
            elif complete:
                new = full_rows[i]
            else:
                base = cur if cur is not _MISSING else older.materialize(old)
                assert isinstance(base, tuple)
                new = _assemble(list(base), present, i)
        elif op == RowOp.DELETE:
            if not live:
                errors.append((i, NotFound(f"{key_text(schema, k)} not found")))
                continue
            new = None
            live_delta -= 1
            nbytes += len(k) + ROW_OVERHEAD
        else:
            errors.append((i, InvalidArgument(f"row {i}: unknown row operation {op}")))
            continue
        if cur is not _MISSING:
            was = times[k]
            if was != ts:
                history[k] = (*history.get(k, ()), (was, cur))  # type: ignore[arg-type]
                nbytes += len(k) + ROW_OVERHEAD
        rows[k] = new
        times[k] = ts
        applied += 1
    if applied:
        _applied(mem, ts, nbytes + applied * (table.nbytes // max(n, 1) + ROW_OVERHEAD))
    return applied, errors, live_delta


def _apply_new_keys(
    mem: MemStore, keys: list[bytes], full_rows: list[Row], ts: int, born: int, arrow_bytes: int
) -> tuple[int, list[tuple[int, TesseraError]], int]:
    """`apply_batch` of whole rows whose keys are distinct and none in `mem`, all INSERTs of
    keys live nowhere or all UPSERTs (`born` of them not live before): every row applies, as
    the loop over rows would apply it, and no version moves to history. One `update` per dict
    instead of that loop, which costs about 2 us a row on every replica: the common write
    (new rows, or a load that replaces rows already flushed) takes this path."""
    mem.rows.update(zip(keys, full_rows, strict=True))
    mem.times.update(dict.fromkeys(keys, ts))
    n = len(keys)
    _applied(mem, ts, n * (arrow_bytes // n + ROW_OVERHEAD))
    return n, [], born


def _applied(mem: MemStore, ts: int, nbytes: int) -> None:
    """What every apply that changed `mem` records: its newest stamp, version and size."""
    if ts > mem.max_time:
        mem.max_time = ts
    mem.version += 1
    mem.nbytes += nbytes


def merge_staged(
    mem: MemStore,
    items: Sequence[tuple[bytes, Row | None]],
    col_ids: tuple[int, ...],
    schema: Schema,
    ts: int,
) -> int:
    """Make a transaction's staged row images (`items`: key and full row, None for a deletion,
    laid out as `col_ids`, in the order they are to apply) versions of the active memstore
    `mem` committed at `ts` (docs/design/transactions.md#R3); the rows applied. Each image was
    decided when it was staged, against the same committed rows (its key has been locked
    since), so this only installs it: no row to look up or merge over, no per-row outcome."""
    if not items:
        return 0
    relay = None
    if col_ids != mem.col_ids:  # the schema changed since the rows were staged
        pos = {cid: j for j, cid in enumerate(col_ids)}
        defaults = {c.id: c.default for c in schema.columns}
        relay = [(pos.get(cid), defaults.get(cid)) for cid in mem.col_ids]
    rows = mem.rows
    times = mem.times
    history = mem.history
    nbytes = 0
    width = 8 * len(mem.col_ids)
    for k, new in items:
        if new is not None and relay is not None:
            new = tuple(new[j] if j is not None else d for j, d in relay)
        cur = rows.get(k, _MISSING)
        if cur is not _MISSING:
            was = times[k]
            if was != ts:
                history[k] = (*history.get(k, ()), (was, cur))  # type: ignore[arg-type]
                nbytes += len(k) + ROW_OVERHEAD
        rows[k] = new
        times[k] = ts
        nbytes += len(k) + ROW_OVERHEAD + width
    if ts > mem.max_time:
        mem.max_time = ts
    mem.version += 1
    mem.nbytes += nbytes
    return len(items)


def _assemble(base: list[object], present: list[tuple[int, list[object]]], i: int) -> Row:
    for j, values in present:
        base[j] = values[i]
    return tuple(base)


def key_text(schema: Schema, k: bytes) -> str:
    """`k` decoded for an error message: key (a=1, b='x')."""
    cols = schema.key_columns
    values = decode_key(cols, k)
    inner = ", ".join(f"{c.name}={v!r}" for c, v in zip(cols, values, strict=True))
    return f"key ({inner})"
