"""Catalog scale benchmark (`make bench-scale`): 3 real masters and a simulated fleet grow a
catalog table by table, then the leader is killed three times. Rows on stdout, progress on
stderr. A benchmark, not a test: the goals are printed next to the figures, never asserted.

Secured, as the product ships: the masters speak mutual TLS from a CA made for the run, and each
simulated tablet server heartbeats over its own connection with its own certificate
(service/testing/ts_simulator.py `--pki`). The fleet runs as `--shards` simulator processes
(service/testing/ts_simulator_shards.py), each with its own event loop, and follows Raft's
majority rule, so a tablet the master sees RUNNING has a leader a majority of real (simulated)
replicas stand behind. The masters keep the product's Raft timing (conf/master.toml); only the
assignment pace is raised, as bench-master does (`OVERRIDES`).

  table     after each table of --table-tablets tablets (created one at a time until the
            catalog holds --target tablets): the catalog size, the create time (CreateTable
            until IsCreateTableDone says every tablet RUNNING; goal <= 60 s), the leader's CPU
            over the step (fraction of one core, /proc/<pid>/stat) and RSS (/proc/<pid>/status),
            the simulator's CPU over the step (all its processes), and the elections seen so far
  failover  the leader killed (SIGKILL) and restarted 3 times: time to a new leader (by
            its own log, and until ConnectToMaster answers LEADER, which waits for a
            majority to confirm it, so the gap is the new leader's and its follower's
            responsiveness, not the election), to the first correct GetTableLocations of a probe
            table (every tablet listed with a LEADER replica; goal <= 3 s) and for a small
            CreateTable to be RUNNING (goal <= 10 s), each measured from the kill (the
            signal; the line also says when the process was gone); and when the new leader
            had read every server's full report, with its full-report turns (not a goal)
  scale: T tablets, E unprovoked elections, create max C s, replaced R (P%), failover lookup
            p100 L s
            the last line; E counts the term changes seen while the catalog grew and through
            the census after it, until the first kill (nothing was killed then: goal 0),
            watched on every master by ConnectToMaster twice a second;
            R the tablets REPLACED in the catalog after the growth (goal: under 1%)

`--burners N` runs N CPU-bound busy loops beside everything, to stand in for a slower machine
(docs/design/catalog.md#R16: the master must slow down, not replace or elect).

A create that is not RUNNING within --create-timeout seconds ends the growth early with a clear
message (the failover figures are still measured on the catalog reached).

Usage: python -m bench.scale_bench [--target 200000] [--servers 1000] [--table-tablets 10000]
       [--shards 2] [--create-timeout 600] [--quick] [--burners N] [--set KEY=VALUE ...]
       [--keep-logs DIR]
       (--quick: --target 20000 --servers 100, a small run)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from bench.fleet_census import take_census
from bench.master_bench import SCHEMA, cpu_seconds, partitioning, wait_for_port_file
from bench.master_failover_scale import metric, metrics
from bench.overload_bench import burners
from service.client.channels import ChannelPool
from service.client.master_client import MasterClient
from service.common.errors import from_grpc
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import MasterCluster
from service.tools.launcher import terminate_all

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {"bg_task_interval_ms": "200", "max_create_tablets_per_ts": "1000"}
"""The assignment pace bench-master uses; Raft timing and liveness stay the product's."""
GOAL_CREATE_S = 60.0
GOAL_LOOKUP_S = 3.0
GOAL_SMALL_CREATE_S = 10.0
PROBE_TABLETS = 10
KILLS = 3


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Masters:
    """Admin stubs to each master and a watcher of their terms (ConnectToMaster)."""

    cluster: MasterCluster
    stubs: dict[str, Any] = field(default_factory=dict)
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    terms: dict[str, int] = field(default_factory=dict)
    leader: str = ""
    leader_term: int = 0
    elections: int = 0
    """Increases of the highest term seen (each is at least one election)."""

    def stub(self, address: str) -> Any:
        if address not in self.stubs:
            ch = self.cluster.channel(address)
            self.channels.append(ch)
            self.stubs[address] = master_pb2_grpc.MasterServiceStub(ch)
        return self.stubs[address]

    async def poll(self) -> None:
        """Ask every master at once (as the client library does): a poll takes as long as the
        slowest answer (at most the 2 s timeout), not the sum of them."""

        async def ask(address: str) -> pb.ConnectToMasterResponsePB | None:
            try:
                r: pb.ConnectToMasterResponsePB = await self.stub(address).ConnectToMaster(
                    pb.ConnectToMasterRequestPB(), timeout=2
                )
            except grpc.aio.AioRpcError:
                return None
            return r

        addresses = self.cluster.addresses
        answers = await asyncio.gather(*map(ask, addresses))
        for address, r in zip(addresses, answers, strict=True):
            if r is None:
                continue
            self.terms[address] = max(self.terms.get(address, 0), r.term)
            if r.role == pb.LEADER and r.term >= self.leader_term:
                self.leader = address
            top = max(self.terms.values())
            if top > self.leader_term:
                if self.leader_term:
                    self.elections += top - self.leader_term
                self.leader_term = top

    async def watch(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(0.5)

    async def leader_stub(self) -> Any:
        while not self.leader:
            await self.poll()
            await asyncio.sleep(0.1)
        return self.stub(self.leader)

    def leader_pid(self) -> int:
        proc = self.cluster.by_address(self.leader).proc
        assert proc is not None
        return proc.pid

    async def aclose(self) -> None:
        for ch in self.channels:
            await ch.close(None)


_SEQ = itertools.count(1)
"""Request sequence numbers of the bench's client, one per CreateTable, always increasing: a
master remembers only a client's latest results, so a number reused after twenty creates is
refused as stale (and one reused earlier would be answered with the first table's id)."""


def create_request(name: str, tablets: int) -> pb.CreateTableRequestPB:
    """A CreateTable of `tablets` tablets x 3 replicas (no request id yet)."""
    return pb.CreateTableRequestPB(
        name=name,
        schema=schema_to_pb(SCHEMA),
        partition_schema=partition_schema_to_pb(partitioning(tablets), SCHEMA),
        num_replicas=3,
    )


async def create_table(m: Masters, name: str, tablets: int) -> str:
    """CreateTable through whichever master leads (retried, with the same request id, while
    there is none)."""
    req = create_request(name, tablets)
    req.request_id.CopyFrom(pb.RequestIdPB(client_id="scale-bench", seq_no=next(_SEQ)))
    while True:
        stub = await m.leader_stub()
        try:
            return str((await stub.CreateTable(req, timeout=120)).table_id)
        except grpc.aio.AioRpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            m.leader = ""
            await asyncio.sleep(0.1)


async def wait_running(m: Masters, table_id: str, timeout: float, quiet: bool = False) -> float:
    """Seconds until IsCreateTableDone says done; TimeoutError past `timeout`."""
    t0 = time.monotonic()
    reported = t0
    req = pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id))
    while True:
        try:
            r = await (await m.leader_stub()).IsCreateTableDone(req, timeout=10)
        except grpc.aio.AioRpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            m.leader = ""
            await asyncio.sleep(0.1)
            continue
        if r.done:
            return time.monotonic() - t0
        now = time.monotonic()
        if now - t0 > timeout:
            raise TimeoutError(
                f"{r.tablets_running}/{r.tablets_total} tablets RUNNING after {timeout:.0f} s"
            )
        if not quiet and now - reported >= 10:
            reported = now
            progress(f"{r.tablets_running}/{r.tablets_total} RUNNING after {now - t0:.0f} s")
        await asyncio.sleep(0.2)


