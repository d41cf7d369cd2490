"""A log entry that does not apply fails its replica, never the server (tablet.py, "Applying
never takes the server down"), in one real tablet server in-process.

A replica that fails while it leads stops leading, so its group elects another leader
(docs/design/tablet_copy.md#R2); and a server whose wall clock is stepped does not fail its
replicas when they flush and compact, but goes on once the clock is right (three servers
in-process, the fault injected into one server's objects).

A poison write planted in a stopped replica's WAL (service/testing/poison_log.py: bytes that
segfault pyarrow if read unvalidated) makes the replay fail that replica, FAILED with the
entry's index and the cause, on every restart, while the server's other replica serves. A write
whose apply raises half way through leaves the row store's files as they were, so the entry is
replayed after a restart instead of being skipped with part of it applied.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import grpc
import pytest

from service.common.config import RaftSettings
from service.common.errors import NotTheLeader, ServiceUnavailable
from service.common.schema import Schema
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.poison_log import plant_committed_entry, poison_write_entry
from service.testing.tablet_fixtures import SCHEMA, rows, scan_all, write_request
from service.tserver import rowstore
from service.tserver.row_ops import WriteBatch
from service.tserver.rowstore import RowStore
from service.tserver.rowstore_memstore import MemStore, OlderVersions
from service.tserver.tablet import ReplicaState, TabletReplica
from tests.helpers.tserver_inproc import Group, Server, run

pytestmark = pytest.mark.timeout(120)


async def _restarted(s: Server, tmp_path: Path) -> Server:
    await s.stop()
    s2 = Server(tmp_path / "ts")
    await s2.start()
    return s2


async def _once_poisoned_failed(s: Server) -> dict[str, Any]:
    """The server's replicas once "poisoned" has replayed as far as its poison entry: a sole
    voter leads at once, and its committed entries are applied after that, so the replica
    runs for a moment before the replay reaches the entry (longer on a busy machine)."""
    for _ in range(600):
        replicas = await s.replicas()
        if replicas["poisoned"].state != mpb.REPLICA_RUNNING:
            return replicas
        await asyncio.sleep(0.05)
    return replicas


@run
async def test_a_poison_entry_in_the_log_fails_its_replica_only_on_every_restart(
    tmp_path: Path,
) -> None:
    s = Server(tmp_path / "ts")
    await s.start()
    await s.create("poisoned")
    await s.create("healthy")
    for tablet in ("poisoned", "healthy"):
        await s.data.Write(write_request(s.uuid, tablet, rows(0, 50)))
    assert s.ts is not None
    tablet_dir = s.ts.tablets.get("poisoned").dir
    await s.stop()
    index = plant_committed_entry(tablet_dir, poison_write_entry(SCHEMA, "id", "name"))

    s = Server(tmp_path / "ts")
    await s.start()
    n = 50
    try:
        for _ in range(2):  # the same on every start: never a crash loop
            await s.wait_leader("healthy")
            replicas = await _once_poisoned_failed(s)
            status = replicas["poisoned"]
            assert status.state == mpb.REPLICA_FAILED
            assert f"log entry {index} could not be applied" in status.error.message
            assert "not a valid Arrow IPC stream" in status.error.message
            assert status.role == mpb.ROLE_UNKNOWN
            assert replicas["healthy"].state == mpb.REPLICA_RUNNING

            # The healthy replica serves writes and reads; the failed one refuses both.
            await s.data.Write(write_request(s.uuid, "healthy", rows(n, n + 10)))
            n += 10
            assert (await scan_all(s.data, s.uuid, "healthy")).num_rows == n
            for call in (
                s.data.Write(write_request(s.uuid, "poisoned", rows(100, 101))),
                scan_all(s.data, s.uuid, "poisoned"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call
                assert e.value.code() is grpc.StatusCode.UNAVAILABLE

            assert s.ts is not None
            tm = s.ts.tablets
            failed = tm.get("poisoned")
            # Reported with its error and without the consensus state its stopped loop froze
            # (a failed leader would still claim to lead); its node takes no more messages.
            report = tm.reported_tablet(failed)
            assert report.state == mpb.REPLICA_FAILED and report.error.message
            assert not report.HasField("consensus_state")
            assert report.role == mpb.ROLE_UNKNOWN and not failed.is_leader()
            assert tm.num_leaders() == 1 and tm.num_live() == 1
            metrics = s.ts.metrics.render()
            assert 'tessera_tserver_replicas{state="FAILED"} 1' in metrics
            assert 'tessera_tserver_replicas{state="RUNNING"} 1' in metrics
            s = await _restarted(s, tmp_path)
        await s.wait_leader("healthy")
        assert (await scan_all(s.data, s.uuid, "healthy")).num_rows == n
    finally:
        await s.stop()


def test_an_apply_that_raises_half_way_writes_nothing_more_and_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_apply_raises_half_way(tmp_path, monkeypatch))


async def _apply_raises_half_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = rowstore.apply_batch

    def half_then_raise(
        mem: MemStore, schema: Schema, batch: WriteBatch, older: OlderVersions, ts: int = 0
    ) -> object:
        half = batch.num_rows // 2
        real(
            mem,
            schema,
            WriteBatch(
                batch.table.slice(0, half), batch.ops[:half], batch.schema_version, batch.column_ids
            ),
            older,
            ts,
        )
        raise RuntimeError("a bug after half the rows went in")

    s = Server(tmp_path / "ts")
    await s.start()
    try:
        await s.create("t")
        await s.data.Write(write_request(s.uuid, "t", rows(0, 10)))
        assert s.ts is not None
        replica = s.ts.tablets.get("t")
        store = replica.store
        assert store is not None
        await replica.flush()
        flushed, files = store.flushed_index, store.data_files()
        monkeypatch.setattr(rowstore, "apply_batch", half_then_raise)
        with pytest.raises(grpc.aio.AioRpcError):
            await s.data.Write(write_request(s.uuid, "t", rows(10, 20)))
        monkeypatch.setattr(rowstore, "apply_batch", real)
        assert replica.state is ReplicaState.FAILED
        assert replica.error is not None
        assert "RuntimeError: a bug after half the rows went in" in str(replica.error)
        # The memstore holds the half-applied entry; none of it may reach the files.
        await replica.flush()
        with pytest.raises(Exception, match="nothing is written after a failed apply"):
            store.flush()
        assert RowStore.open(replica.data_dir).flushed_index == flushed
        assert store.data_files() == files
    finally:
        s = await _restarted(s, tmp_path)
    try:
        await s.wait_leader("t")
        assert (await scan_all(s.data, s.uuid, "t")).num_rows == 20  # replayed, not skipped
    finally:
        await s.stop()


FAST_RAFT = RaftSettings(
    heartbeat_interval_ms=100,
    election_timeout_ms=500,
    election_jitter_ms=200,
    election_timeout_max_ms=1000,
    tick_interval_ms=50,
)


async def _wait_idle_flush(replica: TabletReplica, timeout: float = 30.0) -> None:
    """Until the replica's idle flush (and the compaction after it) is over, or the replica
    FAILED."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        store = replica.store
        if replica.state is ReplicaState.FAILED or (store and store.memstore_rows() == 0):
            await replica.flush()  # waits for the idle flush's compaction to end
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{replica.tablet_id}: neither flushed nor failed in {timeout:.0f}s")


