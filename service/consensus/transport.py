"""gRPC transport for Raft messages: per-peer batching, bounded queues, reconnect with backoff.

Theory of operation
-------------------
One `GrpcTransport` per server process, shared by every Raft group the process hosts (a tablet
server runs hundreds): messages are keyed by group id.

Sending: `send()` never blocks the node's loop. A node hands over a Ready's messages at once;
they go into a bounded per-peer queue as one item per (peer, call), and one sender task per
peer drains it and packs everything queued, for every group, into one `StepRequest` (one
`GroupBatch` per group) and writes it. The groups of a process tick together (`ticker.py`), so
the heartbeats of hundreds of idle tablets leave in the same loop iteration and cost one write
per peer, not one each. Raft tolerates loss, so when a peer has `MAX_QUEUE` messages queued
the newest are dropped (and counted) instead of growing memory without bound. On an RPC
failure the sender backs off exponentially (50 ms .. 2 s), tells the group the peer is
unreachable (so its progress drops back to probing), and discards what it could not send.

A leader's messages that wait in a queue past the leader's term are dropped when the sender
picks them up (`leader_term` at `register`, counted in `deposed_dropped`): appends,
heartbeats, snapshots and TIMEOUT_NOW of a term this node no longer leads. A node that
stepped down while its sender backed off from a failed peer would otherwise deliver, seconds
later, a heartbeat of the old term; the peer takes its term's leader as alive from it, and
its leader lease then refuses a real candidate's votes (docs/design/consensus.md#R2).

Two lanes per peer: appends and snapshots (the messages that carry the log, and may be
megabytes) go on one stream, everything else (heartbeats, votes, and every answer) on another,
each with its own queue and sender task, as etcd's rafthttp keeps a stream for appends apart
from the one for other messages. On one stream a message arrives only after the receiver has
read every message before it, and the write of a large one waits for the receiver's reads
(HTTP/2 flow control). Measured with grpc.aio on loopback, against a reader that took 3 s per
message: a 100-byte message written after two 4 MB ones arrived 6 s later, and a third 4 MB
write took 9 s to complete; on a second stream of the same channel, small messages written
every 0.5 s arrived every 0.5 s meanwhile. So on one stream, a sys.catalog leader's 4 MB
CreateTable append to a starved follower would hold its heartbeats back, and a write taking
over `STEP_TIMEOUT_S` would cancel the stream, heartbeats and all. Raft tolerates the reordering
between lanes: heartbeats and answers name no log position a later append depends on, and all
appends of a group (commit-only ones too) stay in one lane, in order.

A request carries this server's known peer addresses (so a receiver that knows nobody can
answer) only when they are news to the peer: on the first unary Step after a (re)connect and
after an address changed, not with every write (`addresses_version`).

Warm peers (`keep_warm`): Raft sends nothing between two followers, so the first message one
sends the other is a vote request at the moment the leader is gone, and it would pay for a TCP
connection, a TLS handshake and the unary first contact on a machine that is busy at exactly
that moment (measured on a loaded 2-core host: 230 ms for a vote request to arrive, 405-473 ms
for a whole pre-vote round, long enough for both survivors to pre-vote at once and split the
vote). A server whose group is small (the masters') asks the transport to keep a ready stream
to every member: each interval, a member without one gets an empty request (no groups), which
connects, handshakes and opens the stream. An open stream also keeps gRPC from idling the
connection, and a peer that goes away ends it, so the next interval redials. Tablet servers do
not: they share peers with hundreds of groups whose leaders keep the streams busy anyway.

Receiving: `ConsensusServicer.Step` checks the envelope before anything reaches a core:
  * `dest_uuid` must be this server's uuid (docs/design/consensus.md#R9: never act on a message
    meant for another incarnation or node) -> FAILED_PRECONDITION;
  * the sender's incarnation must match what this server recorded for that uuid: a node whose
    data directory was wiped comes back with the same uuid but a new incarnation, and must not
    vote or acknowledge entries it has forgotten -> FAILED_PRECONDITION;
  * every message must decode and be addressed consistently (codec) -> INVALID_ARGUMENT;
  * every group must exist here -> NOT_FOUND (a tablet server drops a batch for a group it
    does not host instead, `drop_unknown_groups`).
The whole request is checked before any group's batch is delivered: a bad one changes nothing.
Oversized requests are refused by gRPC itself (RESOURCE_EXHAUSTED) via max_receive_message_length.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import posixpath
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError

from service.common import channel_options
from service.common.authz import Authorizer, Rule, allow
from service.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    WrongDestination,
    rpc_errors,
)
from service.common.tls import INSECURE_PEER, Credentials, open_channel
from service.consensus.codec import CodecError, message_from_pb, message_to_pb
from service.consensus.fs import FileSystem
from service.consensus.quiesce import Quiescence
from service.pb import consensus_pb2 as pb
from service.pb import consensus_pb2_grpc as pb_grpc
from service.raft import Message, MessageType, NodeId

log = logging.getLogger(__name__)

STEP_TIMEOUT_S = 5.0
MAX_QUEUE = 4096
WARM_INTERVAL_S = 1.0
"""How often `keep_warm` looks for a member without a ready stream."""
LEADER_MESSAGES = frozenset(
    {MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP, MessageType.TIMEOUT_NOW}
)
"""What only a leader sends, for its term: dropped unsent once that term is over for its node
(`GrpcTransport.drop_deposed`)."""


class Incarnations:
    """This server's incarnation id and the ones it has seen for each peer uuid, persisted.

    The incarnation is a random id created when the data directory is formatted. Peers are
    remembered on first contact (trust on first use) and never forgotten: a peer that comes
    back with another incarnation has lost its disk and is refused until it is given a new
    uuid (docs/design/consensus.md#R9)."""

    def __init__(self, fs: FileSystem, directory: str, own_uuid: str) -> None:
        self.fs = fs
        self.path = posixpath.join(directory, "incarnations.json")
        fs.makedirs(directory)
        if fs.exists(self.path):
            data = json.loads(fs.read_bytes(self.path))
            if data["uuid"] != own_uuid:
                raise FailedPrecondition(
                    f"{directory} belongs to node {data['uuid']}, not {own_uuid}"
                )
            self.own = str(data["own"])
            self.peers: dict[str, str] = dict(data["peers"])
        else:
            self.own = uuidlib.uuid4().hex
            self.peers = {}
            self._save(own_uuid)
        self.uuid = own_uuid

    def _save(self, own_uuid: str) -> None:
        body = {"uuid": own_uuid, "own": self.own, "peers": self.peers}
        self.fs.write_atomic(self.path, json.dumps(body, sort_keys=True).encode())

    def check(self, peer: str, incarnation: str) -> None:
        """Raise if `peer` is a different incarnation than the one we know; learn it if new."""
        if not incarnation:
            raise InvalidArgument(f"request from {peer} does not name its incarnation")
        known = self.peers.get(peer)
        if known is None:
            self.peers[peer] = incarnation
            self._save(self.uuid)
        elif known != incarnation:
            raise FailedPrecondition(
                f"node {peer} came back with a different data directory (incarnation "
                f"{incarnation}, expected {known}): it may have forgotten votes and entries, so "
                f"it is refused; wipe it fully and give it a new uuid"
            )


def _bulk(m: Message) -> bool:
    """Whether `m` goes in a peer's log lane (appends, snapshots) rather than its control lane
    (module docstring: two lanes per peer)."""
    return m.type is MessageType.APP or m.type is MessageType.SNAP


class _Peer:
    """One lane to one peer: its queue, sender task, channel and stream."""

    def __init__(self, transport: GrpcTransport, node: str, lane: str = "control") -> None:
        self.t = transport
        self.node = node
        self.lane = lane
        self.queue: asyncio.Queue[tuple[str, list[Message]] | pb.QuiesceDigest | None] = (
            asyncio.Queue()
        )
        """Messages of a group, a quiescence digest, or None: an empty request that only
        connects (`GrpcTransport.keep_warm`)."""
        self.queued = 0
        """Messages in `queue` (bounded by MAX_QUEUE in `GrpcTransport.send`)."""
        self.channel: grpc.aio.Channel | None = None
        self.creds: Credentials | None = None
        """The credentials `channel` was opened with."""
        self.stub: pb_grpc.ConsensusServiceStub | None = None
        self.address: str | None = None
        self.dest_incarnation = ""
        self.task: asyncio.Task[None] | None = None
        self.failures = 0
        self.sending = False
        """`run` is sending a request (or backing off after one failed)."""
        self.stream: grpc.aio.StreamUnaryCall | None = None
        self.stream_ok = False  # a unary Step succeeded since the last (re)connect or failure
        self._watchers: set[asyncio.Task[None]] = set()
        self.addresses_sent = -1
        """The transport's `addresses_version` the peer was last sent (-1: none yet)."""

    def connect(self) -> pb_grpc.ConsensusServiceStub | None:
        address = self.t.addresses.get(self.node)
        if address is None:
            return None
        if address != self.address or self.stub is None or self.creds is not self.t.credentials:
            self.close_stream()
            if self.channel is not None:
                self.t._closing.add(asyncio.ensure_future(self.channel.close(None)))
            self.channel = open_channel(
                address, self.t.credentials, role=self.t.peer_role, options=self.t.channel_options
            )
            self.stub = pb_grpc.ConsensusServiceStub(self.channel)
            self.address = address
            self.creds = self.t.credentials  # renewed credentials: reconnect with them
        return self.stub

    def close_stream(self) -> None:
        self.stream_ok = False
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None

    async def _watch(self, stream: grpc.aio.StreamUnaryCall, groups: list[str]) -> None:
        """The server ends a stream only on an error (or shutdown): treat it as a failed send
        (of the groups of the request that opened it)."""
        try:
            await stream
        except asyncio.CancelledError:
            return
        except grpc.aio.AioRpcError as e:
            if self.stream is stream and e.code() is not grpc.StatusCode.CANCELLED:
                await self._failed({g: [] for g in groups}, 1, e)

    async def run(self) -> None:
        while True:
            by_group: dict[str, list[Message]] = {}
            digest: pb.QuiesceDigest | None = None
            item = await self.queue.get()
            while True:  # everything queued meanwhile: one request
                if item is None:
                    pass  # nothing to carry: the request (empty if alone) connects the peer
                elif isinstance(item, pb.QuiesceDigest):
                    digest = item  # a newer one replaces an older one
                else:
                    group, msgs = item
                    self.queued -= len(msgs)
                    have = by_group.get(group)
                    by_group[group] = msgs if have is None else [*have, *msgs]
                if self.queue.empty():
                    break
                item = self.queue.get_nowait()
            if self.t.drop_deposed(by_group) and not by_group and digest is None:
                continue  # nothing left to send
            self.sending = True
            try:
                await self._send(by_group, digest)
            finally:
                self.sending = False

    async def _send(
        self, by_group: dict[str, list[Message]], digest: pb.QuiesceDigest | None = None
    ) -> None:
        n = sum(map(len, by_group.values()))
        stub = self.connect()
        if stub is None:
            self._lost(by_group, n)
            return
        req = pb.StepRequest(
            dest_uuid=self.node,
            src_uuid=self.t.uuid,
            src_instance=self.t.incarnations.own if self.t.incarnations else "",
            dest_instance=self.dest_incarnation,
        )
        for group, msgs in by_group.items():
            batch = req.groups.add(group_id=group)
            batch.messages.extend(message_to_pb(m) for m in msgs)
        if digest is not None:
            req.quiesce.CopyFrom(digest)
        version = self.t.addresses_version
        if not self.stream_ok or version != self.addresses_sent:
            for node, addr in self.t.addresses.items():
                req.addresses[node] = addr
            if self.t.own_address:
                req.addresses[self.t.uuid] = self.t.own_address
        try:
            if not self.stream_ok:
                # First contact, or after a reconnect or failure: a unary call, whose answer
                # names the peer's incarnation (the request names the one we knew, if any, so
                # a wiped peer refuses it); then the stream.
                resp = await stub.Step(req, timeout=STEP_TIMEOUT_S)  # type: ignore[misc]
                self.dest_incarnation = resp.instance
                self.stream_ok = True
            else:
                if self.stream is None:
                    stream: grpc.aio.StreamUnaryCall = stub.StepStream()  # type: ignore[call-arg,assignment]
                    self.stream = stream
                    watcher = asyncio.create_task(self._watch(stream, list(by_group)))
                    self._watchers.add(watcher)
                    watcher.add_done_callback(self._watchers.discard)
                assert self.stream is not None
                async with asyncio.timeout(STEP_TIMEOUT_S):  # not wait_for: no task per write
                    await self.stream.write(req)
            self.addresses_sent = version
            self.failures = 0
            self.t.sent += n
            self.t.report_snapshots_sent(by_group, self.node)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError) as e:
            await self._failed(by_group, n, e)

    def _lost(self, by_group: dict[str, list[Message]], n: int) -> None:
        self.t.dropped += n
        for group in by_group:
            self.t.report_unreachable(group, self.node)
        if self.t.quiescence is not None:  # its quiesced groups send nothing else to report
            self.t.quiescence.peer_unreachable(self.node)

    async def _failed(self, by_group: dict[str, list[Message]], n: int, e: BaseException) -> None:
        stream = self.stream
        self.close_stream()  # the next send re-handshakes with a unary Step
        code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
        if stream is not None and code is None:
            # A write on a stream the server ended: its status says why.
            with contextlib.suppress(Exception):
                code = await asyncio.wait_for(stream.code(), 1.0)
                details = await stream.details()
                e = RuntimeError(f"{code.name} {details}")
        self.failures += 1
        self._lost(by_group, n)
        if code is grpc.StatusCode.UNAVAILABLE:
            self.t.report_gone(self.node)
        if self.failures in (1, 10) or self.failures % 100 == 0:
            what = f"{e.code().name} {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else e
            log.warning(
                "send to %s at %s (%s lane) failed (%d in a row): %s",
                self.node,
                self.address,
                self.lane,
                self.failures,
                what,
            )
        await asyncio.sleep(min(2.0, 0.05 * 2 ** min(self.failures, 6)))


