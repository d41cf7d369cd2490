"""A Raft node lets its state machine decode a large entry before it applies it, and goes on
answering heartbeats meanwhile (docs/design/consensus.md#R11).

The state machine here decodes nothing: its `decode_ahead` hands out a future per large entry
that the test resolves, standing in for a decoding that takes long on a starved host. While the
decodings are pending, the entry commits but is applied nowhere, and heartbeats and their answers
go on (what keeps a leader's check-quorum and the followers' election timers satisfied); once
they end, every node applies it. A node closed while a decoding is pending does not wait for it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from service.raft import Message, MessageType
from tests.helpers.raft_node import WAIT_S, Cluster, KvMachine, MemSender, eventually, run

BIG = b"big="


class SlowDecodingKv(KvMachine):
    def __init__(self) -> None:
        super().__init__()
        self.decoding: dict[int, asyncio.Future[None]] = {}

    def decode_ahead(self, index: int, data: bytes) -> asyncio.Future[None] | None:
        if not data.startswith(BIG):
            return None
        fut = asyncio.get_running_loop().create_future()
        self.decoding[index] = fut
        return fut

    def release(self) -> None:
        for fut in self.decoding.values():
            if not fut.done():
                fut.set_result(None)


class CountingSender(MemSender):
    """Counts the heartbeat answers this node sends."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.kinds: Counter[MessageType] = Counter()

    def send(self, group_id: str, messages: list[Message]) -> None:
        self.kinds.update(m.type for m in messages)
        super().send(group_id, messages)


class DecodingCluster(Cluster):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.senders: dict[str, CountingSender] = {}

    def machine(self, uuid: str) -> KvMachine:
        return SlowDecodingKv()

    def sender(self, uuid: str) -> MemSender:
        self.senders[uuid] = CountingSender(self.net, uuid)
        return self.senders[uuid]


def _sms(c: Cluster) -> list[SlowDecodingKv]:
    return [sm for sm in c.sms.values() if isinstance(sm, SlowDecodingKv)]


def _answers(c: DecodingCluster) -> dict[str, int]:
    return {u: s.kinds[MessageType.HEARTBEAT_RESP] for u, s in c.senders.items()}


def test_a_committed_entry_waits_for_its_decoding_while_heartbeats_go_on(tmp_path: Path) -> None:
    async def scenario(c: DecodingCluster) -> None:
        leader = await c.leader()
        await leader.propose(b"small=1", timeout=WAIT_S)  # small entries: nothing decoded ahead
        assert all(sm.decoding == {} for sm in _sms(c))
        proposal = asyncio.ensure_future(leader.propose(BIG + b"1", timeout=WAIT_S))
        try:
            await eventually(
                lambda: all(len(sm.decoding) == 1 for sm in _sms(c)), "every node decodes it"
            )
            index = next(iter(_sms(c)[0].decoding))
            await eventually(lambda: leader.status().commit >= index, "the entry commits")
            # Every node's Ready now waits for its decoding; heartbeats are answered meanwhile.
            before = _answers(c)
            await eventually(
                lambda: sum(n - before[u] >= 5 for u, n in _answers(c).items()) >= 2,
                "two nodes answer 5 more heartbeats while the entry waits for its decoding",
            )
            assert not proposal.done()
            assert all("big" not in sm.kv for sm in _sms(c)), "applied before its decoding ended"
        finally:
            for sm in _sms(c):
                sm.release()
        assert await proposal == index
        await eventually(lambda: all(sm.kv.get("big") == "1" for sm in _sms(c)), "applied")
        leader = await c.leader()
        await leader.propose(b"after=1", timeout=WAIT_S)
        await eventually(lambda: all(sm.kv.get("after") == "1" for sm in _sms(c)), "goes on")

    run(tmp_path, scenario, cluster=DecodingCluster)


def test_a_node_closed_while_decoding_does_not_wait_for_it(tmp_path: Path) -> None:
    async def scenario(c: DecodingCluster) -> None:
        leader = await c.leader()
        proposal = asyncio.ensure_future(leader.propose(BIG + b"1", timeout=WAIT_S))
        await eventually(lambda: all(len(sm.decoding) == 1 for sm in _sms(c)), "decoding")
        index = next(iter(_sms(c)[0].decoding))
        await eventually(lambda: leader.status().commit >= index, "the entry commits")
        await asyncio.wait_for(c.close(), WAIT_S)  # no decoding ever ends
        assert all("big" not in sm.kv for sm in _sms(c))
        done, _ = await asyncio.wait([proposal], timeout=WAIT_S)
        assert done and proposal.exception() is not None  # closing fails the waiter

    run(tmp_path, scenario, cluster=DecodingCluster)
