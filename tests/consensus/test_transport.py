"""The gRPC transport: envelope checks in `deliver()`, the servicer over real gRPC on loopback,
and two transports talking to each other (incarnations learned and enforced both ways)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from service.common.errors import (
    CODE_KEY,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    WrongDestination,
    from_grpc,
)
from service.common.metrics import MetricsRegistry
from service.consensus.codec import message_to_pb
from service.consensus.fs import RealFileSystem
from service.consensus.transport import ConsensusServicer, GrpcTransport, Incarnations
from service.consensus.transport_metrics import install_transport_metrics
from service.pb import consensus_pb2 as pb
from service.raft.types import Entry, Message, MessageType, NodeId
from tests.helpers.status_pages import parse_metrics

A, B, C = NodeId("uuid-a"), NodeId("uuid-b"), NodeId("uuid-c")
GROUP = "g1"
STEP = "/tessera.consensus.ConsensusService/Step"


class Inbox:
    """A group's delivery callbacks, recording what they were given."""

    def __init__(self) -> None:
        self.batches: list[list[Message]] = []
        self.unreachable: list[str] = []

    def deliver(self, msgs: list[Message]) -> None:
        self.batches.append(msgs)

    def report_unreachable(self, node: str) -> None:
        self.unreachable.append(node)

    @property
    def messages(self) -> list[Message]:
        return [m for b in self.batches for m in b]


def make_transport(tmp_path: Path, uuid: str, sub: str | None = None) -> GrpcTransport:
    directory = os.path.join(str(tmp_path), sub or uuid)
    return GrpcTransport(uuid, incarnations=Incarnations(RealFileSystem(), directory, uuid))


def heartbeat(to: str = B, frm: str = A, term: int = 3) -> Message:
    return Message(
        MessageType.HEARTBEAT, to=NodeId(to), frm=NodeId(frm), term=term, commit=2, context=b"c"
    )


def request(
    receiver: GrpcTransport,
    msgs: Sequence[Message] = (),
    *,
    src: str = A,
    src_instance: str = "inc-a-1",
    dest: str | None = None,
    dest_instance: str = "",
    group: str = GROUP,
) -> pb.StepRequest:
    req = pb.StepRequest(
        dest_uuid=receiver.uuid if dest is None else dest,
        src_uuid=src,
        src_instance=src_instance,
        dest_instance=dest_instance,
    )
    req.groups.add(group_id=group).messages.extend(message_to_pb(m) for m in msgs)
    return req


# --- deliver(): the envelope checks ---------------------------------------------------------------


@pytest.fixture
def receiver(tmp_path: Path) -> tuple[GrpcTransport, Inbox]:
    t = make_transport(tmp_path, B)
    inbox = Inbox()
    t.register(GROUP, inbox.deliver, inbox.report_unreachable)
    return t, inbox


def test_deliver_hands_a_valid_batch_to_the_group(receiver: tuple[GrpcTransport, Inbox]) -> None:
    t, inbox = receiver
    msgs = [heartbeat(), heartbeat(term=4)]
    req = request(t, msgs)
    req.addresses[A] = "10.0.0.1:1"
    req.addresses[B] = "10.0.0.2:1"  # our own address as the sender knows it: not recorded
    t.deliver(req)
    assert inbox.batches == [msgs]
    assert t.received == 2
    assert t.address_of(A) == "10.0.0.1:1"
    assert t.address_of(B) is None


def test_wrong_dest_uuid_is_refused_before_anything_is_learned(
    receiver: tuple[GrpcTransport, Inbox],
) -> None:
    t, inbox = receiver
    with pytest.raises(WrongDestination, match="uuid-c"):
        t.deliver(request(t, [heartbeat(to=C)], dest=C))
    assert inbox.batches == []
    assert t.incarnations is not None
    assert t.incarnations.peers == {}  # a misaddressed request teaches us nothing


def test_wrong_dest_instance_is_refused(receiver: tuple[GrpcTransport, Inbox]) -> None:
    t, inbox = receiver
    assert t.incarnations is not None
    with pytest.raises(WrongDestination, match="previous life"):
        t.deliver(request(t, [heartbeat()], dest_instance="an-older-incarnation"))
    assert inbox.batches == []
    # Naming the right incarnation (or none yet) is accepted.
    t.deliver(request(t, [heartbeat()], dest_instance=t.incarnations.own))
    t.deliver(request(t, [heartbeat()], dest_instance=""))
    assert len(inbox.batches) == 2


