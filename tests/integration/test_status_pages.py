"""Status pages and /metrics of real master and tablet-server processes (a MiniCluster).

One cluster (3 masters, 3 tablet servers) for the whole module: a table is created through the
master leader, rows are written to one tablet's leader and a scanner is left open; then every
page of the leader master, a follower master and a tablet server is fetched with urllib and
must name the table, its tablets, the servers; /metrics must parse as the Prometheus text
format and carry the families the issue lists, with sensible values.

The helpers (`fetch`, `parse_metrics`, `create_table`) are tests/helpers/status_pages.py's, shared
with the headless browser test (test_status_pages_browser.py) and other integration tests.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from service.common.config import RaftSettings
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema_codec import partition_from_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import SCHEMA, rows, write_request
from tests.helpers.status_pages import (
    create_table,
    fetch,
    metrics_of,
    parse_metrics,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TABLE = "status_events"
MASTER_PAGES = ("/", "/tables", "/tablets", "/tservers", "/tasks")
TSERVER_PAGES = ("/", "/tablets", "/tablet-copies", "/scans")


# --- the cluster -----------------------------------------------------------------------------


@dataclass
class Setup:
    cluster: MiniCluster
    leader: str
    table_id: str
    locations: pb.GetTableLocationsResponsePB
    written_to: str
    """uuid of the tablet server whose leader replica took the rows."""
    scanner_id: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base: Path = tmp_path_factory.mktemp("status")
    with MiniCluster(base) as cluster:
        leader, table_id, locs = create_table(cluster, TABLE, buckets=3, replicas=3)
        first = locs.tablet_locations[0]
        written_to = wait_for("a write accepted", lambda: _write(cluster, first))
        ts = cluster.tserver_by_uuid(written_to)
        with cluster.sync_channel(ts.address) as ch:
            # One page of one row: the scanner stays open for /scans.
            page = tpb_grpc.TabletServerServiceStub(ch).Scan(
                tpb.ScanRequestPB(
                    dest_uuid=written_to,
                    new_scan=tpb.NewScanRequestPB(tablet_id=first.tablet_id),
                    batch_size_bytes=1,
                ),
                timeout=10,
            )
            assert page.has_more_results
        yield Setup(cluster, leader, table_id, locs, written_to, page.scanner_id.hex())


def _rows_of(tablet: pb.TabletLocationsPB, n: int) -> pa.Table:
    """`n` fixture rows whose keys lie in `tablet`'s partition (a tablet takes only its own,
    docs/design/tablets.md#R2), from the lowest ids up."""
    part = partition_from_pb(tablet.partition)
    partitioning = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))
    candidates = rows(0, 20 * n)
    mine = candidates.filter(pa.array(~partitioning.rows_outside(SCHEMA, part, candidates)))
    assert mine.num_rows >= n
    return mine.slice(0, n)


def _write(cluster: MiniCluster, tablet: pb.TabletLocationsPB) -> str | None:
    """Write 500 rows to the tablet's current leader; its uuid (None if none took them). A
    non-leader refuses before proposing, so trying every replica writes the rows once."""
    for r in tablet.replicas:
        with cluster.sync_channel(cluster.tserver_by_uuid(r.ts_uuid).address) as ch:
            data = tpb_grpc.TabletServerServiceStub(ch)
            try:
                data.Write(
                    write_request(r.ts_uuid, tablet.tablet_id, _rows_of(tablet, 500)), timeout=10
                )
                return r.ts_uuid
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:  # NOT_THE_LEADER is UNAVAILABLE
                    raise
    return None


def _tablet_ids(s: Setup) -> list[str]:
    return [t.tablet_id for t in s.locations.tablet_locations]


# --- masters ---------------------------------------------------------------------------------


def test_every_master_writes_its_http_address_to_the_ready_file(setup: Setup) -> None:
    for m in setup.cluster.masters.masters.values():
        assert re.fullmatch(r"127\.0\.0\.1:\d+", m.http_address), m
    for ts in setup.cluster.tservers.values():
        assert re.fullmatch(r"127\.0\.0\.1:\d+", ts.http_address), ts


