"""Tablet servers guard their data, on a real secured cluster, against a careless client and a
bad member of the cluster:

* a row sent to a tablet whose partition does not hold its key is refused, row by row, for
  every operation kind (docs/design/tablets.md#R2): the table never holds a key twice;
* one member tablet server's own certificate cannot move a tablet's membership or leader, and
  a master restart after its claim tombstones nothing (docs/design/catalog.md#R15);
* a tablet server's certificate reads and writes no table, and a master's only changes the
  replicas of the cluster it belongs to (docs/design/security.md#R12).

Each of these worked against the code before the rules above: 100 rows written to one tablet
of a 6-bucket table left 86 keys twice; a forged report got both healthy replicas tombstoned;
a server certificate wrote 2,000 rows into a tablet it did not host.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest

from service.common.errors import (
    CasMismatch,
    InvalidAuthzToken,
    NotFound,
    NotTheLeader,
    PermissionDenied,
    TesseraError,
    from_grpc,
)
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_from_pb
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
HASHED = PartitionSchema(hash=(HashBucketSchema(("id",), 6),), range=RangeSchema(()))
RANGED = PartitionSchema(range=RangeSchema(("id",)), split_rows=((50,),))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("integrity")) as c:
        with c.client() as admin:
            admin.call("create_table", "hashed", SCHEMA, HASHED, num_replicas=3)
            admin.call("create_table", "ranged", SCHEMA, RANGED, num_replicas=3)
            admin.call("create_table", "lone", SCHEMA, PartitionSchema(), num_replicas=1)
            admin.call("create_table", "victim", SCHEMA, PartitionSchema(), num_replicas=3)
            admin.write("victim", _rows(range(10)))
            for table in ("hashed", "ranged"):
                admin.call("grant", table, "mallory", ["read", "write"])
        yield c


def _rows(ids: Any) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _creds(cluster: MiniCluster, role: str, name: str) -> Credentials:
    creds = cluster.credentials(role, name)
    assert creds is not None
    return creds


def _locations(
    cluster: MiniCluster, creds: Credentials, table: str
) -> pb.GetTableLocationsResponsePB:
    deadline = time.monotonic() + 30
    while True:
        leader = cluster.masters.leader()[0]
        try:
            with open_sync_channel(leader, creds, role="master") as ch:
                return master_pb2_grpc.MasterServiceStub(ch).GetTableLocations(
                    pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_name=table)),
                    timeout=10,
                )
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _address(r: pb.TabletLocationsPB.ReplicaPB) -> str:
    return f"{r.rpc_address.host}:{r.rpc_address.port}"


def _leader(t: pb.TabletLocationsPB) -> pb.TabletLocationsPB.ReplicaPB:
    return next(r for r in t.replicas if r.role == pb.LEADER)


def _on_leader(
    cluster: MiniCluster,
    creds: Credentials,
    table: str,
    tablet_id: str,
    fn: Callable[[pb.TabletLocationsPB.ReplicaPB], Any],
) -> Any:
    """`fn(leader)` on the tablet's leader, found again (as a client would) while the one the
    locations named has lost its leadership: on a busy machine a tablet may re-elect between
    the lookup and the call. A refused call applied nothing, so it is safe to send again."""
    deadline = time.monotonic() + 60
    while True:
        loc = _locations(cluster, creds, table)
        tablet = next(t for t in loc.tablet_locations if t.tablet_id == tablet_id)
        leader = next((r for r in tablet.replicas if r.role == pb.LEADER), None)
        try:
            if leader is not None:
                return fn(leader)
        except grpc.RpcError as e:
            if not isinstance(from_grpc(e), NotTheLeader) or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"tablet {tablet_id} had no leader within 60 s")
        time.sleep(0.2)


def _call(address: str, creds: Credentials, fn: Callable[[grpc.Channel], Any]) -> Any:
    with open_sync_channel(address, creds, role="tserver") as ch:
        grpc.channel_ready_future(ch).result(timeout=10)
        return fn(ch)


def _refused(address: str, creds: Credentials, fn: Callable[[grpc.Channel], Any]) -> TesseraError:
    with pytest.raises(grpc.RpcError) as e:
        _call(address, creds, fn)
    return from_grpc(e.value)


def _scan_ids(cluster: MiniCluster, table: str) -> list[int]:
    with cluster.client() as c:
        return sorted(c.call("scan", table).column("id").to_pylist())


# --- 1. rows stay in their partition ---------------------------------------------------------


@pytest.mark.parametrize("table", ["hashed", "ranged"])
@pytest.mark.parametrize(
    "op",
    [
        tpb.ROW_OP_UPSERT,
        tpb.ROW_OP_INSERT,
        tpb.ROW_OP_INSERT_IGNORE,
        tpb.ROW_OP_UPDATE,
        tpb.ROW_OP_DELETE,
    ],
)
def test_rows_outside_a_tablets_partition_are_refused_row_by_row(
    cluster: MiniCluster, table: str, op: int
) -> None:
    """A user with the write grant sends keys 0..99 to ONE tablet: only the keys of that
    tablet's partition are applied, every other row gets OUTSIDE_PARTITION naming its key, and
    after an ordinary upsert of the same keys the table holds each key once."""
    mallory = _creds(cluster, "user", "mallory")
    loc = _locations(cluster, mallory, table)
    ps = HASHED if table == "hashed" else RANGED
    if table == "hashed":
        keys = list(range(1000 * op, 1000 * op + 100))
    else:  # fresh keys for each op kind, half in each range: (-inf, 50) and [50, inf)
        keys = [-1000 * op - k for k in range(50)] + [1000 * op + 50 + k for k in range(50)]
    tablet = loc.tablet_locations[0]
    partition = partition_from_pb(tablet.partition)
    data = _rows(keys)
    inside = np.array([partition.contains(k) for k in ps.partition_keys_for_arrow(SCHEMA, data)])
    assert 0 < inside.sum() < 100

    if op in (tpb.ROW_OP_UPDATE, tpb.ROW_OP_DELETE):
        with cluster.client() as admin:  # rows for UPDATE and DELETE to find
            admin.write(table, data, "upsert")

    def write(leader: pb.TabletLocationsPB.ReplicaPB) -> Any:
        return _call(
            _address(leader),
            mallory,
            lambda ch: tserver_pb2_grpc.TabletServerServiceStub(ch).Write(
                tpb.WriteRequestPB(
                    dest_uuid=leader.ts_uuid,
                    tablet_id=tablet.tablet_id,
                    rows=_ipc(data),
                    default_op=op,
                    authz_token=loc.authz_token,
                ),
                timeout=20,
            ),
        )

    resp = _on_leader(cluster, mallory, table, tablet.tablet_id, write)
    errors = {e.row_index: e.error for e in resp.per_row_errors}
    assert sorted(errors) == [i for i in range(100) if not inside[i]]
    assert {e.code for e in errors.values()} == {"OUTSIDE_PARTITION"}
    i = min(errors)
    assert f"key (id={keys[i]})" in errors[i].message and "partition" in errors[i].message
    assert resp.rows_applied == inside.sum()

    with cluster.client() as admin:
        admin.write(table, data, "upsert")
    ids = _scan_ids(cluster, table)
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    assert set(keys) <= set(ids)


# --- 2. no destruction on one server's word --------------------------------------------------


def _consensus(cluster: MiniCluster, uuid: str, tablet_id: str) -> tpb.GetConsensusStateResponsePB:
    ts = cluster.tserver_by_uuid(uuid)
    return _call(
        ts.address,
        _creds(cluster, "admin", "test-admin"),
        lambda ch: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).GetConsensusState(
            tpb.GetConsensusStateRequestPB(dest_uuid=uuid, tablet_ids=[tablet_id]), timeout=10
        ),
    )


def _instance_seqno(cluster: MiniCluster, uuid: str) -> int:
    leader = cluster.masters.leader()[0]
    with open_sync_channel(leader, cluster.credentials(), role="master") as ch:
        servers = master_pb2_grpc.MasterServiceStub(ch).ListTabletServers(
            pb.ListTabletServersRequestPB(), timeout=10
        )
    return next(
        s.instance.instance_seqno for s in servers.servers if s.instance.permanent_uuid == uuid
    )


def _replica_states(cluster: MiniCluster, tablet_id: str) -> dict[str, int]:
    """Each tablet server's data state of its replica of `tablet_id` (absent: none)."""
    admin = _creds(cluster, "admin", "test-admin")
    out = {}
    for ts in cluster.tservers.values():
        listed = _call(
            ts.address,
            admin,
            lambda ch, ts=ts: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).ListTablets(
                tpb.ListTabletsRequestPB(dest_uuid=ts.uuid), timeout=10
            ),
        )
        for r in listed.replicas:
            if r.tablet_id == tablet_id:
                out[ts.uuid] = r.data_state
    return out


