"""The "tessera" DataSource with real Spark against a real local cluster.

One MiniCluster (3 masters, 3 tablet servers) serves the module. The Spark session is started
before any client exists in this process: a JVM launched (forked) while gRPC threads run in the
parent fails to start.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import re
import urllib.request
from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.client import ColumnPredicate
from service.client.sync import SyncClient
from service.common import failpoints
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from spark_jobs.datasource import register_views
from tests.spark.conftest import masters, read

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

ALL_TYPES = Schema.build(
    [
        ("id", ColumnType.INT64),
        ("b", ColumnType.BOOL),
        ("i8", ColumnType.INT8),
        ("i16", ColumnType.INT16),
        ("i32", ColumnType.INT32),
        ("f", ColumnType.FLOAT),
        ("d", ColumnType.DOUBLE),
        ("s", ColumnType.STRING),
        ("bin", ColumnType.BINARY),
        ("ts", ColumnType.TIMESTAMP),
        ("day", ColumnType.DATE),
        AddColumn("dec", ColumnType.DECIMAL, precision=12, scale=3),
    ],
    key="id",
)
N = 3_000


def all_types_rows(n: int) -> pa.Table:
    def nul(i: int, v: object) -> object:
        return None if i % 11 == 3 else v

    ids = range(n)
    utc = dt.UTC
    cols = {
        "id": [i for i in ids],
        "b": [nul(i, i % 3 == 0) for i in ids],
        "i8": [nul(i, i % 256 - 128) for i in ids],
        "i16": [nul(i, i * 7 % 65536 - 32768) for i in ids],
        "i32": [nul(i, i * 1_000_003 % 2**31) for i in ids],
        "f": [nul(i, i / 8) for i in ids],
        "d": [nul(i, i * 1.5 - 1000) for i in ids],
        "s": [nul(i, f"s{i % 97}-é") for i in ids],
        "bin": [nul(i, bytes([i % 256, 0, 255])) for i in ids],
        "ts": [nul(i, dt.datetime(2024, 1, 1, tzinfo=utc) + dt.timedelta(seconds=i)) for i in ids],
        "day": [nul(i, dt.date(2000, 1, 1) + dt.timedelta(days=i % 5000)) for i in ids],
        "dec": [nul(i, decimal.Decimal(i * 1001) / 1000) for i in ids],
    }
    return pa.Table.from_pydict(cols, schema=ALL_TYPES.to_arrow())


@pytest.fixture(scope="module")
def typed_table(client: SyncClient) -> pa.Table:
    ps = PartitionSchema(
        hash=(HashBucketSchema(("id",), 2),), range=RangeSchema(("id",)), split_rows=((1500,),)
    )
    client.call("create_table", "typed", ALL_TYPES, ps, num_replicas=3)
    rows = all_types_rows(N)
    r = client.write("typed", rows, "insert")
    assert (r.rows_applied, r.errors) == (N, [])
    return rows


def by_id(t: pa.Table) -> pa.Table:
    t = t.sort_by("id")
    return t.cast(pa.schema([f.with_nullable(True) for f in t.schema]))


def test_every_type_round_trips(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, typed_table: pa.Table
) -> None:
    df = read(spark, cluster, "typed")
    assert [f.name for f in df.schema.fields] == list(ALL_TYPES.column_names)
    assert df.schema["id"].nullable is False and df.schema["s"].nullable is True
    assert df.rdd.getNumPartitions() == 4  # one per tablet
    got = df.toArrow()
    assert by_id(got).equals(by_id(typed_table)), "read differs"

    # Write the DataFrame back through Spark into a second table: identical rows.
    client.call(
        "create_table", "typed_copy", ALL_TYPES, PartitionSchema(range=RangeSchema(("id",)))
    )
    df.write.format("tessera").option("masters", masters(cluster)).option(
        "credentials", cluster.credentials_dir()
    ).option("table", "typed_copy").option("operation", "insert").mode("append").save()
    (tok,) = client.scan_tokens("typed_copy")
    copied = pa.Table.from_batches(list(client.scan_batches(tok)))
    assert by_id(copied).equals(by_id(typed_table)), "write differs"


def test_aggregates_nulls_and_filters_match_pyarrow(
    spark: SparkSession, cluster: MiniCluster, typed_table: pa.Table
) -> None:
    read(spark, cluster, "typed").createOrReplaceTempView("typed")
    t = typed_table
    row = spark.sql(
        "SELECT count(*) n, sum(i32) s32, sum(d) sd, count(s) ns, "
        "sum(CASE WHEN b IS NULL THEN 1 ELSE 0 END) nb FROM typed"
    ).collect()[0]
    assert row.n == t.num_rows
    assert row.s32 == pc.sum(t["i32"]).as_py()
    assert row.sd == pytest.approx(pc.sum(t["d"]).as_py())
    assert row.ns == pc.count(t["s"]).as_py()
    assert row.nb == t["b"].null_count

    cases = {
        "id >= 100 AND id < 200": pc.and_(pc.greater_equal(t["id"], 100), pc.less(t["id"], 200)),
        "id IN (5, 7, 2999)": pc.is_in(t["id"], pa.array([5, 7, 2999])),
        "s IS NULL": pc.is_null(t["s"]),
        "s LIKE 's1%'": pc.starts_with(t["s"], "s1"),
        "i8 > 100 AND d < 0": pc.and_(pc.greater(t["i8"], 100), pc.less(t["d"], 0)),
        "ts >= TIMESTAMP '2024-01-01 00:10:00 UTC'": pc.greater_equal(
            t["ts"], pa.scalar(dt.datetime(2024, 1, 1, 0, 10, tzinfo=dt.UTC))
        ),
        "dec < 10.5": pc.less(t["dec"], pa.scalar(decimal.Decimal("10.5"))),
        "NOT (id > 10)": pc.invert(pc.greater(t["id"], 10)),
    }
    for where, mask in cases.items():
        got = spark.sql(f"SELECT id FROM typed WHERE {where}").toArrow()
        want = t.filter(pc.fill_null(mask, False)).select(["id"])
        assert sorted(got["id"].to_pylist()) == sorted(want["id"].to_pylist()), where


def tablet_scans(cluster: MiniCluster) -> Counter[str]:
    """Scans started per tablet, summed over every tablet server's /metrics."""
    out: Counter[str] = Counter()
    for ts in cluster.tservers.values():
        with urllib.request.urlopen(f"http://{ts.http_address}/metrics", timeout=10) as r:
            text = r.read().decode()
        for m in re.finditer(r'^tessera_tablet_scans_total\{group="([^"]+)"\} (\S+)$', text, re.M):
            out[m.group(1)] += int(float(m.group(2)))
    return out


