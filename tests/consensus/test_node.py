"""RaftNode, the asyncio shell: three (or four) nodes in one event loop over an in-memory network,
each with a real WAL in tmp_path.

The network delivers on a later loop iteration (`call_soon`), like a transport would, and can cut
links. Timing only ever enters through "eventually, within N seconds" polling with generous
limits; ticks are 10 ms so a whole election takes a few hundred milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pytest

from service.common.errors import (
    CasMismatch,
    ConfigChangeRejected,
    InvalidArgument,
    IOFatal,
    NotTheLeader,
    ServiceUnavailable,
    Timeout,
)
from service.consensus import turns
from service.consensus.fs import AppendFile, FileSystem, RealFileSystem
from service.consensus.node import WRITE_ON_LOOP_BYTES, NodeSettings, RaftNode
from service.consensus.quiesce import Quiescence
from service.consensus.raft_store import RaftStore
from service.raft import ConfigChangeType, Message, MessageType, NodeId, RaftConfig, Role
from service.testing.simdisk import SimFileSystem

GROUP = "kv"
UUIDS = ["a", "b", "c"]
FAST = NodeSettings(
    tick_interval_s=0.01, heartbeat_ticks=2, election_ticks=10, election_jitter_ticks=10
)
"""Fast ticks. The election jitter is a whole election timeout (etcd's spread), the one these
tests were written against, not `[raft]`'s default of half of it."""
WAIT_S = 15.0


def address(uuid: str) -> str:
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
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        await asyncio.sleep(0.005)


class Cluster:
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
        sm = KvMachine()
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


# --- elections and proposals ----------------------------------------------------------------------


def test_a_leader_is_elected_and_everyone_knows_it(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await eventually(
            lambda: all(n.status().lead == leader.uuid for n in c.nodes.values()),
            "every node follows the leader",
        )
        term = leader.status().term
        assert all(n.status().term == term for n in c.nodes.values())
        assert sorted(r.status().role.value for r in c.nodes.values()) == [
            "FOLLOWER",
            "FOLLOWER",
            "LEADER",
        ]
        assert leader.status().config.voters == frozenset(UUIDS)

    run(tmp_path, scenario)


def test_propose_on_the_leader_returns_the_applied_result_everywhere(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        index = await leader.propose(b"x=1", timeout=WAIT_S)
        assert isinstance(index, int) and index > 0
        # Resolved only once applied here, with the state machine's result.
        assert c.sms[leader.uuid].kv == {"x": "1"}
        assert c.sms[leader.uuid].last_index == index
        assert leader.applied >= index
        await eventually(
            lambda: all(sm.kv == {"x": "1"} for sm in c.sms.values()), "x=1 applied everywhere"
        )
        second = await leader.propose(b"x=2", timeout=WAIT_S)
        assert isinstance(second, int) and second > index
        await eventually(
            lambda: all(sm.kv == {"x": "2"} and sm.last_index == second for sm in c.sms.values()),
            "x=2 applied everywhere at the same index",
        )

    run(tmp_path, scenario)


def test_propose_and_read_on_a_follower_name_the_leader(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        follower = c.followers(leader)[0]
        await eventually(lambda: follower.status().lead == leader.uuid, "follower knows leader")
        with pytest.raises(NotTheLeader) as ei:
            await follower.propose(b"x=1", timeout=WAIT_S)
        assert ei.value.leader_uuid == leader.uuid
        assert ei.value.leader_address == address(leader.uuid)
        with pytest.raises(NotTheLeader) as ei:
            await follower.read(timeout=WAIT_S)
        assert ei.value.leader_uuid == leader.uuid
        with pytest.raises(NotTheLeader):
            await follower.transfer_leadership(follower.uuid)
        assert all(sm.kv == {} for sm in c.sms.values())

    run(tmp_path, scenario)


def test_read_returns_an_index_covering_every_acknowledged_write(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        for i in range(3):
            written = await leader.propose(f"k{i}=v".encode(), timeout=WAIT_S)
            assert isinstance(written, int)
            index = await leader.read(timeout=WAIT_S)
            assert index >= written
            assert leader.applied >= index  # the barrier waits for the apply too
            assert c.sms[leader.uuid].kv[f"k{i}"] == "v"

    run(tmp_path, scenario)


def test_read_on_an_isolated_leader_does_not_return(tmp_path: Path) -> None:
    """ReadIndex needs a quorum's answer: cut off, the old leader cannot serve a read once its
    lease (half an election timeout after its last confirmed round) has run out."""

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await leader.read(timeout=WAIT_S)  # a confirmed round: the lease starts
        c.net.isolate(leader.uuid)
        assert leader.lease_s > 0
        await leader.read(timeout=0.5)  # within the lease: served (no other leader can exist)
        await asyncio.sleep(leader.lease_s)
        with pytest.raises((Timeout, NotTheLeader)):
            await leader.read(timeout=0.5)
        c.net.heal()
        await c.leader()

    run(tmp_path, scenario)


def test_group_commit_many_proposals_few_syncs(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        fsyncs = leader.metrics["fsyncs"]
        syncs = leader.store.wal.metrics.syncs
        batches = leader.metrics["batches"]
        follower_syncs = {n.uuid: n.store.wal.metrics.syncs for n in c.followers(leader)}
        n = 200
        results = await asyncio.gather(
            *(leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S) for i in range(n))
        )
        indexes = [r for r in results if isinstance(r, int)]
        # Every proposal got its own index, in proposal order, with no gap.
        assert indexes == list(range(indexes[0], indexes[0] + n))
        assert c.sms[leader.uuid].kv == {f"k{i}": str(i) for i in range(n)}
        assert leader.metrics["fsyncs"] - fsyncs <= n // 20
        assert leader.store.wal.metrics.syncs - syncs <= n // 20
        assert leader.metrics["batches"] - batches <= n // 20
        await eventually(
            lambda: all(len(sm.kv) == n for sm in c.sms.values()), "every node applied all"
        )
        for f in c.followers(leader):
            assert f.store.wal.metrics.syncs - follower_syncs[f.uuid] <= n // 20

    run(tmp_path, scenario)


def test_applies_that_take_turns_stay_whole_and_in_log_order(tmp_path: Path) -> None:
    # A slice so short that every entry with data waits for a new pass of the loop
    # (turns.py): proposals still resolve in order with their own results, and every node
    # applies every entry once, in log order (`check_order`).
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        n = 100
        results = await asyncio.gather(
            *(leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S) for i in range(n))
        )
        indexes = [r for r in results if isinstance(r, int)]
        assert indexes == list(range(indexes[0], indexes[0] + n))
        await eventually(
            lambda: all(len(sm.kv) == n for sm in c.sms.values()), "every node applied all"
        )
        assert turns.shared(1e-9).yields > 0

    run(tmp_path, scenario, settings=dataclasses.replace(FAST, apply_slice_s=1e-9))


def test_a_large_entry_is_written_off_the_loop_and_replicated(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        big = "v" * (WRITE_ON_LOOP_BYTES + 1)
        index = await leader.propose(f"big={big}".encode(), timeout=WAIT_S)
        await eventually(
            lambda: all(sm.kv.get("big") == big for sm in c.sms.values()), "applied everywhere"
        )
        assert all(sm.last_index >= index for sm in c.sms.values())

    run(tmp_path, scenario)


# --- snapshots and restarts -----------------------------------------------------------------------


SNAPPY = NodeSettings(
    tick_interval_s=0.01,
    heartbeat_ticks=2,
    election_ticks=10,
    election_jitter_ticks=10,
    snapshot_interval_entries=50,
    snapshot_catchup_entries=10,
)


async def write_keys(leader: RaftNode, keys: range, chunk: int = 10) -> None:
    for lo in range(keys.start, keys.stop, chunk):
        await asyncio.gather(
            *(
                leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S)
                for i in range(lo, min(lo + chunk, keys.stop))
            )
        )


def test_snapshot_compaction_and_restart_recover_the_same_state(tmp_path: Path) -> None:
    expected = {f"k{i}": str(i) for i in range(130)}

    async def main() -> None:
        c = Cluster(tmp_path, SNAPPY)
        try:
            for uuid in UUIDS:
                await c.start(uuid, UUIDS)
            leader = await c.leader()
            await write_keys(leader, range(130))
            await eventually(lambda: all(sm.kv == expected for sm in c.sms.values()), "all applied")
            # A snapshot taken after the last apply may still be under way in a worker thread.
            interval = SNAPPY.snapshot_interval_entries
            await eventually(
                lambda: all(n.applied - n.last_snapshot_index < interval for n in c.nodes.values()),
                "no snapshot due or under way",
            )
            last = {}
            for uuid, node in c.nodes.items():
                assert node.last_snapshot_index >= 100, uuid
                assert node.storage.first_index() > 1, uuid  # memory log compacted
                assert (tmp_path / uuid / "snapshot").exists()
                last[uuid] = node.last_snapshot_index
            assert sum(n.store.wal.metrics.segments_deleted for n in c.nodes.values()) > 0
            await c.close()

            # Restart every node from its directory alone (no bootstrap): the state machine is
            # restored from the snapshot before the node even starts, then the log replays.
            for uuid in UUIDS:
                await c.start(uuid, None)
                assert c.sms[uuid].restores == 1
                assert c.nodes[uuid].applied == last[uuid]
                assert c.nodes[uuid].status().config.voters == frozenset(UUIDS)
            leader = await c.leader()
            await leader.propose(b"after=restart", timeout=WAIT_S)
            await eventually(
                lambda: all(sm.kv == {**expected, "after": "restart"} for sm in c.sms.values()),
                "restarted nodes converge",
            )
            c.check_order()
        finally:
            await c.close()

    asyncio.run(main())


def test_learner_catches_up_by_snapshot_and_is_promoted(tmp_path: Path) -> None:
    expected = {f"k{i}": str(i) for i in range(120)}

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await write_keys(leader, range(120))
        assert leader.storage.first_index() > 1  # the log start is gone: d needs a snapshot
        d = await c.start("d", None)  # empty config, no bootstrap: waits to be added
        assert d.status().role is Role.NON_PARTICIPANT
        cfg = leader.status().committed_config
        index = await leader.change_config(
            ConfigChangeType.ADD_LEARNER,
            NodeId("d"),
            address=address("d"),
            expected_index=cfg.index,
            timeout=WAIT_S,
        )
        assert index > cfg.index
        await eventually(
            lambda: all("d" in n.status().config.voters for n in c.nodes.values()),
            "d promoted to voter everywhere",
        )
        await eventually(
            lambda: leader.status().committed_config.voters == frozenset({*UUIDS, "d"}),
            "the promotion commits",
        )
        await eventually(lambda: c.sms["d"].kv == expected, "d caught up")
        assert c.sms["d"].restores >= 1  # by snapshot, not by replaying from index 1
        assert d.status().role is Role.FOLLOWER
        # And d takes part from now on.
        await leader.propose(b"with=d", timeout=WAIT_S)
        await eventually(lambda: c.sms["d"].kv.get("with") == "d", "d applies new writes")
        # The change named a config that is no longer the committed one: compare-and-set.
        with pytest.raises(CasMismatch):
            await leader.change_config(
                ConfigChangeType.REMOVE, NodeId("d"), expected_index=cfg.index, timeout=WAIT_S
            )

    run(tmp_path, scenario, settings=SNAPPY)


def test_a_learner_added_without_promote_stays_a_non_voter(tmp_path: Path) -> None:
    """promote=False: a read replica catches up and applies writes but is never made a voter."""

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await write_keys(leader, range(10))
        d = await c.start("d", None)
        cfg = leader.status().committed_config
        await leader.change_config(
            ConfigChangeType.ADD_LEARNER,
            NodeId("d"),
            address=address("d"),
            expected_index=cfg.index,
            timeout=WAIT_S,
            promote=False,
        )
        await leader.propose(b"after=1", timeout=WAIT_S)
        await eventually(lambda: c.sms["d"].kv.get("after") == "1", "d applies new writes")
        for _ in range(20):  # many leader ticks: NodeQuiescence.after_tick runs on each
            await asyncio.sleep(0.05)
        assert "d" in leader.status().committed_config.learners
        assert "d" not in leader.status().config.voters
        assert d.status().role is Role.LEARNER

    run(tmp_path, scenario, settings=SNAPPY)


def test_config_change_compare_and_set(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        committed = leader.status().committed_config.index
        with pytest.raises(CasMismatch, match="stale config"):
            await leader.change_config(
                ConfigChangeType.ADD_LEARNER,
                NodeId("x"),
                address=address("x"),
                expected_index=committed + 7,
                timeout=WAIT_S,
            )
        # Refusals that are not about the CAS are not CasMismatch.
        with pytest.raises(ConfigChangeRejected) as ei:
            await leader.change_config(
                ConfigChangeType.ADD_LEARNER,
                NodeId("b"),
                address=address("b"),
                expected_index=committed,
                timeout=WAIT_S,
            )
        assert type(ei.value) is ConfigChangeRejected
        with pytest.raises(InvalidArgument, match="needs its address"):
            await leader.change_config(
                ConfigChangeType.ADD_LEARNER, NodeId("x"), expected_index=committed
            )
        # A learner that never answers: added (a, b, c commit it), never promoted.
        new_index = await leader.change_config(
            ConfigChangeType.ADD_LEARNER,
            NodeId("x"),
            address=address("x"),
            expected_index=committed,
            timeout=WAIT_S,
        )
        assert leader.status().committed_config.learners == frozenset({"x"})
        assert leader.store.cmeta.addresses["x"] == address("x")  # remembered for restarts
        with pytest.raises(CasMismatch):
            await leader.change_config(
                ConfigChangeType.REMOVE, NodeId("x"), expected_index=committed, timeout=WAIT_S
            )
        await leader.change_config(
            ConfigChangeType.REMOVE, NodeId("x"), expected_index=new_index, timeout=WAIT_S
        )
        assert leader.status().committed_config.members == frozenset(UUIDS)

    run(tmp_path, scenario)


def test_transfer_leadership_moves_the_leader(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        target = c.followers(leader)[0]
        with pytest.raises(InvalidArgument, match="not a voter"):
            await leader.transfer_leadership(NodeId("nobody"))
        await leader.transfer_leadership(target.uuid, timeout=WAIT_S)
        await eventually(lambda: target.status().role is Role.LEADER, "target leads")
        new = await c.leader()
        assert new is target
        with pytest.raises(NotTheLeader) as ei:
            await leader.propose(b"old=leader", timeout=WAIT_S)
        assert ei.value.leader_uuid == target.uuid
        await target.propose(b"new=leader", timeout=WAIT_S)

    run(tmp_path, scenario)


# --- shutdown and failures ------------------------------------------------------------------------


def test_aclose_fails_waiters_and_leaves_no_task_behind(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await leader.propose(b"a=1", timeout=WAIT_S)
        c.net.isolate(leader.uuid)  # what it proposes now cannot commit
        pending = asyncio.ensure_future(leader.propose(b"b=2", timeout=WAIT_S))
        await eventually(lambda: leader.metrics["proposals"] == 2, "b=2 appended")
        await c.stop(leader.uuid)
        with pytest.raises(ServiceUnavailable):
            await pending
        with pytest.raises(ServiceUnavailable):
            await leader.propose(b"c=3")
        with pytest.raises(ServiceUnavailable):
            await leader.read()
        await leader.aclose()  # idempotent
        # run() checks that no task is left once the other two are closed as well.

    run(tmp_path, scenario)


def test_aclose_waits_for_a_persist_running_in_its_worker_thread(tmp_path: Path) -> None:
    """The WAL is not thread-safe: closing the store while a Ready is being persisted in a
    worker thread would sync and close the segment under that thread."""

    async def main() -> None:
        c = Cluster(tmp_path)
        fs = GatedFileSystem()
        try:
            node = await c.start("a", ["a"], fs=fs)
            leader = await c.leader()
            assert leader is node
            fs.armed = True
            proposal = asyncio.ensure_future(node.propose(b"k=v", timeout=WAIT_S))
            await eventually(fs.entered.is_set, "the persist blocks in its thread")
            closing = asyncio.ensure_future(c.stop("a"))
            for _ in range(20):
                await asyncio.sleep(0.005)
            assert not closing.done(), "aclose returned while the WAL was still being written"
            fs.release.set()
            await asyncio.wait_for(closing, WAIT_S)
            try:
                result = await proposal  # the loop finished its iteration before it stopped
            except ServiceUnavailable:
                result = None
            assert node.fatal is None
        finally:
            fs.release.set()
            await c.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}
        # The entry whose persist was under way is durable and well-formed.
        store, rec = RaftStore.open(RealFileSystem(), str(tmp_path / "a"), "a", preallocate=False)
        last = rec.storage.entries(rec.storage.last_index(), rec.storage.last_index() + 1)
        assert last[0].data == b"k=v"
        assert result in (None, last[0].index)
        store.close()

    asyncio.run(main())


def test_aclose_stops_the_loop_even_when_a_message_arrives_at_the_same_time(
    tmp_path: Path,
) -> None:
    """A delivery and aclose() in the same loop iteration: the wakeup completes while the stop
    is requested. (On Python 3.11, `asyncio.wait_for` swallows a cancel in exactly that case,
    so a node stopped by cancelling its task would run on and aclose() would never return.)"""

    async def main() -> None:
        # Ticks far apart: no tick timer fires during the test, the loop is parked in its
        # wait for the wakeup event. No config: it never campaigns either.
        c = Cluster(tmp_path, NodeSettings(tick_interval_s=WAIT_S))
        try:
            node = await c.start("a", None)
            for _ in range(5):
                await asyncio.sleep(0)
            hb = Message(MessageType.HEARTBEAT, to=NodeId("a"), frm=NodeId("z"), term=1)

            async def deliver_and_close() -> None:
                node.step([hb])  # the transport delivers ...
                await node.aclose()  # ... and shutdown starts, before the loop runs again

            stopper = asyncio.ensure_future(deliver_and_close())
            done, _ = await asyncio.wait({stopper}, timeout=5.0)
            assert stopper in done, "aclose() did not return: the node loop ran on"
            await stopper
        finally:
            await c.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_a_wal_sync_failure_stops_the_node(tmp_path: Path) -> None:
    async def main() -> None:
        c = Cluster(tmp_path)
        fs = SimFileSystem()
        try:
            node = await c.start("a", ["a"], fs=fs, directory="/data/a")
            await c.leader()
            await node.propose(b"k=1", timeout=WAIT_S)
            fs.fail_next_sync("/wal/")
            with pytest.raises(IOFatal, match="storage failure"):
                await node.propose(b"k=2", timeout=WAIT_S)
            await asyncio.wait_for(node.fatal_event.wait(), WAIT_S)
            assert node.fatal is not None
            with pytest.raises(IOFatal):
                await node.propose(b"k=3")
            assert c.sms["a"].kv == {"k": "1"}
        finally:
            await c.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
