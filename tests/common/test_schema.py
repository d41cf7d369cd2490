"""Schemas: validation rules (each naming its column), the value model, the exact Arrow mapping,
alter operations (stable ids, no reuse, versions) and the protobuf codec."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
import pytest

from service.common.errors import InvalidArgument
from service.common.schema import (
    MAX_COLUMNS,
    MAX_NAME_BYTES,
    AddColumn,
    AlterOp,
    ColumnSchema,
    ColumnType,
    DropColumn,
    RenameColumn,
    Schema,
    coerce_value,
    decimal_to_unscaled,
    unscaled_to_decimal,
)
from service.common.schema_codec import (
    column_to_pb,
    column_type_from_pb,
    decode_cell,
    encode_cell,
    schema_from_pb,
    schema_to_pb,
)
from service.pb import common_pb2 as pb

T = ColumnType
UTC = dt.UTC


def col(
    i: int,
    name: str,
    t: ColumnType = T.INT64,
    nullable: bool = True,
    default: object | None = None,
    precision: int | None = None,
    scale: int | None = None,
) -> ColumnSchema:
    return ColumnSchema(i, name, t, nullable, default, precision, scale)


def key_col(i: int, name: str, t: ColumnType = T.INT64) -> ColumnSchema:
    return ColumnSchema(i, name, t, nullable=False)


def every_type_schema() -> Schema:
    """One column of every type (and a second DECIMAL width), ids 0..n-1."""
    return Schema.build(
        [
            ("k", T.INT64),
            ("b", T.BOOL),
            ("i8", T.INT8),
            ("i16", T.INT16),
            ("i32", T.INT32),
            ("i64", T.INT64, False),
            ("f", T.FLOAT),
            ("d", T.DOUBLE),
            ("s", T.STRING),
            ("bin", T.BINARY),
            ("ts", T.TIMESTAMP),
            ("date", T.DATE),
            AddColumn("dec", T.DECIMAL, precision=38, scale=10),
            AddColumn("dec2", T.DECIMAL, False, precision=5, scale=0, default=Decimal(7)),
        ],
        key=["k"],
    )


def assert_invalid(fn: Callable[[], object], *fragments: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        fn()
    for f in fragments:
        assert f in info.value.message, (f, info.value.message)
    return info.value


# --- validation ------------------------------------------------------------------------------


def test_build_assigns_ids_in_order_and_key_columns_not_null() -> None:
    s = Schema.build([("a", T.INT32), ("b", T.STRING), ("c", T.STRING)], key=["a", "b"])
    assert [c.id for c in s.columns] == [0, 1, 2]
    assert [c.nullable for c in s.columns] == [False, False, True]
    assert s.key_columns == (s.column("a"), s.column("b"))
    assert s.column_by_id(2).name == "c"
    assert s.next_column_id == 3
    assert s.version == 0


def test_names_are_case_sensitive() -> None:
    s = Schema.build([("a", T.INT32), ("A", T.INT32)], key="a")
    assert s.column("A").id == 1
    assert_invalid(lambda: s.column("b"), "unknown column 'b'")
    assert_invalid(lambda: s.column_by_id(7), "unknown column id 7")


def test_exactly_max_columns_is_fine() -> None:
    specs: list[tuple[str, ColumnType]] = [(f"c{i}", T.INT32) for i in range(MAX_COLUMNS)]
    assert len(Schema.build(specs, key="c0").columns) == MAX_COLUMNS


INVALID_SCHEMAS: list[tuple[str, Callable[[], Schema], tuple[str, ...]]] = [
    ("no columns", lambda: Schema((), ("k",)), ("no columns",)),
    (
        "too many columns",
        lambda: Schema(
            (key_col(0, "k"), *(col(i, f"c{i}") for i in range(1, MAX_COLUMNS + 1))), ("k",)
        ),
        ("301 columns", "MAX_COLUMNS 300"),
    ),
    ("empty name", lambda: Schema((key_col(0, "k"), col(1, "")), ("k",)), ("column id 1", "empty")),
    (
        "long name",
        lambda: Schema((key_col(0, "k"), col(1, "x" * (MAX_NAME_BYTES + 1))), ("k",)),
        ("'xxxxxxxx", "257 bytes", "MAX_NAME_BYTES 256"),
    ),
    (
        "multibyte name too long in bytes",
        lambda: Schema((key_col(0, "k"), col(1, "é" * 129)), ("k",)),
        ("258 bytes",),
    ),
    (
        "name not utf-8",
        lambda: Schema((key_col(0, "k"), col(1, "bad\udc80")), ("k",)),
        ("'bad\\udc80'", "not valid UTF-8"),
    ),
    (
        "duplicate name",
        lambda: Schema((key_col(0, "k"), col(1, "v"), col(2, "v")), ("k",)),
        ("duplicate column name 'v'",),
    ),
    (
        "duplicate id",
        lambda: Schema((key_col(0, "k"), col(1, "v"), col(1, "w")), ("k",)),
        ("duplicate column id 1", "'v'", "'w'"),
    ),
    ("negative id", lambda: Schema((key_col(-1, "k"),), ("k",)), ("column 'k'", "id must be")),
    ("no key", lambda: Schema((col(0, "v"),), ()), ("no key",)),
    (
        "key column missing",
        lambda: Schema((key_col(0, "k"),), ("k", "zz")),
        ("key column 'zz' is not a column",),
    ),
    (
        "key listed twice",
        lambda: Schema((key_col(0, "k"),), ("k", "k")),
        ("key column 'k' is listed twice",),
    ),
    (
        "key column not first",
        lambda: Schema((col(0, "v"), key_col(1, "k")), ("k",)),
        ("key column 'k' must be column 0",),
    ),
    (
        "key columns out of key order",
        lambda: Schema((key_col(0, "a"), key_col(1, "b")), ("b", "a")),
        ("key column 'b' must be column 0",),
    ),
    (
        "nullable key column",
        lambda: Schema((col(0, "k"),), ("k",)),
        ("key column 'k' must not be nullable",),
    ),
    (
        "bool key",
        lambda: Schema((key_col(0, "flag", T.BOOL),), ("flag",)),
        ("key column 'flag'", "BOOL", "cannot be part of a key"),
    ),
    (
        "float key",
        lambda: Schema((key_col(0, "f", T.FLOAT),), ("f",)),
        ("key column 'f'", "FLOAT"),
    ),
    (
        "double key",
        lambda: Schema((key_col(0, "d", T.DOUBLE),), ("d",)),
        ("key column 'd'", "DOUBLE"),
    ),
    (
        "decimal without precision",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.DECIMAL)), ("k",)),
        ("column 'm'", "precision must be in 1..38", "None"),
    ),
    (
        "decimal precision 39",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.DECIMAL, precision=39, scale=0)), ("k",)),
        ("column 'm'", "precision", "39"),
    ),
    (
        "decimal precision 0",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.DECIMAL, precision=0, scale=0)), ("k",)),
        ("column 'm'", "precision", "got 0"),
    ),
    (
        "decimal without scale",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.DECIMAL, precision=5)), ("k",)),
        ("column 'm'", "scale must be in 0..precision (5)", "None"),
    ),
    (
        "decimal scale above precision",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.DECIMAL, precision=5, scale=6)), ("k",)),
        ("column 'm'", "scale", "got 6"),
    ),
    (
        "decimal negative scale",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.DECIMAL, precision=5, scale=-1)), ("k",)),
        ("column 'm'", "scale", "got -1"),
    ),
    (
        "precision on a non-decimal",
        lambda: Schema((key_col(0, "k"), col(1, "m", T.INT32, precision=5)), ("k",)),
        ("column 'm'", "only for DECIMAL"),
    ),
    (
        "string default for an int",
        lambda: Schema((key_col(0, "k"), col(1, "n", T.INT64, default="7")), ("k",)),
        ("default value of column 'n'", "INT64", "str"),
    ),
    (
        "int8 default out of range",
        lambda: Schema((key_col(0, "k"), col(1, "n", T.INT8, default=128)), ("k",)),
        ("default value of column 'n'", "out of range for INT8"),
    ),
    (
        "bool default for an int",
        lambda: Schema((key_col(0, "k"), col(1, "n", T.INT32, default=True)), ("k",)),
        ("default value of column 'n'", "bool"),
    ),
    (
        "int default for a bool",
        lambda: Schema((key_col(0, "k"), col(1, "flag", T.BOOL, default=1)), ("k",)),
        ("default value of column 'flag'", "expected a bool"),
    ),
    (
        "bytes default for a string",
        lambda: Schema((key_col(0, "k"), col(1, "s", T.STRING, default=b"x")), ("k",)),
        ("default value of column 's'", "bytes"),
    ),
    (
        "naive datetime default for a timestamp",
        lambda: Schema(
            (key_col(0, "k"), col(1, "ts", T.TIMESTAMP, default=dt.datetime(2020, 1, 1))), ("k",)
        ),
        ("default value of column 'ts'", "naive datetime"),
    ),
    (
        "float default for a decimal",
        lambda: Schema(
            (key_col(0, "k"), col(1, "m", T.DECIMAL, default=1.5, precision=5, scale=2)), ("k",)
        ),
        ("default value of column 'm'", "decimal.Decimal"),
    ),
    (
        "decimal default with too many digits",
        lambda: Schema(
            (
                key_col(0, "k"),
                col(1, "m", T.DECIMAL, default=Decimal("1000.00"), precision=5, scale=2),
            ),
            ("k",),
        ),
        ("default value of column 'm'", "more than 5 digits"),
    ),
    (
        "decimal default with too many fraction digits",
        lambda: Schema(
            (
                key_col(0, "k"),
                col(1, "m", T.DECIMAL, default=Decimal("1.005"), precision=5, scale=2),
            ),
            ("k",),
        ),
        ("default value of column 'm'", "more than 2 digits after the point"),
    ),
    (
        "float default out of float32 range",
        lambda: Schema((key_col(0, "k"), col(1, "f", T.FLOAT, default=1e300)), ("k",)),
        ("default value of column 'f'", "out of range for FLOAT"),
    ),
    (
        "comment too long",
        lambda: Schema((key_col(0, "k"), ColumnSchema(1, "c", T.INT32, comment="x" * 257)), ("k",)),
        ("column 'c'", "comment"),
    ),
]


@pytest.mark.parametrize(
    ("make", "fragments"),
    [(m, f) for _, m, f in INVALID_SCHEMAS],
    ids=[n for n, _, _ in INVALID_SCHEMAS],
)
def test_validation_names_the_problem(
    make: Callable[[], Schema], fragments: tuple[str, ...]
) -> None:
    assert_invalid(lambda: make().validate(), *fragments)


def test_valid_defaults_are_accepted_and_canonical() -> None:
    s = Schema(
        (
            key_col(0, "k"),
            col(1, "ts", T.TIMESTAMP, default=dt.datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC)),
            col(2, "day", T.DATE, default=dt.date(1970, 1, 3)),
            col(3, "m", T.DECIMAL, default=Decimal("1.5"), precision=5, scale=2),
            col(4, "m0", T.DECIMAL, default=12, precision=5, scale=2),
            col(5, "f", T.FLOAT, default=0.1),
            col(6, "d", T.DOUBLE, default=3),
            col(7, "bin", T.BINARY, default=bytearray(b"\x00\x01")),
        ),
        ("k",),
    )
    s.validate()
    d = {c.name: c.default for c in s.columns}
    assert d["ts"] == 1_000_005
    assert d["day"] == 2
    assert isinstance(d["m"], Decimal) and d["m"].as_tuple().exponent == -2
    assert d["m"] == Decimal("1.50")
    assert d["m0"] == Decimal("12.00")
    assert d["f"] != 0.1 and abs(d["f"] - 0.1) < 1e-8  # type: ignore[operator]
    assert d["d"] == 3.0 and isinstance(d["d"], float)
    assert d["bin"] == b"\x00\x01" and isinstance(d["bin"], bytes)


def test_coerce_value_converts_exactly_or_refuses() -> None:
    ts = col(0, "ts", T.TIMESTAMP)
    tokyo = dt.timezone(dt.timedelta(hours=9))
    assert coerce_value(ts, dt.datetime(1970, 1, 1, 9, tzinfo=tokyo)) == 0
    assert coerce_value(ts, dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == -1
    assert coerce_value(col(0, "d", T.DATE), dt.date(1969, 12, 31)) == -1
    assert_invalid(lambda: coerce_value(col(0, "d", T.DATE), dt.datetime(2020, 1, 1)), "'d'")
    assert_invalid(lambda: coerce_value(col(0, "i", T.INT16), 2**15), "out of range for INT16")
    assert coerce_value(col(0, "i", T.INT16), -(2**15)) == -(2**15)
    dec = col(0, "m", T.DECIMAL, precision=38, scale=5)
    big = Decimal("123456789012345678901234567890123.45678")
    assert coerce_value(dec, big) == big  # no context rounding at 38 digits
    assert_invalid(lambda: coerce_value(dec, Decimal("NaN")), "'m'", "finite")
    assert_invalid(lambda: coerce_value(col(0, "s", T.STRING), None), "'s'", "NoneType")


def test_decimal_unscaled_round_trip() -> None:
    for text, scale, unscaled in [
        ("1.5", 2, 150),
        ("-0.01", 2, -1),
        ("0", 3, 0),
        ("1E+3", 0, 1000),
        ("-99999999999999999999999999999999999999", 0, -(10**38 - 1)),
    ]:
        assert decimal_to_unscaled(Decimal(text), scale) == unscaled
        assert unscaled_to_decimal(unscaled, scale) == Decimal(text)
        assert unscaled_to_decimal(unscaled, scale).as_tuple().exponent == -scale
    with pytest.raises(ValueError):
        decimal_to_unscaled(Decimal("0.001"), 2)


# --- Arrow -----------------------------------------------------------------------------------


def test_to_arrow_is_the_exact_mapping() -> None:
    expected = pa.schema(
        [
            pa.field("k", pa.int64(), False),
            pa.field("b", pa.bool_()),
            pa.field("i8", pa.int8()),
            pa.field("i16", pa.int16()),
            pa.field("i32", pa.int32()),
            pa.field("i64", pa.int64(), False),
            pa.field("f", pa.float32()),
            pa.field("d", pa.float64()),
            pa.field("s", pa.string()),
            pa.field("bin", pa.binary()),
            pa.field("ts", pa.timestamp("us", tz="UTC")),
            pa.field("date", pa.date32()),
            pa.field("dec", pa.decimal128(38, 10)),
            pa.field("dec2", pa.decimal128(5, 0), False),
        ]
    )
    got = every_type_schema().to_arrow()
    assert got.equals(expected)
    assert {f.name: f.nullable for f in got} == {f.name: f.nullable for f in expected}


def test_arrow_round_trip_for_every_type() -> None:
    s = every_type_schema()
    back = Schema.from_arrow(s.to_arrow(), key=["k"])
    # Defaults do not live in Arrow; everything else does.
    assert back == dataclasses.replace(
        s, columns=tuple(dataclasses.replace(c, default=None) for c in s.columns)
    )
    assert back.to_arrow().equals(s.to_arrow())


def test_arrow_data_of_every_type_fits_the_schema() -> None:
    s = every_type_schema()
    row = {
        "k": -5,
        "b": True,
        "i8": -128,
        "i16": 32767,
        "i32": -(2**31),
        "i64": 2**63 - 1,
        "f": 1.5,
        "d": -2.25,
        "s": "héllo\x00",
        "bin": b"\x00\xff",
        "ts": dt.datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=UTC),
        "date": dt.date(2024, 2, 29),
        "dec": Decimal("-1234567890123456789012345678.0123456789"),
        "dec2": Decimal(99999),
    }
    table = pa.Table.from_pylist([row], schema=s.to_arrow())
    assert table.to_pylist() == [row]
    for c in s.columns:
        assert coerce_value(c, row[c.name]) is not None


def test_from_arrow_moves_key_first_and_makes_it_not_null() -> None:
    arrow = pa.schema(
        [pa.field("v", pa.large_string()), pa.field("b", pa.int32()), pa.field("a", pa.string())]
    )
    s = Schema.from_arrow(arrow, key=["a", "b"])
    assert s.column_names == ("a", "b", "v")
    assert [c.nullable for c in s.columns] == [False, False, True]
    assert s.column("v").type is T.STRING
    tokyo = Schema.from_arrow(pa.schema([pa.field("t", pa.timestamp("us", "Asia/Tokyo"))]), "t")
    assert tokyo.column("t").type is T.TIMESTAMP


@pytest.mark.parametrize(
    ("arrow_type", "fragment"),
    [
        (pa.uint8(), "uint8"),
        (pa.timestamp("us"), "timestamp('us', tz='UTC')"),
        (pa.timestamp("ns", tz="UTC"), "timestamp('us', tz='UTC')"),
        (pa.date64(), "date64"),
        (pa.list_(pa.int32()), "list"),
        (pa.decimal256(40, 2), "decimal256"),
    ],
)
def test_from_arrow_refuses_unmapped_types(arrow_type: pa.DataType, fragment: str) -> None:
    arrow = pa.schema([pa.field("k", pa.int64()), pa.field("odd", arrow_type)])
    assert_invalid(lambda: Schema.from_arrow(arrow, "k"), "column 'odd'", fragment)


def test_from_arrow_refuses_a_missing_or_invalid_key() -> None:
    arrow = pa.schema([pa.field("k", pa.int64()), pa.field("f", pa.float64())])
    assert_invalid(lambda: Schema.from_arrow(arrow, "nope"), "key column 'nope'")
    assert_invalid(lambda: Schema.from_arrow(arrow, "f"), "key column 'f'", "DOUBLE")


# --- alter -----------------------------------------------------------------------------------


def base() -> Schema:
    return Schema.build([("id", T.INT64), ("a", T.STRING), ("b", T.INT32)], key="id")


def test_rename_keeps_the_id_and_follows_into_the_key() -> None:
    s = base()
    s2 = s.apply([RenameColumn("a", "alpha"), RenameColumn("id", "pk")])
    assert s2.column("alpha").id == s.column("a").id
    assert s2.key == ("pk",)
    assert s2.column("pk").id == 0
    assert s2.version == s.version + 1
    assert s.column("a").name == "a"  # the original is untouched
    assert s2.renames_from(s) == {"a": "alpha", "id": "pk"}


def test_dropped_ids_are_never_reused() -> None:
    s = base()
    s1 = s.apply([DropColumn("b")])
    assert s1.next_column_id == 3
    s2 = s1.apply([AddColumn("b", T.INT32)])
    assert s2.column("b").id == 3
    s3 = s2.apply([DropColumn("b"), AddColumn("b", T.STRING), AddColumn("c", T.INT8)])
    assert (s3.column("b").id, s3.column("c").id) == (4, 5)
    assert s3.next_column_id == 6
    assert [x.version for x in (s, s1, s2, s3)] == [0, 1, 2, 3]
    # Dropping the highest id keeps the high-water mark.
    s4 = s3.apply([DropColumn("c")])
    assert s4.next_column_id == 6
    assert s4.apply([AddColumn("d", T.INT8)]).column("d").id == 6


def test_add_not_null_with_default() -> None:
    s = base().apply([AddColumn("n", T.INT64, nullable=False, default=0, comment="count")])
    c = s.column("n")
    assert (c.nullable, c.default, c.comment, c.id) == (False, 0, "count", 3)


ALTER_ERRORS: list[tuple[str, list[AlterOp], tuple[str, ...]]] = [
    ("drop key column", [DropColumn("id")], ("cannot drop key column 'id'",)),
    ("drop unknown column", [DropColumn("zz")], ("'zz'", "unknown column")),
    ("rename unknown column", [RenameColumn("zz", "y")], ("'zz'", "unknown column")),
    ("rename to existing", [RenameColumn("a", "b")], ("'a' to 'b'", "'b' already exists")),
    ("rename key to existing", [RenameColumn("id", "a")], ("'id' to 'a'", "already exists")),
    ("rename to itself", [RenameColumn("a", "a")], ("'a' already exists",)),
    ("add existing", [AddColumn("a", T.INT8)], ("cannot add column 'a'", "already exists")),
    (
        "add not null without default",
        [AddColumn("n", T.INT8, nullable=False)],
        ("NOT NULL column 'n'", "without a default"),
    ),
    (
        "add with a default of the wrong type",
        [AddColumn("n", T.INT8, default="x")],
        ("default value of column 'n'",),
    ),
    (
        "add a bad decimal",
        [AddColumn("m", T.DECIMAL, precision=50, scale=1)],
        ("column 'm'", "precision"),
    ),
    ("add an empty name", [AddColumn("", T.INT8)], ("name is empty",)),
    (
        "conflict created earlier in the same alter",
        [RenameColumn("a", "x"), AddColumn("x", T.INT8)],
        ("cannot add column 'x'",),
    ),
    ("no operations", [], ("no operations",)),
    (
        "too many columns",
        [AddColumn(f"c{i}", T.INT8) for i in range(MAX_COLUMNS)],
        ("MAX_COLUMNS 300",),
    ),
]


@pytest.mark.parametrize(
    ("ops", "fragments"), [(o, f) for _, o, f in ALTER_ERRORS], ids=[n for n, _, _ in ALTER_ERRORS]
)
def test_alter_refusals_name_the_column(ops: list[AlterOp], fragments: tuple[str, ...]) -> None:
    assert_invalid(lambda: base().apply(ops), *fragments)


def test_ops_apply_in_order() -> None:
    s = base().apply([DropColumn("a"), RenameColumn("b", "a"), AddColumn("b", T.STRING)])
    assert s.column_names == ("id", "a", "b")
    assert (s.column("a").id, s.column("a").type) == (2, T.INT32)
    assert s.column("b").id == 3


def test_next_column_id_is_at_least_max_id_plus_one() -> None:
    s = Schema((key_col(5, "k"),), ("k",))
    assert s.next_column_id == 6
    assert Schema((key_col(5, "k"),), ("k",), next_column_id=9).next_column_id == 9


# --- protobuf --------------------------------------------------------------------------------


def with_defaults() -> Schema:
    return Schema.build(
        [
            ("k", T.INT64),
            AddColumn("b", T.BOOL, default=False),
            AddColumn("i8", T.INT8, default=-128),
            AddColumn("i16", T.INT16, default=-2),
            AddColumn("i32", T.INT32, default=2**31 - 1),
            AddColumn("i64", T.INT64, False, default=-(2**63), comment="min"),
            AddColumn("f", T.FLOAT, default=0.1),
            AddColumn("d", T.DOUBLE, default=-0.5),
            AddColumn("s", T.STRING, default=""),
            AddColumn("s2", T.STRING, default="ünï\x00"),
            AddColumn("bin", T.BINARY, default=b"\x00\xff"),
            AddColumn("ts", T.TIMESTAMP, default=-1),
            AddColumn("date", T.DATE, default=dt.date(2000, 1, 1)),
            AddColumn("dec", T.DECIMAL, default=Decimal("-1.25"), precision=38, scale=2),
            ("none", T.STRING),
        ],
        key="k",
        version=7,
    )


def test_schema_protobuf_round_trip_with_every_default() -> None:
    s = with_defaults().apply([DropColumn("none")])
    p = schema_to_pb(s)
    assert p.next_column_id == 15 and p.version == 8
    back = schema_from_pb(pb.SchemaPB.FromString(p.SerializeToString()))
    assert back == s
    assert back.column("s").default == ""  # presence: an empty default is a default
    assert not p.columns[0].HasField("default_value")


def test_every_column_type_has_a_wire_value() -> None:
    values = set()
    for t in ColumnType:
        c = ColumnSchema(
            0, "c", t, precision=5 if t is T.DECIMAL else None, scale=0 if t is T.DECIMAL else None
        )
        values.add(column_to_pb(c).type)
        assert column_type_from_pb(column_to_pb(c).type) is t
    assert len(values) == len(ColumnType)


def test_cells_round_trip() -> None:
    s = with_defaults()
    for c in s.columns:
        if c.default is not None:
            assert decode_cell(c, encode_cell(c, c.default)) == c.default
    assert encode_cell(s.column("i16"), -2) == b"\xfe\xff"  # little-endian, as documented
    assert encode_cell(s.column("dec"), Decimal("-0.01")) == b"\xff" * 16


def good_pb() -> pb.SchemaPB:
    return schema_to_pb(with_defaults())


def mutate(fn: Callable[[pb.SchemaPB], object]) -> pb.SchemaPB:
    p = good_pb()
    fn(p)
    return p


def _decimal_too_wide(p: pb.SchemaPB) -> None:
    p.columns[13].precision = 2
    p.columns[13].default_value = (12345).to_bytes(16, "little", signed=True)


WIRE_ERRORS: list[tuple[str, Callable[[pb.SchemaPB], object], tuple[str, ...]]] = [
    ("no columns", lambda p: p.ClearField("columns"), ("schema.columns: missing",)),
    ("no key", lambda p: p.ClearField("key_column_names"), ("schema.key_column_names: missing",)),
    (
        "unknown enum value",
        lambda p: setattr(p.columns[2], "type", 99),
        ("schema.columns[2].type: unknown column type 99",),
    ),
    (
        "type unset",
        lambda p: setattr(p.columns[1], "type", 0),
        ("schema.columns[1].type: missing",),
    ),
    (
        "name unset",
        lambda p: setattr(p.columns[3], "name", ""),
        ("schema.columns[3].name: missing",),
    ),
    (
        "default of the wrong size",
        lambda p: setattr(p.columns[4], "default_value", b"\x00"),
        ("schema.columns[4].default_value", "expected 4 bytes for INT32, got 1"),
    ),
    (
        "bool default not 0/1",
        lambda p: setattr(p.columns[1], "default_value", b"\x02"),
        ("schema.columns[1].default_value", "BOOL"),
    ),
    (
        "string default not utf-8",
        lambda p: setattr(p.columns[8], "default_value", b"\xff"),
        ("schema.columns[8].default_value", "UTF-8"),
    ),
    (
        "decimal without precision",
        lambda p: p.columns[13].ClearField("precision"),
        ("schema.columns[13]", "column 'dec'", "precision"),
    ),
    (
        "decimal default too wide for its precision",
        _decimal_too_wide,
        ("schema.columns[13].default_value", "more than 2 digits"),
    ),
    (
        "nullable key",
        lambda p: setattr(p.columns[0], "nullable", True),
        ("schema:", "key column 'k' must not be nullable"),
    ),
    (
        "key names an unknown column",
        lambda p: p.key_column_names.append("ghost"),
        ("schema:", "key column 'ghost'"),
    ),
    (
        "duplicate ids",
        lambda p: setattr(p.columns[2], "id", 1),
        ("schema:", "duplicate column id 1"),
    ),
]


@pytest.mark.parametrize(
    ("fn", "fragments"), [(f, x) for _, f, x in WIRE_ERRORS], ids=[n for n, _, _ in WIRE_ERRORS]
)
def test_wire_input_is_validated_naming_the_field(
    fn: Callable[[pb.SchemaPB], object], fragments: tuple[str, ...]
) -> None:
    assert_invalid(lambda: schema_from_pb(mutate(fn)), *fragments)