def start_fleet(
    args: argparse.Namespace, cluster: MasterCluster, workdir: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    port_file = workdir / "fleet.port"
    assert cluster.pki is not None
    cmd = [sys.executable, "-m", "service.testing.ts_simulator", "--masters"]
    cmd += [",".join(cluster.addresses), "--uuid", "sc", "--count", str(args.servers)]
    cmd += ["--port-file", str(port_file), "--stats-file", str(workdir / "fleet.stats")]
    cmd += ["--stagger", "--pki", str(cluster.pki.directory), "--shards", str(args.shards)]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "fleet.log").open("wb"),
    )
    wait_for_port_file(proc, port_file, "the simulated fleet")
    return proc, port_file


def fleet_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


async def wait_servers(m: Masters, n: int) -> None:
    while True:
        stub = await m.leader_stub()
        try:
            r = await stub.ListTabletServers(pb.ListTabletServersRequestPB(), timeout=10)
        except grpc.aio.AioRpcError:
            m.leader = ""
            continue
        live = sum(1 for s in r.servers if s.live)
        if live >= n:
            return
        progress(f"{live}/{n} simulated servers registered")
        await asyncio.sleep(1.0)


async def grow(args: argparse.Namespace, m: Masters, sim_pids: list[int]) -> tuple[int, float]:
    """Tables of --table-tablets until --target; returns (tablets, slowest create)."""
    catalog = 0
    slowest = 0.0
    steps = max(1, -(-args.target // args.table_tablets))
    for n in range(steps):
        count = min(args.table_tablets, args.target - catalog)
        pid = m.leader_pid()
        c0, s0, t0 = cpu_seconds(pid), fleet_cpu(sim_pids), time.monotonic()
        progress(f"table {n + 1}/{steps}: CreateTable {count} tablets x 3 (catalog {catalog})")
        try:
            table_id = await create_table(m, f"scale{n}", count)
            secs = await wait_running(m, table_id, args.create_timeout)
        except TimeoutError as e:
            print(
                f"stopped  table {n + 1}/{steps} ({count} tablets) not RUNNING within"
                f" --create-timeout: {e}; the catalog stays at {catalog} tablets"
            )
            return catalog, max(slowest, args.create_timeout)
        elapsed = time.monotonic() - t0
        catalog += count
        slowest = max(slowest, secs)
        same = m.leader_pid() == pid
        cpu = (cpu_seconds(pid) - c0) / elapsed if same else float("nan")
        sim_cpu = (fleet_cpu(sim_pids) - s0) / elapsed
        progress(
            f"table {n + 1}/{steps} done: {catalog} tablets, leader {m.leader} term"
            f" {m.leader_term}, load average {os.getloadavg()[0]:.2f}"
        )
        print(
            f"table    {n + 1}/{steps} catalog {catalog} tablets: create {secs:.1f} s (goal <="
            f" {GOAL_CREATE_S:.0f}), leader CPU {cpu:.2f} core, RSS {rss_mb(m.leader_pid()):.0f}"
            f" MB, simulator CPU {sim_cpu:.2f} core, elections {m.elections} (goal 0)",
            flush=True,
        )
    return catalog, slowest


def correct_locations(r: pb.GetTableLocationsResponsePB, tablets: set[str]) -> bool:
    """Every probe tablet listed, each with a LEADER among its replicas."""
    seen = {t.tablet_id for t in r.tablet_locations}
    leaders = all(any(x.role == pb.LEADER for x in t.replicas) for t in r.tablet_locations)
    return seen == tablets and leaders


class ClientRetries(logging.Handler):
    """The client library's retries during a small create (its DEBUG lines: each failed
    attempt or discovery round and why), as steps "retry at T s: reason" from `t0`, so a
    create acknowledged late says whether the client waited for a leader, a loading catalog
    or an answer."""

    LOGGER = "service.client.master_client"

    def __init__(self, t0: float, steps: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.t0, self.steps = t0, steps
        self._last: list[Any] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        reason = record.getMessage()
        now = time.monotonic() - self.t0
        if self._last is not None and self._last[2] == reason:  # a run of the same: merged
            self._last[1], self._last[3] = now, self._last[3] + 1
        else:
            self._last = [now, now, reason, 1]
            self.steps.append("")
        first, last, _, n = self._last
        when = f"{first:.2f}-{last:.2f} s x{n}" if n > 1 else f"{first:.2f} s"
        self.steps[-1] = f"client retry {when}: {reason[:240]}"

    def __enter__(self) -> ClientRetries:
        logger = logging.getLogger(self.LOGGER)
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.removeHandler(self)
        logger.setLevel(self._level)


class Trace:
    """What each probe attempt got, per master, as seconds from the kill: printed when a
    failover misses a goal, so the figure comes with the reason (runs of the same outcome are
    merged: `0.41-1.62 FOLLOWER x57`)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.runs: dict[str, list[list[Any]]] = {}

    def add(self, address: str, started: float, outcome: str) -> None:
        runs = self.runs.setdefault(address, [])
        now = time.monotonic() - self.t0
        if runs and runs[-1][2] == outcome:
            runs[-1][1], runs[-1][3] = now, runs[-1][3] + 1
        else:
            runs.append([started - self.t0, now, outcome, 1])

    def lines(self, m: Masters, what: str) -> list[str]:
        out = []
        for address, runs in self.runs.items():
            name = m.cluster.by_address(address).name
            steps = ", ".join(f"{a:.2f}-{b:.2f} {o} x{n}" for a, b, o, n in runs)
            out.append(f"{what} on {name}: {steps}")
        return out


async def first_from_any(
    addresses: list[str], ask: Callable[[str], Awaitable[T | str]], trace: Trace
) -> T:
    """The first answer `ask(address)` gives that is not a string (a string says why the
    answer is not the one awaited), asking each of `addresses` in a loop of its own (every
    20 ms; an RPC error is an answer not awaited): a master slow to answer delays only its
    own loop, as with a client that asks every master at once. Every answer goes to `trace`."""

    async def keep_asking(address: str) -> T:
        while True:
            started = time.monotonic()
            try:
                answer = await ask(address)
            except grpc.aio.AioRpcError as e:
                answer = type(from_grpc(e)).__name__  # NotTheLeader, NotReady, Timeout...
            if not isinstance(answer, str):
                trace.add(address, started, "ok")
                return answer
            trace.add(address, started, answer)
            await asyncio.sleep(0.02)

    tasks = [asyncio.create_task(keep_asking(a)) for a in addresses]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_correct_lookup(m: Masters, table_id: str, tablets: set[str], trace: Trace) -> float:
    """Seconds from the kill until a surviving master answers GetTableLocations correctly."""
    req = pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_id=table_id))

    async def ask(address: str) -> float | str:
        r = await m.stub(address).GetTableLocations(req, timeout=1)
        if correct_locations(r, tablets):
            return time.monotonic() - trace.t0
        listed = {t.tablet_id for t in r.tablet_locations}
        led = sum(any(x.role == pb.LEADER for x in t.replicas) for t in r.tablet_locations)
        return f"{len(listed & tablets)} listed, {led} with a leader"

    alive = [a for a in m.cluster.addresses if m.cluster.by_address(a).alive]
    return await first_from_any(alive, ask, trace)


async def new_leader(m: Masters, old: str, old_term: int, trace: Trace) -> tuple[float, int]:
    """Seconds from the kill until another master answers ConnectToMaster as the leader of a
    later term, and how many terms later (more than 1: an election failed first, typically
    two followers that split the vote)."""

    async def ask(address: str) -> tuple[float, int] | str:
        r = await m.stub(address).ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=1)
        if r.role == pb.LEADER and r.term > old_term:
            return time.monotonic() - trace.t0, r.term - old_term
        return f"{pb.RaftRolePB.Name(r.role)} term {r.term}"

    return await first_from_any([a for a in m.cluster.addresses if a != old], ask, trace)


def elected_in_log(log: Path, term: int) -> float | None:
    """The wall-clock time a master's log says it became the leader of `term` (its
    "term T, role LEADER" line), or None if it does not say so."""
    mark = f"term {term}, role LEADER"
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if mark in line:
                stamp = datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
                return stamp.replace(tzinfo=UTC).timestamp()
    return None


def elected_by_log(m: Masters, term: int, killed_at: float) -> str:
    """Seconds from the kill (`killed_at`, wall clock) until some master's log says it led
    `term`, for the failover line."""
    for node in m.cluster.masters.values():
        at = elected_in_log(node.log, term)
        if at is not None:
            return f"{at - killed_at:.2f} s"
    return "?"


async def settled_fleet_stats(path: Path, catalog: int, wait_s: float = 10.0) -> dict[str, Any]:
    """The fleet's statistics once they count every replica and leader of `catalog` tablets,
    or as they are after `wait_s`. The file lags the fleet by up to two seconds (each shard
    writes its own every second, and the fleet merges them every second), so read at once
    after the last create it missed the last tablets' leaders."""
    deadline = time.monotonic() + wait_s
    while True:
        stats: dict[str, Any] = json.loads(path.read_text())
        settled = stats.get("replicas") == 3 * catalog and stats.get("leaders") == catalog
        if settled or time.monotonic() >= deadline:
            return stats
        await asyncio.sleep(0.5)


async def failovers(args: argparse.Namespace, m: Masters) -> list[tuple[float, float, float]]:
    progress(f"probe table of {PROBE_TABLETS} tablets for the failover lookups")
    probe = await create_table(m, "probe", PROBE_TABLETS)
    await wait_running(m, probe, args.create_timeout)
    # The client library's view for the small creates: it learns the leader here, as a
    # client in use would have before the kill.
    client = MasterClient(m.cluster.addresses, ChannelPool(m.cluster.credentials()))
    out = []
    try:
        r = await client.call(
            "GetTableLocations",
            pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_id=probe)),
            timeout=30,
        )
        tablets = {t.tablet_id for t in r.tablet_locations}
        for k in range(KILLS):
            out.append(await failover(args, m, client, k, probe, tablets))
    finally:
        await client.aclose()
    return out