def test_where_option_prunes_tablets(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, typed_table: pa.Table
) -> None:
    """Asserted from the tablet servers' scan metrics: an equality on the key in `where` scans
    exactly the one tablet holding the key, a range on it only the tablets of that range."""
    before = tablet_scans(cluster)
    assert read(spark, cluster, "typed", where="id = 5").count() == 1
    delta = tablet_scans(cluster) - before
    (token,) = client.scan_tokens("typed", predicates=[ColumnPredicate("id", "EQ", (5,))])
    assert delta == Counter({token.tablet_id: 1})
    before = tablet_scans(cluster)
    assert read(spark, cluster, "typed", where="id >= 2000").count() == N - 2000
    assert len(tablet_scans(cluster) - before) == 2  # both buckets of the upper range only

    assert read(spark, cluster, "typed", where="id = 5").rdd.getNumPartitions() == 1
    df = read(spark, cluster, "typed", where="id >= 2000 AND s startswith 's1'")
    assert df.rdd.getNumPartitions() == 2  # both buckets, upper range
    want = [
        i for i, s in enumerate(typed_table["s"].to_pylist()) if i >= 2000 and s and s[:2] == "s1"
    ]
    assert sorted(r.id for r in df.select("id").collect()) == want
    # Spark's own filters still apply on top, and are never pushed (so never leak).
    assert df.filter("id < 2100").count() == len([i for i in want if i < 2100])
    assert df.count() == len(want)
    for bad, match in [
        ("id >", "option 'where'"),
        ("nope = 1", "unknown column 'nope'"),
        ("id != 3", "do not evaluate !="),
    ]:
        with pytest.raises(Exception, match=match):
            read(spark, cluster, "typed", where=bad).count()


