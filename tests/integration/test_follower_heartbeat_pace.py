"""Followers set a slower heartbeat pace; a lost leader sends a server to every master at once.

Three real masters and one real tablet server (heartbeats every 200 ms; followers ask for one
every 6 s). Over 7 seconds the leader is heartbeated several times as often as each
follower. Then the leader is killed: the server heartbeats the new leader within about one of
its own intervals after the election, not after a follower's slow pace (which would take
up to 6 s more), and a table created on
the new leader is written and read (its replicas were reported to the new leader)
(docs/design/failover.md#R1).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster

pytestmark = pytest.mark.integration

FOLLOWER_PACE_MS = 6000
TSERVER_INTERVAL_MS = 200
SCHEMA = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], ("k",))


def heartbeats_ok(http_address: str) -> dict[str, float]:
    """The tablet server's count of successful heartbeats, by master address."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tessera_tserver_heartbeats_total{") and '"ok"' in line:
            master = line.split('master="', 1)[1].split('"', 1)[0]
            out[master] = float(line.rsplit(" ", 1)[1])
    return out


def wait_for(pred, what: str, timeout: float = 30.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if pred():
                return time.monotonic() - t0
        except Exception:  # a master electing; keep polling
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not within {timeout} s")


def test_followers_are_heartbeated_at_their_pace_and_a_new_leader_at_once(
    tmp_path: Path,
) -> None:
    cluster = MiniCluster(
        tmp_path,
        num_tservers=1,
        master_overrides={**FAST_RAFT, "follower_heartbeat_interval_ms": str(FOLLOWER_PACE_MS)},
        tserver_overrides={**FAST_TSERVER, "heartbeat_interval_ms": str(TSERVER_INTERVAL_MS)},
    )
    with cluster:
        ts = next(iter(cluster.tservers.values()))
        leader, _ = cluster.masters.leader()
        followers = [a for a in cluster.master_addresses if a != leader]
        wait_for(lambda: len(heartbeats_ok(ts.http_address)) == 3, "heartbeats to 3 masters")
        time.sleep(1.0)  # past the first heartbeats, sent to every master before a leader is known
        before = heartbeats_ok(ts.http_address)
        time.sleep(7.0)
        after = heartbeats_ok(ts.http_address)
        to_leader = after[leader] - before[leader]
        # About 35 to the leader (every 200 ms) and 1 or 2 to each follower (every 6 s).
        assert to_leader >= 15, (before, after)
        for f in followers:
            to_follower = after[f] - before[f]
            assert 1 <= to_follower <= 3, (f, before, after)

        # Kill the leader: the server goes to every master at once, finds the new leader and
        # heartbeats it at its own pace: five heartbeats within a few seconds of the kill
        # (the election takes about one), where at a follower's pace they would take 24 s.
        base = heartbeats_ok(ts.http_address)
        cluster.masters.kill(cluster.masters.by_address(leader).name)
        t0 = time.monotonic()
        new_leader, _ = cluster.masters.leader(among=followers)
        wait_for(
            lambda: heartbeats_ok(ts.http_address)[new_leader] >= base[new_leader] + 5,
            "five heartbeats to the new leader",
        )
        took = time.monotonic() - t0
        assert took < 4.0, took
        with SyncClient(cluster.master_addresses, credentials=cluster.credentials()) as client:
            client.call(
                "create_table",
                "after_failover",
                SCHEMA,
                PartitionSchema(hash=(HashBucketSchema(("k",), 2),)),
                num_replicas=1,
            )
            client.write(
                "after_failover", pa.table({"k": pa.array([1, 2, 3]), "v": ["a", "b", "c"]})
            )
            got = client.call("scan", "after_failover")
            assert sorted(got.column("k").to_pylist()) == [1, 2, 3]
