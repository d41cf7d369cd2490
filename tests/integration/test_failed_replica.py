"""A poison entry already in one replica's log, against real processes: that replica fails, its
server and the server's other tablets serve on, and the master replaces it (3-4-3).

The entry is a write whose string offsets point far outside their buffer (poison_log.py; read
unvalidated, it segfaults pyarrow), planted with the WAL's own API into a stopped follower's log
as a committed entry, as an older version that validated less could have left it. When the
server starts, the replay meets it:

  * the replica is FAILED, naming the entry's index and the Arrow validation error, in
    ListTablets, on the /tablets page and in tessera_tserver_replicas{state="FAILED"}; the
    server's replica of another table takes writes and answers reads; a second restart fails
    the replica the same way (never a crash loop);
  * ksck rates the tablet UNDER_REPLICATED, giving the FAILED replica and its error, and the
    leader master counts it (tessera_master_failed_replicas): with three servers there is
    nowhere to put a replacement;
  * a fourth server joins: the master adds a replica there, the leader copies the tablet to it
    and promotes it, the FAILED replica is removed from the config and tombstoned, and ksck is
    clean. Every replica of the new config has the same rows (the poison applied nowhere).

Replica eviction for dead servers keeps its default (5 minutes): the FAILED report alone drives
the re-replication.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster
from service.testing.poison_log import plant_committed_entry, poison_write_entry
from service.testing.tablet_fixtures import ClusterStubs, ipc
from service.tools import ksck_cmd
from service.tools.launcher import ServerProcess
from tests.helpers.status_pages import fetch, metrics_of, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KV = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], key="k")
MASTER = {**FAST_RAFT, "bg_task_interval_ms": "200"}


def _rows(lo: int, hi: int) -> pa.Table:
    return pa.table(
        {"k": pa.array(range(lo, hi), pa.int64()), "v": [f"v{i}" for i in range(lo, hi)]}
    )


def _replicas(cluster: MiniCluster, ts: ServerProcess) -> dict[str, tpb.ReplicaStatusPB]:
    async def ask() -> dict[str, tpb.ReplicaStatusPB]:
        stubs = ClusterStubs(cluster, "")
        try:
            r = await stubs.admin(ts.uuid).ListTablets(
                tpb.ListTabletsRequestPB(dest_uuid=ts.uuid), timeout=5
            )
            return {x.tablet_id: x for x in r.replicas}
        finally:
            await stubs.close()

    return asyncio.run(ask())


def _checksums(
    cluster: MiniCluster, tablet_id: str, uuids: list[str], probe_rows: pa.Table
) -> set[tuple[int, bytes]]:
    """Write `probe_rows` through the tablet's leader, then each replica's (row count, digest)
    once it has applied that write."""

    async def run() -> set[tuple[int, bytes]]:
        stubs = ClusterStubs(cluster, tablet_id)
        try:
            leader = await stubs.leader(uuids)
            w = await stubs.data(leader).Write(
                tpb.WriteRequestPB(
                    dest_uuid=leader,
                    tablet_id=tablet_id,
                    rows=ipc(probe_rows),
                    default_op=tpb.ROW_OP_UPSERT,
                ),
                timeout=10,
            )
            out = set()
            for u in uuids:
                c = await stubs.data(u).Checksum(
                    tpb.ChecksumRequestPB(
                        dest_uuid=u, tablet_id=tablet_id, min_applied_index=w.applied_index
                    ),
                    timeout=30,
                )
                out.add((c.row_count, c.digest))
            return out
        finally:
            await stubs.close()

    return asyncio.run(run())


def test_a_poison_entry_fails_one_replica_and_the_master_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        MiniCluster(tmp_path, num_tservers=3, master_overrides=MASTER) as cluster,
        cluster.client() as client,
    ):
        for name in ("poisoned", "healthy"):
            client.call(
                "create_table", name, KV, PartitionSchema(range=RangeSchema(("k",))), num_replicas=3
            )
            assert client.write(name, _rows(0, 100), "insert").rows_applied == 100
        (token,) = client.scan_tokens("poisoned")
        tablet_id = token.tablet_id
        (healthy,) = client.scan_tokens("healthy")
        # A follower: the tablet takes no write while it is down, so its leader never sends it
        # another entry at the planted index.
        victim = cluster.tserver_by_uuid(next(r.ts_uuid for r in token.replicas if not r.is_leader))
        cluster.kill_tserver(victim.name)
        index = plant_committed_entry(
            victim.data_dir / "tablets" / tablet_id, poison_write_entry(KV, "k", "v")
        )
        cluster.start_tserver(victim.name)

        # The replay fails that replica only, the same way on every start.
        def failed() -> tpb.ReplicaStatusPB | None:
            r = _replicas(cluster, victim).get(tablet_id)
            return r if r is not None and r.state == mpb.REPLICA_FAILED else None

        for start in range(2):
            if start:
                cluster.kill_tserver(victim.name)
                cluster.start_tserver(victim.name)
            status = wait_for("the poisoned replica FAILED", failed)
            assert f"log entry {index} could not be applied" in status.error.message
            assert "Offset invariant failure" in status.error.message
            assert victim.alive
            assert _replicas(cluster, victim)[healthy.tablet_id].state == mpb.REPLICA_RUNNING
            replicas = metrics_of(victim.http_address)["tessera_tserver_replicas"]
            assert replicas.value(state="FAILED") == 1
            page = fetch(victim.http_address, "/tablets")[2]
            assert ">FAILED<" in page and f"log entry {index} could not be applied" in page
            assert "<th>Replicas FAILED</th><td>1</td>" in fetch(victim.http_address, "/")[2]

        # The server's other tablet serves: a write through its leader, read back from the
        # victim's replica once applied there.
        healthy_members = [r.ts_uuid for r in healthy.replicas]
        sums = _checksums(cluster, healthy.tablet_id, healthy_members, _rows(100, 150))
        assert len(sums) == 1 and next(iter(sums))[0] == 150, sums

        # Three servers: nowhere to re-replicate. ksck names the FAILED replica, the master
        # counts it.
        ksck = ["ksck", "--masters", ",".join(cluster.master_addresses), "--timeout", "3"]
        ksck += ["--credentials", cluster.credentials_dir() or ""]
        capsys.readouterr()
        assert ksck_cmd.main(ksck) == 1
        out = capsys.readouterr().out
        assert f"UNDER_REPLICATED  tablet {tablet_id} of poisoned" in out
        assert f"replica on {victim.address} is FAILED" in out
        assert f"log entry {index} could not be applied" in out
        leader_master, _ = cluster.masters.leader()
        leader_http = next(
            m.http_address for m in cluster.masters.masters.values() if m.address == leader_master
        )
        wait_for(
            "the leader master counting the FAILED replica",
            lambda: metrics_of(leader_http)["tessera_master_failed_replicas"].value() == 1,
        )

        # A fourth server: 3-4-3 replaces the FAILED replica, which is then tombstoned.
        ts4 = cluster.add_tserver_slot("ts-4")
        cluster.start_tserver("ts-4")

        def replaced() -> list[str] | None:
            (t,) = client.scan_tokens("poisoned")
            members = sorted(r.ts_uuid for r in t.replicas)
            if victim.uuid not in members and ts4.uuid in members and len(members) == 3:
                return members
            return None

        members = wait_for("the FAILED replica replaced by one on ts-4", replaced, timeout=60)
        wait_for(
            "the FAILED replica tombstoned",
            lambda: _replicas(cluster, victim)[tablet_id].data_state == tpb.TABLET_DATA_TOMBSTONED,
        )
        assert (
            metrics_of(victim.http_address)["tessera_tserver_replicas"].value(state="FAILED") == 0
        )
        wait_for("ksck clean", lambda: ksck_cmd.main(ksck) == 0 or None)
        assert all(ts.alive for ts in cluster.tservers.values())
        sums = _checksums(cluster, tablet_id, members, _rows(100, 101))
        assert len(sums) == 1 and next(iter(sums))[0] == 101, sums
