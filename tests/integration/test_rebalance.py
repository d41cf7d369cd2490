"""Rebalancing and replica moves against real processes: 3 masters, 3 + 1 tablet servers.

Two tables (6 and 4 tablets, 3 replicas each) with rows are created on three servers; a fourth,
empty server joins; `tessera cluster rebalance --apply` moves replicas onto it. Afterwards every
table's and the cluster's replica-count skew is at most 1 (from a fresh catalog dump), every
tablet's replicas have equal checksums that match the ones taken before the moves, and the rows
scan back identical. Then `tessera replica move` moves one more replica, and its data arrives.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest

from service.client import TesseraClient
from service.client.client import CatalogDump
from service.client.retry import Backoff, Deadline
from service.common.errors import InvalidArgument, ServiceUnavailable
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.rebalance.rebalancing import Distribution, skew_report
from service.testing.mini_cluster import MiniCluster
from service.tools import rebalance_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("score", ColumnType.DOUBLE)],
    key="id",
)
SIX = PartitionSchema(
    hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(("id",)), split_rows=((1_000,),)
)
FOUR = PartitionSchema(hash=(HashBucketSchema(("id",), 4),), range=RangeSchema(()))


def data(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "score": pa.array([i / 8 for i in ids], pa.float64()),
        }
    )


def voters(t: mpb.TabletRecordPB) -> list[str]:
    return sorted(
        p.permanent_uuid
        for p in t.consensus_state.committed_config.peers
        if p.member_type != mpb.NON_VOTER
    )


def running(dump: CatalogDump) -> list[mpb.TabletRecordPB]:
    return [t for t in dump.tablets if t.state == mpb.TabletRecordPB.RUNNING]


async def checksums(c: TesseraClient) -> dict[str, tuple[int, bytes]]:
    """Per tablet, the (row count, digest) every voter agrees on (asserted), the followers
    asked once they applied what the leader had."""
    dump = await c.dump_catalog()
    addr = {s.uuid: s.address for s in await c.list_tablet_servers()}
    out: dict[str, tuple[int, bytes]] = {}
    for t in running(dump):
        leader = t.consensus_state.leader_uuid
        order = [leader] + [u for u in voters(t) if u != leader]
        assert leader in voters(t), t
        sums = []
        index = 0
        for u in order:
            req = tpb.ChecksumRequestPB(dest_uuid=u, tablet_id=t.tablet_id, min_applied_index=index)
            r = await _checksum(c, addr[u], req)
            index = index or r.applied_index
            sums.append((r.row_count, r.digest))
        assert len(set(sums)) == 1, (t.tablet_id, order, sums)
        out[t.tablet_id] = sums[0]
    return out


async def _checksum(
    c: TesseraClient, address: str, req: tpb.ChecksumRequestPB
) -> tpb.ChecksumResponsePB:
    """One server's Checksum, retried while the server cannot be reached, as a client's
    operations retry: a server busy just after a replica move (a copied tablet opening, a
    flush) may answer a new connection's TLS handshake later than the channel's connect
    timeout, and the call then fails UNAVAILABLE without having reached it."""
    deadline, backoff = Deadline.after(30), Backoff(initial=0.1, cap=1.0)
    while True:
        try:
            r: tpb.ChecksumResponsePB = await c.channels.tserver(address).Checksum(  # type: ignore[misc]
                req, timeout=deadline.attempt_timeout()
            )
            return r
        except ServiceUnavailable:
            if deadline.remaining() < 1.0:
                raise
            await backoff.sleep(deadline)


def skews(dump: CatalogDump, live: set[str]) -> tuple[int, int]:
    dist = Distribution.of(
        [(t.table_id, t.tablet_id, u) for t in running(dump) for u in voters(t)], live
    )
    rep = skew_report(dist)
    return rep.max_table_skew, rep.cluster_skew


async def wait_live(cluster: MiniCluster, n: int) -> None:
    """Until the master leader lists `n` live tablet servers."""
    async with TesseraClient(
        cluster.master_addresses, timeout=30, credentials=cluster.credentials()
    ) as c:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sum(s.live for s in await c.list_tablet_servers()) == n:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"the master never listed {n} live tablet servers")


def test_rebalance_onto_a_new_server_then_move_one_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MiniCluster(tmp_path) as cluster:
        masters = ",".join(cluster.master_addresses)
        creds = ["--credentials", cluster.credentials_dir() or ""]

        async def setup() -> tuple[dict[str, tuple[int, bytes]], pa.Table, pa.Table]:
            await wait_live(cluster, 3)  # the servers are up; the master must have them too
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                await c.create_table("alpha", SCHEMA, SIX, num_replicas=3)
                await c.create_table("beta", SCHEMA, FOUR, num_replicas=3)
                assert not (await c.write("alpha", data(0, 2_000))).errors
                assert not (await c.write("beta", data(0, 1_200))).errors
                alpha = (await c.scan("alpha")).sort_by("id")
                beta = (await c.scan("beta")).sort_by("id")
                assert alpha.num_rows == 2_000 and beta.num_rows == 1_200
                return await checksums(c), alpha, beta

        before, alpha, beta = asyncio.run(setup())
        cluster.add_tserver_slot("ts-4")
        new = cluster.start_tserver("ts-4")

        asyncio.run(wait_live(cluster, 4))
        assert rebalance_cmd.main(["cluster", "rebalance", "--masters", masters, *creds]) == 0
        assert "dry run" in capsys.readouterr().out
        report = ["cluster", "rebalance", "--masters", masters, *creds, "--report-only"]
        report += ["--format", "json"]
        assert rebalance_cmd.main(report) == 0
        doc = json.loads(capsys.readouterr().out)
        assert not doc["before"]["balanced"] and doc["before"]["servers"][new.uuid] == 0
        assert rebalance_cmd.main([*report, "--apply"]) == 2  # exclusive modes: usage error

        apply = ["cluster", "rebalance", "--masters", masters, *creds, "--apply"]
        code = rebalance_cmd.main([*apply, "--max-moves-per-server", "2"])
        out, err = capsys.readouterr()
        assert code == 0, out + err
        assert "0 failed" in out and "after (measured)" in out
        assert rebalance_cmd.main(report) == 0
        assert json.loads(capsys.readouterr().out)["before"]["balanced"]

        async def verify() -> tuple[str, str, str]:
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                dump = await c.dump_catalog()
                live = {s.uuid for s in await c.list_tablet_servers() if s.live}
                assert skews(dump, live) <= (1, 1), skews(dump, live)
                hosted = [u for t in running(dump) for u in voters(t)]
                assert hosted.count(new.uuid) >= 7
                assert all(len(voters(t)) == 3 for t in running(dump))
                assert await checksums(c) == before
                assert (await c.scan("alpha")).sort_by("id").equals(alpha)
                assert (await c.scan("beta")).sort_by("id").equals(beta)
                # A tablet to move by hand, from its leader (which must step down first) to a
                # server without it.
                t = running(dump)[0]
                to = sorted(live - set(voters(t)))[0]
                return t.tablet_id, t.consensus_state.leader_uuid, to

        tablet, src, dst = asyncio.run(verify())
        code = rebalance_cmd.main(
            ["replica", "move", tablet, src, dst, "--masters", masters, *creds]
        )
        out, err = capsys.readouterr()
        assert code == 0, out + err
        assert f"moved from {src} to {dst}" in out

        async def verify_move() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                deadline = time.monotonic() + 30
                while True:
                    dump = await c.dump_catalog()
                    rec = next(t for t in dump.tablets if t.tablet_id == tablet)
                    if dst in voters(rec) and src not in voters(rec):
                        break
                    assert time.monotonic() < deadline, voters(rec)
                    await asyncio.sleep(0.2)
                assert len(voters(rec)) == 3
                assert await checksums(c) == before

        asyncio.run(verify_move())
        # The same move again finds it done (idempotent); a move from a server that holds no
        # replica is refused with exit 1 and the reason.
        assert (
            rebalance_cmd.main(["replica", "move", tablet, src, dst, "--masters", masters, *creds])
            == 0
        )
        code = rebalance_cmd.main(
            ["replica", "move", tablet, "ts-nope", src, "--masters", masters, *creds]
        )
        assert code == 1
        assert "holds no replica" in capsys.readouterr().err


def test_execute_moves_limits_moves_per_server_and_keeps_tablet_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler alone (no cluster): the move itself is replaced by a fake that records
    what runs at once."""
    from service.client import replica_ops
    from service.rebalance.rebalancing import Move

    in_flight: dict[str, int] = {}
    peak: dict[str, int] = {}
    log: list[tuple[str, int]] = []

    async def fake_run(
        client: object, index: int, m: Move, timeout: float
    ) -> replica_ops.MoveResult:
        for s in (m.from_ts, m.to_ts):
            in_flight[s] = in_flight.get(s, 0) + 1
            peak[s] = max(peak.get(s, 0), in_flight[s])
        log.append(("start", index))
        await asyncio.sleep(0.01 * (1 + index % 3))
        for s in (m.from_ts, m.to_ts):
            in_flight[s] -= 1
        log.append(("end", index))
        status = replica_ops.MoveStatus.FAILED if index == 4 else replica_ops.MoveStatus.DONE
        return replica_ops.MoveResult(index, m, status, "fake")

    monkeypatch.setattr(replica_ops, "_run_move", fake_run)
    moves = [
        Move("t1", "T", "a", "d"),
        Move("t2", "T", "b", "e"),
        Move("t3", "T", "c", "d"),
        Move("t1", "T", "d", "e"),  # after move 0 (same tablet)
        Move("t4", "T", "a", "f"),
        Move("t5", "T", "b", "f"),
    ]
    events: list[tuple[int, str]] = []

    async def run(n: int) -> list[replica_ops.MoveResult]:
        return await replica_ops.execute_moves(
            None,  # type: ignore[arg-type]
            moves,
            max_in_flight_per_server=n,
            progress=lambda r: events.append((r.index, r.status.value)),
        )

    for n in (1, 2):
        for record in (in_flight, peak, log, events):
            record.clear()
        results = asyncio.run(run(n))
        assert [r.index for r in results] == list(range(len(moves)))
        assert results[4].status is replica_ops.MoveStatus.FAILED
        assert max(peak.values()) <= n
        assert log.index(("end", 0)) < log.index(("start", 3))
        assert sorted(events) == sorted(
            [(i, "started") for i in range(6)] + [(r.index, r.status.value) for r in results]
        )
    with pytest.raises(InvalidArgument):
        asyncio.run(run(0))