def _forged_report(
    cluster: MiniCluster, tablet_id: str, follower: str, seq: int, *, alone: bool
) -> pb.TSHeartbeatRequestPB:
    real = _consensus(cluster, follower, tablet_id).tablets[0].consensus_state
    forged = pb.ConsensusStatePB()
    forged.CopyFrom(real)
    forged.current_term = 1000
    forged.leader_uuid = follower
    if alone:
        forged.committed_config.opid_index = 1000
        mine = [p for p in forged.committed_config.peers if p.permanent_uuid == follower]
        del forged.committed_config.peers[:]
        forged.committed_config.peers.extend(mine)
    req = pb.TSHeartbeatRequestPB(
        instance=pb.NodeInstancePB(
            permanent_uuid=follower, instance_seqno=_instance_seqno(cluster, follower)
        )
    )
    req.tablet_report.is_incremental = True
    req.tablet_report.sequence_number = seq
    req.tablet_report.updated_tablets.add(
        tablet_id=tablet_id, state=pb.REPLICA_RUNNING, role=pb.LEADER, consensus_state=forged
    )
    return req


def _send_heartbeat(cluster: MiniCluster, creds: Credentials, req: pb.TSHeartbeatRequestPB) -> Any:
    leader = cluster.masters.leader()[0]
    with open_sync_channel(leader, creds, role="master") as ch:
        return master_pb2_grpc.MasterServiceStub(ch).TSHeartbeat(req, timeout=10)