def test_first_contact_learns_and_persists_the_peer_incarnation(tmp_path: Path) -> None:
    t = make_transport(tmp_path, B)
    inbox = Inbox()
    t.register(GROUP, inbox.deliver)
    t.deliver(request(t, [heartbeat()], src_instance="inc-a-1"))
    t.deliver(request(t, [heartbeat()], src_instance="inc-a-1"))  # same life: fine
    assert len(inbox.batches) == 2

    # A restarted server (a new Incarnations over the same directory) still knows A's life,
    # and its own incarnation did not change.
    again = Incarnations(RealFileSystem(), os.path.join(str(tmp_path), B), B)
    assert t.incarnations is not None
    assert again.own == t.incarnations.own
    assert again.peers == {A: "inc-a-1"}
    with pytest.raises(FailedPrecondition, match="different data directory") as ei:
        again.check(A, "inc-a-2")
    assert type(ei.value) is FailedPrecondition
    again.check(A, "inc-a-1")

    # The same through the transport: the wiped peer's batch never reaches the group.
    t2 = GrpcTransport(B, incarnations=again)
    inbox2 = Inbox()
    t2.register(GROUP, inbox2.deliver)
    with pytest.raises(FailedPrecondition, match="different data directory"):
        t2.deliver(request(t2, [heartbeat()], src_instance="inc-a-2"))
    assert inbox2.batches == []


def test_incarnations_directory_of_another_node_is_refused(tmp_path: Path) -> None:
    d = os.path.join(str(tmp_path), "dir")
    Incarnations(RealFileSystem(), d, B)
    with pytest.raises(FailedPrecondition, match="belongs to node uuid-b"):
        Incarnations(RealFileSystem(), d, C)


def test_two_formats_get_different_incarnations(tmp_path: Path) -> None:
    one = Incarnations(RealFileSystem(), os.path.join(str(tmp_path), "1"), B)
    two = Incarnations(RealFileSystem(), os.path.join(str(tmp_path), "2"), B)
    assert one.own and two.own and one.own != two.own


def test_missing_src_instance_is_invalid(receiver: tuple[GrpcTransport, Inbox]) -> None:
    t, inbox = receiver
    with pytest.raises(InvalidArgument, match="does not name its incarnation"):
        t.deliver(request(t, [heartbeat()], src_instance=""))
    assert inbox.batches == []
    assert t.incarnations is not None and t.incarnations.peers == {}


def test_missing_src_uuid_is_invalid(receiver: tuple[GrpcTransport, Inbox]) -> None:
    t, inbox = receiver
    with pytest.raises(InvalidArgument, match="without src_uuid"):
        t.deliver(request(t, [], src=""))
    assert inbox.batches == []


def test_unknown_group_is_not_found(receiver: tuple[GrpcTransport, Inbox]) -> None:
    t, inbox = receiver
    with pytest.raises(NotFound, match="no raft group 'other'"):
        t.deliver(request(t, [heartbeat()], group="other"))
    assert inbox.batches == []
    t.unregister(GROUP)
    with pytest.raises(NotFound):
        t.deliver(request(t, [heartbeat()]))


def test_a_request_for_several_groups_is_checked_whole_before_any_is_delivered(
    receiver: tuple[GrpcTransport, Inbox],
) -> None:
    t, g1 = receiver
    g2 = Inbox()
    t.register("g2", g2.deliver)
    bad = message_to_pb(heartbeat())
    bad.term = 0
    req = request(t, [heartbeat()])
    req.groups.add(group_id="g2").messages.append(bad)  # g1 first and good, g2 bad
    with pytest.raises(InvalidArgument, match="group 'g2'"):
        t.deliver(req)
    req = request(t, [heartbeat()])
    req.groups.add(group_id="nowhere").messages.append(message_to_pb(heartbeat()))
    with pytest.raises(NotFound, match="'nowhere'"):
        t.deliver(req)
    assert g1.batches == [] and g2.batches == [] and t.received == 0
    t.drop_unknown_groups = True  # a tablet server: a group it does not host is skipped
    t.deliver(req)
    assert g1.messages == [heartbeat()] and t.unknown_group_batches == 1


def test_only_members_of_a_group_may_send_it_messages(tmp_path: Path) -> None:
    t = make_transport(tmp_path, B)
    g1, g2 = Inbox(), Inbox()
    members = {GROUP: frozenset({A, B}), "g2": frozenset[str]()}
    t.register(GROUP, g1.deliver, members=lambda: members[GROUP])
    t.register("g2", g2.deliver, members=lambda: members["g2"])
    told: list[tuple[str, str]] = []
    t.on_foreign = lambda group, sender: told.append((group, sender))
    outsider = "node-c"
    req = request(t, [heartbeat(frm=outsider)], src=outsider, src_instance="inc-c-1")
    with pytest.raises(PermissionDenied, match="not a member"):
        t.deliver(req)
    assert g1.batches == [] and t.foreign_batches == 1 and t.received == 0
    # The refusal is told to the server, which may ask the members about the sender.
    assert told == [(GROUP, outsider)]
    members[GROUP] = frozenset({A, B, outsider})  # ... and a member vouched for it
    t.deliver(req)
    assert g1.messages == [heartbeat(frm=outsider)]
    g1.batches.clear()
    members[GROUP] = frozenset({A, B})
    # A group that knows no config yet (a node joining empty) hears from anyone; in one
    # request, the group the sender is foreign to is skipped and the other delivered.
    req.groups.add(group_id="g2").messages.append(message_to_pb(heartbeat(frm=outsider)))
    t.deliver(req)
    assert g1.batches == [] and g2.messages == [heartbeat(frm=outsider)]
    registry = MetricsRegistry()
    install_transport_metrics(registry, lambda: t)
    foreign = parse_metrics(registry.render())["tessera_raft_foreign_batches_total"]
    assert foreign.value() == t.foreign_batches == 2
    t.deliver(request(t, [heartbeat()]))  # a member
    assert g1.messages == [heartbeat()]
    assert told == [(GROUP, outsider)] * 2  # a member's batches are nobody's business