def test_master_add_remove_move_replica_rpcs(tmp_path: Path) -> None:
    """The master's AddReplica/RemoveReplica/MoveReplica (docs/design/tablet_copy.md#R7) on real
    processes: a move to a fourth server lands in the catalog; bad requests are refused naming the
    problem."""
    from service.common.errors import AlreadyExists, FailedPrecondition, NotFound

    with MiniCluster(tmp_path) as cluster:

        async def main() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                await c.create_table(
                    "m", SCHEMA, PartitionSchema(range=RangeSchema(("id",))), num_replicas=3
                )
                await c.write("m", data(0, 2000), "insert")
                (loc,) = await c.table_locations("m")
                cluster.add_tserver_slot("ts-4")
                ts4 = cluster.start_tserver("ts-4")
                cluster.wait_registered()
                leader = loc.leader()
                assert leader is not None
                # Move the leader's own replica: the master steps it down first.
                await c.master.call(
                    "MoveReplica",
                    mpb.MoveReplicaRequestPB(
                        tablet_id=loc.tablet_id, from_ts_uuid=leader.ts_uuid, to_ts_uuid=ts4.uuid
                    ),
                    120,
                )

                async def members() -> set[str]:
                    d = await c.dump_catalog()
                    (t,) = [x for x in d.tablets if x.tablet_id == loc.tablet_id]
                    return {p.permanent_uuid for p in t.consensus_state.committed_config.peers}

                deadline = time.monotonic() + 30
                while leader.ts_uuid in await members():
                    assert time.monotonic() < deadline, "the move never reached the catalog"
                    await asyncio.sleep(0.2)
                assert ts4.uuid in await members() and len(await members()) == 3
                got = await c.scan("m")
                assert got.num_rows == 2000
                with pytest.raises(AlreadyExists):
                    await c.master.call(
                        "AddReplica",
                        mpb.AddReplicaRequestPB(tablet_id=loc.tablet_id, ts_uuid=ts4.uuid),
                        10,
                    )
                with pytest.raises(NotFound):
                    await c.master.call(
                        "RemoveReplica",
                        mpb.RemoveReplicaRequestPB(tablet_id="nope", ts_uuid=ts4.uuid),
                        10,
                    )
                d = await c.dump_catalog()
                (t,) = [x for x in d.tablets if x.tablet_id == loc.tablet_id]
                follower = next(
                    p.permanent_uuid
                    for p in t.consensus_state.committed_config.peers
                    if p.permanent_uuid != t.consensus_state.leader_uuid
                )
                with pytest.raises(FailedPrecondition, match="cas_config_opid_index"):
                    await c.master.call(
                        "RemoveReplica",
                        mpb.RemoveReplicaRequestPB(
                            tablet_id=loc.tablet_id, ts_uuid=follower, cas_config_opid_index=1
                        ),
                        10,
                    )

        asyncio.run(main())
