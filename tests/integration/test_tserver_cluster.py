"""Real tablet-server processes on loopback (with 3 real masters they heartbeat to): one tablet
replicated on three servers. Rows written are scanned back exactly; replicas converge to equal
checksums; kill -9 of the tablet leader under write load loses no acknowledged row."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from service.common.errors import from_grpc
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster
from service.testing.tablet_fixtures import (
    ClusterStubs,
    create_request,
    rows,
    scan_all,
    write_request,
)
from service.tools.launcher import ServerProcess, log_tail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TABLET = "tablet-x"


async def _create(cluster: MiniCluster, client: ClusterStubs) -> list[str]:
    peers = [(ts.uuid, ts.address) for ts in cluster.tservers.values()]
    for uuid, _ in peers:
        await client.admin(uuid).CreateTablet(create_request(uuid, TABLET, peers))
    return [u for u, _ in peers]


async def _checksums(client: ClusterStubs, uuids: list[str], index: int) -> set[tuple[int, bytes]]:
    out = set()
    for u in uuids:
        # wait_for_ready: a server restarted moments ago may still be in gRPC's reconnect
        # backoff (subchannels are shared process-wide), which fails an RPC at once otherwise.
        r = await client.data(u).Checksum(
            tpb.ChecksumRequestPB(dest_uuid=u, tablet_id=TABLET, min_applied_index=index),
            timeout=30,
            wait_for_ready=True,
        )
        out.add((r.row_count, r.digest))
    return out


def test_write_100k_rows_scan_back_and_replicas_agree(tmp_path: Path) -> None:
    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                last = 0
                for lo in range(0, 100_000, 5_000):

                    async def write(ld: str, lo: int = lo) -> None:
                        nonlocal last
                        # UPSERT: a retry after an unknown outcome is idempotent.
                        resp = await client.data(ld).Write(
                            write_request(ld, TABLET, rows(lo, lo + 5_000), tpb.ROW_OP_UPSERT),
                            timeout=30,
                        )
                        assert not resp.per_row_errors
                        last = resp.applied_index

                    leader = await _on_leader(client, uuids, write)
                got = await scan_all(client.data(leader), leader, TABLET)
                assert got.to_pydict() == rows(0, 100_000).to_pydict()
                sums = await _checksums(client, uuids, last)
                assert len(sums) == 1 and next(iter(sums))[0] == 100_000
                follower = next(u for u in uuids if u != leader)
                got_f = await scan_all(client.data(follower), follower, TABLET)
                assert got_f.num_rows == 100_000
            finally:
                await client.close()

    asyncio.run(main())


def test_kill_tablet_leader_under_load_loses_no_acknowledged_row(tmp_path: Path) -> None:
    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                leader = await client.leader(uuids)
                acked: list[int] = []
                stop = asyncio.Event()

                async def writer(w: int) -> None:
                    nonlocal leader
                    key = w * 1_000_000
                    while not stop.is_set():
                        batch = rows(key, key + 50)
                        target = leader
                        try:
                            resp = await client.data(target).Write(
                                # UPSERT: a retry of a write whose outcome was unknown is
                                # idempotent (an INSERT retry would hit its own rows).
                                write_request(target, TABLET, batch, tpb.ROW_OP_UPSERT),
                                timeout=5,
                            )
                        except grpc.aio.AioRpcError as e:
                            err = from_grpc(e)
                            hint = getattr(err, "leader_uuid", None)
                            if hint and hint in uuids and hint != target:
                                leader = hint
                            else:
                                await asyncio.sleep(0.05)
                                with contextlib.suppress(AssertionError):
                                    leader = await client.leader(
                                        [u for u in uuids if u != target] + [target], timeout=2
                                    )
                            continue  # unknown outcome: the keys are retried, never counted
                        assert not resp.per_row_errors
                        acked.extend(batch.column("id").to_pylist())
                        key += 50

                tasks = [asyncio.create_task(writer(w)) for w in range(4)]
                await asyncio.sleep(2.0)
                victim = cluster.tserver_by_uuid(leader)
                cluster.kill_tserver(victim.name, signal.SIGKILL)
                client.forget(victim.uuid)
                before_kill = len(acked)
                await asyncio.sleep(4.0)
                stop.set()
                await asyncio.gather(*tasks)
                assert len(acked) > before_kill, "no write succeeded after the failover"
                cluster.start_tserver(victim.name)
                client.forget(victim.uuid)
                leader = await client.leader(uuids)
                got = await scan_all(client.data(leader), leader, TABLET)
                ids = set(got.column("id").to_pylist())
                missing = set(acked) - ids
                assert not missing, f"{len(missing)} acknowledged rows lost"
                probe = await client.data(leader).Write(
                    write_request(leader, TABLET, rows(10**9, 10**9 + 1)), timeout=10
                )
                sums = await _checksums(client, uuids, probe.applied_index)
                assert len(sums) == 1, sums
            finally:
                await client.close()

    asyncio.run(main())


def test_rows_helper_is_sorted() -> None:
    t = rows(0, 5)
    assert t.column("id").to_pylist() == sorted(t.column("id").to_pylist())
    assert isinstance(t, pa.Table)


async def _wait_replica(
    client: ClusterStubs, uuid: str, state: int, timeout: float = 60.0
) -> tpb.ReplicaStatusPB:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.aio.AioRpcError):
            resp = await client.admin(uuid).ListTablets(
                tpb.ListTabletsRequestPB(dest_uuid=uuid), timeout=2
            )
            last = {r.tablet_id: r for r in resp.replicas}.get(TABLET)
            if last is not None and last.data_state == state and last.state == mpb.REPLICA_RUNNING:
                return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{uuid} never reached data state {state}: {last}")


async def _add_peer(
    client: ClusterStubs, leader: str, uuid: str, address: str, promote: bool = True
) -> None:
    host, _, port = address.rpartition(":")
    req = tpb.ChangeConfigRequestPB(
        dest_uuid=leader, tablet_id=TABLET, type=tpb.ChangeConfigRequestPB.ADD_PEER
    )
    req.peer.permanent_uuid = uuid
    req.peer.member_type = mpb.NON_VOTER
    req.peer.promote = promote
    req.peer.last_known_addr.host, req.peer.last_known_addr.port = host, int(port)
    await client.admin(leader).ChangeConfig(req, timeout=10)


async def _on_leader(client: Any, uuids: Any, call: Any) -> str:
    """`call(leader)` on the tablet's leader, found again if leadership moved meanwhile (an
    election on a loaded machine answers UNAVAILABLE "not the leader"); the leader used."""
    for attempt in range(10):
        leader: str = await client.leader(uuids)
        try:
            await call(leader)
            return leader
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == 9:
                raise
    raise AssertionError("unreachable")


async def _committed_peers(client: ClusterStubs, leader: str) -> dict[str, mpb.RaftPeerPB]:
    cs = await client.admin(leader).GetConsensusState(
        tpb.GetConsensusStateRequestPB(dest_uuid=leader, tablet_ids=[TABLET])
    )
    return {p.permanent_uuid: p for p in cs.tablets[0].consensus_state.committed_config.peers}


def test_added_peer_is_filled_by_tablet_copy_even_after_a_crash_mid_copy(tmp_path: Path) -> None:
    """3-4: a fourth server added as a non-voter gets the tablet by copy (the leader sends
    StartTabletCopy), is promoted once caught up, and ends with an equal checksum. The first
    copy is killed half-way (COPYING on disk): restart tombstones it, the copy runs again."""

    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                leader = await client.leader(uuids)
                for lo in range(0, 20_000, 5_000):
                    leader = await _on_leader(
                        client,
                        uuids,
                        lambda ld, lo=lo: client.data(ld).Write(
                            write_request(ld, TABLET, rows(lo, lo + 5_000)), timeout=30
                        ),
                    )
                ts4 = cluster.add_tserver_slot("ts-4")
                cluster.start_tserver("ts-4", env={"TESSERA_FAILPOINT_COPY_PAUSE_S": "30"})
                leader = await _on_leader(
                    client, uuids, lambda ld: _add_peer(client, ld, ts4.uuid, ts4.address)
                )
                tablet_dir = ts4.data_dir / "tablets" / TABLET
                deadline = time.monotonic() + 30
                while not (tablet_dir / "superblock").exists():
                    assert time.monotonic() < deadline, "no copy started"
                    await asyncio.sleep(0.1)
                cluster.kill_tserver("ts-4")
                client.forget(ts4.uuid)
                cluster.start_tserver("ts-4")
                status = await _wait_replica(client, ts4.uuid, tpb.TABLET_DATA_READY)
                assert status.row_count >= 0
                # promoted to voter once caught up
                deadline = time.monotonic() + 30
                while True:
                    cs = await client.admin(leader).GetConsensusState(
                        tpb.GetConsensusStateRequestPB(dest_uuid=leader, tablet_ids=[TABLET])
                    )
                    voters = {
                        p.permanent_uuid
                        for p in cs.tablets[0].consensus_state.committed_config.peers
                        if p.member_type == mpb.VOTER
                    }
                    if ts4.uuid in voters:
                        break
                    assert time.monotonic() < deadline, f"not promoted: {cs}"
                    await asyncio.sleep(0.1)
                probe = await client.data(leader).Write(
                    write_request(leader, TABLET, rows(50_000, 50_001)), timeout=10
                )
                sums = await _checksums(client, [*uuids, ts4.uuid], probe.applied_index)
                assert sums == {(20_001, next(iter(sums))[1])}
            finally:
                await client.close()

    asyncio.run(main())


async def _with_a_read_replica(
    cluster: MiniCluster, client: ClusterStubs
) -> tuple[list[str], ServerProcess]:
    """The tablet on three servers with 2,000 rows, and a fourth server ("ts-4") added as a
    non-voter without promote (a read replica) that holds the copy; (the voters, ts-4)."""
    uuids = await _create(cluster, client)
    await _on_leader(
        client,
        uuids,
        lambda ld: client.data(ld).Write(write_request(ld, TABLET, rows(0, 2_000)), timeout=30),
    )
    ts4 = cluster.add_tserver_slot("ts-4")
    cluster.start_tserver("ts-4")
    await _on_leader(
        client, uuids, lambda ld: _add_peer(client, ld, ts4.uuid, ts4.address, promote=False)
    )
    await _wait_replica(client, ts4.uuid, tpb.TABLET_DATA_READY)
    return uuids, ts4


def test_non_voter_added_without_promote_is_not_promoted(tmp_path: Path) -> None:
    """ADD_PEER of a NON_VOTER with promote=false (a read replica): the leader copies the
    tablet to it and it catches up, but it stays a non-voter (reported with promote=false)
    until an explicit PROMOTE_PEER."""

    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids, ts4 = await _with_a_read_replica(cluster, client)
                probes: list[tpb.WriteResponsePB] = []

                async def probe_write(ld: str) -> None:
                    probes.append(
                        await client.data(ld).Write(
                            write_request(ld, TABLET, rows(2_000, 2_001)), timeout=10
                        )
                    )

                leader = await _on_leader(client, uuids, probe_write)
                probe = probes[-1]
                # Caught up: it has applied a write made after it joined ...
                sums = await _checksums(client, [leader, ts4.uuid], probe.applied_index)
                assert sums == {(2_001, next(iter(sums))[1])}
                # ... and a caught-up learner with `promote` would be a voter by now.
                await asyncio.sleep(2.0)
                peer = (await _committed_peers(client, leader))[ts4.uuid]
                assert peer.member_type == mpb.NON_VOTER and not peer.promote, peer

                async def promote(ld: str) -> None:
                    req = tpb.ChangeConfigRequestPB(
                        dest_uuid=ld, tablet_id=TABLET, type=tpb.ChangeConfigRequestPB.PROMOTE_PEER
                    )
                    req.peer.permanent_uuid = ts4.uuid
                    await client.admin(ld).ChangeConfig(req, timeout=10)

                leader = await _on_leader(client, uuids, promote)
                assert (await _committed_peers(client, leader))[ts4.uuid].member_type == mpb.VOTER
            finally:
                await client.close()

    asyncio.run(main())


def test_follower_behind_the_leaders_log_catches_up_by_a_copy_of_the_files(
    tmp_path: Path,
) -> None:
    """A follower that missed entries the leader has since dropped from its log (anchored at
    its flushed index once 100k rows were flushed) needs the tablet's files: a tablet's Raft
    snapshot is only an anchor and is never sent, so the leader copies the tablet to the
    follower (StartTabletCopy onto the running, lagging replica). The files (about 4 MB) are
    more than one message may carry (`rpc.max_message_bytes` = 2 MiB) and go in chunks; the
    follower then catches up from the log and the replicas agree."""
    overrides = {
        **FAST_TSERVER,
        "raft.snapshot_catchup_entries": "5",
        "rpc.max_message_bytes": str(2 << 20),
    }

    async def main() -> None:
        with MiniCluster(tmp_path, tserver_overrides=overrides) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                leader = await client.leader(uuids)
                first = await client.data(leader).Write(
                    write_request(leader, TABLET, rows(0, 2_000), tpb.ROW_OP_UPSERT), timeout=30
                )
                # Every replica holds the first rows: the follower stopped below has
                # acknowledged entries (its match is past 0) before it falls behind.
                await _checksums(client, uuids, first.applied_index)
                follower = next(u for u in uuids if u != leader)
                lagger = cluster.tserver_by_uuid(follower)
                cluster.kill_tserver(lagger.name)
                client.forget(follower)
                last = 0
                for lo in range(2_000, 120_000, 2_000):  # 59 entries, about 4 MB of rows

                    async def write(ld: str, lo: int = lo) -> None:
                        nonlocal last
                        resp = await client.data(ld).Write(
                            write_request(ld, TABLET, rows(lo, lo + 2_000), tpb.ROW_OP_UPSERT),
                            timeout=30,
                        )
                        last = resp.applied_index

                    await _on_leader(client, [u for u in uuids if u != follower], write)
                cluster.start_tserver(lagger.name)
                # Until the copy is done the follower's replica answers UNAVAILABLE (being
                # replaced, copying, starting).
                deadline = time.monotonic() + 60
                while True:
                    try:
                        sums = await _checksums(client, uuids, last)
                        break
                    except grpc.aio.AioRpcError as e:
                        if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)
                assert sums == {(120_000, next(iter(sums))[1])}, sums
                copies = await client.admin(follower).ListTabletCopies(
                    tpb.ListTabletCopiesRequestPB(dest_uuid=follower)
                )
                assert [(c.tablet_id, c.state) for c in copies.copies] == [(TABLET, "DONE")]
            finally:
                await client.close()

    asyncio.run(main())


def test_a_quiesced_tablet_stops_heartbeating_and_fails_over_when_its_leader_dies(
    tmp_path: Path,
) -> None:
    """Quiescence (consensus/quiesce.py) with real servers: an idle tablet's three replicas stop
    ticking, and after kill -9 of the leader's server the other two hear no more digests from
    it, wake, elect a leader and take writes; nothing acknowledged is lost. Restarted, the
    victim catches up and the group quiesces again."""
    from tests.helpers.status_pages import metrics_of

    def quiesced(ts: Any) -> bool:
        fam = metrics_of(ts.http_address).get("tessera_raft_quiesced")
        return fam is not None and fam.total(group=TABLET) == 1.0

    async def all_quiesced(servers: list[Any], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(done := [await asyncio.to_thread(quiesced, ts) for ts in servers]):
            if time.monotonic() >= deadline:
                # What the next reader needs to tell a slow group from a stuck one.
                awake = [ts for ts, ok in zip(servers, done, strict=True) if not ok]
                raise AssertionError(
                    f"the idle tablet did not quiesce on {[ts.name for ts in awake]} within "
                    f"{timeout:.0f} s; their logs end:\n"
                    + "\n".join(f"--- {ts.name}\n{log_tail(ts.log, limit=2000)}" for ts in awake)
                )
            await asyncio.sleep(0.2)

    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                leader = await client.leader(uuids)
                await client.data(leader).Write(write_request(leader, TABLET, rows(0, 100)))
                servers = list(cluster.tservers.values())
                await all_quiesced(servers)

                victim = cluster.tserver_by_uuid(leader)
                cluster.kill_tserver(victim.name, signal.SIGKILL)
                client.forget(victim.uuid)
                killed = time.monotonic()
                rest = [u for u in uuids if u != victim.uuid]
                new = await client.leader(rest, timeout=30)
                failover_s = time.monotonic() - killed
                # Silence for an election timeout (0.5 s in FAST_TSERVER), then an election.
                assert failover_s < 15, failover_s
                resp = await client.data(new).Write(write_request(new, TABLET, rows(100, 200)))
                assert not resp.per_row_errors
                got = await scan_all(client.data(new), new, TABLET)
                assert got.to_pydict() == rows(0, 200).to_pydict()
                # A group with a dead member keeps ticking (the leader's progress for it is
                # behind); once the victim is back and caught up, all three quiesce again.
                cluster.start_tserver(victim.name)
                client.forget(victim.uuid)
                await all_quiesced(list(cluster.tservers.values()))
            finally:
                await client.close()

    asyncio.run(main())


def test_a_member_whose_replica_was_tombstoned_is_copied_back_by_the_leader(
    tmp_path: Path,
) -> None:
    """A member of the config whose server lost the replica while the server lives on (an
    operator's DeleteTablet; or a stale tombstone from the master landing just after a move
    re-added it) drops every message for the group, so the leader hears nothing from it. The
    leader copies the tablet to it again, as it does for a peer that never had it, whether
    the member is a voter or a non-voter (a learner is the case a move races with); it had
    acknowledged entries before, so it is not a peer that "acknowledged nothing"."""

    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids, ts4 = await _with_a_read_replica(cluster, client)
                leader = await client.leader(uuids)
                follower = next(u for u in uuids if u != leader)
                n = 2_000
                probes: list[tpb.WriteResponsePB] = []

                async def probe_write(ld: str) -> None:
                    resp = await client.data(ld).Write(
                        write_request(ld, TABLET, rows(n, n + 1)), timeout=10
                    )
                    assert not resp.per_row_errors, resp
                    probes.append(resp)

                for victim in (follower, ts4.uuid):
                    # The victim has acknowledged entries (its match is past 0) ...
                    leader = await _on_leader(client, uuids, probe_write)
                    n += 1
                    await _checksums(client, [victim], probes[-1].applied_index)
                    # ... and, idle for longer than quiesce_idle_ms (1 s), the group has most
                    # likely quiesced, its leader asleep, when the victim's server loses the
                    # replica (quiesce.py: "A lost replica").
                    await asyncio.sleep(3.0)
                    await client.admin(victim).DeleteTablet(
                        tpb.DeleteTabletRequestPB(
                            dest_uuid=victim,
                            tablet_id=TABLET,
                            delete_type=tpb.TABLET_DATA_TOMBSTONED,
                            reason="test: lost while a member",
                        ),
                        timeout=10,
                    )
                    await _wait_replica(client, victim, tpb.TABLET_DATA_READY)
                    leader = await _on_leader(client, uuids, probe_write)
                    n += 1
                    sums = await _checksums(client, [*uuids, ts4.uuid], probes[-1].applied_index)
                    assert sums == {(n, next(iter(sums))[1])}, (victim, sums)
                    peers = await _committed_peers(client, leader)
                    assert set(peers) == {*uuids, ts4.uuid}
                    assert peers[ts4.uuid].member_type == mpb.NON_VOTER
            finally:
                await client.close()

    asyncio.run(main())


async def _wait_voter(client: ClusterStubs, uuids: list[str], uuid: str) -> str:
    """Wait until `uuid` is a voter of the tablet's committed config; the leader that says so."""
    deadline = time.monotonic() + 60
    while True:
        leader = await client.leader(uuids)
        peers = await _committed_peers(client, leader)
        if uuid in peers and peers[uuid].member_type == mpb.VOTER:
            return leader
        assert time.monotonic() < deadline, f"{uuid} not promoted: {peers}"
        await asyncio.sleep(0.1)


