"""The fault campaign's workloads: clients that record what they asked and what they were told.

Each workload runs a few logical processes (Jepsen's term), each with its own `TesseraClient`,
at a modest rate (a few operations a second each: the machine has two cores and runs six
servers). Every operation goes through `_timed`, which records the invocation, waits at most
`OP_TIMEOUT` seconds and completes it as `ok`, `fail` (an answer that proves the operation did
nothing) or `info` (anything else: a timeout or a lost connection may hide a success).

* `register`: single-row upserts and reads of a few keys of a one-tablet table. A read is a
  scan with a key-equality predicate at the tablet leader in READ_AT_LEADER mode (the leader
  confirms its leadership with a majority before it reads, `TabletReplica.wait_readable`).
  The client's scanner asks for READ_LATEST, which a deposed leader may still answer; the
  workload subclasses the scanner to ask for READ_AT_LEADER instead.
* `rows`: inserts of fresh keys in batches into a three-tablet table, and whole-table
  READ_AT_LEADER scans; then a final scan once the faults are healed.
* `ddl`: lineages of create, rename, delete of fresh table names, the final catalog against
  `DdlModel`, and every master's own view of the catalog against the others.
* `catalog_reads`: creates and deletes, and ListTables sent to a master picked at random (a
  follower refuses; the leader answers after a ReadIndex round), checked for linearizability.
* `snapshot`: counters upserted across tablets with their commit timestamps, and whole-table
  snapshot reads at chosen timestamps from random replicas, each against the writes
  (`check_snapshots`).
* `bank`: transfers between accounts of two tables as transactions, and snapshot reads of
  every balance, which must always sum to the starting total (`check_bank`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
import pyarrow as pa

from service.client.client import TesseraClient
from service.client.scanner import ScanToken, TabletScanner
from service.common.errors import TesseraError
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.predicates import ColumnPredicate
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing import linearizability
from service.testing.chaos_checks import (
    DdlModel,
    History,
    Op,
    catalog_ops,
    check_bank,
    check_rows,
    check_snapshots,
    register_ops,
    views_diverge,
)
from service.testing.chaos_cluster import ChaosCluster

OP_TIMEOUT = 10.0
SETUP_TIMEOUT = 90.0
DEFINITE = frozenset(
    {"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "FAILED_PRECONDITION", "PERMISSION_DENIED"}
)
"""Error codes with which the server refused before doing anything (DDL is exactly-once, so a
retried call answers what its first attempt did)."""


@dataclass
class Verdict:
    """What a run's checker found. `valid` is None when the checker could not decide."""

    valid: bool | None
    violations: int = 0
    lost: int = 0
    divergent: int = 0
    notes: list[str] = field(default_factory=list)


class LeaderReadScanner(TabletScanner):
    """The client's fault-tolerant scanner, asking every replica for READ_AT_LEADER."""

    def _new_scan(self) -> tpb.NewScanRequestPB:
        ns = super()._new_scan()
        ns.read_mode = tpb.READ_AT_LEADER
        return ns


def error_code(e: BaseException) -> str:
    if isinstance(e, TesseraError):
        return e.code
    if isinstance(e, grpc.aio.AioRpcError):
        return e.code().name
    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return "TIMED_OUT"
    return type(e).__name__


