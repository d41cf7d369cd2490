"""Master benchmark (`make bench-master`): one line per figure, progress on stderr.

Secured, as the product ships: the master, its simulated tablet servers and every client speak
mutual TLS from a CA made for the run, and the master authorizes every call by certificate.
Each simulated server heartbeats over its own connection with its own `tserver` certificate
(service/testing/ts_simulator.py `--pki`), because a master accepts a heartbeat only from the
server it names; so the heartbeat figures are secured too. GetTableLocations and Raft commits
are also measured with security off, and the run ends with their ratios.

  create    CreateTable with --tablets tablets x 3 replicas: bytes of its ONE replicated entry
            (Kudu measured ~117 KB for 1,000 tablets) and seconds until every tablet
            is RUNNING on simulated tablet servers (a real master process, simulator process),
            on the secured master and on an insecure one with its own plaintext fleet
  lookup    GetTableLocations in-process p99 on a --lookup-tablets table (goal <= 100 us)
  rpc       GetTableLocations RPCs/s against the secured master process with 32 concurrent
            clients of the Go load generator over mutual TLS, as a user granted `read` on the
            table (so each call pays the grant check and an authz token's signature too:
            `Setup.load_identity`; bench/go_load.py; goal >= 3,000/s
            on this 2-core machine), the same clients' Ping RPCs/s against the master (its
            ceiling: gRPC's per-call cost in this process, without the lookup) and against an
            empty grpc.aio server with TLS (bench/grpc_baseline.py): what one Python gRPC
            process can answer here today. --rpc-rounds rounds (3; 1 with --quick) of 5 s
            each, every target in turn, so they share the machine's good and bad minutes;
            medians, the rate's range, ratios
  rpc-insecure  the same clients in plaintext against the insecure master (security.mode =
            "insecure", up at the same time, measured right after the secured one in every
            round), secured/insecure (goal >= 0.8), and the empty server in plaintext
  rpc-py    the same with 32 Python grpc.aio clients in the bench process, which take about
            as much CPU per call as the master and share its 2 cores, secured and insecure
  spiral    the first of the heartbeat fleet's tables (10,000 tablets x 3 at full scale): how
            long until RUNNING, and the fewest servers the master held live meanwhile (a busy
            master must never declare its servers dead: progress_clock, bounded rounds)
  heartbeat --servers simulated servers heartbeating every second, hosting --replicas
            replicas in all: the master process's CPU (fraction of one core, from
            /proc/<pid>/stat) and the heartbeat p99 latency the simulator measured
            (goals: < 0.5 core, p99 < 50 ms)
  raft      Raft commits/s, secured and insecure: bench.raft_commit's Tessera measurement
            (3 KV demo nodes, fsync on, 64 clients over PutStream), run once every master is
            stopped, so that bench-master reports both security goals
  security-overhead: raft-commit S1, get-table-locations S2
            the last line: each S is secured / insecure, two decimals (goals >= 0.8); S2 from
            the Go load generator's figures, the Python clients' where Go is missing

Usage: python -m bench.master_bench [--tablets 1000] [--servers 1000] [--replicas 100000]
       [--rpc-rounds 3] [--raft-seconds 10] [--quick]
       (--quick: --servers 100 --replicas 3000 --lookup-tablets 2000 --rpc-rounds 1
       --raft-seconds 2, a smoke run)
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench import go_load, raft_commit
from service.common.clock import ManualClock
from service.common.ids import NodeId
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.pki import IdentityFiles
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.common.tls import Credentials, open_channel
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
from service.tools.launcher import terminate_all

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


def catalog_on_fleet(servers: int) -> tuple[CatalogManager, _Replicate]:
    """A loaded, empty catalog manager in process, `servers` registered tablet servers, and
    the in-memory replication it writes through (also bench/master_promotion.py)."""
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
    return cm, rep


async def mark_running(cm: CatalogManager, rep: _Replicate, table_id: str) -> None:
    """Every tablet of the table RUNNING with a leader, as report processing would record it
    (one write; also bench/master_promotion.py)."""
    ops = []
    for info in cm.maps.tables_by_id[table_id].tablets.values():  # type: ignore[index]
        rec = info.record
        assert rec.consensus is not None
        cs = replace(rec.consensus, term=1, leader_uuid=rec.consensus.peers[0].uuid)
        ops.append(Update(replace(rec, state=TabletState.RUNNING, consensus=cs)))
    await rep(CatalogWrite(ops=tuple(ops)).encode(), 1.0)


async def in_process(tablets: int, servers: int) -> tuple[CatalogManager, _Replicate, str]:
    cm, rep = catalog_on_fleet(servers)
    table_id = await cm.create_table("bench", SCHEMA, partitioning(tablets), 3, RequestId("b", 1))
    return cm, rep, table_id


async def entry_bytes(tablets: int) -> int:
    _, rep, _ = await in_process(tablets, 10)
    return rep.sizes[-1]


async def lookup_p99(tablets: int) -> float:
    cm, rep, table_id = await in_process(tablets, 30)
    await cm.assign_tablets(max_tablets=tablets)  # all in one round
    await mark_running(cm, rep, table_id)
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
    masters: list[str],
    prefix: str,
    count: int,
    workdir: Path,
    *,
    stagger: bool = False,
    pki: Path | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    """`count` simulated tablet servers `<prefix>-NNNN` in one process, heartbeating to
    `masters`; with `pki` (the masters' CA directory), each over mutual TLS as itself."""
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
            *(["--pki", str(pki)] if pki is not None else []),
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
    address: str,
    call: str,
    request: Any,
    clients: int,
    seconds: float,
    creds: Credentials | None = None,
) -> float:
    """Calls of MasterService.`call` per second, `clients` callers over 4 channels (mutual TLS
    as `creds`, plaintext without)."""
    channels = [open_channel(address, creds, role="master") for _ in range(4)]
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
def empty_server(workdir: Path, credentials: Path | None) -> Iterator[str]:
    """`bench.grpc_baseline` (an empty grpc.aio server) in its own process, serving mutual TLS
    as the identity in the directory `credentials` or plaintext; its address."""
    port_file = workdir / f"baseline-{'tls' if credentials else 'plaintext'}.port"
    tls = ["--credentials", str(credentials)] if credentials is not None else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.grpc_baseline", "--port-file", str(port_file), *tls],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_for_port_file(proc, port_file, "bench.grpc_baseline")
        yield f"127.0.0.1:{port_file.read_text()}"
    finally:
        terminate_all([proc])


