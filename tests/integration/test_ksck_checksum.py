"""`tessera cluster ksck --checksum` on a real secured cluster: replicas that agree check
clean; rows outside a tablet's partition are found on exactly the replicas that hold them
(docs/design/tablets.md#R2); and the remedy the report gives for them works.

Such rows cannot be planted over RPC any more: the leader refuses every row outside its
tablet's partition before it is replicated, and no other RPC writes rows. So the test plants
them the way only a server's own code could, under a server that is not running: a tablet
server is stopped (SIGTERM) once its replica's row store holds in files every write it
applied (a short `flush_idle_ms`), the row store is opened from the test (`RowStore.open` on
`<data_dir>/tablets/<tablet>/data`), three rows whose keys belong to other tablets (one of
them a key the table already holds in its own tablet) are applied as an UPSERT at the index
after the replica's last applied one and flushed, and the server is started again. The store
then says it holds every entry up to that index, so the replay after the restart skips only
entries that are not writes (none is written to the table afterwards; a write at that index
would be skipped on that replica).

First on one follower: ksck names it, with the count and the keys, and its digest differs
from its peers'. Then on the other two replicas as well, which is what a server that accepted
such a write through Raft left: the replicas agree, each holds the three rows, the tablet's
leader refuses a DELETE of them (OUTSIDE_PARTITION), and `tessera table copy --create
--operation insert --no-transactional`, the rewrite the report prescribes, makes a table that
holds every key once and checks clean.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest

from service.common.keys import encode_key
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_from_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster
from service.testing.tablet_fixtures import ipc
from service.tools import cli, ksck_cmd
from service.tserver.row_ops import RowOp, decode_write
from service.tserver.rowstore import MANIFEST, RowStore, _parse_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
HASHED = PartitionSchema(hash=(HashBucketSchema(("id",), 4),), range=RangeSchema(()))
TABLE = "events"
ROWS = 400

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    # Idle replicas flush at once, so a stopped server's row store holds all it applied.
    overrides = {**FAST_TSERVER, "flush_idle_ms": "300"}
    with MiniCluster(tmp_path_factory.mktemp("ksck-checksum"), tserver_overrides=overrides) as c:
        with c.client() as admin:
            admin.call("create_table", TABLE, SCHEMA, HASHED, num_replicas=3)
            admin.write(TABLE, _rows(range(ROWS)))
        yield c


def _rows(ids: Any) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _wait(what: str, fn: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _ksck(
    cluster: MiniCluster, capsys: pytest.CaptureFixture[str], fmt: str = "json", tables: str = ""
) -> tuple[int, str]:
    argv = ["ksck", "--masters", ",".join(cluster.master_addresses), "--timeout", "5"]
    argv += ["--credentials", cluster.credentials_dir() or "", "--checksum", "--format", fmt]
    argv += ["--tables", tables] if tables else []
    capsys.readouterr()
    code = ksck_cmd.main(argv)
    return code, capsys.readouterr().out


def _locations(cluster: MiniCluster) -> pb.GetTableLocationsResponsePB:
    def ask() -> pb.GetTableLocationsResponsePB | None:
        leader = cluster.masters.leader()[0]
        with cluster.sync_channel(leader) as ch:
            r = master_pb2_grpc.MasterServiceStub(ch).GetTableLocations(
                pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_name=TABLE)),
                timeout=10,
            )
        has_leader = all(any(x.role == pb.LEADER for x in t.replicas) for t in r.tablet_locations)
        return r if has_leader else None

    return _wait("every tablet to have a leader", ask)


def _applied(cluster: MiniCluster, uuid: str, tablet_id: str) -> int:
    ts = cluster.tserver_by_uuid(uuid)
    with cluster.sync_channel(ts.address) as ch:
        listed = tserver_pb2_grpc.TabletServerAdminServiceStub(ch).ListTablets(
            tpb.ListTabletsRequestPB(dest_uuid=uuid), timeout=10
        )
    return next(r.last_applied_index for r in listed.replicas if r.tablet_id == tablet_id)


def _flushed(data: Path) -> int:
    """The row store's flushed index as its manifest says, read without opening the store
    (`RowStore.open` removes files the manifest does not list: not while a server runs it)."""
    path = data / MANIFEST
    return _parse_manifest(path, path.read_bytes()).flushed_index


def _data(cluster: MiniCluster, uuid: str, tablet_id: str) -> Path:
    return cluster.tserver_by_uuid(uuid).data_dir / "tablets" / tablet_id / "data"


def _stop(cluster: MiniCluster, uuid: str) -> None:
    ts = cluster.tserver_by_uuid(uuid)
    cluster.kill_tserver(ts.name, signal.SIGTERM)
    assert ts.proc is not None
    ts.proc.wait(timeout=30)


def _plant(data: Path, ids: list[int], applied: int, loaded: int) -> None:
    """Rows `ids` into a stopped server's row store, at the index after the replica's last
    applied one (module docstring); every write up to `loaded` must be in its files."""
    store = RowStore.open(data)
    assert store.flushed_index >= loaded, (store.flushed_index, loaded)
    batch = decode_write(store.schema, ipc(_rows(ids)), RowOp.UPSERT, [])
    assert store.apply_write(max(applied, store.applied_index) + 1, batch).rows_applied == 3
    store.flush()
    store.close()


def _ksck_until(
    cluster: MiniCluster,
    capsys: pytest.CaptureFixture[str],
    what: str,
    ok: Callable[[dict[str, Any]], bool],
) -> tuple[int, dict[str, Any]]:
    def ask() -> tuple[int, dict[str, Any]] | None:
        code, out = _ksck(cluster, capsys)
        report = json.loads(out)
        return (code, report) if ok(report) else None

    return _wait(what, ask)


def _only_bad_tablet(report: dict[str, Any], tablet_id: str, health: str) -> dict[str, Any] | None:
    bad = report["unhealthy_tablets"]
    if [(t["tablet_id"], t["health"]) for t in bad] != [(tablet_id, health)]:
        return None
    tablet: dict[str, Any] = bad[0]
    return tablet


def test_ksck_checksum_finds_rows_outside_a_tablets_partition(
    cluster: MiniCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _ksck(cluster, capsys)
    report = json.loads(out)
    assert code == 0, out
    assert report["healthy"] and report["checksum"]["checked"]
    assert report["checksum"]["replicas_matched"] == 4 * 3
    assert report["checksum"]["rows_outside_partition"] == [] and report["remedies"] == []

    # --- 1. on one follower ------------------------------------------------------------------

    loc = _locations(cluster)
    tablet = loc.tablet_locations[0]
    tid = tablet.tablet_id
    partition = partition_from_pb(tablet.partition)
    victim = next(r for r in tablet.replicas if r.role != pb.LEADER).ts_uuid
    uuids = [r.ts_uuid for r in tablet.replicas]
    others = [u for u in uuids if u != victim]
    address = {u: cluster.tserver_by_uuid(u).address for u in uuids}

    def settled() -> int | None:
        """The index every replica applied, once each one's files hold it."""
        indexes = {_applied(cluster, u, tid) for u in uuids}
        if len(indexes) != 1:
            return None
        (index,) = indexes
        return index if all(_flushed(_data(cluster, u, tid)) == index for u in uuids) else None

    loaded = _wait("every replica to apply and flush the load", settled)

    # Keys of other tablets: one the table holds already (in its own tablet), two new ones.
    def outside(i: int) -> bool:
        return not partition.contains(HASHED.partition_key_for_row(SCHEMA, {"id": i}))

    held = next(i for i in range(ROWS) if outside(i))
    fresh = [i for i in range(10_000, 10_100) if outside(i)][:2]
    planted = sorted([held, *fresh], key=lambda i: encode_key(SCHEMA, [i]))
    keys = ", ".join(f"(id={i})" for i in planted)
    own = sum(not outside(i) for i in range(ROWS))

    _stop(cluster, victim)
    _plant(_data(cluster, victim, tid), planted, loaded, loaded)
    cluster.start_tserver(cluster.tserver_by_uuid(victim).name)

    code, report = _ksck_until(
        cluster,
        capsys,
        "ksck to find the rows on the follower",
        lambda r: _only_bad_tablet(r, tid, "CHECKSUM_MISMATCH") is not None,
    )
    assert code == 1
    bad = _only_bad_tablet(report, tid, "CHECKSUM_MISMATCH")
    assert bad is not None and bad["outside_partition_rows"] == 3
    assert report["checksum"]["rows_outside_partition"] == [
        {"table": TABLE, "tablet_id": tid, "partition": bad["partition"], "rows": 3}
    ]
    # The victim's peers agree with each other, as do all replicas of the other tablets.
    assert report["checksum"]["replicas_matched"] == 4 * 3 - 1
    assert [r for r in bad["reasons"] if r.startswith("ROWS_OUTSIDE_PARTITION:")] == [
        f"ROWS_OUTSIDE_PARTITION: replica on {address[victim]} holds 3 live row(s) whose key "
        f"lies outside the tablet's partition: {keys}"
    ], bad["reasons"]
    (mismatch,) = [r for r in bad["reasons"] if r.startswith("CHECKSUM_MISMATCH:")]
    assert f"{address[victim]}: {own + 3} rows" in mismatch, mismatch
    assert all(f"{address[u]}: {own} rows" in mismatch for u in others), mismatch
    (remedy,) = report["remedies"]
    assert (
        f"tessera table copy {TABLE} {TABLE}_rewritten --create --operation insert "
        "--no-transactional" in remedy
    )

    code, text = _ksck(cluster, capsys, "plain")
    assert code == 1 and "NOT HEALTHY" in text
    assert f"ROWS_OUTSIDE_PARTITION: replica on {address[victim]} holds 3 live row(s)" in text
    assert f"  tessera table copy {TABLE} {TABLE}_rewritten" in text

    # --- 2. on every replica, as an old server's accepted write left them ----------------------

    applied = {u: _applied(cluster, u, tid) for u in others}
    for u in others:
        _stop(cluster, u)
    for u in others:
        _plant(_data(cluster, u, tid), planted, applied[u], loaded)
    for u in others:
        cluster.start_tserver(cluster.tserver_by_uuid(u).name)

    code, report = _ksck_until(
        cluster,
        capsys,
        "ksck to find the rows on every replica",
        lambda r: _only_bad_tablet(r, tid, "ROWS_OUTSIDE_PARTITION") is not None,
    )
    assert code == 1 and report["checksum"]["replicas_matched"] == 4 * 3
    bad = _only_bad_tablet(report, tid, "ROWS_OUTSIDE_PARTITION")
    assert bad is not None
    who = ", ".join(address[u] for u in sorted(uuids))
    assert bad["reasons"] == [
        f"ROWS_OUTSIDE_PARTITION: replicas on {who} each hold 3 live row(s) whose key lies "
        f"outside the tablet's partition: {keys}"
    ]

    code, text = _ksck(cluster, capsys, "plain")
    assert code == 1 and f"ROWS_OUTSIDE_PARTITION: replicas on {who} each hold 3" in text

    # They cannot be deleted in place: the tablet's leader refuses every one of them.
    leader = next(r for r in _locations(cluster).tablet_locations if r.tablet_id == tid)
    lead = next(r for r in leader.replicas if r.role == pb.LEADER)
    with cluster.sync_channel(f"{lead.rpc_address.host}:{lead.rpc_address.port}") as ch:
        resp = tserver_pb2_grpc.TabletServerServiceStub(ch).Write(
            tpb.WriteRequestPB(
                dest_uuid=lead.ts_uuid,
                tablet_id=tid,
                rows=ipc(_rows(planted).select(["id"])),
                default_op=tpb.ROW_OP_DELETE,
            ),
            timeout=20,
        )
    assert resp.rows_applied == 0
    assert [e.error.code for e in resp.per_row_errors] == ["OUTSIDE_PARTITION"] * 3

    # The remedy: a rewrite puts every key once into the tablet that owns it. The key held
    # twice goes in once; its other copy is refused and the copy fails naming it.
    new = f"{TABLE}_rewritten"
    argv = ["table", "copy", TABLE, new, "--create", "--operation", "insert", "--no-transactional"]
    argv += ["--masters", ",".join(cluster.master_addresses)]
    argv += ["--credentials", cluster.credentials_dir() or ""]
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code != 0 and f"key ({held},): ALREADY_EXISTS" in err, (code, err)
    with cluster.client() as c:
        ids = c.call("scan", new).column("id").to_pylist()
    assert sorted(ids) == sorted(set(range(ROWS)) | set(fresh))
    code, out = _ksck(cluster, capsys, tables=new)
    assert code == 0, out
    assert json.loads(out)["checksum"]["replicas_matched"] == 4 * 3
