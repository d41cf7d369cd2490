"""Creation on a machine kept busy (`make bench-overload`): does the cluster converge?

Real processes on loopback: 3 masters and 3 tablet servers (production settings but
`max_create_tablets_per_ts = 400` and 1 MiB WAL segments, so 3,000 replicas do not preallocate
24 GB), and beside them as many CPU-bound busy loops as the machine has cores (`--burners`). Then:

  create             a 1,000-tablet table (3 replicas each): seconds until every tablet is
                     RUNNING;
  create after kill  the table is deleted (its replicas gone from the servers), and another
                     1,000-tablet table is created; 0.6 s in, every master is killed with
                     SIGKILL and restarted. The client retries CreateTable with the same
                     request id (exactly-once DDL) on whichever master leads: seconds from the
                     first CreateTable until every tablet is RUNNING.

It ends with one line

    overload: create C s, create after kill-all K s, replaced R, load L

R: tablets REPLACED in the catalog over both creates; L: the 1-minute load average at the end.
The goal (docs/design/catalog.md#R16): both creates RUNNING within 180 s, and R no more than 5%
of the tablets (100 of 2,000).

Usage: python -m bench.overload_bench [--tablets 1000] [--burners N] [--timeout 600]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from bench.master_failover_scale import metrics
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.mini_cluster import MiniCluster

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
MASTERS = {"max_create_tablets_per_ts": "400"}
TSERVERS = {"wal.segment_size_mb": "1"}
KILL_AFTER_S = 0.6


def progress(msg: str) -> None:
    print(f"  .. {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    """`n` processes that spin a core each until killed: a busy host."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]


class Leader:
    """Calls to whichever master leads now, found again after a failure (as a client does)."""

    def __init__(self, cluster: MiniCluster) -> None:
        self.cluster = cluster
        self._address: str | None = None
        self._channel: grpc.Channel | None = None

    def stub(self) -> Any:
        if self._address is None or self._channel is None:
            self._address, _ = self.cluster.masters.leader(timeout=120)
            self._channel = self.cluster.sync_channel(self._address)
        return master_pb2_grpc.MasterServiceStub(self._channel)

    def call(self, method: str, request: Any, timeout: float = 30.0) -> Any:
        """`method` on the leader, retried on a lost or changed leader for up to 5 minutes."""
        deadline = time.monotonic() + 300
        while True:
            try:
                return getattr(self.stub(), method)(request, timeout=timeout)
            except grpc.RpcError as e:
                code = e.code()
                retryable = (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.FAILED_PRECONDITION,  # not the leader (any more)
                    grpc.StatusCode.CANCELLED,
                )
                if code not in retryable or time.monotonic() > deadline:
                    raise
                self.close()
                time.sleep(0.2)
            except TimeoutError:
                self.close()
                time.sleep(0.5)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._address = self._channel = None


def create(leader: Leader, name: str, tablets: int, seq: int) -> str:
    ps = PartitionSchema(hash=(HashBucketSchema(("id",), tablets),), range=RangeSchema(()))
    req = pb.CreateTableRequestPB(
        request_id=pb.RequestIdPB(client_id="overload-bench", seq_no=seq),
        name=name,
        schema=schema_to_pb(SCHEMA),
        partition_schema=partition_schema_to_pb(ps, SCHEMA),
        num_replicas=3,
    )
    return str(leader.call("CreateTable", req, timeout=60).table_id)


def wait_running(leader: Leader, table_id: str, t0: float, timeout: float) -> tuple[float, str]:
    """Seconds from `t0` until every tablet of the table is RUNNING, and that figure as text;
    past `timeout`, (inf, ">T s (R/N RUNNING)"): a run that did not converge still reports."""
    shown = 0.0
    req = pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id))
    while True:
        r = leader.call("IsCreateTableDone", req, timeout=10)
        now = time.monotonic()
        if r.done:
            return now - t0, f"{now - t0:.0f} s"
        if now - shown >= 5:
            shown = now
            progress(f"{r.tablets_running}/{r.tablets_total} RUNNING after {now - t0:.0f} s")
        if now - t0 > timeout:
            progress(f"not RUNNING within {timeout:.0f} s; going on")
            return float("inf"), f">{timeout:.0f} s ({r.tablets_running}/{r.tablets_total})"
        time.sleep(0.2)