def test_split_size_rows_cuts_tablets_into_key_ranges(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, typed_table: pa.Table
) -> None:
    df = read(spark, cluster, "typed", split_size_rows="200")
    # 4 tablets of about 750 rows: 4 ranges each (the last one shorter).
    assert df.rdd.getNumPartitions() == 16
    assert by_id(df.toArrow()).equals(by_id(typed_table))
    assert df.filter("id >= 2900").count() == 100
    (token,) = client.scan_tokens("typed", predicates=[ColumnPredicate("id", "EQ", (5,))])
    pieces = client.call("split_token", token, 100)
    assert pieces[0].lower_key == b"" and pieces[-1].upper_key == b""
    assert all(a.upper_key == b.lower_key for a, b in itertools.pairwise(pieces))


def test_sql_view_and_register_views(
    spark: SparkSession, cluster: MiniCluster, typed_table: pa.Table
) -> None:
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW tv USING tessera "
        f"OPTIONS (masters '{masters(cluster)}', "
        f"credentials '{cluster.credentials_dir()}', table 'typed', columns 'id,s')"
    )
    assert spark.sql("SELECT count(*) FROM tv").collect()[0][0] == N
    assert spark.table("tv").columns == ["id", "s"]
    names = register_views(spark, masters(cluster), credentials=cluster.credentials_dir() or "")
    assert "typed" in names
    assert spark.sql("SELECT max(id) FROM typed").collect()[0][0] == N - 1


def test_bad_input_is_refused_with_a_clear_error(
    spark: SparkSession, cluster: MiniCluster, typed_table: pa.Table
) -> None:
    with pytest.raises(Exception, match="missing_table"):
        read(spark, cluster, "missing_table").schema  # noqa: B018
    with pytest.raises(Exception, match="unknown option 'colour'"):
        read(spark, cluster, "typed", colour="red").schema  # noqa: B018
    with pytest.raises(Exception, match="no column 'nope'"):
        read(spark, cluster, "typed", columns="id,nope").schema  # noqa: B018
    bad = spark.range(3).selectExpr("id", "cast(id as string) as i32")
    with pytest.raises(Exception, match=r"'i32'.*string.*INT32"):
        bad.write.format("tessera").option("masters", masters(cluster)).option(
            "credentials", cluster.credentials_dir()
        ).option("table", "typed").mode("append").save()
    with pytest.raises(Exception, match="overwrite"):
        spark.range(3).write.format("tessera").option("masters", masters(cluster)).option(
            "credentials", cluster.credentials_dir()
        ).option("table", "typed").mode("overwrite").save()
    with pytest.raises(Exception, match=r"127\.0\.0\.1:1"):
        spark.read.format("tessera").option("masters", "127.0.0.1:1").option(
            "table", "typed"
        ).option("rpc_timeout_ms", "1500").load()
    # A refused row fails the job naming its key; nothing else of that task is hidden.
    dup = spark.range(5, 6).selectExpr("id", "true as b")
    with pytest.raises(Exception, match=r"key \(5,\): ALREADY_EXISTS"):
        dup.write.format("tessera").option("masters", masters(cluster)).option(
            "credentials", cluster.credentials_dir()
        ).option("table", "typed").option("operation", "insert").mode("append").save()


def test_million_rows_write_then_read_back(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient
) -> None:
    schema = Schema.build(
        [("k", ColumnType.INT64), ("v", ColumnType.DOUBLE), ("tag", ColumnType.STRING)], key="k"
    )
    client.call(
        "create_table",
        "big",
        schema,
        PartitionSchema(hash=(HashBucketSchema(("k",), 4),), range=RangeSchema(())),
    )
    n = 1_000_000
    src = spark.range(n).selectExpr(
        "id as k", "cast(id * 0.5 as double) as v", "concat('t', id % 1000) as tag"
    )
    src.write.format("tessera").option("masters", masters(cluster)).option(
        "credentials", cluster.credentials_dir()
    ).option("table", "big").mode("append").save()
    df = read(spark, cluster, "big")
    assert df.count() == n
    diff = df.exceptAll(src).count() + src.exceptAll(df).count()
    assert diff == 0


