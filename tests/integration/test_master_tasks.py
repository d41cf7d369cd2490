"""The leader's background tasks and report processing end to end, in one process: a real
single-master sys.catalog (Raft on a real WAL, gRPC on 127.0.0.1) and the tablet-server
simulator (service/testing/ts_simulator.py) speaking TSHeartbeat and the admin RPCs.

CreateTable -> every tablet RUNNING (assignment, CreateTablet, leader reports);
AlterTable -> AlterSchema reaches the leaders, IsAlterTableDone; DeleteTable -> replicas
deleted; a stale master term is refused by a server; 3-4-3 re-replication of a dead server's
replicas, and the evicted replica tombstoned when its server comes back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from service.common.config import MasterConfig, RaftSettings, WalSettings
from service.common.errors import StaleTerm, from_grpc
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.common.tls import SecuritySettings
from service.master.master import MasterServer
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.raft import Role
from service.testing.ts_simulator import FleetSimulator
from tests.helpers.master_cluster import PARTITIONING, SCHEMA

pytestmark = pytest.mark.integration

FAST = RaftSettings(
    tick_interval_ms=20, heartbeat_interval_ms=40, election_timeout_ms=200, election_jitter_ms=40
)


def master_config(tmp: Path, **kw: Any) -> MasterConfig:
    args: dict[str, Any] = {
        "data_dir": tmp / "master",
        "rpc_bind": "127.0.0.1:0",
        "http_bind": "127.0.0.1:0",
        "bg_task_interval_ms": 100,
        "task_retry_initial_ms": 50,
        "task_retry_max_ms": 200,
        "tserver_rpc_timeout_ms": 2000,
        "raft": FAST,
        "wal": WalSettings(fsync=False, preallocate=False),
        # In-process master with simulated tablet servers on one plaintext server: these tests
        # are about background tasks; tests/integration/test_security.py covers who may call.
        "security": SecuritySettings(mode="insecure"),
    }
    args.update(kw)
    return MasterConfig(**args)


async def eventually(cond: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


class Cluster:
    def __init__(self, master: MasterServer, sim: FleetSimulator) -> None:
        self.master = master
        self.sim = sim
        self.channel = grpc.aio.insecure_channel(master.address)
        self.stub: Any = master_pb2_grpc.MasterServiceStub(self.channel)
        self.seq = 0

    def rid(self) -> pb.RequestIdPB:
        self.seq += 1
        return pb.RequestIdPB(client_id="test", seq_no=self.seq)

    async def create(self, name: str = "t", replicas: int = 3) -> str:
        req = pb.CreateTableRequestPB(
            request_id=self.rid(),
            name=name,
            schema=schema_to_pb(SCHEMA),
            partition_schema=partition_schema_to_pb(PARTITIONING, SCHEMA),
            num_replicas=replicas,
        )
        resp = await self.stub.CreateTable(req, timeout=10)
        return str(resp.table_id)

    async def create_done(self, table_id: str) -> bool:
        r = await self.stub.IsCreateTableDone(
            pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
            timeout=5,
        )
        return bool(r.done)

    def hosted(self) -> dict[str, set[str]]:
        return {
            u: {t for t, r in s.replicas.items() if not r.tombstoned}
            for u, s in self.sim.servers.items()
        }


async def start(tmp: Path, servers: int = 3, **kw: Any) -> Cluster:
    master = MasterServer(master_config(tmp, **kw))
    await master.start()
    deadline = time.monotonic() + 10
    while not (master.catalog and master.catalog.loaded):
        assert time.monotonic() < deadline, "the single master never loaded its catalog"
        await asyncio.sleep(0.02)
    sim = FleetSimulator(
        [master.address], [f"ts-{i}" for i in range(servers)], heartbeat_interval_s=0.1
    )
    await sim.start()
    assert master.ts_manager is not None
    deadline = time.monotonic() + 10
    while master.ts_manager.num_live() < servers:
        assert time.monotonic() < deadline, "simulated servers did not register"
        await asyncio.sleep(0.02)
    return Cluster(master, sim)


async def stop(c: Cluster) -> None:
    await c.channel.close(None)
    await c.sim.aclose()
    await c.master.aclose()


def test_create_alter_delete_reach_the_simulated_servers(tmp_path: Path) -> None:
    async def main() -> None:
        c = await start(tmp_path)
        try:
            table_id = await c.create()
            await eventually(lambda: c.create_done(table_id))
            catalog = c.master.catalog
            assert catalog is not None
            tablets = set(catalog.maps.tables_by_id[table_id].tablets)  # type: ignore[index]
            assert len(tablets) == 4
            hosted = c.hosted()
            assert all(sum(t in h for h in hosted.values()) == 3 for t in tablets)
            for t in tablets:  # the recorded leader is the one the simulated group elected
                rec = catalog.maps.tablets_by_id[t].record  # type: ignore[index]
                assert rec.consensus is not None
                assert rec.consensus.leader_uuid == c.sim.leader_of(t)
                assert rec.consensus.term == 1

            await c.stub.AlterTable(
                pb.AlterTableRequestPB(
                    request_id=c.rid(),
                    table=pb.TableIdentifierPB(table_id=table_id),
                    steps=[
                        pb.AlterTableStepPB(
                            add_column=pb.AlterTableStepPB.AddColumn(
                                column=schema_to_pb(
                                    Schema.build(
                                        [("k", ColumnType.STRING), ("x", ColumnType.INT32)],
                                        ("k",),
                                    )
                                ).columns[1]
                            )
                        )
                    ],
                ),
                timeout=10,
            )

            async def alter_done() -> bool:
                r = await c.stub.IsAlterTableDone(
                    pb.IsAlterTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
                    timeout=5,
                )
                return bool(r.done) and r.schema_version == 1

            await eventually(alter_done)
            assert all(c.sim.groups[t].view.schema_version == 1 for t in tablets)

            await c.stub.DeleteTable(
                pb.DeleteTableRequestPB(
                    request_id=c.rid(), table=pb.TableIdentifierPB(table_id=table_id)
                ),
                timeout=10,
            )

            async def deleted() -> bool:
                return not any(tablets & h for h in c.hosted().values())

            await eventually(deleted)
            assert not any(tablets & set(s.replicas) for s in c.sim.servers.values())
        finally:
            await stop(c)

    asyncio.run(main())


def test_a_stale_master_term_is_refused_by_the_server(tmp_path: Path) -> None:
    async def main() -> None:
        c = await start(tmp_path, servers=1)
        try:
            st = c.master.node.status()  # type: ignore[union-attr]
            assert st.role is Role.LEADER
            await eventually(lambda: _true(c.sim.servers["ts-0"].highest_term >= st.term))
            async with grpc.aio.insecure_channel(c.sim.address) as ch:
                stub: Any = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
                req = tpb.DeleteTabletRequestPB(
                    dest_uuid="ts-0",
                    fence=tpb.MasterFencePB(master_uuid="old", master_term=st.term - 1),
                    tablet_id="c" * 32,
                    delete_type=tpb.TABLET_DATA_DELETED,
                )
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.DeleteTablet(req, timeout=5)
                assert isinstance(from_grpc(e.value), StaleTerm)
        finally:
            await stop(c)

    asyncio.run(main())


async def _true(v: bool) -> bool:
    return v


def test_dead_replicas_are_replaced_3_4_3_and_tombstoned_when_back(tmp_path: Path) -> None:
    async def main() -> None:
        c = await start(
            tmp_path,
            servers=4,
            unresponsive_timeout_ms=500,
            replica_eviction_timeout_ms=1000,
        )
        try:
            table_id = await c.create()
            await eventually(lambda: c.create_done(table_id))
            catalog = c.master.catalog
            assert catalog is not None
            tablets = set(catalog.maps.tables_by_id[table_id].tablets)  # type: ignore[index]
            # Stop a server hosting replicas; its replicas move to the spare server.
            victim = next(u for u, h in c.hosted().items() if h & tablets)
            moved = c.hosted()[victim] & tablets
            c.sim.stop_server(victim)

            async def replaced() -> bool:
                for t in moved:
                    rec = catalog.maps.tablets_by_id[t].record  # type: ignore[index]
                    cs = rec.consensus
                    assert cs is not None
                    peers = {p.uuid for p in cs.peers}
                    if victim in peers or len(cs.voters) != 3:
                        return False
                return True

            await eventually(replaced, timeout=30)
            c.sim.start_server(victim)

            async def tombstoned() -> bool:
                s = c.sim.servers[victim]
                return all(s.replicas[t].tombstoned for t in moved if t in s.replicas)

            await eventually(tombstoned)
            assert await c.create_done(table_id)
        finally:
            await stop(c)

    asyncio.run(main())