def test_malformed_message_is_invalid_and_nothing_is_delivered(
    receiver: tuple[GrpcTransport, Inbox],
) -> None:
    t, inbox = receiver
    good = message_to_pb(heartbeat())
    bad = message_to_pb(heartbeat())
    bad.term = 0
    req = request(t)
    req.groups[0].messages.extend([good, bad])  # one bad message spoils the whole request
    req.addresses[C] = "10.0.0.3:1"
    with pytest.raises(
        InvalidArgument, match=r"malformed raft message from uuid-a for group 'g1': .*without a"
    ):
        t.deliver(req)
    assert inbox.batches == []
    assert t.received == 0
    assert t.address_of(C) is None


def test_message_addressed_inside_the_batch_to_another_node_is_invalid(
    receiver: tuple[GrpcTransport, Inbox],
) -> None:
    t, inbox = receiver
    with pytest.raises(InvalidArgument, match="inside a batch"):
        t.deliver(request(t, [heartbeat(to=C)]))  # envelope says B, message says C
    with pytest.raises(InvalidArgument, match="inside a batch"):
        t.deliver(request(t, [heartbeat(frm=C)]))  # envelope says A sent it, message says C
    assert inbox.batches == []


def test_send_without_an_address_drops_and_reports_unreachable(tmp_path: Path) -> None:
    async def main() -> None:
        t = make_transport(tmp_path, A)
        inbox = Inbox()
        t.register(GROUP, inbox.deliver, inbox.report_unreachable)
        t.send(GROUP, [heartbeat(to=B)])
        await eventually(lambda: inbox.unreachable == [B])
        assert t.dropped == 1 and t.sent == 0
        await t.aclose()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


# --- over real gRPC -------------------------------------------------------------------------------