class GrpcTransport:
    def __init__(
        self,
        uuid: str,
        *,
        incarnations: Incarnations | None,
        max_message_bytes: int = channel_options.DEFAULT_MAX_MESSAGE_BYTES,
        drop_unknown_groups: bool = False,
        credentials: Credentials | None = None,
        peer_role: str = "",
    ) -> None:
        self.uuid = uuid
        self.credentials = credentials
        """Mutual TLS to every peer when set (service/common/tls.py); plaintext otherwise."""
        self.peer_role = peer_role
        """The role a peer's certificate must have ("master" for sys.catalog's group,
        "tserver" for tablets)."""
        self.drop_unknown_groups = drop_unknown_groups
        """A tablet server hosts hundreds of groups on the same streams to a peer: a batch for
        a group it does not host (yet: a CreateTablet still on its way; or any more: deleted)
        is dropped and counted instead of failing the stream every other group shares. Raft
        tolerates the loss; the leader's retries reach the replica once it exists."""
        self.unknown_group_batches = 0
        self.incarnations = incarnations
        self.addresses: dict[str, str] = {}
        self.addresses_version = 0
        """Bumped whenever `addresses` or `own_address` changes (see "A request carries")."""
        self.own_address: str | None = None
        """This server's address, sent with the others (when they are news to the peer) so that
        a receiver that knows nobody (a learner booted with no peers) can answer."""
        self.channel_options = channel_options.consensus_peer(max_message_bytes)
        self.max_message_bytes = max_message_bytes
        self._peers: dict[str, _Peer] = {}
        """Each peer's control lane (module docstring: two lanes per peer)."""
        self._log_lanes: dict[str, _Peer] = {}
        """Each peer's log lane: appends and snapshots."""
        self._closing: set[asyncio.Future[None]] = set()
        self._warmer: asyncio.Task[None] | None = None
        self._groups: dict[str, Callable[[list[Message]], None]] = {}
        self._unreachable: dict[str, Callable[[str], None]] = {}
        self._snapshot_sent: dict[str, Callable[[str], None]] = {}
        self._members: dict[str, Callable[[], frozenset[str]]] = {}
        self._leader_terms: dict[str, Callable[[], int]] = {}
        self._gone: dict[str, Callable[[str], None]] = {}
        self.gone_reports = 0
        """Connections to a peer's server found closed or refused (`report_gone`)."""
        self.deposed_dropped = 0
        """A leader's messages dropped because its node no longer leads their term
        (module docstring)."""
        self.foreign_batches = 0
        """Batches dropped because their sender is not a member of the group (`deliver`)."""
        self.on_foreign: Callable[[str, str], None] | None = None
        """Told (group, sender) of each such batch: the server checks whether the sender is a
        member that its node's stale config does not know yet (vouch.py)."""
        self.quiescence: Quiescence | None = None
        """Set by a server whose groups quiesce (quiesce.py): digests received go to it."""
        self.sent = 0
        self.dropped = 0
        self.received = 0

    # -- wiring ---------------------------------------------------------------------------------

    def register(
        self,
        group_id: str,
        deliver: Callable[[list[Message]], None],
        unreachable: Callable[[str], None] | None = None,
        snapshot_sent: Callable[[str], None] | None = None,
        members: Callable[[], frozenset[str]] | None = None,
        leader_term: Callable[[], int] | None = None,
        peer_gone: Callable[[str], None] | None = None,
    ) -> None:
        """`unreachable(peer)`: a send to `peer` failed. `snapshot_sent(peer)`: a snapshot for
        `peer` was written to its stream (etcd's ReportSnapshot(finish): the leader probes from
        the snapshot's index at the next heartbeat answer instead of waiting, for the rest of
        its term, for an acknowledgement that may have been lost). `members()`: who may send
        this group messages (`deliver`). `leader_term()`: the term the group's node leads now,
        0 when it does not lead; a leader's message of another term is dropped unsent.
        `peer_gone(peer)`: the connection to `peer`'s server was closed or refused
        (`report_gone`)."""
        self._groups[group_id] = deliver
        if members is not None:
            self._members[group_id] = members
        if unreachable is not None:
            self._unreachable[group_id] = unreachable
        if snapshot_sent is not None:
            self._snapshot_sent[group_id] = snapshot_sent
        if leader_term is not None:
            self._leader_terms[group_id] = leader_term
        if peer_gone is not None:
            self._gone[group_id] = peer_gone

    def unregister(self, group_id: str) -> None:
        self._groups.pop(group_id, None)
        self._unreachable.pop(group_id, None)
        self._snapshot_sent.pop(group_id, None)
        self._members.pop(group_id, None)
        self._leader_terms.pop(group_id, None)
        self._gone.pop(group_id, None)

    def set_address(self, node: str, address: str) -> None:
        if node == self.uuid:
            if self.own_address != address:
                self.own_address = address
                self.addresses_version += 1
        elif self.addresses.get(node) != address:
            self.addresses[node] = address
            self.addresses_version += 1

    def address_of(self, node: str) -> str | None:
        return self.addresses.get(node)

    def answering(self, node: str) -> bool:
        """Whether `node`'s server takes this server's Raft messages now: a unary Step was
        answered since the last (re)connect and no send failed since. A group's peer that stays
        silent while its server answers does not host the group's replica any more (the tablet
        copy trigger acts on that, tablet_copy.py)."""
        peer = self._peers.get(node)
        log_lane = self._log_lanes.get(node)
        if log_lane is not None and log_lane.failures:
            return False
        return peer is not None and peer.stream_ok and peer.failures == 0

    def drop_deposed(self, by_group: dict[str, list[Message]]) -> int:
        """Drop from `by_group`, in place, the leader messages of a term their group's node no
        longer leads (module docstring); returns how many were dropped."""
        if not self._leader_terms:
            return 0
        dropped = 0
        for group, msgs in list(by_group.items()):
            leader_term = self._leader_terms.get(group)
            if leader_term is None:
                continue
            term = leader_term()
            kept = [m for m in msgs if m.type not in LEADER_MESSAGES or m.term == term]
            if len(kept) != len(msgs):
                dropped += len(msgs) - len(kept)
                if kept:
                    by_group[group] = kept
                else:
                    del by_group[group]
        self.deposed_dropped += dropped
        return dropped

    def report_gone(self, node: str) -> None:
        """A send or stream to `node` failed UNAVAILABLE: its server closed the connection or
        refused a new one, as a process that exited does at once (a live but starved one
        keeps its sockets open: its messages are late, not refused). Every group is told,
        and a follower of `node` stops stretching its election timeout (Raft.leader_gone)."""
        self.gone_reports += 1
        for cb in list(self._gone.values()):
            cb(node)

    def report_unreachable(self, group: str, node: str) -> None:
        cb = self._unreachable.get(group)
        if cb is not None:
            cb(node)

    def report_snapshots_sent(self, by_group: dict[str, list[Message]], node: str) -> None:
        """After `by_group` was written to `node`'s stream: report its snapshots as sent."""
        if not self._snapshot_sent:
            return  # no group here asked (tablets send no Raft snapshots): the common case
        for group, msgs in by_group.items():
            cb = self._snapshot_sent.get(group)
            if cb is not None and any(m.type is MessageType.SNAP for m in msgs):
                cb(node)

    def keep_warm(
        self, members: Callable[[], frozenset[str]], interval_s: float = WARM_INTERVAL_S
    ) -> None:
        """Keep a connected, handshaken stream to every one of `members()` (other than this
        server) whose address is known, checked every `interval_s` (module docstring: warm
        peers). Runs until `aclose`."""
        if self._warmer is None:
            self._warmer = asyncio.create_task(
                self._keep_warm(members, interval_s), name="raft-keep-warm"
            )

    async def _keep_warm(self, members: Callable[[], frozenset[str]], interval_s: float) -> None:
        while True:
            for node in members():
                if node != self.uuid and node in self.addresses:
                    peer = self._peer(node)
                    # Not while anything is queued or being sent: that request connects too,
                    # and a peer that failed is backing off inside its sender.
                    if peer.stream is None and peer.queue.empty() and not peer.sending:
                        peer.queue.put_nowait(None)
            await asyncio.sleep(interval_s)

    async def aclose(self) -> None:
        if self._warmer is not None:
            self._warmer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warmer
            self._warmer = None
        lanes = [*self._peers.values(), *self._log_lanes.values()]
        for p in lanes:
            p.close_stream()
            for w in p._watchers:
                w.cancel()
            if p.task is not None:
                p.task.cancel()
        for p in lanes:
            if p.task is not None:
                try:
                    await p.task
                except (asyncio.CancelledError, Exception):
                    pass
            if p.channel is not None:
                await p.channel.close(None)
        self._peers.clear()
        self._log_lanes.clear()

    def peer_backlog(self) -> dict[str, tuple[int, int]]:
        """Per peer: messages queued and not yet written, and sends failed in a row. A backlog
        that grows while the process runs is a peer (or this process) not keeping up: its
        Raft messages, heartbeats included, wait behind the queue (the masters' metrics)."""
        out = {node: (p.queued, p.failures) for node, p in self._peers.items()}
        for node, p in self._log_lanes.items():
            queued, failures = out.get(node, (0, 0))
            out[node] = (queued + p.queued, max(failures, p.failures))
        return out

    # -- sending --------------------------------------------------------------------------------

    def send(self, group_id: str, messages: list[Message]) -> None:
        by_lane: dict[tuple[str, bool], list[Message]] = {}
        for m in messages:
            key = (m.to, _bulk(m))
            msgs = by_lane.get(key)
            if msgs is None:
                by_lane[key] = [m]
            else:
                msgs.append(m)
        for (to, bulk), msgs in by_lane.items():
            peer = self._log_lane(to) if bulk else self._peer(to)
            if peer.queued and peer.queued + len(msgs) > MAX_QUEUE:
                self.dropped += len(msgs)  # the peer is not keeping up: Raft re-sends
                continue
            peer.queued += len(msgs)
            peer.queue.put_nowait((group_id, msgs))

    def send_digest(self, peer: str, digest: pb.QuiesceDigest) -> None:
        """Queue this interval's quiescence digest for `peer` (quiesce.py) on its control lane,
        after whatever is queued there: it goes out with the next request. A leader quiesces a
        group only once every follower holds its whole log, so no append of that group is
        behind it on the other lane."""
        p = self._peer(peer)
        p.queue.put_nowait(digest)

    def _peer(self, to: str) -> _Peer:
        """`to`'s control lane, started on first use."""
        peer = self._peers.get(to)
        if peer is None:
            peer = self._peers[to] = _Peer(self, to)
            peer.task = asyncio.create_task(peer.run(), name=f"raft-send-{to}")
        return peer

    def _log_lane(self, to: str) -> _Peer:
        """`to`'s log lane (appends, snapshots), started on first use."""
        peer = self._log_lanes.get(to)
        if peer is None:
            peer = self._log_lanes[to] = _Peer(self, to, "log")
            peer.task = asyncio.create_task(peer.run(), name=f"raft-send-log-{to}")
        return peer

    # -- receiving ------------------------------------------------------------------------------

    def deliver(self, req: pb.StepRequest) -> None:
        if req.dest_uuid != self.uuid:
            raise WrongDestination(f"message for node {req.dest_uuid!r} reached node {self.uuid!r}")
        if not req.src_uuid:
            raise InvalidArgument("step request without src_uuid")
        inc = self.incarnations
        if inc is not None and req.dest_instance and req.dest_instance != inc.own:
            raise WrongDestination(
                f"message for incarnation {req.dest_instance} of {self.uuid}, this is "
                f"{inc.own}: the sender talks to a previous life of this node"
            )
        # Every group's batch is checked and decoded before any is delivered: a bad request
        # changes nothing.
        batches: list[tuple[Callable[[list[Message]], None], list[Message]]] = []
        foreign: list[str] = []
        for batch in req.groups:
            deliver = self._groups.get(batch.group_id)
            if deliver is None:
                if self.drop_unknown_groups:
                    self.unknown_group_batches += 1
                    continue
                raise NotFound(f"no raft group {batch.group_id!r} on node {self.uuid}")
            members_of = self._members.get(batch.group_id)
            if members_of is not None:
                members = members_of()
                if members and req.src_uuid not in members:
                    # Not (or no longer) in this group's config: its votes and entries are
                    # not the group's business. Dropped, not refused: the same request may
                    # carry other groups' messages that it sends rightly (a replica removed
                    # here and still a member elsewhere). `on_foreign` may find it is a member
                    # this replica does not know of yet; its next batch is then taken.
                    self.foreign_batches += 1
                    foreign.append(batch.group_id)
                    continue
            try:
                msgs = [
                    message_from_pb(m, to=req.dest_uuid, frm=req.src_uuid) for m in batch.messages
                ]
            except CodecError as e:
                raise InvalidArgument(
                    f"malformed raft message from {req.src_uuid} for group {batch.group_id!r}: {e}"
                ) from e
            batches.append((deliver, msgs))
        if foreign and self.on_foreign is not None:
            for group_id in foreign:
                self.on_foreign(group_id, req.src_uuid)
        if foreign and not batches:
            raise PermissionDenied(
                f"raft messages from {req.src_uuid!r} for group(s) {sorted(foreign)[:3]} of "
                "which it is not a member"
            )
        if self.incarnations is not None:
            # Learned (and pinned) only from a request that is otherwise valid.
            self.incarnations.check(req.src_uuid, req.src_instance)
        for node, addr in req.addresses.items():
            if node not in self.addresses and node != self.uuid:
                self.addresses[node] = addr
                self.addresses_version += 1
        for deliver, msgs in batches:
            self.received += len(msgs)
            deliver(msgs)
        # After the messages: one that woke a group was stepped before the digest is read.
        if self.quiescence is not None and req.HasField("quiesce"):
            self.quiescence.on_digest(req.src_uuid, req.quiesce)