def test_master_leader_pages_name_the_table_tablets_and_servers(setup: Setup) -> None:
    cluster = setup.cluster
    leader = cluster.masters.by_address(setup.leader)
    pages = {}
    for path in MASTER_PAGES:
        status, content_type, body = fetch(leader.http_address, path)
        assert status == 200, (path, body)
        assert content_type.startswith("text/html")
        pages[path] = body

    home = pages["/"]
    assert leader.uuid in home and "LEADER" in home
    for m in cluster.masters.masters.values():
        assert m.uuid in home and m.address in home
    assert home.count(">FOLLOWER<") == 2
    # Leadership is claimed only as confirmed by a majority (a ReadIndex round per page).
    for path in ("/", "/tables", "/tablets", "/tservers", "/tasks"):
        assert "confirmed by a majority" in pages[path], path

    assert TABLE in pages["/tables"] and setup.table_id in pages["/tables"]
    assert f"/tablets?table={setup.table_id}" in pages["/tables"]
    for tablet_id in _tablet_ids(setup):
        assert tablet_id in pages["/tablets"]

    status, _, per_table = fetch(leader.http_address, f"/tablets?table={setup.table_id}")
    assert status == 200
    for t in setup.locations.tablet_locations:
        assert t.tablet_id in per_table
        for r in t.replicas:
            assert r.ts_uuid in per_table
    assert "HASH(id) 0/3" in per_table and "VOTER" in per_table and ">live<" in per_table
    status, _, _ = fetch(leader.http_address, "/tablets?table=no-such-table")
    assert status == 404

    for ts in cluster.tservers.values():
        assert ts.uuid in pages["/tservers"] and ts.address in pages["/tservers"]
        assert f'href="http://{ts.http_address}/"' in pages["/tservers"]
    assert "Rounds" in pages["/tasks"]


def test_a_follower_master_shows_its_own_view(setup: Setup) -> None:
    follower = next(m for m in setup.cluster.masters.masters.values() if m.address != setup.leader)
    status, _, home = fetch(follower.http_address, "/")
    assert status == 200 and follower.uuid in home and ">FOLLOWER<" in home
    assert "may lag the leader" in home and "confirmed by a majority" not in home
    # The catalog is warm on followers: the table is listed there too.
    wait_for("the table on a follower", lambda: TABLE in fetch(follower.http_address, "/tables")[2])
    _, _, tasks = fetch(follower.http_address, "/tasks")
    assert "not serving as the leader" in tasks
    fam = metrics_of(follower.http_address)
    assert fam["tessera_raft_is_leader"].value(group="sys.catalog") == 0
    assert fam["tessera_master_catalog_loaded"].value() == 0


