"""Fixtures of the DataSource tests: one real local cluster (3 masters, 3 tablet servers) per
test module, and a client of it. `spark` (the run-wide session) is asked for first, so the JVM
is forked before this process runs any gRPC (tests/conftest.py says why)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from service.client.sync import SyncClient
from service.testing.mini_cluster import MiniCluster

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@pytest.fixture(scope="module")
def cluster(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("ds-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: MiniCluster) -> Iterator[SyncClient]:
    with SyncClient(cluster.master_addresses, timeout=60, credentials=cluster.credentials()) as c:
        yield c


def masters(cluster: MiniCluster) -> str:
    return ",".join(cluster.master_addresses)


def read(spark: SparkSession, cluster: MiniCluster, table: str, **opts: str) -> DataFrame:
    """`spark.read.format("tessera")` of `table` on `cluster`, with `opts` as options."""
    r = (
        spark.read.format("tessera")
        .option("masters", masters(cluster))
        .option("credentials", cluster.credentials_dir())
        .option("table", table)
    )
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()