class Workload:
    """One workload on one cluster; subclasses fill in `setup`, `step` and `check`."""

    name: ClassVar[str]
    focus: ClassVar[str]
    """Which processes its faults should mostly hit: "master" or "tserver"."""
    processes: ClassVar[int] = 4
    rate: ClassVar[float] = 2.5
    """Operations per second per process (exponential gaps, as Jepsen's `stagger`)."""

    def __init__(self, cluster: ChaosCluster, history: History, seed: int) -> None:
        self.cluster = cluster
        self.history = history
        self.seed = seed
        self.clients: list[TesseraClient] = []
        self.counter = itertools.count(1)

    def client(self) -> TesseraClient:
        c = TesseraClient(
            self.cluster.master_addresses,
            timeout=OP_TIMEOUT,
            credentials=self.cluster.mini.credentials(),
        )
        self.clients.append(c)
        return c

    async def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                await c.aclose()

    async def _timed(
        self,
        process: int,
        f: str,
        key: str | None,
        value: Any,
        call: Callable[[], Awaitable[Any]],
        definite: frozenset[str] = DEFINITE,
    ) -> Op:
        """Invoke, run `call` (its result is the output), complete as ok, fail or info."""
        op = self.history.invoke(process, f, key, value)
        try:
            out = await asyncio.wait_for(call(), OP_TIMEOUT)
        except Exception as e:
            code = error_code(e)
            kind = "fail" if code in definite or f in ("read", "list", "scan") else "info"
            return self.history.complete(op, kind, error=code)
        return self.history.complete(op, "ok", out)

    async def setup(self) -> None:
        """Create what the workload needs, before the clock starts and the faults begin."""

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        raise NotImplementedError

    async def run(self, until: float) -> None:
        async def proc(i: int) -> None:
            rng = random.Random(self.seed * 1000 + i)
            client = self.client()
            while self.history.now() < until:
                await asyncio.sleep(min(rng.expovariate(self.rate), 2.0))
                if self.history.now() < until:
                    await self.step(i, client, rng)

        await asyncio.gather(*(proc(i) for i in range(self.processes)))

    async def finish(self) -> None:
        """After the faults are healed: the final reads."""

    async def _final(self, f: str, value: Any, read: Callable[[], Awaitable[Any]]) -> None:
        """The final read `f` of a workload, tried every 5 s for a minute until one succeeds
        (the cluster is healed, but a leader may still be being elected)."""
        for _ in range(12):
            op = await self._timed(-1, f, None, value, read)
            if op.type == "ok":
                return
            await asyncio.sleep(5)

    def check(self) -> Verdict:
        raise NotImplementedError

    async def leader(self) -> str | None:
        """The process a fault aimed at 'the leader' should hit."""
        if self.focus == "master":
            return await asyncio.to_thread(self.cluster.master_leader, 3.0)
        try:
            locs = await self.clients[0].table_locations(self.table, timeout=3)
        except Exception:
            return None
        for loc in locs:
            for r in loc.replicas:
                if r.is_leader:
                    return self.cluster.tserver_name(r.ts_uuid)
        return None

    table: ClassVar[str] = ""

    async def _create(self, name: str, schema: Schema, ps: PartitionSchema, replicas: int) -> None:
        c = self.client()
        deadline = asyncio.get_running_loop().time() + SETUP_TIMEOUT
        while True:
            try:
                await c.create_table(name, schema, ps, num_replicas=replicas, timeout=30)
                return
            except TesseraError as e:
                if e.code == "ALREADY_EXISTS":
                    return
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(1)

    async def _leader_scan(self, client: TesseraClient, predicates: list[ColumnPredicate]) -> Any:
        tokens: list[ScanToken] = await client.scan_tokens(
            self.table,
            predicates=predicates,
            rpc_timeout_s=OP_TIMEOUT / 2,
            scan_timeout_s=OP_TIMEOUT,
            timeout=OP_TIMEOUT,
        )
        batches: list[pa.RecordBatch] = []
        for tok in tokens:
            batches += [b async for b in LeaderReadScanner(client, tok).batches()]
        return batches


