"""What a master's event loop does at once at the scale where promotions failed (in process).

Masters flapped at ~95,000 tablets on 300 servers: a new leader held its loop longer than the
election timeout loading the catalog, then decoding and judging 300 full reports. This measures
those steps on an in-process catalog of --tablets tablets x 3 replicas on --servers servers
(every tablet RUNNING with a leader, as report processing records it), one line per figure:

  load      seconds until the catalog answers after a promotion (`CatalogManager.load`: the
            maps and tasks are kept warm, so nothing is rebuilt) and the longest single hold
            of the loop meanwhile
  decode    one server's full report (~3 x tablets / servers replicas): seconds to decode it
            (`heartbeat.decode_report`) and to judge it (`judge_report`), each on the loop
  report    --reports such full reports arriving together, as after an election: the longest
            the loop was held while they were decoded (`heartbeat.read_report`, in threads, at
            most `ReportGate.max_reading` at once, where it exists) and judged

Usage: python -m bench.master_promotion [--tablets 100000] [--servers 300] [--reports 10]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench.master_bench import SCHEMA, catalog_on_fleet, mark_running, partitioning
from service.common.ids import NodeId
from service.master import heartbeat
from service.master.catalog_manager import CatalogManager
from service.master.catalog_records import (
    RequestId,
    consensus_state_to_pb,
)
from service.pb import master_pb2 as pb

TABLE_TABLETS = 10_000


async def build(tablets: int, servers: int) -> CatalogManager:
    cm, rep = catalog_on_fleet(servers)
    for n, start in enumerate(range(0, tablets, TABLE_TABLETS)):
        count = min(TABLE_TABLETS, tablets - start)
        table_id = await cm.create_table(
            f"t{n}", SCHEMA, partitioning(count), 3, RequestId("b", n + 1)
        )
        await cm.assign_tablets(max_tablets=count)
        await mark_running(cm, rep, table_id)
        print(f"  .. {start + count} tablets", file=sys.stderr, flush=True)
    return cm


def full_report(cm: CatalogManager, uuid: str) -> pb.TabletReportPB:
    report = pb.TabletReportPB(is_incremental=False, sequence_number=1)
    for info in cm.maps.tablets_by_id.values():
        cs = info.record.consensus
        if cs is None or not any(p.uuid == uuid for p in cs.peers):
            continue
        t = report.updated_tablets.add(
            tablet_id=info.tablet_id,
            state=pb.REPLICA_RUNNING,
            role=pb.LEADER if cs.leader_uuid == uuid else pb.FOLLOWER,
        )
        t.consensus_state.CopyFrom(consensus_state_to_pb(cs))
    return report


class LoopWatch:
    """The longest gap between wakes of a task asking to wake every millisecond."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0.01)
        self.longest = 0.0
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.01)
        assert self._task is not None
        self._task.cancel()


async def main_async(args: argparse.Namespace) -> None:
    cm = await build(args.tablets, args.servers)
    cm.unload()
    async with LoopWatch() as watch:
        t0 = time.perf_counter()
        cm.load()
        ready_s = time.perf_counter() - t0
    print(
        f"load     {len(cm.maps.tablets_by_id)} tablets: ready after {ready_s:.3f} s, longest "
        f"loop hold {watch.longest:.3f} s, {len(cm.pending_tasks())} pending tasks"
    )
    report = full_report(cm, "ts-0")
    n = len(report.updated_tablets)
    t0 = time.perf_counter()
    reported = heartbeat.decode_report(report)
    decode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = cm.judge_report(NodeId("ts-0"), reported)
    judge_s = time.perf_counter() - t0
    print(
        f"decode   full report of {n} replicas: decode {decode_s * 1000:.1f} ms, judge "
        f"{judge_s * 1000:.1f} ms (write: {plan.write is not None})"
    )
    # --reports full reports arriving together, as after an election: each decoded and judged
    # (through `read_report` and at most `ReportGate.max_reading` at once where it exists).
    threaded = hasattr(heartbeat, "read_report")
    readers = asyncio.Semaphore(heartbeat.ReportGate().max_reading if threaded else 1)

    async def one() -> None:
        async with readers:
            if threaded:
                got = await heartbeat.read_report(report)
            else:
                got = heartbeat.decode_report(report)
        cm.judge_report(NodeId("ts-0"), got)

    async with LoopWatch() as watch:
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(args.reports)))
        wall = time.perf_counter() - t0
    how = "decoded in threads" if threaded else "decoded on the loop"
    print(
        f"report   {args.reports} full reports of {n} replicas {how}, judged: {wall:.2f} s, "
        f"longest loop hold {watch.longest * 1000:.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.master_promotion")
    p.add_argument("--tablets", type=int, default=100_000)
    p.add_argument("--servers", type=int, default=300)
    p.add_argument("--reports", type=int, default=10)
    asyncio.run(main_async(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
