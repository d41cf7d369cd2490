"""A tablet server stops cleanly under load, and nothing acknowledged is lost.

Three tablet servers host a 30-tablet table (3 replicas each) while a client writes batches
without pause. One server gets SIGTERM: it exits within `service.tserver.__main__`'s
`SHUTDOWN_TIMEOUT_S` (plus the interpreter's exit), with exit code 0 and no traceback in its
log. Writes go on against the other two (its tablets elect new leaders), the server is started
again, and every row of every batch the client saw acknowledged is there.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from service.common.errors import TesseraError
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from service.tserver.__main__ import SHUTDOWN_TIMEOUT_S

pytestmark = pytest.mark.integration

SCHEMA = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], ("k",))
BATCH = 2_000
BAD_LINES = ("Traceback", "never retrieved", "was destroyed but it is pending")


class Writer(threading.Thread):
    """Writes numbered batches until stopped; keeps the keys of every acknowledged batch."""

    def __init__(self, cluster: MiniCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.acked: list[int] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with self.cluster.client(timeout=30.0) as client:
            n = 0
            while not self.stop.is_set():
                keys = list(range(n * BATCH, (n + 1) * BATCH))
                n += 1
                batch = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"v{k}" for k in keys]})
                try:
                    result = client.write("t", batch)
                except TesseraError:
                    self.failed += 1
                    continue
                if result.rows_applied == BATCH and not result.errors:
                    self.acked.extend(keys)


def test_sigterm_under_writes_exits_within_the_bound_and_loses_nothing(tmp_path: Path) -> None:
    with MiniCluster(tmp_path, num_tservers=3) as cluster:
        with cluster.client() as client:
            client.call(
                "create_table",
                "t",
                SCHEMA,
                PartitionSchema(hash=(HashBucketSchema(("k",), 30),)),
                num_replicas=3,
            )
        writer = Writer(cluster)
        writer.start()
        try:
            deadline = time.monotonic() + 60
            while len(writer.acked) < 10 * BATCH and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(writer.acked) >= 10 * BATCH, "writes did not get going"

            victim = cluster.tservers["ts-1"]
            assert victim.proc is not None
            t0 = time.monotonic()
            victim.proc.send_signal(signal.SIGTERM)
            code = victim.proc.wait(timeout=60)
            took = time.monotonic() - t0
            assert code == 0, victim.log.read_text()[-3000:]
            assert took < SHUTDOWN_TIMEOUT_S + 2.0, took
            log = victim.log.read_text()
            assert not [line for line in log.splitlines() if any(b in line for b in BAD_LINES)]

            before = len(writer.acked)
            deadline = time.monotonic() + 60
            while len(writer.acked) < before + 5 * BATCH and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(writer.acked) >= before + 5 * BATCH, "writes stopped with one server down"
            cluster.start_tserver("ts-1")
        finally:
            writer.stop.set()
            writer.join(timeout=60)
        with cluster.client() as client:
            got = set(client.call("scan", "t", projection=["k"]).column("k").to_pylist())
        missing = set(writer.acked) - got
        assert not missing, f"{len(missing)} acknowledged rows lost, e.g. {sorted(missing)[:5]}"