class RegisterWorkload(Workload):
    name = "register"
    focus = "tserver"
    table = "chaos_register"
    keys = 4

    async def setup(self) -> None:
        schema = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.INT64)], key="k")
        await self._create(self.table, schema, PartitionSchema(range=RangeSchema(())), 3)

    async def _read(self, client: TesseraClient, k: int) -> int | None:
        batches = await self._leader_scan(client, [ColumnPredicate("k", "EQ", (k,))])
        values = [v for b in batches for v in b.column("v").to_pylist()]
        if len(values) > 1:
            raise AssertionError(f"key {k}: {len(values)} rows")
        return values[0] if values else None

    async def _write(self, client: TesseraClient, k: int, v: int) -> None:
        r = await client.write(self.table, pa.table({"k": [k], "v": [v]}), "upsert")
        if r.errors:
            raise RuntimeError(str(r.errors[0]))

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        k = rng.randrange(self.keys)
        if rng.random() < 0.5:
            await self._timed(process, "read", str(k), None, lambda: self._read(client, k))
        else:
            v = next(self.counter)
            await self._timed(process, "write", str(k), v, lambda: self._write(client, k, v))

    async def finish(self) -> None:
        c = self.clients[0]
        for k in range(self.keys):
            await self._timed(-1, "read", str(k), None, functools.partial(self._read, c, k))

    def check(self) -> Verdict:
        r = linearizability.check(register_ops(self.history.ops), timeout_s=120)
        if not r.ok:
            return Verdict(False, violations=1, notes=[r.explanation])
        return Verdict(None if r.timed_out else True, notes=[r.explanation])


class RowsWorkload(Workload):
    name = "rows"
    focus = "tserver"
    table = "chaos_rows"
    batch = 5

    async def setup(self) -> None:
        schema = Schema.build([("id", ColumnType.INT64), ("p", ColumnType.INT64)], key="id")
        ps = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))
        await self._create(self.table, schema, ps, 3)

    async def _insert(self, client: TesseraClient, keys: list[int], p: int) -> None:
        data = pa.table({"id": keys, "p": [p] * len(keys)})
        r = await client.write(self.table, data, "insert")
        # A retry of a batch the first attempt applied finds its rows: applied, not refused.
        bad = [e for e in r.errors if e.code != "ALREADY_EXISTS"]
        if bad:
            raise RuntimeError(str(bad[0]))

    async def _scan(self, client: TesseraClient) -> list[int]:
        batches = await self._leader_scan(client, [])
        return [k for b in batches for k in b.column("id").to_pylist()]

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        if process == 0:
            await self._timed(process, "scan", None, None, lambda: self._scan(client))
            return
        keys = [next(self.counter) for _ in range(self.batch)]
        await self._timed(
            process, "insert", None, keys, lambda: self._insert(client, keys, process)
        )

    async def finish(self) -> None:
        c = self.clients[0]
        await self._final("final_scan", None, lambda: self._scan(c))

    def check(self) -> Verdict:
        v = check_rows(self.history.ops)
        notes = [f"{v.acknowledged} acknowledged rows"]
        if not v.final_scan:
            notes.append("no final scan succeeded")
        if v.lost:
            notes.append(f"lost: {v.lost[:10]}")
        bad = len(v.duplicates) + len(v.phantoms) + len(v.stale)
        for what, items in (
            ("duplicate", v.duplicates),
            ("phantom", v.phantoms),
            ("stale read", v.stale),
        ):
            if items:
                notes.append(f"{what}: {items[:10]}")
        valid = None if not v.final_scan else (bad == 0 and not v.lost)
        return Verdict(valid, violations=bad, lost=len(v.lost), notes=notes)


