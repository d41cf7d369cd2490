"""AddMaster and RemoveMaster on real master and tablet-server processes.

The group grows from 3 masters to 4 (the new one joins with an empty data dir and receives
sys.catalog as a Raft snapshot: the masters snapshot every few entries here) and then shrinks
to that new master alone, removing whichever master leads each time (it hands leadership over
first). Along the way the catalog stays whole, DDL keeps working, and the tablet servers follow
the membership from heartbeat responses: the last master standing, which no tablet server was
configured with, knows every one of them. Bad requests are refused with the right status and
leave the membership unchanged.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.errors import FailedPrecondition, InvalidArgument, NotFound
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT, MasterCluster
from service.testing.mini_cluster import MiniCluster

pytestmark = pytest.mark.integration

SNAPSHOTTING = {
    **FAST_RAFT,
    "raft.snapshot_interval_entries": "5",
    "raft.snapshot_catchup_entries": "0",
}
"""Masters that compact their log after a few entries, so a joining master must be sent a
snapshot (the log it would need is gone)."""


def _list_masters(cluster: MasterCluster, address: str) -> pb.ListMastersResponsePB:
    with cluster.sync_channel(address) as ch:
        return master_pb2_grpc.MasterServiceStub(ch).ListMasters(
            pb.ListMastersRequestPB(), timeout=5
        )


def _connect(cluster: MasterCluster, address: str) -> pb.ConnectToMasterResponsePB:
    with cluster.sync_channel(address) as ch:
        return master_pb2_grpc.MasterServiceStub(ch).ConnectToMaster(
            pb.ConnectToMasterRequestPB(), timeout=5
        )


def _voters(client: SyncClient) -> set[str]:
    return {m.address for m in client.run(client.client.list_masters()) if m.member_type == "VOTER"}


def _wait(pred, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception as e:  # a master may be electing: keep polling
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{what} not within {timeout}s (last error: {last})")


def _heartbeats_ok(http_address: str, master: str) -> float:
    """A tablet server's count of successful heartbeats to `master`, from its /metrics."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        ours = line.startswith("tessera_tserver_heartbeats_total{") and f'"{master}"' in line
        if ours and '"ok"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _rows(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64()), "v": [f"v{i}" for i in range(n)]})


SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
PARTITIONING = PartitionSchema(hash=(HashBucketSchema(("id",), 2),))


def _create(client: SyncClient, name: str) -> None:
    client.call("create_table", name, SCHEMA, PARTITIONING, num_replicas=1)


def test_grow_to_four_then_shrink_to_the_new_master(tmp_path: Path) -> None:
    cluster = MiniCluster(tmp_path, num_tservers=2, master_overrides=SNAPSHOTTING)
    with cluster:
        originals = list(cluster.master_addresses)
        with SyncClient(originals, credentials=cluster.credentials()) as client:
            for i in range(4):  # enough entries that the masters have snapshotted
                _create(client, f"t{i}")
            client.write("t0", _rows(100))

            # Grow: master-4 joins empty and is added; it answers as a non-participant first.
            m4 = cluster.masters.add_master_slot("master-4")
            cluster.masters.start_master("master-4", join=True)
            cluster.masters.wait_ready(["master-4"])
            assert _connect(cluster.masters, m4.address).role == pb.NON_PARTICIPANT
            client.run(client.client.add_master(m4.address, timeout=60))
            assert _voters(client) == {*originals, m4.address}
            own = [
                e
                for e in _list_masters(cluster.masters, m4.address).masters
                if e.instance.instance_seqno
            ]
            assert own[0].member_type == pb.VOTER and own[0].role == pb.FOLLOWER
            # It was sent the catalog as a snapshot: its log starts after the early entries.
            assert "installing snapshot" in m4.log.read_text()
            # Every tablet server heartbeats to it (learned from heartbeat responses) before
            # the masters it was configured with go away.
            for ts in cluster.tservers.values():
                _wait(
                    lambda ts=ts: _heartbeats_ok(ts.http_address, m4.address) > 0,
                    f"{ts.name} heartbeating to master-4",
                )
            # Adding it again is a success that changes nothing (a retried call).
            client.run(client.client.add_master(m4.address, timeout=30))
            assert _voters(client) == {*originals, m4.address}

            # Shrink to master-4 alone, always removing whichever master leads.
            remaining = {*originals}
            while remaining:
                _wait(lambda: client.client.master.leader is not None, "a known leader")
                leader = client.client.master.leader or ""
                victim = leader if leader in remaining else sorted(remaining)[0]
                client.run(client.client.remove_master(victim, timeout=60))
                remaining.discard(victim)
                cluster.masters.kill(cluster.masters.by_address(victim).name)
                assert _voters(client) == {*remaining, m4.address}

            # master-4 leads alone, has the whole catalog, and knows every tablet server,
            # though none was configured with its address (they followed the membership).
            assert _connect(cluster.masters, m4.address).role == pb.LEADER
            with SyncClient([m4.address], credentials=cluster.credentials()) as solo:
                assert {t.name for t in solo.call("list_tables")} >= {f"t{i}" for i in range(4)}
                want = {ts.uuid for ts in cluster.tservers.values()}
                _wait(
                    lambda: want <= {s.uuid for s in solo.call("list_tablet_servers") if s.live},
                    "tablet servers heartbeating to master-4",
                )
                _create(solo, "after")
                solo.write("after", _rows(10))
                got = pa.concat_tables(
                    [
                        pa.Table.from_batches(list(solo.scan_batches(t)))
                        for t in solo.scan_tokens("t0")
                    ]
                )
                assert got.num_rows == 100