@dataclass(frozen=True)
class GoTarget:
    """One thing the Go load generator measures: a method of a server, as an identity."""

    address: str
    method: str
    request: bytes
    credentials: IdentityFiles | None
    """Mutual TLS as this identity; None: plaintext."""
    pid: int | None = None
    """The server process whose CPU is sampled while it is measured."""


async def go_rounds(
    go: Path, targets: dict[str, GoTarget], rounds: int
) -> tuple[dict[str, list[go_load.LoadResult]], dict[str, list[float]]]:
    """`rounds` rounds of 5 s per target, in turn, 32 Go clients each: on a noisy machine the
    targets then share its good and bad minutes. Also, per target with a pid, that process's
    CPU (cores) during each of its runs."""
    results: dict[str, list[go_load.LoadResult]] = {name: [] for name in targets}
    cpu: dict[str, list[float]] = {name: [] for name in targets}
    for r in range(rounds):
        for name, t in targets.items():
            progress(
                f"round {r + 1}/{rounds}: {name}, 32 clients of the Go load generator, 5 s"
                f" (load average {os.getloadavg()[0]:.2f})"
            )
            c0, t0 = (cpu_seconds(t.pid) if t.pid else 0.0), time.monotonic()
            result = await asyncio.to_thread(
                go_load.run,
                go,
                t.address,
                f"{SERVICE}/{t.method}",
                t.request,
                clients=32,
                seconds=5.0,
                credentials=t.credentials,
            )
            if t.pid:
                cpu[name].append((cpu_seconds(t.pid) - c0) / (time.monotonic() - t0))
            assert result.errors == 0, (name, result)
            results[name].append(result)
    return results, cpu


def _median_rps(results: list[go_load.LoadResult]) -> float:
    return statistics.median(r.rps for r in results)


def _spread(results: list[go_load.LoadResult]) -> str:
    if len(results) == 1:
        return "one round of 5 s"
    low, high = min(r.rps for r in results), max(r.rps for r in results)
    return f"median of {len(results)} rounds of 5 s: {low:,.0f}-{high:,.0f}"


