"""One real tablet server in-process (real gRPC on loopback, real WAL and fsync), single-voter
tablets: the admin and data RPCs, restart and replay, tombstones, fencing, startup recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import google_crc32c
import grpc
import pyarrow as pa
import pytest

from service.common.config import RaftSettings
from service.common.errors import Aborted
from service.common.predicates import ScanSpec
from service.common.schema_codec import encode_cell
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.tablet_fixtures import (
    SCHEMA,
    create_request,
    ipc,
    rows,
    scan_all,
    write_request,
)
from service.tools.launcher import free_ports
from service.tserver import superblock as sbmod
from service.tserver.rowstore import RowStore
from service.tserver.superblock import DataState
from tests.helpers.tserver_inproc import Server, run

pytestmark = pytest.mark.timeout(120)


def with_server(
    body: Callable[[Server], Awaitable[None]],
) -> Callable[[Path], None]:
    """A sync test (the suite has no asyncio plugin) running `body` against a fresh server."""

    def test(tmp_path: Path) -> None:
        async def main() -> None:
            s = Server(tmp_path / "ts")
            await s.start()
            try:
                await body(s)
            finally:
                await s.stop()

        asyncio.run(main())

    test.__name__ = body.__name__
    return test


def _code(e: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> grpc.StatusCode:
    return e.value.code()


@with_server
async def test_write_then_scan_back_exactly(server: Server) -> None:
    await server.create()
    for lo in range(0, 5000, 1000):
        resp = await server.data.Write(write_request(server.uuid, "tablet-1", rows(lo, lo + 1000)))
        assert not resp.per_row_errors and resp.rows_applied == 1000
    got = await scan_all(server.data, server.uuid, "tablet-1", batch_size_bytes=16 << 10)
    assert got.to_pydict() == rows(0, 5000).to_pydict()
    assert got.schema == SCHEMA.to_arrow()
    status = (await server.replicas())["tablet-1"]
    assert status.row_count == 5000
    assert status.data_state == tpb.TABLET_DATA_READY and status.state == mpb.REPLICA_RUNNING


@with_server
async def test_projection_predicates_and_limit(server: Server) -> None:
    await server.create()
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 100)))
    col = SCHEMA.column("id")
    pred = tpb.ColumnPredicatePB(
        column="id", op=tpb.ColumnPredicatePB.GE, values=[encode_cell(col, 90)]
    )
    got = await scan_all(
        server.data, server.uuid, "tablet-1", projection=["name"], predicates=[pred]
    )
    assert got.column_names == ["name"]
    assert got.column("name").to_pylist() == [f"row-{i}" for i in range(90, 100)]
    limited = await scan_all(server.data, server.uuid, "tablet-1", limit=7)
    assert limited.num_rows == 7


@with_server
async def test_per_row_errors_do_not_stop_the_batch(server: Server) -> None:
    await server.create()
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 10)))
    resp = await server.data.Write(write_request(server.uuid, "tablet-1", rows(5, 15)))
    assert sorted(e.row_index for e in resp.per_row_errors) == [0, 1, 2, 3, 4]
    assert all(e.error.code == "ALREADY_EXISTS" for e in resp.per_row_errors)
    got = await scan_all(server.data, server.uuid, "tablet-1")
    assert got.column("id").to_pylist() == list(range(15))


@with_server
async def test_bad_input_is_refused_and_changes_nothing(server: Server) -> None:
    await server.create()
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 3)))
    bad = [
        (
            write_request("someone-else", "tablet-1", rows(10, 11)),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (write_request(server.uuid, "no-such-tablet", rows(10, 11)), grpc.StatusCode.NOT_FOUND),
        (
            tpb.WriteRequestPB(
                dest_uuid=server.uuid,
                tablet_id="tablet-1",
                rows=b"garbage",
                default_op=tpb.ROW_OP_INSERT,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            write_request(server.uuid, "tablet-1", pa.table({"id": [10], "nope": ["x"]})),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            write_request(server.uuid, "tablet-1", pa.table({"id": ["not-an-int"]})),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ]
    for req, code in bad:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await server.data.Write(req)
        assert _code(e) == code, e.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await scan_all(server.data, server.uuid, "tablet-1", projection=["dropped_col"])
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT and "dropped_col" in (
        e.value.details() or ""
    )
    got = await scan_all(server.data, server.uuid, "tablet-1")
    assert got.column("id").to_pylist() == [0, 1, 2]


@run
async def test_a_snapshot_read_outlives_a_timestamp_entry_a_new_leader_overwrote(
    tmp_path: Path,
) -> None:
    """A snapshot read of a quiet tablet has its leader replicate a timestamp entry; if a new
    leader overwrites that entry (an election under load), the read keeps waiting (asking the
    new leader, or trying again) instead of failing with ABORTED, which a scanner takes for
    fatal: an incremental backup died of it on a busy machine."""
    s = Server(tmp_path / "ts")
    await s.start()
    try:
        await s.create()
        await s.data.Write(write_request(s.uuid, "tablet-1", rows(0, 100)))
        assert s.ts is not None
        tablet = s.ts.tablets.get("tablet-1")
        real = tablet._advance_safe_time
        calls = []

        async def overwritten_once(ts: int, timeout: float) -> None:
            calls.append(ts)
            if len(calls) == 1:
                raise Aborted("entry 20 was overwritten by a new leader; not applied")
            await real(ts, timeout)

        tablet._advance_safe_time = overwritten_once  # type: ignore[method-assign]
        at = tablet.settings.clock.now()
        got = await scan_all(s.data, s.uuid, "tablet-1", snapshot_timestamp=at)
        assert got.num_rows == 100 and len(calls) == 2
    finally:
        await s.stop()


@run
async def test_a_transactional_write_whose_entry_a_new_leader_overwrote_is_sent_again(
    tmp_path: Path,
) -> None:
    """The entries of a transaction's write (its begin, then its staged rows) can lose their
    place in the log to a new leader's (an election under load). Nothing of such an entry took
    effect, so the write is answered UNAVAILABLE and the writer sends it again, instead of
    ABORTED, which a transaction's writer takes for a conflict. (A begin lost so failed two
    transaction tests beside two busy loops.)"""
    s = Server(tmp_path / "ts")
    await s.start()
    try:
        await s.create()
        assert s.ts is not None
        tablet = s.ts.tablets.get("tablet-1")

        async def register(txn_id: int, tablet_id: str, writer: str, timeout: float) -> int:
            return tablet.settings.clock.now()

        tablet.settings = dataclasses.replace(tablet.settings, register_txn=register)
        node = tablet.running_node()
        real = node.propose
        proposed: list[bytes] = []
        lose: set[int] = set()

        async def overwritten(entry: bytes, timeout: float | None = None) -> object:
            proposed.append(entry)
            if len(proposed) in lose:
                raise Aborted(f"entry {len(proposed)} was overwritten by a new leader")
            return await real(entry, timeout=timeout)

        node.propose = overwritten  # type: ignore[method-assign]
        for txn_id, lost in ((77, 1), (78, 4)):  # the begin lost; then the staged rows
            lose.add(lost)
            req = write_request(s.uuid, "tablet-1", rows(txn_id, txn_id + 1))
            req.txn_id = txn_id
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await s.data.Write(req)
            assert _code(e) == grpc.StatusCode.UNAVAILABLE, e.value.details()
            assert "send the write again" in (e.value.details() or "")
            resp = await s.data.Write(req)  # the writer's retry
            assert not resp.per_row_errors, resp
        assert len(proposed) == 6  # begin lost, begin, stage; begin, stage lost, stage
    finally:
        await s.stop()


@run
async def test_restart_replays_the_wal(tmp_path: Path) -> None:
    s = Server(tmp_path / "ts")
    await s.start()
    await s.create()
    await s.data.Write(write_request(s.uuid, "tablet-1", rows(0, 500)))
    uuid = s.uuid
    await s.stop()
    s2 = Server(tmp_path / "ts")
    await s2.start()
    try:
        assert s2.uuid == uuid
        await s2.wait_leader("tablet-1")
        got = await scan_all(s2.data, s2.uuid, "tablet-1")
        assert got.to_pydict() == rows(0, 500).to_pydict()
        await s2.data.Write(write_request(s2.uuid, "tablet-1", rows(500, 600)))
        assert (await scan_all(s2.data, s2.uuid, "tablet-1")).num_rows == 600
    finally:
        await s2.stop()


@run
async def test_tombstone_survives_restart_and_keeps_consensus_metadata(tmp_path: Path) -> None:
    s = Server(tmp_path / "ts")
    await s.start()
    await s.create()
    await s.data.Write(write_request(s.uuid, "tablet-1", rows(0, 10)))
    await s.admin.DeleteTablet(
        tpb.DeleteTabletRequestPB(
            dest_uuid=s.uuid, tablet_id="tablet-1", delete_type=tpb.TABLET_DATA_TOMBSTONED
        )
    )
    assert (await s.replicas())["tablet-1"].data_state == tpb.TABLET_DATA_TOMBSTONED
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.data.Write(write_request(s.uuid, "tablet-1", rows(10, 11)))
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    # A stale leader (a term below the one this replica reached) cannot resurrect it by copy.
    stale = tpb.StartTabletCopyRequestPB(
        dest_uuid=s.uuid, tablet_id="tablet-1", copy_peer_uuid="old-leader", caller_term=0
    )
    stale.copy_peer_addr.host, stale.copy_peer_addr.port = "127.0.0.1", 1
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.admin.StartTabletCopy(stale)
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION and "term" in (e.value.details() or "")
    assert (await s.replicas())["tablet-1"].data_state == tpb.TABLET_DATA_TOMBSTONED
    await s.stop()
    tablet_dir = tmp_path / "ts" / "tablets" / "tablet-1"
    assert (tablet_dir / "raft" / "cmeta").exists()
    assert not (tablet_dir / "data").exists()
    s2 = Server(tmp_path / "ts")
    await s2.start()
    try:
        assert (await s2.replicas())["tablet-1"].data_state == tpb.TABLET_DATA_TOMBSTONED
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await s2.admin.CreateTablet(
                create_request(s2.uuid, "tablet-1", [(s2.uuid, s2.ts.address)])  # type: ignore[union-attr]
            )
        assert _code(e) == grpc.StatusCode.ALREADY_EXISTS
    finally:
        await s2.stop()


@with_server
async def test_delete_removes_everything(server: Server) -> None:
    await server.create()
    await server.admin.DeleteTablet(
        tpb.DeleteTabletRequestPB(
            dest_uuid=server.uuid, tablet_id="tablet-1", delete_type=tpb.TABLET_DATA_DELETED
        )
    )
    assert "tablet-1" not in await server.replicas()
    assert not (server.data_dir / "tablets" / "tablet-1").exists()


@with_server
async def test_create_is_idempotent_and_validated(server: Server) -> None:
    await server.create()
    assert server.ts is not None
    await server.admin.CreateTablet(
        create_request(server.uuid, "tablet-1", [(server.uuid, server.ts.address)])
    )
    req = create_request(server.uuid, "tablet-2", [("other", "127.0.0.1:1")])
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.admin.CreateTablet(req)
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT and "not a voter" in (
        e.value.details() or ""
    )
    req = create_request(server.uuid, "../evil", [(server.uuid, server.ts.address)])
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.admin.CreateTablet(req)
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    assert set(await server.replicas()) == {"tablet-1"}


@with_server
async def test_a_deposed_master_is_fenced(server: Server) -> None:
    assert server.ts is not None
    req = create_request(server.uuid, "tablet-1", [(server.uuid, server.ts.address)])
    req.fence.master_uuid, req.fence.master_term = "m2", 7
    await server.admin.CreateTablet(req)
    stale = tpb.DeleteTabletRequestPB(
        dest_uuid=server.uuid,
        tablet_id="tablet-1",
        delete_type=tpb.TABLET_DATA_DELETED,
        fence=tpb.MasterFencePB(master_uuid="m1", master_term=6),
    )
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.admin.DeleteTablet(stale)
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION and "term 6" in (e.value.details() or "")
    assert "tablet-1" in await server.replicas()


class _Heartbeats:
    """The part of the heartbeater a fenced admin call touches."""

    def __init__(self, masters: set[str]) -> None:
        self.masters = masters
        self.woken = 0

    def master_uuids(self) -> set[str]:
        return self.masters

    def saw_newer_term(self) -> None:
        self.woken += 1

    async def aclose(self) -> None:
        pass


@with_server
async def test_an_admin_call_of_a_newer_master_term_wakes_every_heartbeat(server: Server) -> None:
    """After a leader master dies, the first sign of the new one is often its CreateTablet:
    a successful fenced call of a newer term makes the heartbeater try every master at once
    (so the new replica's report finds the new leader); a call of a term already seen, or one
    refused, does not."""
    assert server.ts is not None
    hb = _Heartbeats({"m1", "m2"})
    server.ts.heartbeater = cast(Any, hb)
    req = create_request(server.uuid, "tablet-1", [(server.uuid, server.ts.address)])
    req.fence.master_uuid, req.fence.master_term = "m2", 7
    await server.admin.CreateTablet(req)
    assert hb.woken == 1 and server.ts.highest_master_term == 7
    again = create_request(server.uuid, "tablet-2", [(server.uuid, server.ts.address)])
    again.fence.master_uuid, again.fence.master_term = "m2", 7
    await server.admin.CreateTablet(again)
    assert hb.woken == 1  # the same leader's next call: nothing new
    refused = tpb.DeleteTabletRequestPB(
        dest_uuid=server.uuid,
        tablet_id="no-such-tablet",
        delete_type=tpb.TABLET_DATA_DELETED,
        fence=tpb.MasterFencePB(master_uuid="m1", master_term=9),
    )
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.admin.DeleteTablet(refused)
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    assert hb.woken == 1 and server.ts.highest_master_term == 7
    server.ts.heartbeater = None


@with_server
async def test_scanner_paging_retry_and_expiry(server: Server) -> None:
    await server.create()
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 3000)))
    ns = tpb.NewScanRequestPB(tablet_id="tablet-1")
    first = await server.data.Scan(
        tpb.ScanRequestPB(dest_uuid=server.uuid, new_scan=ns, batch_size_bytes=1)
    )
    assert first.has_more_results and first.scanner_id
    nxt = tpb.ScanNextRequestPB(
        dest_uuid=server.uuid, scanner_id=first.scanner_id, call_seq_id=1, batch_size_bytes=1
    )
    a = await server.data.ScanNext(nxt)
    again = await server.data.ScanNext(nxt)  # a retry of the same call gets the same page
    assert a.batch == again.batch
    nxt.call_seq_id = 5
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.data.ScanNext(nxt)
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    await asyncio.sleep(1.0)  # ttl 0.4 s
    nxt.call_seq_id = 2
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.data.ScanNext(nxt)
    assert _code(e) == grpc.StatusCode.NOT_FOUND and "start_after_primary_key" in (
        e.value.details() or ""
    )


@with_server
async def test_checksum_matches_contents(server: Server) -> None:
    await server.create()
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 100)))
    c1 = await server.data.Checksum(
        tpb.ChecksumRequestPB(dest_uuid=server.uuid, tablet_id="tablet-1")
    )
    assert c1.row_count == 100 and c1.digest
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(100, 101)))
    c2 = await server.data.Checksum(
        tpb.ChecksumRequestPB(dest_uuid=server.uuid, tablet_id="tablet-1")
    )
    assert c2.row_count == 101 and c2.digest != c1.digest


@run
async def test_startup_cleans_unfinished_creates_and_copies(tmp_path: Path) -> None:
    s = Server(tmp_path / "ts")
    await s.start()
    await s.create("tablet-1")
    await s.create("tablet-2")
    await s.stop()
    root = tmp_path / "ts" / "tablets"
    (root / "half-created").mkdir()
    (root / "half-created" / "junk").write_bytes(b"x")
    sb = sbmod.load(root / "tablet-2")
    assert sb is not None
    sbmod.save(root / "tablet-2", sb.with_state(DataState.COPYING, copy_source="x"))
    s2 = Server(tmp_path / "ts")
    await s2.start()
    try:
        reps = await s2.replicas()
        assert set(reps) == {"tablet-1", "tablet-2"}
        assert reps["tablet-2"].data_state == tpb.TABLET_DATA_TOMBSTONED
        assert not (root / "half-created").exists()
        assert (root / "tablet-2" / "raft" / "cmeta").exists()
        await s2.wait_leader("tablet-1")
    finally:
        await s2.stop()


def test_ipc_helper_roundtrip() -> None:
    t = rows(0, 3)
    assert pa.ipc.open_stream(ipc(t)).read_all().equals(t)


@with_server
async def test_add_peer_carries_the_promote_intent(server: Server) -> None:
    """ADD_PEER always adds a non-voter; it is marked for promotion (Kudu's PRE_VOTER)
    only when the request asks for a VOTER or for a NON_VOTER with promote set. The peers
    here never answer, so nothing is promoted: what is checked is the intent recorded."""
    await server.create()
    ports = free_ports(3)
    asks = [(mpb.NON_VOTER, False), (mpb.NON_VOTER, True), (mpb.VOTER, False)]
    for i, ((member_type, promote), port) in enumerate(zip(asks, ports, strict=True)):
        req = tpb.ChangeConfigRequestPB(
            dest_uuid=server.uuid, tablet_id="tablet-1", type=tpb.ChangeConfigRequestPB.ADD_PEER
        )
        req.peer.permanent_uuid = f"peer-{i}"
        req.peer.member_type = member_type
        req.peer.promote = promote
        req.peer.last_known_addr.host, req.peer.last_known_addr.port = "127.0.0.1", port
        resp = await server.admin.ChangeConfig(req)
        peers = {p.permanent_uuid: p for p in resp.consensus_state.committed_config.peers}
        assert peers[f"peer-{i}"].member_type == mpb.NON_VOTER
    cs = await server.admin.GetConsensusState(
        tpb.GetConsensusStateRequestPB(dest_uuid=server.uuid, tablet_ids=["tablet-1"])
    )
    peers = {p.permanent_uuid: p for p in cs.tablets[0].consensus_state.committed_config.peers}
    assert [peers[f"peer-{i}"].promote for i in range(3)] == [False, True, True]
    assert all(peers[f"peer-{i}"].member_type == mpb.NON_VOTER for i in range(3))


@run
async def test_an_idle_tablet_flushes_and_compacts_overlapping_files(tmp_path: Path) -> None:
    """flush_idle_ms: a tablet that takes no write for that long flushes its memstore, then
    merges files whose key ranges overlap, so that it is read from one sorted file."""
    server = Server(tmp_path / "ts", flush_idle_ms=300)
    await server.start()
    try:
        await server.create()
        assert server.ts is not None
        replica = server.ts.tablets.get("tablet-1")

        def files() -> list[str]:
            assert replica.store is not None
            return [f for f in replica.store.data_files() if f.endswith(".arrow")]

        async def settle(want_files: int, before: list[str]) -> None:
            """Until the memstore is empty and the files (changed from `before`: a write's
            apply may trail its answer) are `want_files` many."""
            for _ in range(100):
                await asyncio.sleep(0.05)
                assert replica.store is not None
                now = files()
                if replica.store.memstore_rows() == 0 and len(now) == want_files and now != before:
                    return
            raise AssertionError(f"memstore {replica.store.memstore_rows()}, files {files()}")

        await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 1000)))
        await settle(1, [])
        first = files()
        await server.data.Write(
            write_request(server.uuid, "tablet-1", rows(500, 1500), op=tpb.ROW_OP_UPSERT)
        )
        await settle(1, first)  # flushed (2 files, overlapping), then compacted into one
        second = files()
        await server.data.Write(write_request(server.uuid, "tablet-1", rows(5000, 5100)))
        await settle(2, second)  # disjoint from the first: left as a second file
        got = await scan_all(server.data, server.uuid, "tablet-1")
        assert got.to_pydict() == pa.concat_tables([rows(0, 1500), rows(5000, 5100)]).to_pydict()
    finally:
        await server.stop()


@with_server
async def test_start_tablet_copy_replaces_a_ready_replica_only_if_it_cannot_catch_up(
    server: Server,
) -> None:
    """StartTabletCopy onto a READY replica is a no-op, unless the leader says its log starts
    past the end of the replica's (`retained_from_index`): then the replica cannot catch up
    by replication and is replaced, if the caller's term is not stale. The source here does
    not answer, so that copy fails before anything is touched and the replica stays READY."""
    s = server
    await s.create()
    await s.data.Write(write_request(s.uuid, "tablet-1", rows(0, 10)))
    assert s.ts is not None
    node = s.ts.tablets.get("tablet-1").running_node()
    last, term = node.status().last_index, node.status().term

    def req(retained_from: int, caller_term: int) -> tpb.StartTabletCopyRequestPB:
        r = tpb.StartTabletCopyRequestPB(
            dest_uuid=s.uuid,
            tablet_id="tablet-1",
            copy_peer_uuid="leader",
            caller_term=caller_term,
            retained_from_index=retained_from,
        )
        r.copy_peer_addr.host, r.copy_peer_addr.port = "127.0.0.1", 1
        return r

    async def copies() -> list[tuple[str, str]]:
        resp = await s.admin.ListTabletCopies(tpb.ListTabletCopiesRequestPB(dest_uuid=s.uuid))
        return [(c.tablet_id, c.state) for c in resp.copies]

    # Not given, or the replica's log reaches the leader's first index - 1: left alone.
    await s.admin.StartTabletCopy(req(0, term + 1))
    await s.admin.StartTabletCopy(req(last + 1, term + 1))
    assert await copies() == []
    # Behind, but asked by a deposed leader: refused.
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.admin.StartTabletCopy(req(last + 2, term - 1))
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION and "term" in (e.value.details() or "")
    assert await copies() == []
    # Behind, asked by the current leader: a copy starts (and fails: no source there).
    await s.admin.StartTabletCopy(req(last + 2, term))
    for _ in range(100):
        if await copies() == [("tablet-1", "FAILED")]:
            break
        await asyncio.sleep(0.05)
    assert await copies() == [("tablet-1", "FAILED")]
    assert (await s.replicas())["tablet-1"].data_state == tpb.TABLET_DATA_READY
    got = await scan_all(s.data, s.uuid, "tablet-1")
    assert got.num_rows == 10


# --- the WAL anchored by the flushed index; copy sessions of files ----------------------------


@run
async def test_the_log_is_anchored_at_the_flushed_index_and_no_rows_are_serialized(
    tmp_path: Path,
) -> None:
    """A tablet's Raft snapshot is an anchor at its row store's flushed index: taken once a
    flush moved it on, holding no rows, dropping the log up to it (less the catch-up entries
    kept for followers); a restart checks the anchor and replays only what follows."""
    catchup = 3
    s = Server(tmp_path / "ts", raft=RaftSettings(snapshot_catchup_entries=catchup))
    await s.start()
    await s.create()
    assert s.ts is not None
    for lo in range(0, 2000, 100):
        await s.data.Write(write_request(s.uuid, "tablet-1", rows(lo, lo + 100)))
    replica = s.ts.tablets.get("tablet-1")
    node, store = replica.node, replica.store
    assert node is not None and store is not None
    assert node.last_snapshot_index == 0 and store.flushed_index == 0  # nothing flushed yet
    await replica.flush()
    flushed = store.flushed_index
    await s.data.Write(write_request(s.uuid, "tablet-1", rows(2000, 2001)))  # one more Ready
    assert flushed >= 20 and node.last_snapshot_index == flushed
    assert node.storage.first_index() == flushed - catchup + 1
    snapshot_file = replica.raft_dir / "snapshot"
    assert snapshot_file.stat().st_size < 1024  # an anchor, whatever the rows weigh
    await s.stop()
    s2 = Server(tmp_path / "ts")
    await s2.start()
    try:
        await s2.wait_leader("tablet-1")
        assert s2.ts is not None
        restarted = s2.ts.tablets.get("tablet-1").node
        assert restarted is not None and restarted.last_snapshot_index == flushed
        got = await scan_all(s2.data, s2.uuid, "tablet-1")
        assert got.to_pydict() == rows(0, 2001).to_pydict()
    finally:
        await s2.stop()


@run
async def test_a_replica_whose_row_files_fall_short_of_its_anchor_fails(tmp_path: Path) -> None:
    """Files lost under an anchored log cannot be replayed back: the replica must fail loudly
    (reported FAILED, serving nothing) rather than serve fewer rows than it acknowledged."""
    s = Server(tmp_path / "ts")
    await s.start()
    await s.create()
    assert s.ts is not None
    await s.data.Write(write_request(s.uuid, "tablet-1", rows(0, 100)))
    replica = s.ts.tablets.get("tablet-1")
    await replica.flush()
    await s.data.Write(write_request(s.uuid, "tablet-1", rows(100, 101)))  # takes the anchor
    assert replica.node is not None and replica.node.last_snapshot_index > 0
    data_dir = replica.data_dir
    await s.stop()
    shutil.rmtree(data_dir)
    RowStore.create(data_dir, SCHEMA).close()  # files of an empty tablet
    s2 = Server(tmp_path / "ts")
    await s2.start()
    try:
        status = (await s2.replicas())["tablet-1"]
        assert status.state == mpb.REPLICA_FAILED
        assert "data files lost" in status.error.message
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await scan_all(s2.data, s2.uuid, "tablet-1")
        assert _code(e) is grpc.StatusCode.UNAVAILABLE
    finally:
        await s2.stop()


@with_server
async def test_a_copy_session_serves_the_flushed_files_from_hard_links(server: Server) -> None:
    """BeginTabletCopySession flushes the memstore and offers the row store's MANIFEST and
    data files as of the flushed index, linked into a session directory: fetched chunk by
    chunk they open as the tablet's rows, though the tablet moved on meanwhile."""
    await server.create()
    assert server.ts is not None
    for lo in (0, 300):
        await server.data.Write(write_request(server.uuid, "tablet-1", rows(lo, lo + 300)))
    replica = server.ts.tablets.get("tablet-1")
    assert replica.store is not None and replica.store.memstore_rows() == 600
    copy = tpb_grpc.TabletCopyServiceStub(server.channel)
    begin = await copy.BeginTabletCopySession(
        tpb.BeginTabletCopySessionRequestPB(
            dest_uuid=server.uuid, tablet_id="tablet-1", requestor_uuid="peer-x"
        )
    )
    meta = json.loads(begin.consensus_meta)
    assert replica.store.memstore_rows() == 0  # flushed for the session
    assert meta["snapshot_index"] == replica.store.flushed_index > 0
    assert meta["voters"] == [server.uuid]
    names = sorted(f.name for f in begin.data_files)
    assert names == sorted(replica.store.data_files()) and "MANIFEST" in names
    session_dir = server.data_dir / "copy-sessions" / begin.session_id
    assert sorted(os.listdir(session_dir)) == names
    # The tablet moves on: more rows, a flush, a compaction of the linked files.
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(600, 700)))
    await replica.flush()
    replica.store.compact()
    image = server.data_dir.parent / "image"
    image.mkdir()
    for f in begin.data_files:
        parts, offset = [], 0
        while offset < f.size:
            chunk = await copy.FetchData(
                tpb.FetchDataRequestPB(
                    dest_uuid=server.uuid,
                    session_id=begin.session_id,
                    file_name=f.name,
                    offset=offset,
                    max_length=1000,
                )
            )
            assert chunk.total_size == f.size and len(chunk.data) <= 1000
            parts.append(chunk.data)
            offset += len(chunk.data)
        data = b"".join(parts)
        assert google_crc32c.value(data) == f.crc32c
        (image / f.name).write_bytes(data)
    copied = RowStore.open(image)
    assert copied.flushed_index == meta["snapshot_index"]
    got = pa.Table.from_batches(list(copied.scan(ScanSpec())))
    assert got.to_pydict() == rows(0, 600).to_pydict()
    copied.close()
    for bad, code in [
        ({"file_name": "../superblock"}, grpc.StatusCode.NOT_FOUND),
        ({"file_name": "MANIFEST", "offset": 10**9}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"session_id": "nope", "file_name": "MANIFEST"}, grpc.StatusCode.NOT_FOUND),
    ]:
        req = tpb.FetchDataRequestPB(dest_uuid=server.uuid, session_id=begin.session_id)
        for k, v in bad.items():
            setattr(req, k, v)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await copy.FetchData(req)
        assert _code(e) is code
    await copy.EndTabletCopySession(
        tpb.EndTabletCopySessionRequestPB(dest_uuid=server.uuid, session_id=begin.session_id)
    )
    assert not session_dir.exists()