@pytest.fixture(scope="module")
def three_masters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterCluster]:
    with MasterCluster(tmp_path_factory.mktemp("membership-errors"), 3) as masters:
        yield masters


def test_bad_membership_requests_are_refused_and_change_nothing(
    three_masters: MasterCluster, tmp_path: Path
) -> None:
    addresses = three_masters.addresses
    with SyncClient(addresses, credentials=three_masters.credentials()) as client:
        _wait(lambda: len(_voters(client)) == 3, "a leader")
        before = _voters(client)
        add, remove = client.client.add_master, client.client.remove_master

        # Nothing listens there.
        stray = three_masters.add_master_slot("stray")
        with pytest.raises(FailedPrecondition, match=f"{stray.address}.*did not answer"):
            client.run(add(stray.address, timeout=20))
        # A uuid that does not match the address.
        with pytest.raises(InvalidArgument, match="uuid"):
            req = pb.AddMasterRequestPB(
                uuid="master-elsewhere-1",
                rpc_address=pb.HostPortPB(host="127.0.0.1", port=int(stray.address.split(":")[1])),
            )
            client.run(client.client.master.ddl("AddMaster", req, 20))
        # No address at all.
        with pytest.raises(InvalidArgument, match="rpc_address"):
            client.run(client.client.master.ddl("AddMaster", pb.AddMasterRequestPB(), 20))
        # A master that bootstrapped a group of its own (started without join_existing).
        loner = MasterCluster(tmp_path / "loner", 1, pki=three_masters.pki)  # the same CA
        with loner:
            _wait(
                lambda: _connect(loner, loner.addresses[0]).role == pb.LEADER, "the loner leading"
            )
            with pytest.raises(FailedPrecondition, match="group of its own"):
                client.run(add(loner.addresses[0], timeout=20))
        # Unknown master to remove.
        with pytest.raises(NotFound, match="no master"):
            client.run(remove("127.0.0.1:1", timeout=20))
        with pytest.raises(NotFound, match="no master"):
            client.run(remove("master-nobody", timeout=20))
        assert _voters(client) == before


SLOW_ELECTIONS = {
    **FAST_RAFT,
    "raft.election_timeout_ms": "4000",
    "raft.election_timeout_max_ms": "8000",
}
"""Masters that wait 4 s before they campaign: beside one with the fast timing, that one wins
every election."""


def test_a_master_down_while_a_new_master_joined_and_took_the_lead_follows_that_leader(
    tmp_path: Path,
) -> None:
    """A master is down while master-4 is added and then wins an election. Restarted, its
    config is the old one, which does not name master-4, and masters take Raft messages only
    from members. A master its config names vouches for master-4 (service/consensus/vouch.py),
    so it follows the new leader and catches up, and the group keeps its quorum when another
    master goes: without it, the four masters would have only three that count."""
    cluster = MiniCluster(tmp_path, num_tservers=1, master_overrides=FAST_RAFT)
    with cluster:
        masters = cluster.masters
        leader, _ = masters.leader()
        stale = next(s for s in masters.masters.values() if s.address != leader)
        others = [s for s in masters.masters.values() if s is not stale]
        masters.kill(stale.name)
        with SyncClient(cluster.master_addresses, credentials=cluster.credentials()) as client:
            _create(client, "before")
            m4 = masters.add_master_slot("master-4")
            masters.start_master("master-4", join=True)
            masters.wait_ready(["master-4"])
            client.run(client.client.add_master(m4.address, timeout=60))
            added_at = _list_masters(masters, m4.address).config_index
            # Every other master restarts with slow elections, so master-4 leads next.
            masters.overrides = SLOW_ELECTIONS
            live = [m4.address, *(s.address for s in others)]
            for s in others:
                cluster.restart(s.name)
                masters.wait_ready([s.name])
                masters.leader(among=live, timeout=60)
            while (current := masters.leader(among=live, timeout=60)[0]) != m4.address:
                cluster.restart(masters.by_address(current).name)
            _create(client, "under-master-4")
            cluster.start_server(stale.name)
            _wait(
                lambda: _list_masters(masters, stale.address).config_index >= added_at,
                "the restarted master learning of master-4",
                timeout=60,
            )
            assert "taken as a member" in stale.log.read_text()
            # It counts toward the quorum now: with one more master gone, DDL still commits.
            masters.kill(others[0].name)
            _create(client, "after")
            assert {t.name for t in client.call("list_tables")} >= {
                "before",
                "under-master-4",
                "after",
            }
