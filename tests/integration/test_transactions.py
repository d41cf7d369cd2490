"""Transactions on a real secured cluster (docs/design/transactions.md): writes to several
tables and tablets that become visible together at one commit timestamp, or never.

Every check reads whole tables, from every replica where it matters: before the commit nothing
of the transaction shows anywhere, after it everything does, a snapshot just before the commit
timestamp shows none of it, and an abort (asked, or a client that stopped sending keep-alives)
leaves the tables as they were. Row locks keep other writers off staged rows; only the owner
writes in, commits or aborts a transaction; and a kill -9 of the coordinator or of a
participant's leader at each step of the two-phase commit ends with the transaction all there
or all gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.client.transactions import Transaction
from service.common import failpoints
from service.common.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    TesseraError,
)
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.tls import open_sync_channel
from service.pb import master_pb2 as pb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("n", ColumnType.INT64)], key="id")
HASHED = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))
KEEPALIVE_MS = 3000
MASTERS = {**FAST_RAFT, "txn_keepalive_ms": str(KEEPALIVE_MS)}
TSERVERS = {**FAST_TSERVER, "txn_lock_wait_ms": "500"}


def _cluster(base: Path, **kw: Any) -> MiniCluster:
    return MiniCluster(base, master_overrides=MASTERS, tserver_overrides=TSERVERS, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with _cluster(tmp_path_factory.mktemp("txns")) as c:
        with c.client() as admin:
            for name in ("a", "b"):
                admin.call("create_table", name, SCHEMA, HASHED, num_replicas=3)
            admin.call("create_table", "shared", SCHEMA, HASHED, num_replicas=3)
            for user in ("alice", "bob"):
                admin.call("grant", "shared", user, ["read", "write"])
        yield c


def _rows(ids: Any, n: int) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "n": pa.array([n] * len(ids), pa.int64())})


def _table(client: SyncClient, table: str, **kw: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for tok in client.scan_tokens(table, **kw):
        for b in client.scan_batches(tok):
            for r in b.to_pylist():
                assert r["id"] not in out
                out[r["id"]] = r["n"]
    return out


def _every_replica(client: SyncClient, table: str, at: int) -> dict[int, int]:
    """The table at snapshot `at`, read from each replica of each tablet; they must agree."""
    out: dict[int, int] = {}
    for tok in client.scan_tokens(table, snapshot=at):
        views = []
        for rep in tok.replicas:
            one = replace(tok, replicas=(rep,), fault_tolerant=False)
            views.append({r["id"]: r["n"] for b in client.scan_batches(one) for r in b.to_pylist()})
        assert len(views) == 3 and all(v == views[0] for v in views), tok.tablet_id
        out.update(views[0])
    return out


def _begin(client: SyncClient, **kw: Any) -> Transaction:
    txn: Transaction = client.call("begin_transaction", **kw)
    return txn


def _write(client: SyncClient, txn: Transaction, table: str, data: pa.Table, op: str = "upsert"):
    return client.run(txn.write(table, data, op))


def _as(cluster: MiniCluster, name: str, role: str = "user") -> SyncClient:
    return SyncClient(
        cluster.master_addresses, timeout=30, credentials=cluster.credentials(role, name)
    )


def test_a_transaction_over_two_tables_commits_at_one_timestamp(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        c.write("a", _rows(range(100, 110), 0))  # rows the transaction updates and deletes
        before = c.client.latest_timestamp
        txn = _begin(c)
        r1 = _write(c, txn, "a", _rows(range(0, 50), 1))
        r2 = _write(c, txn, "b", _rows(range(0, 30), 2))
        r3 = _write(c, txn, "a", _rows(range(100, 105), 0), "delete")
        r4 = _write(c, txn, "a", _rows(range(105, 110), 7), "update")
        assert not (r1.errors or r2.errors or r3.errors or r4.errors)
        # Staged: nobody sees any of it, at the newest rows or at a snapshot taken now.
        assert _table(c, "a") == dict.fromkeys(range(100, 110), 0)
        assert _table(c, "b") == {}
        assert _table(c, "a", snapshot=True) == dict.fromkeys(range(100, 110), 0)
        ts = c.run(txn.commit())
        assert ts > before
        want_a = {**dict.fromkeys(range(50), 1), **dict.fromkeys(range(105, 110), 7)}
        want_b = dict.fromkeys(range(30), 2)
        assert _table(c, "a") == want_a
        assert _every_replica(c, "a", ts) == want_a
        assert _every_replica(c, "b", ts) == want_b
        # One tick before the commit timestamp: none of it, on every replica.
        assert _every_replica(c, "a", ts - 1) == dict.fromkeys(range(100, 110), 0)
        assert _every_replica(c, "b", ts - 1) == {}
        state = c.call("transaction_state", txn.txn_id)
        assert state.state == "COMMITTED" and state.commit_timestamp == ts
        # A retried commit is answered the same.
        assert c.run(txn.commit()) == ts


def test_per_row_outcomes_are_decided_when_staged(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        c.write("a", _rows([500], 5))
        txn = _begin(c)
        res = _write(c, txn, "a", _rows([500, 501], 6), "insert")
        assert [e.key for e in res.errors] == [(500,)] and res.errors[0].code == "ALREADY_EXISTS"
        res = _write(c, txn, "a", _rows([502], 6), "update")
        assert [e.code for e in res.errors] == ["NOT_FOUND"]
        # The transaction sees its own staged rows: an update of 501 merges over the staged row.
        res = _write(c, txn, "a", _rows([501], 9), "update")
        assert not res.errors
        c.run(txn.commit())
        got = _table(c, "a")
        assert got[500] == 5 and got[501] == 9 and 502 not in got


def test_an_abort_leaves_nothing_and_releases_the_rows(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        txn = _begin(c)
        _write(c, txn, "b", _rows(range(1000, 1020), 3))
        c.run(txn.abort("changed my mind"))
        assert not set(_table(c, "b")) & set(range(1000, 1020))
        state = c.call("transaction_state", txn.txn_id)
        assert state.state == "ABORTED" and "changed my mind" in state.message
        with pytest.raises(Aborted, match="changed my mind"):
            c.run(txn.commit())
        # The rows are free: a plain write goes through at once.
        t0 = time.monotonic()
        assert not c.write("b", _rows(range(1000, 1020), 4)).errors
        assert time.monotonic() - t0 < 5
        # And a write in the ended transaction is refused, naming why.
        with pytest.raises(FailedPrecondition):
            _write(c, txn, "b", _rows([1000], 5))


def test_a_context_manager_that_raises_aborts(cluster: MiniCluster) -> None:
    with cluster.client() as c:

        async def body() -> int:
            txn = await c.client.begin_transaction()
            try:
                async with txn:
                    await txn.write("b", _rows(range(2000, 2010), 1))
                    raise RuntimeError("boom")
            except RuntimeError:
                pass
            return txn.txn_id

        txn_id = c.run(body())
        assert c.call("transaction_state", txn_id).state == "ABORTED"
        assert not set(_table(c, "b")) & set(range(2000, 2010))


def test_staged_rows_are_locked_against_other_writers(cluster: MiniCluster) -> None:
    with cluster.client() as c, cluster.client() as other:
        txn = _begin(c)
        _write(c, txn, "a", _rows([3000, 3001], 1))
        # Another transaction on the same row: ABORTED after the lock wait, naming both.
        t2 = _begin(other)
        session = other.run(t2.new_session("a", timeout=2))
        other.run(session.apply(_rows([3000], 2)))
        with pytest.raises(TesseraError) as e:
            other.run(session.flush())
        assert "locked by transaction" in str(e.value) and str(txn.txn_id) in str(e.value)
        other.run(t2.abort())
        # A plain write waits until the transaction commits, then lands after it.
        done: list[int] = []
        writer = threading.Thread(
            target=lambda: done.append(other.write("a", _rows([3001], 9)).commit_timestamp)
        )
        writer.start()
        time.sleep(1.0)
        assert not done, "the plain write did not wait for the staged row"
        ts = c.run(txn.commit())
        writer.join(timeout=60)
        assert done and done[0] > ts
        got = _table(c, "a")
        assert got[3000] == 1 and got[3001] == 9


def test_a_row_changed_after_the_snapshot_is_a_write_conflict(cluster: MiniCluster) -> None:
    with cluster.client() as c, cluster.client() as other:
        c.write("a", _rows([3500, 3501], 1))
        txn = _begin(c)
        assert _table(c, "a", snapshot=txn.start_timestamp)[3500] == 1
        other.write("a", _rows([3500], 2))  # commits after the transaction's snapshot
        other.write("a", _rows([3502], 2), "insert")
        other.write("a", _rows([3502], 2), "delete")  # a deletion is a change too
        for key in (3500, 3502):
            with pytest.raises(Aborted, match="write conflict"):
                _write(c, txn, "a", _rows([key], 3))
        # Rows nobody changed since the snapshot are written; so are the transaction's own.
        assert not _write(c, txn, "a", _rows([3501], 3)).errors
        assert not _write(c, txn, "a", _rows([3501], 4)).errors
        c.run(txn.commit())
        got = _table(c, "a")
        assert got[3500] == 2 and got[3501] == 4 and 3502 not in got


def test_a_client_that_stops_sending_keepalives_is_aborted(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        txn = _begin(c)
        _write(c, txn, "b", _rows(range(4000, 4010), 1))
        txn.stop_keepalive()  # what a killed client does
        deadline = time.monotonic() + 30
        while c.call("transaction_state", txn.txn_id).state != "ABORTED":
            assert time.monotonic() < deadline, "not aborted without keep-alives"
            time.sleep(0.2)
        assert "keep-alive" in c.call("transaction_state", txn.txn_id).message
        assert not set(_table(c, "b")) & set(range(4000, 4010))
        assert not c.write("b", _rows(range(4000, 4010), 2)).errors  # unlocked


def test_a_long_transaction_kept_alive_commits(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        txn = _begin(c)
        _write(c, txn, "b", _rows([4100], 1))
        time.sleep(KEEPALIVE_MS / 1000 * 2)  # keep-alives carry it past two periods
        c.run(txn.commit())
        assert _table(c, "b")[4100] == 1


def test_only_the_owner_acts_on_a_transaction(cluster: MiniCluster) -> None:
    with _as(cluster, "alice") as alice, _as(cluster, "bob") as bob:
        txn = _begin(alice)
        _write(alice, txn, "shared", _rows([1, 2], 1))
        # Bob joins alice's transaction by its id: his rows are refused, hers stay.
        session = bob.run(bob.client.new_session("shared", txn_id=txn.txn_id))
        bob.run(session.apply(_rows([3], 66)))
        with pytest.raises(PermissionDenied):
            bob.run(session.flush())
        for call in ("CommitTransaction", "AbortTransaction", "KeepTransactionAlive"):
            req = getattr(pb, f"{call}RequestPB")(txn_id=txn.txn_id)
            with pytest.raises(PermissionDenied):
                bob.run(bob.client.master.call(call, req, 10))
        # A tablet server's certificate cannot commit a user's transaction either.
        ts_uuid = next(iter(cluster.tservers.values())).uuid
        with _as(cluster, ts_uuid, role="tserver") as server:
            req = pb.CommitTransactionRequestPB(txn_id=txn.txn_id)
            with pytest.raises(PermissionDenied):
                server.run(server.client.master.call("CommitTransaction", req, 10))
        alice.run(txn.commit())
        got = _table(alice, "shared")
        assert got == {1: 1, 2: 1}


def test_staged_rows_survive_a_restart_of_every_tablet_server(tmp_path: Path) -> None:
    with _cluster(tmp_path) as cluster, cluster.client() as c:
        c.call("create_table", "t", SCHEMA, HASHED, num_replicas=3)
        txn = _begin(c)
        _write(c, txn, "t", _rows(range(200), 1))
        for name in list(cluster.tservers):
            cluster.kill_tserver(name)
        for name in list(cluster.tservers):
            cluster.start_tserver(name)
        ts = _commit_retrying(c, txn)
        assert _every_replica(c, "t", ts) == dict.fromkeys(range(200), 1)


def test_a_big_transaction_commits_in_parts_on_every_replica(cluster: MiniCluster) -> None:
    """120,000 rows on one tablet: the commit is replicated as three parts (COMMIT_PART_ROWS
    at most each), all at one timestamp; a snapshot just before it sees none of them."""
    from service.tserver.txn_staging import COMMIT_PART_ROWS

    n = 2 * COMMIT_PART_ROWS + 20_000
    with cluster.client() as c:
        c.call("create_table", "big", SCHEMA, PartitionSchema(), num_replicas=3)
        txn = _begin(c)
        for lo in range(0, n, 40_000):
            _write(c, txn, "big", _rows(range(lo, min(n, lo + 40_000)), 1))
        ts = c.run(txn.commit())
        assert _every_replica(c, "big", ts) == dict.fromkeys(range(n), 1)
        assert _every_replica(c, "big", ts - 1) == {}


def _commit_retrying(c: SyncClient, txn: Transaction, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return c.run(txn.commit(timeout=20))
        except TesseraError as e:
            if isinstance(e, Aborted | PermissionDenied | FailedPrecondition):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.parametrize(
    "point",
    ["txn_commit:after_committing", "txn_commit:after_prepare", "txn_commit:after_committed"],
)
def test_the_coordinator_killed_at_each_step_of_a_commit(tmp_path: Path, point: str) -> None:
    """Every master runs with the failpoint (the first to reach it dies): the leader dies at
    the step; the new leader carries the transaction on. Before COMMITTED is recorded either
    ending is allowed (the client was never told), after it the rows must all be there; never
    a part of them."""
    once = tmp_path / "crashed"
    env = {failpoints.CRASH_AT: point, failpoints.ONCE_FILE: str(once)}
    with _cluster(tmp_path / "c") as cluster:
        names = list(cluster.masters.masters)
        for name in names:
            cluster.masters.kill(name)
        for name in names:
            cluster.masters.start_master(name, env=env)
        cluster.masters.wait_ready(names)
        cluster.wait_registered()
        with cluster.client() as c:
            c.call("create_table", "t", SCHEMA, HASHED, num_replicas=3)
            c.call("create_table", "u", SCHEMA, HASHED, num_replicas=3)
            txn = _begin(c)
            _write(c, txn, "t", _rows(range(300), 1))
            _write(c, txn, "u", _rows(range(100), 2))
            try:
                ts = _commit_retrying(c, txn)
            except Aborted:
                ts = 0
            assert once.exists(), "the failpoint was not reached"
            state = c.call("transaction_state", txn.txn_id)
            if point == "txn_commit:after_committed":
                assert state.state == "COMMITTED"
            assert state.state in ("COMMITTED", "ABORTED")
            assert (state.state == "COMMITTED") == bool(ts)
            at = ts or c.client.snapshot_now()
            t, u = _every_replica(c, "t", at), _every_replica(c, "u", at)
            if ts:
                assert t == dict.fromkeys(range(300), 1) and u == dict.fromkeys(range(100), 2)
            else:
                assert t == {} and u == {}
            _wait_resolved(c, txn.txn_id)


def _wait_resolved(c: SyncClient, txn_id: int, timeout: float = 60) -> None:
    """Wait until the master has finalized the transaction everywhere: a plain write to its
    rows then goes through at once (no lock left)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            c.write("t", _rows([0], 99))
            return
        except TesseraError:
            assert time.monotonic() < deadline
            time.sleep(0.5)


