"""The default catalog (spark_jobs/catalog.py): in-memory per session, rebuilt from the
warehouse's Delta tables, so that a table written by another process is found by name, time
travel and change data feed included, with no metastore database shared between processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from spark_jobs.catalog import hive_requested, is_conflict, register_tables, table_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark]


def test_the_default_catalog_is_in_memory(spark: SparkSession) -> None:
    assert spark.conf.get("spark.sql.catalogImplementation") == "in-memory"


def test_tables_written_by_path_are_found_by_name_with_history(spark: SparkSession) -> None:
    """A table another process created (here: written by path, never named in this session)
    is registered under `<db>.<table>` from its directory, and by name gives its versions and
    its change feed."""
    path = table_path(spark, "elsewhere", "events")
    spark.sql(
        f"CREATE TABLE delta.`{path}` USING delta TBLPROPERTIES "
        "(delta.enableChangeDataFeed = true) AS SELECT id, 'a' AS v FROM range(3)"
    )
    spark.sql(f"UPDATE delta.`{path}` SET v = 'b' WHERE id = 1")
    assert not spark.catalog.tableExists("elsewhere.events")
    assert register_tables(spark) == ["elsewhere.events"]
    assert register_tables(spark) == []  # already there
    got = spark.sql("SELECT v FROM elsewhere.events VERSION AS OF 0 WHERE id = 1").collect()
    assert [r.v for r in got] == ["a"]
    changes = spark.sql(
        "SELECT _change_type, v FROM table_changes('elsewhere.events', 1) ORDER BY _change_type"
    ).collect()
    assert [(r._change_type, r.v) for r in changes] == [
        ("update_postimage", "b"),
        ("update_preimage", "a"),
    ]
    (detail,) = spark.sql("DESCRIBE DETAIL elsewhere.events").collect()
    assert detail.location.rstrip("/") == path
    spark.sql("DROP TABLE elsewhere.events")  # an external table: only the name goes
    assert register_tables(spark, "elsewhere") == ["elsewhere.events"]
    assert spark.table("elsewhere.events").count() == 3


def test_naming_a_metastore_asks_for_hive() -> None:
    assert not hive_requested({})
    assert not hive_requested({"spark.sql.catalogImplementation": "in-memory"})
    assert hive_requested({"spark.sql.catalogImplementation": "hive"})
    assert hive_requested({"spark.hadoop.hive.metastore.uris": "thrift://meta:9083"})
    assert not hive_requested({"spark.hadoop.hive.metastore.uris": ""})


def test_only_lost_races_are_conflicts() -> None:
    assert not is_conflict(ValueError("no such column"))
    assert is_conflict(RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException: ..."))
    assert is_conflict(RuntimeError("[DELTA_PATH_EXISTS] Cannot write to already existent path"))