async def failover(
    args: argparse.Namespace,
    m: Masters,
    client: MasterClient,
    k: int,
    probe: str,
    tablets: set[str],
) -> tuple[float, float, float]:
    """Kill the leader, measure the failover (module docstring), restart the master killed."""
    await m.poll()
    old, old_term = m.leader, m.leader_term
    name = m.cluster.by_address(old).name
    progress(f"failover {k + 1}/{KILLS}: kill -9 {name} (leader, term {old_term})")
    t0, killed_at = time.monotonic(), time.time()
    m.cluster.kill(name, signal.SIGKILL)  # returns once the process has exited
    exited = time.monotonic() - t0
    m.leader = ""

    steps: list[str] = []

    async def small_create() -> float:
        """Through the client library, as a user would (it still names the old leader:
        its first attempt fails and it rediscovers, with its own backoff). `steps` gets when
        the create was acknowledged and each change in its count of RUNNING tablets, so a
        slow one says whether the wait was for a leader or for the tablets."""
        req = create_request(f"small{k}", PROBE_TABLETS)
        with ClientRetries(t0, steps):
            table_id = (await client.ddl("CreateTable", req, timeout=120)).table_id
        steps.append(f"acknowledged {time.monotonic() - t0:.2f} s")
        done = pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id))
        running = -1
        while True:
            r = await client.call("IsCreateTableDone", done, timeout=60)
            if r.tablets_running != running:
                running = r.tablets_running
                steps.append(f"{running} RUNNING {time.monotonic() - t0:.2f} s")
            if r.done:
                return time.monotonic() - t0
            await asyncio.sleep(0.2)

    connects, lookups = Trace(t0), Trace(t0)
    (elected, terms), lookup, create, (read, http) = await asyncio.wait_for(
        asyncio.gather(
            new_leader(m, old, old_term, connects),
            first_correct_lookup(m, probe, tablets, lookups),
            small_create(),
            full_reports_read(m, old, t0),
        ),
        args.create_timeout,
    )
    print(
        f"failover {k + 1}/{KILLS} kill -9 of the leader (gone {exited:.2f} s later):"
        f" new leader {elected_by_log(m, old_term + terms, killed_at)} by its log,"
        f" answering {elected:.2f} s"
        f" ({terms} term{'s' if terms > 1 else ''} later), first"
        f" correct GetTableLocations {lookup:.2f} s (goal <= {GOAL_LOOKUP_S:.0f}), small"
        f" CreateTable RUNNING {create:.2f} s (goal <= {GOAL_SMALL_CREATE_S:.0f}), every"
        f" full report read {read:.1f} s ({await turns(http)})",
        flush=True,
    )
    if create > GOAL_SMALL_CREATE_S:
        progress(f"small CreateTable: {', '.join(steps)}")
    if lookup > GOAL_LOOKUP_S:
        for line in [*connects.lines(m, "ConnectToMaster"), *lookups.lines(m, "lookup")]:
            progress(line)
        for node in m.cluster.masters.values():
            if node.address != old:
                progress(f"{node.name}: {await loop_lag(node.http_address)}")
    progress(f"restarting {name}")
    t1 = time.monotonic()
    m.cluster.start_master(name)
    m.cluster.wait_ready([name], timeout=120)
    await caught_up(m, name, timeout=300)
    progress(f"{name} restarted and caught up in {time.monotonic() - t1:.1f} s")
    return elected, lookup, create


