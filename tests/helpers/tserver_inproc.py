"""One real tablet server in-process (real gRPC on loopback, real WAL and fsync), for the tablet
server's tests.

`Server` starts a `TabletServer` with no master (insecure, a master address nobody serves) and
stubs for its admin and data services; `Group` runs several and creates tablets replicated
across them, for faults injected into one server's objects; `run` turns an async test body
into a sync pytest test (the suite has no asyncio plugin).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from service.common.config import TServerConfig
from service.common.tls import SecuritySettings
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.tablet_fixtures import create_request
from service.tools.launcher import free_ports
from service.tserver.tablet_server import TabletServer


def _config(data_dir: Path, **settings: Any) -> TServerConfig:
    """`Server`'s configuration: loopback, port 0, fast heartbeats and scanner expiry."""
    (dead_master,) = free_ports(1)
    return TServerConfig(
        data_dir=data_dir,
        rpc_bind="127.0.0.1:0",
        http_bind="127.0.0.1:0",
        advertised_address=None,
        master_addresses=(f"127.0.0.1:{dead_master}",),
        heartbeat_interval_ms=200,
        scanner_ttl_ms=400,
        # In process, with no master: the servicers are what these tests exercise; who may call
        # them is tests/integration/test_security.py's subject.
        security=SecuritySettings(mode="insecure"),
        **settings,
    )


class Server:
    """A `TabletServer` in this process with gRPC stubs for it: `start`, `stop`, `create`."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        self.data_dir = data_dir
        self.settings = settings
        self.ts: TabletServer | None = None

    async def start(self) -> None:
        self.ts = TabletServer(_config(self.data_dir, **self.settings))
        await self.ts.start()
        self.channel = grpc.aio.insecure_channel(self.ts.address)
        self.admin = tpb_grpc.TabletServerAdminServiceStub(self.channel)
        self.data = tpb_grpc.TabletServerServiceStub(self.channel)

    @property
    def uuid(self) -> str:
        assert self.ts is not None
        return self.ts.uuid

    async def stop(self) -> None:
        await self.channel.close()
        assert self.ts is not None
        await self.ts.aclose()

    async def create(self, tablet_id: str = "tablet-1") -> None:
        assert self.ts is not None
        await self.admin.CreateTablet(
            create_request(self.uuid, tablet_id, [(self.uuid, self.ts.address)])
        )
        await self.wait_leader(tablet_id)

    async def wait_leader(self, tablet_id: str) -> None:
        """Until this replica leads and its first entry of the term committed: before that
        the leader refuses config changes ("retry after it commits"), which made tests that
        change the config right after creating the tablet fail now and then."""
        assert self.ts is not None
        for _ in range(200):
            resp = await self.admin.GetConsensusState(
                tpb.GetConsensusStateRequestPB(dest_uuid=self.uuid, tablet_ids=[tablet_id])
            )
            node = self.ts.tablets.get(tablet_id).node
            if resp.tablets[0].role == mpb.LEADER and node is not None:
                st = node.status()
                if st.commit >= st.last_index:  # nothing else is proposed yet: the no-op
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{tablet_id} elected no leader")

    async def replicas(self) -> dict[str, tpb.ReplicaStatusPB]:
        resp = await self.admin.ListTablets(tpb.ListTabletsRequestPB(dest_uuid=self.uuid))
        return {r.tablet_id: r for r in resp.replicas}


def run(body: Callable[[Path], Awaitable[None]]) -> Callable[[Path], None]:
    """A sync test (taking `tmp_path`) that runs the async `body` in a fresh event loop."""

    def test(tmp_path: Path) -> None:
        asyncio.run(body(tmp_path))

    test.__name__ = body.__name__
    return test


class Group:
    """`size` tablet servers in this process, each a `Server` (with `settings`), and the
    tablets created on all of them as one Raft group: a replicated tablet with no master and
    no process boundary, for faults that are injected into one server's objects."""

    def __init__(self, base: Path, size: int = 3, **settings: Any) -> None:
        self.servers = [Server(base / f"ts-{i}", **settings) for i in range(size)]
        self._started: list[Server] = []

    async def start(self) -> None:
        try:
            for s in self.servers:
                await s.start()
                self._started.append(s)
        except BaseException:
            await self.stop()  # those already started: nothing is left running
            raise

    async def stop(self) -> None:
        while self._started:
            await self._started.pop().stop()

    async def __aenter__(self) -> Group:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def create(self, tablet_id: str) -> None:
        peers = []
        for s in self.servers:
            assert s.ts is not None
            peers.append((s.uuid, s.ts.address))
        for s in self.servers:
            await s.admin.CreateTablet(create_request(s.uuid, tablet_id, peers))

    async def leader(
        self, tablet_id: str, timeout: float = 30.0, other_than: Server | None = None
    ) -> Server:
        """The server (not `other_than`) whose replica of `tablet_id` leads, is RUNNING and has
        committed its term's first entry (so it takes writes), waiting up to `timeout` seconds
        for one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for s in self.servers:
                assert s.ts is not None
                if s is other_than:
                    continue
                replica = s.ts.tablets.get(tablet_id)
                node = replica.node
                if replica.is_leader() and node is not None:
                    st = node.status()
                    if st.commit >= st.last_index:
                        return s
            await asyncio.sleep(0.05)
        raise AssertionError(f"{tablet_id}: no leader within {timeout:.0f}s")