OVERRIDES = {
    **FAST_RAFT,
    "bg_task_interval_ms": "200",
    "max_create_tablets_per_ts": "1000",
    "unresponsive_timeout_ms": "10000",
}
"""A 10 s unresponsive timeout: the create phase's fleet, stopped, is marked dead soon."""

LOAD_USER = "bench-reader"
"""The user the GetTableLocations load runs as, granted `read` on the table."""

CREATE_FLEET = 30
"""Simulated servers the create phase's table is placed on (and the rpc figures' table lives)."""


@dataclass
class Setup:
    """One master process, a small simulated fleet and a table of --tablets tablets on it."""

    cluster: MasterCluster
    address: str
    pid: int
    channel: grpc.aio.Channel
    stub: Any
    sim: subprocess.Popen[bytes]
    table_id: str
    create_s: float
    """Seconds from CreateTable until every tablet was RUNNING."""

    @property
    def load_identity(self) -> IdentityFiles | None:
        """The load generators' identity (None: insecure): a `user` granted `read` on the
        table (`set_up`), as a Spark job or an application calls. So the secured figure pays
        for everything a user's lookup costs: TLS, the role check, the per-table grant check
        and signing the authz token that comes with the locations. (An admin skips the
        grant check, which would flatter the figure.)"""
        pki = self.cluster.pki
        return None if pki is None else pki.files("user", LOAD_USER)

    def load_credentials(self) -> Credentials | None:
        files = self.load_identity
        return None if files is None else Credentials.from_files(files)

    def locations_request(self) -> pb.GetTableLocationsRequestPB:
        return pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_id=self.table_id))


async def set_up(
    cluster: MasterCluster, workdir: Path, prefix: str, tablets: int, procs: list[Any]
) -> Setup:
    """Wait for `cluster`'s one master to lead, start CREATE_FLEET simulated servers for it
    (secured like the master), and create a `tablets`-tablet table on them."""
    what = "secured" if cluster.pki is not None else "insecure"
    address = cluster.addresses[0]
    proc = cluster.masters["master-1"].proc
    assert proc is not None
    channel = cluster.channel(address)  # as the cluster's admin: CreateTable is DDL
    stub: Any = master_pb2_grpc.MasterServiceStub(channel)
    progress(f"waiting for the {what} master to lead")
    while True:
        try:
            await stub.ListTables(pb.ListTablesRequestPB(), timeout=2)
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    pki = None if cluster.pki is None else cluster.pki.directory
    sim, _ = start_sim([address], prefix, CREATE_FLEET, workdir, pki=pki)
    procs.append(sim)
    await wait_servers(stub, CREATE_FLEET, prefix=f"{prefix}-")
    progress(f"CreateTable with {tablets} tablets x 3 on the {what} master")
    t0 = time.monotonic()
    table_id = await create_table(stub, "create", tablets, 1)
    await wait_running(stub, table_id, 300)
    create_s = time.monotonic() - t0
    if cluster.pki is not None:
        await stub.GrantPrivileges(
            pb.GrantPrivilegesRequestPB(
                request_id=pb.RequestIdPB(client_id="bench", seq_no=2),
                table=pb.TableIdentifierPB(table_id=table_id),
                user=LOAD_USER,
                privileges=[pb.PRIVILEGE_READ],
            ),
            timeout=30,
        )
    return Setup(cluster, address, proc.pid, channel, stub, sim, table_id, create_s)


