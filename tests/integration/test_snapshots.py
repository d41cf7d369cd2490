"""Snapshot reads on a real cluster (docs/design/tablets.md#R3): hybrid-time commit stamps,
READ_AT_SNAPSHOT on any replica, exact resumes, diff scans, the history horizon.

Writers keep upserting while readers read; every check compares whole tables row for row.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from service.client.scanner import ScanToken
from service.client.sync import SyncClient
from service.common.errors import SnapshotTooOld, TesseraError
from service.common.hybrid_time import physical_us
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("n", ColumnType.INT64)], key="id")
HASHED = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("snapshots")) as c:
        with c.client() as admin:
            admin.call("create_table", "counters", SCHEMA, HASHED, num_replicas=3)
            admin.call("create_table", "quiet", SCHEMA, PartitionSchema(), num_replicas=3)
            admin.write("quiet", _rows(range(10), 1))
        yield c


def _rows(ids: Any, n: int) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "n": pa.array([n] * len(ids), pa.int64())})


def _read(client: SyncClient, token: ScanToken) -> dict[int, int]:
    out: dict[int, int] = {}
    for b in client.scan_batches(token):
        for r in b.to_pylist():
            assert r["id"] not in out, "a row twice"
            out[r["id"]] = r["n"]
    return out


class Writer:
    """Upserts rounds of counters in the background, remembering each round's commit time."""

    def __init__(self, cluster: MiniCluster, table: str, keys: int = 60) -> None:
        self.client = cluster.client()
        self.table = table
        self.keys = keys
        self.rounds: list[tuple[int, int]] = []  # (round, commit timestamp)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            res = self.client.write(self.table, _rows(range(self.keys), n))
            assert not res.errors
            self.rounds.append((n, res.commit_timestamp))

    def __enter__(self) -> Writer:
        self._thread.start()
        while len(self.rounds) < 3:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.client.close()


def test_the_same_snapshot_from_the_leader_and_every_follower_while_writes_go_on(
    cluster: MiniCluster,
) -> None:
    with Writer(cluster, "counters") as w, cluster.client() as reader:
        time.sleep(0.3)
        tokens = reader.scan_tokens("counters", snapshot=True)
        at = tokens[0].snapshot_timestamp
        assert at and all(t.snapshot_timestamp == at for t in tokens)
        time.sleep(0.5)  # writes go on past the snapshot
        per_replica: list[dict[int, int]] = []
        for tok in tokens:
            views = [
                _read(reader, replace(tok, replicas=(rep,), fault_tolerant=False))
                for rep in tok.replicas
            ]
            assert len(views) == 3
            assert views[0] == views[1] == views[2], tok.tablet_id
            per_replica.append(views[0])
        table = {k: v for view in per_replica for k, v in view.items()}
        # Exactly the rounds committed at or before the snapshot: every key has the value of
        # the last such round (a round is one write per tablet, each stamped on its own).
        done = [n for n, ts in w.rounds if ts <= at]
        assert done, "no round committed before the snapshot"
        assert set(table) == set(range(60))
        assert min(table.values()) >= done[-1] - 1 and max(table.values()) <= done[-1] + 1
        # A second read of the same snapshot, later, is the same table.
        again = {k: v for tok in tokens for k, v in _read(reader, tok).items()}
        assert again == table
        assert reader.client.latest_timestamp >= at


def test_a_scan_resumed_on_another_replica_after_a_kill_is_exact(cluster: MiniCluster) -> None:
    with Writer(cluster, "counters") as _, cluster.client() as reader:
        time.sleep(0.3)
        tok = reader.scan_tokens("counters", snapshot=True, batch_size_bytes=64)[0]
        want = _read(reader, replace(tok, replicas=(tok.replicas[1],), fault_tolerant=False))
        first = tok.replicas[0]
        victim = cluster.tserver_by_uuid(first.ts_uuid)
        got: dict[int, int] = {}
        it = reader.scan_batches(replace(tok, replicas=(first, *tok.replicas[1:])))
        batch = next(it)
        got.update(zip(batch.column("id").to_pylist(), batch.column("n").to_pylist(), strict=True))
        victim.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        victim.proc.wait(timeout=10)  # type: ignore[union-attr]
        for batch in it:
            for k, v in zip(
                batch.column("id").to_pylist(), batch.column("n").to_pylist(), strict=True
            ):
                assert k not in got
                got[k] = v
        assert got == want
    cluster.start_tserver(victim.name)
    cluster.wait_registered()


