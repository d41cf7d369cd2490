"""RaftNode, the asyncio shell: three (or four) nodes in one event loop over an in-memory network,
each with a real WAL in tmp_path.

The cluster is tests/helpers/raft_node.py's. Its network delivers on a later loop iteration
(`call_soon`), like a transport would, and can cut links. Timing only ever enters through
"eventually, within N seconds" polling with generous limits; ticks are 10 ms so a whole election
takes a few hundred milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import cast

import pytest

from service.common.errors import (
    Aborted,
    CasMismatch,
    ConfigChangeRejected,
    InvalidArgument,
    IOFatal,
    NotTheLeader,
    ServiceUnavailable,
    Timeout,
)
from service.consensus import turns
from service.consensus.fs import RealFileSystem
from service.consensus.node import WRITE_ON_LOOP_BYTES, NodeSettings, RaftNode
from service.consensus.raft_store import RaftStore
from service.raft import ConfigChangeType, Message, MessageType, NodeId, Role
from service.testing.simdisk import SimFileSystem
from tests.helpers.raft_node import (
    FAST,
    UUIDS,
    WAIT_S,
    Cluster,
    GatedFileSystem,
    KvMachine,
    address,
    eventually,
    run,
)

# --- elections and proposals ----------------------------------------------------------------------


def test_a_leader_is_elected_and_everyone_knows_it(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await eventually(
            lambda: all(n.status().lead == leader.uuid for n in c.nodes.values()),
            "every node follows the leader",
        )
        term = leader.status().term
        assert all(n.status().term == term for n in c.nodes.values())
        assert sorted(r.status().role.value for r in c.nodes.values()) == [
            "FOLLOWER",
            "FOLLOWER",
            "LEADER",
        ]
        assert leader.status().config.voters == frozenset(UUIDS)

    run(tmp_path, scenario)


def test_a_sole_voter_campaigns_at_once_and_others_wait_their_timeout(tmp_path: Path) -> None:
    """A single-voter group (a replication-factor-1 tablet, a one-master catalog) needs no
    one's vote: it leads right after start, and after a restart, long before its election
    timeout (10 s here). A member of a three-voter group still waits its timeout."""
    slow = dataclasses.replace(FAST, election_ticks=1000, election_jitter_ticks=1)

    async def main() -> None:
        for round_ in ("start", "restart"):
            c = Cluster(tmp_path / "one", slow)
            node = await c.start("solo", ["solo"])
            await eventually(
                lambda n=node: n.status().role is Role.LEADER, f"leads after {round_}", timeout=2.0
            )
            assert (await node.propose(b"k=v", timeout=5)) is not None
            await c.close()
        trio = Cluster(tmp_path / "three", slow)
        try:
            for uuid in UUIDS:
                await trio.start(uuid, UUIDS)
            await asyncio.sleep(0.3)
            assert all(n.status().role is Role.FOLLOWER for n in trio.nodes.values())
        finally:
            await trio.close()

    asyncio.run(main())


def test_propose_on_the_leader_returns_the_applied_result_everywhere(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        index = await leader.propose(b"x=1", timeout=WAIT_S)
        assert isinstance(index, int) and index > 0
        # Resolved only once applied here, with the state machine's result.
        assert c.sms[leader.uuid].kv == {"x": "1"}
        assert c.sms[leader.uuid].last_index == index
        assert leader.applied >= index
        await eventually(
            lambda: all(sm.kv == {"x": "1"} for sm in c.sms.values()), "x=1 applied everywhere"
        )
        second = await leader.propose(b"x=2", timeout=WAIT_S)
        assert isinstance(second, int) and second > index
        await eventually(
            lambda: all(sm.kv == {"x": "2"} and sm.last_index == second for sm in c.sms.values()),
            "x=2 applied everywhere at the same index",
        )

    run(tmp_path, scenario)


def test_wait_term_applied_refuses_a_leader_reelected_while_it_waited(tmp_path: Path) -> None:
    """A leader that lost its term while waiting for its no-op, and won a later one, has not
    applied the new term's entries: it answers NotTheLeader (the caller retries) instead of
    returning as if its clock were ready."""

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        raw = leader.raw
        term = raw.term()
        # Its applied entry looks older than its term, so it must wait for the no-op...
        raw.term_at = lambda index: term - 1  # type: ignore[method-assign]

        async def reelected_meanwhile(index: int, timeout: float | None = None) -> None:
            raw.term = lambda: term + 1  # type: ignore[method-assign]

        leader.wait_applied = reelected_meanwhile  # type: ignore[method-assign]
        with pytest.raises(NotTheLeader):
            await leader.wait_term_applied(1.0)

    run(tmp_path, scenario)


def test_propose_and_read_on_a_follower_name_the_leader(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        follower = c.followers(leader)[0]
        await eventually(lambda: follower.status().lead == leader.uuid, "follower knows leader")
        with pytest.raises(NotTheLeader) as ei:
            await follower.propose(b"x=1", timeout=WAIT_S)
        assert ei.value.leader_uuid == leader.uuid
        assert ei.value.leader_address == address(leader.uuid)
        with pytest.raises(NotTheLeader) as ei:
            await follower.read(timeout=WAIT_S)
        assert ei.value.leader_uuid == leader.uuid
        with pytest.raises(NotTheLeader):
            await follower.transfer_leadership(follower.uuid)
        assert all(sm.kv == {} for sm in c.sms.values())

    run(tmp_path, scenario)


def test_read_returns_an_index_covering_every_acknowledged_write(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        for i in range(3):
            written = await leader.propose(f"k{i}=v".encode(), timeout=WAIT_S)
            assert isinstance(written, int)
            index = await leader.read(timeout=WAIT_S)
            assert index >= written
            assert leader.applied >= index  # the barrier waits for the apply too
            assert c.sms[leader.uuid].kv[f"k{i}"] == "v"

    run(tmp_path, scenario)


def test_read_on_an_isolated_leader_does_not_return(tmp_path: Path) -> None:
    """ReadIndex needs a quorum's answer: cut off, the old leader cannot serve a read once its
    lease (half an election timeout after its last confirmed round) has run out."""

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await leader.read(timeout=WAIT_S)  # a confirmed round: the lease starts
        c.net.isolate(leader.uuid)
        assert leader.lease_s > 0
        await leader.read(timeout=0.5)  # within the lease: served (no other leader can exist)
        await asyncio.sleep(leader.lease_s)
        with pytest.raises((Timeout, NotTheLeader)):
            await leader.read(timeout=0.5)
        c.net.heal()
        await c.leader()

    run(tmp_path, scenario)


def test_an_isolated_leader_steps_down_and_logs_its_followers_silence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Check-quorum, and its warning: how many ticks ago each follower was last heard."""
    isolated: list[str] = []

    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        isolated.append(str(leader.uuid))
        c.net.isolate(leader.uuid)
        await eventually(
            lambda: leader.status().role is not Role.LEADER, "the isolated leader steps down"
        )
        c.net.heal()
        await c.leader()

    with caplog.at_level(logging.WARNING, logger="service.consensus.node"):
        run(tmp_path, scenario)
    lines = [r.getMessage() for r in caplog.records if "stepping down in term" in r.message]
    mine = [line for line in lines if f"/{isolated[0]}:" in line]
    assert len(mine) == 1, lines
    # Each follower: "N ticks ago", or "never" if it had not answered this leader yet.
    assert "no quorum heard in the last" in mine[0]
    assert mine[0].count(" ticks ago") + mine[0].count(" never") == 2, mine[0]