def replaced(leader: Leader) -> int:
    n = 0
    for chunk in leader.stub().DumpCatalog(pb.DumpCatalogRequestPB(), timeout=60):
        n += sum(
            1
            for row in chunk.rows
            if row.HasField("tablet") and row.tablet.state == pb.TabletRecordPB.REPLACED
        )
    return n


def wait_replicas_gone(cluster: MiniCluster, timeout: float) -> None:
    """Until no tablet server hosts a replica (the deleted table's are gone), by the servers'
    own /metrics."""
    t0 = time.monotonic()
    names = [f'tessera_tserver_replicas{{state="{s}"}}' for s in ("RUNNING", "BOOTSTRAPPING")]
    while time.monotonic() - t0 < timeout:
        left = 0.0
        for ts in cluster.tservers.values():
            got = metrics(ts.http_address, *names)
            left += sum(v if v is not None else 1.0 for v in got.values())
        if left == 0:
            progress(f"the deleted table's replicas are gone after {time.monotonic() - t0:.0f} s")
            return
        progress(f"{left:.0f} replicas of the deleted table left")
        time.sleep(2)
    progress("replicas of the deleted table still there; going on")


def run(args: argparse.Namespace, base: Path) -> None:
    procs = burners(args.burners)
    progress(f"{args.burners} busy loops started beside the cluster")
    try:
        with MiniCluster(
            base,
            num_masters=3,
            num_tservers=3,
            master_overrides=MASTERS,
            tserver_overrides=TSERVERS,
        ) as cluster:
            leader = Leader(cluster)
            progress(f"create: {args.tablets} tablets x 3 replicas")
            t0 = time.monotonic()
            first = create(leader, "overload_1", args.tablets, 1)
            c, c_text = wait_running(leader, first, t0, args.timeout)
            progress(f"create: {c_text}; deleting the table")
            leader.call(
                "DeleteTable",
                pb.DeleteTableRequestPB(
                    request_id=pb.RequestIdPB(client_id="overload-bench", seq_no=2),
                    table=pb.TableIdentifierPB(table_id=first),
                ),
            )
            wait_replicas_gone(cluster, 300)
            progress(f"create after kill-all: {args.tablets} tablets; every master killed at 0.6 s")
            got: dict[str, str] = {}
            t0 = time.monotonic()
            thread = threading.Thread(
                target=lambda: got.update(id=create(Leader(cluster), "overload_2", args.tablets, 3))
            )
            thread.start()
            time.sleep(max(0.0, t0 + KILL_AFTER_S - time.monotonic()))
            names = list(cluster.masters.masters)
            for name in names:
                cluster.masters.kill(name, signal.SIGKILL)
            for name in names:
                cluster.masters.start_master(name)
            leader.close()
            thread.join(timeout=args.timeout)
            if "id" not in got:
                raise RuntimeError("CreateTable was not answered after the restart")
            k, k_text = wait_running(leader, got["id"], t0, args.timeout)
            r = replaced(leader)
            load = os.getloadavg()[0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    total = 2 * args.tablets
    print(
        f"create: {args.tablets} tablets in {c:.1f} s; after kill-all {k:.1f} s; "
        f"{r} of {total} tablets replaced ({100 * r / total:.1f}%), {args.burners} busy loops"
    )
    print(
        f"overload: create {c_text}, create after kill-all {k_text}, replaced {r}, load {load:.1f}"
    )
    print("  (goal: both creates within 180 s, replaced at most 5% of the tablets)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overload_bench", description=__doc__)
    p.add_argument("--tablets", type=int, default=1000)
    p.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-overload-bench-") as d:
        run(args, Path(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
