"""The "tessera" DataSource across the matrix users hit, with real Spark on a real local cluster.

* Every column type as a key column, and every type as a non-key column both nullable and
  NOT NULL, through read, write and SQL. Spark compares each batch a Python source yields with
  the declared schema, nullability included: a NOT NULL non-key column once made every read of
  its table fail.
* Reused DataFrames and views. Spark 4.2 keeps a pushed-down read plan on the data source object
  that every scan of one DataFrame shares; a source that pushed filters returned the previous
  query's rows (count, count where id = 5, count gave 60000, 1, 1) and a read-then-write copied
  10 of 60,000 rows. Each sequence runs with Python filter pushdown on and off.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from tests.spark.conftest import masters, read

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

N = 600
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"

# Every type a key may have, in one composite key.
KEY_TYPES = [
    ("k_i64", ColumnType.INT64),
    ("k_i8", ColumnType.INT8),
    ("k_i16", ColumnType.INT16),
    ("k_i32", ColumnType.INT32),
    ("k_s", ColumnType.STRING),
    ("k_bin", ColumnType.BINARY),
    ("k_ts", ColumnType.TIMESTAMP),
    ("k_day", ColumnType.DATE),
]
VALUE_TYPES = [
    ("b", ColumnType.BOOL),
    ("i8", ColumnType.INT8),
    ("i16", ColumnType.INT16),
    ("i32", ColumnType.INT32),
    ("i64", ColumnType.INT64),
    ("f", ColumnType.FLOAT),
    ("d", ColumnType.DOUBLE),
    ("s", ColumnType.STRING),
    ("bin", ColumnType.BINARY),
    ("ts", ColumnType.TIMESTAMP),
    ("day", ColumnType.DATE),
    ("dec", ColumnType.DECIMAL),
]


def _column(name: str, ctype: ColumnType, nullable: bool) -> AddColumn:
    if ctype is ColumnType.DECIMAL:
        return AddColumn(name, ctype, nullable=nullable, precision=12, scale=3)
    return AddColumn(name, ctype, nullable=nullable)


MATRIX = Schema.build(
    [_column(n, t, False) for n, t in KEY_TYPES]
    + [_column("k_dec", ColumnType.DECIMAL, False)]
    + [_column(f"nn_{n}", t, False) for n, t in VALUE_TYPES]
    + [_column(f"n_{n}", t, True) for n, t in VALUE_TYPES],
    key=[n for n, _ in KEY_TYPES] + ["k_dec"],
)


def _value(ctype: ColumnType, i: int) -> object:
    utc = dt.UTC
    return {
        ColumnType.BOOL: i % 3 == 0,
        ColumnType.INT8: i % 256 - 128,
        ColumnType.INT16: i * 7 % 65536 - 32768,
        ColumnType.INT32: i * 1_000_003 % 2**31,
        ColumnType.INT64: i * 10**12 - 5,
        ColumnType.FLOAT: i / 8,
        ColumnType.DOUBLE: i * 1.5 - 100,
        ColumnType.STRING: f"x{i % 97}-é",
        ColumnType.BINARY: bytes([i % 256, 0, 255]),
        ColumnType.TIMESTAMP: dt.datetime(2024, 1, 1, tzinfo=utc) + dt.timedelta(seconds=i),
        ColumnType.DATE: dt.date(2000, 1, 1) + dt.timedelta(days=i % 5000),
        ColumnType.DECIMAL: decimal.Decimal(i * 1001) / 1000,
    }[ctype]


def matrix_rows(n: int) -> pa.Table:
    cols: dict[str, list[object]] = {}
    for c in MATRIX.columns:
        if c.name == "k_i64":
            cols[c.name] = list(range(n))  # the row number: the tests filter on it
        elif c.name.startswith("k_"):
            cols[c.name] = [_value(c.type, i) for i in range(n)]
        elif c.name.startswith("nn_"):
            cols[c.name] = [_value(c.type, i + 1) for i in range(n)]
        else:
            cols[c.name] = [None if i % 7 == 2 else _value(c.type, i + 2) for i in range(n)]
    return pa.Table.from_pydict(cols, schema=MATRIX.to_arrow())


def normalized(t: pa.Table) -> pa.Table:
    """Sorted by key, timestamps in UTC microseconds, the schema's own nullability."""
    t = t.select(list(MATRIX.column_names)).sort_by("k_i64")
    return t.cast(MATRIX.to_arrow())