def test_group_commit_many_proposals_few_syncs(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        fsyncs = leader.metrics["fsyncs"]
        syncs = leader.store.wal.metrics.syncs
        batches = leader.metrics["batches"]
        follower_syncs = {n.uuid: n.store.wal.metrics.syncs for n in c.followers(leader)}
        n = 200
        results = await asyncio.gather(
            *(leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S) for i in range(n))
        )
        indexes = [r for r in results if isinstance(r, int)]
        # Every proposal got its own index, in proposal order, with no gap.
        assert indexes == list(range(indexes[0], indexes[0] + n))
        assert c.sms[leader.uuid].kv == {f"k{i}": str(i) for i in range(n)}
        assert leader.metrics["fsyncs"] - fsyncs <= n // 20
        assert leader.store.wal.metrics.syncs - syncs <= n // 20
        assert leader.metrics["batches"] - batches <= n // 20
        await eventually(
            lambda: all(len(sm.kv) == n for sm in c.sms.values()), "every node applied all"
        )
        for f in c.followers(leader):
            assert f.store.wal.metrics.syncs - follower_syncs[f.uuid] <= n // 20

    run(tmp_path, scenario)


def test_applies_that_take_turns_stay_whole_and_in_log_order(tmp_path: Path) -> None:
    # A slice so short that every entry with data waits for a new pass of the loop
    # (turns.py): proposals still resolve in order with their own results, and every node
    # applies every entry once, in log order (`check_order`).
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        n = 100
        results = await asyncio.gather(
            *(leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S) for i in range(n))
        )
        indexes = [r for r in results if isinstance(r, int)]
        assert indexes == list(range(indexes[0], indexes[0] + n))
        await eventually(
            lambda: all(len(sm.kv) == n for sm in c.sms.values()), "every node applied all"
        )
        assert turns.shared(1e-9).yields > 0

    run(tmp_path, scenario, settings=dataclasses.replace(FAST, apply_slice_s=1e-9))


