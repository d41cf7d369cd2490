"""Conversion between the core's dataclasses and the protobuf wire format (consensus.proto).

The only place that knows both: the core stays free of protobuf, the transport free of the
core's types. Every decode validates what the core relies on (known message type, non-empty
sender, entry indexes contiguous) and raises `CodecError` naming the problem, so garbage from
the network never reaches `RawNode.step`.
"""

from __future__ import annotations

from service.pb import consensus_pb2 as pb
from service.raft.types import (
    Entry,
    EntryType,
    Message,
    MessageType,
    NodeId,
    RaftConfig,
    Snapshot,
    SnapshotMeta,
)


class CodecError(ValueError):
    pass


_TO_PB = {
    MessageType.APP: pb.MSG_APP,
    MessageType.APP_RESP: pb.MSG_APP_RESP,
    MessageType.VOTE: pb.MSG_VOTE,
    MessageType.VOTE_RESP: pb.MSG_VOTE_RESP,
    MessageType.PRE_VOTE: pb.MSG_PRE_VOTE,
    MessageType.PRE_VOTE_RESP: pb.MSG_PRE_VOTE_RESP,
    MessageType.SNAP: pb.MSG_SNAP,
    MessageType.HEARTBEAT: pb.MSG_HEARTBEAT,
    MessageType.HEARTBEAT_RESP: pb.MSG_HEARTBEAT_RESP,
    MessageType.TIMEOUT_NOW: pb.MSG_TIMEOUT_NOW,
}
_FROM_PB = {v: k for k, v in _TO_PB.items()}
_ENTRY_TYPES = {int(t) for t in EntryType}


def config_to_pb(c: RaftConfig, out: pb.RaftConfigPB | None = None) -> pb.RaftConfigPB:
    out = out if out is not None else pb.RaftConfigPB()
    out.voters.extend(sorted(c.voters))
    out.learners.extend(sorted(c.learners))
    out.index = c.index
    return out


def config_from_pb(p: pb.RaftConfigPB) -> RaftConfig:
    voters = frozenset(NodeId(v) for v in p.voters)
    learners = frozenset(NodeId(v) for v in p.learners)
    if voters & learners:
        raise CodecError(
            f"config lists nodes as both voter and learner: {sorted(voters & learners)}"
        )
    return RaftConfig(voters, learners, p.index)


def snapshot_to_pb(s: Snapshot, out: pb.SnapshotPB | None = None) -> pb.SnapshotPB:
    out = out if out is not None else pb.SnapshotPB()
    out.meta.index = s.meta.index
    out.meta.term = s.meta.term
    config_to_pb(s.meta.config, out.meta.config)
    out.data = s.data
    return out


def snapshot_from_pb(p: pb.SnapshotPB) -> Snapshot:
    return Snapshot(SnapshotMeta(p.meta.index, p.meta.term, config_from_pb(p.meta.config)), p.data)


def message_to_pb(m: Message) -> pb.MessagePB:
    out = pb.MessagePB(
        type=_TO_PB[m.type],
        to=m.to,
        term=m.term,
        log_term=m.log_term,
        index=m.index,
        commit=m.commit,
        reject=m.reject,
        reject_hint=m.reject_hint,
        context=m.context,
    )
    setattr(out, "from", m.frm)
    if m.entries:
        out.entries.extend(
            pb.EntryPB(term=e.term, index=e.index, type=int(e.type), data=e.data) for e in m.entries
        )
    if m.snapshot is not None:
        snapshot_to_pb(m.snapshot, out.snapshot)
    return out


MAX_TERM_OR_INDEX = 1 << 62
"""Terms and log indexes a message may carry are below this."""


def message_from_pb(p: pb.MessagePB, *, to: str, frm: str) -> Message:
    """Decode one message of a batch addressed `to` and sent by `frm` (from the envelope)."""
    mtype = _FROM_PB.get(p.type)
    if mtype is None:
        raise CodecError(f"unknown raft message type {p.type}")
    if p.to != to or getattr(p, "from") != frm:
        raise CodecError(
            f"message addressed {getattr(p, 'from')!r}->{p.to!r} inside a batch {frm!r}->{to!r}"
        )
    if p.term == 0:
        raise CodecError(f"{mtype.value} message without a term")
    for name, value in (("term", p.term), ("log_term", p.log_term), ("index", p.index),
                        ("commit", p.commit), ("reject_hint", p.reject_hint)):  # fmt: skip
        if value >= MAX_TERM_OR_INDEX:
            # A term (or index) no real group reaches (2^62 elections): a member that sends
            # one would push the group's term past what every later message can carry, and no
            # leader could be elected again.
            raise CodecError(f"{mtype.value} message with {name} {value}: out of range")
    entries: tuple[Entry, ...] = ()
    if p.entries:
        if mtype is not MessageType.APP:
            raise CodecError(f"{mtype.value} message must not carry entries")
        prev = p.index
        ents = []
        for e in p.entries:
            if e.index != prev + 1:
                raise CodecError(f"append entries not contiguous: {e.index} after {prev}")
            if e.type not in _ENTRY_TYPES:
                raise CodecError(f"unknown entry type {e.type} at index {e.index}")
            if e.term > p.term or e.term == 0:
                raise CodecError(f"entry {e.index} has term {e.term} outside (0, {p.term}]")
            ents.append(Entry(term=e.term, index=e.index, type=EntryType(e.type), data=e.data))
            prev = e.index
        entries = tuple(ents)
    snapshot = None
    if p.HasField("snapshot"):
        if mtype is not MessageType.SNAP:
            raise CodecError(f"{mtype.value} message must not carry a snapshot")
        snapshot = snapshot_from_pb(p.snapshot)
    elif mtype is MessageType.SNAP:
        raise CodecError("snapshot message without a snapshot")
    return Message(
        type=mtype,
        to=NodeId(to),
        frm=NodeId(frm),
        term=p.term,
        log_term=p.log_term,
        index=p.index,
        entries=entries,
        commit=p.commit,
        reject=p.reject,
        reject_hint=p.reject_hint,
        snapshot=snapshot,
        context=p.context,
    )
