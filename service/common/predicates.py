"""Scan specifications: column predicates, projection, key bounds and limits.

Theory of operation
-------------------
A scan request names columns by their *current* names and carries predicate values in the cell
encoding of the schema codec (`encode_cell`). `predicates_from_pb` turns them into
`ColumnPredicate` values holding canonical Python values (`schema.coerce_value`), validating
everything a request can get wrong (an unknown or dropped column, a wrong value count, PREFIX on
a non-string column, an undecodable value) with InvalidArgument naming the predicate, so the
storage engine only ever sees well-formed specs.

Row storage evaluates predicates with Arrow compute: `to_arrow_expression` builds one
`pyarrow.compute.Expression` (a conjunction) over columns named by their current names, with
scalars of the exact Arrow type of each column. Null semantics are SQL's: a comparison with a
null cell is not true, so the row is filtered out; only IS_NULL selects nulls.

Key bounds in a `ScanSpec` are encoded primary keys (`keys.encode_key`) compared as bytes:
`lower_key` inclusive, `upper_key` exclusive, `start_after_key` exclusive (resuming a scan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from service.common.errors import InvalidArgument
from service.common.schema import ColumnSchema, ColumnType, Schema, coerce_value
from service.common.schema_codec import decode_cell, encode_cell
from service.pb import tserver_pb2

__all__ = [
    "IS_DELETED",
    "OPS",
    "ColumnPredicate",
    "ScanSpec",
    "predicate_to_pb",
    "predicates_from_pb",
    "to_arrow_expression",
    "validate_spec",
]

OPS = ("EQ", "LT", "LE", "GT", "GE", "IN", "IS_NULL", "IS_NOT_NULL", "PREFIX")
"""Predicate operators, named as in ColumnPredicatePB.Op."""

_ONE_VALUE = frozenset({"EQ", "LT", "LE", "GT", "GE", "PREFIX"})
_NO_VALUE = frozenset({"IS_NULL", "IS_NOT_NULL"})
_OP_NUMBERS = frozenset(tserver_pb2.ColumnPredicatePB.Op.Value(name) for name in OPS)


@dataclass(frozen=True)
class ColumnPredicate:
    """`column op values`. Values are canonical for the column's type (see schema.py)."""

    column: str
    op: str
    values: tuple[object, ...] = ()


IS_DELETED = "__is_deleted"
"""The column a diff scan adds to its batches (`ScanSpec.diff_start`): whether the row was
deleted as of the snapshot (then only its key columns hold values)."""


@dataclass(frozen=True)
class ScanSpec:
    """What a scan reads. Key bounds are encoded primary keys (b"" = unbounded)."""

    projection: tuple[str, ...] | None = None
    """Columns to return, by current name; None = every column in schema order."""
    predicates: tuple[ColumnPredicate, ...] = ()
    lower_key: bytes = b""
    """Inclusive lower bound on the encoded key."""
    upper_key: bytes = b""
    """Exclusive upper bound on the encoded key; b"" = none."""
    start_after_key: bytes | None = None
    """Return only rows with a key strictly greater (resuming after the last row seen)."""
    limit: int = 0
    """At most this many rows; 0 = no limit."""
    read_at: int | None = None
    """The snapshot's hybrid timestamp: the rows as of it (docs/design/tablets.md#R3); None =
    the newest version of every row."""
    diff_start: int | None = None
    """A diff scan (with `read_at`): only rows whose version as of `read_at` was committed after
    this timestamp, deleted ones included (flagged)."""


def _where(i: int, column: str, op: str) -> str:
    return f"predicate {i} ({column!r} {op})"


def _check_shape(schema: Schema, i: int, column: str, op: str, n_values: int) -> ColumnSchema:
    where = _where(i, column, op)
    if op not in OPS:
        raise InvalidArgument(f"{where}: unknown operator")
    if not schema.has_column(column):
        raise InvalidArgument(f"{where}: unknown column {column!r}")
    col = schema.column(column)
    if op in _ONE_VALUE and n_values != 1:
        raise InvalidArgument(f"{where}: needs exactly one value, got {n_values}")
    if op in _NO_VALUE and n_values != 0:
        raise InvalidArgument(f"{where}: takes no values, got {n_values}")
    if op == "PREFIX" and col.type not in (ColumnType.STRING, ColumnType.BINARY):
        raise InvalidArgument(
            f"{where}: PREFIX needs a STRING or BINARY column, not {col.type_name}"
        )
    return col


