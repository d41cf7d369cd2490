"""Per-table grants and authz tokens on a real secured cluster.

A user certificate alone opens no table: an admin grants `read`, `write` or `alter` per table
(replicated in sys.catalog, exactly once), the master hands the user an authz token with the
table's locations, and tablet servers check every Write and Scan against it without asking a
master. Forged, tampered, expired, unknown-key and someone else's tokens are refused; a revoked
grant stops working within the token lifetime; grants survive a master failover and go away
with their table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from service.client.sync import SyncClient
from service.common import tokens
from service.common.errors import InvalidAuthzToken, PermissionDenied, from_grpc
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
TOKEN_TTL_S = 4.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    overrides = {**FAST_RAFT, "authz_token_ttl_ms": str(int(TOKEN_TTL_S * 1000))}
    with MiniCluster(tmp_path_factory.mktemp("grants"), master_overrides=overrides) as c:
        with c.client() as admin:
            for name in ("t", "other"):
                admin.call(
                    "create_table", name, SCHEMA, PartitionSchema(range=RangeSchema(("id",)))
                )
            admin.write("t", _rows([1, 2, 3]))
        yield c


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _creds(cluster: MiniCluster, name: str, role: str = "user") -> Credentials:
    creds = cluster.credentials(role, name)
    assert creds is not None
    return creds


def _as(cluster: MiniCluster, name: str) -> SyncClient:
    return SyncClient(cluster.master_addresses, timeout=30, credentials=_creds(cluster, name))


def _error(fn: object, *args: object, **kwargs: object) -> Exception:
    with pytest.raises(Exception) as e:
        fn(*args, **kwargs)  # type: ignore[operator]
    err = e.value
    return from_grpc(err) if isinstance(err, grpc.RpcError) else err


def _scan_all(client: SyncClient, table: str) -> list[int]:
    ids: list[int] = []
    for token in client.scan_tokens(table):
        for batch in client.scan_batches(token):
            ids.extend(batch.column("id").to_pylist())
    return sorted(ids)


def _admin(cluster: MiniCluster) -> SyncClient:
    return cluster.client()


def _grant(cluster: MiniCluster, table: str, user: str, *privileges: str) -> None:
    with _admin(cluster) as admin:
        admin.call("grant", table, user, list(privileges))


def _revoke(cluster: MiniCluster, table: str, user: str, *privileges: str) -> None:
    with _admin(cluster) as admin:
        admin.call("grant", table, user, list(privileges), revoke=True)


# --- the user's view, through the client -----------------------------------------------------


def test_a_user_without_grants_sees_and_touches_nothing(cluster: MiniCluster) -> None:
    with _as(cluster, "nobody") as c:
        assert c.call("list_tables") == []
        err = _error(c.call, "open_table", "t")
        assert isinstance(err, PermissionDenied) and "no privilege" in str(err), err
        # A missing table answers the same way: no probing for names.
        err = _error(c.call, "open_table", "no_such_table")
        assert isinstance(err, PermissionDenied), err
        assert isinstance(_error(c.write, "t", _rows([99])), PermissionDenied)
        assert isinstance(_error(c.scan_tokens, "t"), PermissionDenied)


def test_read_write_and_alter_are_separate_privileges(cluster: MiniCluster) -> None:
    _grant(cluster, "t", "alice", "read")
    with _as(cluster, "alice") as c:
        assert [t.name for t in c.call("list_tables")] == ["t"]  # not "other"
        assert _scan_all(c, "t")[:3] == [1, 2, 3]
        err = _error(c.write, "t", _rows([10]))
        assert isinstance(err, PermissionDenied) and "'write'" in str(err), err
        err = _error(c.call, "alter_table", "t", [AddColumn("x", ColumnType.INT64)])
        assert isinstance(err, PermissionDenied) and "'alter'" in str(err), err
        assert isinstance(_error(c.scan_tokens, "other"), PermissionDenied)
    _grant(cluster, "t", "alice", "write", "alter")
    with _as(cluster, "alice") as c:
        c.write("t", _rows([10, 11]))
        assert {10, 11} <= set(_scan_all(c, "t"))
        c.call("alter_table", "t", [AddColumn("note", ColumnType.STRING)])
    with _admin(cluster) as admin:
        grants = admin.call("list_grants", "t", "alice")
    assert [(g.user, g.privileges) for g in grants] == [("alice", ("read", "write", "alter"))]


def test_only_admins_change_or_list_grants(cluster: MiniCluster) -> None:
    _grant(cluster, "t", "mallory", "read")
    with _as(cluster, "mallory") as c:
        err = _error(c.call, "grant", "t", "mallory", ["write"])
        assert isinstance(err, PermissionDenied) and "GrantPrivileges" in str(err), err
        assert isinstance(_error(c.call, "list_grants"), PermissionDenied)
    with _admin(cluster) as admin:
        assert [g.privileges for g in admin.call("list_grants", "t", "mallory")] == [("read",)]


def test_bad_grant_requests_are_invalid_argument(cluster: MiniCluster) -> None:
    with _admin(cluster) as admin:
        for user, privileges in (("", ["read"]), ("has space", ["read"]), ("bob", [])):
            err = _error(admin.call, "grant", "t", user, privileges)
            assert type(err).__name__ == "InvalidArgument", err
        err = _error(admin.call, "grant", "t", "bob", ["delete"])
        assert "unknown privilege" in str(err), err
        err = _error(admin.call, "grant", "no_such_table", "bob", ["read"])
        assert type(err).__name__ == "NotFound", err
        assert admin.call("list_grants", "", "bob") == []


# --- tokens at the tablet server, through raw stubs ------------------------------------------


def _locations(
    cluster: MiniCluster, creds: Credentials, table: str
) -> pb.GetTableLocationsResponsePB:
    leader = cluster.masters.leader()[0]
    with open_sync_channel(leader, creds, role="master") as ch:
        stub = master_pb2_grpc.MasterServiceStub(ch)
        return stub.GetTableLocations(
            pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_name=table)),
            timeout=10,
        )


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _write(
    cluster: MiniCluster, creds: Credentials, loc: pb.GetTableLocationsResponsePB, token: bytes
) -> tpb.WriteResponsePB:
    tablet = loc.tablet_locations[0]
    leader = next(r for r in tablet.replicas if r.role == pb.LEADER)
    address = f"{leader.rpc_address.host}:{leader.rpc_address.port}"
    with open_sync_channel(address, creds, role="tserver") as ch:
        stub = tserver_pb2_grpc.TabletServerServiceStub(ch)
        return stub.Write(
            tpb.WriteRequestPB(
                dest_uuid=leader.ts_uuid,
                tablet_id=tablet.tablet_id,
                rows=_ipc(_rows([500])),
                default_op=tpb.ROW_OP_UPSERT,
                authz_token=token,
            ),
            timeout=10,
        )


def _forge(token: bytes, *, key_seq: int | None = None) -> bytes:
    """The same claim, signed with a key the cluster never had (optionally another key seq)."""
    version, seq, expire_us, kind, length = struct_header(token)
    body = token[22 : 22 + length]
    header = bytes([version]) + (key_seq if key_seq is not None else seq).to_bytes(8, "big")
    header += expire_us.to_bytes(8, "big") + bytes([kind]) + length.to_bytes(4, "big")
    key = ed25519.Ed25519PrivateKey.generate()
    return header + body + key.sign(header + body)


def struct_header(token: bytes) -> tuple[int, int, int, int, int]:
    return (
        token[0],
        int.from_bytes(token[1:9], "big"),
        int.from_bytes(token[9:17], "big"),
        token[17],
        int.from_bytes(token[18:22], "big"),
    )


def test_tablet_servers_check_authz_tokens(cluster: MiniCluster) -> None:
    _grant(cluster, "t", "carol", "read", "write")
    _grant(cluster, "other", "carol", "read")
    carol = _creds(cluster, "carol")
    loc = _locations(cluster, carol, "t")
    assert loc.authz_token, "a user gets an authz token with the locations"
    assert not _locations(cluster, _creds(cluster, "test-admin", "admin"), "t").authz_token
    _write(cluster, carol, loc, loc.authz_token)  # the real token works

    def refused(token: bytes, creds: Credentials = carol) -> Exception:
        return _error(_write, cluster, creds, loc, token)

    err = refused(b"")
    assert isinstance(err, InvalidAuthzToken) and "no authz token" in str(err), err
    tampered = bytearray(loc.authz_token)
    tampered[30] ^= 0x01  # inside the JSON claim
    err = refused(bytes(tampered))
    assert isinstance(err, InvalidAuthzToken) and "does not verify" in str(err), err
    err = refused(_forge(loc.authz_token))
    assert isinstance(err, InvalidAuthzToken) and "does not verify" in str(err), err
    err = refused(_forge(loc.authz_token, key_seq=10**9))
    assert isinstance(err, InvalidAuthzToken) and "unknown token signing key" in str(err), err
    # Another table's token, and carol's token presented by dave.
    err = refused(_locations(cluster, carol, "other").authz_token)
    assert isinstance(err, InvalidAuthzToken) and "for table" in str(err), err
    err = refused(loc.authz_token, _creds(cluster, "dave"))
    assert isinstance(err, InvalidAuthzToken) and "for user 'carol'" in str(err), err
    # A read-only token does not write.
    err = refused(_locations(cluster, carol, "other").authz_token)
    assert isinstance(err, PermissionDenied)


def test_tokens_expire_and_a_revoked_grant_stops_within_the_token_lifetime(
    cluster: MiniCluster,
) -> None:
    _grant(cluster, "t", "erin", "read", "write")
    erin = _creds(cluster, "erin")
    loc = _locations(cluster, erin, "t")
    claim = tokens.AuthzClaim.of(
        json.loads(loc.authz_token[22 : 22 + struct_header(loc.authz_token)[4]])
    )
    assert claim.user == "erin" and tokens.Privilege.WRITE in claim.privileges
    _revoke(cluster, "t", "erin", "write")
    # The old token still writes until it expires (documented), then is refused.
    _write(cluster, erin, loc, loc.authz_token)
    deadline = time.monotonic() + TOKEN_TTL_S + 5
    while True:
        try:
            _write(cluster, erin, loc, loc.authz_token)
        except grpc.RpcError as e:
            err = from_grpc(e)
            assert isinstance(err, InvalidAuthzToken) and "expired" in str(err), err
            break
        assert time.monotonic() < deadline, "the token outlived its lifetime"
        time.sleep(0.2)
    # The client fetches a fresh token, which no longer carries `write`.
    with _as(cluster, "erin") as c:
        err = _error(c.write, "t", _rows([600]))
        assert isinstance(err, PermissionDenied) and "'write'" in str(err), err
        assert 1 in _scan_all(c, "t")


def test_a_scanner_continues_only_for_whoever_opened_it(cluster: MiniCluster) -> None:
    _grant(cluster, "t", "frank", "read")
    frank = _creds(cluster, "frank")
    loc = _locations(cluster, frank, "t")
    tablet = loc.tablet_locations[0]
    leader = next(r for r in tablet.replicas if r.role == pb.LEADER)
    address = f"{leader.rpc_address.host}:{leader.rpc_address.port}"
    with open_sync_channel(address, frank, role="tserver") as ch:
        first = tserver_pb2_grpc.TabletServerServiceStub(ch).Scan(
            tpb.ScanRequestPB(
                dest_uuid=leader.ts_uuid,
                new_scan=tpb.NewScanRequestPB(tablet_id=tablet.tablet_id),
                batch_size_bytes=1,
                authz_token=loc.authz_token,
            ),
            timeout=10,
        )
    assert first.has_more_results and first.scanner_id
    with open_sync_channel(address, _creds(cluster, "grace"), role="tserver") as ch:
        err = _error(
            tserver_pb2_grpc.TabletServerServiceStub(ch).ScanNext,
            tpb.ScanNextRequestPB(
                dest_uuid=leader.ts_uuid, scanner_id=first.scanner_id, call_seq_id=1
            ),
            timeout=10,
        )
    assert type(err).__name__ == "NotFound", err


# --- replication -----------------------------------------------------------------------------


def test_grants_survive_failover_and_leave_with_their_table(cluster: MiniCluster) -> None:
    with _admin(cluster) as admin:
        admin.call("create_table", "doomed", SCHEMA, PartitionSchema(range=RangeSchema(("id",))))
    _grant(cluster, "doomed", "heidi", "read", "write")
    old_leader = cluster.masters.by_address(cluster.masters.leader()[0]).name
    cluster.masters.kill(old_leader)
    try:
        others = [a for a in cluster.master_addresses if cluster.masters.by_address(a).alive]
        cluster.masters.leader(among=others)
        with _as(cluster, "heidi") as c:  # the new leader knows the grant and signs tokens
            c.write("doomed", _rows([7]))
            assert _scan_all(c, "doomed") == [7]
    finally:
        cluster.masters.start_master(old_leader)
        cluster.masters.wait_ready([old_leader])
    with _admin(cluster) as admin:
        assert [g.user for g in admin.call("list_grants", "doomed")] == ["heidi"]
        admin.call("delete_table", "doomed")
        admin.call("create_table", "doomed", SCHEMA, PartitionSchema(range=RangeSchema(("id",))))
        assert admin.call("list_grants", "doomed") == []
    with _as(cluster, "heidi") as c:
        assert isinstance(_error(c.write, "doomed", _rows([8])), PermissionDenied)


# --- the CLI ---------------------------------------------------------------------------------


def _cli(cluster: MiniCluster, *args: str) -> subprocess.CompletedProcess[str]:
    creds = cluster.credentials_dir()
    assert creds is not None
    masters = ",".join(cluster.master_addresses)
    where = ["--masters", masters, "--credentials", creds]
    return subprocess.run(
        [sys.executable, "-m", "service.tools.cli", *args, *where],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_grant_revoke_and_list_from_the_command_line(cluster: MiniCluster) -> None:
    r = _cli(cluster, "grant", "t", "ivan", "read,write")
    assert r.returncode == 0, r.stderr
    assert "ivan" in r.stdout and "read, write" in r.stdout
    r = _cli(cluster, "revoke", "t", "ivan", "write")
    assert r.returncode == 0 and "read" in r.stdout and "write" not in r.stdout, r.stdout
    r = _cli(cluster, "grant", "list", "--user", "ivan", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        {
            "table_id": json.loads(r.stdout)[0]["table_id"],
            "table_name": "t",
            "user": "ivan",
            "privileges": ["read"],
        }
    ]
    r = _cli(cluster, "grant", "t", "ivan", "own")
    assert r.returncode == 2 and "unknown privilege 'own'" in r.stderr, (r.returncode, r.stderr)
