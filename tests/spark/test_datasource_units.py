"""Pure parts of the DataSource: options, filter translation, write-schema checks. No JVM:
pyspark's datasource and types modules are plain Python."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    In,
    IsNull,
    Not,
    StringContains,
    StringStartsWith,
)
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from service.client.meta_cache import TableInfo
from service.common.errors import InvalidArgument
from service.common.partition import PartitionSchema
from service.common.schema import ColumnType, Schema
from service.tserver.predicates import ColumnPredicate
from spark_jobs.datasource import ReadOptions, check_write_schema, spark_schema, to_predicate

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("n", ColumnType.INT32), ("s", ColumnType.STRING)], key="id"
)
INFO = TableInfo("tid", "t", SCHEMA, PartitionSchema(), 3)


def test_options_parse_with_defaults_and_refuse_unknown_ones() -> None:
    o = ReadOptions.parse({"masters": "a:1, b:2", "table": "t", "Replica_Selection": "closest"})
    assert o.masters == ("a:1", "b:2") and o.replica_selection == "closest"
    assert (o.fault_tolerant, o.operation, o.row_errors, o.truncate) == (
        True,
        "upsert",
        "fail",
        False,
    )
    with pytest.raises(InvalidArgument, match="unknown option 'colour'"):
        ReadOptions.parse({"masters": "a:1", "table": "t", "colour": "red"})
    with pytest.raises(InvalidArgument, match="'masters' is required"):
        ReadOptions.parse({"table": "t"})
    with pytest.raises(InvalidArgument, match="'operation'"):
        ReadOptions.parse({"masters": "a:1", "table": "t", "operation": "merge"})
    with pytest.raises(InvalidArgument, match="'fault_tolerant'"):
        ReadOptions.parse({"masters": "a:1", "table": "t", "fault_tolerant": "maybe"})
    with pytest.raises(InvalidArgument, match="'batch_size_bytes'"):
        ReadOptions.parse({"masters": "a:1", "table": "t", "batch_size_bytes": "-1"})


def test_filters_translate_exactly_or_stay_with_spark() -> None:
    assert to_predicate(EqualTo(("id",), 5)) == ColumnPredicate("id", "EQ", (5,))
    assert to_predicate(GreaterThan(("n",), 1)) == ColumnPredicate("n", "GT", (1,))
    assert to_predicate(In(("id",), (1, 2))) == ColumnPredicate("id", "IN", (1, 2))
    assert to_predicate(IsNull(("s",))) == ColumnPredicate("s", "IS_NULL")
    assert to_predicate(StringStartsWith(("s",), "ab")) == ColumnPredicate("s", "PREFIX", ("ab",))
    # Not expressible exactly: left to Spark.
    assert to_predicate(Not(EqualTo(("id",), 5))) is None
    assert to_predicate(EqualNullSafe(("id",), 5)) is None
    assert to_predicate(StringContains(("s",), "x")) is None
    assert to_predicate(EqualTo(("a", "b"), 1)) is None  # a nested field
    assert to_predicate(In(("id",), (1, None))) is None


def test_spark_schema_and_write_schema_checks() -> None:
    st = spark_schema(SCHEMA)
    assert [(f.name, f.dataType, f.nullable) for f in st.fields] == [
        ("id", LongType(), False),
        ("n", IntegerType(), True),
        ("s", StringType(), True),
    ]
    check_write_schema(
        INFO, StructType([StructField("id", LongType()), StructField("n", LongType())]), "upsert"
    )
    with pytest.raises(InvalidArgument, match=r"'n'.*string.*INT32"):
        check_write_schema(
            INFO,
            StructType([StructField("id", LongType()), StructField("n", StringType())]),
            "upsert",
        )
    with pytest.raises(InvalidArgument, match="not in table 't'"):
        check_write_schema(
            INFO,
            StructType([StructField("id", LongType()), StructField("x", LongType())]),
            "upsert",
        )
    with pytest.raises(InvalidArgument, match="no column 'id'"):
        check_write_schema(INFO, StructType([StructField("n", IntegerType())]), "delete")
