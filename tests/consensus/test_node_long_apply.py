"""A leader tells its followers that a large entry committed before it applies it
(docs/design/consensus.md#R11).

Applying a large entry holds the node's loop; a leader that kept the entry's commit in a held
commit-only append (sent at its next tick) would be silent for that whole time while its
followers, knowing of no commit, have nothing to apply and tick toward an election. Here the
state machine records, when the leader starts applying a large entry, the highest commit index
each follower has been delivered so far: it must already cover the entry. Small entries keep
the batching (their commit may wait for the tick), which the second test pins. And every node
that was held applying a large entry expects its peers, applying it too, to be as silent: its
timeouts stretch (the third test).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

from service.raft import Message, MessageType, Role
from tests.helpers.raft_node import (
    FAST,
    WAIT_S,
    Cluster,
    KvMachine,
    MemSender,
    eventually,
    run,
)

BIG = b"big=" + b"x" * (300 << 10)  # past the node's LONG_APPLY_BYTES


class RecordingSender(MemSender):
    """Records, per destination, the highest commit index delivered (in the same loop turn as
    the delivery itself: the in-memory network delivers on the next iteration)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.delivered_commit: dict[str, int] = defaultdict(int)

    def _record(self, to: str, commit: int) -> None:
        self.delivered_commit[to] = max(self.delivered_commit[to], commit)

    def send(self, group_id: str, messages: list[Message]) -> None:
        loop = asyncio.get_running_loop()
        for m in messages:
            if m.type in (MessageType.APP, MessageType.HEARTBEAT):
                loop.call_soon(self._record, m.to, m.commit)
        super().send(group_id, messages)


class WatchingKv(KvMachine):
    """On the leader, notes what its followers were told when each entry's apply starts."""

    def __init__(self, cluster: RecordingCluster, uuid: str) -> None:
        super().__init__()
        self.cluster = cluster
        self.uuid = uuid
        self.told_at_apply: dict[int, dict[str, int]] = {}

    def apply(self, index: int, data: bytes) -> object:
        node = self.cluster.nodes.get(self.uuid)
        if node is not None and node.status().role is Role.LEADER:
            sender = self.cluster.senders[self.uuid]
            self.told_at_apply[index] = {
                u: sender.delivered_commit[u] for u in self.cluster.nodes if u != self.uuid
            }
        return super().apply(index, data)


class RecordingCluster(Cluster):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.senders: dict[str, RecordingSender] = {}

    def machine(self, uuid: str) -> KvMachine:
        return WatchingKv(self, uuid)

    def sender(self, uuid: str) -> MemSender:
        self.senders[uuid] = RecordingSender(self.net, uuid)
        return self.senders[uuid]


def _told(c: RecordingCluster, leader_uuid: str, index: int) -> dict[str, int]:
    sm = c.sms[leader_uuid]
    assert isinstance(sm, WatchingKv)
    return sm.told_at_apply[index]


def test_followers_learn_a_large_entry_committed_before_the_leader_applies_it(
    tmp_path: Path,
) -> None:
    async def scenario(c: RecordingCluster) -> None:
        leader = await c.leader()
        uuid = str(leader.uuid)
        for _ in range(3):  # more than once: not a lucky tick
            index = await leader.propose(BIG, timeout=WAIT_S)
            assert isinstance(index, int)
            told = _told(c, uuid, index)
            assert len(told) == 2
            assert all(commit >= index for commit in told.values()), (index, told)
        await eventually(
            lambda: all(len(sm.kv.get("big", "")) == len(BIG) - 4 for sm in c.sms.values()),
            "every node applies the large entries",
        )
        c.check_order()

    run(tmp_path, scenario, cluster=RecordingCluster)


def test_small_entries_keep_their_commit_for_the_next_batch_or_tick(tmp_path: Path) -> None:
    """The flush is for large entries only: at a small entry's apply, the followers have
    typically not been told yet (the held commit-only append waits), which saves a message
    per proposal. At least one of several must show it, or the hold is gone."""

    async def scenario(c: RecordingCluster) -> None:
        leader = await c.leader()
        uuid = str(leader.uuid)
        not_yet = 0
        for i in range(10):
            index = await leader.propose(f"k{i}=v".encode(), timeout=WAIT_S)
            assert isinstance(index, int)
            if any(commit < index for commit in _told(c, uuid, index).values()):
                not_yet += 1
        assert not_yet > 0

    run(tmp_path, scenario, cluster=RecordingCluster)


HOLD_S = 0.15
"""How long a large entry's apply holds a node's loop below: 15 of FAST's ticks."""


class SlowKv(KvMachine):
    def apply(self, index: int, data: bytes) -> object:
        if len(data) > len(BIG) // 2:
            time.sleep(HOLD_S)  # the loop held, as by a 10,000-tablet CreateTable
        return super().apply(index, data)


class SlowCluster(Cluster):
    def machine(self, uuid: str) -> KvMachine:
        return SlowKv()


def test_a_node_held_applying_a_large_entry_stretches_its_timeouts(tmp_path: Path) -> None:
    """Each node measures its own apply of the large entry and, expecting its peers to be as
    long applying it, stretches its election (a leader: check-quorum) timeout toward the cap
    (`Raft.held_applying`). The nodes share one event loop here, so no peer's message can
    arrive late meanwhile: the stretch comes from the measured hold alone."""

    async def scenario(c: SlowCluster) -> None:
        leader = await c.leader()
        index = await leader.propose(BIG, timeout=WAIT_S)
        assert isinstance(index, int)
        await eventually(
            lambda: all(n.applied >= index for n in c.nodes.values()),
            "every node applies the large entry",
        )
        timeouts = {u: n.status().election_timeout for u, n in c.nodes.items()}
        assert all(t > FAST.election_ticks for t in timeouts.values()), timeouts

    run(tmp_path, scenario, cluster=SlowCluster)
