"""Conversion between schema/partition dataclasses and their protobuf form (common.proto).

The only module that knows both. Encoding takes valid values; decoding takes anything the
network or a disk hands us and either returns a *validated* value or raises InvalidArgument
naming the offending field by its path ("schema.columns[2].type: unknown column type 99"), so
garbage never reaches the catalog.

Two representation choices:

* Defaults travel in their cell encoding (`encode_cell`; documented on
  `ColumnSchemaPB.default_value`), little-endian fixed width as Kudu's defaults are, with proto3
  `optional` presence distinguishing "no default" from an empty string.
* The partition schema names columns by id, and split rows travel as encoded range keys, so
  its encoding depends on the table schema: both directions take the `Schema`. A column renamed
  after CreateTable decodes under its new name.

proto3 has no presence for scalars, so "missing" means the zero value where zero is invalid: an
empty name, type COLUMN_TYPE_UNKNOWN, no columns, no key.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeVar

from service.common.errors import InvalidArgument
from service.common.keys import decode_key
from service.common.partition import (
    HashBucketSchema,
    Partition,
    PartitionSchema,
    RangeBound,
    RangeSchema,
    hash_prefix,
)
from service.common.schema import (
    ColumnSchema,
    ColumnType,
    Schema,
    coerce_value,
    decimal_to_unscaled,
    unscaled_to_decimal,
)
from service.pb import common_pb2 as pb

__all__ = [
    "column_from_pb",
    "column_to_pb",
    "column_type_from_pb",
    "column_type_to_pb",
    "decode_cell",
    "encode_cell",
    "hash_schema_from_pb",
    "hash_schema_to_pb",
    "partition_from_pb",
    "partition_schema_from_pb",
    "partition_schema_to_pb",
    "partition_to_pb",
    "schema_from_pb",
    "schema_to_pb",
]

_TYPE_TO_PB: dict[ColumnType, pb.ColumnTypePB.ValueType] = {
    ColumnType.BOOL: pb.COLUMN_TYPE_BOOL,
    ColumnType.INT8: pb.COLUMN_TYPE_INT8,
    ColumnType.INT16: pb.COLUMN_TYPE_INT16,
    ColumnType.INT32: pb.COLUMN_TYPE_INT32,
    ColumnType.INT64: pb.COLUMN_TYPE_INT64,
    ColumnType.FLOAT: pb.COLUMN_TYPE_FLOAT,
    ColumnType.DOUBLE: pb.COLUMN_TYPE_DOUBLE,
    ColumnType.STRING: pb.COLUMN_TYPE_STRING,
    ColumnType.BINARY: pb.COLUMN_TYPE_BINARY,
    ColumnType.TIMESTAMP: pb.COLUMN_TYPE_TIMESTAMP,
    ColumnType.DATE: pb.COLUMN_TYPE_DATE,
    ColumnType.DECIMAL: pb.COLUMN_TYPE_DECIMAL,
}
_TYPE_FROM_PB = {int(v): k for k, v in _TYPE_TO_PB.items()}

_STRUCTS = {
    ColumnType.INT8: struct.Struct("<b"),
    ColumnType.INT16: struct.Struct("<h"),
    ColumnType.INT32: struct.Struct("<i"),
    ColumnType.INT64: struct.Struct("<q"),
    ColumnType.FLOAT: struct.Struct("<f"),
    ColumnType.DOUBLE: struct.Struct("<d"),
    ColumnType.TIMESTAMP: struct.Struct("<q"),
    ColumnType.DATE: struct.Struct("<i"),
}

_T = TypeVar("_T")


def _at(path: str, fn: Callable[..., _T], *args: Any) -> _T:
    """Run `fn(*args)`, prefixing the message of an InvalidArgument it raises with `path`."""
    try:
        return fn(*args)
    except InvalidArgument as e:
        raise InvalidArgument(f"{path}: {e.message}") from None


# --- column types and cells ------------------------------------------------------------------


def column_type_to_pb(t: ColumnType) -> pb.ColumnTypePB.ValueType:
    return _TYPE_TO_PB[t]


def column_type_from_pb(value: int, path: str = "type") -> ColumnType:
    if value == pb.COLUMN_TYPE_UNKNOWN:
        raise InvalidArgument(f"{path}: missing")
    t = _TYPE_FROM_PB.get(int(value))
    if t is None:
        raise InvalidArgument(f"{path}: unknown column type {value}")
    return t


def encode_cell(column: ColumnSchema, value: object) -> bytes:
    """`value` (coerced to `column`'s type) in the cell encoding of ColumnSchemaPB.default_value."""
    v = coerce_value(column, value)
    t = column.type
    s = _STRUCTS.get(t)
    if s is not None:
        return s.pack(v)
    if t is ColumnType.BOOL:
        return b"\x01" if v else b"\x00"
    if t is ColumnType.STRING:
        assert isinstance(v, str)
        return v.encode("utf-8")
    if t is ColumnType.BINARY:
        assert isinstance(v, bytes)
        return v
    assert t is ColumnType.DECIMAL and column.scale is not None
    return decimal_to_unscaled(v, column.scale).to_bytes(16, "little", signed=True)  # type: ignore[arg-type]


def decode_cell(column: ColumnSchema, data: bytes) -> object:
    """The canonical value of a cell encoded by `encode_cell`; InvalidArgument if malformed."""
    t = column.type
    s = _STRUCTS.get(t)
    size = s.size if s is not None else {ColumnType.BOOL: 1, ColumnType.DECIMAL: 16}.get(t)
    if size is not None and len(data) != size:
        raise InvalidArgument(f"expected {size} bytes for {column.type_name}, got {len(data)}")
    if s is not None:
        value: object = s.unpack(data)[0]
    elif t is ColumnType.BOOL:
        if data not in (b"\x00", b"\x01"):
            raise InvalidArgument(f"BOOL must be 0x00 or 0x01, got 0x{data.hex()}")
        value = data == b"\x01"
    elif t is ColumnType.STRING:
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument("STRING is not valid UTF-8") from None
    elif t is ColumnType.BINARY:
        value = bytes(data)
    else:
        if column.scale is None:
            raise InvalidArgument("DECIMAL needs a scale")
        value = unscaled_to_decimal(int.from_bytes(data, "little", signed=True), column.scale)
    return coerce_value(column, value)  # range checks (DATE, DECIMAL digits)


# --- schemas ---------------------------------------------------------------------------------


def column_to_pb(c: ColumnSchema) -> pb.ColumnSchemaPB:
    out = pb.ColumnSchemaPB(
        id=c.id,
        name=c.name,
        type=column_type_to_pb(c.type),
        nullable=c.nullable,
        comment=c.comment,
    )
    if c.default is not None:
        out.default_value = encode_cell(c, c.default)
    if c.precision is not None:
        out.precision = c.precision
    if c.scale is not None:
        out.scale = c.scale
    return out


def column_from_pb(p: pb.ColumnSchemaPB, path: str = "column") -> ColumnSchema:
    """A validated column; InvalidArgument naming the field under `path`."""
    if not p.name:
        raise InvalidArgument(f"{path}.name: missing")
    t = column_type_from_pb(p.type, f"{path}.type")
    precision = p.precision if p.HasField("precision") else None
    scale = p.scale if p.HasField("scale") else None
    shell = ColumnSchema(p.id, p.name, t, p.nullable, None, precision, scale, p.comment)
    _at(path, shell.validate)
    default = None
    if p.HasField("default_value"):
        default = _at(f"{path}.default_value", decode_cell, shell, p.default_value)
    return ColumnSchema(p.id, p.name, t, p.nullable, default, precision, scale, p.comment)


def schema_to_pb(s: Schema) -> pb.SchemaPB:
    return pb.SchemaPB(
        columns=[column_to_pb(c) for c in s.columns],
        key_column_names=list(s.key),
        version=s.version,
        next_column_id=s.next_column_id,
    )


def schema_from_pb(p: pb.SchemaPB, path: str = "schema") -> Schema:
    """A validated schema; InvalidArgument naming the field under `path`."""
    if not p.columns:
        raise InvalidArgument(f"{path}.columns: missing")
    if not p.key_column_names:
        raise InvalidArgument(f"{path}.key_column_names: missing")
    cols = tuple(column_from_pb(c, f"{path}.columns[{i}]") for i, c in enumerate(p.columns))
    schema = Schema(cols, tuple(p.key_column_names), p.version, p.next_column_id)
    _at(path, schema.validate)
    return schema


# --- partitioning ----------------------------------------------------------------------------


def _names(schema: Schema, ids: list[int], path: str) -> tuple[str, ...]:
    out = []
    for i, cid in enumerate(ids):
        out.append(_at(f"{path}[{i}]", schema.column_by_id, cid).name)
    return tuple(out)


def _decode_prefix(cols: list[ColumnSchema], key: bytes) -> tuple[object, ...]:
    return decode_key(cols, key, allow_prefix=True)


def hash_schema_to_pb(h: HashBucketSchema, schema: Schema) -> pb.HashBucketSchemaPB:
    return pb.HashBucketSchemaPB(
        column_ids=[schema.column(c).id for c in h.columns],
        num_buckets=h.num_buckets,
        seed=h.seed,
    )


def hash_schema_from_pb(
    p: pb.HashBucketSchemaPB, schema: Schema, path: str = "hash_schema"
) -> HashBucketSchema:
    """Not validated on its own: `partition_schema_from_pb` validates the whole."""
    if not p.column_ids:
        raise InvalidArgument(f"{path}.column_ids: missing")
    return HashBucketSchema(
        _names(schema, list(p.column_ids), f"{path}.column_ids"), p.num_buckets, p.seed
    )


def partition_schema_to_pb(ps: PartitionSchema, schema: Schema) -> pb.PartitionSchemaPB:
    """Validates `ps` against `schema` first (InvalidArgument), then encodes it."""
    ps.validate(schema)
    out = pb.PartitionSchemaPB(hash_schema=[hash_schema_to_pb(h, schema) for h in ps.hash])
    out.range_schema.column_ids.extend(schema.column(c).id for c in ps.range_columns(schema))
    for lower, upper in ps.range_bounds:
        bound = out.range_bounds.add()
        if lower is not None:
            bound.lower = lower
        if upper is not None:
            bound.upper = upper
    out.split_keys.extend(ps.range.encode_key(schema, row) for row in ps.split_rows)
    return out


def partition_schema_from_pb(
    p: pb.PartitionSchemaPB, schema: Schema, path: str = "partition_schema"
) -> PartitionSchema:
    """A partition schema validated against `schema`; InvalidArgument naming the field."""
    hashes = tuple(
        hash_schema_from_pb(h, schema, f"{path}.hash_schema[{i}]")
        for i, h in enumerate(p.hash_schema)
    )
    if not p.HasField("range_schema"):
        raise InvalidArgument(f"{path}.range_schema: missing")
    range_names = _names(schema, list(p.range_schema.column_ids), f"{path}.range_schema.column_ids")
    range_cols = [schema.column(n) for n in range_names]
    bounds: list[RangeBound] = []
    for b in p.range_bounds:
        bounds.append(
            (
                b.lower if b.HasField("lower") else None,
                b.upper if b.HasField("upper") else None,
            )
        )
    splits = []
    for i, key in enumerate(p.split_keys):
        splits.append(_at(f"{path}.split_keys[{i}]", _decode_prefix, range_cols, key))
    ps = PartitionSchema(hashes, RangeSchema(range_names), tuple(bounds), tuple(splits))
    _at(path, ps.validate, schema)
    return ps


def partition_to_pb(p: Partition) -> pb.PartitionPB:
    return pb.PartitionPB(
        hash_buckets=list(p.hash_buckets),
        range_lower=p.range_lower,
        range_upper=p.range_upper,
        partition_key_start=p.partition_key_start,
        partition_key_end=p.partition_key_end,
    )


def partition_from_pb(p: pb.PartitionPB, path: str = "partition") -> Partition:
    """A partition; checks what it can without the partition schema (buckets >= 0, the start
    key agreeing with the buckets and range lower bound)."""
    buckets = tuple(p.hash_buckets)
    for i, b in enumerate(buckets):
        if b < 0:
            raise InvalidArgument(f"{path}.hash_buckets[{i}]: negative bucket {b}")
    if p.partition_key_start != hash_prefix(buckets) + p.range_lower:
        raise InvalidArgument(
            f"{path}.partition_key_start: does not agree with hash_buckets and range_lower"
        )
    return Partition(
        buckets, p.range_lower, p.range_upper, p.partition_key_start, p.partition_key_end
    )