async def _join_and_lead(
    cluster: MiniCluster, client: ClusterStubs, voters: list[str]
) -> tuple[ServerProcess, list[str]]:
    """A new server "ts-4" added to the tablet whose voters are `voters`, promoted, and made its
    leader; (ts-4, the members now)."""
    ts4 = cluster.add_tserver_slot("ts-4")
    cluster.start_tserver("ts-4")
    await _on_leader(client, voters, lambda ld: _add_peer(client, ld, ts4.uuid, ts4.address))
    members = [*voters, ts4.uuid]
    leader = await _wait_voter(client, members, ts4.uuid)
    if leader != ts4.uuid:
        await client.admin(leader).LeaderStepDown(
            tpb.LeaderStepDownRequestPB(
                dest_uuid=leader, tablet_id=TABLET, new_leader_uuid=ts4.uuid
            ),
            timeout=10,
        )
    deadline = time.monotonic() + 30
    while await client.leader(members) != ts4.uuid:
        assert time.monotonic() < deadline, "ts-4 did not take the lead"
        await asyncio.sleep(0.1)
    return ts4, members


def test_a_copy_from_a_leader_that_joined_after_the_last_row_names_that_leader(
    tmp_path: Path,
) -> None:
    """The rows were written before ts-4 joined; ts-4 then leads and copies the tablet to a
    fifth server. The copy's image is at the flushed index and the new replica's config is the
    one as of that index: had the flush stopped at the last row, that config would not name
    ts-4, the new replica would refuse its leader's messages as a non-member's, and it would
    never catch up or be promoted."""

    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                await _on_leader(
                    client,
                    uuids,
                    lambda ld: client.data(ld).Write(
                        write_request(ld, TABLET, rows(0, 2_000)), timeout=30
                    ),
                )
                ts4, members = await _join_and_lead(cluster, client, uuids)
                ts5 = cluster.add_tserver_slot("ts-5")
                cluster.start_tserver("ts-5")
                await _add_peer(client, ts4.uuid, ts5.uuid, ts5.address)
                await _wait_voter(client, members, ts5.uuid)
                probe = await client.data(ts4.uuid).Write(
                    write_request(ts4.uuid, TABLET, rows(2_000, 2_001)), timeout=10
                )
                sums = await _checksums(client, [*members, ts5.uuid], probe.applied_index)
                assert sums == {(2_001, next(iter(sums))[1])}
            finally:
                await client.close()

    asyncio.run(main())


