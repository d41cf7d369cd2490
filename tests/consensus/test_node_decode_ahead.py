"""A Raft node lets its state machine decode a large entry before it applies it, and goes on
answering heartbeats meanwhile (docs/design/consensus.md#R11).

The state machine here decodes nothing: its `decode_ahead` hands out a future per large entry
that the test resolves, standing in for a decoding that takes long on a starved host. While the
decodings are pending, the entry commits but is applied nowhere, and the group keeps its leader
and term (the followers answer heartbeats, so check-quorum keeps the leader, and the leader's
heartbeats keep the followers from campaigning); once they end, every node applies it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.helpers.raft_node import FAST, UUIDS, WAIT_S, Cluster, KvMachine, eventually, run

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


class DecodingCluster(Cluster):
    def machine(self, uuid: str) -> KvMachine:
        return SlowDecodingKv()


def _sms(c: Cluster) -> list[SlowDecodingKv]:
    return [sm for sm in c.sms.values() if isinstance(sm, SlowDecodingKv)]


def test_a_committed_entry_waits_for_its_decoding_while_heartbeats_go_on(tmp_path: Path) -> None:
    async def scenario(c: DecodingCluster) -> None:
        leader = await c.leader()
        term = leader.status().term
        await leader.propose(b"small=1", timeout=WAIT_S)  # small entries: nothing decoded ahead
        assert all(sm.decoding == {} for sm in _sms(c))
        proposal = asyncio.ensure_future(leader.propose(BIG + b"1", timeout=WAIT_S))
        await eventually(
            lambda: all(len(sm.decoding) == 1 for sm in _sms(c)), "every node decodes it"
        )
        index = next(iter(_sms(c)[0].decoding))
        await eventually(lambda: leader.status().commit >= index, "the entry commits")
        # Many election timeouts (10 ticks of 10 ms) with the decodings pending.
        await asyncio.sleep(30 * 10 * FAST.tick_interval_s)
        assert not proposal.done()
        assert all("big" not in sm.kv for sm in _sms(c)), "applied before its decoding ended"
        statuses = [n.status() for n in c.nodes.values()]
        assert [s.term for s in statuses] == [term] * 3, "an election while decoding"
        assert sorted(s.role.value for s in statuses) == ["FOLLOWER", "FOLLOWER", "LEADER"]
        for sm in _sms(c):
            sm.decoding[index].set_result(None)
        assert await proposal == index
        await eventually(lambda: all(sm.kv.get("big") == "1" for sm in _sms(c)), "applied")
        await leader.propose(b"after=1", timeout=WAIT_S)
        await eventually(lambda: all(sm.kv.get("after") == "1" for sm in _sms(c)), "goes on")

    run(tmp_path, scenario, cluster=DecodingCluster, members=UUIDS)