class DdlWorkload(Workload):
    """Lineages of one table name each: create, then maybe rename, then maybe delete."""

    name = "ddl"
    focus = "master"
    processes = 3
    rate = 1.5
    prefix = "d_"
    renames = True
    schema = Schema.build([("id", ColumnType.INT64)], key="id")
    partitions = PartitionSchema(range=RangeSchema(()))

    def __init__(self, cluster: ChaosCluster, history: History, seed: int) -> None:
        super().__init__(cluster, history, seed)
        self.lineages: dict[int, dict[str, Any]] = {}
        self.final: list[str] | None = None
        self.views: dict[str, dict[str, str] | None] = {}

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        lin = self.lineages.get(process)
        if lin is None:
            n = next(self.counter)
            lin = {
                "lineage": f"{process}-{n}",
                "name": f"{self.prefix}{process}_{n}",
                "next": "create",
            }
            self.lineages[process] = lin
        name, f = lin["name"], lin["next"]
        value: dict[str, str] = {"lineage": lin["lineage"], "name": name}
        call: Callable[[], Awaitable[Any]]
        if f == "create":
            call = lambda: client.create_table(  # noqa: E731
                name, self.schema, self.partitions, num_replicas=1, wait=False
            )
        elif f == "rename":
            value["new_name"] = f"{name}r"
            call = lambda: client.alter_table(name, new_name=value["new_name"], wait=False)  # noqa: E731
        else:
            call = lambda: client.delete_table(name)  # noqa: E731
        op = await self._timed(process, f, name, value, call)
        if op.type != "ok":
            del self.lineages[process]  # failed or uncertain: the lineage ends here
            return
        if f == "create":
            lin["next"] = "rename" if self.renames and rng.random() < 0.5 else "delete"
        elif f == "rename":
            lin["name"], lin["next"] = value["new_name"], "delete"
        if f == "delete" or rng.random() < 0.3:
            del self.lineages[process]  # some tables stay to the end

    async def finish(self) -> None:
        c = self.clients[0]
        for _ in range(12):
            op = await self._timed(
                -1, "final_list", None, None, lambda: c.list_tables(timeout=OP_TIMEOUT)
            )
            if op.type == "ok":
                self.final = [t.name for t in op.output if t.name.startswith(self.prefix)]
                break
            await asyncio.sleep(5)
        for _ in range(30):  # followers apply what the leader committed a little later
            self.views = {}
            for n in self.cluster.nodes:
                if n.kind == "master":
                    try:
                        self.views[n.name] = await asyncio.to_thread(
                            self.cluster.master_tables, n.name
                        )
                    except OSError:
                        self.views[n.name] = None
            if None not in self.views.values() and not views_diverge(self.views):
                return
            await asyncio.sleep(1)

    def check(self) -> Verdict:
        notes: list[str] = []
        violations = 0
        r = linearizability.check(catalog_ops(self.history.ops), timeout_s=120)
        notes.append(r.explanation)
        if not r.ok:
            violations += 1
        if self.final is None:
            notes.append("no final listing succeeded")
        else:
            m = DdlModel(self.history.ops).check(self.final)
            notes.append(f"{m.lineages} lineages, {len(self.final)} tables at the end")
            violations += len(m.mismatches)
            notes += m.mismatches[:10]
        diverged = views_diverge(self.views)
        silent = [m for m, v in self.views.items() if v is None]
        if diverged:
            notes.append(f"masters whose catalog differs: {diverged}")
        if silent:
            notes.append(f"masters whose catalog could not be read: {silent}")
        decided = self.final is not None and not r.timed_out and not silent
        valid = False if violations or diverged else (True if decided else None)
        return Verdict(valid, violations=violations, divergent=int(bool(diverged)), notes=notes)


class CatalogReadsWorkload(DdlWorkload):
    """Creates and deletes by two processes, ListTables through any master by two others."""

    name = "catalog_reads"
    processes = 4
    rate = 2.0
    prefix = "c_"
    renames = False

    async def _list(self, client: TesseraClient, address: str) -> list[str]:
        r = await client.channels.master(address).ListTables(  # type: ignore[misc]
            mpb.ListTablesRequestPB(name_filter=self.prefix), timeout=OP_TIMEOUT
        )
        return [t.name for t in r.tables if t.name.startswith(self.prefix)]

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        if process < 2:
            await super().step(process, client, rng)
            return
        address = rng.choice(self.cluster.master_addresses)
        await self._timed(process, "list", address, None, lambda: self._list(client, address))