def _restart_master_leader(cluster: MiniCluster) -> None:
    name = cluster.masters.by_address(cluster.masters.leader()[0]).name
    cluster.masters.kill(name, signal.SIGTERM)
    proc = cluster.masters.masters[name].proc
    assert proc is not None
    proc.wait(timeout=30)
    cluster.masters.start_master(name)
    cluster.masters.wait_ready([name])
    cluster.masters.leader()


def test_a_members_own_certificate_cannot_shrink_its_tablet_or_get_it_tombstoned(
    cluster: MiniCluster,
) -> None:
    """The follower's server claims LEADER, term 1000, op index 1000, voters = {itself}, and,
    separately, LEADER of the same voters in term 1000, under its own uuid and certificate.
    Neither is adopted (the other voters do not say so), a restart of the master leader
    tombstones nobody, and the tablet keeps taking writes with its real leader."""
    loc = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim")
    tablet = loc.tablet_locations[0]
    tid = tablet.tablet_id
    real_leader = _leader(tablet).ts_uuid
    follower = next(r.ts_uuid for r in tablet.replicas if r.ts_uuid != real_leader)
    members = sorted(r.ts_uuid for r in tablet.replicas)
    own = _creds(cluster, "tserver", follower)
    for seq, alone in enumerate((True, False, True), start=900):
        resp = _send_heartbeat(
            cluster, own, _forged_report(cluster, tid, follower, seq, alone=alone)
        )
        assert resp.acked_report_sequence_number == 0  # not adopted: never acknowledged

    after = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim").tablet_locations[
        0
    ]
    assert sorted(r.ts_uuid for r in after.replicas) == members
    assert _leader(after).ts_uuid == real_leader

    _restart_master_leader(cluster)
    time.sleep(3)  # a new leader's full reports, judgements and tasks
    states = _replica_states(cluster, tid)
    assert {u: states.get(u) for u in members} == dict.fromkeys(members, tpb.TABLET_DATA_READY)
    with cluster.client() as c:
        c.write("victim", _rows([77]))
    assert 77 in _scan_ids(cluster, "victim")
    after = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim").tablet_locations[
        0
    ]
    assert sorted(r.ts_uuid for r in after.replicas) == members


