"""The request tracker's bookkeeping (service/tserver/request_tracker.py): outcomes kept and
forgotten, bounds, in-flight marks. Pure logic on a real event loop (the marks are futures)."""

from __future__ import annotations

import asyncio

import pytest

from service.common.errors import InvalidArgument
from service.pb import tserver_pb2 as tpb
from service.tserver.request_tracker import Outcome, RequestId, RequestTracker

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


def _done(n: int) -> Outcome:
    return Outcome(n, (), 1000 + n)


def test_outcomes_are_kept_per_client_and_forgotten_below_what_the_client_awaits() -> None:
    t = RequestTracker()
    for seq in (1, 2, 3):
        t.record(RequestId(A, seq), _done(seq))
    t.record(RequestId(A, 2), _done(99))  # a second apply of one name keeps the first outcome
    assert t.outcome(RequestId(A, 2)) == _done(2)
    assert t.outcome(RequestId(B, 2)) is None
    t.forget_below(RequestId(A, 3, first_incomplete=3))
    assert [t.outcome(RequestId(A, s)) for s in (1, 2, 3)] == [None, None, _done(3)]
    t.forget_below(RequestId(A, 4, first_incomplete=0))  # 0: the client says nothing
    assert len(t) == 1


def test_the_tables_are_bounded_least_recently_seen_first() -> None:
    t = RequestTracker(max_clients=2, max_per_client=2)
    t.record(RequestId(A, 1), _done(1))
    t.record(RequestId(B, 1), _done(1))
    t.record(RequestId(A, 2), _done(2))  # A seen again: B is now the oldest
    t.record(RequestId(C, 1), _done(1))
    assert t.outcome(RequestId(B, 1)) is None and t.outcome(RequestId(A, 2)) == _done(2)
    t.record(RequestId(A, 3), _done(3))
    assert t.outcome(RequestId(A, 1)) is None  # the oldest of A's three
    assert len(t) == 3


def test_an_in_flight_mark_is_released_by_the_apply_and_dropped_at_the_next_term() -> None:
    async def main() -> None:
        t = RequestTracker()
        t.mark(RequestId(A, 1), term=5)
        pending = t.in_flight(RequestId(A, 1), term=5)
        assert pending is not None and not pending.done()
        t.record(RequestId(A, 1), _done(1))
        assert pending.done() and t.in_flight(RequestId(A, 1), term=5) is None
        t.mark(RequestId(A, 2), term=5)
        stale = t._inflight[(A, 2)][1]
        assert t.in_flight(RequestId(A, 2), term=6) is None  # applied or truncated by now
        assert stale.done()

    asyncio.run(main())


def test_a_request_id_from_the_wire_is_checked() -> None:
    def req(client: bytes, seq: int, first: int = 0) -> tpb.WriteRequestPB:
        r = tpb.WriteRequestPB()
        r.request_id.CopyFrom(
            tpb.WriteRequestIdPB(client_id=client, seq_no=seq, first_incomplete_seq_no=first)
        )
        return r

    assert RequestId.from_request(tpb.WriteRequestPB()) is None
    assert RequestId.from_request(req(A, 7, 3)) == RequestId(A, 7, 3)
    assert RequestId.decode(RequestId(A, 7).encode()) == RequestId(A, 7)
    for bad, message in [
        (req(b"x" * 15, 1), "15 bytes"),
        (req(A, 0), "seq_no: 0"),
        (req(A, 2, 3), "past seq_no 2"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            RequestId.from_request(bad)
    with pytest.raises(ValueError, match="cut short"):
        RequestId.decode(A)