async def full_reports_read(m: Masters, old: str, t0: float) -> tuple[float, str]:
    """Seconds from `t0` (the kill of `old`) until a surviving master leads with its catalog
    loaded and has read every server's full report (`tessera_master_full_reports_due` 0; a
    follower's count means nothing, it reads none), polled every second. Not a goal: it shows
    how long the new leader's catch-up on the fleet lasts while lookups and creates go on.
    Returns the seconds and the new leader's status address.

    Polled gently: rendering /metrics walks the catalog (about 0.1 s of the leader's loop at
    200,000 tablets, before the tablet states were counted as they change), and a first version
    of this wait, polling both masters four times a second, took half of the new leader's
    time and slowed the very failover it measured."""
    others = [node.http_address for node in m.cluster.masters.values() if node.address != old]
    loaded, due = "tessera_master_catalog_loaded", "tessera_master_full_reports_due"
    while True:
        for http in others:
            values = await asyncio.to_thread(metrics, http, loaded, due)
            if values[loaded] == 1 and values[due] == 0:
                return time.monotonic() - t0, http
        await asyncio.sleep(1.0)


async def metric_line(http: str, *fields: tuple[str, str, str]) -> str:
    """One /metrics read of the master at `http`, as "label value, ...": each field is
    (label, metric name, format of its value); "?" for a value the page does not have."""
    values = await asyncio.to_thread(metrics, http, *(name for _, name, _ in fields))
    out = []
    for label, name, fmt in fields:
        value = values[name]
        out.append(f"{label} {fmt.format(value)}" if value is not None else f"{label} ?")
    return ", ".join(out)