def test_a_tombstone_is_refused_by_a_voter_of_its_own_committed_config(
    cluster: MiniCluster,
) -> None:
    """DeleteTablet(TOMBSTONED) carries the op index of the config it was decided from: a
    replica whose own committed config at that index names it refuses (the config the request
    came from is not its group's), as does one whose config is newer."""
    loc = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim")
    tablet = loc.tablet_locations[0]
    victim = tablet.replicas[0].ts_uuid
    own = _consensus(cluster, victim, tablet.tablet_id).tablets[0].consensus_state
    index = own.committed_config.opid_index
    ts = cluster.tserver_by_uuid(victim)
    for cas in (index, max(0, index - 1)):
        err = _refused(
            ts.address,
            _creds(cluster, "admin", "test-admin"),
            lambda ch, cas=cas: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).DeleteTablet(
                tpb.DeleteTabletRequestPB(
                    dest_uuid=victim,
                    tablet_id=tablet.tablet_id,
                    delete_type=tpb.TABLET_DATA_TOMBSTONED,
                    cas_config_opid_index=cas,
                ),
                timeout=10,
            ),
        )
        assert isinstance(err, CasMismatch), err
    assert _replica_states(cluster, tablet.tablet_id)[victim] == tpb.TABLET_DATA_READY


# --- 3. least privilege ----------------------------------------------------------------------


def test_a_tablet_servers_certificate_reads_and_writes_no_table(cluster: MiniCluster) -> None:
    """With one tablet server's certificate and no authz token: no Write, Scan, Checksum or
    SplitKeyRange on any tablet, hosted there or not; no list of another server's replicas; no
    consensus state of a tablet whose config does not name it."""
    loc = _locations(cluster, _creds(cluster, "admin", "test-admin"), "lone")
    tablet = loc.tablet_locations[0]
    host = tablet.replicas[0]
    outsider = next(ts for ts in cluster.tservers.values() if ts.uuid != host.ts_uuid)
    for who in (outsider.uuid, host.ts_uuid):
        creds = _creds(cluster, "tserver", who)

        def data(ch: grpc.Channel) -> Any:
            return tserver_pb2_grpc.TabletServerServiceStub(ch)

        calls = {
            "Write": lambda ch: data(ch).Write(
                tpb.WriteRequestPB(
                    dest_uuid=host.ts_uuid,
                    tablet_id=tablet.tablet_id,
                    rows=_ipc(_rows(range(2000))),
                    default_op=tpb.ROW_OP_UPSERT,
                ),
                timeout=10,
            ),
            "Scan": lambda ch: data(ch).Scan(
                tpb.ScanRequestPB(
                    dest_uuid=host.ts_uuid,
                    new_scan=tpb.NewScanRequestPB(tablet_id=tablet.tablet_id),
                ),
                timeout=10,
            ),
            "Checksum": lambda ch: data(ch).Checksum(
                tpb.ChecksumRequestPB(dest_uuid=host.ts_uuid, tablet_id=tablet.tablet_id),
                timeout=10,
            ),
            "SplitKeyRange": lambda ch: data(ch).SplitKeyRange(
                tpb.SplitKeyRangeRequestPB(
                    dest_uuid=host.ts_uuid, tablet_id=tablet.tablet_id, target_chunk_rows=10
                ),
                timeout=10,
            ),
        }
        for name, call in calls.items():
            err = _refused(_address(host), creds, call)
            assert isinstance(err, PermissionDenied | InvalidAuthzToken), (name, err)
    assert _scan_ids(cluster, "lone") == []

    creds = _creds(cluster, "tserver", outsider.uuid)
    err = _refused(
        _address(host),
        creds,
        lambda ch: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).ListTablets(
            tpb.ListTabletsRequestPB(dest_uuid=host.ts_uuid), timeout=10
        ),
    )
    assert isinstance(err, PermissionDenied), err
    for ids in ([tablet.tablet_id], []):
        err = _refused(
            _address(host),
            creds,
            lambda ch, ids=ids: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).GetConsensusState(
                tpb.GetConsensusStateRequestPB(dest_uuid=host.ts_uuid, tablet_ids=ids),
                timeout=10,
            ),
        )
        assert isinstance(err, PermissionDenied), err


def test_a_peer_reads_the_consensus_state_of_its_own_tablets_only(cluster: MiniCluster) -> None:
    loc = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim")
    tablet = loc.tablet_locations[0]
    a, b = tablet.replicas[0], tablet.replicas[1]
    got = _call(
        _address(a),
        _creds(cluster, "tserver", b.ts_uuid),
        lambda ch: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).GetConsensusState(
            tpb.GetConsensusStateRequestPB(dest_uuid=a.ts_uuid, tablet_ids=[tablet.tablet_id]),
            timeout=10,
        ),
    )
    assert got.tablets[0].tablet_id == tablet.tablet_id


