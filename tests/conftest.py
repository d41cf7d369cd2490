"""Test-run-wide fixtures.

Only the ``spark`` fixture lives here. It is lazy: pyspark is imported and the JVM started
(8-10 s on these machines, more on the first run, which downloads the Delta jars) only when a test
asks for ``spark``, and then once for the whole run. Tests that do not use it pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession with Delta, its warehouse in a temporary directory."""
    from spark_jobs.session import build_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    metastore = tmp_path_factory.mktemp("spark-metastore")
    session = build_session(
        "tessera-tests", warehouse_dir=str(warehouse), metastore_dir=str(metastore)
    )
    try:
        yield session
    finally:
        session.stop()
