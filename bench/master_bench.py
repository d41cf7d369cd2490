"""Master benchmark (`make bench-master`): one line per figure, progress on stderr.

  create    CreateTable with --tablets tablets x 3 replicas: bytes of its ONE replicated entry
            (Kudu measured ~117 KB for 1,000 tablets, seed 001) and seconds until every tablet
            is RUNNING on simulated tablet servers (a real master process, simulator process)
  lookup    GetTableLocations in-process p99 on a --lookup-tablets table (goal <= 100 us)
  rpc       GetTableLocations RPCs/s against the master process with 32 concurrent clients
            of the Go load generator (bench/go_load.py; goal >= 3,000/s on this 2-core
            machine), the same clients' Ping RPCs/s against the master (its ceiling: gRPC's
            per-call cost in this process, without the lookup) and against an empty grpc.aio
            server (bench/grpc_baseline.py): what one Python gRPC process can answer here
            today. --rpc-rounds rounds (3; 1 with --quick) of 5 s each, the three in turn, so
            they share the machine's good and bad minutes; medians, the rate's range, ratios
  rpc-py    the same with 32 Python grpc.aio clients in the bench process, which take about
            as much CPU per call as the master and share its 2 cores
  heartbeat --servers simulated servers heartbeating every second, hosting --replicas
            replicas in all: the master process's CPU (fraction of one core, from
            /proc/<pid>/stat) and the heartbeat p99 latency the simulator measured
            (goals: < 0.5 core, p99 < 50 ms)
  spiral    the first of the heartbeat fleet's tables (10,000 tablets x 3 at full scale): how
            long until RUNNING, and the fewest servers the master held live meanwhile (a busy
            master must never declare its servers dead: progress_clock, bounded rounds)

Usage: python -m bench.master_bench [--tablets 1000] [--servers 1000] [--replicas 100000]
       [--rpc-rounds 3] [--quick]
       (--quick: --servers 100 --replicas 3000 --lookup-tablets 2000 --rpc-rounds 1, a smoke run)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench import go_load
from service.common.clock import ManualClock
from service.common.ids import NodeId
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.master.catalog_manager import CatalogManager
from service.master.catalog_reads import (
    TableIdentifier,
)
from service.master.catalog_records import CatalogWrite, RequestId, TabletState, Update
from service.master.catalog_settings import CatalogSettings
from service.master.sys_catalog import ApplyResult, SysCatalogState
from service.master.ts_descriptor import NodeInstance, TSRegistration
from service.master.ts_manager import TSManager
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT, MasterCluster
from service.testing.processes import terminate_all

ROOT = Path(__file__).resolve().parents[1]
SERVICE = "/tessera.master.MasterService"
FLEET_TABLE_TABLETS = 10_000
"""The heartbeat figure's replicas are created as tables of this many tablets (the most a table
may have), one at a time: each is the CreateTable that once set off the starvation spiral (a
master too busy assigning to read heartbeats, declaring its servers dead), so the bench also
reports the fewest servers the master held live while they were created."""
SCHEMA = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("value", ColumnType.DOUBLE)],
    ("host", "ts"),
)


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def partitioning(n: int) -> PartitionSchema:
    """n tablets: n hash buckets up to 1,000; beyond, 100 buckets x n/100 ranges."""
    if n <= 1000:
        return PartitionSchema(hash=(HashBucketSchema(("host",), n),), range=RangeSchema(()))
    ranges = max(1, n // 100)
    return PartitionSchema(
        hash=(HashBucketSchema(("host",), 100),),
        split_rows=tuple((f"h{i:05d}",) for i in range(1, ranges)),
    )


# --- in-process figures ----------------------------------------------------------------------


class _Replicate:
    def __init__(self, state: SysCatalogState) -> None:
        self.state = state
        self.index = 0
        self.sizes: list[int] = []

    async def __call__(self, data: bytes, timeout: float) -> ApplyResult:
        self.index += 1
        self.sizes.append(len(data))
        return self.state.apply(self.index, data)


async def in_process(tablets: int, servers: int) -> tuple[CatalogManager, _Replicate, str]:
    clock = ManualClock(start=100.0)
    ts = TSManager(clock, 60.0)
    for i in range(servers):
        ts.register(
            NodeInstance(NodeId(f"ts-{i}"), 1),
            TSRegistration((f"10.0.{i // 250}.{i % 250 + 1}:7050",)),
        )
    state = SysCatalogState()
    rep = _Replicate(state)
    settings = CatalogSettings(max_create_tablets_per_ts=10_000, max_creating_tablets=10_000)
    cm = CatalogManager(state, rep, ts, clock, random.Random(1), settings)
    cm.load()
    table_id = await cm.create_table("bench", SCHEMA, partitioning(tablets), 3, RequestId("b", 1))
    return cm, rep, table_id


async def entry_bytes(tablets: int) -> int:
    _, rep, _ = await in_process(tablets, 10)
    return rep.sizes[-1]


async def lookup_p99(tablets: int) -> float:
    cm, rep, table_id = await in_process(tablets, 30)
    await cm.assign_tablets(max_tablets=tablets)  # all in one round
    # Every tablet RUNNING with a leader, as report processing would record it.
    ops = []
    for info in cm.maps.tables_by_id[table_id].tablets.values():  # type: ignore[index]
        rec = info.record
        assert rec.consensus is not None
        cs = replace(rec.consensus, term=1, leader_uuid=rec.consensus.peers[0].uuid)
        ops.append(Update(replace(rec, state=TabletState.RUNNING, consensus=cs)))
    await rep(CatalogWrite(ops=tuple(ops)).encode(), 1.0)
    keys = [t.partition.partition_key_start for t in cm.maps.tables_by_id[table_id].live_tablets()]  # type: ignore[index]
    ident = TableIdentifier.by_id(table_id)
    rng = random.Random(2)
    samples = []
    for _ in range(20_000):
        k = rng.choice(keys)
        t0 = time.perf_counter()
        await cm.get_table_locations(ident, k, b"", 1)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[int(0.99 * len(samples))]


# --- process figures -------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_sim(
    masters: list[str], prefix: str, count: int, workdir: Path, *, stagger: bool = False
) -> tuple[subprocess.Popen[bytes], Path]:
    port_file = workdir / f"{prefix}.port"
    stats = workdir / f"{prefix}.stats"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.testing.ts_simulator",
            "--masters",
            ",".join(masters),
            "--uuid",
            prefix,
            "--count",
            str(count),
            "--port-file",
            str(port_file),
            "--stats-file",
            str(stats),
            *(["--stagger"] if stagger else []),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=(workdir / f"{prefix}.log").open("wb"),
    )
    wait_for_port_file(proc, port_file, f"simulator {prefix}")
    return proc, stats


def wait_for_port_file(proc: subprocess.Popen[bytes], port_file: Path, what: str) -> None:
    """Until `proc` has written `port_file` (it is serving); RuntimeError if it exits or
    takes over 30 s."""
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


async def create_table(stub: Any, name: str, tablets: int, seq: int) -> str:
    req = pb.CreateTableRequestPB(
        request_id=pb.RequestIdPB(client_id="bench", seq_no=seq),
        name=name,
        schema=schema_to_pb(SCHEMA),
        partition_schema=partition_schema_to_pb(partitioning(tablets), SCHEMA),
        num_replicas=3,
    )
    return str((await stub.CreateTable(req, timeout=120)).table_id)


async def wait_running(stub: Any, table_id: str, timeout: float) -> float:
    secs, _, _ = await wait_running_watching(stub, table_id, timeout, None)
    return secs


async def wait_running_watching(
    stub: Any, table_id: str, timeout: float, prefix: str | None
) -> tuple[float, int, float]:
    """Seconds until every tablet of the table is RUNNING, (with `prefix`) the fewest servers
    named `prefix*` the master listed live meanwhile (-1 without), and the slowest answer to
    the IsCreateTableDone polls (a client's view of how busy the master was; a poll past its
    10 s deadline counts as 10 s and polling goes on)."""
    t0 = time.monotonic()
    fewest = -1
    watched = 0.0
    reported = 0.0
    slowest = 0.0
    while True:
        sent = time.monotonic()
        try:
            r = await stub.IsCreateTableDone(
                pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
                timeout=10,
            )
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            slowest = 10.0
            progress("IsCreateTableDone past its 10 s deadline")
            continue
        slowest = max(slowest, time.monotonic() - sent)
        if prefix is not None and (r.done or time.monotonic() - watched >= 1.0):
            # Once a second: listing 1,000 servers is work for the master being measured.
            watched = time.monotonic()
            live = await live_servers(stub, prefix)
            fewest = live if fewest < 0 else min(fewest, live)
        if r.done:
            return time.monotonic() - t0, fewest, slowest
        if time.monotonic() - reported >= 5.0:
            reported = time.monotonic()
            progress(
                f"{r.tablets_running}/{r.tablets_total} tablets RUNNING after {reported - t0:.0f} s"
            )
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{r.tablets_running}/{r.tablets_total} RUNNING after {timeout}s")
        await asyncio.sleep(0.2)


async def live_servers(stub: Any, prefix: str) -> int:
    r = await stub.ListTabletServers(pb.ListTabletServersRequestPB(), timeout=10)
    return sum(1 for s in r.servers if s.live and s.instance.permanent_uuid.startswith(prefix))


async def rpc_throughput(
    address: str, call: str, request: Any, clients: int, seconds: float
) -> float:
    """Calls of MasterService.`call` per second, `clients` callers over 4 channels."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    stubs = [master_pb2_grpc.MasterServiceStub(c) for c in channels]
    count = 0
    stop = time.monotonic() + seconds

    async def client(i: int) -> None:
        nonlocal count
        method = getattr(stubs[i % len(stubs)], call)
        while time.monotonic() < stop:
            await method(request, timeout=10)
            count += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.monotonic() - t0
    for c in channels:
        await c.close(None)
    return count / elapsed