async def loop_lag(http: str) -> str:
    """How late the event loop of the master at `http` ran over the last 60 s (the window of
    its lag gauge, service/common/loop_lag.py; read within a minute of a kill it covers the
    failover), and its stalls beyond the Raft heartbeat interval: busy ones (its own work) and
    all (also waits for a CPU or the GIL)."""
    return await metric_line(
        http,
        ("loop lag max", "tessera_event_loop_lag_max_seconds", "{:.2f} s"),
        ("stalls", "tessera_event_loop_stalls_total", "{:.0f}"),
        ("busy stalls", "tessera_event_loop_busy_stalls_total", "{:.0f}"),
    )


async def turns(http: str) -> str:
    """The full-report turns the leader at `http` gave and saw lapse, and the tablet reports
    it left unacknowledged (report_turns.py, heartbeat.ReportGate), since it started: shed,
    late (the write outlived the budget) and unconfirmed (a claim the other voters did not
    confirm yet). Each such report makes its server wait longer before its next changes go
    (heartbeater.next_report_gap), which is where a slow small create's time goes."""
    deferred = "tessera_master_tablet_reports_deferred_total"
    return await metric_line(
        http,
        ("turns given", 'tessera_master_full_report_turns_total{outcome="given"}', "{:.0f}"),
        ("lapsed", 'tessera_master_full_report_turns_total{outcome="lapsed"}', "{:.0f}"),
        ("reports shed", deferred + '{reason="shed"}', "{:.0f}"),
        ("late", deferred + '{reason="late"}', "{:.0f}"),
        ("unconfirmed", deferred + '{reason="unconfirmed"}', "{:.0f}"),
    )