def _partitioning() -> PartitionSchema:
    return PartitionSchema(
        hash=(HashBucketSchema(("k_i64",), 2),),
        range=RangeSchema(("k_i64",)),
        split_rows=((N // 2,),),
    )


@pytest.fixture(scope="module")
def matrix(client: SyncClient) -> pa.Table:
    client.call("create_table", "matrix", MATRIX, _partitioning(), num_replicas=3)
    rows = matrix_rows(N)
    r = client.write("matrix", rows, "insert")
    assert (r.rows_applied, r.errors) == (N, [])
    return rows


def write(df: DataFrame, cluster: MiniCluster, table: str, operation: str = "insert") -> None:
    df.write.format("tessera").option("masters", masters(cluster)).option(
        "credentials", cluster.credentials_dir()
    ).option("table", table).option("operation", operation).mode("append").save()


def scan_all(client: SyncClient, table: str) -> pa.Table:
    batches = [b for tok in client.scan_tokens(table) for b in client.scan_batches(tok)]
    return pa.Table.from_batches(batches)


# --- every type, nullable and NOT NULL, key and non-key ---------------------------------------


def test_every_type_nullable_and_not_null_reads_with_its_own_nullability(
    spark: SparkSession, cluster: MiniCluster, matrix: pa.Table
) -> None:
    df = read(spark, cluster, "matrix")
    for c in MATRIX.columns:
        assert df.schema[c.name].nullable is c.nullable, c.name
    assert df.rdd.getNumPartitions() == 4
    assert normalized(df.toArrow()).equals(normalized(matrix))
    # A projection of NOT NULL columns only, and of nullable ones only.
    nn = [c.name for c in MATRIX.columns if c.name.startswith("nn_")]
    got = read(spark, cluster, "matrix", columns=",".join(["k_i64", *nn])).toArrow()
    assert (
        got.sort_by("k_i64")
        .select(nn)
        .equals(
            normalized(matrix)
            .select(nn)
            .cast(pa.schema([f for f in MATRIX.to_arrow() if f.name in nn]))
        )
    )


def test_sql_over_not_null_columns_matches_pyarrow(
    spark: SparkSession, cluster: MiniCluster, matrix: pa.Table
) -> None:
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW matrix USING tessera "
        f"OPTIONS (masters '{masters(cluster)}', "
        f"credentials '{cluster.credentials_dir()}', table 'matrix')"
    )
    t = matrix
    row = spark.sql(
        "SELECT count(*) n, sum(nn_i32) s, count(n_i32) c, min(nn_day) d, "
        "max(unix_micros(k_ts)) ts, "
        "sum(nn_dec) dec FROM matrix WHERE nn_s LIKE 'x1%' AND k_i16 < 30000"
    ).collect()[0]
    mask = pc.and_(pc.starts_with(t["nn_s"], "x1"), pc.less(t["k_i16"], 30000))
    f = t.filter(mask)
    assert row.n == f.num_rows > 0
    assert row.s == pc.sum(f["nn_i32"]).as_py()
    assert row.c == pc.count(f["n_i32"]).as_py()
    assert row.d == pc.min(f["nn_day"]).as_py()
    assert row.dec == pc.sum(f["nn_dec"]).as_py()
    assert row.ts == pc.max(f["k_ts"].cast(pa.int64())).as_py()


def test_write_into_not_null_columns(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, matrix: pa.Table
) -> None:
    # A DataFrame read from the table (NOT NULL columns declared so) written into a copy.
    client.call("create_table", "matrix_copy", MATRIX, _partitioning(), num_replicas=3)
    write(read(spark, cluster, "matrix"), cluster, "matrix_copy")
    assert normalized(scan_all(client, "matrix_copy")).equals(normalized(matrix))

    # A Spark-built DataFrame: its columns are nullable in Spark's eyes, the values are not.
    small = Schema.build(
        [
            ("id", ColumnType.INT64),
            ("nn_s", ColumnType.STRING, False),
            ("nn_d", ColumnType.DOUBLE, False),
            ("n_i", ColumnType.INT32, True),
        ],
        key="id",
    )
    client.call("create_table", "nn_small", small, PartitionSchema(range=RangeSchema(("id",))))
    src = spark.range(50).selectExpr(
        "id",
        "concat('v', cast(id as string)) as nn_s",
        "cast(id as double) / 2 as nn_d",
        "CASE WHEN id % 3 = 0 THEN NULL ELSE cast(id as int) END as n_i",
    )
    write(src, cluster, "nn_small")
    got = read(spark, cluster, "nn_small")
    assert got.schema["nn_s"].nullable is False and got.schema["n_i"].nullable is True
    assert got.count() == 50
    assert got.filter("n_i IS NULL").count() == 17
    # A NULL into a NOT NULL column is refused, naming the column; nothing of it is written.
    bad = spark.range(100, 103).selectExpr("id", "CAST(NULL AS string) as nn_s", "1.0 as nn_d")
    with pytest.raises(Exception, match="nn_s"):
        write(bad, cluster, "nn_small")
    assert read(spark, cluster, "nn_small").filter("id >= 100").count() == 0


# --- reused DataFrames and views: no filter leaks into a later query ---------------------------


@pytest.fixture(params=["true", "false"], ids=["pushdown-on", "pushdown-off"])
def pushdown(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    before = spark.conf.get(PUSHDOWN)
    spark.conf.set(PUSHDOWN, request.param)
    try:
        yield request.param
    finally:
        spark.conf.set(PUSHDOWN, before)


def test_reused_dataframe_counts_stay_exact(
    spark: SparkSession, cluster: MiniCluster, matrix: pa.Table, pushdown: str
) -> None:
    df = read(spark, cluster, "matrix")
    assert df.count() == N
    assert df.where("k_i64 = 5").count() == 1
    assert df.count() == N
    assert df.where("k_i64 < 10 AND nn_i64 >= 0").count() == 10
    assert df.where("nn_s LIKE '%-é'").count() == N  # a filter Spark cannot hand to Python
    assert df.count() == N
    assert df.where("k_i64 >= 100").count() == N - 100
    assert len(df.collect()) == N


def test_reused_view_counts_stay_exact(
    spark: SparkSession, cluster: MiniCluster, matrix: pa.Table, pushdown: str
) -> None:
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW matrix_reuse USING tessera "
        f"OPTIONS (masters '{masters(cluster)}', "
        f"credentials '{cluster.credentials_dir()}', table 'matrix')"
    )
    count = "SELECT count(*) FROM matrix_reuse"
    assert spark.sql(count).collect()[0][0] == N
    assert spark.sql(count + " WHERE k_i64 = 5").collect()[0][0] == 1
    assert spark.sql(count).collect()[0][0] == N
    assert spark.sql(count + " WHERE k_i64 IN (1, 2, 3)").collect()[0][0] == 3
    assert spark.table("matrix_reuse").count() == N


def test_read_then_write_copies_every_row(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, matrix: pa.Table, pushdown: str
) -> None:
    """The README's pattern: look at a few filtered rows, then write the whole DataFrame."""
    table = f"matrix_rw_{pushdown}"
    client.call("create_table", table, MATRIX, _partitioning(), num_replicas=3)
    df = read(spark, cluster, "matrix")
    df.filter("k_i64 < 10 AND nn_i64 >= 0").show(3)
    assert df.filter("k_i64 < 10").count() == 10
    write(df, cluster, table)
    assert scan_all(client, table).num_rows == N


def test_cached_dataframe_reuse(
    spark: SparkSession, cluster: MiniCluster, matrix: pa.Table, pushdown: str
) -> None:
    df = read(spark, cluster, "matrix")
    assert df.where("k_i64 = 7").count() == 1  # a filtered query before the cache is filled
    cached = df.cache()
    try:
        assert cached.count() == N
        assert cached.where("k_i64 = 5").count() == 1
        assert cached.count() == N
    finally:
        cached.unpersist()
    assert df.count() == N


def test_a_catalog_table_is_refused_at_create_pointing_to_views(
    spark: SparkSession, cluster: MiniCluster
) -> None:
    with pytest.raises(Exception, match="CREATE TEMPORARY VIEW") as e:
        spark.sql(
            f"CREATE TABLE cat_t USING tessera OPTIONS (masters '{masters(cluster)}', "
            f"credentials '{cluster.credentials_dir()}', table 'typed')"
        )
    assert "catalog table" in str(e.value)
    assert not spark.catalog.tableExists("cat_t")