def test_a_large_entry_is_written_off_the_loop_and_replicated(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        big = "v" * (WRITE_ON_LOOP_BYTES + 1)
        index = await leader.propose(f"big={big}".encode(), timeout=WAIT_S)
        await eventually(
            lambda: all(sm.kv.get("big") == big for sm in c.sms.values()), "applied everywhere"
        )
        assert all(sm.last_index >= index for sm in c.sms.values())

    run(tmp_path, scenario)


# --- snapshots and restarts -----------------------------------------------------------------------


SNAPPY = NodeSettings(
    tick_interval_s=0.01,
    heartbeat_ticks=2,
    election_ticks=10,
    election_jitter_ticks=10,
    snapshot_interval_entries=50,
    snapshot_catchup_entries=10,
)


async def write_keys(c: Cluster, keys: range, chunk: int = 10) -> RaftNode:
    """Write `keys` (k<i>=<i>, so a key written twice is the same), `chunk` at a time, through
    the leader; the leader at the end. A chunk that loses its leader (an election on a busy
    machine overwrote its entries) is written again through the new one, as a client would."""
    leader = await c.leader()
    for lo in range(keys.start, keys.stop, chunk):
        for _ in range(20):
            done = await asyncio.gather(
                *(
                    leader.propose(f"k{i}={i}".encode(), timeout=WAIT_S)
                    for i in range(lo, min(lo + chunk, keys.stop))
                ),
                return_exceptions=True,
            )
            failed = [e for e in done if isinstance(e, BaseException)]
            if not failed:
                break
            if not all(isinstance(e, Aborted | NotTheLeader | Timeout) for e in failed):
                raise failed[0]
            leader = await c.leader()
        else:
            raise AssertionError(f"keys from {lo}: no leader took them in 20 tries")
    return leader


def test_snapshot_compaction_and_restart_recover_the_same_state(tmp_path: Path) -> None:
    expected = {f"k{i}": str(i) for i in range(130)}

    async def main() -> None:
        c = Cluster(tmp_path, SNAPPY)
        try:
            for uuid in UUIDS:
                await c.start(uuid, UUIDS)
            await write_keys(c, range(130))
            await eventually(lambda: all(sm.kv == expected for sm in c.sms.values()), "all applied")
            # A snapshot taken after the last apply may still be under way in a worker thread.
            interval = SNAPPY.snapshot_interval_entries
            await eventually(
                lambda: all(n.applied - n.last_snapshot_index < interval for n in c.nodes.values()),
                "no snapshot due or under way",
            )
            last = {}
            for uuid, node in c.nodes.items():
                assert node.last_snapshot_index >= 100, uuid
                assert node.storage.first_index() > 1, uuid  # memory log compacted
                assert (tmp_path / uuid / "snapshot").exists()
                last[uuid] = node.last_snapshot_index
            assert sum(n.store.wal.metrics.segments_deleted for n in c.nodes.values()) > 0
            await c.close()

            # Restart every node from its directory alone (no bootstrap): the state machine is
            # restored from the snapshot before the node even starts, then the log replays.
            for uuid in UUIDS:
                await c.start(uuid, None)
                assert c.sms[uuid].restores == 1
                assert c.nodes[uuid].applied == last[uuid]
                assert c.nodes[uuid].status().config.voters == frozenset(UUIDS)
            leader = await c.leader()
            await leader.propose(b"after=restart", timeout=WAIT_S)
            await eventually(
                lambda: all(sm.kv == {**expected, "after": "restart"} for sm in c.sms.values()),
                "restarted nodes converge",
            )
            c.check_order()
        finally:
            await c.close()

    asyncio.run(main())


class GatedSnapshotMachine(KvMachine):
    """Takes its snapshot beside the node's loop (`SlicedSnapshots`), held until `gate` opens."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self.gate = gate
        self.sliced = 0
        self.taking = False

    def apply(self, index: int, data: bytes) -> object:
        if self.taking:
            self.errors.append(f"entry {index} applied during a snapshot")
        return super().apply(index, data)

    async def snapshot_sliced(self) -> bytes:
        self.sliced += 1
        self.taking = True
        try:
            await asyncio.sleep(0.05)  # slices: the loop runs, as with sys.catalog's rows
            await self.gate.wait()
            return self.snapshot()
        finally:
            self.taking = False


def test_a_snapshot_taken_beside_the_loop_holds_applies_not_heartbeats(tmp_path: Path) -> None:
    """The leader takes a snapshot that does not end (a 55 MB catalog on a starved host; the
    followers' end at once): it applies nothing meanwhile, but its heartbeats go on, so its
    followers do not campaign; once the snapshot ends, the writes held apply everywhere. Taken
    on the loop instead, the leader would fall silent and be replaced."""
    expected = {f"k{i}": str(i) for i in range(80)}

    async def main() -> None:
        gates: dict[str, asyncio.Event] = {u: asyncio.Event() for u in UUIDS}

        class GatedCluster(Cluster):
            def machine(self, uuid: str) -> KvMachine:
                return GatedSnapshotMachine(gates[uuid])

        c = GatedCluster(tmp_path, SNAPPY)
        try:
            for uuid in UUIDS:
                await c.start(uuid, UUIDS)
            leader = await c.leader()
            for uuid, gate in gates.items():
                if uuid != leader.uuid:
                    gate.set()
            held = cast(GatedSnapshotMachine, c.sms[leader.uuid])
            writer = asyncio.create_task(write_keys(c, range(80)))
            await eventually(lambda: held.sliced > 0, "the leader snapshotting")
            terms = {u: n.raw.term() for u, n in c.nodes.items()}
            applied = leader.applied
            await asyncio.sleep(20 * SNAPPY.election_ticks * SNAPPY.tick_interval_s)
            assert {u: n.raw.term() for u, n in c.nodes.items()} == terms, "an election"
            assert leader.raw.is_leader() and leader.applied == applied
            assert not writer.done()
            gates[leader.uuid].set()
            await writer
            await eventually(lambda: all(sm.kv == expected for sm in c.sms.values()), "applied")
            interval = SNAPPY.snapshot_interval_entries
            assert all(n.last_snapshot_index >= interval for n in c.nodes.values())
            c.check_order()
        finally:
            for gate in gates.values():
                gate.set()
            await c.close()

    asyncio.run(main())


def test_learner_catches_up_by_snapshot_and_is_promoted(tmp_path: Path) -> None:
    expected = {f"k{i}": str(i) for i in range(120)}

    async def scenario(c: Cluster) -> None:
        leader = await write_keys(c, range(120))
        assert leader.storage.first_index() > 1  # the log start is gone: d needs a snapshot
        d = await c.start("d", None)  # empty config, no bootstrap: waits to be added
        assert d.status().role is Role.NON_PARTICIPANT
        cfg = leader.status().committed_config
        index = await leader.change_config(
            ConfigChangeType.ADD_LEARNER,
            NodeId("d"),
            address=address("d"),
            expected_index=cfg.index,
            timeout=WAIT_S,
        )
        assert index > cfg.index
        await eventually(
            lambda: all("d" in n.status().config.voters for n in c.nodes.values()),
            "d promoted to voter everywhere",
        )
        await eventually(
            lambda: leader.status().committed_config.voters == frozenset({*UUIDS, "d"}),
            "the promotion commits",
        )
        await eventually(lambda: c.sms["d"].kv == expected, "d caught up")
        assert c.sms["d"].restores >= 1  # by snapshot, not by replaying from index 1
        assert d.status().role is Role.FOLLOWER
        # And d takes part from now on.
        await leader.propose(b"with=d", timeout=WAIT_S)
        await eventually(lambda: c.sms["d"].kv.get("with") == "d", "d applies new writes")
        # The change named a config that is no longer the committed one: compare-and-set.
        with pytest.raises(CasMismatch):
            await leader.change_config(
                ConfigChangeType.REMOVE, NodeId("d"), expected_index=cfg.index, timeout=WAIT_S
            )

    run(tmp_path, scenario, settings=SNAPPY)


def test_a_learner_added_without_promote_stays_a_non_voter(tmp_path: Path) -> None:
    """promote=False: a read replica catches up and applies writes but is never made a voter."""

    async def scenario(c: Cluster) -> None:
        leader = await write_keys(c, range(10))
        d = await c.start("d", None)
        cfg = leader.status().committed_config
        await leader.change_config(
            ConfigChangeType.ADD_LEARNER,
            NodeId("d"),
            address=address("d"),
            expected_index=cfg.index,
            timeout=WAIT_S,
            promote=False,
        )
        await leader.propose(b"after=1", timeout=WAIT_S)
        await eventually(lambda: c.sms["d"].kv.get("after") == "1", "d applies new writes")
        for _ in range(20):  # many leader ticks: NodeQuiescence.after_tick runs on each
            await asyncio.sleep(0.05)
        assert "d" in leader.status().committed_config.learners
        assert "d" not in leader.status().config.voters
        assert d.status().role is Role.LEARNER

    run(tmp_path, scenario, settings=SNAPPY)


def test_config_change_compare_and_set(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        committed = leader.status().committed_config.index
        with pytest.raises(CasMismatch, match="stale config"):
            await leader.change_config(
                ConfigChangeType.ADD_LEARNER,
                NodeId("x"),
                address=address("x"),
                expected_index=committed + 7,
                timeout=WAIT_S,
            )
        # Refusals that are not about the CAS are not CasMismatch.
        with pytest.raises(ConfigChangeRejected) as ei:
            await leader.change_config(
                ConfigChangeType.ADD_LEARNER,
                NodeId("b"),
                address=address("b"),
                expected_index=committed,
                timeout=WAIT_S,
            )
        assert type(ei.value) is ConfigChangeRejected
        with pytest.raises(InvalidArgument, match="needs its address"):
            await leader.change_config(
                ConfigChangeType.ADD_LEARNER, NodeId("x"), expected_index=committed
            )
        # A learner that never answers: added (a, b, c commit it), never promoted.
        new_index = await leader.change_config(
            ConfigChangeType.ADD_LEARNER,
            NodeId("x"),
            address=address("x"),
            expected_index=committed,
            timeout=WAIT_S,
        )
        assert leader.status().committed_config.learners == frozenset({"x"})
        assert leader.store.cmeta.addresses["x"] == address("x")  # remembered for restarts
        with pytest.raises(CasMismatch):
            await leader.change_config(
                ConfigChangeType.REMOVE, NodeId("x"), expected_index=committed, timeout=WAIT_S
            )
        await leader.change_config(
            ConfigChangeType.REMOVE, NodeId("x"), expected_index=new_index, timeout=WAIT_S
        )
        assert leader.status().committed_config.members == frozenset(UUIDS)

    run(tmp_path, scenario)


def test_transfer_leadership_moves_the_leader(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        target = c.followers(leader)[0]
        with pytest.raises(InvalidArgument, match="not a voter"):
            await leader.transfer_leadership(NodeId("nobody"))
        await leader.transfer_leadership(target.uuid, timeout=WAIT_S)
        await eventually(lambda: target.status().role is Role.LEADER, "target leads")
        new = await c.leader()
        assert new is target
        with pytest.raises(NotTheLeader) as ei:
            await leader.propose(b"old=leader", timeout=WAIT_S)
        assert ei.value.leader_uuid == target.uuid
        await target.propose(b"new=leader", timeout=WAIT_S)

    run(tmp_path, scenario)


# --- shutdown and failures ------------------------------------------------------------------------


def test_aclose_fails_waiters_and_leaves_no_task_behind(tmp_path: Path) -> None:
    async def scenario(c: Cluster) -> None:
        leader = await c.leader()
        await leader.propose(b"a=1", timeout=WAIT_S)
        c.net.isolate(leader.uuid)  # what it proposes now cannot commit
        pending = asyncio.ensure_future(leader.propose(b"b=2", timeout=WAIT_S))
        await eventually(lambda: leader.metrics["proposals"] == 2, "b=2 appended")
        await c.stop(leader.uuid)
        with pytest.raises(ServiceUnavailable):
            await pending
        with pytest.raises(ServiceUnavailable):
            await leader.propose(b"c=3")
        with pytest.raises(ServiceUnavailable):
            await leader.read()
        await leader.aclose()  # idempotent
        # run() checks that no task is left once the other two are closed as well.

    run(tmp_path, scenario)


def test_aclose_waits_for_a_persist_running_in_its_worker_thread(tmp_path: Path) -> None:
    """The WAL is not thread-safe: closing the store while a Ready is being persisted in a
    worker thread would sync and close the segment under that thread."""

    async def main() -> None:
        c = Cluster(tmp_path)
        fs = GatedFileSystem()
        try:
            node = await c.start("a", ["a"], fs=fs)
            leader = await c.leader()
            assert leader is node
            fs.armed = True
            proposal = asyncio.ensure_future(node.propose(b"k=v", timeout=WAIT_S))
            await eventually(fs.entered.is_set, "the persist blocks in its thread")
            closing = asyncio.ensure_future(c.stop("a"))
            for _ in range(20):
                await asyncio.sleep(0.005)
            assert not closing.done(), "aclose returned while the WAL was still being written"
            fs.release.set()
            await asyncio.wait_for(closing, WAIT_S)
            try:
                result = await proposal  # the loop finished its iteration before it stopped
            except ServiceUnavailable:
                result = None
            assert node.fatal is None
        finally:
            fs.release.set()
            await c.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}
        # The entry whose persist was under way is durable and well-formed.
        store, rec = RaftStore.open(RealFileSystem(), str(tmp_path / "a"), "a", preallocate=False)
        last = rec.storage.entries(rec.storage.last_index(), rec.storage.last_index() + 1)
        assert last[0].data == b"k=v"
        assert result in (None, last[0].index)
        store.close()

    asyncio.run(main())


def test_aclose_stops_the_loop_even_when_a_message_arrives_at_the_same_time(
    tmp_path: Path,
) -> None:
    """A delivery and aclose() in the same loop iteration: the wakeup completes while the stop
    is requested. (On Python 3.11, `asyncio.wait_for` swallows a cancel in exactly that case,
    so a node stopped by cancelling its task would run on and aclose() would never return.)"""

    async def main() -> None:
        # Ticks far apart: no tick timer fires during the test, the loop is parked in its
        # wait for the wakeup event. No config: it never campaigns either.
        c = Cluster(tmp_path, NodeSettings(tick_interval_s=WAIT_S))
        try:
            node = await c.start("a", None)
            for _ in range(5):
                await asyncio.sleep(0)
            hb = Message(MessageType.HEARTBEAT, to=NodeId("a"), frm=NodeId("z"), term=1)

            async def deliver_and_close() -> None:
                node.step([hb])  # the transport delivers ...
                await node.aclose()  # ... and shutdown starts, before the loop runs again

            stopper = asyncio.ensure_future(deliver_and_close())
            done, _ = await asyncio.wait({stopper}, timeout=5.0)
            assert stopper in done, "aclose() did not return: the node loop ran on"
            await stopper
        finally:
            await c.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_a_wal_sync_failure_stops_the_node(tmp_path: Path) -> None:
    async def main() -> None:
        c = Cluster(tmp_path)
        fs = SimFileSystem()
        try:
            node = await c.start("a", ["a"], fs=fs, directory="/data/a")
            await c.leader()
            await node.propose(b"k=1", timeout=WAIT_S)
            fs.fail_next_sync("/wal/")
            with pytest.raises(IOFatal, match="storage failure"):
                await node.propose(b"k=2", timeout=WAIT_S)
            await asyncio.wait_for(node.fatal_event.wait(), WAIT_S)
            assert node.fatal is not None
            with pytest.raises(IOFatal):
                await node.propose(b"k=3")
            assert c.sms["a"].kv == {"k": "1"}
        finally:
            await c.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