async def caught_up(m: Masters, name: str, timeout: float) -> None:
    """Until the restarted master `name` has heard from the leader (its term is the leader's)
    and applied what the leader had committed when it came back. Killing the next leader
    sooner would leave one master up to date and one still catching up (at 200,000 tablets,
    installing a 30-40 MB snapshot): no quorum, and the failover measured would be of two
    failures at once. The applied index alone is not enough: a master replays its own log on
    start, which can reach the target before it has heard from the leader at all (10 s later
    at 200,000 tablets)."""
    deadline = time.monotonic() + timeout
    await m.poll()
    while not m.leader:  # between terms (a split vote): no master says it leads yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"no master led within {timeout:.0f} s of {name}'s restart")
        await asyncio.sleep(0.5)
        await m.poll()
    leader = m.cluster.by_address(m.leader)
    target = await asyncio.to_thread(metric, leader.http_address, "tessera_raft_commit_index")
    if target is None:
        raise RuntimeError(f"the leader {m.leader} has no tessera_raft_commit_index")
    node = m.cluster.masters[name]
    while True:
        applied, term = "tessera_raft_applied_index", "tessera_raft_term"
        values = await asyncio.to_thread(metrics, node.http_address, applied, term)
        index, seen = values[applied], values[term]
        if index is not None and index >= target and seen is not None and seen >= m.leader_term:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{name} did not catch up to index {target} of term {m.leader_term} in "
                f"{timeout:.0f} s"
            )
        await asyncio.sleep(0.5)


