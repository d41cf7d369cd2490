"""Pure pieces of the client: request ids, the tablet map, scan tokens, replica order, how
writes are cut into Write RPCs."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from service.client.master_client import RequestIds
from service.client.meta_cache import Replica, TabletLocation, _TabletMap
from service.client.retry import Backoff
from service.client.scanner import ScanToken, TokenReplica, order_replicas
from service.client.write_session import MAX_BATCH_BYTES, WriteSession
from service.common.errors import InvalidArgument
from service.common.partition import Partition


def test_request_ids_track_the_first_incomplete() -> None:
    ids = RequestIds("c1")
    a, b, c = ids.new(), ids.new(), ids.new()
    assert (a.seq_no, b.seq_no, c.seq_no) == (1, 2, 3)
    assert c.first_incomplete_seq_no == 1
    ids.done(a)
    assert ids.new().first_incomplete_seq_no == 2
    ids.done(b)
    ids.done(c)
    assert ids.new().first_incomplete_seq_no == 4  # the new one itself is outstanding


def _loc(tid: str, start: bytes, end: bytes, leader: str = "a") -> TabletLocation:
    reps = tuple(Replica(u, f"h{u}:1", u == leader, True) for u in "abc")
    return TabletLocation(tid, "t", Partition((), b"", b"", start, end), reps)


def test_tablet_map_finds_by_key_and_replaces_overlapping_tablets() -> None:
    m = _TabletMap()
    m.put(_loc("t1", b"", b"m"))
    m.put(_loc("t2", b"m", b""))
    assert m.find(b"a").tablet_id == "t1"  # type: ignore[union-attr]
    assert m.find(b"z").tablet_id == "t2"  # type: ignore[union-attr]
    # A replacement tablet for the same partition (after an assignment timeout) evicts t1.
    m.put(_loc("t3", b"", b"m"))
    assert [t.tablet_id for t in m.tablets] == ["t3", "t2"]
    assert m.drop("t2") and m.find(b"z") is None
    # Holes stay holes.
    m.put(_loc("t4", b"p", b"q"))
    assert m.find(b"o") is None


def test_note_leader_moves_the_leader_flag() -> None:
    loc = _loc("t1", b"", b"").with_leader("c")
    assert loc.leader() is not None and loc.leader().ts_uuid == "c"  # type: ignore[union-attr]
    assert sum(r.is_leader for r in loc.replicas) == 1


def test_scan_token_round_trips_through_bytes_and_pickle() -> None:
    tok = ScanToken(
        masters=("127.0.0.1:1", "127.0.0.1:2"),
        table_id="tid",
        table_name="t",
        schema_version=3,
        tablet_id="tab",
        replicas=(TokenReplica("a", "127.0.0.1:5", True), TokenReplica("b", "10.0.0.1:5", False)),
        projection=("x", "y"),
        predicates=(b"\x0a\x01x",),
        lower_key=b"\x00\xff",
        limit=7,
        replica_selection="closest",
        min_applied_index=42,
        partition_key_end=b"\x80",
    )
    assert ScanToken.from_bytes(tok.to_bytes()) == tok
    assert pickle.loads(pickle.dumps(tok)) == tok
    with pytest.raises(InvalidArgument, match="not a scan token"):
        ScanToken.from_bytes(b"{}")
    with pytest.raises(InvalidArgument, match="replica_selection"):
        ScanToken((), "t", "t", 0, "x", (), replica_selection="nearest")


def test_replica_order() -> None:
    reps = [
        TokenReplica("f1", "10.0.0.1:1", False),
        TokenReplica("l", "10.0.0.2:1", True),
        TokenReplica("f2", "10.0.0.3:1", False),
    ]
    assert [r.ts_uuid for r in order_replicas(reps, "leader")] == ["l", "f1", "f2"]
    closest = order_replicas(reps, "closest", frozenset({"10.0.0.3"}))
    assert [r.ts_uuid for r in closest] == ["f2", "l", "f1"]


def test_backoff_grows_and_is_capped() -> None:
    import random

    b = Backoff(initial=0.1, cap=0.4, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    assert all(0 <= d <= 0.4 for d in delays)
    assert max(delays[:1]) <= 0.1


def test_writes_are_cut_into_batches_a_tablet_server_accepts() -> None:
    # A few rows of 1 MiB among small ones: batches sized by the average row would carry
    # several of them and pass MAX_BATCH_BYTES, so those are halved until they fit.
    n = 3000
    values = ["x" * (1 << 20) if i % 100 == 0 else f"v{i}" for i in range(n)]
    data = pa.table({"k": pa.array(range(n), pa.int64()), "v": values})
    rows = np.arange(n, dtype=np.int64)[::-1].copy()  # any subset, in any order
    session = SimpleNamespace(batch_rows=1000)
    batches = list(WriteSession._batches(session, data, rows))  # type: ignore[arg-type]
    assert np.concatenate([c for c, _ in batches]).tolist() == rows.tolist()
    assert all(len(c) <= 1000 and len(p) <= MAX_BATCH_BYTES for c, p in batches)
    for chunk, payload in batches:
        got = pa.ipc.open_stream(payload).read_all()
        assert got.column("k").to_pylist() == chunk.tolist()
    # A single row past the limit goes alone, for the server to refuse naming the limit.
    big = pa.table({"k": [1, 2], "v": ["x" * (MAX_BATCH_BYTES + 1), "y"]})
    alone = list(WriteSession._batches(session, big, np.arange(2)))  # type: ignore[arg-type]
    assert [c.tolist() for c, _ in alone] == [[0], [1]]
