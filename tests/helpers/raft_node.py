"""RaftNode clusters in one event loop over an in-memory network, each node with a real WAL.

`Cluster` starts nodes (`KvMachine` state machines: key=value entries) over a `Network` that
delivers on a later loop iteration (`call_soon`), like a transport would, and can cut links;
`run` starts `UUIDS`, runs a scenario and checks that nothing is left running. Timing only ever
enters through `eventually` polling with generous limits; `FAST` ticks are 10 ms so a whole
election takes a few hundred milliseconds. `GatedFileSystem` holds a WAL sync until released.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

from service.common.errors import NotTheLeader, Timeout
from service.consensus.fs import AppendFile, FileSystem, RealFileSystem
from service.consensus.node import NodeSettings, RaftNode
from service.consensus.quiesce import Quiescence
from service.consensus.raft_store import RaftStore
from service.raft import Message, NodeId, RaftConfig, Role

GROUP = "kv"
UUIDS = ["a", "b", "c"]
FAST = NodeSettings(
    tick_interval_s=0.01, heartbeat_ticks=2, election_ticks=10, election_jitter_ticks=10
)
"""Fast ticks. The election jitter is a whole election timeout (etcd's spread), the one these
tests were written against, not `[raft]`'s default of half of it."""
WAIT_S = 15.0


def address(uuid: str) -> str:
    """The in-memory address of node `uuid`."""
    return f"mem://{uuid}"


# --- fakes ----------------------------------------------------------------------------------------


class KvMachine:
    """key=value entries; `apply` returns the index. Records order violations instead of raising
    (an exception would stop the node's loop and show up only as a timeout)."""

    def __init__(self) -> None:
        self.kv: dict[str, str] = {}
        self.last_index = 0
        self.restores = 0
        self.errors: list[str] = []

    def apply(self, index: int, data: bytes) -> object:
        if index <= self.last_index:
            self.errors.append(f"entry {index} applied after {self.last_index}")
        self.last_index = index
        key, _, value = data.decode().partition("=")
        self.kv[key] = value
        return index

    def snapshot(self) -> bytes:
        return json.dumps({"kv": self.kv, "index": self.last_index}).encode()

    def restore(self, data: bytes) -> None:
        d = json.loads(data)
        self.kv, self.last_index = d["kv"], d["index"]
        self.restores += 1


class Network:
    """Delivers every batch on a later loop iteration; `cut(a, b)` drops traffic both ways."""

    def __init__(self) -> None:
        self.nodes: dict[str, RaftNode] = {}
        self.cuts: set[frozenset[str]] = set()
        self.dropped = 0

    def cut(self, a: str, b: str) -> None:
        self.cuts.add(frozenset((a, b)))

    def heal(self) -> None:
        self.cuts.clear()

    def isolate(self, a: str) -> None:
        for b in self.nodes:
            if b != a:
                self.cut(a, b)

    def linked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cuts

    def _deliver(self, frm: str, to: str, msgs: list[Message]) -> None:
        node = self.nodes.get(to)
        if node is None or not self.linked(frm, to):  # the link may be cut in flight
            self.dropped += len(msgs)
            return
        node.step(msgs)


class MemSender:
    """The node's `Sender`: an in-memory transport endpoint for one node."""

    def __init__(self, net: Network, uuid: str) -> None:
        self.net = net
        self.uuid = uuid
        self.addresses: dict[str, str] = {}
        self.sent = 0

    def send(self, group_id: str, messages: list[Message]) -> None:
        assert group_id == GROUP
        by_dest: dict[str, list[Message]] = defaultdict(list)
        for m in messages:
            assert m.frm == self.uuid, m
            by_dest[m.to].append(m)
        loop = asyncio.get_running_loop()
        for to, msgs in by_dest.items():
            self.sent += len(msgs)
            loop.call_soon(self.net._deliver, self.uuid, to, msgs)

    def set_address(self, node: str, address: str) -> None:
        self.addresses[node] = address

    def address_of(self, node: str) -> str | None:
        return self.addresses.get(node)


class GatedFileSystem(RealFileSystem):
    """A real disk whose next WAL sync, once armed, blocks (in its worker thread) until released."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def open_append(self, path: str, *, position: int | None = None) -> AppendFile:
        return _GatedFile(self, super().open_append(path, position=position))


class _GatedFile:
    """A `GatedFileSystem`'s append file: its WAL sync waits while the gate is armed."""

    def __init__(self, fs: GatedFileSystem, inner: AppendFile) -> None:
        self.fs = fs
        self.inner = inner

    @property
    def path(self) -> str:
        return self.inner.path

    def write(self, data: bytes) -> None:
        self.inner.write(data)

    def sync(self) -> None:
        if self.fs.armed and f"{os.sep}wal{os.sep}" in self.inner.path:
            self.fs.armed = False
            self.fs.entered.set()
            assert self.fs.release.wait(WAIT_S)
        self.inner.sync()

    def truncate(self, size: int) -> None:
        self.inner.truncate(size)

    def preallocate(self, size: int) -> None:
        self.inner.preallocate(size)

    def tell(self) -> int:
        return self.inner.tell()

    def close(self) -> None:
        self.inner.close()


# --- the cluster ----------------------------------------------------------------------------------


async def eventually(pred: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll until `pred()` holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        await asyncio.sleep(0.005)


class Cluster:
    """RaftNodes over one `Network`, each with its WAL under `base`; subclasses may give each
    node its own sender or quiescence."""

    def __init__(
        self, base: Path, settings: NodeSettings = FAST, segment_bytes: int = 1024
    ) -> None:
        self.base = base
        self.settings = settings
        self.segment_bytes = segment_bytes
        self.net = Network()
        self.nodes: dict[str, RaftNode] = {}
        self.sms: dict[str, KvMachine] = {}

    async def start(
        self,
        uuid: str,
        members: Iterable[str] | None,
        fs: FileSystem | None = None,
        directory: str | None = None,
    ) -> RaftNode:
        """Start `uuid` from its directory; `members` bootstraps a new one (None: no config)."""
        ms = list(members) if members is not None else []
        store, recovered = RaftStore.open(
            fs or RealFileSystem(),
            directory or str(self.base / uuid),
            uuid,
            bootstrap_config=RaftConfig(frozenset(NodeId(m) for m in ms)),
            addresses={m: address(m) for m in ms},
            segment_bytes=self.segment_bytes,
            preallocate=False,
        )
        sm = self.machine(uuid)
        node = RaftNode(
            group_id=GROUP,
            uuid=NodeId(uuid),
            store=store,
            recovered=recovered,
            state_machine=sm,
            transport=self.sender(uuid),
            settings=self.settings,
            rng=random.Random(uuid),
            quiescence=await self.quiescence(uuid),
        )
        self.net.nodes[uuid] = node
        self.nodes[uuid] = node
        self.sms[uuid] = sm
        await node.start()
        return node

    def sender(self, uuid: str) -> MemSender:
        return MemSender(self.net, uuid)

    def machine(self, uuid: str) -> KvMachine:
        return KvMachine()  # test_node_decode_ahead.py's cluster gives each node another

    async def quiescence(self, uuid: str) -> Quiescence | None:
        return None  # test_quiesce.py's cluster gives each node one

    async def stop(self, uuid: str) -> None:
        node = self.nodes.pop(uuid)
        self.net.nodes.pop(uuid, None)
        await node.aclose()

    async def close(self) -> None:
        for uuid in list(self.nodes):
            await self.stop(uuid)

    async def leader(self, timeout: float = WAIT_S) -> RaftNode:
        """The one leader, once it has committed an entry of its term and confirmed its
        leadership with a quorum (a ReadIndex round), so it can take config changes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [n for n in self.nodes.values() if n.status().role is Role.LEADER]
            if len(leaders) == 1:
                try:
                    await leaders[0].read(timeout=1.0)
                    return leaders[0]
                except (NotTheLeader, Timeout):
                    pass
            await asyncio.sleep(0.01)
        raise AssertionError(f"no stable leader within {timeout}s")

    def followers(self, leader: RaftNode) -> list[RaftNode]:
        return [n for n in self.nodes.values() if n is not leader]

    def check_order(self) -> None:
        for uuid, sm in self.sms.items():
            assert sm.errors == [], uuid


C = TypeVar("C", bound="Cluster")


def run(
    tmp_path: Path,
    scenario: Callable[[C], Awaitable[None]],
    *,
    settings: NodeSettings = FAST,
    members: list[str] = UUIDS,
    cluster: Callable[[Path, NodeSettings], C] = Cluster,  # type: ignore[assignment]
) -> None:
    """Start `members` in one event loop, run `scenario`, close every node, and check that
    nothing is left running."""

    async def main() -> None:
        c = cluster(tmp_path, settings)
        try:
            for uuid in members:
                await c.start(uuid, members)
            await scenario(c)
            c.check_order()
        finally:
            await c.close()
        await asyncio.sleep(0)  # let delivered-but-dropped batches run
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