@with_server
async def test_a_flush_waits_for_its_manifest_fsyncs_off_the_event_loop(server: Server) -> None:
    """A flush's manifest write (file and directory fsyncs, slow on a busy disk) runs in a
    worker thread, and the tablet takes writes while it waits (rowstore.py, Installs). The
    disk here is made slow by holding that write until a Write sent meanwhile has been applied
    and acknowledged; a manifest written on the loop's thread is counted instead of held."""
    await server.create()
    await server.data.Write(write_request(server.uuid, "tablet-1", rows(0, 100)))
    assert server.ts is not None
    replica = server.ts.tablets.get("tablet-1")
    store = replica.store
    assert store is not None
    loop_thread = threading.current_thread()
    on_loop: list[str] = []
    started, release = threading.Event(), threading.Event()
    real_write = store._fs.write_atomic

    def slow_write(path: str, data: bytes) -> None:
        if threading.current_thread() is loop_thread:
            on_loop.append(path)  # the old way: it would block the very Write we wait for
        else:
            started.set()
            release.wait(30)
        real_write(path, data)

    store._fs.write_atomic = slow_write  # type: ignore[method-assign]
    flush = asyncio.create_task(replica.flush())
    while not (started.is_set() or flush.done()):
        await asyncio.sleep(0.01)
    before = store.flushed_index
    w = await server.data.Write(write_request(server.uuid, "tablet-1", rows(100, 200)))
    assert w.rows_applied == 100
    assert store.flushed_index == before  # the manifest is not durable yet: the anchor waits
    release.set()
    await flush
    assert on_loop == [] and started.is_set()
    assert store.flushed_index > before
    assert (await scan_all(server.data, server.uuid, "tablet-1")).num_rows == 200


