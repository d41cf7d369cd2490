"""Table schemas: column types, columns, the primary key, and schema evolution as values.

Theory of operation
-------------------
A `Schema` is an immutable value shared by every component: the master validates it at
CreateTable and evolves it at AlterTable, tablet servers store and scan rows with its Arrow form,
the client routes rows with its key, and the Spark DataSource declares its Arrow form to Spark.
Everything here is pure: no I/O, no clock, no global state.

Columns have two names. `name` is what users write; `id` is what storage and the partition
schema hold on to. As in Kudu, ids are assigned once and are stable across renames, and an id is
never reused, even after its column is dropped: a tablet that still has data of a dropped column
`c` (id 4) must not mistake it for a later column `c` (id 7). `Schema.next_column_id` is the
high-water mark that makes this hold across alters (it is persisted, see schema_codec).

The primary key is a tuple of column names. Its columns come first in the column list, in key
order, are NOT NULL, and have a type with a total order that can be encoded order-preservingly
(`keys.py`): BOOL, FLOAT and DOUBLE are refused, as in Kudu.

The value model
---------------
Each type has one canonical Python value; defaults are stored in it and keys decode to it:

============  ==================================================================
BOOL          bool
INT8..INT64   int within the type's range (bool is not an int here)
FLOAT/DOUBLE  float (a FLOAT is rounded to float32, so it round-trips exactly)
STRING        str (encodable as UTF-8: no lone surrogates)
BINARY        bytes
TIMESTAMP     int, microseconds since the Unix epoch, UTC
DATE          int, days since the Unix epoch (int32 range)
DECIMAL       decimal.Decimal with exponent -scale and at most `precision` digits
============  ==================================================================

`coerce_value` turns what callers naturally have into the canonical value, exactly or not at
all: an int for a FLOAT, a timezone-aware datetime for a TIMESTAMP, a date for a DATE, an int
for a DECIMAL. It never rounds (a float is refused for a DECIMAL, 1.005 with scale 2 too) and
refuses naive datetimes, whose instant is ambiguous. `ColumnSchema` canonicalizes its default
the same way when it can; a default that cannot be coerced is left as given for `validate()` to
report.

Construction and validation are separate, as in `config.py`: the dataclasses accept anything
(tests and the codec build odd values on purpose), `Schema.validate()` checks every rule and
raises `InvalidArgument` naming the rule and the column. `Schema.build`, `Schema.from_arrow` and
`Schema.apply` return validated schemas.

Alter operations (`AddColumn`, `DropColumn`, `RenameColumn`) are values too, so AlterTable
requests can be logged, replicated and replayed. `Schema.apply(ops)` applies them in order and
returns a new schema with `version + 1`; tablet servers report the version they run
(docs/design/catalog.md#R12).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import numbers
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeAlias

import pyarrow as pa

from service.common.errors import InvalidArgument

__all__ = [
    "KEY_TYPES",
    "MAX_COLUMNS",
    "MAX_COLUMN_ID",
    "MAX_COMMENT_CHARS",
    "MAX_DECIMAL_PRECISION",
    "MAX_NAME_BYTES",
    "MAX_SCHEMA_VERSION",
    "AddColumn",
    "AlterOp",
    "ColumnSchema",
    "ColumnSpec",
    "ColumnType",
    "DropColumn",
    "RenameColumn",
    "Schema",
    "coerce_value",
    "decimal_to_unscaled",
    "unscaled_to_decimal",
]

MAX_COLUMNS = 300
"""Columns per table (Kudu's max_num_columns default)."""
MAX_NAME_BYTES = 256
"""Longest column name, in UTF-8 bytes (Kudu's max_identifier_length)."""
MAX_COMMENT_CHARS = 256
"""Longest column comment, in characters (Kudu's max_column_comment_length)."""
MAX_DECIMAL_PRECISION = 38
"""Largest DECIMAL precision: the unscaled value fits 128 bits (Arrow's decimal128)."""
MAX_COLUMN_ID = 2**31 - 2
"""Largest column id: ids travel as int32 and `next_column_id` must fit too."""
MAX_SCHEMA_VERSION = 2**32 - 1
"""Largest schema version (a uint32 on the wire)."""


class ColumnType(enum.Enum):
    """The column types. The value is the stable lowercase name used in messages."""

    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT = "float"
    DOUBLE = "double"
    STRING = "string"
    BINARY = "binary"
    TIMESTAMP = "timestamp"
    """Microseconds since the Unix epoch, UTC."""
    DATE = "date"
    """Days since the Unix epoch."""
    DECIMAL = "decimal"
    """Fixed point; needs a precision (1..38) and a scale (0..precision)."""

    @property
    def is_key_type(self) -> bool:
        """Whether a key (primary, hash or range) may contain a column of this type."""
        return self in KEY_TYPES

    @property
    def int_range(self) -> tuple[int, int] | None:
        """The inclusive range of an integer-like type (TIMESTAMP, DATE included), else None."""
        return _INT_RANGES.get(self)


KEY_TYPES = frozenset(ColumnType) - {ColumnType.BOOL, ColumnType.FLOAT, ColumnType.DOUBLE}
"""Types allowed in a key. BOOL, FLOAT and DOUBLE are refused, as in Kudu (a two-valued key
is useless, and floating point has no exact equality for NaN and -0.0)."""

_INT_RANGES = {
    ColumnType.INT8: (-(2**7), 2**7 - 1),
    ColumnType.INT16: (-(2**15), 2**15 - 1),
    ColumnType.INT32: (-(2**31), 2**31 - 1),
    ColumnType.INT64: (-(2**63), 2**63 - 1),
    ColumnType.TIMESTAMP: (-(2**63), 2**63 - 1),
    ColumnType.DATE: (-(2**31), 2**31 - 1),
}

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_ONE_MICROSECOND = dt.timedelta(microseconds=1)


# --- values ----------------------------------------------------------------------------------


def decimal_to_unscaled(value: decimal.Decimal, scale: int) -> int:
    """The integer `value * 10**scale`, exactly; ValueError if that is not an integer."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # 'n', 'N' or 'F': NaN or infinity
        raise ValueError("not a finite number")
    magnitude = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    if shift >= 0:
        magnitude *= 10**shift
    else:
        magnitude, rest = divmod(magnitude, 10**-shift)
        if rest:
            raise ValueError(f"has more than {scale} digits after the point")
    return -magnitude if sign else magnitude


def unscaled_to_decimal(unscaled: int, scale: int) -> decimal.Decimal:
    """The Decimal `unscaled * 10**-scale`, with exponent -scale (exact, no context rounding)."""
    digits = tuple(int(c) for c in str(abs(unscaled)))
    return decimal.Decimal((1 if unscaled < 0 else 0, digits, -scale))


def _type_error(column: ColumnSchema, expected: str, value: object) -> InvalidArgument:
    return InvalidArgument(
        f"column {column.name!r}: expected {expected} for {column.type_name}, "
        f"got {type(value).__name__} {value!r}"
    )


def coerce_value(column: ColumnSchema, value: object) -> object:
    """`value` as the canonical Python value of `column`'s type (see the module docstring).

    Raises InvalidArgument naming the column when the value has the wrong type, is out of
    range, or cannot be represented exactly. None is not a value: callers handle nulls.
    """
    t = column.type
    if t is ColumnType.BOOL:
        if isinstance(value, bool):
            return value
        raise _type_error(column, "a bool", value)
    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise _type_error(column, "a float", value)
        if isinstance(value, decimal.Decimal):
            raise _type_error(column, "a float", value)
        f = float(value)
        if t is ColumnType.FLOAT:
            try:
                f = struct.unpack("<f", struct.pack("<f", f))[0]
            except OverflowError:
                raise InvalidArgument(
                    f"column {column.name!r}: {value!r} is out of range for FLOAT"
                ) from None
        return f
    if t is ColumnType.STRING:
        if not isinstance(value, str):
            raise _type_error(column, "a str", value)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"column {column.name!r}: string is not encodable as UTF-8: {value!r}"
            ) from None
        return value
    if t is ColumnType.BINARY:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        raise _type_error(column, "bytes", value)
    if t is ColumnType.DECIMAL:
        return _coerce_decimal(column, value)
    if t is ColumnType.TIMESTAMP and isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(
                f"column {column.name!r}: a naive datetime is ambiguous for TIMESTAMP; give a "
                f"timezone-aware datetime or microseconds since the epoch, got {value!r}"
            )
        value = (value - _EPOCH) // _ONE_MICROSECOND
    elif t is ColumnType.DATE and isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = (value - _EPOCH_DATE).days
    bounds = _INT_RANGES[t]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        what = {
            ColumnType.TIMESTAMP: "an int (microseconds) or an aware datetime",
            ColumnType.DATE: "an int (days) or a date",
        }.get(t, "an int")
        raise _type_error(column, what, value)
    v = int(value)
    if not bounds[0] <= v <= bounds[1]:
        raise InvalidArgument(
            f"column {column.name!r}: {v} is out of range for {column.type_name} "
            f"[{bounds[0]}, {bounds[1]}]"
        )
    return v


def _coerce_decimal(column: ColumnSchema, value: object) -> decimal.Decimal:
    precision, scale = column.precision, column.scale
    if precision is None or scale is None:
        raise InvalidArgument(f"column {column.name!r}: DECIMAL needs a precision and a scale")
    if isinstance(value, bool) or not isinstance(value, decimal.Decimal | numbers.Integral):
        raise _type_error(column, "a decimal.Decimal or an int", value)
    d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(int(value))
    try:
        unscaled = decimal_to_unscaled(d, scale)
    except ValueError as e:
        raise InvalidArgument(f"column {column.name!r}: {value!r} {e}") from None
    if abs(unscaled) >= 10**precision:
        raise InvalidArgument(
            f"column {column.name!r}: {value!r} has more than {precision} digits "
            f"(DECIMAL({precision}, {scale}))"
        )
    return unscaled_to_decimal(unscaled, scale)


# --- columns ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSchema:
    """One column. `id` is stable across renames and never reused (see the module docstring).

    `default` is the value given to rows written without this column, and to existing rows when
    the column is added by an alter; None means no default (NULL for a nullable column).
    It is canonicalized on construction when it can be (see `coerce_value`).
    """

    id: int
    name: str
    type: ColumnType
    nullable: bool = True
    default: object | None = None
    precision: int | None = None
    """DECIMAL only: total digits, 1..38."""
    scale: int | None = None
    """DECIMAL only: digits after the point, 0..precision."""
    comment: str = ""

    def __post_init__(self) -> None:
        if self.default is not None and isinstance(self.type, ColumnType):
            try:
                canonical = coerce_value(self, self.default)
            except InvalidArgument:
                return  # left for validate() to report
            object.__setattr__(self, "default", canonical)

    @property
    def type_name(self) -> str:
        """The type as written in messages: INT64, DECIMAL(10, 2)."""
        if not isinstance(self.type, ColumnType):
            return repr(self.type)
        if self.type is ColumnType.DECIMAL:
            return f"DECIMAL({self.precision}, {self.scale})"
        return self.type.name

    def arrow_type(self) -> pa.DataType:
        """The exact Arrow type of this column (see `Schema.to_arrow`)."""
        if self.type is ColumnType.DECIMAL:
            if self.precision is None or self.scale is None:
                raise InvalidArgument(f"column {self.name!r}: DECIMAL needs a precision and scale")
            return pa.decimal128(self.precision, self.scale)
        return _ARROW_TYPES[self.type]

    def validate(self) -> None:
        """Check this column on its own; InvalidArgument naming the column and the rule."""
        name = self.name
        if not isinstance(name, str):
            raise InvalidArgument(f"column id {self.id}: name must be a str, got {name!r}")
        if not name:
            raise InvalidArgument(f"column id {self.id}: name is empty")
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidArgument(f"column {name!r}: name is not valid UTF-8") from None
        if size > MAX_NAME_BYTES:
            raise InvalidArgument(
                f"column {name[:32]!r}...: name is {size} bytes, longer than "
                f"MAX_NAME_BYTES {MAX_NAME_BYTES}"
            )
        if isinstance(self.id, bool) or not isinstance(self.id, int):
            raise InvalidArgument(f"column {name!r}: id must be an int, got {self.id!r}")
        if not 0 <= self.id <= MAX_COLUMN_ID:
            raise InvalidArgument(f"column {name!r}: id must be in 0..{MAX_COLUMN_ID}")
        if not isinstance(self.type, ColumnType):
            raise InvalidArgument(f"column {name!r}: unknown type {self.type!r}")
        if not isinstance(self.nullable, bool):
            raise InvalidArgument(f"column {name!r}: nullable must be a bool")
        if not isinstance(self.comment, str) or len(self.comment) > MAX_COMMENT_CHARS:
            raise InvalidArgument(
                f"column {name!r}: comment must be a str of at most {MAX_COMMENT_CHARS} chars"
            )
        if self.type is ColumnType.DECIMAL:
            p, s = self.precision, self.scale
            if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= MAX_DECIMAL_PRECISION:
                raise InvalidArgument(
                    f"column {name!r}: DECIMAL precision must be in 1..{MAX_DECIMAL_PRECISION}, "
                    f"got {p!r}"
                )
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= p:
                raise InvalidArgument(
                    f"column {name!r}: DECIMAL scale must be in 0..precision ({p}), got {s!r}"
                )
        elif self.precision is not None or self.scale is not None:
            raise InvalidArgument(
                f"column {name!r}: precision and scale are only for DECIMAL, not {self.type.name}"
            )
        if self.default is not None:
            try:
                coerce_value(self, self.default)
            except InvalidArgument as e:
                raise InvalidArgument(f"default value of {e.message}") from None


_ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.BOOL: pa.bool_(),
    ColumnType.INT8: pa.int8(),
    ColumnType.INT16: pa.int16(),
    ColumnType.INT32: pa.int32(),
    ColumnType.INT64: pa.int64(),
    ColumnType.FLOAT: pa.float32(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.STRING: pa.string(),
    ColumnType.BINARY: pa.binary(),
    ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    ColumnType.DATE: pa.date32(),
}


def _type_from_arrow(field: pa.Field) -> tuple[ColumnType, int | None, int | None]:
    t = field.type
    for ct, at in _ARROW_TYPES.items():
        if ct is not ColumnType.TIMESTAMP and t == at:
            return ct, None, None
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return ColumnType.STRING, None, None
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return ColumnType.BINARY, None, None
    if pa.types.is_timestamp(t) and t.unit == "us" and t.tz is not None:
        return ColumnType.TIMESTAMP, None, None  # any zone: Arrow stores UTC instants
    if pa.types.is_decimal128(t) or (pa.types.is_decimal(t) and t.precision <= 38):
        return ColumnType.DECIMAL, t.precision, t.scale
    hint = ""
    if pa.types.is_timestamp(t):
        hint = " (use timestamp('us', tz='UTC'))"
    raise InvalidArgument(f"column {field.name!r}: Arrow type {t} has no Tessera type{hint}")


# --- alter operations ------------------------------------------------------------------------


@dataclass(frozen=True)
class AddColumn:
    """Add a column at the end. Also the column spec of `Schema.build`.

    A NOT NULL column needs a default when added by an alter (existing rows get it).
    """

    name: str
    type: ColumnType
    nullable: bool = True
    default: object | None = None
    precision: int | None = None
    scale: int | None = None
    comment: str = ""

    def to_column(self, column_id: int) -> ColumnSchema:
        return ColumnSchema(
            column_id,
            self.name,
            self.type,
            self.nullable,
            self.default,
            self.precision,
            self.scale,
            self.comment,
        )


@dataclass(frozen=True)
class DropColumn:
    """Drop a non-key column. Its id is never given to another column."""

    name: str


@dataclass(frozen=True)
class RenameColumn:
    """Rename a column, key columns included (as in Kudu); its id does not change."""

    old: str
    new: str


AlterOp: TypeAlias = AddColumn | DropColumn | RenameColumn
ColumnSpec: TypeAlias = AddColumn | tuple[str, ColumnType] | tuple[str, ColumnType, bool]
"""A column for `Schema.build`: an `AddColumn`, or `(name, type[, nullable])`; in the tuple
forms nullability defaults to "NOT NULL for key columns, nullable otherwise"."""


# --- the schema ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """Columns (key columns first, in key order), the key, a version and the id high-water mark.

    `next_column_id` is the id the next added column gets; it is raised on construction to at
    least `max(id) + 1`, so it is only worth passing when columns were dropped (the codec does).
    """

    columns: tuple[ColumnSchema, ...]
    key: tuple[str, ...]
    version: int = 0
    next_column_id: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "key", tuple(self.key))
        ids = [c.id for c in self.columns if isinstance(c.id, int)]
        floor = max(ids) + 1 if ids else 0
        if self.next_column_id < floor:
            object.__setattr__(self, "next_column_id", floor)

    # --- constructors ----------------------------------------------------------------------

    @classmethod
    def build(
        cls, columns: Iterable[ColumnSpec], key: Sequence[str] | str, *, version: int = 0
    ) -> Schema:
        """A validated schema with column ids 0..n-1 in the order given."""
        key_t = (key,) if isinstance(key, str) else tuple(key)
        cols: list[ColumnSchema] = []
        for i, spec in enumerate(columns):
            if isinstance(spec, AddColumn):
                cols.append(spec.to_column(i))
            else:
                name, ctype = spec[0], spec[1]
                nullable = spec[2] if len(spec) == 3 else name not in key_t
                cols.append(ColumnSchema(i, name, ctype, nullable))
        schema = cls(tuple(cols), key_t, version)
        schema.validate()
        return schema

    @classmethod
    def from_arrow(cls, arrow_schema: pa.Schema, key: Sequence[str] | str) -> Schema:
        """A validated schema from an Arrow schema (Spark's, a Parquet file's).

        As Kudu's Spark integration does, key columns are moved to the front in key order and
        made NOT NULL; the other columns keep their order and nullability. Ids are assigned in
        the resulting order. Accepted beyond `to_arrow`'s exact types: large/view strings and
        binaries, and microsecond timestamps in any time zone (instants either way).
        """
        key_t = (key,) if isinstance(key, str) else tuple(key)
        fields = {f.name: f for f in arrow_schema}
        for k in key_t:
            if k not in fields:
                raise InvalidArgument(f"key column {k!r} is not in the Arrow schema")
        ordered = [fields[k] for k in key_t] + [f for f in arrow_schema if f.name not in key_t]
        cols = []
        for i, f in enumerate(ordered):
            ctype, precision, scale = _type_from_arrow(f)
            nullable = bool(f.nullable) and f.name not in key_t
            cols.append(ColumnSchema(i, f.name, ctype, nullable, None, precision, scale))
        schema = cls(tuple(cols), key_t)
        schema.validate()
        return schema

    # --- lookups ---------------------------------------------------------------------------

    @cached_property
    def _by_name(self) -> dict[str, ColumnSchema]:
        return {c.name: c for c in self.columns}

    @cached_property
    def _by_id(self) -> dict[int, ColumnSchema]:
        return {c.id: c for c in self.columns}

    def has_column(self, name: str) -> bool:
        return name in self._by_name

    def column(self, name: str) -> ColumnSchema:
        """The column named `name`; InvalidArgument if there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise InvalidArgument(f"unknown column {name!r}") from None

    def column_by_id(self, column_id: int) -> ColumnSchema:
        """The column with id `column_id`; InvalidArgument if there is none (dropped ids too)."""
        try:
            return self._by_id[column_id]
        except KeyError:
            raise InvalidArgument(f"unknown column id {column_id}") from None

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def key_columns(self) -> tuple[ColumnSchema, ...]:
        """The key columns, in key order."""
        return tuple(self.column(k) for k in self.key)

    def is_key_column(self, name: str) -> bool:
        return name in self.key

    # --- Arrow -----------------------------------------------------------------------------

    def to_arrow(self) -> pa.Schema:
        """The exact Arrow schema of rows of this table, nullability included.

        INT8..INT64 -> int8..int64, FLOAT -> float32, DOUBLE -> float64, BOOL -> bool,
        STRING -> string (utf8; not large_string: Spark's Arrow batches use 32-bit offsets),
        BINARY -> binary, TIMESTAMP -> timestamp('us', tz='UTC'), DATE -> date32,
        DECIMAL(p, s) -> decimal128(p, s).
        """
        return pa.schema([pa.field(c.name, c.arrow_type(), c.nullable) for c in self.columns])

    # --- validation ------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every rule; InvalidArgument naming the problem and the column."""
        if not self.columns:
            raise InvalidArgument("schema has no columns")
        if len(self.columns) > MAX_COLUMNS:
            raise InvalidArgument(
                f"schema has {len(self.columns)} columns, more than MAX_COLUMNS {MAX_COLUMNS}"
            )
        if not 0 <= self.version <= MAX_SCHEMA_VERSION:
            raise InvalidArgument(f"schema version must be in 0..{MAX_SCHEMA_VERSION}")
        names: dict[str, ColumnSchema] = {}
        ids: dict[int, ColumnSchema] = {}
        for c in self.columns:
            if not isinstance(c, ColumnSchema):
                raise InvalidArgument(f"schema column {c!r} is not a ColumnSchema")
            c.validate()
            if c.name in names:
                raise InvalidArgument(f"duplicate column name {c.name!r}")
            if c.id in ids:
                raise InvalidArgument(
                    f"duplicate column id {c.id}: columns {ids[c.id].name!r} and {c.name!r}"
                )
            names[c.name] = c
            ids[c.id] = c
        if self.next_column_id > MAX_COLUMN_ID + 1:
            raise InvalidArgument(f"next_column_id must be at most {MAX_COLUMN_ID + 1}")
        if not self.key:
            raise InvalidArgument("schema has no key: at least one key column is needed")
        seen: set[str] = set()
        for i, k in enumerate(self.key):
            if k in seen:
                raise InvalidArgument(f"key column {k!r} is listed twice")
            seen.add(k)
            col = names.get(k)
            if col is None:
                raise InvalidArgument(f"key column {k!r} is not a column of the schema")
            if self.columns[i].name != k:
                raise InvalidArgument(
                    f"key column {k!r} must be column {i}: key columns come first, in key order"
                )
            if col.nullable:
                raise InvalidArgument(f"key column {k!r} must not be nullable")
            if not col.type.is_key_type:
                raise InvalidArgument(
                    f"key column {k!r} has type {col.type.name}, which cannot be part of a key "
                    f"(BOOL, FLOAT and DOUBLE cannot)"
                )

    # --- evolution -------------------------------------------------------------------------

    def apply(self, ops: Iterable[AlterOp]) -> Schema:
        """A new, validated schema: `ops` applied in order, `version + 1`.

        New columns go at the end with fresh ids from `next_column_id`. Refused with
        InvalidArgument naming the column: no operations, an unknown column, a name that is
        taken, dropping a key column, adding a NOT NULL column without a default.
        """
        columns = list(self.columns)
        key = list(self.key)
        next_id = self.next_column_id
        n_ops = 0
        for op in ops:
            n_ops += 1
            index = {c.name: i for i, c in enumerate(columns)}
            if isinstance(op, AddColumn):
                if op.name in index:
                    raise InvalidArgument(f"cannot add column {op.name!r}: it already exists")
                if not op.nullable and op.default is None:
                    raise InvalidArgument(
                        f"cannot add NOT NULL column {op.name!r} without a default value"
                    )
                columns.append(op.to_column(next_id))
                next_id += 1
            elif isinstance(op, DropColumn):
                if op.name not in index:
                    raise InvalidArgument(f"cannot drop column {op.name!r}: unknown column")
                if op.name in key:
                    raise InvalidArgument(f"cannot drop key column {op.name!r}")
                del columns[index[op.name]]
            elif isinstance(op, RenameColumn):
                if op.old not in index:
                    raise InvalidArgument(f"cannot rename column {op.old!r}: unknown column")
                if op.new in index:
                    raise InvalidArgument(
                        f"cannot rename column {op.old!r} to {op.new!r}: {op.new!r} already exists"
                    )
                i = index[op.old]
                columns[i] = dataclasses.replace(columns[i], name=op.new)
                key = [op.new if k == op.old else k for k in key]
            else:
                raise InvalidArgument(f"unknown alter operation {op!r}")
        if n_ops == 0:
            raise InvalidArgument("alter has no operations")
        new = Schema(tuple(columns), tuple(key), self.version + 1, next_id)
        new.validate()
        return new

    def renames_from(self, older: Schema) -> Mapping[str, str]:
        """Old name -> new name for the columns of `older` still here under another name."""
        out = {}
        for c in older.columns:
            now = self._by_id.get(c.id)
            if now is not None and now.name != c.name:
                out[c.name] = now.name
        return out