class SnapshotWorkload(Workload):
    """Snapshot reads under faults (docs/design/tablets.md#R3, #R4): writers upsert per-key
    counters across the tablets of one table, each write one counter for a few keys of
    different tablets, recorded with its commit timestamp; readers read the whole table at a
    snapshot timestamp (now, or the commit time of an earlier write) from replicas picked at
    random, each tablet from another one, and a second time from other replicas.
    `check_snapshots` compares every read with the writes."""

    name = "snapshot"
    focus = "tserver"
    table = "chaos_snapshot"
    keys = 24

    async def setup(self) -> None:
        schema = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.INT64)], key="k")
        ps = PartitionSchema(hash=(HashBucketSchema(("k",), 3),), range=RangeSchema(()))
        await self._create(self.table, schema, ps, 3)

    async def _write(self, client: TesseraClient, counter: int, keys: list[int]) -> int:
        data = pa.table({"k": keys, "v": [counter] * len(keys)})
        r = await client.write(self.table, data, "upsert")
        if r.errors:
            raise RuntimeError(str(r.errors[0]))
        return r.commit_timestamp

    async def _read(self, client: TesseraClient, at: int, rng: random.Random) -> dict[int, int]:
        tokens = await client.scan_tokens(
            self.table,
            snapshot=at,
            rpc_timeout_s=OP_TIMEOUT / 2,
            scan_timeout_s=OP_TIMEOUT,
            timeout=OP_TIMEOUT,
        )
        out: dict[int, int] = {}
        for tok in tokens:
            replicas = list(tok.replicas)
            rng.shuffle(replicas)
            scanner = TabletScanner(client, dataclasses.replace(tok, replicas=tuple(replicas)))
            async for b in scanner.batches():
                for k, v in zip(b.column("k").to_pylist(), b.column("v").to_pylist(), strict=True):
                    if k in out:
                        raise AssertionError(f"key {k} twice in one snapshot")
                    out[k] = v
        return out

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        if process == 0:
            done = [op.output for op in self.history.ops if op.f == "write" and op.type == "ok"]
            at = rng.choice(done) if done and rng.random() < 0.5 else client.snapshot_now()
            await self._timed(process, "snapshot", None, at, lambda: self._read(client, at, rng))
            await self._timed(process, "snapshot", None, at, lambda: self._read(client, at, rng))
            return
        counter = next(self.counter)
        keys = sorted(rng.sample(range(self.keys), 3))
        await self._timed(
            process, "write", None, (counter, keys), lambda: self._write(client, counter, keys)
        )

    async def finish(self) -> None:
        c = self.clients[0]
        at = c.snapshot_now()  # after every acknowledged write: they must all be in it
        await self._final("final_snapshot", at, lambda: self._read(c, at, random.Random(self.seed)))

    def check(self) -> Verdict:
        v = check_snapshots(self.history.ops)
        final = any(op.f == "final_snapshot" and op.type == "ok" for op in self.history.ops)
        notes = [f"{v.reads} snapshot reads checked"]
        notes += v.violations[:10]
        if v.lost:
            notes.append(f"lost: {v.lost[:10]}")
        if not final:
            notes.append("no final snapshot read succeeded")
        valid = None if not final else (not v.violations and not v.lost)
        return Verdict(valid, violations=len(v.violations), lost=len(v.lost), notes=notes)