def test_a_client_reads_its_own_write_on_a_follower_at_a_snapshot(cluster: MiniCluster) -> None:
    """The snapshot a client takes after its write is later than the write's commit time, so
    every replica, a follower that has not applied the write yet included, returns it."""
    with cluster.client() as c:
        res = c.write("counters", _rows([5000], 7))
        assert res.commit_timestamp > 0
        union: dict[int, int] = {}
        for tok in c.scan_tokens("counters", snapshot=True):
            assert tok.snapshot_timestamp > res.commit_timestamp
            views = [
                _read(c, replace(tok, replicas=(rep,), fault_tolerant=False))
                for rep in tok.replicas
            ]
            assert all(v == views[0] for v in views)
            union.update(views[0])
        assert union[5000] == 7


def test_a_quiet_tablets_follower_serves_a_snapshot_of_now(cluster: MiniCluster) -> None:
    """No write for a while: the follower asks the leader to move the safe time (a timestamp
    entry), then reads, in well under a second."""
    time.sleep(1.5)
    with cluster.client() as c:
        (tok,) = c.scan_tokens("quiet", snapshot=True)
        for rep in tok.replicas:
            t0 = time.monotonic()
            assert _read(c, replace(tok, replicas=(rep,), fault_tolerant=False)) == dict.fromkeys(
                range(10), 1
            )
            assert time.monotonic() - t0 < 5


def test_a_diff_scan_returns_what_changed_with_deletes_flagged(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        c.write("quiet", _rows(range(100, 110), 1))
        t1 = c.scan_tokens("quiet", snapshot=True)[0].snapshot_timestamp
        c.write("quiet", _rows([100, 101], 2))
        c.write("quiet", pa.table({"id": pa.array([102], pa.int64())}), "delete")
        c.write("quiet", _rows([200], 3))
        t2 = c.scan_tokens("quiet", snapshot=True)[0].snapshot_timestamp
        diff = c.call("scan", "quiet", snapshot=t2, diff_start=t1)
        got = {r["id"]: (r["n"], r["__is_deleted"]) for r in diff.to_pylist()}
        assert got == {100: (2, False), 101: (2, False), 102: (None, True), 200: (3, False)}
        assert c.call("scan", "quiet", snapshot=t2, diff_start=t2 - 1).num_rows == 0


def test_reads_older_than_the_history_horizon_are_refused(tmp_path: Any) -> None:
    overrides = {**FAST_TSERVER, "tablet_history_max_age_ms": "2000"}
    with (
        MiniCluster(tmp_path, num_masters=1, num_tservers=1, tserver_overrides=overrides) as c,
        c.client() as admin,
    ):
        admin.call("create_table", "t", SCHEMA, PartitionSchema(), num_replicas=1)
        res = admin.write("t", _rows(range(3), 1))
        old = res.commit_timestamp
        (tok,) = admin.scan_tokens("t", snapshot=old)
        assert _read(admin, tok) == dict.fromkeys(range(3), 1)
        time.sleep(2.5)
        with pytest.raises(SnapshotTooOld) as e:
            _read(admin, tok)
        assert "history horizon" in e.value.message
        assert physical_us(old) > 0
        # Now is fine.
        (tok,) = admin.scan_tokens("t", snapshot=True)
        assert _read(admin, tok) == dict.fromkeys(range(3), 1)
        with pytest.raises(TesseraError):  # a diff that starts before the horizon
            _read(admin, admin.scan_tokens("t", snapshot=True, diff_start=old)[0])
