"""On a real cluster, every file and directory the servers write is owner-only, and a master
whose sys.catalog files (the CA key, the token signing keys) others could read refuses to start,
naming the file. Before, WAL segments, snapshots and consensus metadata were created 0644 in
0755 directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _open_to_others(root: Path) -> list[str]:
    bad = []
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
            bad.append(f"{p} {stat.S_IMODE(st.st_mode):04o}")
    return bad


def test_servers_write_owner_only_and_a_readable_catalog_file_stops_a_master(
    tmp_path: Path,
) -> None:
    base = tmp_path / "cluster"
    base.mkdir(mode=0o755)  # as a launcher with the usual umask would make it
    with (
        MiniCluster(base) as cluster,
        SyncClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as client,
    ):
        schema = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], key="k")
        client.call("create_table", "t", schema, PartitionSchema(range=RangeSchema(("k",))))
        client.write("t", pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
        for m in cluster.masters.masters.values():
            assert _open_to_others(m.data_dir) == [], m.name
        for ts in cluster.tservers.values():
            assert _open_to_others(ts.data_dir) == [], ts.name

        # One sys.catalog file made world-readable: that master refuses to start, naming it.
        name, m = next(iter(cluster.masters.masters.items()))
        cluster.masters.kill(name)
        wal_file = next(p for p in (m.data_dir / "raft").rglob("*") if p.is_file())
        os.chmod(wal_file, 0o644)
        cluster.masters.start_master(name)
        assert m.proc is not None
        assert m.proc.wait(timeout=60) == 2
        log = m.log.read_text()
        assert str(wal_file) in log and "go-rwx" in log, log[-2000:]

        os.chmod(wal_file, 0o600)  # fixed as the message says: it starts again
        cluster.masters.start_master(name)
        cluster.masters.wait_ready([name])