def predicates_from_pb(
    schema: Schema, preds: Sequence[tserver_pb2.ColumnPredicatePB]
) -> tuple[ColumnPredicate, ...]:
    """Decode and validate predicates from a NewScanRequestPB; InvalidArgument naming the one
    that is wrong."""
    out = []
    for i, p in enumerate(preds):
        op = tserver_pb2.ColumnPredicatePB.Op.Name(p.op) if p.op in _OP_NUMBERS else str(p.op)
        col = _check_shape(schema, i, p.column, op, len(p.values))
        values = []
        for j, raw in enumerate(p.values):
            try:
                values.append(decode_cell(col, bytes(raw)))
            except InvalidArgument as e:
                raise InvalidArgument(
                    f"{_where(i, p.column, op)}: value {j}: {e.message}"
                ) from None
        out.append(ColumnPredicate(p.column, op, tuple(values)))
    return tuple(out)


def predicate_to_pb(schema: Schema, p: ColumnPredicate) -> tserver_pb2.ColumnPredicatePB:
    """The wire form of `p` (the inverse of `predicates_from_pb`)."""
    col = _check_shape(schema, 0, p.column, p.op, len(p.values))
    return tserver_pb2.ColumnPredicatePB(
        column=p.column,
        op=tserver_pb2.ColumnPredicatePB.Op.Value(p.op),
        values=[encode_cell(col, v) for v in p.values],
    )


def validate_spec(schema: Schema, spec: ScanSpec) -> tuple[ColumnPredicate, ...]:
    """Check `spec` against `schema` (projection and predicate columns, shapes, values) and
    return its predicates with canonical values. InvalidArgument names the problem."""
    if spec.projection is not None:
        seen: set[str] = set()
        for name in spec.projection:
            if not schema.has_column(name):
                raise InvalidArgument(f"projection: unknown column {name!r}")
            if name in seen:
                raise InvalidArgument(f"projection: column {name!r} is listed twice")
            seen.add(name)
    if spec.limit < 0:
        raise InvalidArgument(f"limit must be >= 0, got {spec.limit}")
    out = []
    for i, p in enumerate(spec.predicates):
        col = _check_shape(schema, i, p.column, p.op, len(p.values))
        values = []
        for v in p.values:
            if v is None:
                raise InvalidArgument(
                    f"{_where(i, p.column, p.op)}: null is not a value (use IS_NULL)"
                )
            try:
                values.append(coerce_value(col, v))
            except InvalidArgument as e:
                raise InvalidArgument(f"{_where(i, p.column, p.op)}: {e.message}") from None
        out.append(ColumnPredicate(p.column, p.op, tuple(values)))
    return tuple(out)


def _successor_of_prefix(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with `prefix` (None: none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _one(schema: Schema, p: ColumnPredicate, field_name: str) -> pc.Expression:
    col = schema.column(p.column)
    t = col.arrow_type()
    f = pc.field(field_name)
    if p.op == "IS_NULL":
        return f.is_null()
    if p.op == "IS_NOT_NULL":
        return f.is_valid()
    if p.op == "IN":
        if not p.values:
            return pc.scalar(False)
        return f.isin(pa.array(list(p.values), type=t))
    v = p.values[0]
    if p.op == "PREFIX":
        if col.type is ColumnType.STRING:
            assert isinstance(v, str)
            return pc.starts_with(f, pattern=v)
        # Binary prefixes may not be UTF-8, which starts_with's pattern must be: compare a range.
        assert isinstance(v, bytes)
        expr = f >= pc.scalar(pa.scalar(v, type=t))
        succ = _successor_of_prefix(v)
        if succ is not None:
            expr = expr & (f < pc.scalar(pa.scalar(succ, type=t)))
        return expr
    s = pc.scalar(pa.scalar(v, type=t))
    if p.op == "EQ":
        return f == s
    if p.op == "LT":
        return f < s
    if p.op == "LE":
        return f <= s
    if p.op == "GT":
        return f > s
    assert p.op == "GE"
    return f >= s


def to_arrow_expression(
    schema: Schema,
    predicates: Sequence[ColumnPredicate],
    field_names: Mapping[str, str] | None = None,
) -> pc.Expression | None:
    """The conjunction of `predicates` as an Arrow compute expression; None when there are none.

    Fields are the columns' current names, or `field_names[name]` when given (row storage
    evaluates over columns named by id).
    """
    expr: pc.Expression | None = None
    for p in predicates:
        name = field_names[p.column] if field_names is not None else p.column
        e = _one(schema, p, name)
        expr = e if expr is None else expr & e
    return expr
