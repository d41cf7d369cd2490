"""A stale node's check of a sender its config does not name (service/consensus/vouch.py): who
vouches, for how long, and how often a sender is checked. The members' answers are given
directly (a tablet server's, built from GetConsensusState by service/tserver/vouch.py);
tests/integration/test_tserver_cluster.py and test_master_membership.py run the whole thing on
real servers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from service.consensus.node import RaftNode
from service.consensus.transport import GrpcTransport
from service.consensus.vouch import MemberView, Vouches
from service.pb import master_pb2 as mpb
from service.raft import RaftConfig
from service.tserver.vouch import newest_view

TABLET = "t" * 32
SELF, A, B, NEW, STRANGER = "ts-self", "ts-a", "ts-b", "ts-new", "ts-stranger"


@dataclass
class _Status:
    config: RaftConfig


@dataclass
class _Node:
    config: RaftConfig

    def config_members(self) -> frozenset[str]:
        return frozenset(self.config.members)

    def status(self) -> _Status:
        return _Status(self.config)


@dataclass
class _Transport:
    addresses: dict[str, str] = field(default_factory=dict)
    credentials: Any = None

    def address_of(self, node: str) -> str | None:
        return self.addresses.get(node)

    def set_address(self, node: str, address: str) -> None:
        self.addresses[node] = address


def _config(index: int, *members: str, pending: tuple[int, list[str]] | None = None) -> Any:
    cs = mpb.ConsensusStatePB(current_term=5, leader_uuid=NEW)
    cs.committed_config.opid_index = index
    for m in members:
        p = cs.committed_config.peers.add(permanent_uuid=m, member_type=mpb.VOTER)
        p.last_known_addr.host, p.last_known_addr.port = "127.0.0.1", 7000 + len(m)
    if pending is not None:
        cs.pending_config.opid_index = pending[0]
        for m in pending[1]:
            cs.pending_config.peers.add(permanent_uuid=m, member_type=mpb.VOTER)
    return cs


class _Harness:
    def __init__(self, answers: dict[str, Any], *, own_index: int = 2) -> None:
        self.node = _Node(RaftConfig(frozenset({SELF, A, B}), index=own_index))
        self.transport = _Transport({A: "127.0.0.1:1", B: "127.0.0.1:2"})
        self.now = 100.0
        self.answers = answers
        self.asked: list[str] = []

        async def ask(member: str, address: str, tablet_id: str) -> MemberView | None:
            assert address == self.transport.addresses[member]
            self.asked.append(member)
            cs = self.answers.get(member)
            return None if cs is None else newest_view(cs)

        self.hosted = {TABLET}
        self.vouches = Vouches(
            SELF,
            lambda tid: cast(RaftNode, self.node) if tid in self.hosted else None,
            cast(GrpcTransport, self.transport),
            ask,
            retry_s=3.0,
            clock=lambda: self.now,
        )

    def members(self) -> frozenset[str]:
        return self.vouches.members(TABLET, cast(RaftNode, self.node))

    async def refused(self, sender: str, tablet: str = TABLET) -> None:
        self.vouches.on_foreign(tablet, sender)
        await asyncio.gather(*self.vouches._checks.values())


def test_a_member_naming_the_sender_in_a_newer_config_vouches_until_the_replica_catches_up() -> (
    None
):
    async def main() -> None:
        h = _Harness({A: None, B: _config(7, SELF, A, B, NEW)})
        assert NEW not in h.members()
        await h.refused(NEW)
        assert h.asked == [A, B]  # A did not answer; B did
        assert NEW in h.members() and h.vouches.vouched == 1
        assert h.transport.addresses[NEW] == "127.0.0.1:7006"  # to answer its leader
        # Its own config at the vouching index (the entries came): its config decides again.
        h.node.config = RaftConfig(frozenset({SELF, A, B}), index=7)
        assert NEW not in h.members()
        h.node.config = RaftConfig(frozenset({SELF, A, B}), index=2)
        assert NEW not in h.members()  # forgotten, not suspended

    asyncio.run(main())


def test_no_vouch_for_a_stranger_an_old_config_or_a_sender_being_removed() -> None:
    async def main() -> None:
        cases = {
            "no member names it": {A: _config(7, SELF, A, B), B: _config(7, SELF, A, B)},
            "named only by a config older than the replica's own": {
                A: _config(2, SELF, A, B, STRANGER),
                B: _config(1, SELF, A, B, STRANGER),
            },
            "named by the committed config, dropped by the pending one": {
                A: _config(7, SELF, A, B, STRANGER, pending=(8, [SELF, A, B])),
            },
            "nobody answers": {},
        }
        for why, answers in cases.items():
            h = _Harness(answers)
            await h.refused(STRANGER)
            assert STRANGER not in h.members(), why
            assert h.vouches.vouched == 0 and h.vouches.refused == 1, why

    asyncio.run(main())


def test_a_pending_config_naming_the_sender_vouches() -> None:
    async def main() -> None:
        h = _Harness({A: _config(5, SELF, A, B, pending=(6, [SELF, A, B, NEW]))})
        await h.refused(NEW)
        assert NEW in h.members()

    asyncio.run(main())


def test_a_refused_sender_is_checked_again_only_after_the_retry_interval() -> None:
    async def main() -> None:
        h = _Harness({A: _config(7, SELF, A, B), B: _config(7, SELF, A, B)})
        await h.refused(STRANGER)
        for _ in range(50):  # a flood of its batches
            await h.refused(STRANGER)
        assert h.asked == [A, B]
        h.now += 3.0
        await h.refused(STRANGER)
        assert h.asked == [A, B, A, B]
        # A tablet not hosted here (any more) asks nobody.
        h.vouches.on_foreign("x" * 32, STRANGER)
        await asyncio.gather(*h.vouches._checks.values())
        assert h.asked == [A, B, A, B]

    asyncio.run(main())


def test_checks_at_once_are_bounded() -> None:
    async def main() -> None:
        h = _Harness({})
        gate = asyncio.Event()

        async def slow(member: str, address: str, tablet_id: str) -> MemberView | None:
            await gate.wait()
            return None

        h.vouches.ask = slow
        for i in range(100):
            h.vouches.on_foreign(TABLET, f"ts-{i}")
        assert len(h.vouches._checks) == h.vouches.max_checks
        gate.set()
        await asyncio.gather(*h.vouches._checks.values())
        assert not h.vouches._checks
        await h.vouches.aclose()

    asyncio.run(main())


def test_a_stranger_naming_many_tablets_costs_one_check_per_interval() -> None:
    async def main() -> None:
        h = _Harness({A: _config(7, SELF, A, B), B: _config(7, SELF, A, B)})
        tablets = [f"{i:032d}" for i in range(50)]
        h.hosted.update(tablets)
        for t in tablets:  # all at once: one check runs, the others are just refused
            h.vouches.on_foreign(t, STRANGER)
        assert len(h.vouches._checks) == 1
        await asyncio.gather(*h.vouches._checks.values())
        for t in tablets:  # then, within the interval, none
            await h.refused(STRANGER, t)
        assert h.asked == [A, B]
        h.now += 3.0
        for t in tablets:
            await h.refused(STRANGER, t)
        assert h.asked == [A, B] * 2

    asyncio.run(main())


def test_a_new_leader_of_many_tablets_is_vouched_for_in_each() -> None:
    async def main() -> None:
        h = _Harness({A: _config(7, SELF, A, B, NEW)})
        tablets = [f"{i:032d}" for i in range(20)]
        h.hosted.update(tablets)
        for t in tablets:  # its batches to each, retried as a leader does
            await h.refused(NEW, t)
        assert all(NEW in h.vouches.members(t, cast(RaftNode, h.node)) for t in tablets)
        assert h.vouches.vouched == 20 and h.asked == [A] * 20

    asyncio.run(main())