class ConsensusServicer:
    """Thin servicer: parse, validate the envelope (in the transport) and hand over.

    Registered with a raw-bytes deserializer (`add_to_server`) so that garbage on the wire is
    answered with INVALID_ARGUMENT naming the problem, not gRPC's generic INTERNAL."""

    def __init__(self, transport: GrpcTransport, authorizer: Authorizer | None = None) -> None:
        self.transport = transport
        self.authorizer = authorizer
        """Set by a secured server: only peers of `transport.peer_role` may send, and each
        only as itself (`_check_sender`)."""

    @staticmethod
    def policy(role: str) -> dict[str, Rule]:
        """Who may send Raft messages to a server whose groups' peers have `role`."""
        return {"Step": allow(role), "StepStream": allow(role)}

    def _check_sender(self, req: pb.StepRequest, context: grpc.aio.ServicerContext) -> None:
        """A peer speaks only for itself: the message's src_uuid must be its certificate's."""
        if self.authorizer is None:
            return
        who = self.authorizer.identity(context)
        if who is not INSECURE_PEER and who.name != req.src_uuid:
            raise PermissionDenied(
                f"raft message claims to come from {req.src_uuid!r}, but the caller is {who}"
            )

    @rpc_errors
    async def Step(self, request: bytes, context: grpc.aio.ServicerContext) -> pb.StepResponse:
        req = pb.StepRequest()
        try:
            req.ParseFromString(request)
        except DecodeError as e:
            raise InvalidArgument(f"undecodable StepRequest ({len(request)} bytes): {e}") from e
        self._check_sender(req, context)
        self.transport.deliver(req)
        inc = self.transport.incarnations
        return pb.StepResponse(instance=inc.own if inc else "")

    @rpc_errors
    async def StepStream(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> pb.StepResponse:
        async for raw in request_iterator:
            req = pb.StepRequest()
            try:
                req.ParseFromString(raw)
            except DecodeError as e:
                raise InvalidArgument(f"undecodable StepRequest ({len(raw)} bytes): {e}") from e
            self._check_sender(req, context)
            self.transport.deliver(req)
        inc = self.transport.incarnations
        return pb.StepResponse(instance=inc.own if inc else "")

    def add_to_server(self, server: grpc.aio.Server) -> None:
        serialize = pb.StepResponse.SerializeToString
        handlers = {
            "Step": grpc.unary_unary_rpc_method_handler(
                self.Step, request_deserializer=None, response_serializer=serialize
            ),
            "StepStream": grpc.stream_unary_rpc_method_handler(
                self.StepStream, request_deserializer=None, response_serializer=serialize
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("tessera.consensus.ConsensusService", handlers),)
        )


def node_id(s: str) -> NodeId:
    return NodeId(s)