async def main_async(args: argparse.Namespace) -> None:
    # SIGTERM unwinds like Ctrl-C: the masters and the fleet are stopped on the way out (the
    # default action ended the bench alone and left them running, orphaned).
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    progress(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; 3 secured masters,"
        f" {args.servers} simulated servers in {args.shards} processes, target {args.target}"
        f" tablets in tables of {args.table_tablets}"
    )
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        workdir = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = burners(args.burners)
        if args.burners:
            progress(f"{args.burners} busy loops beside the benchmark (a slower machine)")
        overrides = {**OVERRIDES, **dict(kv.split("=", 1) for kv in args.set)}
        with MasterCluster(workdir / "masters", 3, overrides=overrides) as cluster:
            m = Masters(cluster)
            watcher: asyncio.Task[None] | None = None
            try:
                await m.leader_stub()
                fleet, port_file = start_fleet(args, cluster, workdir)
                procs.append(fleet)
                info = json.loads(port_file.read_text())
                sim_pids = [info["pid"], *info.get("pids", [])]
                await wait_servers(m, args.servers)
                await m.poll()
                m.elections = 0
                watcher = asyncio.create_task(m.watch())
                catalog, slowest = await grow(args, m, sim_pids)
                # Elections are watched through the census too: its catalog reads are work
                # a leader must do without losing its group (a one-pass DumpCatalog of
                # 200,000 tablets once cost an election here, after the last create).
                replaced = await count_replaced(await m.leader_stub())
                stats = await settled_fleet_stats(workdir / "fleet.stats", catalog)
                print(
                    f"fleet    {stats.get('replicas', 0)} replicas, {stats.get('leaders', 0)}"
                    f" leaders on {args.servers} servers; heartbeat p99 over the last"
                    f" {stats.get('recent_s', 0):.0f} s {stats.get('recent_p99_s', 0) * 1000:.1f}"
                    f" ms (worst shard), {stats.get('failed', 0)} heartbeats failed,"
                    f" {stats.get('copies_triggered', 0)} replicas copied by leaders to members"
                    " missing them",
                    flush=True,
                )
                fleet_census = await take_census(
                    await m.leader_stub(),
                    m.cluster.channel,
                    info.get("addresses") or [info["address"]],
                    info["uuids"],
                )
                print(fleet_census.line(), flush=True)
                await m.poll()
                unprovoked = m.elections
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                watcher = None
                results = await failovers(args, m)
            finally:
                if watcher is not None:
                    watcher.cancel()
                terminate_all(procs)
                await m.aclose()
                if args.keep_logs is not None:  # a failed run's logs matter most
                    keep_logs(workdir, args.keep_logs)
    worst = max((r[1] for r in results), default=float("nan"))
    busy = f", {args.burners} busy loops" if args.burners else ""
    print(
        f"scale: {catalog} tablets, {unprovoked} unprovoked elections, create max"
        f" {slowest:.1f} s, replaced {replaced} ({100 * replaced / max(1, catalog):.2f}%),"
        f" failover lookup p100 {worst:.2f} s{busy}"
    )


