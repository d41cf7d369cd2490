"""The "tessera" DataSource as a user with per-table grants: Spark reads and writes a table only
with the privilege the operation needs, checked by the tablet servers on the executors' calls
against the authz token planned on the driver (or fetched by the executor's writer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from service.client.credentials import load_credentials_dir, token_of
from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.private_files import write_private_file
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from tests.spark.conftest import masters, read

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")


def _write(spark: SparkSession, cluster: MiniCluster, creds: str, table: str) -> None:
    df = spark.createDataFrame([(1000 + i, f"s{i}") for i in range(5)], "id long, v string")
    df.write.format("tessera").option("masters", masters(cluster)).option(
        "credentials", creds
    ).option("table", table).mode("append").save()


def test_spark_reads_and_writes_only_what_the_user_was_granted(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient
) -> None:
    client.call(
        "create_table",
        "granted",
        SCHEMA,
        PartitionSchema(hash=(HashBucketSchema(("id",), 3),)),
    )
    client.write("granted", pa.table({"id": pa.array(range(50), pa.int64()), "v": ["x"] * 50}))
    user = cluster.credentials_dir("user", "spark-user")
    assert user is not None

    with pytest.raises(Exception, match="holds no privilege on table 'granted'"):
        read(spark, cluster, "granted", credentials=user).count()

    client.call("grant", "granted", "spark-user", ["read"])
    df = read(spark, cluster, "granted", credentials=user)
    assert df.count() == 50
    assert df.where("id < 10").count() == 10
    with pytest.raises(Exception, match="lacks the 'write' privilege"):
        _write(spark, cluster, user, "granted")

    client.call("grant", "granted", "spark-user", ["write"])
    _write(spark, cluster, user, "granted")
    assert read(spark, cluster, "granted", credentials=user).count() == 55

    # The token travels in the planned partitions, never in the plan Spark prints.
    plan = read(spark, cluster, "granted", credentials=user)._jdf.queryExecution().toString()
    assert "authz" not in plan.lower()


def test_spark_authenticates_with_a_credentials_token_or_token_file(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    client.call(
        "create_table", "by_token", SCHEMA, PartitionSchema(hash=(HashBucketSchema(("id",), 2),))
    )
    client.write("by_token", pa.table({"id": pa.array(range(20), pa.int64()), "v": ["t"] * 20}))
    user = cluster.credentials_dir("user", "token-user")
    assert user is not None
    token = token_of(load_credentials_dir(user))
    token_file = tmp_path / "token-user.token"
    write_private_file(token_file, (token + "\n").encode())
    client.call("grant", "by_token", "token-user", ["read"])

    def reader(**opts: str) -> DataFrameReader:
        r = spark.read.format("tessera").option("masters", masters(cluster))
        for k, v in {"table": "by_token", **opts}.items():
            r = r.option(k, v)
        return r

    by_text = reader(token=token).load()
    assert by_text.count() == 20
    assert reader(token_file=str(token_file)).load().where("id < 5").count() == 5
    # The token is a secret: the plan Spark prints shows no part of it.
    plan = by_text._jdf.queryExecution().toString()
    secret = token.split(".", 1)[1][-40:]
    assert secret not in plan

    with pytest.raises(Exception, match="give only one way to authenticate"):
        reader(token=token, credentials=user).load()
    with pytest.raises(Exception, match="option 'token': credentials token") as e:
        reader(token=token[: len(token) // 2]).load()  # cut short: no key left in it
    assert secret not in str(e.value) and token[40:80] not in str(e.value)
    os.chmod(token_file, 0o644)
    with pytest.raises(Exception, match=r"option 'token_file'.*group or others"):
        reader(token_file=str(token_file)).load()
