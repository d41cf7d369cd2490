"""Coalescing a Ready's outgoing messages: one append and one acknowledgement per peer.

Theory of operation
-------------------
Between two Readys the core may queue several messages for the same peer. A leader that
commits on an acknowledgement broadcasts an append (often empty) carrying the new commit
index, and the next batch of proposals broadcasts another append with its entries; a follower
that stepped several appends answers every one of them. Each message costs an encode, a
decode, a step on the other side and, for an append, an acknowledgement of its own, so
`RawNode.ready` hands the caller `coalesce(messages)`:

  * consecutive APPs to one peer, in one term, whose entries are contiguous (the second starts
    where the first ends) become one APP: the first one's (index, log_term), the entries of
    both, the later commit. Stepping it leaves the follower in exactly the state stepping the
    two in order would have (same log-matching check, same entries, the higher commit), and
    its one acknowledgement covers both. A merge stops before the entries exceed `max_bytes`,
    the size limit the appends were cut to;
  * a successful APP_RESP to a peer is dropped when the next message to that peer is a
    successful APP_RESP of the same term acknowledging at least as much: acknowledgements
    are cumulative (the leader keeps the highest `match` and frees every inflight append up to
    it). Rejections are never dropped or merged.

Only messages adjacent in one peer's own sequence are combined, so nothing moves past another
message to that peer (a heartbeat or a vote between two appends keeps them apart). Raft is safe
under loss and reordering anyway; this only removes redundancy.
"""

from __future__ import annotations

from service.raft.storage import entries_size
from service.raft.types import Message, MessageType, NodeId

_APP = MessageType.APP
_APP_RESP = MessageType.APP_RESP


def coalesce(messages: list[Message], max_bytes: int) -> list[Message]:
    """`messages` with adjacent appends to a peer merged and superseded acknowledgements dropped;
    the order of what remains is unchanged."""
    if len(messages) < 2:
        return messages
    out: list[Message | None] = []
    latest: dict[NodeId, int] = {}  # peer -> position in `out` of its latest message
    for m in messages:
        i = latest.get(m.to)
        prev = out[i] if i is not None else None
        if i is not None and prev is not None and prev.term == m.term:
            if m.type is _APP and prev.type is _APP:
                merged = _merge_appends(prev, m, max_bytes)
                if merged is not None:
                    out[i] = merged
                    continue
            elif (
                m.type is _APP_RESP
                and prev.type is _APP_RESP
                and not m.reject
                and not prev.reject
                and m.index >= prev.index
            ):
                out[i] = None  # superseded by m
        latest[m.to] = len(out)
        out.append(m)
    return [m for m in out if m is not None]


def _merge_appends(a: Message, b: Message, max_bytes: int) -> Message | None:
    """`a` then `b` as one append, or None if they cannot be one."""
    if b.index != a.index + len(a.entries) or b.commit < a.commit or a.context or b.context:
        return None
    if a.entries and b.entries and entries_size(a.entries) + entries_size(b.entries) > max_bytes:
        return None
    return Message(
        type=_APP,
        to=a.to,
        frm=a.frm,
        term=a.term,
        log_term=a.log_term,
        index=a.index,
        entries=a.entries + b.entries,
        commit=b.commit,
    )