async def _leader_of_new_tablet(group: Group) -> tuple[Server, TabletReplica]:
    """Tablet "t" created on every server of `group`: its leader, and the leader's replica."""
    await group.create("t")
    leader = await group.leader("t")
    assert leader.ts is not None
    return leader, leader.ts.tablets.get("t")


async def _write(s: Server, lo: int, hi: int) -> int:
    """Rows [lo, hi) written through `s`, all applied; their commit timestamp."""
    resp = await s.data.Write(write_request(s.uuid, "t", rows(lo, hi)))
    assert resp.rows_applied == hi - lo and not resp.per_row_errors
    return resp.commit_timestamp


@run
async def test_a_leader_whose_wall_clock_is_stepped_hands_over_and_keeps_its_replica(
    tmp_path: Path,
) -> None:
    # The chaos campaign's clock nemesis set a leader's clock back 797 s: its idle flush asked
    # the clock for the history horizon, got ClockError, and failed the replica, which went on
    # leading while refusing every write until its server restarted. Now the replica stays,
    # the leadership moves to a server whose clock is right, and writes go on meanwhile.
    async with Group(tmp_path, flush_idle_ms=100, raft=FAST_RAFT) as group:
        stepped, replica = await _leader_of_new_tablet(group)
        await _write(stepped, 0, 10)
        clock = replica.settings.clock
        real = clock._raw_wall_us
        clock._raw_wall_us = lambda: real() - 797_000_000  # stepped back, as `date -s` does
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _write(stepped, 10, 20)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # clients retry elsewhere
        assert "moved -797.000 s against its monotonic clock" in str(refused.value.details())
        await _wait_idle_flush(replica)  # the idle flush, and its compaction, ran
        assert replica.state is ReplicaState.RUNNING, replica.error
        leader = await group.leader("t", other_than=stepped)  # handed over
        at = await _write(leader, 10, 20)
        # A snapshot read on the stepped replica is refused as UNAVAILABLE too (a client reads
        # another replica); on the others it reads every acknowledged row.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await scan_all(stepped.data, stepped.uuid, "t", snapshot_timestamp=at)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (await scan_all(leader.data, leader.uuid, "t", snapshot_timestamp=at)).num_rows == 20
        clock._raw_wall_us = real  # set right: the replica serves again
        assert (
            await scan_all(stepped.data, stepped.uuid, "t", snapshot_timestamp=at)
        ).num_rows == 20
        await _write(await group.leader("t"), 20, 30)