class BankWorkload(Workload):
    """Jepsen's bank test over transactions (docs/design/transactions.md): accounts spread
    over the tablets of two tables; transfers move an amount between two accounts (often of
    different tables) as one transaction that reads both at its snapshot and writes both; a
    reader reads every balance of both tables at one snapshot timestamp (now, or an earlier
    transfer's commit), each tablet from a replica picked at random. `check_bank`: every read
    sums to the starting total."""

    name = "bank"
    focus = "tserver"
    tables = ("chaos_bank_a", "chaos_bank_b")
    table = "chaos_bank_a"
    accounts = 12
    """Per table."""
    balance = 100

    @property
    def total(self) -> int:
        return len(self.tables) * self.accounts * self.balance

    async def setup(self) -> None:
        schema = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.INT64)], key="k")
        ps = PartitionSchema(hash=(HashBucketSchema(("k",), 3),), range=RangeSchema(()))
        for t in self.tables:
            await self._create(t, schema, ps, 3)
        c = self.client()
        start = pa.table({"k": list(range(self.accounts)), "v": [self.balance] * self.accounts})
        deadline = asyncio.get_running_loop().time() + SETUP_TIMEOUT
        for t in self.tables:
            while True:
                try:
                    r = await c.write(t, start, "upsert", timeout=30)
                    if not r.errors:
                        break
                except TesseraError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"could not open the accounts of {t}")
                await asyncio.sleep(1)

    async def _balances(self, client: TesseraClient, at: int, rng: random.Random) -> dict[str, int]:
        """Every balance ("table/account": balance) at snapshot `at`."""
        out: dict[str, int] = {}
        for table in self.tables:
            tokens = await client.scan_tokens(
                table,
                snapshot=at,
                rpc_timeout_s=OP_TIMEOUT / 2,
                scan_timeout_s=OP_TIMEOUT,
                timeout=OP_TIMEOUT,
            )
            for tok in tokens:
                replicas = list(tok.replicas)
                rng.shuffle(replicas)
                scanner = TabletScanner(client, dataclasses.replace(tok, replicas=tuple(replicas)))
                async for b in scanner.batches():
                    for k, v in zip(
                        b.column("k").to_pylist(), b.column("v").to_pylist(), strict=True
                    ):
                        if f"{table}/{k}" in out:
                            raise AssertionError(f"account {table}/{k} twice in one snapshot")
                        out[f"{table}/{k}"] = v
        if len(out) != len(self.tables) * self.accounts:
            raise AssertionError(f"{len(out)} accounts in a snapshot, not {self.total}")
        return out

    async def _transfer(
        self,
        client: TesseraClient,
        src: tuple[str, int],
        dst: tuple[str, int],
        amount: int,
        rng: random.Random,
    ) -> int:
        async with client.transaction() as txn:
            now = await self._balances(client, txn.start_timestamp, rng)
            moved = {
                src: now[f"{src[0]}/{src[1]}"] - amount,
                dst: now[f"{dst[0]}/{dst[1]}"] + amount,
            }
            for table in self.tables:
                mine = {k: v for (t, k), v in moved.items() if t == table}
                if mine:
                    await txn.write(
                        table, pa.table({"k": list(mine), "v": list(mine.values())}), "upsert"
                    )
        return txn.commit_timestamp

    async def step(self, process: int, client: TesseraClient, rng: random.Random) -> None:
        if process == 0:
            done = [op.output for op in self.history.ops if op.f == "transfer" and op.type == "ok"]
            at = rng.choice(done) if done and rng.random() < 0.5 else client.snapshot_now()
            await self._timed(
                process, "balances", None, at, lambda: self._balances(client, at, rng)
            )
            return
        accounts = [(t, k) for t in self.tables for k in range(self.accounts)]
        src, dst = rng.sample(accounts, 2)
        amount = rng.randint(1, 10)
        await self._timed(
            process,
            "transfer",
            None,
            (src, dst, amount),
            lambda: self._transfer(client, src, dst, amount, rng),
            definite=DEFINITE | {"ABORTED"},
        )

    async def finish(self) -> None:
        c = self.clients[0]
        at = c.snapshot_now()
        rng = random.Random(self.seed)
        await self._final("final_balances", at, lambda: self._balances(c, at, rng))

    def check(self) -> Verdict:
        v = check_bank(self.history.ops, self.total)
        final = any(op.f == "final_balances" and op.type == "ok" for op in self.history.ops)
        notes = [f"{v.reads} snapshot reads of every balance, {v.transfers} transfers committed"]
        notes += v.violations[:10]
        if not final:
            notes.append("no final read succeeded")
        valid = None if not final else not v.violations
        return Verdict(valid, violations=len(v.violations), notes=notes)


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        RegisterWorkload,
        DdlWorkload,
        CatalogReadsWorkload,
        RowsWorkload,
        SnapshotWorkload,
        BankWorkload,
    )
}