def test_master_metrics(setup: Setup) -> None:
    leader = setup.cluster.masters.by_address(setup.leader)
    fam = metrics_of(leader.http_address)
    assert fam["tessera_raft_term"].kind == "gauge"
    assert fam["tessera_raft_term"].value(group="sys.catalog") >= 1
    assert fam["tessera_raft_is_leader"].value(group="sys.catalog") == 1
    commit = fam["tessera_raft_commit_index"].value(group="sys.catalog")
    applied = fam["tessera_raft_applied_index"].value(group="sys.catalog")
    assert commit >= applied >= 2  # the no-op and CreateTable at least
    # A leader's election timeout is its check-quorum period: the stretch's cap whenever
    # stretching is on (docs/design/consensus.md#R2). And the transport's traffic with the
    # two other masters.
    timeout = fam["tessera_raft_election_timeout_seconds"].value(group="sys.catalog")
    assert timeout == RaftSettings().election_timeout_max_ms / 1000
    raft_msgs = fam["tessera_raft_messages_total"]
    assert raft_msgs.kind == "counter"
    assert raft_msgs.value(outcome="sent") > 0 and raft_msgs.value(outcome="received") > 0
    # A healthy group's transport drops nothing. Start-up may have lost a message or two to a
    # master not listening yet (a busy machine starts them seconds apart), so the check is
    # that none is dropped now, while heartbeats flow.
    dropped = raft_msgs.value(outcome="dropped")
    assert dropped <= 2
    time.sleep(1.0)
    again = metrics_of(leader.http_address)["tessera_raft_messages_total"]
    assert again.value(outcome="sent") > raft_msgs.value(outcome="sent")
    assert again.value(outcome="dropped") == dropped
    peers = [m.uuid for m in setup.cluster.masters.masters.values() if m.address != setup.leader]
    for peer in peers:
        assert fam["tessera_raft_peer_queued_messages"].value(peer=peer) >= 0
        assert fam["tessera_raft_peer_send_failures"].value(peer=peer) == 0
    assert fam["tessera_master_catalog_loaded"].value() == 1
    assert fam["tessera_master_tables"].value(state="RUNNING") == 1
    assert fam["tessera_master_tablets"].value(state="RUNNING") == 3
    assert fam["tessera_master_tservers"].value(state="live") == 3
    assert fam["tessera_master_tservers"].value(state="dead") == 0
    assert fam["tessera_master_heartbeats_total"].kind == "counter"
    assert fam["tessera_master_heartbeats_total"].value() > 0
    wal = fam["tessera_wal_sync_seconds"]
    assert wal.kind == "histogram" and wal.value("tessera_wal_sync_seconds_count") > 0
    assert wal.value("tessera_wal_sync_seconds_bucket", le="+Inf") == wal.value(
        "tessera_wal_sync_seconds_count"
    )
    rpc = fam["tessera_rpc_requests_total"]
    assert rpc.value(service="MasterServicer", method="CreateTable", code="OK") == 1
    # Heartbeats come on long-lived TSHeartbeatStreams, counted by the heartbeat counter above
    # (an RPC's outcome is counted when it ends); the report gate shed nothing.
    deferred = fam["tessera_master_tablet_reports_deferred_total"]
    assert deferred.kind == "counter" and deferred.value(reason="shed") == 0
    assert deferred.value(reason="unconfirmed") >= 0  # exported (a new leader may defer some)
    # Each of the 3 servers was asked for its full report in a turn; none lapsed.
    turns = fam["tessera_master_full_report_turns_total"]
    assert turns.value(outcome="given") >= 3 and turns.value(outcome="lapsed") == 0
    assert fam["tessera_master_full_report_turns_held"].value() == 0
    assert fam["tessera_master_full_reports_due"].value() == 0
    # Reports made the 3 tablets RUNNING: at least one write, never more entries than writes.
    group = fam["tessera_master_report_writes_total"]
    assert 1 <= group.value(what="entries") <= group.value(what="writes")
    assert rpc.total(service="ConsensusServicer") > 0  # followers' replies reach the leader
    lat = fam["tessera_rpc_duration_seconds"]
    assert lat.kind == "histogram"
    assert lat.value("tessera_rpc_duration_seconds_count", method="CreateTable") == 1

    # RPC counts rise with calls.
    before = rpc.total(method="ListTables")
    with setup.cluster.sync_channel(leader.address) as ch:
        stub = master_pb2_grpc.MasterServiceStub(ch)
        for _ in range(5):
            stub.ListTables(pb.ListTablesRequestPB(), timeout=5)
    after = metrics_of(leader.http_address)["tessera_rpc_requests_total"]
    assert after.total(method="ListTables", code="OK") >= before + 5

    # The table locations cache: the setup's lookups filled it; asking again hits it (unless a
    # heartbeat's report changed one of the tablets in between: then a miss, built and kept).
    lookups = fam["tessera_master_table_locations_cache_lookups_total"]
    assert lookups.kind == "counter" and lookups.value(result="miss") >= 1
    assert fam["tessera_master_table_locations_cache_entries"].value() >= 1
    table = pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_id=setup.table_id))
    with setup.cluster.sync_channel(leader.address) as ch:
        stub = master_pb2_grpc.MasterServiceStub(ch)
        for _ in range(5):
            stub.GetTableLocations(table, timeout=5)
    now = metrics_of(leader.http_address)["tessera_master_table_locations_cache_lookups_total"]
    assert now.total() == lookups.total() + 5
    assert now.value(result="hit") >= lookups.value(result="hit") + 4