@run
async def test_a_leader_whose_flush_fails_stops_and_another_replica_leads(
    tmp_path: Path,
) -> None:
    async with Group(tmp_path, flush_idle_ms=100, raft=FAST_RAFT) as group:
        leader, replica = await _leader_of_new_tablet(group)
        store = replica.store
        assert store is not None

        def disk_full(*_: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        store.write_frozen = disk_full  # type: ignore[method-assign]
        await _write(leader, 0, 10)
        await _wait_idle_flush(replica)
        assert replica.state is ReplicaState.FAILED
        assert "No space left on device" in str(replica.error)
        # The failed replica no longer leads: the other two elect a leader, which takes
        # writes and has every acknowledged row.
        new = await group.leader("t", other_than=leader)
        await _write(new, 10, 20)
        assert (await scan_all(new.data, new.uuid, "t")).num_rows == 20
        states = await leader.replicas()
        assert states["t"].state == mpb.REPLICA_FAILED


@run
async def test_a_transaction_participant_whose_clock_is_stepped_refuses_as_unavailable(
    tmp_path: Path,
) -> None:
    # The coordinator retries a refused prepare or commit; UNAVAILABLE also moves the
    # leadership, so that its retry meets a leader whose clock is right.
    async with Group(tmp_path, raft=FAST_RAFT) as group:
        stepped, replica = await _leader_of_new_tablet(group)
        clock = replica.settings.clock
        real = clock._raw_wall_us
        clock._raw_wall_us = lambda: real() + 600_000_000  # stepped ten minutes ahead
        prepare = tpb.TxnParticipantOpRequestPB(txn_id=7, op=tpb.TxnParticipantOpRequestPB.PREPARE)
        with pytest.raises(ServiceUnavailable, match=r"moved \+600\.\d+ s against its monotonic"):
            await replica.txn_op(prepare, timeout=5)
        commit = tpb.TxnParticipantOpRequestPB(
            txn_id=7, op=tpb.TxnParticipantOpRequestPB.COMMIT, commit_timestamp=clock.last + 1
        )
        with pytest.raises((ServiceUnavailable, NotTheLeader)):  # handed over meanwhile
            await replica.txn_op(commit, timeout=5)
        await group.leader("t", other_than=stepped)  # handed over
        clock._raw_wall_us = real