async def rpc_figures(args: argparse.Namespace, workdir: Path, sec: Setup, ins: Setup) -> float:
    """Print the `rpc`, `rpc-insecure` and `rpc-py` lines; GetTableLocations secured/insecure
    (from the Go load generator's figures where Go is available, the Python clients' else)."""
    assert sec.cluster.pki is not None
    empty_identity = sec.cluster.pki.export("master", "empty-server", workdir / "empty-creds")
    go, why = await asyncio.to_thread(go_load.build)
    with (
        empty_server(workdir, empty_identity.ca_file.parent) as empty_tls,
        empty_server(workdir, None) as empty_plain,
    ):
        ratio = 0.0
        if go is None:
            print(f"rpc      GetTableLocations: no Go load generator ({why})")
        else:
            ping = pb.PingRequestPB().SerializeToString()
            user = sec.load_identity
            targets = {
                "GetTableLocations, secured master": GoTarget(
                    sec.address, "GetTableLocations", sec.locations_request().SerializeToString(),
                    user, sec.pid),
                "GetTableLocations, insecure master": GoTarget(
                    ins.address, "GetTableLocations", ins.locations_request().SerializeToString(),
                    None, ins.pid),
                "Ping, secured master": GoTarget(sec.address, "Ping", ping, user),
                "Ping, empty server with TLS": GoTarget(empty_tls, "Ping", ping, user),
                "Ping, empty server in plaintext": GoTarget(empty_plain, "Ping", ping, None),
            }  # fmt: skip
            results, cpus = await go_rounds(go, targets, args.rpc_rounds)
            s_gtl, i_gtl, own, e_tls, e_plain = results.values()
            s_cpu, i_cpu = (statistics.median(c) for c in list(cpus.values())[:2])
            rps, rps_i = _median_rps(s_gtl), _median_rps(i_gtl)
            ratio = rps / rps_i
            print(
                f"rpc      GetTableLocations {rps:,.0f} RPCs/s ({_spread(s_gtl)}) from 32 clients"
                " of the Go load generator over mutual TLS, p99"
                f" {statistics.median(r.p99_us for r in s_gtl) / 1000:.1f} ms, master"
                f" {s_cpu:.2f} core (goal >= 3,000/s); an empty grpc.aio server with TLS"
                f" {_median_rps(e_tls):,.0f}/s: ratio {rps / _median_rps(e_tls):.2f}; the"
                f" master's own Ping {_median_rps(own):,.0f}/s: ratio {rps / _median_rps(own):.2f}"
            )
            print(
                f"rpc-insecure GetTableLocations {rps_i:,.0f} RPCs/s ({_spread(i_gtl)}) from the"
                ' same clients in plaintext, master with security.mode = "insecure", p99'
                f" {statistics.median(r.p99_us for r in i_gtl) / 1000:.1f} ms, master"
                f" {i_cpu:.2f} core; secured/insecure {ratio:.2f} (goal >= 0.8); an empty"
                f" grpc.aio server in plaintext {_median_rps(e_plain):,.0f}/s (with TLS:"
                f" {_median_rps(e_tls) / _median_rps(e_plain):.2f} of that)"
            )
        progress("GetTableLocations RPCs, 32 Python clients over mutual TLS")
        creds = sec.load_credentials()
        c0, t0 = cpu_seconds(sec.pid), time.monotonic()
        rate = await rpc_throughput(
            sec.address, "GetTableLocations", sec.locations_request(), 32, 5.0, creds
        )
        cpu = (cpu_seconds(sec.pid) - c0) / (time.monotonic() - t0)
        progress("the same, plaintext, against the insecure master")
        rate_i = await rpc_throughput(
            ins.address, "GetTableLocations", ins.locations_request(), 32, 5.0
        )
        progress("Ping RPCs, the same Python clients, against an empty grpc.aio server with TLS")
        ping_req = pb.PingRequestPB()
        await rpc_throughput(empty_tls, "Ping", ping_req, 32, 0.5, creds)  # warm up
        empty = await rpc_throughput(empty_tls, "Ping", ping_req, 32, 5.0, creds)
    print(
        f"rpc-py   GetTableLocations {rate:,.0f} RPCs/s from 32 Python clients over mutual TLS"
        f" (one process on the same 2 cores), master {cpu:.2f} core; an empty grpc.aio server"
        f" with TLS {empty:,.0f}/s: ratio {rate / empty:.2f}; the insecure master in plaintext"
        f" {rate_i:,.0f}/s: secured/insecure {rate / rate_i:.2f}"
    )
    return ratio if go is not None else rate / rate_i


async def processes(args: argparse.Namespace, workdir: Path) -> float:
    """The figures of real processes, on a secured master (the product's default) with
    simulated servers heartbeating over mutual TLS; GetTableLocations also against a master
    with security.mode = "insecure" and its own plaintext fleet, both up at once so that the
    rounds alternate between them. Returns GetTableLocations secured/insecure."""
    procs: list[subprocess.Popen[bytes]] = []
    with MasterCluster(workdir / "secured", 1, overrides=OVERRIDES) as cluster:
        try:
            sec = await set_up(cluster, workdir, "c", args.tablets, procs)
            plain = MasterCluster(workdir / "insecure", 1, overrides=OVERRIDES, secure=False)
            with plain:
                ins = await set_up(plain, workdir, "p", args.tablets, procs)
                print(
                    f"create   {args.tablets} tablets x 3 RUNNING on simulated servers in"
                    f" {sec.create_s:.2f} s (secured; the insecure master and fleet:"
                    f" {ins.create_s:.2f} s)"
                )
                ratio = await rpc_figures(args, workdir, sec, ins)
                await ins.channel.close(None)
                terminate_all([ins.sim])
                procs.remove(ins.sim)
            terminate_all([sec.sim])
            procs.remove(sec.sim)
            await heartbeat_figures(args, workdir, sec, procs)
            await sec.channel.close(None)
        finally:
            terminate_all(procs)
    return ratio


