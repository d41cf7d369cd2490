"""RaftNode's pipelined group commit (node.py, "Group commit, pipelined" and "Pacing by commit"):
what a batch costs (fdatasyncs, messages), when the next batch may start, what happens to
proposals that were never appended, and stepping while a Ready's fdatasync is running.

Same in-memory cluster as test_node.py (tests/helpers/raft_node.py: real WAL in tmp_path, ticks
of 10 ms). Counts are exact where the protocol makes them so; timing enters only through
"eventually" polling.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from service.common.errors import NotTheLeader, Timeout
from service.consensus.fs import RealFileSystem
from service.consensus.node import NodeSettings, RaftNode
from service.consensus.raft_store import RaftStore
from service.raft import Entry, Message, MessageType, NodeId
from tests.helpers.raft_node import (
    WAIT_S,
    Cluster,
    GatedFileSystem,
    MemSender,
    eventually,
    run,
)


class Recording:
    """Wraps a node's sender: records every `send` call (one list per call), then forwards."""

    def __init__(self, inner: MemSender) -> None:
        self.inner = inner
        self.calls: list[list[Message]] = []

    def send(self, group_id: str, messages: list[Message]) -> None:
        self.calls.append(list(messages))
        self.inner.send(group_id, messages)

    def set_address(self, node: str, address: str) -> None:
        self.inner.set_address(node, address)

    def address_of(self, node: str) -> str | None:
        return self.inner.address_of(node)

    def sent(self, type: MessageType, to: str | None = None) -> list[Message]:
        return [m for c in self.calls for m in c if m.type is type and to in (None, m.to)]


def record(node: RaftNode) -> Recording:
    rec = Recording(node.transport)  # type: ignore[arg-type]
    node.transport = rec
    return rec


async def idle(leader: RaftNode) -> None:
    """Until the leader has committed its whole log and has no fdatasync running."""
    raft = leader.raw.raft
    await eventually(
        lambda: leader._persisting is None and raft.log.committed == raft.log.last_index(),
        "the leader is idle",
    )


async def all_idle(c: Cluster, leader: RaftNode) -> None:
    """Until every node holds the leader's whole log, with nothing to persist and no fdatasync
    running. The leader's commit needs only one follower: the other may still be syncing the
    election's entries, and that sync would be counted against the next batch (a CI run once
    saw a follower's count go up by 2)."""
    last = leader.raw.raft.log.last_index

    def quiet(n: RaftNode) -> bool:
        return (
            n._persisting is None
            and not n.raw.has_ready()
            and n.raw.raft.log.last_index() == last()
        )

    await idle(leader)
    await eventually(lambda: all(quiet(n) for n in c.nodes.values()), "every node is idle")


def test_concurrent_proposals_are_one_fsync_and_one_append_per_follower(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        followers = c.followers(leader)
        await all_idle(c, leader)
        recs = {n.uuid: record(n) for n in c.nodes.values()}
        syncs = {n.uuid: n.store.wal.metrics.syncs for n in c.nodes.values()}
        batches = leader.metrics["batches"]
        first = leader.raw.raft.log.last_index() + 1
        n = 50
        results = await asyncio.gather(
            *(leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S) for i in range(n))
        )
        assert results == list(range(first, first + n))
        last = first + n - 1
        # The leader: one batch, one WAL write and fdatasync, one append per follower.
        assert leader.metrics["batches"] - batches == 1
        assert leader.store.wal.metrics.syncs - syncs[leader.uuid] == 1
        for f in followers:
            apps = [m for m in recs[leader.uuid].sent(MessageType.APP, f.uuid) if m.entries]
            assert len(apps) == 1
            assert [e.index for e in apps[0].entries] == list(range(first, last + 1))
        await eventually(lambda: all(len(c.sms[f.uuid].kv) >= n for f in followers), "applied")
        for f in followers:
            # Each follower: one fdatasync for the batch, and one acknowledgement of all of it.
            assert f.store.wal.metrics.syncs - syncs[f.uuid] == 1
            # An answer below the batch is a late one to an append sent before it (seen once
            # beside two busy loops: index 1): not an acknowledgement of the batch.
            acks = [a for a in recs[f.uuid].sent(MessageType.APP_RESP) if a.index >= first]
            assert acks and acks[0].index == last and not acks[0].reject
            assert all(a.index == last for a in acks)  # never a partial acknowledgement

    run(tmp_path, scenario)


