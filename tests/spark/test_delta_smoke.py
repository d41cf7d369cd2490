"""Smoke tests of spark_jobs.session's SparkSession: Delta works, workers run the venv python.

Delta's versioning, as asserted here: CREATE TABLE of an empty table commits version 0 (operation
CREATE TABLE), each INSERT commits one more version (operation WRITE, mode Append). So after two
inserts the history has versions 0, 1 and 2; VERSION AS OF 0 is the empty table and VERSION AS
OF 1 holds the first insert only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

FIRST = [(1, "alpha"), (2, "beta")]
SECOND = [(3, "gamma")]


def _rows(spark: SparkSession, sql: str) -> list[tuple[int, str]]:
    return sorted((row.id, row.name) for row in spark.sql(sql).collect())


def test_delta_table_versions_and_time_travel(spark: SparkSession, tmp_path: Path) -> None:
    location = tmp_path / "tesserae"
    table = "delta_smoke_tesserae"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.sql(f"CREATE TABLE {table} (id INT, name STRING) USING delta LOCATION '{location}'")
    try:
        spark.sql(f"INSERT INTO {table} VALUES (1, 'alpha'), (2, 'beta')")
        spark.sql(f"INSERT INTO {table} VALUES (3, 'gamma')")

        assert (location / "_delta_log").is_dir()
        assert _rows(spark, f"SELECT id, name FROM {table}") == FIRST + SECOND
        assert _rows(spark, f"SELECT id, name FROM {table} VERSION AS OF 0") == []
        # By path, as jobs that only know a location will address it. (Each time-travel read
        # rebuilds a snapshot, about a second here, so the test keeps to the informative ones.)
        assert _rows(spark, f"SELECT id, name FROM delta.`{location}` VERSION AS OF 1") == FIRST

        history = spark.sql(f"DESCRIBE HISTORY {table}").orderBy("version").collect()
        assert [h.version for h in history] == [0, 1, 2]
        assert [h.operation for h in history] == ["CREATE TABLE", "WRITE", "WRITE"]
        assert [h.operationParameters["mode"] for h in history[1:]] == ["Append", "Append"]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
    # An external (LOCATION) table: dropping the name leaves the data and its log in place.
    assert _rows(spark, f"SELECT id, name FROM delta.`{location}`") == FIRST + SECOND


def test_session_applies_the_repository_defaults(spark: SparkSession) -> None:
    from spark_jobs.session import LOG4J2_FILE, read_spark_defaults

    defaults = read_spark_defaults()
    assert defaults["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert defaults["spark.sql.python.filterPushdown.enabled"] == "false"
    applied = dict(spark.sparkContext.getConf().getAll())
    # build_session rewrites these: the fixture's temporary warehouse, Delta jars from Ivy
    # or from jars/, the log4j2 option appended to the driver's Java options.
    rewritten = {
        "spark.sql.warehouse.dir",
        "spark.jars.packages",
        "spark.driver.extraJavaOptions",
    }
    for key, value in defaults.items():
        if key not in rewritten:
            assert applied.get(key) == value, key
    assert "var/spark/warehouse" not in applied["spark.sql.warehouse.dir"]
    jars = applied["spark.jars"].split(",")
    assert any("delta-spark_" in jar for jar in jars), jars
    assert spark.sparkContext.master == "local[2]"
    assert spark.sparkContext.uiWebUrl is None
    # The driver JVM was started with the repository's log4j2 configuration.
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    assert jvm.System.getProperty("log4j2.configurationFile") == LOG4J2_FILE.as_uri()


def test_workers_run_the_venv_python(spark: SparkSession) -> None:
    executables = (
        spark.sparkContext.parallelize(range(4), 2)
        .map(lambda _: sys.executable)
        .distinct()
        .collect()
    )
    assert executables == [sys.executable]