async def count_replaced(stub: Any) -> int:
    """Tablets REPLACED in the catalog (a creation the master gave up on: goal under 1%)."""
    n = 0
    async for chunk in stub.DumpCatalog(pb.DumpCatalogRequestPB(), timeout=300):
        n += sum(
            1
            for row in chunk.rows
            if row.HasField("tablet") and row.tablet.state == pb.TabletRecordPB.REPLACED
        )
    return n


def keep_logs(workdir: Path, dest: Path) -> None:
    """Copy the masters' and the fleet's logs out of the run's temporary directory (which goes
    with the run) into `dest`, created owner-only: a failover figure worth explaining needs
    the masters' own account of it."""
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    dest.chmod(0o700)
    for log in [*sorted((workdir / "masters").glob("*.log")), workdir / "fleet.log"]:
        if log.is_file():
            shutil.copyfile(log, dest / log.name)
    progress(f"logs kept in {dest}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale_bench")
    p.add_argument("--target", type=int, default=200_000, help="tablets in the catalog")
    p.add_argument("--servers", type=int, default=1000, help="simulated tablet servers")
    p.add_argument("--table-tablets", type=int, default=10_000, help="tablets per table")
    p.add_argument("--shards", type=int, default=2, help="simulator processes")
    p.add_argument("--create-timeout", type=float, default=600.0, help="seconds per create")
    p.add_argument("--quick", action="store_true", help="20,000 tablets on 100 servers")
    p.add_argument(
        "--burners",
        type=int,
        default=0,
        help="CPU-bound busy loops beside the benchmark, to stand in for a slower machine",
    )
    p.add_argument(
        "--keep-logs",
        type=Path,
        metavar="DIR",
        help="copy the masters' and the fleet's logs here at the end (owner-only)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a master setting over the bench's (repeatable), to try a knob",
    )
    args = p.parse_args(argv)
    if any("=" not in kv for kv in args.set):
        p.error("--set takes KEY=VALUE")
    if args.quick:
        args.target, args.servers = 20_000, 100
    if args.target < 1 or args.table_tablets < 1 or args.servers < 3:
        p.error("--target and --table-tablets must be >= 1, --servers >= 3")
    args.shards = max(1, min(args.shards, args.servers))
    try:
        asyncio.run(main_async(args))
    except asyncio.CancelledError:
        progress("terminated (SIGTERM): masters and fleet stopped")
        return 128 + signal.SIGTERM
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