# --- tablet servers --------------------------------------------------------------------------


def test_tablet_server_pages_name_the_replicas_masters_and_scanner_but_not_its_id(
    setup: Setup,
) -> None:
    ts = setup.cluster.tserver_by_uuid(setup.written_to)
    pages = {}
    for path in TSERVER_PAGES:
        status, content_type, body = fetch(ts.http_address, path)
        assert status == 200, (path, body)
        assert content_type.startswith("text/html")
        pages[path] = body
    assert ts.uuid in pages["/"]
    for address in setup.cluster.master_addresses:
        assert address in pages["/"]
    assert "LEADER" in pages["/"]  # one master is the leader, as heartbeats tell
    for tablet_id in _tablet_ids(setup):
        assert tablet_id in pages["/tablets"]
    assert TABLE in pages["/tablets"] and setup.table_id in pages["/tablets"]
    assert ">RUNNING<" in pages["/tablets"] and ">500<" in pages["/tablets"]
    assert "no tablet copies to this server" in pages["/tablet-copies"]
    # The open scanner is listed (its tablet, one page of one row), never its id: an id with
    # its call sequence number is enough to continue someone else's scan.
    assert "no open scanners" not in pages["/scans"]
    assert setup.scanner_id not in pages["/scans"]


def test_tablet_server_metrics(setup: Setup) -> None:
    servers = list(setup.cluster.tservers.values())

    def leaders() -> bool:  # scrapes are not one instant: an election may fall in between
        total = sum(
            metrics_of(ts.http_address)["tessera_tserver_leaders"].value() for ts in servers
        )
        return total == 3

    wait_for("one leader per tablet across the servers' metrics", leaders, timeout=20)
    for ts in servers:
        fam = metrics_of(ts.http_address)
        assert fam["tessera_tserver_replicas"].value(state="RUNNING") == 3
        assert fam["tessera_tserver_replicas"].value(state="FAILED") == 0
        for tablet_id in _tablet_ids(setup):
            assert fam["tessera_raft_term"].value(group=tablet_id) >= 1
            assert fam["tessera_raft_commit_index"].value(group=tablet_id) >= 1
        hb = fam["tessera_tserver_heartbeats_total"]
        assert hb.kind == "counter"
        for address in setup.cluster.master_addresses:
            assert hb.value(master=address, result="ok") > 0
        assert fam["tessera_wal_sync_seconds"].value("tessera_wal_sync_seconds_count") > 0
        # The tablets' Raft traffic, counted as a master counts sys.catalog's.
        raft_msgs = fam["tessera_raft_messages_total"]
        assert raft_msgs.value(outcome="sent") > 0 and raft_msgs.value(outcome="received") > 0
        assert raft_msgs.value(outcome="deposed") >= 0
        assert fam["tessera_raft_foreign_batches_total"].value() == 0
        assert fam["tessera_raft_peer_gone_total"].kind == "counter"
        if ts.uuid == setup.written_to:
            assert fam["tessera_tserver_rows_written_total"].value() == 500
            assert fam["tessera_tserver_scan_bytes_total"].value() > 0
            assert fam["tessera_tserver_scanners_open"].value() == 1
            rpc = fam["tessera_rpc_requests_total"]
            assert rpc.value(service="DataServicer", method="Write", code="OK") == 1
            assert rpc.value(service="AdminServicer", method="CreateTablet", code="OK") >= 1


def test_parse_metrics_rejects_garbage() -> None:
    with pytest.raises(AssertionError):
        parse_metrics("# TYPE a counter\na{x=1} 2\n")
    assert parse_metrics('# TYPE a gauge\na{x="q\\"y"} 2\n')["a"].value(x='q"y') == 2