async def eventually(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def serving(
    transport: GrpcTransport, options: Sequence[tuple[str, Any]] = ()
) -> AsyncIterator[str]:
    server = grpc.aio.server(options=list(options))
    port = server.add_insecure_port("127.0.0.1:0")
    assert port
    ConsensusServicer(transport).add_to_server(server)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def raw_step(address: str, payload: bytes) -> pb.StepResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(
            STEP, request_serializer=None, response_deserializer=pb.StepResponse.FromString
        )
        resp: pb.StepResponse = await call(payload, timeout=10)
        return resp


async def raw_step_error(address: str, payload: bytes) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await raw_step(address, payload)
    return ei.value


def test_grpc_envelope_errors_travel_with_their_codes(tmp_path: Path) -> None:
    async def main() -> None:
        t = make_transport(tmp_path, B)
        inbox = Inbox()
        t.register(GROUP, inbox.deliver)
        async with serving(t) as address:
            # Garbage: INVALID_ARGUMENT naming the problem, not gRPC's generic INTERNAL.
            e = await raw_step_error(address, b"\x0a\xff\x01garbage")
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "undecodable StepRequest" in (e.details() or "")
            err = from_grpc(e)
            assert type(err) is InvalidArgument

            # Wrong uuid: FAILED_PRECONDITION carrying WRONG_DESTINATION.
            wrong = request(t, [heartbeat(to=C)], dest=C).SerializeToString()
            e = await raw_step_error(address, wrong)
            assert e.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert (CODE_KEY, "WRONG_DESTINATION") in list(e.trailing_metadata() or ())
            assert type(from_grpc(e)) is WrongDestination

            # Unknown group and malformed message.
            e = await raw_step_error(
                address, request(t, [heartbeat()], group="x").SerializeToString()
            )
            assert e.code() is grpc.StatusCode.NOT_FOUND
            assert type(from_grpc(e)) is NotFound
            e = await raw_step_error(address, request(t, [heartbeat(term=0)]).SerializeToString())
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert type(from_grpc(e)) is InvalidArgument

            # A good request is answered with the receiver's incarnation.
            resp = await raw_step(address, request(t, [heartbeat()]).SerializeToString())
            assert t.incarnations is not None
            assert resp.instance == t.incarnations.own
            assert inbox.messages == [heartbeat()]
        await t.aclose()

    asyncio.run(main())


def test_grpc_oversized_request_is_resource_exhausted(tmp_path: Path) -> None:
    async def main() -> None:
        t = make_transport(tmp_path, B)
        inbox = Inbox()
        t.register(GROUP, inbox.deliver)
        async with serving(t, [("grpc.max_receive_message_length", 1024)]) as address:
            big = Message(
                MessageType.APP,
                to=B,
                frm=A,
                term=2,
                index=0,
                entries=(Entry(2, 1, data=b"x" * 10_000),),
            )
            payload = request(t, [big]).SerializeToString()
            assert len(payload) > 10_000
            e = await raw_step_error(address, payload)
            assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert type(from_grpc(e)) is ResourceExhausted
            # Under the limit the same server accepts.
            await raw_step(address, request(t, [heartbeat()]).SerializeToString())
        assert inbox.messages == [heartbeat()]
        await t.aclose()

    asyncio.run(main())


def test_two_transports_exchange_messages_and_learn_incarnations(tmp_path: Path) -> None:
    async def main() -> None:
        ta, tb = make_transport(tmp_path, A), make_transport(tmp_path, B)
        in_a, in_b = Inbox(), Inbox()
        ta.register(GROUP, in_a.deliver, in_a.report_unreachable)
        tb.register(GROUP, in_b.deliver, in_b.report_unreachable)
        assert ta.incarnations is not None and tb.incarnations is not None
        async with serving(ta) as addr_a, serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            tb.set_address(A, addr_a)

            app = Message(
                MessageType.APP,
                to=B,
                frm=A,
                term=2,
                index=0,
                commit=1,
                entries=(Entry(1, 1), Entry(2, 2, data=b"hello")),
            )
            ta.send(GROUP, [app, heartbeat()])
            await eventually(lambda: len(in_b.messages) == 2 and ta.sent == 2)
            # Two lanes (the append on one, the heartbeat on the other): no order between them.
            assert sorted(in_b.messages, key=lambda m: m.type.value) == [app, heartbeat()]
            assert tb.incarnations.peers == {A: ta.incarnations.own}
            # The reply direction, through B's own sender.
            resp = Message(MessageType.HEARTBEAT_RESP, to=A, frm=B, term=3, context=b"c")
            tb.send(GROUP, [resp])
            await eventually(lambda: in_a.messages == [resp])
            assert ta.incarnations.peers == {B: tb.incarnations.own}

            # B loses its disk: same uuid, new data directory, new incarnation, new port.
            wiped = make_transport(tmp_path, B, sub="b-wiped")
            in_wiped = Inbox()
            wiped.register(GROUP, in_wiped.deliver)
            assert wiped.incarnations is not None
            assert wiped.incarnations.own != tb.incarnations.own
            async with serving(wiped) as addr_wiped:
                # A learned B's first incarnation, so the wiped B refuses what A sends it
                # (dest_instance names the old life) and A reports B unreachable.
                ta.set_address(B, addr_wiped)
                ta.send(GROUP, [heartbeat(term=4)])
                await eventually(lambda: in_a.unreachable == [B])
                assert ta.dropped == 1
                assert in_wiped.batches == []

                # A sender that never met B's old life is accepted: the refusal above was
                # A's learned incarnation at work, not something else about the request.
                tc = make_transport(tmp_path, C)
                tc.set_address(B, addr_wiped)
                tc.send(GROUP, [heartbeat(to=B, frm=C)])
                await eventually(lambda: in_wiped.messages == [heartbeat(to=B, frm=C)])
                await tc.aclose()
        await ta.aclose()
        await tb.aclose()
        await wiped.aclose()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_a_wiped_sender_is_refused_by_a_peer_that_knew_it(tmp_path: Path) -> None:
    async def main() -> None:
        ta, tb = make_transport(tmp_path, A), make_transport(tmp_path, B)
        in_b = Inbox()
        tb.register(GROUP, in_b.deliver)
        async with serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            ta.send(GROUP, [heartbeat()])
            await eventually(lambda: len(in_b.messages) == 1)
            await ta.aclose()

            wiped_a = make_transport(tmp_path, A, sub="a-wiped")
            in_wiped_a = Inbox()
            wiped_a.register(GROUP, in_wiped_a.deliver, in_wiped_a.report_unreachable)
            wiped_a.set_address(B, addr_b)
            wiped_a.send(GROUP, [heartbeat(term=9)])
            await eventually(lambda: in_wiped_a.unreachable == [B])
            assert len(in_b.messages) == 1  # the amnesiac's heartbeat never reached B's group
            await wiped_a.aclose()
        await tb.aclose()

    asyncio.run(main())


def test_a_node_that_knows_nobody_can_answer_a_sender(tmp_path: Path) -> None:
    """A learner booted with no peers (added later with ADD_LEARNER) knows no address: it must
    learn the leader's from the leader's own requests, or it can never acknowledge anything."""

    async def main() -> None:
        ta, td = make_transport(tmp_path, A), make_transport(tmp_path, "uuid-d")
        in_a, in_d = Inbox(), Inbox()
        ta.register(GROUP, in_a.deliver)
        td.register(GROUP, in_d.deliver, in_d.report_unreachable)
        async with serving(ta) as addr_a, serving(td) as addr_d:
            # What RaftNode does on start: every recorded address, its own included.
            ta.set_address(A, addr_a)
            ta.set_address(B, "127.0.0.1:1")
            ta.set_address("uuid-d", addr_d)
            ta.send(GROUP, [heartbeat(to="uuid-d")])
            await eventually(lambda: len(in_d.messages) == 1)
            assert td.address_of(B) == "127.0.0.1:1"  # third parties, learned from the request
            assert td.address_of(A) == addr_a  # and the sender itself
            resp = Message(MessageType.HEARTBEAT_RESP, to=A, frm=NodeId("uuid-d"), term=3)
            td.send(GROUP, [resp])
            await eventually(lambda: in_a.messages == [resp] or bool(in_d.unreachable))
            assert in_d.unreachable == []
            assert in_a.messages == [resp]
        await ta.aclose()
        await td.aclose()

    asyncio.run(main())


# --- batching and what a request carries ----------------------------------------------------------


class RecordingTransport(GrpcTransport):
    """Records every request `deliver` is given (a copy), then delivers it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[pb.StepRequest] = []

    @classmethod
    def for_node(cls, tmp_path: Path, uuid: str) -> RecordingTransport:
        return cls(uuid, incarnations=Incarnations(RealFileSystem(), str(tmp_path / uuid), uuid))

    def deliver(self, req: pb.StepRequest) -> None:
        copy = pb.StepRequest()
        copy.CopyFrom(req)
        self.requests.append(copy)
        super().deliver(req)


def test_one_send_is_one_request_and_addresses_travel_only_when_they_are_news(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        ta = make_transport(tmp_path, A)
        tb = RecordingTransport.for_node(tmp_path, B)
        in_b = Inbox()
        tb.register(GROUP, in_b.deliver)
        async with serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            ta.set_address(C, "127.0.0.1:1")
            hbs = [heartbeat(term=t) for t in (3, 4, 5)]
            ta.send(GROUP, hbs)  # one Ready's messages for B: one request
            await eventually(lambda: len(in_b.messages) == 3)
            assert [[len(g.messages) for g in r.groups] for r in tb.requests] == [[3]]
            assert set(tb.requests[0].addresses) == {B, C}  # first contact: what A knows
            ta.send(GROUP, [heartbeat(term=6)])
            await eventually(lambda: len(tb.requests) == 2)
            assert not tb.requests[1].addresses  # nothing new since
            ta.set_address("uuid-e", "127.0.0.1:2")
            ta.send(GROUP, [heartbeat(term=7)])
            await eventually(lambda: len(tb.requests) == 3)
            assert set(tb.requests[2].addresses) == {B, C, "uuid-e"}
            assert tb.address_of("uuid-e") == "127.0.0.1:2"
            ta.send(GROUP, [heartbeat(term=8)])
            await eventually(lambda: len(tb.requests) == 4)
            assert not tb.requests[3].addresses
            assert ta.sent == 6 and ta.dropped == 0
        await ta.aclose()
        await tb.aclose()

    asyncio.run(main())


def test_everything_queued_for_a_peer_goes_in_one_request_whatever_the_groups(
    tmp_path: Path,
) -> None:
    """The groups of a process tick together (ticker.py): what they queue for a peer in one
    loop iteration leaves as one request of several GroupBatches, in queue order per group."""

    async def main() -> None:
        ta = make_transport(tmp_path, A)
        tb = RecordingTransport.for_node(tmp_path, B)
        inboxes = {g: Inbox() for g in ("g1", "g2", "g3")}
        for g, inbox in inboxes.items():
            tb.register(g, inbox.deliver)
        async with serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            ta.send("g1", [heartbeat(term=3)])  # first contact: its own unary Step
            await eventually(lambda: len(tb.requests) == 1)
            for term in (4, 5):  # then, in one loop iteration, six sends for three groups
                for g in inboxes:
                    ta.send(g, [heartbeat(term=term)])
            await eventually(lambda: sum(len(i.messages) for i in inboxes.values()) == 7)
            assert len(tb.requests) == 2
            groups = [(g.group_id, [m.term for m in g.messages]) for g in tb.requests[1].groups]
            assert groups == [("g1", [4, 5]), ("g2", [4, 5]), ("g3", [4, 5])]
            assert ta.sent == 7
        await ta.aclose()
        await tb.aclose()

    asyncio.run(main())


def test_a_leaders_messages_queued_past_its_term_are_dropped_not_sent_late(
    tmp_path: Path,
) -> None:
    """What a leader queued for a peer is sent only while its node still leads that term: a
    heartbeat of a term the node lost, delivered late, would have the peer take a deposed
    leader as alive (and refuse a real candidate's votes). Answers and messages of the term
    the node leads now still go."""

    async def main() -> None:
        ta = make_transport(tmp_path, A)
        tb = make_transport(tmp_path, B)
        leads = {"term": 3}
        ta.register(GROUP, Inbox().deliver, leader_term=lambda: leads["term"])
        in_b = Inbox()
        tb.register(GROUP, in_b.deliver)
        app = Message(MessageType.APP, to=B, frm=A, term=3, index=0, commit=1)
        async with serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            ta.send(GROUP, [heartbeat(term=3), app])
            await eventually(lambda: len(in_b.messages) == 2)
            assert ta.deposed_dropped == 0

            # Queued in term 3; the node steps down before its sender picks them up.
            answer = Message(MessageType.HEARTBEAT_RESP, to=B, frm=A, term=3, context=b"c")
            ta.send(GROUP, [heartbeat(term=3), app, answer])
            leads["term"] = 0
            await eventually(lambda: len(in_b.messages) == 3)
            assert in_b.messages[2] == answer
            assert ta.deposed_dropped == 2

            # It wins term 5: the old term's leftovers are dropped, the new term's go.
            ta.send(GROUP, [heartbeat(term=3), heartbeat(term=5)])
            leads["term"] = 5
            await eventually(lambda: len(in_b.messages) == 4)
            assert in_b.messages[3] == heartbeat(term=5)
            assert ta.deposed_dropped == 3
            # A sender whose every message was dropped sends nothing at all (no empty request).
            ta.send(GROUP, [heartbeat(term=4)])
            ta.send(GROUP, [heartbeat(term=5)])
            await eventually(lambda: len(in_b.messages) == 5)
            assert ta.deposed_dropped == 4
            # Exported beside the other outcomes, as a master and a tablet server serve them.
            registry = MetricsRegistry()
            install_transport_metrics(registry, lambda: ta)
            messages = parse_metrics(registry.render())["tessera_raft_messages_total"]
            assert messages.kind == "counter"
            assert messages.value(outcome="deposed") == 4
            assert messages.value(outcome="sent") == ta.sent == 5
        await ta.aclose()
        await tb.aclose()

    asyncio.run(main())


_PEER_PROCESS = """
import asyncio, sys
import grpc
from service.consensus.fs import RealFileSystem
from service.consensus.transport import ConsensusServicer, GrpcTransport, Incarnations

async def main():
    uuid, directory = sys.argv[1], sys.argv[2]
    t = GrpcTransport(uuid, incarnations=Incarnations(RealFileSystem(), directory, uuid))
    t.register("g1", lambda msgs: None)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    ConsensusServicer(t).add_to_server(server)
    await server.start()
    print(port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_peer_process_killed_is_reported_gone_at_once_and_a_refusal_is_not(
    tmp_path: Path,
) -> None:
    """kill -9 of a peer's process closes its sockets: the open stream to it fails
    UNAVAILABLE and every group is told the peer is gone, with nothing more sent (a follower
    sends its dead leader nothing). A live peer refusing a request is not gone."""

    async def main() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PEER_PROCESS, B, str(tmp_path / "b")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            port = int(await asyncio.to_thread(proc.stdout.readline))
            ta = make_transport(tmp_path, A)
            gone: list[str] = []
            ta.register(GROUP, Inbox().deliver, peer_gone=gone.append)
            ta.set_address(B, f"127.0.0.1:{port}")
            ta.send(GROUP, [heartbeat(term=3)])  # the first contact, unary
            await eventually(lambda: ta.sent == 1)
            ta.send(GROUP, [heartbeat(term=3)])  # opens the stream
            await eventually(lambda: ta.sent == 2)
            assert gone == [] and ta.gone_reports == 0
            proc.kill()
            await asyncio.to_thread(proc.wait)
            await eventually(lambda: gone == [B], timeout=5.0)
            registry = MetricsRegistry()
            install_transport_metrics(registry, lambda: ta)
            exported = parse_metrics(registry.render())["tessera_raft_peer_gone_total"]
            assert exported.value() == ta.gone_reports >= 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # A live peer that refuses (another node's uuid at that address) is not gone.
        tc = make_transport(tmp_path, C)
        refused: list[str] = []
        tc.register(GROUP, Inbox().deliver, peer_gone=refused.append)
        tb = make_transport(tmp_path, "uuid-x")
        tb.register(GROUP, Inbox().deliver)
        async with serving(tb) as addr:
            tc.set_address(B, addr)
            tc.send(GROUP, [heartbeat(frm=C)])
            await eventually(lambda: tc.dropped == 1)
            assert refused == [] and tc.gone_reports == 0
        await ta.aclose()
        await tc.aclose()
        await tb.aclose()

    asyncio.run(main())


class GatedServicer(ConsensusServicer):
    """Delivers each streamed request, then, after one that carried an append, reads nothing
    more on that stream until `gate` is set: a peer slow to read its appends."""

    def __init__(self, transport: GrpcTransport, gate: asyncio.Event) -> None:
        super().__init__(transport)
        self.gate = gate

    async def StepStream(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> pb.StepResponse:
        async for raw in request_iterator:
            req = pb.StepRequest.FromString(raw)
            self.transport.deliver(req)
            if any(m.type == pb.MSG_APP for g in req.groups for m in g.messages):
                await self.gate.wait()
        return pb.StepResponse()


def test_heartbeats_pass_appends_a_peer_is_slow_to_read(tmp_path: Path) -> None:
    """Appends and heartbeats go on separate streams (lanes): a heartbeat sent after appends
    that the peer has not read yet arrives at once, not after them (on one stream it would wait
    for every message before it), and the appends all arrive, in order, once the peer reads."""

    async def main() -> None:
        ta, tb = make_transport(tmp_path, A), make_transport(tmp_path, B)
        in_b = Inbox()
        tb.register(GROUP, in_b.deliver)
        gate = asyncio.Event()
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        GatedServicer(tb, gate).add_to_server(server)
        await server.start()
        try:
            ta.set_address(B, f"127.0.0.1:{port}")

            def app(index: int) -> Message:
                entry = Entry(1, index, data=b"x" * 1000)
                return Message(
                    MessageType.APP,
                    to=B,
                    frm=A,
                    term=1,
                    index=index - 1,
                    log_term=1,
                    commit=0,
                    entries=(entry,),
                )

            # Both lanes handshake (unary first contact), so what follows goes on streams.
            ta.send(GROUP, [app(1), heartbeat(term=1)])
            await eventually(lambda: len(in_b.messages) == 2)
            ta.send(GROUP, [app(2)])  # streamed, delivered; then the peer stops reading appends
            await eventually(lambda: len(in_b.messages) == 3)
            ta.send(GROUP, [app(3)])
            ta.send(GROUP, [app(4)])
            ta.send(GROUP, [heartbeat(term=2)])
            await eventually(lambda: heartbeat(term=2) in in_b.messages)
            assert [m.index for m in in_b.messages if m.type is MessageType.APP] == [0, 1]
            gate.set()
            await eventually(lambda: len(in_b.messages) == 6)
            apps = [m.entries[0].index for m in in_b.messages if m.type is MessageType.APP]
            assert apps == [1, 2, 3, 4]
        finally:
            gate.set()
            await ta.aclose()
            await server.stop(None)
            await tb.aclose()

    asyncio.run(main())


def test_a_peer_with_a_full_queue_drops_the_newest_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.consensus.transport as transport_module

    monkeypatch.setattr(transport_module, "MAX_QUEUE", 8)

    async def main() -> None:
        t = make_transport(tmp_path, A)
        t.set_address(B, "127.0.0.1:1")  # nothing listens: the sender never drains quickly
        t.send(GROUP, [heartbeat()] * 5)
        t.send(GROUP, [heartbeat()] * 5)  # 10 > 8 queued: refused whole
        assert t.dropped == 5
        assert t._peers[B].queued == 5
        await t.aclose()

        # One Ready larger than the bound is still taken when nothing is queued.
        t2 = make_transport(tmp_path, A, sub="a2")
        t2.set_address(B, "127.0.0.1:1")
        t2.send(GROUP, [heartbeat()] * 20)
        assert t2.dropped == 0 and t2._peers[B].queued == 20
        await t2.aclose()

    asyncio.run(main())


# --- quiescence digests (quiesce.py) ----------------------------------------------------------


class DigestLog:
    """Stands in for a Quiescence: records digests, and what the group had received by then."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.seen: list[tuple[str, list[str], int]] = []

    def on_digest(self, src: str, digest: pb.QuiesceDigest) -> None:
        self.seen.append((src, [g.group_id for g in digest.groups], len(self.inbox.messages)))


def test_a_digest_travels_in_the_stream_after_the_messages_queued_before_it(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        ta, tb = make_transport(tmp_path, A), make_transport(tmp_path, B)
        in_b = Inbox()
        tb.register(GROUP, in_b.deliver, in_b.report_unreachable)
        digests = DigestLog(in_b)
        tb.quiescence = digests  # type: ignore[assignment]
        async with serving(ta) as addr_a, serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            tb.set_address(A, addr_a)
            d = pb.QuiesceDigest()
            d.groups.add(group_id=GROUP, term=3, commit=2)
            ta.send(GROUP, [heartbeat()])
            ta.send_digest(B, d)  # same request: the messages are delivered first
            await eventually(lambda: len(digests.seen) == 1)
            assert digests.seen == [(A, [GROUP], 1)]
            ta.send_digest(B, pb.QuiesceDigest())  # alone, and empty: still delivered
            await eventually(lambda: len(digests.seen) == 2)
            assert digests.seen[1] == (A, [], 1)
        await ta.aclose()
        await tb.aclose()

    asyncio.run(main())


# --- snapshot sends (etcd's ReportSnapshot) ------------------------------------------------------


def test_a_snapshot_written_to_the_stream_is_reported_sent(tmp_path: Path) -> None:
    """Only a batch with a snapshot, and only once it went out: the leader then probes from
    the snapshot's index instead of waiting, perhaps for the rest of its term, for an
    acknowledgement that may be lost on the way back."""
    from service.raft.types import RaftConfig, Snapshot, SnapshotMeta

    async def main() -> None:
        ta, tb = make_transport(tmp_path, A), make_transport(tmp_path, B)
        in_a, in_b = Inbox(), Inbox()
        sent: list[str] = []
        ta.register(GROUP, in_a.deliver, in_a.report_unreachable, sent.append)
        tb.register(GROUP, in_b.deliver, in_b.report_unreachable)
        snap = Snapshot(SnapshotMeta(index=5, term=3, config=RaftConfig(frozenset({A, B}))))
        async with serving(ta) as addr_a, serving(tb) as addr_b:
            ta.set_address(B, addr_b)
            tb.set_address(A, addr_a)
            ta.send(GROUP, [heartbeat()])
            await eventually(lambda: len(in_b.messages) == 1)
            assert sent == []  # no snapshot in it
            m = Message(MessageType.SNAP, to=B, frm=A, term=3, snapshot=snap)
            ta.send(GROUP, [m])
            await eventually(lambda: len(in_b.messages) == 2)
            await eventually(lambda: sent == [B])
        await ta.aclose()
        await tb.aclose()

    asyncio.run(main())


# --- warm peers -----------------------------------------------------------------------------------


def test_keep_warm_connects_every_member_before_any_message_and_redials_a_restarted_one(
    tmp_path: Path,
) -> None:
    """A member gets an empty request (no groups: nothing delivered) and a ready stream
    before any Raft message is sent to it, so the first real message (a vote request between
    two followers) needs no connection, handshake or unary round trip. A member that went
    away is redialled once it is back, and members without an address or this server itself
    are left alone."""

    async def main() -> None:
        ta = make_transport(tmp_path, A)
        tb = RecordingTransport.for_node(tmp_path, B)
        in_b = Inbox()
        tb.register(GROUP, in_b.deliver)
        assert ta.incarnations is not None and tb.incarnations is not None
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        ConsensusServicer(tb).add_to_server(server)
        await server.start()
        addr_b = f"127.0.0.1:{port}"
        ta.set_address(B, addr_b)
        ta.keep_warm(lambda: frozenset({A, B, C}), interval_s=0.05)  # C: no address known

        def ready() -> bool:
            peer = ta._peers.get(B)
            return peer is not None and peer.stream is not None and not peer.sending

        # Two empty requests: the unary first contact, then the stream's first write.
        await eventually(lambda: ready() and len(tb.requests) == 2)
        assert set(ta._peers) == {B}
        assert not any(r.groups for r in tb.requests)
        assert tb.incarnations.peers == {A: ta.incarnations.own}  # the handshake was made
        assert in_b.batches == [] and ta.sent == 0

        # The first message goes over the stream opened in advance: no second unary Step.
        ta.send(GROUP, [heartbeat(term=3)])
        await eventually(lambda: in_b.messages == [heartbeat(term=3)])
        assert ta.sent == 1

        # B goes away: the stream ends; B is back on the same port: A redials it unasked.
        await server.stop(None)
        await eventually(lambda: ta._peers[B].stream is None)
        before = len(tb.requests)
        server = grpc.aio.server()
        assert server.add_insecure_port(addr_b) == port
        ConsensusServicer(tb).add_to_server(server)
        await server.start()
        await eventually(lambda: ready() and len(tb.requests) == before + 2)
        assert not any(r.groups for r in tb.requests[before:])
        ta.send(GROUP, [heartbeat(term=4)])
        await eventually(lambda: in_b.messages == [heartbeat(term=3), heartbeat(term=4)])
        await ta.aclose()
        await tb.aclose()
        await server.stop(None)
        # The transport's own tasks are gone (gRPC's server may still be retiring its own).
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("raft-")]

    asyncio.run(main())
