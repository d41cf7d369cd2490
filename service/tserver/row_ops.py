"""Client writes: validation before replication, and the form a write takes in the Raft log.

Theory of operation
-------------------
A WriteRequestPB carries rows as one Arrow IPC stream, columns by name, plus an operation per
row. The leader validates the request completely *before* it is replicated (`decode_write`):
every check that depends only on the request and the schema happens here, so a bad request is
refused with InvalidArgument and changes nothing, on any replica. What is left for apply time
are the checks that depend on the tablet's state (does the key exist?), which become per-row
errors in `RowStore.apply_write`.

The validated batch (`WriteBatch`) is cast to the exact Arrow types of the schema, so apply code
never sees an int32 for an INT64 column or a timestamp in another zone.

The replicated form (`WriteBatch.encode`) is one Arrow IPC stream whose fields carry the column
*id* in their metadata, with the ops and the schema version in the schema metadata. Replicas
decode it with the schema they run when they apply the entry, which may be newer than the one
the leader validated against (an AlterTable entry can sit between the two in the log). Going by
id makes that safe: a renamed column decodes under its new name, a dropped column's data is
dropped (the drop came first in log order), and an added column is simply absent (it gets its
default like any absent column). Decoding is a pure function of the bytes and the schema, so
every replica builds the same batch.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.common.errors import Corruption, InvalidArgument
from service.common.schema import ColumnSchema, ColumnType, Schema

__all__ = [
    "MAX_WRITE_BYTES",
    "MAX_WRITE_ROWS",
    "RowOp",
    "WriteBatch",
    "check_write_size",
    "decode_write",
]

MAX_WRITE_ROWS = 50_000
MAX_WRITE_BYTES = 8 << 20
"""The most rows, and bytes of Arrow IPC, one Write may carry (InvalidArgument beyond). Every
step of a write runs at a cost that grows with its size: on the leader, copying the entry into
an append message per follower and serializing it; on each replica, parsing that message,
then applying the entry on the event loop in one step (a scan never sees part of an entry), at
a few microseconds per row (tens for a partial UPDATE). These bounds keep each such step a
small fraction of the Raft heartbeat interval (service/common/loop_lag.py): a 64 MiB write (the
gRPC message limit) of 3 million narrow rows held each replica's loop for seconds, and its
leader lost leadership. 8 MiB is also Kudu's client default for one batch. The client cuts
writes to fit (write_session.MAX_BATCH_ROWS, MAX_BATCH_BYTES)."""

_OPS_KEY = b"tessera.ops"
_VERSION_KEY = b"tessera.schema_version"
_ID_KEY = b"tessera.column_id"


class RowOp(enum.IntEnum):
    """The operation of one row; the numbers are those of RowOperationTypePB."""

    INSERT = 1
    UPSERT = 2
    UPDATE = 3
    DELETE = 4
    INSERT_IGNORE = 5


_VALID_OPS = frozenset(int(op) for op in RowOp)
# Ops that may create a row: absent NOT NULL columns need a default for these.
_CREATING_OPS = (int(RowOp.INSERT), int(RowOp.UPSERT), int(RowOp.INSERT_IGNORE))


@dataclass(frozen=True)
class WriteBatch:
    """A validated write: rows and one op per row.

    `table` has one chunk per column, columns named by the current schema's names, in schema
    order, with the exact Arrow types of the schema; it always includes every key column (non
    null). `ops` is a uint8 array of `RowOp` values, one per row.
    """

    table: pa.Table
    ops: np.ndarray
    schema_version: int
    column_ids: tuple[int, ...] = ()
    """The id of each column of `table` under the schema it was validated against (filled by
    `decode_write` and `decode`); empty means "look columns up by name when decoding"."""

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)

    def encode(self) -> bytes:
        """The Raft-entry payload: one Arrow IPC stream, each field tagged with its column id."""
        tagged = len(self.column_ids) == self.table.num_columns
        fields = []
        for i, field in enumerate(self.table.schema):
            md = {_ID_KEY: str(self.column_ids[i]).encode()} if tagged else None
            fields.append(pa.field(field.name, field.type, True, md))
        md_schema = pa.schema(
            fields,
            metadata={
                _OPS_KEY: np.ascontiguousarray(self.ops, dtype=np.uint8).tobytes(),
                _VERSION_KEY: str(self.schema_version).encode(),
            },
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, md_schema) as writer:
            writer.write_table(self.table.cast(md_schema))
        return bytes(sink.getvalue().to_pybytes())

    @staticmethod
    def decode(data: bytes, schema: Schema) -> WriteBatch:
        """Rebuild a batch from `encode`'s bytes under `schema` (see the module docstring).

        The payload was validated before it was replicated, so a failure here means the log
        entry is damaged: Corruption.
        """
        try:
            table = pa.ipc.open_stream(data).read_all()
            # Full validation here too: an entry that reached a log without it (an older
            # version, a bug) must fail as Corruption, never reach code that trusts offsets.
            table.validate(full=True)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise Corruption(f"write entry: not a valid Arrow IPC stream: {e}") from None
        md = table.schema.metadata or {}
        ops = np.frombuffer(md.get(_OPS_KEY, b""), dtype=np.uint8).copy()
        try:
            version = int(md.get(_VERSION_KEY, b"0"))
        except ValueError:
            raise Corruption("write entry: bad schema version metadata") from None
        if len(ops) != table.num_rows:
            raise Corruption(
                f"write entry: {len(ops)} ops for {table.num_rows} rows",
            )
        by_col: dict[str, pa.ChunkedArray] = {}
        for i, field in enumerate(table.schema):
            fmd = field.metadata or {}
            col: ColumnSchema | None
            if _ID_KEY in fmd:
                try:
                    cid = int(fmd[_ID_KEY])
                except ValueError:
                    raise Corruption(f"write entry: bad column id of {field.name!r}") from None
                col = next((c for c in schema.columns if c.id == cid), None)
            else:
                col = schema.column(field.name) if schema.has_column(field.name) else None
            if col is None:
                continue  # dropped after the write was validated: its data goes with it
            by_col[col.name] = table.column(i)
        arrays, names, ids = [], [], []
        for c in schema.columns:
            if c.name in by_col:
                arr = by_col[c.name]
                if arr.type != c.arrow_type():
                    raise Corruption(
                        f"write entry: column {c.name!r} is {arr.type}, not {c.arrow_type()}"
                    )
                arrays.append(arr)
                names.append(c.name)
                ids.append(c.id)
        for k in schema.key:
            if k not in by_col:
                raise Corruption(f"write entry: key column {k!r} is missing")
        out = pa.Table.from_arrays(arrays, names=names).combine_chunks()
        return WriteBatch(out, ops, version, tuple(ids))


def _read_stream(rows_ipc: bytes) -> pa.Table:
    """The client's rows, fully validated before anything else touches them.

    `read_all` checks only the stream's framing and buffer sizes. Offsets that point outside
    their data buffer, invalid UTF-8, null counts that disagree with the validity bitmap and
    out-of-range dictionary indices pass it, and the first cast or `to_pylist` of such an array
    reads wild memory: one crafted stream appended to the log crashed every replica, on every
    replay. `validate(full=True)` checks all of them, in time linear in the data.
    """
    try:
        table = pa.ipc.open_stream(rows_ipc).read_all()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InvalidArgument(f"rows: not a valid Arrow IPC stream: {e}") from None
    try:
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as e:
        raise InvalidArgument(f"rows: invalid Arrow data: {e}") from None
    return table


def _convertible(src: pa.DataType, col: ColumnSchema) -> bool:
    """Whether Arrow data of type `src` may be cast to `col` (the cast itself checks values).

    Only casts within a family are allowed: pyarrow would happily parse strings into ints,
    which a client never means.
    """
    t = col.type
    if pa.types.is_null(src):
        return True
    if t is ColumnType.BOOL:
        return pa.types.is_boolean(src)
    if t in (ColumnType.INT8, ColumnType.INT16, ColumnType.INT32, ColumnType.INT64):
        return pa.types.is_integer(src)
    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):
        return pa.types.is_integer(src) or pa.types.is_floating(src)
    if t is ColumnType.STRING:
        return pa.types.is_string(src) or pa.types.is_large_string(src) or _is_view(src, "string")
    if t is ColumnType.BINARY:
        return (
            pa.types.is_binary(src)
            or pa.types.is_large_binary(src)
            or pa.types.is_fixed_size_binary(src)
            or _is_view(src, "binary")
            or pa.types.is_string(src)
            or pa.types.is_large_string(src)
        )
    if t is ColumnType.TIMESTAMP:
        # A zone-less timestamp is ambiguous (as a naive datetime is for coerce_value).
        return pa.types.is_timestamp(src) and src.tz is not None
    if t is ColumnType.DATE:
        return pa.types.is_date(src)
    if t is ColumnType.DECIMAL:
        return pa.types.is_decimal(src) or pa.types.is_integer(src)
    return False


def _is_view(t: pa.DataType, kind: str) -> bool:
    check = getattr(pa.types, f"is_{kind}_view", None)
    return bool(check(t)) if check is not None else False


def _cast(col: ColumnSchema, arr: pa.ChunkedArray) -> pa.Array:
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    combined = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    target = col.arrow_type()
    if combined.type == target:
        return combined
    if not _convertible(combined.type, col):
        raise InvalidArgument(
            f"column {col.name!r}: Arrow type {combined.type} does not convert to "
            f"{col.type_name} ({target})"
        )
    try:
        return combined.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidArgument(
            f"column {col.name!r}: Arrow type {combined.type} does not convert to "
            f"{col.type_name} ({target}): {e}"
        ) from None


def _resolve_ops(default_op: int, ops: Sequence[int], n: int) -> np.ndarray:
    if len(ops) == 0:
        if n and int(default_op) not in _VALID_OPS:
            raise InvalidArgument(f"default_op: unknown row operation {int(default_op)}")
        return np.full(n, default_op if n else 0, dtype=np.uint8)
    if len(ops) != n:
        raise InvalidArgument(f"ops: {len(ops)} operations for {n} rows (give one per row)")
    out = np.asarray([int(o) for o in ops], dtype=np.int64)
    bad = ~np.isin(out, np.fromiter(_VALID_OPS, dtype=np.int64))
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidArgument(f"ops[{i}]: unknown row operation {int(out[i])}")
    return out.astype(np.uint8)


def check_write_size(payload_bytes: int, rows: int | None = None) -> None:
    """InvalidArgument if a Write carries more than `MAX_WRITE_BYTES` of rows, or more than
    `MAX_WRITE_ROWS` rows (`rows`, once the stream is read)."""
    if payload_bytes > MAX_WRITE_BYTES:
        raise InvalidArgument(
            f"rows: {payload_bytes} bytes, more than the {MAX_WRITE_BYTES} one Write may "
            "carry; split them into several Writes"
        )
    if rows is not None and rows > MAX_WRITE_ROWS:
        raise InvalidArgument(
            f"rows: {rows} rows, more than the {MAX_WRITE_ROWS} one Write may carry; split "
            "them into several Writes"
        )


def decode_write(
    schema: Schema, rows_ipc: bytes, default_op: int, ops: Sequence[int]
) -> WriteBatch:
    """Parse and validate a client write (WriteRequestPB.rows/default_op/ops) under `schema`.

    Raises InvalidArgument naming the problem: a malformed stream, a duplicate or unknown
    column, a type that does not convert, a missing or null key, a null in a NOT NULL column,
    an absent NOT NULL column without default for a row that may create one, bad ops.
    (Size limits are the Write RPC's: `check_write_size`.)
    """
    table = _read_stream(rows_ipc)
    names = table.schema.names
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(f"rows: column {name!r} appears more than once")
        seen.add(name)
        if not schema.has_column(name):
            raise InvalidArgument(
                f"rows: unknown column {name!r} (schema version {schema.version})"
            )
    n = table.num_rows
    op_arr = _resolve_ops(default_op, ops, n)
    for k in schema.key:
        if k not in seen:
            raise InvalidArgument(f"rows: key column {k!r} is missing")
    not_delete = op_arr != int(RowOp.DELETE)
    arrays: list[pa.Array] = []
    out_names: list[str] = []
    for col in schema.columns:
        if col.name not in seen:
            continue
        arr = _cast(col, table.column(col.name))
        if arr.null_count:
            if schema.is_key_column(col.name):
                raise InvalidArgument(
                    f"rows: key column {col.name!r} is null in {arr.null_count} rows"
                )
            if not col.nullable:
                nulls = np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False), dtype=bool)
                # DELETE needs only the key: whatever else a DELETE row carries is ignored.
                bad = nulls & not_delete
                if bad.any():
                    row = int(np.argmax(bad))
                    key = ", ".join(f"{k}={table.column(k)[row].as_py()!r}" for k in schema.key)
                    raise InvalidArgument(
                        f"rows: NOT NULL column {col.name!r} is null in row {row} (key {key})"
                    )
        arrays.append(arr)
        out_names.append(col.name)
    if n and np.isin(op_arr, _CREATING_OPS).any():
        for col in schema.columns:
            if col.name not in seen and not col.nullable and col.default is None:
                raise InvalidArgument(
                    f"rows: NOT NULL column {col.name!r} has no default and is missing "
                    "(needed by INSERT, UPSERT and INSERT_IGNORE rows)"
                )
    out = pa.Table.from_arrays(arrays, names=out_names)
    ids = tuple(schema.column(name).id for name in out_names)
    return WriteBatch(out, op_arr, schema.version, ids)
