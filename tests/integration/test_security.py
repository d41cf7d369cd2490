"""The security matrix on a real secured cluster: every way in without the right certificate is
refused with a clear error, and nothing changes.

Each case was an attack that worked when every port was plaintext and open: DDL from anyone, a
fake tablet server registered by one heartbeat, a heartbeat under a real server's uuid that
moved its address, consensus messages from outside the group, AddMaster from an outside
process, an unfenced DeleteTablet straight to a tablet server. The last test runs the first
attacks against an insecure cluster and shows them succeed: the refusals here come from the
security layer, not from the requests being malformed.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from service.common.errors import PermissionDenied, Unauthenticated, from_grpc
from service.common.partition import PartitionSchema, RangeSchema
from service.common.pki import ClusterPki, IdentityFiles
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.common.tls import Credentials, open_sync_channel
from service.consensus.codec import message_to_pb
from service.pb import consensus_pb2 as cpb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.pb.consensus_pb2_grpc import ConsensusServiceStub
from service.raft.types import Message, MessageType, NodeId
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("secure")) as c:
        with c.client() as client:
            client.call("create_table", "t", SCHEMA, PartitionSchema(range=RangeSchema(("id",))))
        yield c


def _creds(cluster: MiniCluster, role: str, name: str) -> Credentials:
    creds = cluster.credentials(role, name)
    assert creds is not None
    return creds


def _master_stub(
    address: str, creds: Credentials | None
) -> tuple[grpc.Channel, master_pb2_grpc.MasterServiceStub]:
    ch = open_sync_channel(address, creds, role="master")
    return ch, master_pb2_grpc.MasterServiceStub(ch)


def _leader(cluster: MiniCluster) -> str:
    return cluster.masters.leader()[0]


def _refused(call: object, *args: object) -> Exception:
    with pytest.raises(grpc.RpcError) as e:
        call(*args)  # type: ignore[operator]
    return from_grpc(e.value)


def _tables(cluster: MiniCluster) -> set[str]:
    with cluster.client() as c:
        return {t.name for t in c.call("list_tables")}


def _create_request(name: str) -> pb.CreateTableRequestPB:
    return pb.CreateTableRequestPB(
        request_id=pb.RequestIdPB(client_id="attacker", seq_no=1),
        name=name,
        schema=schema_to_pb(SCHEMA),
        partition_schema=partition_schema_to_pb(PartitionSchema(), SCHEMA),
        num_replicas=1,
    )


def _heartbeat(uuid: str, port: int) -> pb.TSHeartbeatRequestPB:
    req = pb.TSHeartbeatRequestPB(
        instance=pb.NodeInstancePB(permanent_uuid=uuid, instance_seqno=2**40)
    )
    req.registration.rpc_addresses.add(host="127.0.0.1", port=port)
    req.registration.software_version = "attacker"
    return req


# --- who may connect at all ------------------------------------------------------------------


def test_plaintext_other_ca_and_expired_certificates_are_refused_at_the_handshake(
    cluster: MiniCluster, tmp_path: Path
) -> None:
    leader = _leader(cluster)
    # Plaintext.
    ch, stub = _master_stub(leader, None)
    with ch:
        err = _refused(stub.ListTables, pb.ListTablesRequestPB(), 5)
    assert err.code in ("SERVICE_UNAVAILABLE", "UNAVAILABLE") or "navailable" in type(err).__name__
    # A certificate of the right shape from another CA.
    other = ClusterPki(tmp_path / "other-ca")
    foreign = Credentials.from_files(other.files("admin", "test-admin"))
    ch, stub = _master_stub(leader, foreign)
    with ch:
        _refused(stub.ListTables, pb.ListTablesRequestPB(), 5)
    # An expired certificate from the cluster's own CA.
    assert cluster.masters.pki is not None
    ca = cluster.masters.pki.ca
    cert, key = ca.issue(
        "admin",
        "expired-admin",
        now=dt.datetime.now(dt.UTC) - dt.timedelta(days=3),
        validity=dt.timedelta(days=1),
    )
    files = IdentityFiles.in_dir(tmp_path / "expired").write(ca.cert_pem, cert, key)
    ch, stub = _master_stub(leader, Credentials.from_files(files))
    with ch:
        _refused(stub.ListTables, pb.ListTablesRequestPB(), 5)
    # The cluster's own admin gets in.
    ch, stub = _master_stub(leader, cluster.credentials())
    with ch:
        assert "t" in {t.name for t in stub.ListTables(pb.ListTablesRequestPB(), timeout=5).tables}


def test_a_world_readable_key_is_refused_naming_it(cluster: MiniCluster, tmp_path: Path) -> None:
    assert cluster.masters.pki is not None
    files = cluster.masters.pki.files("user", "careless")
    loose = IdentityFiles.in_dir(tmp_path / "loose").write(
        files.ca_file.read_bytes(), files.cert_file.read_bytes(), files.key_file.read_bytes()
    )
    loose.key_file.chmod(0o644)
    with pytest.raises(Exception, match=r"key\.pem: private key is accessible to group"):
        Credentials.from_files(loose)


# --- what each role may do -------------------------------------------------------------------


def test_ddl_only_from_admins(cluster: MiniCluster) -> None:
    leader = _leader(cluster)
    for role, name in (("tserver", "ts-intruder"), ("user", "alice"), ("master", "m-intruder")):
        ch, stub = _master_stub(leader, _creds(cluster, role, name))
        with ch:
            err = _refused(stub.CreateTable, _create_request(f"by_{role}"), 10)
            assert isinstance(err, PermissionDenied), err
            assert "CreateTable" in err.message and "admin" in err.message, err.message
            err = _refused(
                stub.DeleteTable,
                pb.DeleteTableRequestPB(
                    request_id=pb.RequestIdPB(client_id="attacker", seq_no=2),
                    table=pb.TableIdentifierPB(table_name="t"),
                ),
                10,
            )
            assert isinstance(err, PermissionDenied), err
            # Reading metadata is fine for any authenticated party.
            assert stub.ListTables(pb.ListTablesRequestPB(), timeout=5) is not None
    assert _tables(cluster) == {"t"}


def test_non_admin_add_master_is_refused(cluster: MiniCluster) -> None:
    leader = _leader(cluster)
    ch, stub = _master_stub(leader, _creds(cluster, "user", "alice"))
    with ch:
        req = pb.AddMasterRequestPB(rpc_address=pb.HostPortPB(host="127.0.0.1", port=1))
        err = _refused(stub.AddMaster, req, 10)
    assert isinstance(err, PermissionDenied) and "AddMaster" in err.message


def test_heartbeats_only_from_tablet_servers_as_themselves(cluster: MiniCluster) -> None:
    leader = _leader(cluster)
    real = next(iter(cluster.tservers.values()))
    with cluster.client() as c:
        before = {s.uuid: s for s in c.call("list_tablet_servers")}
    # A user or an admin certificate sends a heartbeat: refused.
    for role, name in (("user", "alice"), ("admin", "test-admin")):
        ch, stub = _master_stub(leader, _creds(cluster, role, name))
        with ch:
            err = _refused(stub.TSHeartbeat, _heartbeat(f"ts-fake-{role}", 9), 5)
        assert isinstance(err, PermissionDenied) and "tserver" in err.message, err
    # A tablet server certificate heartbeating under another (real) server's uuid, with a
    # higher instance seqno and another address: refused; the real server keeps its address.
    ch, stub = _master_stub(leader, _creds(cluster, "tserver", "ts-intruder"))
    with ch:
        err = _refused(stub.TSHeartbeat, _heartbeat(real.uuid, 9), 5)
        assert isinstance(err, PermissionDenied) and real.uuid in err.message, err
        # The same over the heartbeat stream (its caller's identity is read once per stream).
        stream = stub.TSHeartbeatStream
        err = _refused(lambda: list(stream(iter([_heartbeat(real.uuid, 9)]), timeout=5)))
    assert isinstance(err, PermissionDenied) and real.uuid in err.message, err
    ch, stub = _master_stub(leader, _creds(cluster, "user", "alice"))
    with ch:
        stream = stub.TSHeartbeatStream
        err = _refused(lambda: list(stream(iter([_heartbeat("ts-fake-user", 9)]), timeout=5)))
    assert isinstance(err, PermissionDenied) and "tserver" in err.message, err
    with cluster.client() as c:
        after = {s.uuid: s for s in c.call("list_tablet_servers")}
    assert set(after) == set(before)  # no fake server registered
    assert after[real.uuid].address == before[real.uuid].address == real.address


def test_consensus_only_from_group_members_as_themselves(cluster: MiniCluster) -> None:
    from service.pb import consensus_pb2_grpc

    leader = _leader(cluster)
    step = cpb.StepRequest(src_uuid="master-evil", dest_uuid="whoever")
    for role, name in (("admin", "test-admin"), ("tserver", "ts-intruder"), ("user", "bob")):
        ch = open_sync_channel(leader, _creds(cluster, role, name), role="master")
        with ch:
            stub = consensus_pb2_grpc.ConsensusServiceStub(ch)
            err = _refused(stub.Step, step, 5)
        assert isinstance(err, PermissionDenied) and "Step" in err.message, err
    # A master certificate speaking for another node.
    ch = open_sync_channel(leader, _creds(cluster, "master", "master-evil"), role="master")
    with ch:
        stub = consensus_pb2_grpc.ConsensusServiceStub(ch)
        spoof = cpb.StepRequest(src_uuid="master-127.0.0.1-1", dest_uuid="x")
        err = _refused(stub.Step, spoof, 5)
    assert isinstance(err, PermissionDenied) and "master-127.0.0.1-1" in err.message, err
    # A master certificate speaking as itself, but for a group it is not a member of: a vote
    # request at a huge term would have deposed the leader.
    from service.consensus.codec import message_to_pb
    from service.master.master import GROUP, master_uuid
    from service.raft.types import Message, MessageType, NodeId

    vote = Message(
        MessageType.VOTE, to=NodeId(master_uuid(leader)), frm=NodeId("master-evil"), term=10**6
    )
    ch = open_sync_channel(leader, _creds(cluster, "master", "master-evil"), role="master")
    with ch:
        stub = consensus_pb2_grpc.ConsensusServiceStub(ch)
        req = cpb.StepRequest(
            src_uuid="master-evil", src_instance="evil-1", dest_uuid=master_uuid(leader)
        )
        req.groups.add(group_id=GROUP).messages.append(message_to_pb(vote))
        err = _refused(stub.Step, req, 5)
    assert isinstance(err, PermissionDenied) and "not a member" in err.message, err
    assert cluster.masters.leader()[0] == leader  # still leading, its term untouched


def test_tablet_admin_calls_only_from_masters_and_admins(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        (token,) = c.scan_tokens("t")
    replica = token.replicas[0]
    req = tpb.DeleteTabletRequestPB(
        dest_uuid=replica.ts_uuid, tablet_id=token.tablet_id, delete_type=tpb.TABLET_DATA_DELETED
    )
    for role, name in (("user", "alice"), ("tserver", "ts-intruder")):
        ch = open_sync_channel(replica.address, _creds(cluster, role, name), role="tserver")
        with ch:
            stub = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
            err = _refused(stub.DeleteTablet, req, 5)
        assert isinstance(err, PermissionDenied) and "DeleteTablet" in err.message, err
    # A master's call must carry its own fence: none, or another master's, is refused.
    ch = open_sync_channel(replica.address, _creds(cluster, "master", "m-x"), role="tserver")
    with ch:
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
        err = _refused(stub.DeleteTablet, req, 5)
        assert isinstance(err, PermissionDenied) and "carries its fence" in err.message, err
        forged = tpb.DeleteTabletRequestPB()
        forged.CopyFrom(req)
        forged.fence.master_uuid, forged.fence.master_term = "m-y", 10**6
        err = _refused(stub.DeleteTablet, forged, 5)
        assert isinstance(err, PermissionDenied) and "not the caller" in err.message, err
        # Its own fence, but "m-x" is no master of this cluster: refused, whatever the term (a
        # successful call would have raised the server's master term above the real leader's).
        own = tpb.DeleteTabletRequestPB()
        own.CopyFrom(req)
        own.fence.master_uuid, own.fence.master_term = "m-x", 2
        err = _refused(stub.DeleteTablet, own, 5)
        assert isinstance(err, PermissionDenied) and "heartbeats to" in err.message, err
    # The replica is still there (as its server tells an admin); a user may not even list it.
    ch = open_sync_channel(replica.address, cluster.credentials(), role="tserver")
    with ch:
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
        listed = stub.ListTablets(tpb.ListTabletsRequestPB(dest_uuid=replica.ts_uuid), timeout=5)
    assert any(
        r.tablet_id == token.tablet_id and r.data_state == tpb.TABLET_DATA_READY
        for r in listed.replicas
    )
    # The real leader's fenced calls still work: a new table's tablets are created there.
    with cluster.client() as c:
        c.call("create_table", "after_outsider", SCHEMA, PartitionSchema(), num_replicas=3)
        c.call("delete_table", "after_outsider")
    ch = open_sync_channel(replica.address, _creds(cluster, "user", "alice"), role="tserver")
    with ch:
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
        err = _refused(stub.ListTablets, tpb.ListTabletsRequestPB(dest_uuid=replica.ts_uuid), 5)
    assert isinstance(err, PermissionDenied)


def test_a_tablet_copy_session_only_for_tablet_servers(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        (token,) = c.scan_tokens("t")
    replica = token.replicas[0]
    ch = open_sync_channel(replica.address, cluster.credentials(), role="tserver")
    with ch:
        stub = tserver_pb2_grpc.TabletCopyServiceStub(ch)
        err = _refused(
            stub.BeginTabletCopySession,
            tpb.BeginTabletCopySessionRequestPB(
                dest_uuid=replica.ts_uuid, tablet_id=token.tablet_id, requestor_uuid="admin"
            ),
            5,
        )
    assert isinstance(err, PermissionDenied) and "tserver" in err.message, err
    # A tablet server certificate, but of a server the tablet's config does not name: a copy
    # of the tablet's rows would go to a stranger.
    ch = open_sync_channel(
        replica.address, _creds(cluster, "tserver", "ts-stranger"), role="tserver"
    )
    with ch:
        stub = tserver_pb2_grpc.TabletCopyServiceStub(ch)
        err = _refused(
            stub.BeginTabletCopySession,
            tpb.BeginTabletCopySessionRequestPB(
                dest_uuid=replica.ts_uuid, tablet_id=token.tablet_id, requestor_uuid="ts-stranger"
            ),
            5,
        )
    assert isinstance(err, PermissionDenied) and "not a member" in err.message, err
    # Nor may it tell a replica to copy the tablet from wherever it says.
    ch = open_sync_channel(
        replica.address, _creds(cluster, "tserver", "ts-stranger"), role="tserver"
    )
    with ch:
        admin = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
        err = _refused(
            admin.StartTabletCopy,
            tpb.StartTabletCopyRequestPB(dest_uuid=replica.ts_uuid, tablet_id=token.tablet_id),
            5,
        )
    assert isinstance(err, PermissionDenied) and "only from itself" in err.message, err
    # ...not even naming itself as the source.
    with open_sync_channel(
        replica.address, _creds(cluster, "tserver", "ts-stranger"), role="tserver"
    ) as ch:
        admin = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
        err = _refused(
            admin.StartTabletCopy,
            tpb.StartTabletCopyRequestPB(
                dest_uuid=replica.ts_uuid,
                tablet_id=token.tablet_id,
                copy_peer_uuid="ts-stranger",
                copy_peer_addr=pb.HostPortPB(host="127.0.0.1", port=1),
            ),
            5,
        )
    assert isinstance(err, PermissionDenied) and "not a member" in err.message, err


def test_raft_messages_from_a_stranger_stay_refused_after_the_members_are_asked(
    cluster: MiniCluster,
) -> None:
    """A replica that is sent Raft messages by a server its config does not name asks its
    members whether that server joined since (service/tserver/vouch.py). For a stranger no
    member vouches: its heartbeat at a high term is refused before and after the asking, and
    the replica's term does not move."""
    with cluster.client() as c:
        (token,) = c.scan_tokens("t")
    replica = token.replicas[0]
    server = cluster.tserver_by_uuid(replica.ts_uuid)

    def term() -> int:
        with open_sync_channel(replica.address, cluster.credentials(), role="tserver") as ch:
            admin = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
            resp = admin.GetConsensusState(
                tpb.GetConsensusStateRequestPB(
                    dest_uuid=replica.ts_uuid, tablet_ids=[token.tablet_id]
                ),
                timeout=5,
            )
        return resp.tablets[0].consensus_state.current_term

    before = term()
    beat = Message(
        MessageType.HEARTBEAT,
        to=NodeId(replica.ts_uuid),
        frm=NodeId("ts-stranger"),
        term=before + 100,
    )
    step = cpb.StepRequest(src_uuid="ts-stranger", dest_uuid=replica.ts_uuid)
    step.groups.add(group_id=token.tablet_id).messages.append(message_to_pb(beat))
    creds = _creds(cluster, "tserver", "ts-stranger")
    refusals = []
    deadline = time.monotonic() + 30
    with open_sync_channel(replica.address, creds, role="tserver") as ch:
        stub = ConsensusServiceStub(ch)
        while not refusals or "no member vouched" not in server.log.read_text():
            assert time.monotonic() < deadline, "the members were not asked"
            refusals.append(_refused(stub.Step, step, 5))
            time.sleep(0.2)
        refusals.append(_refused(stub.Step, step, 5))  # asked, and still refused
    assert all(isinstance(e, PermissionDenied) and "not a member" in e.message for e in refusals), (
        refusals
    )
    assert term() == before


