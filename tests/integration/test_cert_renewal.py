"""A tablet server renews its certificate before it expires and goes on serving with the new
one, without a restart: new connections to it (clients, peers) see the new certificate, and its
own calls (heartbeats, Raft) present it, past the old certificate's expiry."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from cryptography import x509

from service.common.partition import PartitionSchema, RangeSchema
from service.common.pki import IdentityFiles
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64)], key="id")


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    overrides = {**FAST_TSERVER, "cert_renewal_check_ms": "500"}
    with MiniCluster(tmp_path_factory.mktemp("renew"), tserver_overrides=overrides) as c:
        yield c


def _not_after(files: IdentityFiles) -> dt.datetime:
    return x509.load_pem_x509_certificate(files.cert_file.read_bytes()).not_valid_after_utc


def test_a_certificate_near_its_end_is_renewed_and_served_without_a_restart(
    cluster: MiniCluster,
) -> None:
    pki = cluster.masters.pki
    assert pki is not None
    name = "ts-short"
    ts = cluster.add_tserver_slot(name)
    # A certificate 25 s into a 30 s life (plus the usual hour of backdating): due at once.
    now = dt.datetime.now(dt.UTC)
    cert, key = pki.ca.issue("tserver", "ts-short-uuid", now=now - dt.timedelta(seconds=25),
                             validity=dt.timedelta(seconds=30))  # fmt: skip
    files = IdentityFiles.in_dir(cluster.base / "ts-short-creds").write(pki.ca.cert_pem, cert, key)
    old_end = _not_after(files)
    assert old_end < now + dt.timedelta(seconds=10)
    cluster.start_tserver(name, credentials_dir=files.ca_file.parent)
    proc = ts.proc
    deadline = time.monotonic() + 30
    while _not_after(files) <= old_end:
        assert time.monotonic() < deadline, "not renewed"
        time.sleep(0.2)
    assert _not_after(files) > now + dt.timedelta(days=300)
    # Past the old certificate's end: the same process serves new connections and calls out.
    time.sleep(max(0.0, (old_end - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    assert ts.proc is proc and ts.alive
    cluster.wait_registered()
    with cluster.client() as c:
        c.call(
            "create_table",
            "on_four",
            SCHEMA,
            PartitionSchema(range=RangeSchema(("id",))),
            num_replicas=3,
        )
        c.call("create_table", "on_four_b", SCHEMA, PartitionSchema(range=RangeSchema(("id",))),
               num_replicas=3)  # fmt: skip
        hosted = [
            t
            for table in ("on_four", "on_four_b")
            for t in c.scan_tokens(table)
            if any(r.ts_uuid == "ts-short-uuid" for r in t.replicas)
        ]
        assert hosted, "placement put no replica on the renewed server"
        for table in ("on_four", "on_four_b"):
            c.write(table, pa.table({"id": pa.array(range(100), pa.int64())}))
            assert sum(b.num_rows for t in c.scan_tokens(table) for b in c.scan_batches(t)) == 100