def test_a_replica_that_was_down_while_a_new_server_took_the_lead_follows_that_leader(
    tmp_path: Path,
) -> None:
    """A follower is down while ts-4 joins the tablet and takes the lead. Restarted, its config
    is the old one, which does not name ts-4, and a replica takes Raft messages (and copies)
    only from members. A member its config names vouches for ts-4 (service/tserver/vouch.py),
    so it follows its leader and catches up, instead of refusing it forever."""

    async def main() -> None:
        with MiniCluster(tmp_path) as cluster:
            client = ClusterStubs(cluster, TABLET)
            try:
                uuids = await _create(cluster, client)
                leader = await _on_leader(
                    client,
                    uuids,
                    lambda ld: client.data(ld).Write(
                        write_request(ld, TABLET, rows(0, 2_000)), timeout=30
                    ),
                )
                stale = cluster.tserver_by_uuid(next(u for u in uuids if u != leader))
                cluster.kill_tserver(stale.name)
                client.forget(stale.uuid)
                live = [u for u in uuids if u != stale.uuid]
                ts4, members = await _join_and_lead(cluster, client, live)
                await client.data(ts4.uuid).Write(
                    write_request(ts4.uuid, TABLET, rows(2_000, 3_000)), timeout=30
                )
                cluster.start_tserver(stale.name)
                probe = await client.data(ts4.uuid).Write(
                    write_request(ts4.uuid, TABLET, rows(3_000, 3_001)), timeout=30
                )
                # The restarted replica answers UNAVAILABLE while it is replaced by a copy.
                deadline = time.monotonic() + 90
                while True:
                    try:
                        sums = await _checksums(client, [*members, stale.uuid], probe.applied_index)
                        break
                    except grpc.aio.AioRpcError as e:
                        retry = e.code() in (
                            grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                        )
                        if not retry or time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)
                assert sums == {(3_001, next(iter(sums))[1])}, sums
                assert (await _committed_peers(client, ts4.uuid))[stale.uuid].member_type == (
                    mpb.VOTER
                )
            finally:
                await client.close()

    asyncio.run(main())
