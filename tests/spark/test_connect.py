"""Spark Connect as a way in: a Connect server started the documented way (with Delta and the
tessera source), and a client in its own process that registers the source on its remote
session, reads, writes, queries SQL views, and writes and time-travels the audit tables."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from service.tools.launcher import free_ports, terminate_all
from spark_jobs.session import REPO_ROOT
from tests.spark.conftest import masters

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")

CLIENT = """
import json, sys, datetime as dt
from spark_jobs.connect import connect_session
from spark_jobs.audit import write_snapshot
from spark_jobs.inventory import Inventory, SnapshotStamp, catalog_rows
from service.client.sync import SyncClient
from service.client.credentials import find_credentials

url, masters, creds = sys.argv[1], sys.argv[2], sys.argv[3]
spark = connect_session(url)
opts = {"masters": masters, "credentials": creds}
df = spark.read.format("tessera").options(table="conn_src", **opts).load()
out = {"count": df.count(), "evens": df.where("id % 2 = 0").count()}
df.where("id < 10").write.format("tessera").options(table="conn_dst", **opts) \\
    .mode("append").save()
spark.sql(f"CREATE TEMPORARY VIEW v USING tessera OPTIONS (masters '{masters}', "
          f"credentials '{creds}', table 'conn_dst')")
out["view"] = spark.sql("SELECT count(*) AS n, max(id) AS m FROM v").collect()[0].asDict()
client = SyncClient(masters.split(","), credentials=find_credentials(creds))
dump = client.call("dump_catalog")
now = dt.datetime.now(dt.UTC)
tables, tablets, replicas = catalog_rows(dump.tables, dump.tablets)
inv = Inventory(SnapshotStamp("connect-1", now, 1, dump.committed_index), tables, tablets, replicas)
out["audit"] = write_snapshot(spark, inv).status
out["audited"] = sorted(r.name for r in spark.sql(
    "SELECT name FROM tessera_audit.tables VERSION AS OF 0").collect())
client.close()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("connect")
    (port,) = free_ports(1)  # below the ephemeral range: no outgoing connection takes it
    # Started the documented way, the `tessera` command (which becomes the server: a SIGTERM
    # reaches the JVM). The default catalog (in-memory, spark_jobs/catalog.py);
    # test_stream_sink.py and the demo run with a Hive metastore (--metastore).
    tessera = Path(sys.executable).parent / "tessera"
    cmd = [str(tessera), "spark", "connect-server", "--port", str(port)]
    cmd += ["--warehouse", str(base / "wh")]
    log = (base / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=base)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (base / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Connect server did not listen"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        terminate_all([proc])
        log.close()


def test_read_write_sql_and_audit_over_spark_connect(
    connect_url: str, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    ps = PartitionSchema(hash=(HashBucketSchema(("id",), 2),))
    for name in ("conn_src", "conn_dst"):
        client.call("create_table", name, SCHEMA, ps)
    client.write("conn_src", pa.table({"id": pa.array(range(100), pa.int64()), "v": ["x"] * 100}))
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    proc = subprocess.run(
        [sys.executable, str(script), connect_url, masters(cluster),
         str(cluster.credentials_dir())],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert got["count"] == 100 and got["evens"] == 50
    assert got["view"] == {"n": 10, "m": 9}
    assert got["audit"] == "written" and {"conn_src", "conn_dst"} <= set(got["audited"])
