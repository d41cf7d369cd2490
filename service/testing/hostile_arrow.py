"""Arrow IPC streams that frame correctly but lie: poison writes, and misrouted rows.

`pa.ipc.open_stream(...).read_all()` checks a stream's framing and buffer sizes, not what the
buffers say. Each poison stream here (`POISONS`) reads back without an error, and the first
cast, slice or `to_pylist` of its bad column reads memory outside its buffers (or decodes
invalid UTF-8). The servers must refuse all of them before a write is replicated
(`validate(full=True)`); the tests and the fuzzing campaign send them.

Misrouted rows lie about where they go: valid rows of a table (`plain_rows`) sent to a tablet
whose partition does not hold their keys (`outside_partition` keeps those). Applied, such a
row would sit beside the same key in its own tablet, a table with duplicate primary keys
(docs/design/tablets.md#R2): every one must be refused, row by row.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable, Sequence

import pyarrow as pa

from service.common.partition import Partition, PartitionSchema
from service.common.schema import Schema

__all__ = [
    "POISONS",
    "TWO_STRING_OFFSETS",
    "WILD_OFFSETS",
    "ipc",
    "outside_partition",
    "patch_last",
    "patched_offsets_stream",
    "plain_rows",
]


def ipc(table: pa.Table) -> bytes:
    """`table` as one Arrow IPC stream, written without validating its arrays."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _patched(table: pa.Table, find: bytes, replace: bytes) -> bytes:
    """`table`'s stream with the last occurrence of `find` (in the record batch body, which
    follows the schema message) replaced by `replace` of the same length."""
    return patch_last(ipc(table), find, replace)


def patch_last(stream: bytes, find: bytes, replace: bytes) -> bytes:
    """`stream` with the last occurrence of `find` replaced by `replace` of the same length."""
    assert len(find) == len(replace)
    data = bytearray(stream)
    at = data.rfind(find)
    if at < 0:  # pragma: no cover - the IPC layout is Arrow's and stable
        raise AssertionError(f"{find!r} was not found in the stream")
    data[at : at + len(find)] = replace
    return bytes(data)


TWO_STRING_OFFSETS = struct.pack("<3i", 0, 2, 4)
"""The offsets of the strings "ab" and "cd" in an IPC stream."""
WILD_OFFSETS = struct.pack("<3i", 0, 0x7FFF0000, 4)
"""Those offsets with the second one far outside the data buffer."""


def _two_strings(key: str, value: str) -> pa.Table:
    return pa.table({key: pa.array([1, 2], pa.int64()), value: pa.array(["ab", "cd"])})


def patched_offsets_stream(key: str = "k", value: str = "v") -> bytes:
    """{key int64, value string}, two rows, the second string offset patched to 0x7fff0000:
    the stream that once crashed every replica of its tablet."""
    return _patched(_two_strings(key, value), TWO_STRING_OFFSETS, WILD_OFFSETS)


def _decreasing_offsets(key: str = "k", value: str = "v") -> bytes:
    return _patched(_two_strings(key, value), TWO_STRING_OFFSETS, struct.pack("<3i", 0, 3, 1))


def _offsets_past_the_data(key: str = "k", value: str = "v") -> bytes:
    return _patched(_two_strings(key, value), TWO_STRING_OFFSETS, struct.pack("<3i", 0, 2, 1 << 20))


def _invalid_utf8(key: str = "k", value: str = "v") -> bytes:
    return _patched(_two_strings(key, value), b"abcd", b"ab\xff\xfe")


def _dictionary_index_out_of_range(key: str = "k", value: str = "v") -> bytes:
    arr = pa.DictionaryArray.from_arrays(
        pa.array([0, 1], pa.int32()), pa.array(["dict-x", "dict-y"])
    )
    table = pa.table({key: pa.array([1, 2], pa.int64()), value: arr})
    return _patched(table, struct.pack("<2i", 0, 1), struct.pack("<2i", 0, 0x3FFFFFFF))


def _null_count_lies(key: str = "k", value: str = "v") -> bytes:
    """A validity bitmap saying every value is null under a header that says none is."""
    table = pa.table({key: pa.array([1, 2], pa.int64()), value: pa.array(["ab", None])})
    return _patched(table, bytes([0b01]) + bytes(7), bytes([0b00]) + bytes(7))


POISONS: dict[str, Callable[..., bytes]] = {
    "patched_offsets": patched_offsets_stream,
    "null_count_lies": _null_count_lies,
    "offsets_past_the_data": _offsets_past_the_data,
    "decreasing_offsets": _decreasing_offsets,
    "invalid_utf8": _invalid_utf8,
    "dictionary_index_out_of_range": _dictionary_index_out_of_range,
}
"""Each `f(key, value)` returns the IPC bytes of {key int64, value string}, a poison write."""


# --- misrouted rows ---------------------------------------------------------------------------


def _plain_value(t: pa.DataType, seed: int) -> object:
    """A valid value of Arrow type `t` made from `seed` (distinct seeds, distinct keys)."""
    if pa.types.is_integer(t):
        bits = t.bit_width
        if pa.types.is_unsigned_integer(t):
            return seed % (1 << bits)
        half = 1 << (bits - 1)
        return (seed + half) % (1 << bits) - half
    if pa.types.is_floating(t):
        return seed / 3
    if pa.types.is_boolean(t):
        return seed % 2 == 0
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return f"{chr(ord('a') + seed % 26)}-{seed}"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return seed.to_bytes(9, "big", signed=True)
    if pa.types.is_timestamp(t):
        return seed % 1_000_000_000 * 1_000_000  # microseconds, up to 2001
    if pa.types.is_date(t):
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=seed % 100_000)
    return None


def plain_rows(schema: pa.Schema, seeds: Sequence[int]) -> pa.Table:
    """Valid rows of `schema`, one per seed, every column set (the keys distinct when the
    seeds are): what a correct client would write."""
    arrays = [pa.array([_plain_value(f.type, s) for s in seeds], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def outside_partition(
    rows: pa.Table, schema: Schema, partition_schema: PartitionSchema, partition: Partition
) -> pa.Table:
    """The rows of `rows` whose partition key `partition` does not contain (row by row, with
    `Partition.contains`): rows a tablet of that partition must refuse."""
    keys = partition_schema.partition_keys_for_arrow(schema, rows)
    return rows.filter(pa.array([not partition.contains(k) for k in keys], pa.bool_()))
