"""Scan predicates: the wire form, validation, and evaluation with Arrow compute."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from service.common.errors import InvalidArgument
from service.common.predicates import (
    ColumnPredicate,
    ScanSpec,
    predicate_to_pb,
    predicates_from_pb,
    to_arrow_expression,
    validate_spec,
)
from service.common.schema import AddColumn, ColumnType, Schema
from service.pb import tserver_pb2

T = ColumnType
PB = tserver_pb2.ColumnPredicatePB


@pytest.fixture
def schema() -> Schema:
    return Schema.build(
        [
            ("id", T.INT64),
            ("s", T.STRING),
            ("b", T.BINARY),
            ("ts", T.TIMESTAMP),
            AddColumn("d", T.DECIMAL, precision=6, scale=2),
            ("f", T.DOUBLE),
        ],
        "id",
    )


def table(schema: Schema) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"id": 1, "s": "apple", "b": b"\x01\xff", "ts": 10, "d": decimal.Decimal("1.50")},
            {"id": 2, "s": "apricot", "b": b"\x01\xff\x00", "ts": 20, "d": decimal.Decimal("2")},
            {"id": 3, "s": "banana", "b": b"\x02", "ts": 30, "d": None, "f": 1.0},
            {"id": 4, "s": None, "b": None, "ts": None, "d": decimal.Decimal("-3.25")},
        ],
        schema=schema.to_arrow(),
    )


def ids(schema: Schema, *preds: ColumnPredicate) -> list[int]:
    expr = to_arrow_expression(schema, validate_spec(schema, ScanSpec(predicates=preds)))
    t = table(schema)
    if expr is not None:
        t = t.filter(expr)
    return list(t.column("id").to_pylist())


@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        (ColumnPredicate("id", "EQ", (2,)), [2]),
        (ColumnPredicate("id", "LT", (2,)), [1]),
        (ColumnPredicate("id", "LE", (2,)), [1, 2]),
        (ColumnPredicate("id", "GT", (2,)), [3, 4]),
        (ColumnPredicate("id", "GE", (2,)), [2, 3, 4]),
        (ColumnPredicate("id", "IN", (1, 4, 9)), [1, 4]),
        (ColumnPredicate("id", "IN", ()), []),
        (ColumnPredicate("s", "IS_NULL"), [4]),
        (ColumnPredicate("s", "IS_NOT_NULL"), [1, 2, 3]),
        (ColumnPredicate("s", "PREFIX", ("ap",)), [1, 2]),
        (ColumnPredicate("s", "PREFIX", ("",)), [1, 2, 3]),
        (ColumnPredicate("s", "GE", ("b",)), [3]),
        (ColumnPredicate("b", "PREFIX", (b"\x01\xff",)), [1, 2]),
        (ColumnPredicate("b", "PREFIX", (b"\x01",)), [1, 2]),
        (ColumnPredicate("ts", "GT", (15,)), [2, 3]),
        (ColumnPredicate("ts", "EQ", (dt.datetime(1970, 1, 1, tzinfo=dt.UTC),)), []),
        (ColumnPredicate("ts", "IN", (10, 30)), [1, 3]),
        (ColumnPredicate("d", "LT", (decimal.Decimal("2.00"),)), [1, 4]),
        (ColumnPredicate("d", "EQ", (2,)), [2]),
        (ColumnPredicate("d", "IS_NULL"), [3]),
        (ColumnPredicate("f", "EQ", (1.0,)), [3]),
    ],
)
def test_each_operator(schema: Schema, pred: ColumnPredicate, expected: list[int]) -> None:
    assert ids(schema, pred) == expected


def test_predicates_are_a_conjunction(schema: Schema) -> None:
    assert ids(
        schema, ColumnPredicate("id", "GE", (2,)), ColumnPredicate("s", "PREFIX", ("a",))
    ) == [2]
    assert ids(schema) == [1, 2, 3, 4]


def test_pb_round_trip(schema: Schema) -> None:
    preds = (
        ColumnPredicate("id", "IN", (1, -5)),
        ColumnPredicate("s", "PREFIX", ("ap",)),
        ColumnPredicate("b", "EQ", (b"\x00",)),
        ColumnPredicate("ts", "LE", (123,)),
        ColumnPredicate("d", "GT", (decimal.Decimal("1.25"),)),
        ColumnPredicate("f", "IS_NOT_NULL"),
    )
    wire = [predicate_to_pb(schema, p) for p in preds]
    assert predicates_from_pb(schema, wire) == preds


def test_invalid_predicates(schema: Schema) -> None:
    with pytest.raises(InvalidArgument, match=r"predicate 0 .*unknown column 'gone'"):
        predicates_from_pb(schema, [PB(column="gone", op=PB.EQ, values=[b"\x00" * 8])])
    with pytest.raises(InvalidArgument, match="needs exactly one value, got 2"):
        predicates_from_pb(schema, [PB(column="id", op=PB.EQ, values=[b"\x00" * 8] * 2)])
    with pytest.raises(InvalidArgument, match="takes no values"):
        predicates_from_pb(schema, [PB(column="s", op=PB.IS_NULL, values=[b"x"])])
    with pytest.raises(InvalidArgument, match="PREFIX needs a STRING or BINARY column, not INT64"):
        predicates_from_pb(schema, [PB(column="id", op=PB.PREFIX, values=[b"\x00" * 8])])
    with pytest.raises(
        InvalidArgument, match=r"predicate 1 \('id' LT\): value 0: expected 8 bytes"
    ):
        predicates_from_pb(
            schema,
            [PB(column="s", op=PB.IS_NULL), PB(column="id", op=PB.LT, values=[b"\x01"])],
        )
    with pytest.raises(InvalidArgument, match="not valid UTF-8"):
        predicates_from_pb(schema, [PB(column="s", op=PB.EQ, values=[b"\xff"])])
    with pytest.raises(InvalidArgument, match="unknown operator"):
        predicates_from_pb(schema, [PB(column="s", op=PB.OP_UNKNOWN)])


def test_validate_spec(schema: Schema) -> None:
    with pytest.raises(InvalidArgument, match="projection: unknown column 'zz'"):
        validate_spec(schema, ScanSpec(projection=("id", "zz")))
    with pytest.raises(InvalidArgument, match="listed twice"):
        validate_spec(schema, ScanSpec(projection=("id", "id")))
    with pytest.raises(InvalidArgument, match="'s'"):
        validate_spec(schema, ScanSpec(predicates=(ColumnPredicate("s", "EQ", (5,)),)))
    with pytest.raises(InvalidArgument, match="null is not a value"):
        validate_spec(schema, ScanSpec(predicates=(ColumnPredicate("s", "IN", (None,)),)))
    with pytest.raises(InvalidArgument, match="limit"):
        validate_spec(schema, ScanSpec(limit=-1))