@contextlib.contextmanager
def empty_server(workdir: Path) -> Iterator[str]:
    """`bench.grpc_baseline` (an empty grpc.aio server) in its own process; its address."""
    port_file = workdir / "baseline.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.grpc_baseline", "--port-file", str(port_file)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_for_port_file(proc, port_file, "bench.grpc_baseline")
        yield f"127.0.0.1:{port_file.read_text()}"
    finally:
        terminate_all([proc])


async def go_rounds(
    go: Path, targets: dict[str, tuple[str, str, bytes]], rounds: int, pid: int
) -> tuple[dict[str, list[go_load.LoadResult]], list[float]]:
    """`rounds` rounds of 5 s per target (name -> address, method, request), in turn, 32 Go
    clients each: on a noisy machine the targets then share its good and bad minutes. Also
    the master's CPU (cores) during each round's first target."""
    results: dict[str, list[go_load.LoadResult]] = {name: [] for name in targets}
    cpu: list[float] = []
    for r in range(rounds):
        for i, (name, (address, method, request)) in enumerate(targets.items()):
            progress(f"round {r + 1}/{rounds}: {name}, 32 clients of the Go load generator, 5 s")
            c0, t0 = cpu_seconds(pid), time.monotonic()
            result = await asyncio.to_thread(
                go_load.run, go, address, f"{SERVICE}/{method}", request, clients=32, seconds=5.0
            )
            if i == 0:
                cpu.append((cpu_seconds(pid) - c0) / (time.monotonic() - t0))
            assert result.errors == 0, (name, result)
            results[name].append(result)
    return results, cpu