async def heartbeat_figures(
    args: argparse.Namespace, workdir: Path, sec: Setup, procs: list[subprocess.Popen[bytes]]
) -> None:
    """The `spiral` and `heartbeat` lines: --servers simulated servers, each over its own
    mutual-TLS connection, hosting --replicas replicas created as tables of at most
    FLEET_TABLE_TABLETS tablets."""
    stub, pid = sec.stub, sec.pid
    # Staggered: independent servers heartbeat at their own phase of the second.
    assert sec.cluster.pki is not None
    fleet, stats = start_sim(
        [sec.address], "h", args.servers, workdir, stagger=True, pki=sec.cluster.pki.directory
    )
    procs.append(fleet)
    await wait_servers(stub, args.servers, prefix="h-")
    # Once the master has marked the create phase's servers dead (none is placed on them).
    await wait_dead(stub, "c-")
    tablets = args.replicas // 3
    per_table = [min(FLEET_TABLE_TABLETS, tablets - i)
                 for i in range(0, tablets, FLEET_TABLE_TABLETS)]  # fmt: skip
    for n, count in enumerate(per_table):
        progress(f"CreateTable {n + 1}/{len(per_table)}: {count} tablets x 3 on "
                 f"{args.servers} servers")  # fmt: skip
        table2 = await create_table(stub, f"fleet{n}", count, 100 + n)  # 2 is set_up's grant
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
        f"heartbeat {args.servers} servers x 1/s over mutual TLS, {data['replicas']} replicas:"
        f" master CPU {cpu:.2f} core (goal < 0.5), heartbeat p99"
        f" {data['recent_p99_s'] * 1000:.1f} ms over {data['recent_heartbeats']} heartbeats"
        " (goal < 50 ms)"
    )


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


async def raft_figure(args: argparse.Namespace) -> float:
    """The `raft` line: bench.raft_commit's Tessera measurement (3 KV demo nodes, PutStream,
    64 clients), secured and insecure, once every master process is gone. Returns
    secured/insecure."""
    progress("Raft commits (bench.raft_commit's tessera rows): secured, then insecure")
    # In a thread: the measurement runs its own event loops (asyncio.run).
    rows = await asyncio.to_thread(
        raft_commit.run_secured_and_insecure, 64, args.raft_seconds, args.raft_warmup, 16, 1
    )
    secured, insecure = (row.result.rate if row.result else 0.0 for row in rows)
    overhead = raft_commit.security_overhead(rows)
    print(
        f"raft     {secured:,.0f} commits/s over mutual TLS (3 KV demo nodes, fsync on, 64"
        f" clients over PutStream, {args.raft_seconds:g} s); insecure {insecure:,.0f}/s:"
        f" secured/insecure {overhead:.2f} (goal >= 0.8)"
    )
    return overhead


async def main_async(args: argparse.Namespace) -> None:
    # The machines are shared: a figure means little without the load it was measured under.
    progress(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; entry size")
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
        locations = await processes(args, Path(tmp))
    raft = await raft_figure(args)
    print(f"security-overhead: raft-commit {raft:.2f}, get-table-locations {locations:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.master_bench")
    p.add_argument("--tablets", type=int, default=1000)
    p.add_argument("--lookup-tablets", type=int, default=10_000)
    p.add_argument("--servers", type=int, default=1000)
    p.add_argument("--replicas", type=int, default=100_000)
    p.add_argument("--rpc-rounds", type=int, default=3)
    p.add_argument("--raft-seconds", type=float, default=10.0, help="measured, per mode")
    p.add_argument("--raft-warmup", type=float, default=2.0)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.servers, args.replicas, args.lookup_tablets = 100, 3000, 2000
        args.rpc_rounds = 1
        args.raft_seconds, args.raft_warmup = 2.0, 0.5
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
