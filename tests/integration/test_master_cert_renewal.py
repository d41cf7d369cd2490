"""A master renews its own certificate before it expires and goes on serving with the new one,
without a restart (docs/design/security.md#R11): past the old certificate's end, the same
process answers new client connections, takes part in new consensus connections both ways
(it is elected leader over a freshly restarted peer and commits through it), and reaches a
tablet server through new proxy channels (CreateTablet for a new table)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from cryptography import x509

from service.common.partition import PartitionSchema, RangeSchema
from service.common.pki import IdentityFiles
from service.common.private_files import write_private_file
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64)], key="id")
SHORT = "master-1"


def _not_after(files: IdentityFiles) -> dt.datetime:
    return x509.load_pem_x509_certificate(files.cert_file.read_bytes()).not_valid_after_utc


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MiniCluster, dt.datetime]]:
    overrides = {**FAST_RAFT, "cert_renewal_check_ms": "500"}
    c = MiniCluster(tmp_path_factory.mktemp("master-renew"), num_tservers=1,
                    master_overrides=overrides)  # fmt: skip
    pki = c.masters.pki
    assert pki is not None
    # master-1's certificate, in the place the cluster's CA directory keeps it: 20 s into a
    # 30 s life (plus the usual hour of backdating), so due at once and over 10 s from now.
    uuid = c.masters.masters[SHORT].uuid
    now = dt.datetime.now(dt.UTC)
    cert, key = pki.ca.issue("master", uuid, now=now - dt.timedelta(seconds=20),
                             validity=dt.timedelta(seconds=30))  # fmt: skip
    write_private_file(pki.directory / f"master-{uuid}.key", key)
    write_private_file(pki.directory / f"master-{uuid}.pem", cert)
    old_end = x509.load_pem_x509_certificate(cert).not_valid_after_utc
    with c:
        yield c, old_end


def _role(c: MiniCluster, address: str) -> int:
    with c.sync_channel(address) as ch:
        r = master_pb2_grpc.MasterServiceStub(ch).ConnectToMaster(
            pb.ConnectToMasterRequestPB(), timeout=10
        )
    return int(r.role)


def test_a_master_certificate_near_its_end_is_renewed_and_served_without_a_restart(
    cluster: tuple[MiniCluster, dt.datetime],
) -> None:
    c, old_end = cluster
    pki = c.masters.pki
    assert pki is not None
    m1 = c.masters.masters[SHORT]
    proc = m1.proc
    files = pki.files("master", m1.uuid)
    deadline = time.monotonic() + 30
    while _not_after(files) <= old_end:
        assert time.monotonic() < deadline, "not renewed"
        time.sleep(0.2)
    assert _not_after(files) > dt.datetime.now(dt.UTC) + dt.timedelta(days=300)

    # Past the old certificate's end.
    time.sleep(max(0.0, (old_end - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    assert m1.proc is proc and m1.alive
    # A new client connection: master-1 presents the new certificate.
    with c.sync_channel(m1.address) as ch:
        r = master_pb2_grpc.MasterServiceStub(ch).ConnectToMaster(
            pb.ConnectToMasterRequestPB(), timeout=10
        )
    assert r.term >= 1

    # New consensus connections both ways: master-3 is gone, master-2 restarts, and master-1
    # must win its vote and commit through it, each side dialing the other afresh.
    c.masters.kill("master-3")
    c.masters.kill("master-2")
    # master-1 steps down first (it lost its quorum), so that few heartbeats of its old term
    # reach master-2 once restarted. One still can (a message master-1 queued while leading,
    # delivered when the channel comes back): it gives master-2 a leader lease in which it
    # refuses master-1's votes for its whole election timeout, after which master-2 would
    # campaign at once and win. So master-2's election timeout is 5 s plus up to 10 s of
    # jitter: after the lease, master-1 (campaigning every 0.5-3 s) has seconds to win first.
    deadline = time.monotonic() + 30
    while _role(c, m1.address) == pb.LEADER:
        assert time.monotonic() < deadline, "master-1 never stepped down"
        time.sleep(0.05)
    c.masters.overrides = {
        **c.masters.overrides,
        "raft.election_timeout_ms": "5000",
        "raft.election_jitter_ms": "10000",
    }
    c.masters.start_master("master-2")
    c.masters.wait_ready(["master-2"])
    leader, _ = c.masters.leader(timeout=60)
    assert leader == m1.address
    assert m1.proc is proc and m1.alive
    c.wait_registered(timeout=60)
    # New proxy channels: CreateTablet from master-1 to the tablet server, and a commit
    # through master-2 for every catalog write.
    with c.client() as client:
        client.call("create_table", "after_renewal", SCHEMA,
                    PartitionSchema(range=RangeSchema(("id",))), num_replicas=1)  # fmt: skip
        client.write("after_renewal", pa.table({"id": pa.array(range(50), pa.int64())}))
        rows = sum(b.num_rows for t in client.scan_tokens("after_renewal")
                   for b in client.scan_batches(t))  # fmt: skip
    assert rows == 50
