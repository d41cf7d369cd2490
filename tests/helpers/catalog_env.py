"""A catalog manager in-process over a fake replication, for the master's unit tests.

`make_env` builds an `Env`: a manual clock, a `TSManager` with registered servers, a real
`SysCatalogState` and a `CatalogManager` whose `replicate` is `FakeRaft`. `create` and
`create_running` make the standard six-tablet table (`SCHEMA`, `PARTITIONING`) through it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Coroutine
from typing import Any

from service.common.clock import ManualClock
from service.common.errors import TesseraError
from service.common.ids import NodeId, TableId
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.master.catalog_manager import CatalogManager
from service.master.catalog_reads import TableIdentifier
from service.master.catalog_records import CatalogWrite, RequestId, TabletState, Update
from service.master.catalog_settings import CatalogSettings
from service.master.sys_catalog import ApplyResult, SysCatalogState
from service.master.ts_descriptor import NodeInstance, TSRegistration
from service.master.ts_manager import TSManager

UNRESPONSIVE_S = 10.0
"""Seconds of silence after which `make_env`'s TSManager counts a server dead."""
SCHEMA = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("value", ColumnType.DOUBLE)],
    ("host", "ts"),
)
# 2 hash buckets x 3 ranges = 6 tablets.
PARTITIONING = PartitionSchema(
    hash=(HashBucketSchema(("host",), 2),),
    split_rows=(("m",), ("t",)),
)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` to completion in a fresh event loop (the suite has no asyncio plugin)."""
    return asyncio.run(coro)


class FakeRaft:
    """Stands in for `RaftNode.propose` as the catalog manager's `replicate`.

    It applies straight to a `SysCatalogState` with increasing indexes, and can fail before
    applying (a leader losing its lease: nothing applied) or after (the entry committed but the
    answer was lost), be held at a gate, or apply another leader's entries first. It keeps the
    log, so a second replica can replay it (a failover).
    """

    def __init__(self, state: SysCatalogState) -> None:
        self.state = state
        self.log: list[bytes] = []
        self.proposals = 0
        self.waiting = 0
        self.fail_before: list[TesseraError] = []
        self.fail_after: list[TesseraError] = []
        self.other_leader_first: list[bytes] = []
        self.gate: asyncio.Event | None = None

    def apply(self, data: bytes) -> ApplyResult:
        self.log.append(data)
        return self.state.apply(len(self.log), data)

    async def __call__(self, data: bytes, timeout: float) -> ApplyResult:
        assert timeout > 0
        self.proposals += 1
        if self.gate is not None:
            self.waiting += 1
            await self.gate.wait()
            self.waiting -= 1
        if self.fail_before:
            raise self.fail_before.pop(0)
        while self.other_leader_first:
            self.apply(self.other_leader_first.pop(0))
        result = self.apply(data)
        if self.fail_after:
            raise self.fail_after.pop(0)
        return result


@dataclasses.dataclass
class Env:
    """What `make_env` builds: the catalog manager and everything it runs on."""

    clock: ManualClock
    ts: TSManager
    state: SysCatalogState
    raft: FakeRaft
    cm: CatalogManager

    def snapshot(self) -> bytes:
        return self.state.snapshot()


def register_servers(ts: TSManager, n: int, first: int = 0) -> list[str]:
    """Register servers ts-<first> .. ts-<first + n - 1>; their uuids."""
    uuids = []
    for i in range(first, first + n):
        uuid = f"ts-{i}"
        ts.register(NodeInstance(NodeId(uuid), 1), TSRegistration((f"10.0.0.{i + 1}:7050",)))
        uuids.append(uuid)
    return uuids


def make_env(
    servers: int = 3, settings: CatalogSettings | None = None, seed: int = 1, load: bool = True
) -> Env:
    """A loaded catalog manager (unless `load=False`) over `FakeRaft` and `servers` live servers."""
    clock = ManualClock(start=100.0)
    ts = TSManager(clock, UNRESPONSIVE_S)
    register_servers(ts, servers)
    state = SysCatalogState()
    raft = FakeRaft(state)
    # No leader warm-up unless a test asks for one: "not enough servers" is then definite.
    settings = settings or CatalogSettings(leader_warmup_s=0.0)
    cm = CatalogManager(state, raft, ts, clock, random.Random(seed), settings)
    if load:
        cm.load()
    return Env(clock, ts, state, raft, cm)


class Ids:
    """Request ids of one client, seq_no increasing."""

    def __init__(self, client: str = "client-a") -> None:
        self.client = client
        self.seq = 0

    def __call__(self) -> RequestId:
        self.seq += 1
        return RequestId(self.client, self.seq)


def by_id(table_id: str) -> TableIdentifier:
    """The table named by its id."""
    return TableIdentifier.by_id(table_id)


def by_name(name: str) -> TableIdentifier:
    """The table named by its name."""
    return TableIdentifier.by_name(name)


async def create(
    env: Env, name: str = "metrics", req: RequestId | None = None, **kw: Any
) -> TableId:
    """CreateTable of the standard table (`SCHEMA`, `PARTITIONING`, 3 replicas); `kw` overrides."""
    args: dict[str, Any] = {
        "schema": SCHEMA,
        "partition_schema": PARTITIONING,
        "num_replicas": 3,
        "owner": "alice",
    }
    args.update(kw)
    return await env.cm.create_table(name, request_id=req or RequestId(f"c-{name}", 1), **args)


def report_running(env: Env, table_id: str, *, schema_version: int | None = None) -> int:
    """What report processing (later work) will write when each CREATING tablet's leader reports
    in: RUNNING, term 1, a leader, the schema version it runs. One entry; returns its index."""
    table = env.state.table(table_id)
    assert table is not None
    version = table.record.schema_version if schema_version is None else schema_version
    ops = []
    for row in env.state.tablets_of(table_id):
        rec = row.record
        if rec.state not in (TabletState.CREATING, TabletState.RUNNING):
            continue
        assert rec.consensus is not None
        cs = dataclasses.replace(rec.consensus, term=1, leader_uuid=rec.consensus.peers[0].uuid)
        ops.append(
            Update(
                dataclasses.replace(
                    rec, state=TabletState.RUNNING, consensus=cs, reported_schema_version=version
                )
            )
        )
    result = env.raft.apply(CatalogWrite(ops=tuple(ops), operation="TabletReport").encode())
    assert result.ok, result.refusal
    return result.index


async def create_running(env: Env, name: str = "metrics", **kw: Any) -> TableId:
    """`create`, assign the tablets, and commit every leader's RUNNING report."""
    table_id = await create(env, name, **kw)
    await env.cm.assign_tablets()
    report_running(env, table_id)
    return table_id


async def wait_for(cond: Callable[[], bool]) -> None:
    """Yield to the event loop until `cond()` holds (at most 1000 times)."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")