def test_unauthenticated_is_its_own_status() -> None:
    assert issubclass(Unauthenticated, PermissionDenied)
    assert Unauthenticated.code == "UNAUTHENTICATED"


def test_a_tablet_server_certificate_cannot_move_another_tablets_membership(
    cluster: MiniCluster,
) -> None:
    """A server with a genuine tablet server certificate (stolen, or a server gone bad) reports
    itself LEADER of a real tablet, in a newer config that swaps itself in for a real replica.
    Adopted, that claim sent clients to it and got the replica it left out tombstoned. Now the
    leader master asks the claim's other voters, who do not confirm it: nothing is adopted,
    the report is not acknowledged, and every real replica keeps serving."""
    with cluster.client() as c:
        tablet = c.call("table_locations", "t")[0]
    tablet_id = tablet.tablet_id
    admin = _creds(cluster, "admin", "test-admin")

    def consensus(uuid: str) -> pb.ConsensusStatePB:
        ts = cluster.tserver_by_uuid(uuid)
        with open_sync_channel(ts.address, admin, role="tserver") as ch:
            r = tserver_pb2_grpc.TabletServerAdminServiceStub(ch).GetConsensusState(
                tpb.GetConsensusStateRequestPB(dest_uuid=uuid, tablet_ids=[tablet_id]), timeout=5
            )
        return r.tablets[0].consensus_state

    replicas = sorted(r.ts_uuid for r in tablet.replicas)
    assert len(replicas) == 3
    real = consensus(replicas[0])
    forged = pb.ConsensusStatePB()
    forged.CopyFrom(real)
    forged.current_term += 100
    forged.leader_uuid = "ts-rogue"
    forged.committed_config.opid_index += 100
    left_out = forged.committed_config.peers[0].permanent_uuid
    forged.committed_config.peers[0].permanent_uuid = "ts-rogue"
    forged.committed_config.peers[0].ClearField("last_known_addr")

    req = _heartbeat("ts-rogue", 9)
    req.tablet_report.is_incremental = True
    req.tablet_report.sequence_number = 7
    req.tablet_report.updated_tablets.add(
        tablet_id=tablet_id,
        state=pb.REPLICA_RUNNING,
        role=pb.LEADER,
        consensus_state=forged,
    )
    ch, stub = _master_stub(_leader(cluster), _creds(cluster, "tserver", "ts-rogue"))
    with ch:
        for _ in range(3):  # as a server does, again and again: never adopted
            resp = stub.TSHeartbeat(req, timeout=10)
            assert resp.acked_report_sequence_number == 0
    with cluster.client() as c:  # a new client: nothing cached
        after = c.call("table_locations", "t")[0]
    assert sorted(r.ts_uuid for r in after.replicas) == replicas
    assert "ts-rogue" not in {r.ts_uuid for r in after.replicas}
    # The replica the claim left out is a member still, on its server and in its group.
    assert consensus(left_out).committed_config.opid_index == real.committed_config.opid_index
    with cluster.client() as c:
        c.write("t", pa.table({"id": pa.array([77], pa.int64()), "v": ["after"]}))
        assert 77 in c.call("scan", "t").column("id").to_pylist()


def test_the_same_attacks_succeed_against_an_insecure_cluster(tmp_path: Path) -> None:
    """Evidence that the refusals above are the security layer's: with security.mode =
    "insecure" a plaintext outsider creates a table and registers a fake tablet server."""
    with MiniCluster(tmp_path, num_tservers=1, secure=False) as insecure:
        leader = _leader(insecure)
        ch, stub = _master_stub(leader, None)
        with ch:
            stub.CreateTable(_create_request("by_anyone"), timeout=20)
            stub.TSHeartbeat(_heartbeat("ts-fake", 9), timeout=5)
            servers = stub.ListTabletServers(pb.ListTabletServersRequestPB(), timeout=5)
        assert "by_anyone" in _tables(insecure)
        assert "ts-fake" in {s.instance.permanent_uuid for s in servers.servers}
