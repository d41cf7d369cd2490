"""Test-run-wide fixtures.

Only the ``spark`` fixture lives here. It is lazy: pyspark is imported and the JVM started
(8-10 s on these machines, more on the first run, which downloads the Delta jars) only when a test
asks for ``spark``, and then once for the whole run. Tests that do not use it pay nothing.

The tests that use it run first (`pytest_collection_modifyitems`). PySpark starts the JVM with
``subprocess.Popen(preexec_fn=...)``, a plain fork; in a process whose gRPC has been running
(earlier tests' in-process servers and channels), grpcio >= 1.80's fork handlers can kill
the child before it execs (grpc/grpc#43055, open), and every Spark test then errored with
JAVA_GATEWAY_EXITED (twice in full runs, never alone). Started before any test has used gRPC,
the JVM is forked from a process with no gRPC threads. The jobs and the demo already start
their SparkSession before their first RPC.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The shared helpers (tests/helpers/) check with plain asserts, as tests do: rewrite theirs too,
# so that a failing one explains itself. Registered before any test module imports them.
pytest.register_assert_rewrite("tests.helpers")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use ``spark`` (directly or through another fixture) first, in their order."""
    items.sort(key=lambda item: "spark" not in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession with Delta, its warehouse in a temporary directory, and the
    default catalog (in-memory, rebuilt from the warehouse: what jobs get)."""
    from spark_jobs.session import build_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = build_session("tessera-tests", warehouse_dir=str(warehouse))
    try:
        yield session
    finally:
        session.stop()
