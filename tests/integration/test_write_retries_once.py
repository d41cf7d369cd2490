"""A plain write whose leader is killed after the write committed, before it answered: the
client's retry reaches the new leader, which answers with the first attempt's outcome
(docs/design/tablets.md#R6). Without it, the retried INSERT failed row by row "already
present" though every row went in, and a retried UPSERT was applied a second time."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common import failpoints
from service.common.partition import PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("n", ColumnType.INT64)], key="id")


def _rows(ids: range, n: int) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "n": pa.array([n] * len(ids))})


@pytest.mark.parametrize("op", ["insert", "upsert"])
def test_a_write_whose_leader_dies_before_answering_is_applied_once(
    tmp_path: Path, op: str
) -> None:
    once = tmp_path / "crashed"
    env = {failpoints.CRASH_AT: "write:after_apply", failpoints.ONCE_FILE: str(once)}
    with MiniCluster(tmp_path / "c") as cluster, cluster.client() as c:
        c.call("create_table", "t", SCHEMA, PartitionSchema(), num_replicas=3)
        c.write("t", _rows(range(100, 110), 0), "insert")  # the table is up
        for name in list(cluster.tservers):  # now every server dies at the point, once
            cluster.kill_tserver(name)
            cluster.start_tserver(name, env=env)
        cluster.wait_registered()
        res = c.write("t", _rows(range(100), 1), op)
        assert once.exists(), "no leader died after applying the write"
        assert (res.rows_applied, res.errors) == (100, [])
        assert res.retries >= 1
        want = {**dict.fromkeys(range(100), 1), **dict.fromkeys(range(100, 110), 0)}
        assert _read(c, res.commit_timestamp) == want
        # Applied once, at the time the reply names: just before it, none of it (a
        # second application would have left the first one's rows visible there).
        assert _read(c, res.commit_timestamp - 1) == dict.fromkeys(range(100, 110), 0)


def _read(c: SyncClient, at: int) -> dict[int, int]:
    t = c.call("scan", "t", snapshot=at)
    assert t.num_rows == len(set(t.column("id").to_pylist()))
    return dict(zip(t.column("id").to_pylist(), t.column("n").to_pylist(), strict=True))
