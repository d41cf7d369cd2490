"""Exactly-once plain writes: a retried write request gets its first attempt's outcome
(docs/design/tablets.md#R6).

A client retries a write whose reply it did not get (a timeout, the leader killed, a network
cut). Without more, the retry is a second write: an INSERT that did commit fails "already
present", and an UPSERT whose first attempt was held up (a paused leader) may commit after a
newer write of the same row and undo it. So a client names each write request (`RequestId`: a
random client id and a sequence number, the same on every retry of one request), the leader
replicates the name inside the write's Raft entry, and every replica that applies the entry
records its outcome here (`RequestTracker.record`). A request whose name is recorded is not
written again: the leader answers with the recorded outcome. A new leader applies everything
of earlier terms before it takes writes, so it has the record of every request those terms
committed.

A request in flight on this leader (its entry proposed, not applied yet) is marked, and a retry
of it waits for the entry instead of proposing a second one; the mark is dropped when the entry
is applied, or at the next term (the entry was then applied, or truncated and never will be).

The tracker never decides what an entry does when applied: replicas that restarted have
forgotten what the others remember, and the log must give every replica the same rows. The
records are in memory, rebuilt from the entries a replica replays at start; an entry flushed
before a restart is not replayed, so a retry that arrives after its server restarted and
flushed may be written again (Kudu's tablets keep the same limit). A client's records go once
it says it no longer waits on them (`first_incomplete_seq_no`), and the tracker is bounded
(`MAX_CLIENTS` clients, least recently seen dropped first; `MAX_PER_CLIENT` outcomes each).
"""

from __future__ import annotations

import asyncio
import struct
from collections import OrderedDict
from dataclasses import dataclass

from service.common.errors import InvalidArgument
from service.pb import tserver_pb2 as tpb

__all__ = ["CLIENT_ID_BYTES", "Outcome", "RequestId", "RequestTracker"]

CLIENT_ID_BYTES = 16
MAX_CLIENTS = 512
"""Clients remembered per tablet replica, the least recently seen dropped first: a retry comes
within seconds, and every replica of every tablet keeps its own table (about 100 KB each when
full with one outcome per client)."""
MAX_PER_CLIENT = 1024
"""Outcomes kept per client, the oldest dropped first (a client's `first_incomplete_seq_no`
usually keeps it to the requests it has in flight)."""
_SEQ = struct.Struct(">Q")


@dataclass(frozen=True)
class RequestId:
    """A client's name for one write request, the same on each of its retries."""

    client_id: bytes
    seq_no: int
    first_incomplete: int = 0

    @classmethod
    def from_request(cls, req: tpb.WriteRequestPB) -> RequestId | None:
        """The request's name; None when it has none. InvalidArgument for a malformed one
        (the write is then refused, not applied without the guarantee it asked for)."""
        if not req.HasField("request_id"):
            return None
        rid = req.request_id
        if len(rid.client_id) != CLIENT_ID_BYTES:
            raise InvalidArgument(
                f"request_id.client_id: {len(rid.client_id)} bytes, not {CLIENT_ID_BYTES}"
            )
        if rid.seq_no == 0:
            raise InvalidArgument("request_id.seq_no: 0 (requests are numbered from 1)")
        if rid.first_incomplete_seq_no > rid.seq_no:
            raise InvalidArgument(
                f"request_id.first_incomplete_seq_no {rid.first_incomplete_seq_no} is past "
                f"seq_no {rid.seq_no}: the request itself is not complete"
            )
        return cls(bytes(rid.client_id), int(rid.seq_no), int(rid.first_incomplete_seq_no))

    def encode(self) -> bytes:
        """The name as a write entry carries it (`CLIENT_ID_BYTES` + 8 bytes)."""
        return self.client_id + _SEQ.pack(self.seq_no)

    @classmethod
    def decode(cls, data: bytes) -> RequestId:
        if len(data) < CLIENT_ID_BYTES + _SEQ.size:
            raise ValueError("a write entry's request id is cut short")
        (seq,) = _SEQ.unpack_from(data, CLIENT_ID_BYTES)
        return cls(bytes(data[:CLIENT_ID_BYTES]), seq)

    ENCODED_BYTES = CLIENT_ID_BYTES + _SEQ.size


@dataclass(frozen=True)
class Outcome:
    """What applying a named request did: rows changed, rows refused (index in the entry's
    batch, error code, message) and the commit timestamp."""

    rows_applied: int
    errors: tuple[tuple[int, str, str], ...]
    commit_timestamp: int


class RequestTracker:
    """The outcomes of the named writes this replica applied, and the leader's in-flight marks
    (module docstring)."""

    def __init__(self, max_clients: int = MAX_CLIENTS, max_per_client: int = MAX_PER_CLIENT):
        self.max_clients = max_clients
        self.max_per_client = max_per_client
        self._done: OrderedDict[bytes, OrderedDict[int, Outcome]] = OrderedDict()
        self._inflight: dict[tuple[bytes, int], tuple[int, asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        return sum(len(d) for d in self._done.values())

    def outcome(self, rid: RequestId) -> Outcome | None:
        done = self._done.get(rid.client_id)
        return None if done is None else done.get(rid.seq_no)

    def record(self, rid: RequestId, outcome: Outcome) -> None:
        """An entry naming `rid` was applied with `outcome` (every replica, in log order)."""
        done = self._done.get(rid.client_id)
        if done is None:
            done = self._done[rid.client_id] = OrderedDict()
            while len(self._done) > self.max_clients:
                self._done.popitem(last=False)
        else:
            self._done.move_to_end(rid.client_id)
        done.setdefault(rid.seq_no, outcome)
        while len(done) > self.max_per_client:
            done.popitem(last=False)
        mark = self._inflight.pop((rid.client_id, rid.seq_no), None)
        if mark is not None and not mark[1].done():
            mark[1].set_result(None)

    def forget_below(self, rid: RequestId) -> None:
        """The client waits on nothing below `rid.first_incomplete`: drop those outcomes."""
        done = self._done.get(rid.client_id)
        if done is None or not rid.first_incomplete:
            return
        for seq in [s for s in done if s < rid.first_incomplete]:
            del done[seq]

    def in_flight(self, rid: RequestId, term: int) -> asyncio.Future[None] | None:
        """The mark of `rid` proposed in `term` and not applied yet; a mark of an earlier term
        is stale (its entry was applied or truncated before this term's writes) and goes."""
        key = (rid.client_id, rid.seq_no)
        mark = self._inflight.get(key)
        if mark is None:
            return None
        if mark[0] != term or mark[1].done():
            del self._inflight[key]
            if not mark[1].done():
                mark[1].set_result(None)
            return None
        return mark[1]

    def mark(self, rid: RequestId, term: int) -> None:
        """`rid`'s entry is about to be proposed in `term`."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[(rid.client_id, rid.seq_no)] = (term, fut)