def test_the_next_batch_waits_until_the_previous_one_committed(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await idle(leader)
        raft = leader.raw.raft
        before = raft.log.last_index()
        batches = leader.metrics["batches"]
        c.net.isolate(leader.uuid)  # its first batch cannot commit for now
        p1 = asyncio.ensure_future(leader.propose(b"p1=1", timeout=WAIT_S))
        await eventually(lambda: raft.log.last_index() == before + 1, "p1 appended")
        p2 = asyncio.ensure_future(leader.propose(b"p2=2", timeout=WAIT_S))
        p3 = asyncio.ensure_future(leader.propose(b"p3=3", timeout=WAIT_S))
        for _ in range(3):  # a few ticks (well within an election timeout)
            await asyncio.sleep(leader.settings.tick_interval_s)
        assert raft.log.last_index() == before + 1  # p2 and p3 wait for p1 to commit
        assert len(leader._proposals) == 2
        c.net.heal()
        assert await asyncio.gather(p1, p2, p3) == [before + 1, before + 2, before + 3]
        assert leader.metrics["batches"] - batches == 2  # p2 and p3 went as one batch

    run(tmp_path, scenario)


def test_queued_proposals_fail_fast_when_leadership_is_lost(tmp_path: Path) -> None:
    """A proposal still queued (never appended) when the node stops being the leader fails with
    NotTheLeader at once: it definitely did not take effect. One already appended has an
    unknown outcome, so it waits for its deadline (checked at the ticks) instead."""

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await idle(leader)
        raft = leader.raw.raft
        before = raft.log.last_index()
        c.net.isolate(leader.uuid)
        started = time.monotonic()
        appended = asyncio.ensure_future(leader.propose(b"a=1", timeout=0.5))
        await eventually(lambda: raft.log.last_index() == before + 1, "appended")
        queued = asyncio.ensure_future(leader.propose(b"q=1", timeout=WAIT_S))
        with pytest.raises(NotTheLeader):
            await asyncio.wait_for(queued, WAIT_S)  # check-quorum: steps down, fails it
        assert all(e.data != b"q=1" for e in leader.storage.entries(1, raft.log.last_index() + 1))
        with pytest.raises(Timeout, match="outcome unknown"):
            await appended
        assert 0.5 <= time.monotonic() - started < 0.5 + 5.0
        c.net.heal()

    run(tmp_path, scenario)


def test_an_append_that_replaces_entries_being_persisted(tmp_path: Path) -> None:
    """A follower is persisting entries 1-3 (commit 2) when a new leader's append replaces
    entry 3. It must write only the new entry 3 next (rewriting 1-2 would reach below the
    commit index it persisted meanwhile, which the WAL refuses), answer the new leader only
    once that is durable, and restart with the new log."""

    async def main() -> None:
        c = Cluster(tmp_path)
        fs = GatedFileSystem()
        a, b, cc = NodeId("a"), NodeId("b"), NodeId("c")
        try:
            # b alone in the network: what it sends to a or c is recorded, then dropped.
            node = await c.start("b", ["a", "b", "c"], fs=fs)
            rec = record(node)
            old = tuple(Entry(1, i, data=b"k%d=old" % i) for i in (1, 2, 3))
            fs.armed = True
            node.step(
                [
                    Message(MessageType.APP, to=b, frm=a, term=1, index=0, entries=old),
                    Message(MessageType.APP, to=b, frm=a, term=1, index=3, log_term=1, commit=2),
                ]
            )
            await eventually(fs.entered.is_set, "entries 1-3 are being persisted")
            new = (Entry(2, 3, data=b"k3=new"),)
            node.step(
                [Message(MessageType.APP, to=b, frm=cc, term=2, index=2, log_term=1, entries=new)]
            )
            for _ in range(5):
                await asyncio.sleep(0.005)
            assert rec.sent(MessageType.APP_RESP, cc) == []  # nothing before the disk
            fs.release.set()
            await eventually(lambda: bool(rec.sent(MessageType.APP_RESP, cc)), "answered c")
            assert [(m.index, m.reject) for m in rec.sent(MessageType.APP_RESP, cc)] == [(3, False)]
            assert node.fatal is None
            assert node.storage.term(3) == 2
        finally:
            fs.release.set()
            await c.close()
        store, recovered = RaftStore.open(
            RealFileSystem(), str(tmp_path / "b"), "b", preallocate=False
        )
        try:
            entries = recovered.storage.entries(1, 4)
            assert [(e.term, e.data) for e in entries] == [
                (1, b"k1=old"),
                (1, b"k2=old"),
                (2, b"k3=new"),
            ]
        finally:
            store.close()

    asyncio.run(main())


def test_heartbeats_are_answered_while_a_persist_is_stuck_on_the_disk(tmp_path: Path) -> None:
    """A follower whose fsync stalls still answers the leader's heartbeats (they promise
    nothing about the log); its answer to the append waits for the disk. Before, every
    message waited: a disk stalled past an election timeout kept every follower silent, the
    leader's quorum check deposed it and the whole group campaigned."""

    async def main() -> None:
        c = Cluster(tmp_path)
        fs = GatedFileSystem()
        a, b = NodeId("a"), NodeId("b")
        try:
            node = await c.start("b", ["a", "b", "c"], fs=fs)
            rec = record(node)
            fs.armed = True
            entries = tuple(Entry(1, i, data=b"k%d=v" % i) for i in (1, 2))
            node.step([Message(MessageType.APP, to=b, frm=a, term=1, index=0, entries=entries)])
            await eventually(fs.entered.is_set, "the entries are being persisted")
            node.step([Message(MessageType.HEARTBEAT, to=b, frm=a, term=1, commit=0)])
            await eventually(
                lambda: bool(rec.sent(MessageType.HEARTBEAT_RESP, a)), "the heartbeat answered"
            )
            assert rec.sent(MessageType.APP_RESP, a) == []  # not before the disk
            fs.release.set()
            await eventually(lambda: bool(rec.sent(MessageType.APP_RESP, a)), "append answered")
            assert [m.index for m in rec.sent(MessageType.APP_RESP, a)] == [2]
            assert node.fatal is None
        finally:
            fs.release.set()
            await c.close()

    asyncio.run(main())


LINGER = NodeSettings(
    tick_interval_s=0.01,
    heartbeat_ticks=2,
    election_ticks=10,
    election_jitter_ticks=10,
    batch_linger_s=0.3,
)


def test_after_a_large_batch_the_next_one_lingers_and_after_a_small_one_not(
    tmp_path: Path,
) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await idle(leader)
        loop = asyncio.get_running_loop()
        batches = leader.metrics["batches"]
        await asyncio.gather(
            *(leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S) for i in range(8))
        )
        first_at = leader._pacer._last_at
        assert leader.metrics["batches"] - batches == 1  # 8 writers at once: linger next
        await leader.propose(b"lone=1", timeout=WAIT_S)
        assert leader._pacer._last_at - first_at >= 0.3 - 0.02
        # That batch held one proposal: the next lone proposal does not wait.
        started = loop.time()
        await leader.propose(b"lone=2", timeout=WAIT_S)
        assert loop.time() - started < 0.25

    run(tmp_path, scenario, settings=LINGER)
