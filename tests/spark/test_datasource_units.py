"""Pure parts of the DataSource: options, the `where` option, write-schema checks. No JVM:
pyspark's datasource and types modules are plain Python."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from service.client.meta_cache import TableHandle
from service.common.errors import InvalidArgument
from service.common.partition import PartitionSchema
from service.common.pki import ClusterPki
from service.common.predicates import ColumnPredicate
from service.common.schema import ColumnType, Schema
from spark_jobs.datasource import (
    ReadOptions,
    TabletPartition,
    TesseraReader,
    _split_and,
    arrow_target,
    check_write_schema,
    parse_where_option,
    spark_schema,
)

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("n", ColumnType.INT32), ("s", ColumnType.STRING)], key="id"
)
INFO = TableHandle("tid", "t", SCHEMA, PartitionSchema(), 3)


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


def test_where_option_parses_to_exact_predicates() -> None:
    assert parse_where_option(SCHEMA, "id = 5") == (ColumnPredicate("id", "EQ", (5,)),)
    assert parse_where_option(SCHEMA, "id >= 2 AND s startswith 'a and b' and n in (1, 2)") == (
        ColumnPredicate("id", "GE", (2,)),
        ColumnPredicate("s", "PREFIX", ("a and b",)),
        ColumnPredicate("n", "IN", (1, 2)),
    )
    assert parse_where_option(SCHEMA, "s is null") == (ColumnPredicate("s", "IS_NULL"),)
    assert parse_where_option(SCHEMA, "s like 'ab%'") == (ColumnPredicate("s", "PREFIX", ("ab",)),)
    assert parse_where_option(SCHEMA, "s = '>5'") == (ColumnPredicate("s", "EQ", (">5",)),)
    assert _split_and("a = 'x AND y' AND band = 1") == ["a = 'x AND y'", "band = 1"]
    for bad, match in [
        ("id = ", "a value is missing|expected COL OP VALUE"),
        ("zz = 1", "unknown column 'zz'"),
        ("id != 1", "do not evaluate !="),
        ("s like 'a_b%'", "not a plain prefix"),
        ("n = 99999999999", "option 'where'|out of range|INT32"),
        ("  ", "no condition"),
        ("n >>= 5", "unknown operator '>>='"),
        ("n =< 5", "unknown operator '=<'"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            parse_where_option(SCHEMA, bad)


def test_reader_has_no_filter_state_spark_could_reuse() -> None:
    """Spark 4.2 reuses a pushed-down read plan across scans of one DataFrame: the reader must
    not take Spark's filters (datasource.py says why)."""
    from pyspark.sql.datasource import DataSourceReader

    assert TesseraReader.pushFilters is DataSourceReader.pushFilters
    o = ReadOptions.parse({"masters": "a:1", "table": "t", "where": "id > 3"})
    assert o.where == "id > 3"
    assert ReadOptions.parse({"masters": "a:1", "table": "t", "where": " "}).where is None


def test_arrow_target_takes_the_declared_nullability() -> None:
    import pyarrow as pa

    sent = pa.schema([pa.field("id", pa.int64(), False), pa.field("ts", pa.timestamp("us"), False)])
    got = arrow_target(sent, {"id": False, "ts": True})
    assert got == pa.schema(
        [pa.field("id", pa.int64(), False), pa.field("ts", pa.timestamp("us", tz="UTC"), True)]
    )
    nn = Schema.build(
        [("id", ColumnType.INT64), ("n", ColumnType.INT32, False), ("s", ColumnType.STRING)],
        key="id",
    )
    assert [f.nullable for f in spark_schema(nn).fields] == [False, False, True]


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


def test_credentials_travel_inside_tasks_and_are_never_printed(tmp_path: Path) -> None:
    pki = ClusterPki(tmp_path / "pki")
    creds_dir = tmp_path / "alice"
    pki.export("user", "alice", creds_dir)
    opts = ReadOptions.parse(
        {"masters": "h:1", "table": "t", "credentials": str(creds_dir)}
    ).with_shipped_credentials()
    key = (creds_dir / "key.pem").read_bytes()
    assert opts.shipped is not None
    part = TabletPartition(b"token", "tablet-1", opts.shipped)
    for text in (repr(opts), repr(part), str(part)):
        assert b"PRIVATE KEY" not in text.encode() and "token" not in text.replace("tablet", "")
    # What an executor unpickles is enough to connect without the directory.
    shutil.rmtree(creds_dir)
    loaded = pickle.loads(pickle.dumps(part)).credentials.load()
    assert loaded.key_pem == key and (loaded.identity.role, loaded.identity.name) == (
        "user",
        "alice",
    )


def test_the_connect_server_command_takes_its_options() -> None:
    """`tessera spark connect-server --port N` parses (it used to be refused as "unrecognized
    arguments: --port"), and hands spark_jobs.connect what it was given."""
    import argparse

    from spark_jobs import cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="command"))
    args = p.parse_args(["spark", "connect-server", "--port", "15992", "--metastore", "/tmp/ms"])
    assert (args.port, args.warehouse, args.metastore) == (15992, None, "/tmp/ms")
    assert p.parse_args(["spark", "connect-server"]).port == 15002
    args = p.parse_args(["jobs", "run", "orphan_sweep", "--masters", "h:1", "--apply"])
    assert (args.job, args.job_args) == ("orphan_sweep", ["--masters", "h:1", "--apply"])