def test_tablet_server_dies_in_the_middle_of_a_read(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every tablet server runs a crash failpoint: the first one to serve its 3rd ScanNext page
    exits like kill -9, mid-read. The Spark read fails over to other replicas and is exact."""
    base = tmp_path_factory.mktemp("ds-crash")
    once = base / "crashed"
    env = {
        failpoints.CRASH_AT: "scan_next:3",
        failpoints.ONCE_FILE: str(once),
    }
    with MiniCluster(base) as cluster:
        for name in cluster.tservers:
            cluster.kill_tserver(name)
            cluster.start_tserver(name, env=env)
        schema = Schema.build([("k", ColumnType.INT64), ("pad", ColumnType.STRING)], key="k")
        rows = pa.table(
            {
                "k": pa.array(range(40_000), pa.int64()),
                "pad": [f"{i:08d}" * 8 for i in range(40_000)],
            }
        )
        with SyncClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as c:
            c.call(
                "create_table",
                "crashy",
                schema,
                PartitionSchema(hash=(HashBucketSchema(("k",), 2),), range=RangeSchema(())),
            )
            assert c.write("crashy", rows, "insert").rows_applied == 40_000
            got = read(
                spark, cluster, "crashy", batch_size_bytes=str(32 << 10), scan_timeout_ms="60000"
            ).toArrow()
        assert once.exists(), "no tablet server reached the failpoint"
        assert sum(not ts.alive for ts in cluster.tservers.values()) == 1
        assert got.num_rows == 40_000
        assert by_id(got.rename_columns(["id", "pad"])).equals(
            by_id(rows.rename_columns(["id", "pad"]))
        )


def test_a_failed_write_leaves_none_of_its_rows(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient
) -> None:
    """A write is one transaction (transactional=true, the default): a job whose last task
    fails after the others staged their rows shows none of them, and neither does a failed
    overwrite with truncate (its deletes are in the same transaction); transactional=false
    leaves what it wrote."""
    from pyspark.sql.functions import udf

    schema = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], key="k")
    client.call(
        "create_table", "atomic_t", schema, PartitionSchema(hash=(HashBucketSchema(("k",), 3),))
    )
    before = pa.table({"k": pa.array(range(10), pa.int64()), "v": ["old"] * 10})
    client.write("atomic_t", before)

    @udf("long")
    def fail_on_last(k: int) -> int:
        if k == 2999:
            raise ValueError("this task fails")
        return k

    src = spark.range(0, 3000, numPartitions=6).selectExpr("id AS k", "'new' AS v")
    bad = src.withColumn("k", fail_on_last("k"))

    def write(df: object, mode: str = "append", **opts: str) -> None:
        w = (
            df.write.format("tessera")  # type: ignore[attr-defined]
            .option("masters", masters(cluster))
            .option("credentials", cluster.credentials_dir())
            .option("table", "atomic_t")
            .mode(mode)
        )
        for k, v in opts.items():
            w = w.option(k, v)
        w.save()

    def table() -> dict[int, str]:
        return {
            r["k"]: r["v"]
            for t in client.scan_tokens("atomic_t")
            for b in client.scan_batches(t)
            for r in b.to_pylist()
        }

    old = {i: "old" for i in range(10)}
    with pytest.raises(Exception, match="this task fails"):
        write(bad)
    assert table() == old
    with pytest.raises(Exception, match="this task fails"):
        write(bad, "overwrite", truncate="true")
    assert table() == old
    # A write that succeeds shows all of it; an atomic overwrite replaces the table at once.
    write(src.where("k < 100"), "overwrite", truncate="true")
    assert table() == {i: "new" for i in range(100)}
    # transactional=false: the tasks that ran wrote their rows.
    with pytest.raises(Exception, match="this task fails"):
        write(bad, transactional="false")
    assert len(table()) > 100


def test_a_null_in_a_not_null_column_fails_the_write_naming_the_key_and_leaves_nothing(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient
) -> None:
    schema = Schema.build(
        [("id", ColumnType.INT64), AddColumn("name", ColumnType.STRING, nullable=False)],
        key="id",
    )
    client.call(
        "create_table", "nn_t", schema, PartitionSchema(hash=(HashBucketSchema(("id",), 3),))
    )
    src = spark.range(0, 4000, numPartitions=8).selectExpr(
        "id", "CASE WHEN id = 229 THEN NULL ELSE concat('n', id) END AS name"
    )

    def write(df: object) -> None:
        (
            df.write.format("tessera")  # type: ignore[attr-defined]
            .option("masters", masters(cluster))
            .option("credentials", cluster.credentials_dir())
            .option("table", "nn_t")
            .mode("append")
            .save()
        )

    with pytest.raises(
        Exception, match=r"NOT NULL column 'name' is null in row \d+ \(key id=229\)"
    ):
        write(src)
    assert [
        t for t in client.scan_tokens("nn_t") for b in client.scan_batches(t) if b.num_rows
    ] == []
    # A DataFrame without the NOT NULL column is refused when the write is planned.
    with pytest.raises(Exception, match="has no column 'name'") as e:
        write(src.select("id"))
    assert "Traceback" not in str(e.value).split("has no column")[0][-200:]


def test_tables_are_created_from_spark(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient
) -> None:
    """`create_if_missing` makes the table from the DataFrame's schema (key first, NOT NULL;
    the others keep Spark's nullability), and `spark_jobs.tables.create_table` from a
    StructType; unmapped types and bad partitioning are refused before anything is created."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from spark_jobs.tables import create_table

    src = spark.range(0, 500, numPartitions=2).selectExpr(
        "CAST(id AS STRING) AS name", "id", "CASE WHEN id % 7 = 0 THEN NULL ELSE id * 0.5 END AS x"
    )

    def write(df: object, table: str, **opts: str) -> None:
        w = (
            df.write.format("tessera")  # type: ignore[attr-defined]
            .option("masters", masters(cluster))
            .option("credentials", cluster.credentials_dir())
            .option("table", table)
            .mode("append")
        )
        for k, v in opts.items():
            w = w.option(k, v)
        w.save()

    write(src, "made_by_spark", create_if_missing="true", key="id", hash="id:3")
    info = client.call("open_table", "made_by_spark")
    assert info.schema.key == ("id",) and info.schema.column_names == ("id", "name", "x")
    assert not info.schema.column("id").nullable and info.schema.column("x").nullable
    assert not info.schema.column("name").nullable  # Spark's own: CAST of a non-null long
    assert len(info.partition_schema.hash) == 1 and info.partition_schema.hash[0].num_buckets == 3
    assert read(spark, cluster, "made_by_spark").count() == 500
    write(src, "made_by_spark", create_if_missing="true", key="id")  # exists: just written to
    assert read(spark, cluster, "made_by_spark").count() == 500

    # Refused before anything exists: a type Tessera lacks, a partition column that is not
    # there, no key.
    tables_before = {t.name for t in client.call("list_tables")}
    with pytest.raises(Exception, match=r"column 'tags'.*no Tessera type"):
        write(
            src.selectExpr("id", "array(name) AS tags"), "bad1", create_if_missing="true", key="id"
        )
    with pytest.raises(Exception, match="no column 'nope'"):
        write(src, "bad2", create_if_missing="true", key="id", hash="nope:2")
    with pytest.raises(Exception, match="needs option 'key'"):
        write(src, "bad3", create_if_missing="true")
    with pytest.raises(Exception, match="need create_if_missing"):
        write(src, "bad4", key="id")
    assert {t.name for t in client.call("list_tables")} == tables_before

    struct = StructType([StructField("k", LongType(), False), StructField("v", StringType(), True)])
    handle = create_table(
        "made_from_struct",
        struct,
        masters=masters(cluster),
        key="k",
        range="k",
        replicas=1,
        credentials=str(cluster.credentials_dir()),
    )
    assert handle.schema.column_names == ("k", "v") and handle.num_replicas == 1