@pytest.mark.parametrize("point", ["txn_participant:after_prepare", "txn_participant:after_commit"])
def test_a_participant_leader_killed_at_each_step_of_a_commit(tmp_path: Path, point: str) -> None:
    once = tmp_path / "crashed"
    env = {failpoints.CRASH_AT: point, failpoints.ONCE_FILE: str(once)}
    with _cluster(tmp_path / "c") as cluster:
        for name in list(cluster.tservers):
            cluster.kill_tserver(name)
            cluster.start_tserver(name, env=env)
        cluster.wait_registered()
        with cluster.client() as c:
            c.call("create_table", "t", SCHEMA, HASHED, num_replicas=3)
            txn = _begin(c)
            _write(c, txn, "t", _rows(range(300), 1))
            ts = _commit_retrying(c, txn)
            assert once.exists()
            crashed = [n for n, t in cluster.tservers.items() if not t.alive]
            assert len(crashed) == 1
            cluster.start_tserver(crashed[0])
            assert _every_replica_eventually(c, "t", ts) == dict.fromkeys(range(300), 1)


def _every_replica_eventually(c: SyncClient, table: str, at: int) -> dict[int, int]:
    deadline = time.monotonic() + 90
    while True:
        try:
            return _every_replica(c, table, at)
        except (TesseraError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_streaming_batches_commit_once(cluster: MiniCluster) -> None:
    with cluster.client() as c:
        txn = _begin(c, stream_query="q1", stream_batch=7)
        _write(c, txn, "b", _rows([7000], 7))
        c.run(txn.commit())
        with pytest.raises(TesseraError, match="batch 7"):
            _begin(c, stream_query="q1", stream_batch=7)
        st = c.call("transaction_state", stream_query="q1", stream_batch=7)
        assert st.state == "COMMITTED" and st.txn_id == txn.txn_id
        assert st.last_committed_batch == 7
        # Every task of a batch begins it: they all get the one unfinished transaction, and
        # a commit that names attempts keeps only theirs (a re-run after a driver died).
        first = _begin(c, stream_query="q1", stream_batch=8)
        again = _begin(c, stream_query="q1", stream_batch=8)
        assert again.txn_id == first.txn_id
        s1 = c.run(first.new_session("b", attempt="run1-task0"))
        c.run(s1.apply(_rows([7001], 8)))
        c.run(s1.flush())
        s2 = c.run(again.new_session("b", attempt="run2-task0"))
        c.run(s2.apply(_rows([7002], 8)))
        c.run(s2.flush())
        c.run(again.commit(["run2-task0"]))
        first.stop_keepalive()
        got = _table(c, "b")
        assert 7001 not in got and got[7002] == 8
        # An aborted batch is begun afresh.
        doomed = _begin(c, stream_query="q1", stream_batch=9)
        c.run(doomed.abort())
        fresh = _begin(c, stream_query="q1", stream_batch=9)
        assert fresh.txn_id != doomed.txn_id
        c.run(fresh.abort())


def test_many_transactions_at_once_each_all_or_nothing(cluster: MiniCluster) -> None:
    """Eight clients, each running transactions that move an amount between two keys of a
    table (a bank): at every snapshot the total is the same."""
    with cluster.client() as setup:
        setup.call("create_table", "bank", SCHEMA, HASHED, num_replicas=3)
        setup.write("bank", _rows(range(40), 100))
    stop = threading.Event()
    failures: list[BaseException] = []
    committed = [0]

    def run(seed: int) -> None:
        import random

        rng = random.Random(seed)
        with cluster.client() as c:
            while not stop.is_set():
                a, b = rng.sample(range(40), 2)
                txn = _begin(c)
                try:
                    now = _table(c, "bank", snapshot=txn.start_timestamp)
                    amount = rng.randint(1, 10)
                    moved = pa.table(
                        {
                            "id": pa.array([a, b], pa.int64()),
                            "n": pa.array([now[a] - amount, now[b] + amount], pa.int64()),
                        }
                    )
                    _write(c, txn, "bank", moved)
                    c.run(txn.commit())
                    committed[0] += 1
                except TesseraError:
                    with_suppress_abort(c, txn)
                except BaseException as e:
                    failures.append(e)
                    return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    with cluster.client() as reader:
        deadline = time.monotonic() + 20
        checks = 0
        while time.monotonic() < deadline:
            total = sum(_table(reader, "bank", snapshot=True).values())
            assert total == 40 * 100, f"a snapshot saw part of a transfer: total {total}"
            checks += 1
        stop.set()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    assert committed[0] > 0 and checks > 3


def with_suppress_abort(c: SyncClient, txn: Transaction) -> None:
    try:
        c.run(txn.abort())
    except TesseraError:
        pass


def test_unauthorized_callers_of_the_transaction_rpcs_are_refused(cluster: MiniCluster) -> None:
    with cluster.client() as admin, _as(cluster, "alice") as alice:
        admin.call("create_table", "solo", SCHEMA, PartitionSchema(), num_replicas=1)
        admin.call("grant", "solo", "alice", ["write"])
        txn = _begin(alice)
        token = admin.scan_tokens("solo")[0]
        tablet = token.tablet_id
        # A user registers no participants (tablet servers do, for their own tablets).
        req = pb.RegisterParticipantsRequestPB(
            txn_id=txn.txn_id, tablet_ids=[tablet], on_behalf_of="user:alice"
        )
        with pytest.raises(PermissionDenied):
            alice.run(alice.client.master.call("RegisterParticipants", req, 10))
        # A tablet server registers only a tablet it hosts.
        hosting = {r.ts_uuid for r in token.replicas}
        other = next(t.uuid for t in cluster.tservers.values() if t.uuid not in hosting)
        with (
            _as(cluster, other, role="tserver") as server,
            pytest.raises(PermissionDenied, match="does not host"),
        ):
            server.run(server.client.master.call("RegisterParticipants", req, 10))
        # Bad requests name the problem and change nothing.
        with pytest.raises(InvalidArgument):
            alice.run(
                alice.client.master.call("BeginTransaction", pb.BeginTransactionRequestPB(), 10)
            )
        with pytest.raises(InvalidArgument):
            alice.run(
                alice.client.master.call(
                    "CommitTransaction", pb.CommitTransactionRequestPB(txn_id=0), 10
                )
            )
        # Only the leader master, fenced, prepares or commits on a tablet server: not a user,
        # not another tablet server.
        ts = next(t for t in cluster.tservers.values() if t.uuid in hosting)
        op = tpb.TxnParticipantOpRequestPB(
            dest_uuid=ts.uuid,
            tablet_id=tablet,
            txn_id=txn.txn_id,
            op=tpb.TxnParticipantOpRequestPB.ABORT,
        )
        for creds in (cluster.credentials("user", "alice"), cluster.credentials("tserver", other)):
            with open_sync_channel(ts.address, creds, role="tserver") as ch:
                stub = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
                with pytest.raises(Exception) as e:
                    stub.TxnParticipantOp(op, timeout=10)
                assert "PERMISSION_DENIED" in str(e.value)
        alice.run(txn.abort())


def test_a_participant_drops_an_aborted_transaction_the_coordinator_cannot_reach(
    tmp_path: Path,
) -> None:
    """The coordinator never reaches the participants with its abort (TxnFinalize skipped):
    the tablets' own sweep finds the transaction ABORTED at the coordinator and drops its
    staged rows, so its locks go and a snapshot read is not held back."""
    env = {failpoints.SKIP: "TxnFinalize"}
    tservers = {**TSERVERS, "txn_sweep_ms": "500"}
    with MiniCluster(tmp_path, master_overrides=MASTERS, tserver_overrides=tservers) as cluster:
        names = list(cluster.masters.masters)
        for name in names:
            cluster.masters.kill(name)
        for name in names:
            cluster.masters.start_master(name, env=env)
        cluster.masters.wait_ready(names)
        cluster.wait_registered()
        with cluster.client() as c:
            c.call("create_table", "t", SCHEMA, HASHED, num_replicas=3)
            txn = _begin(c)
            _write(c, txn, "t", _rows(range(30), 1))
            c.run(txn.abort("gone"))
            assert c.call("transaction_state", txn.txn_id).state == "ABORTED"
            # The rows are free once the sweep ran (a plain write waits for locks first).
            deadline = time.monotonic() + 60
            while True:
                try:
                    assert not c.write("t", _rows(range(30), 2)).errors
                    break
                except TesseraError:
                    assert time.monotonic() < deadline, "the aborted rows stayed locked"
            assert _every_replica(c, "t", c.client.snapshot_now()) == dict.fromkeys(range(30), 2)


def test_staging_past_the_tablet_limit_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    tservers = {**TSERVERS, "txn_max_staged_rows": "1000"}
    cluster = MiniCluster(tmp_path, master_overrides=MASTERS, tserver_overrides=tservers)
    with cluster, cluster.client() as c:
        c.call("create_table", "t", SCHEMA, PartitionSchema(), num_replicas=3)
        txn = _begin(c)
        assert not _write(c, txn, "t", _rows(range(900), 1)).errors
        with pytest.raises(ResourceExhausted, match="txn_max_staged_rows"):
            _write(c, txn, "t", _rows(range(900, 1200), 1))
        ts = c.run(txn.commit())  # what was staged within the limit commits
        assert _every_replica(c, "t", ts) == dict.fromkeys(range(900), 1)


def test_a_propagated_timestamp_from_the_far_future_is_refused(cluster: MiniCluster) -> None:
    """Found by the fuzzer: 2^64 - 1 overflowed the start timestamp (INTERNAL)."""
    with cluster.client() as c:
        for ts in ((1 << 64) - 1, (1 << 63)):
            req = pb.BeginTransactionRequestPB(propagated_timestamp=ts, keepalive_ms=2)
            with pytest.raises(InvalidArgument, match="propagated_timestamp"):
                c.run(c.client.master.ddl("BeginTransaction", req, 10))