def _named(req: tpb.WriteRequestPB, client: bytes, seq: int, first: int = 0) -> tpb.WriteRequestPB:
    req.request_id.CopyFrom(
        tpb.WriteRequestIdPB(client_id=client, seq_no=seq, first_incomplete_seq_no=first)
    )
    return req


@run
async def test_a_retried_named_write_is_applied_once_even_across_a_restart(
    tmp_path: Path,
) -> None:
    """A named INSERT sent twice (its reply lost, say) answers the second time with the first
    attempt's outcome and changes nothing; another number is another request. The record is
    rebuilt from the log when the server restarts (docs/design/tablets.md#R6)."""
    me = b"c" * 16
    s = Server(tmp_path / "ts")
    await s.start()
    await s.create()
    first = await s.data.Write(_named(write_request(s.uuid, "tablet-1", rows(0, 10)), me, 1))
    assert (first.rows_applied, list(first.per_row_errors)) == (10, [])
    again = await s.data.Write(_named(write_request(s.uuid, "tablet-1", rows(0, 10)), me, 1))
    assert (again.rows_applied, list(again.per_row_errors)) == (10, [])
    assert again.commit_timestamp == first.commit_timestamp
    other = await s.data.Write(_named(write_request(s.uuid, "tablet-1", rows(5, 10)), me, 2))
    assert other.rows_applied == 0 and len(other.per_row_errors) == 5  # already present
    again2 = await s.data.Write(_named(write_request(s.uuid, "tablet-1", rows(5, 10)), me, 2))
    assert [e.row_index for e in again2.per_row_errors] == [0, 1, 2, 3, 4]  # the same outcome
    assert (await scan_all(s.data, s.uuid, "tablet-1")).num_rows == 10
    await s.stop()
    s2 = Server(tmp_path / "ts")
    await s2.start()
    try:
        await s2.wait_leader("tablet-1")
        after = await s2.data.Write(_named(write_request(s2.uuid, "tablet-1", rows(0, 10)), me, 1))
        assert (after.rows_applied, after.commit_timestamp) == (10, first.commit_timestamp)
        # The client says it waits on nothing below 3: request 1 is forgotten, and a third
        # send of it is a new write (refused row by row: the rows exist).
        await s2.data.Write(_named(write_request(s2.uuid, "tablet-1", rows(20, 21)), me, 3, 3))
        late = await s2.data.Write(_named(write_request(s2.uuid, "tablet-1", rows(0, 10)), me, 1))
        assert late.rows_applied == 0 and len(late.per_row_errors) == 10
        assert (await scan_all(s2.data, s2.uuid, "tablet-1")).num_rows == 11
    finally:
        await s2.stop()


@with_server
async def test_a_malformed_request_id_is_refused_and_changes_nothing(server: Server) -> None:
    await server.create()
    bad = [
        (b"short", 1, 0, "client_id: 5 bytes"),
        (b"c" * 16, 0, 0, "seq_no: 0"),
        (b"c" * 16, 2, 3, "first_incomplete_seq_no 3 is past seq_no 2"),
    ]
    for client, seq, first, message in bad:
        req = _named(write_request(server.uuid, "tablet-1", rows(0, 3)), client, seq, first)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await server.data.Write(req)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (e.value.details() or "")
    txn = _named(write_request(server.uuid, "tablet-1", rows(0, 3)), b"c" * 16, 1)
    txn.txn_id = 7
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await server.data.Write(txn)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "plain write" in (e.value.details() or "")
    assert (await scan_all(server.data, server.uuid, "tablet-1")).num_rows == 0