def test_a_copy_session_is_its_requestors_alone(cluster: MiniCluster) -> None:
    """A member begins a copy session only as itself, and another server (even a member) can
    neither read its files nor end it by knowing its id."""
    loc = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim")
    tablet = loc.tablet_locations[0]
    source, peer, other = tablet.replicas[0], tablet.replicas[1], tablet.replicas[2]

    def copy(ch: grpc.Channel) -> Any:
        return tserver_pb2_grpc.TabletCopyServiceStub(ch)

    begin = tpb.BeginTabletCopySessionRequestPB(
        dest_uuid=source.ts_uuid, tablet_id=tablet.tablet_id, requestor_uuid=other.ts_uuid
    )
    err = _refused(
        _address(source),
        _creds(cluster, "tserver", peer.ts_uuid),
        lambda ch: copy(ch).BeginTabletCopySession(begin, timeout=20),
    )
    assert isinstance(err, PermissionDenied) and "as itself" in err.message, err
    begin.requestor_uuid = peer.ts_uuid
    session = _call(
        _address(source),
        _creds(cluster, "tserver", peer.ts_uuid),
        lambda ch: copy(ch).BeginTabletCopySession(begin, timeout=20),
    )
    try:
        fetch = tpb.FetchDataRequestPB(
            dest_uuid=source.ts_uuid,
            session_id=session.session_id,
            file_name=session.data_files[0].name if session.data_files else "manifest",
            offset=0,
        )
        err = _refused(
            _address(source),
            _creds(cluster, "tserver", other.ts_uuid),
            lambda ch: copy(ch).FetchData(fetch, timeout=10),
        )
        assert isinstance(err, PermissionDenied) and "belongs to" in err.message, err
        end = tpb.EndTabletCopySessionRequestPB(
            dest_uuid=source.ts_uuid, session_id=session.session_id
        )
        err = _refused(
            _address(source),
            _creds(cluster, "tserver", other.ts_uuid),
            lambda ch: copy(ch).EndTabletCopySession(end, timeout=10),
        )
        assert isinstance(err, PermissionDenied), err
    finally:
        _call(
            _address(source),
            _creds(cluster, "tserver", peer.ts_uuid),
            lambda ch: copy(ch).EndTabletCopySession(
                tpb.EndTabletCopySessionRequestPB(
                    dest_uuid=source.ts_uuid, session_id=session.session_id
                ),
                timeout=10,
            ),
        )


def test_a_masters_certificate_reads_and_writes_no_rows(cluster: MiniCluster) -> None:
    """A real master's certificate: no Write or Scan (a master has no rows to read); an
    unfenced LeaderStepDown is refused like any unfenced change."""
    loc = _locations(cluster, _creds(cluster, "admin", "test-admin"), "victim")
    tablet = loc.tablet_locations[0]
    leader = _leader(tablet)
    master = cluster.masters.by_address(cluster.masters.leader()[0]).uuid
    creds = _creds(cluster, "master", master)
    err = _refused(
        _address(leader),
        creds,
        lambda ch: tserver_pb2_grpc.TabletServerServiceStub(ch).Scan(
            tpb.ScanRequestPB(
                dest_uuid=leader.ts_uuid, new_scan=tpb.NewScanRequestPB(tablet_id=tablet.tablet_id)
            ),
            timeout=10,
        ),
    )
    assert isinstance(err, PermissionDenied), err
    err = _refused(
        _address(leader),
        creds,
        lambda ch: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).LeaderStepDown(
            tpb.LeaderStepDownRequestPB(dest_uuid=leader.ts_uuid, tablet_id=tablet.tablet_id),
            timeout=10,
        ),
    )
    assert isinstance(err, PermissionDenied) and "fence" in err.message, err
    # A master certificate of a master this server does not heartbeat to reads nothing.
    stranger = _creds(cluster, "master", "master-stranger")
    err = _refused(
        _address(leader),
        stranger,
        lambda ch: tserver_pb2_grpc.TabletServerAdminServiceStub(ch).ListTablets(
            tpb.ListTabletsRequestPB(dest_uuid=leader.ts_uuid), timeout=10
        ),
    )
    assert isinstance(err, PermissionDenied), err
    assert not isinstance(err, NotFound)