def _median_rps(results: list[go_load.LoadResult]) -> float:
    return statistics.median(r.rps for r in results)


async def processes(args: argparse.Namespace, workdir: Path) -> None:
    # A 10 s unresponsive timeout: the create phase's fleet, stopped, is marked dead soon.
    overrides = {
        **FAST_RAFT,
        "bg_task_interval_ms": "200",
        "max_create_tablets_per_ts": "1000",
        "unresponsive_timeout_ms": "10000",
    }
    # Insecure for now: the simulated tablet servers heartbeat as 1,000 uuids from one process,
    # and the load generators speak plaintext; a secured run needs a certificate per simulated
    # server (the secured/insecure ratio is the benchmark's next figure).
    with MasterCluster(workdir / "masters", 1, overrides=overrides, secure=False) as cluster:
        address = cluster.addresses[0]
        pid = cluster.masters["master-1"].proc.pid  # type: ignore[union-attr]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            channel = grpc.aio.insecure_channel(address)
            stub: Any = master_pb2_grpc.MasterServiceStub(channel)
            progress("waiting for the master to lead")
            while True:
                try:
                    await stub.ListTables(pb.ListTablesRequestPB(), timeout=2)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)

            # create: a small fleet, one big table.
            sim, _ = start_sim([address], "c", 30, workdir)
            procs.append(sim)
            await wait_servers(stub, 30)
            progress(f"CreateTable with {args.tablets} tablets x 3")
            t0 = time.monotonic()
            table_id = await create_table(stub, "create", args.tablets, 1)
            await wait_running(stub, table_id, 300)
            secs = time.monotonic() - t0
            print(
                f"create   {args.tablets} tablets x 3 RUNNING on simulated servers in {secs:.2f} s"
            )

            req = pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_id=table_id))
            ping = pb.PingRequestPB()
            go, why = await asyncio.to_thread(go_load.build)
            with empty_server(workdir) as empty_address:
                go_line = f"Go load generator: none ({why})"
                if go is not None:
                    targets = {
                        "GetTableLocations on the master": (
                            address, "GetTableLocations", req.SerializeToString()),
                        "Ping on the master": (address, "Ping", ping.SerializeToString()),
                        "Ping on an empty grpc.aio server": (
                            empty_address, "Ping", ping.SerializeToString()),
                    }  # fmt: skip
                    results, cpus = await go_rounds(go, targets, args.rpc_rounds, pid)
                    gtl, own, empty_go = (results[name] for name in targets)
                    rps = _median_rps(gtl)
                    spread = (
                        f"median of {len(gtl)} rounds of 5 s:"
                        f" {min(r.rps for r in gtl):,.0f}-{max(r.rps for r in gtl):,.0f}"
                        if len(gtl) > 1
                        else "one round of 5 s"
                    )
                    go_line = (
                        f"{rps:,.0f} RPCs/s ({spread}) from 32 clients of the Go load generator,"
                        " p99"
                        f" {statistics.median(r.p99_us for r in gtl) / 1000:.1f} ms, master"
                        f" {statistics.median(cpus):.2f} core (goal >= 3,000/s); an empty"
                        f" grpc.aio server {_median_rps(empty_go):,.0f}/s: ratio"
                        f" {rps / _median_rps(empty_go):.2f}; the master's own Ping"
                        f" {_median_rps(own):,.0f}/s: ratio {rps / _median_rps(own):.2f}"
                    )
                progress("GetTableLocations RPCs, 32 Python clients")
                c0, t0 = cpu_seconds(pid), time.monotonic()
                rate = await rpc_throughput(address, "GetTableLocations", req, 32, 5.0)
                cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
                progress("Ping RPCs, the same Python clients, against an empty grpc.aio server")
                await rpc_throughput(empty_address, "Ping", ping, 32, 0.5)  # warm up
                empty = await rpc_throughput(empty_address, "Ping", ping, 32, 5.0)
            print(f"rpc      GetTableLocations {go_line}")
            print(
                f"rpc-py   GetTableLocations {rate:,.0f} RPCs/s from 32 Python clients (one"
                f" process on the same 2 cores), master {cpu:.2f} core; an empty grpc.aio server"
                f" {empty:,.0f}/s: ratio {rate / empty:.2f}"
            )
            terminate_all([sim])
            procs.remove(sim)

            # heartbeat: the big fleet, --replicas replicas in all.
            # Staggered: independent servers heartbeat at their own phase of the second.
            fleet, stats = start_sim([address], "h", args.servers, workdir, stagger=True)
            procs.append(fleet)
            await wait_servers(stub, args.servers, prefix="h-")
            # Tables of at most FLEET_TABLE_TABLETS tablets each, as many as it takes, once
            # the master has marked the create phase's servers dead (none is placed on them).
            await wait_dead(stub, "c-")
            tablets = args.replicas // 3
            per_table = [min(FLEET_TABLE_TABLETS, tablets - i)
                         for i in range(0, tablets, FLEET_TABLE_TABLETS)]  # fmt: skip
            for n, count in enumerate(per_table):
                progress(f"CreateTable {n + 1}/{len(per_table)}: {count} tablets x 3 on "
                         f"{args.servers} servers")  # fmt: skip
                table2 = await create_table(stub, f"fleet{n}", count, 2 + n)
                secs, fewest, slowest = await wait_running_watching(stub, table2, 600, "h-")
                if n == 0:
                    print(
                        f"spiral   {count}-tablet CreateTable on {args.servers} servers: RUNNING "
                        f"in {secs:.1f} s, fewest servers live meanwhile {fewest}/{args.servers} "
                        f"(goal: none marked dead), slowest IsCreateTableDone {slowest:.2f} s"
                    )
            progress("measuring 10 s of steady heartbeats")
            await asyncio.sleep(2.0)
            c0, t0 = cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(10.0)
            cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
            await asyncio.sleep(1.5)  # the simulator writes its statistics every second
            data = json.loads(stats.read_text())
            # p99 of the heartbeats of the simulator's last 10 s: the steady window, not the
            # creation of the tables before it.
            print(
                f"heartbeat {args.servers} servers x 1/s, {data['replicas']} replicas: master CPU "
                f"{cpu:.2f} core (goal < 0.5), heartbeat p99 {data['recent_p99_s'] * 1000:.1f} "
                f"ms over {data['recent_heartbeats']} heartbeats (goal < 50 ms)"
            )
            await channel.close(None)
        finally:
            terminate_all(procs)


