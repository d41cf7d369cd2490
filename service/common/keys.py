"""Order-preserving binary encoding of keys (Kudu's composite key encoding).

Theory of operation
-------------------
Tablets partition a table by ranges of its key, the master maps partition keys to tablets in a
sorted map, and scans prune by key ranges. All of that compares keys as plain byte strings, so
the encoding must preserve order: for key tuples `a` and `b` of the same columns,

    a < b  <=>  encode_key(cols, a) < encode_key(cols, b)        (bytes compare, memcmp)

where tuples compare component-wise by each type's natural order (ints numerically, strings by
code point, which is UTF-8 byte order, binaries bytewise, decimals numerically).

Each component is encoded so that it is order-preserving on its own, and every component but
the last is also prefix-free (no encoding is a proper prefix of another), which makes the
concatenation order-preserving on tuples:

* INT8/16/32/64, DATE (an int32 of days), TIMESTAMP (an int64 of microseconds): big-endian
  two's complement with the sign bit flipped, so negative numbers sort before positive ones.
  Fixed width, hence prefix-free.
* DECIMAL: the unscaled integer (`value * 10**scale`) as a 128-bit integer, sign bit flipped.
  Two decimals of one column share the scale, so unscaled order is numeric order.
* STRING (as UTF-8) and BINARY: the last component is written raw. Any other component has each
  0x00 byte escaped as 0x00 0x01 and is terminated by 0x00 0x00: the terminator sorts before
  any escaped or ordinary continuation, so "a" < "a\\x00" < "ab" still holds, and the
  terminator makes the encoding prefix-free.

A key *prefix* (fewer values than columns: a split row or range bound on the leading columns, as
Kudu allows) encodes its last given component as non-final. The result sorts at or before every
key that extends it and after every key of a smaller prefix, so as a bound it means "the prefix,
followed by the minimum of the remaining columns".

BOOL, FLOAT and DOUBLE cannot be key columns (see `schema.KEY_TYPES`) and are refused here.

`encode_keys_arrow` encodes whole Arrow columns at once (numpy for fixed-width types) and gives
byte-for-byte the results of `encode_key` row by row; the tests check that.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa

from service.common.errors import InvalidArgument
from service.common.schema import (
    ColumnSchema,
    ColumnType,
    Schema,
    coerce_value,
    decimal_to_unscaled,
    unscaled_to_decimal,
)

__all__ = [
    "KeyColumns",
    "arrow_key_column",
    "decode_key",
    "encode_key",
    "encode_keys_arrow",
]

KeyColumns: TypeAlias = Schema | Sequence[ColumnSchema]
"""The columns a key is made of: a schema (its primary key columns) or explicit columns (the
range or hash columns of a partition schema), in key order."""

_WIDTHS = {
    ColumnType.INT8: 1,
    ColumnType.INT16: 2,
    ColumnType.INT32: 4,
    ColumnType.INT64: 8,
    ColumnType.DATE: 4,
    ColumnType.TIMESTAMP: 8,
    ColumnType.DECIMAL: 16,
}
_VARLEN = (ColumnType.STRING, ColumnType.BINARY)


def _columns(columns: KeyColumns) -> tuple[ColumnSchema, ...]:
    cols = columns.key_columns if isinstance(columns, Schema) else tuple(columns)
    for c in cols:
        if not c.type.is_key_type:
            raise InvalidArgument(
                f"column {c.name!r}: type {c.type.name} cannot be part of a key "
                "(BOOL, FLOAT and DOUBLE cannot)"
            )
    return cols


def _encode_component(col: ColumnSchema, value: object, final: bool, out: bytearray) -> None:
    if value is None:
        raise InvalidArgument(f"key column {col.name!r} is null")
    v = coerce_value(col, value)
    t = col.type
    width = _WIDTHS.get(t)
    if width is not None:
        if t is ColumnType.DECIMAL:
            assert col.scale is not None  # coerce_value checked it
            n = decimal_to_unscaled(v, col.scale)  # type: ignore[arg-type]
        else:
            n = v  # type: ignore[assignment]
        out += (n + (1 << (8 * width - 1))).to_bytes(width, "big")
        return
    raw = v.encode("utf-8") if isinstance(v, str) else v
    assert isinstance(raw, bytes)
    if final:
        out += raw
    else:
        out += raw.replace(b"\x00", b"\x00\x01")
        out += b"\x00\x00"


def encode_key(
    columns: KeyColumns, values: Sequence[object], *, allow_prefix: bool = False
) -> bytes:
    """The order-preserving encoding of `values` (one per column, in key order).

    Values are coerced as `schema.coerce_value` does (an aware datetime for a TIMESTAMP, ...).
    With `allow_prefix`, fewer values than columns encode a key prefix (module docstring).
    InvalidArgument names the column for a null, a wrong type, or a wrong number of values.
    """
    cols = _columns(columns)
    n = len(values)
    if n > len(cols) or (n < len(cols) and not allow_prefix):
        names = ", ".join(c.name for c in cols)
        raise InvalidArgument(f"key ({names}) needs {len(cols)} values, got {n}")
    out = bytearray()
    last = len(cols) - 1
    for i in range(n):
        _encode_component(cols[i], values[i], i == last, out)
    return bytes(out)


def decode_key(
    columns: KeyColumns, data: bytes, *, allow_prefix: bool = False
) -> tuple[object, ...]:
    """The canonical values `encode_key` encoded into `data`.

    With `allow_prefix`, decoding stops where `data` ends between components, giving the
    shortest tuple that encodes to `data`. InvalidArgument for truncated, trailing or malformed
    bytes, naming the column.
    """
    cols = _columns(columns)
    data = bytes(data)
    values: list[object] = []
    pos = 0
    last = len(cols) - 1
    for i, col in enumerate(cols):
        if pos == len(data) and allow_prefix:
            break
        t = col.type
        width = _WIDTHS.get(t)
        if width is not None:
            if pos + width > len(data):
                raise InvalidArgument(f"encoded key is truncated in column {col.name!r}")
            n = int.from_bytes(data[pos : pos + width], "big") - (1 << (8 * width - 1))
            pos += width
            if t is ColumnType.DECIMAL:
                assert col.precision is not None and col.scale is not None
                if abs(n) >= 10**col.precision:
                    raise InvalidArgument(
                        f"encoded key: column {col.name!r} has more than {col.precision} digits"
                    )
                values.append(unscaled_to_decimal(n, col.scale))
            else:
                values.append(n)
            continue
        if i == last:
            raw, pos = data[pos:], len(data)
        else:
            raw, pos = _unescape(col, data, pos)
        if t is ColumnType.STRING:
            try:
                values.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidArgument(
                    f"encoded key: column {col.name!r} is not valid UTF-8"
                ) from None
        else:
            values.append(raw)
    if pos != len(data):
        raise InvalidArgument(f"encoded key has {len(data) - pos} trailing bytes")
    return tuple(values)


def _unescape(col: ColumnSchema, data: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    while True:
        j = data.find(b"\x00", pos)
        if j < 0 or j + 1 >= len(data):
            raise InvalidArgument(f"encoded key is truncated in column {col.name!r}")
        out += data[pos:j]
        marker = data[j + 1]
        pos = j + 2
        if marker == 0:
            return bytes(out), pos
        if marker != 1:
            raise InvalidArgument(
                f"encoded key: column {col.name!r} has a bad escape 0x00 0x{marker:02x}"
            )
        out += b"\x00"


# --- vectorized ------------------------------------------------------------------------------

ArrowData: TypeAlias = pa.Table | pa.RecordBatch


def arrow_key_column(col: ColumnSchema, data: ArrowData) -> pa.Array:
    """Column `col` of `data` as one Arrow array of `col`'s exact type, with no nulls.

    A different but safely castable type (int32 data for an INT64 column, another time zone)
    is cast; anything else is InvalidArgument naming the column.
    """
    names = data.schema.names
    if col.name not in names:
        raise InvalidArgument(f"Arrow data has no key column {col.name!r}")
    arr = data.column(names.index(col.name))
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    target = col.arrow_type()
    if arr.type != target:
        try:
            arr = arr.cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidArgument(
                f"key column {col.name!r}: Arrow type {arr.type} does not convert to {target}: {e}"
            ) from None
    if arr.null_count:
        raise InvalidArgument(f"key column {col.name!r} is null in {arr.null_count} rows")
    return arr


def _fixed_matrix(col: ColumnSchema, arr: pa.Array) -> np.ndarray | None:
    """Rows of `arr` encoded as an (n, width) uint8 matrix, or None to use the row path."""
    t = col.type
    width = _WIDTHS[t]
    n = len(arr)
    if t is ColumnType.DECIMAL:
        if sys.byteorder != "little":
            return None  # Arrow stores decimals in native order; keep the exact row path
        buf = arr.buffers()[1]
        raw = np.frombuffer(buf, dtype=np.uint8, count=n * 16, offset=arr.offset * 16)
        m = raw.reshape(n, 16)[:, ::-1].copy()  # little-endian two's complement -> big-endian
        m[:, 0] ^= 0x80
        return m
    if t is ColumnType.DATE:
        arr = arr.cast(pa.int32())
    elif t is ColumnType.TIMESTAMP:
        arr = arr.cast(pa.int64())
    values = np.asarray(arr.to_numpy(zero_copy_only=False))
    flipped = values.view(f"u{width}") ^ np.array(1 << (8 * width - 1), dtype=f"u{width}")
    return flipped.astype(f">u{width}").view(np.uint8).reshape(n, width)


def _encode_fixed(col: ColumnSchema, value: object) -> bytes:
    out = bytearray()
    _encode_component(col, value, False, out)
    return bytes(out)


def _rows_of(m: np.ndarray) -> list[bytes]:
    n, width = m.shape
    b = np.ascontiguousarray(m).tobytes()
    return [b[i : i + width] for i in range(0, n * width, width)]


def encode_keys_arrow(
    columns: Sequence[ColumnSchema], data: ArrowData, *, prefix: bytes = b""
) -> list[bytes]:
    """`prefix + encode_key(columns, row)` for every row of `data`, computed by column.

    Columns are found by name in `data` (see `arrow_key_column`). Fixed-width types are
    encoded with numpy; strings and binaries go through Python bytes, row by row.
    """
    cols = _columns(columns)
    n = data.num_rows
    if n == 0:
        return []
    last = len(cols) - 1
    parts: list[np.ndarray | list[bytes]] = []
    if prefix:
        parts.append(np.broadcast_to(np.frombuffer(prefix, dtype=np.uint8), (n, len(prefix))))
    for i, col in enumerate(cols):
        arr = arrow_key_column(col, data)
        m = None if col.type in _VARLEN else _fixed_matrix(col, arr)
        if m is not None:
            parts.append(m)
        elif col.type in _VARLEN:
            raw = arr.cast(pa.binary()).to_pylist()
            if i != last:
                raw = [r.replace(b"\x00", b"\x00\x01") + b"\x00\x00" for r in raw]
            parts.append(raw)
        else:
            parts.append([_encode_fixed(col, v) for v in arr.to_pylist()])
    if all(isinstance(p, np.ndarray) for p in parts):
        if not parts:
            return [b""] * n
        return _rows_of(np.hstack(parts))
    # Mixed: merge runs of adjacent fixed-width columns first, then join per row.
    lists: list[list[bytes]] = []
    run: list[np.ndarray] = []
    for p in parts:
        if isinstance(p, np.ndarray):
            run.append(p)
            continue
        if run:
            lists.append(_rows_of(np.hstack(run)))
            run = []
        lists.append(p)
    if run:
        lists.append(_rows_of(np.hstack(run)))
    if len(lists) == 1:
        return lists[0]
    return [b"".join(row) for row in zip(*lists, strict=True)]
