"""Certificates the masters sign: users' short-lived credentials (`tessera token create`),
tablet servers that join with a join credential, and who may ask for what.

The cluster's CA is the one it was provisioned with, stored in sys.catalog by the leader; the
leader signs certificate requests, so a key never travels."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from cryptography import x509

from service.client.sync import SyncClient
from service.common.errors import InvalidArgument, PermissionDenied, from_grpc
from service.common.partition import PartitionSchema, RangeSchema
from service.common.pki import IdentityFiles, new_request
from service.common.schema import ColumnType, Schema
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("enroll")) as c:
        with c.client() as admin:
            admin.call("create_table", "t", SCHEMA, PartitionSchema(range=RangeSchema(("id",))))
            admin.write("t", pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
        yield c


def _cli(
    cluster: MiniCluster, *args: str, creds: str | None = None
) -> subprocess.CompletedProcess[str]:
    where = ["--masters", ",".join(cluster.master_addresses)]
    where += ["--credentials", creds or str(cluster.credentials_dir())]
    return subprocess.run(
        [sys.executable, "-m", "service.tools.cli", *args, *where],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _issue(
    cluster: MiniCluster, creds: Credentials, role: str, name: str, validity_s: int = 0
) -> pb.IssueCertificateResponsePB:
    leader = cluster.masters.leader()[0]
    _, csr = new_request()
    with open_sync_channel(leader, creds, role="master") as ch:
        return master_pb2_grpc.MasterServiceStub(ch).IssueCertificate(
            pb.IssueCertificateRequestPB(role=role, name=name, csr_der=csr, validity_s=validity_s),
            timeout=10,
        )


def _refused(fn: object, *args: object) -> Exception:
    with pytest.raises(grpc.RpcError) as e:
        fn(*args)  # type: ignore[operator]
    return from_grpc(e.value)


def test_a_user_credential_from_token_create_works_until_it_expires(
    cluster: MiniCluster, tmp_path: Path
) -> None:
    out = tmp_path / "zoe"
    r = _cli(cluster, "token", "create", "--user", "zoe", "--ttl", "2h", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "credentials of user 'zoe'" in r.stdout
    files = IdentityFiles.in_dir(out)
    assert all((p.stat().st_mode & 0o077) == 0 for p in (files.cert_file, files.key_file))
    cert = x509.load_pem_x509_certificate(files.cert_file.read_bytes())
    life = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(hours=1, minutes=55) < life <= dt.timedelta(hours=2)
    creds = Credentials.from_files(files)
    assert (creds.identity.role, creds.identity.name) == ("user", "zoe")
    with SyncClient(cluster.master_addresses, timeout=30, credentials=creds) as zoe:
        assert zoe.call("list_tables") == []  # a credential, not a privilege
    with cluster.client() as admin:
        admin.call("grant", "t", "zoe", ["read"])
    with SyncClient(cluster.master_addresses, timeout=30, credentials=creds) as zoe:
        ids = [
            i
            for tok in zoe.scan_tokens("t")
            for b in zoe.scan_batches(tok)
            for i in b.column("id").to_pylist()
        ]
        assert sorted(ids)[:2] == [1, 2]
    # Beyond the 7-day cap: refused, naming the limit; nothing written.
    r = _cli(
        cluster, "token", "create", "--user", "zoe", "--ttl", "8d", "--out", str(tmp_path / "x")
    )
    assert r.returncode != 0 and "lives at most 604800 s" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()
    # A short one works, expires, and then fails the handshake.
    brief_dir = tmp_path / "brief"
    r = _cli(cluster, "token", "create", "--user", "brief", "--ttl", "2", "--out", str(brief_dir))
    assert r.returncode == 0, r.stderr
    brief = Credentials.from_files(IdentityFiles.in_dir(brief_dir))
    leader = cluster.masters.leader()[0]
    with open_sync_channel(leader, brief, role="master") as ch:
        master_pb2_grpc.MasterServiceStub(ch).ListTables(pb.ListTablesRequestPB(), timeout=5)
    time.sleep(3)
    with open_sync_channel(leader, brief, role="master") as ch:
        _refused(master_pb2_grpc.MasterServiceStub(ch).ListTables, pb.ListTablesRequestPB(), 5)


def test_who_may_get_which_certificate(cluster: MiniCluster) -> None:
    user = cluster.credentials("user", "ursula")
    ts = cluster.credentials("tserver", next(iter(cluster.tservers.values())).uuid)
    admin = cluster.credentials()
    assert user is not None and ts is not None and admin is not None
    err = _refused(_issue, cluster, user, "user", "ursula")
    assert isinstance(err, PermissionDenied) and "IssueCertificate" in str(err), err
    err = _refused(_issue, cluster, ts, "user", "someone")
    assert isinstance(err, PermissionDenied) and "may not get a user certificate" in str(err)
    err = _refused(_issue, cluster, ts, "tserver", "ts-other")
    assert isinstance(err, PermissionDenied) and "only its own" in str(err), err
    _issue(cluster, ts, "tserver", ts.identity.name)  # its own renewal
    err = _refused(_issue, cluster, admin, "master", "m-x")
    assert isinstance(err, PermissionDenied) and "provisioning" in str(err), err
    leader = cluster.masters.leader()[0]
    with open_sync_channel(leader, admin, role="master") as ch:
        err = _refused(
            master_pb2_grpc.MasterServiceStub(ch).IssueCertificate,
            pb.IssueCertificateRequestPB(role="user", name="x", csr_der=b"garbage"),
            5,
        )
    assert isinstance(err, InvalidArgument) and "csr_der" in str(err), err


def test_a_tablet_server_joins_with_a_join_credential(cluster: MiniCluster, tmp_path: Path) -> None:
    join_dir = tmp_path / "join"
    r = _cli(cluster, "token", "create", "--join", "--out", str(join_dir))
    assert r.returncode == 0 and "join credential" in r.stdout, r.stderr
    join = Credentials.from_files(IdentityFiles.in_dir(join_dir))
    assert join.identity.role == "join"
    # A join credential cannot pose as a server the cluster knows, nor call anything else.
    known = next(iter(cluster.tservers.values())).uuid
    err = _refused(_issue, cluster, join, "tserver", known)
    assert isinstance(err, PermissionDenied) and "knows" in str(err), err
    leader = cluster.masters.leader()[0]
    with open_sync_channel(leader, join, role="master") as ch:
        err = _refused(
            master_pb2_grpc.MasterServiceStub(ch).ListTables, pb.ListTablesRequestPB(), 5
        )
    assert isinstance(err, PermissionDenied), err
    # A new server started with only the join credential enrolls, registers and serves.
    ts = cluster.add_tserver_slot("ts-joined")
    cluster.start_tserver("ts-joined", credentials_dir=join_dir)
    enrolled = Credentials.from_files(IdentityFiles.in_dir(join_dir))
    assert enrolled.identity.role == "tserver" and enrolled.identity.name == ts.uuid
    cluster.wait_registered()
