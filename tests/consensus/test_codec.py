"""The codec between the core's dataclasses and consensus.proto: round trips and refusals.

Every decode refusal is checked on a message that is valid except for the one defect, so each
test fails if the codec stops catching exactly that defect.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.consensus.codec import (
    CodecError,
    config_from_pb,
    config_to_pb,
    message_from_pb,
    message_to_pb,
    snapshot_from_pb,
    snapshot_to_pb,
)
from service.pb import consensus_pb2 as pb
from service.raft.types import (
    LOCAL_MESSAGES,
    Entry,
    EntryType,
    Message,
    MessageType,
    NodeId,
    RaftConfig,
    Snapshot,
    SnapshotMeta,
)

A, B, C, D = (NodeId(x) for x in ("uuid-a", "uuid-b", "uuid-c", "uuid-d"))
WIRE_TYPES = sorted(set(MessageType) - LOCAL_MESSAGES, key=lambda t: t.value)
CONFIG = RaftConfig(frozenset({A, B, C}), frozenset({D}), index=17)
SNAP = Snapshot(SnapshotMeta(index=40, term=3, config=CONFIG), data=b"\x00state\xff" * 10)


def over_the_wire(m: Message) -> Message:
    """Encode, serialize to bytes, parse and decode, as sender and receiver do."""
    raw = message_to_pb(m).SerializeToString()
    return message_from_pb(pb.MessagePB.FromString(raw), to=m.to, frm=m.frm)


def rich_message(t: MessageType) -> Message:
    """A message of type `t` with every field its type may carry set to a non-default value."""
    common = dict(to=B, frm=A, term=5, log_term=4, index=9, commit=8, context=b"ctx-\x01")
    if t is MessageType.APP:
        entries = (
            Entry(4, 10),  # a no-op
            Entry(5, 11, EntryType.CONFIG, b'{"cfg": 1}'),
            Entry(5, 12, EntryType.NORMAL, bytes(range(256))),
        )
        return Message(t, entries=entries, **common)  # type: ignore[arg-type]
    if t is MessageType.SNAP:
        return Message(t, snapshot=SNAP, **common)  # type: ignore[arg-type]
    if t in (MessageType.APP_RESP, MessageType.VOTE_RESP, MessageType.PRE_VOTE_RESP):
        return Message(t, reject=True, reject_hint=7, **common)  # type: ignore[arg-type]
    return Message(t, **common)  # type: ignore[arg-type]


def test_wire_types_are_exactly_the_non_local_ones() -> None:
    # Guards the parametrization below: a new network message type must be added here.
    assert {t.value for t in WIRE_TYPES} == {
        "APP",
        "APP_RESP",
        "VOTE",
        "VOTE_RESP",
        "PRE_VOTE",
        "PRE_VOTE_RESP",
        "SNAP",
        "HEARTBEAT",
        "HEARTBEAT_RESP",
        "TIMEOUT_NOW",
    }


@pytest.mark.parametrize("mtype", WIRE_TYPES, ids=lambda t: t.value)
def test_every_wire_type_round_trips(mtype: MessageType) -> None:
    m = rich_message(mtype)
    assert over_the_wire(m) == m


@pytest.mark.parametrize("mtype", WIRE_TYPES, ids=lambda t: t.value)
def test_minimal_messages_round_trip(mtype: MessageType) -> None:
    snap = SNAP if mtype is MessageType.SNAP else None
    m = Message(mtype, to=B, frm=A, term=1, snapshot=snap)
    assert over_the_wire(m) == m


def test_wire_types_map_to_distinct_pb_types() -> None:
    pb_types = {message_to_pb(rich_message(t)).type for t in WIRE_TYPES}
    assert len(pb_types) == len(WIRE_TYPES)
    assert pb.MSG_UNKNOWN not in pb_types


def test_snapshot_and_config_round_trip() -> None:
    assert snapshot_from_pb(pb.SnapshotPB.FromString(snapshot_to_pb(SNAP).SerializeToString())) == (
        SNAP
    )
    empty = Snapshot(SnapshotMeta(1, 1, RaftConfig(frozenset({A}))))
    assert snapshot_from_pb(snapshot_to_pb(empty)) == empty
    assert config_from_pb(config_to_pb(CONFIG)) == CONFIG


def test_config_is_encoded_in_sorted_order() -> None:
    # Deterministic bytes for the same config, whatever the frozenset iteration order.
    p = config_to_pb(RaftConfig(frozenset({C, A, B}), frozenset({D}), 3))
    assert list(p.voters) == [A, B, C]
    assert list(p.learners) == [D]


def test_config_with_a_node_both_voter_and_learner_is_refused() -> None:
    p = pb.RaftConfigPB(voters=[A, B], learners=[B, D], index=3)
    with pytest.raises(CodecError, match="both voter and learner"):
        config_from_pb(p)


def test_snapshot_message_with_overlapping_config_is_refused() -> None:
    p = message_to_pb(rich_message(MessageType.SNAP))
    p.snapshot.meta.config.learners.append(A)  # A is a voter already
    with pytest.raises(CodecError, match="both voter and learner"):
        message_from_pb(p, to=B, frm=A)


# --- refusals ------------------------------------------------------------------------------------


def _set_type(value: int) -> Callable[[pb.MessagePB], None]:
    def f(p: pb.MessagePB) -> None:
        p.type = value  # type: ignore[assignment]

    return f


def _zero_term(p: pb.MessagePB) -> None:
    p.term = 0


def _gap(p: pb.MessagePB) -> None:
    p.entries[1].index = 13  # 10, 13, 12


def _first_not_after_index(p: pb.MessagePB) -> None:
    p.index = 5  # entries start at 10, but the message says they follow 5


def _entry_term_above_message(p: pb.MessagePB) -> None:
    p.entries[2].term = 6  # message term is 5


def _entry_term_zero(p: pb.MessagePB) -> None:
    p.entries[0].term = 0


def _unknown_entry_type(p: pb.MessagePB) -> None:
    p.entries[1].type = 7


APP_DEFECTS = {
    "unknown type 0": (_set_type(pb.MSG_UNKNOWN), "unknown raft message type 0"),
    "unknown type 99": (_set_type(99), "unknown raft message type 99"),
    "zero term": (_zero_term, "without a term"),
    "entry gap": (_gap, "not contiguous: 13 after 10"),
    "entries do not follow index": (_first_not_after_index, "not contiguous: 10 after 5"),
    "entry term above message term": (_entry_term_above_message, r"term 6 outside \(0, 5\]"),
    "entry term zero": (_entry_term_zero, r"term 0 outside \(0, 5\]"),
    "unknown entry type": (_unknown_entry_type, "unknown entry type 7 at index 11"),
}


@pytest.mark.parametrize("defect", sorted(APP_DEFECTS))
def test_append_defects_are_refused(defect: str) -> None:
    mutate, match = APP_DEFECTS[defect]
    p = message_to_pb(rich_message(MessageType.APP))
    message_from_pb(p, to=B, frm=A)  # valid before the mutation
    mutate(p)
    with pytest.raises(CodecError, match=match):
        message_from_pb(p, to=B, frm=A)


@pytest.mark.parametrize(
    "mtype", [t for t in WIRE_TYPES if t is not MessageType.APP], ids=lambda t: t.value
)
def test_entries_on_a_non_append_message_are_refused(mtype: MessageType) -> None:
    p = message_to_pb(rich_message(mtype))
    p.entries.append(pb.EntryPB(term=5, index=10, type=0, data=b"x"))
    with pytest.raises(CodecError, match="must not carry entries"):
        message_from_pb(p, to=B, frm=A)


@pytest.mark.parametrize(
    "mtype", [t for t in WIRE_TYPES if t is not MessageType.SNAP], ids=lambda t: t.value
)
def test_snapshot_on_a_non_snapshot_message_is_refused(mtype: MessageType) -> None:
    p = message_to_pb(rich_message(mtype))
    snapshot_to_pb(SNAP, p.snapshot)
    with pytest.raises(CodecError, match="must not carry a snapshot"):
        message_from_pb(p, to=B, frm=A)


def test_snapshot_message_without_a_snapshot_is_refused() -> None:
    p = message_to_pb(rich_message(MessageType.SNAP))
    p.ClearField("snapshot")
    with pytest.raises(CodecError, match="snapshot message without a snapshot"):
        message_from_pb(p, to=B, frm=A)


def test_empty_snapshot_field_still_counts_as_present() -> None:
    # Presence, not content, decides: an all-default SnapshotPB on a SNAP decodes.
    p = message_to_pb(Message(MessageType.HEARTBEAT, to=B, frm=A, term=2))
    p.type = pb.MSG_SNAP
    p.snapshot.SetInParent()
    m = message_from_pb(p, to=B, frm=A)
    assert m.snapshot == Snapshot(SnapshotMeta(0, 0, RaftConfig(frozenset())))


@pytest.mark.parametrize(
    ("to", "frm"),
    [(C, A), (B, C), ("", A), (B, "")],
    ids=["other-dest", "other-sender", "empty-dest", "empty-sender"],
)
def test_addressing_must_match_the_envelope(to: str, frm: str) -> None:
    p = message_to_pb(rich_message(MessageType.HEARTBEAT))  # B <- A
    with pytest.raises(CodecError, match="inside a batch"):
        message_from_pb(p, to=to, frm=frm)


def test_decoded_message_takes_its_ids_from_the_envelope() -> None:
    m = message_from_pb(message_to_pb(rich_message(MessageType.VOTE)), to=B, frm=A)
    assert (m.to, m.frm) == (B, A)
    assert isinstance(m.entries, tuple)


@pytest.mark.parametrize("field", ["term", "log_term", "index", "commit", "reject_hint"])
def test_a_term_or_index_no_group_reaches_is_refused(field: str) -> None:
    """A member's message with term 2^63 + 2 once pushed a fixture tablet's term past what a
    message can carry: no leader could be elected again (found by the 100,000-case fuzz)."""
    p = message_to_pb(Message(type=MessageType.VOTE, to=B, frm=A, term=5, log_term=1, index=3))
    setattr(p, field, (1 << 63) + 2)
    with pytest.raises(CodecError, match=f"{field} .*out of range"):
        message_from_pb(p, to=B, frm=A)
    setattr(p, field, (1 << 62) - 1 if field != "log_term" else 4)
    message_from_pb(p, to=B, frm=A)