async def wait_dead(stub: Any, prefix: str) -> None:
    while True:
        live = await live_servers(stub, prefix)
        if live == 0:
            return
        progress(f"{live} stopped servers {prefix}* not marked dead yet")
        await asyncio.sleep(1.0)


async def wait_servers(stub: Any, n: int, prefix: str = "") -> None:
    while True:
        live = await live_servers(stub, prefix)
        if live >= n:
            return
        progress(f"{live}/{n} simulated servers registered")
        await asyncio.sleep(0.5)


async def main_async(args: argparse.Namespace) -> None:
    progress("entry size")
    size = await entry_bytes(args.tablets)
    print(
        f"create   CreateTable entry for {args.tablets} tablets x 3: {size / 1024:.1f} KB "
        f"(Kudu ~117 KB for 1,000)"
    )
    progress(f"in-process lookups on a {args.lookup_tablets}-tablet table")
    p99 = await lookup_p99(args.lookup_tablets)
    print(
        f"lookup   GetTableLocations in-process p99 {p99 * 1e6:.1f} us on "
        f"{args.lookup_tablets} tablets (goal <= 100 us)"
    )
    with tempfile.TemporaryDirectory(prefix="master-bench-") as tmp:
        await processes(args, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.master_bench")
    p.add_argument("--tablets", type=int, default=1000)
    p.add_argument("--lookup-tablets", type=int, default=10_000)
    p.add_argument("--servers", type=int, default=1000)
    p.add_argument("--replicas", type=int, default=100_000)
    p.add_argument("--rpc-rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.servers, args.replicas, args.lookup_tablets = 100, 3000, 2000
        args.rpc_rounds = 1
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
