"""Three real master processes on loopback: DDL through the leader, failover, exactly-once.

Fake tablet servers are a loop in this test that heartbeats (with registration) to EVERY
master, as tablet servers do (docs/design/failover.md#R1), so the registry of a newly elected leader
is warm. The cluster is a context manager: every process is stopped (SIGTERM, then SIGKILL) even
when a test fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from service.common.errors import LEADER_ADDRESS_KEY, LEADER_UUID_KEY
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import common_pb2, master_pb2_grpc
from service.pb import master_pb2 as pb
from service.testing.master_cluster import MasterCluster
from tests.helpers.master_cluster import Masters, serving_leader, wait

pytestmark = pytest.mark.integration

RPC_TIMEOUT = 5.0
CLIENT = "test-client-1"
SCHEMA = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("value", ColumnType.DOUBLE)],
    ("host", "ts"),
)
# 3 hash buckets on host x 2 ranges on ts = 6 tablets.
PARTITIONING = PartitionSchema(
    hash=(HashBucketSchema(("host",), 3),), range=RangeSchema(("ts",)), split_rows=((1000,),)
)


class FakeTabletServers:
    """N tablet servers that heartbeat to every master every 100 ms, registering on request."""

    def __init__(self, masters: Masters, n: int) -> None:
        self.masters = masters
        self.uuids = [f"ts-{i}" for i in range(1, n + 1)]
        self.registered: dict[tuple[str, str], bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def beat_once(self) -> None:
        for i, uuid in enumerate(self.uuids):
            for address, stub in self.masters.stubs.items():
                req = pb.TSHeartbeatRequestPB(
                    instance=pb.NodeInstancePB(permanent_uuid=uuid, instance_seqno=1)
                )
                if not self.registered.get((uuid, address)):
                    req.registration.rpc_addresses.add(host="127.0.0.1", port=17050 + i)
                    req.registration.software_version = "test"
                try:
                    r = stub.TSHeartbeat(req, timeout=1)
                except grpc.RpcError:
                    continue  # a killed master
                self.registered[(uuid, address)] = not r.needs_reregister

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.beat_once()

    def __enter__(self) -> FakeTabletServers:
        self.beat_once()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _create_request(
    name: str = "metrics",
    seq_no: int = 1,
    num_replicas: int = 3,
    schema: common_pb2.SchemaPB | None = None,
) -> pb.CreateTableRequestPB:
    return pb.CreateTableRequestPB(
        request_id=pb.RequestIdPB(client_id=CLIENT, seq_no=seq_no),
        name=name,
        schema=schema if schema is not None else schema_to_pb(SCHEMA),
        partition_schema=partition_schema_to_pb(PARTITIONING, SCHEMA),
        num_replicas=num_replicas,
    )


def _error(fn: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


def _trailing(err: grpc.RpcError) -> dict[str, str]:
    call = err if isinstance(err, grpc.Call) else None
    pairs: Any = (call.trailing_metadata() if call is not None else None) or ()
    return {str(key): str(value) for key, value in pairs}


def _table_names(stub: master_pb2_grpc.MasterServiceStub) -> list[tuple[str, str]]:
    r = stub.ListTables(pb.ListTablesRequestPB(), timeout=RPC_TIMEOUT)
    return [(t.name, t.table_id) for t in r.tables]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MasterCluster]:
    # Insecure: FakeTabletServers heartbeat under three uuids over one channel, which a secured
    # master refuses by design (tests/integration/test_security.py).
    with MasterCluster(tmp_path, 3, secure=False) as c:
        yield c


def test_ddl_failover_exactly_once_and_bad_input(cluster: MasterCluster) -> None:
    masters = Masters(cluster)
    try:
        leader = wait("a serving leader", lambda: serving_leader(masters, cluster.addresses))
        with FakeTabletServers(masters, 3) as servers:
            assert all(servers.registered.get((u, a)) for u in servers.uuids for a in masters.stubs)

            # Create through the leader.
            created = masters[leader].CreateTable(_create_request(), timeout=RPC_TIMEOUT)
            table_id = created.table_id
            assert len(table_id) == 32

            # A follower refuses with NOT_THE_LEADER and the leader's address.
            follower = next(a for a in cluster.addresses if a != leader)
            err = _error(
                lambda: masters[follower].CreateTable(
                    _create_request(seq_no=2), timeout=RPC_TIMEOUT
                )
            )
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            trailing = _trailing(err)
            assert trailing[LEADER_ADDRESS_KEY] == leader
            assert trailing[LEADER_UUID_KEY] == cluster.by_address(leader).uuid

            # The leader shows it.
            assert _table_names(masters[leader]) == [("metrics", table_id)]
            schema = masters[leader].GetTableSchema(
                pb.GetTableSchemaRequestPB(table=pb.TableIdentifierPB(table_name="metrics")),
                timeout=RPC_TIMEOUT,
            )
            assert schema.table_id == table_id
            assert [c.name for c in schema.schema.columns] == ["host", "ts", "value"]
            assert list(schema.schema.key_column_names) == ["host", "ts"]
            assert schema.num_replicas == 3
            done = masters[leader].IsCreateTableDone(
                pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
                timeout=RPC_TIMEOUT,
            )
            assert done.tablets_total == 6

            # ListMasters: this master's own figures.
            listed = masters[leader].ListMasters(pb.ListMastersRequestPB(), timeout=RPC_TIMEOUT)
            me = next(
                m
                for m in listed.masters
                if f"{m.rpc_addresses[0].host}:{m.rpc_addresses[0].port}" == leader
            )
            assert me.role == pb.LEADER and me.committed_index > 0 and me.term > 0

            # Bad input names the field.
            err = _error(
                lambda: masters[leader].AddMaster(pb.AddMasterRequestPB(), timeout=RPC_TIMEOUT)
            )
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "rpc_address" in (err.details() or "")
            err = _error(
                lambda: masters[leader].MoveReplica(pb.MoveReplicaRequestPB(), timeout=RPC_TIMEOUT)
            )
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "tablet_id: required" in (err.details() or "")

            # Kill -9 the leader; a new one takes over with the same catalog.
            cluster.kill(cluster.by_address(leader).name)
            survivors = [a for a in cluster.addresses if a != leader]
            new_leader = wait("a new serving leader", lambda: serving_leader(masters, survivors))
            assert _table_names(masters[new_leader]) == [("metrics", table_id)]
            schema2 = masters[new_leader].GetTableSchema(
                pb.GetTableSchemaRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
                timeout=RPC_TIMEOUT,
            )
            assert schema2 == schema

            # Exactly-once: the retry of the original request gets the original id.
            retried = masters[new_leader].CreateTable(_create_request(), timeout=RPC_TIMEOUT)
            assert retried.table_id == table_id

            # Bad input: refused with a message naming the problem, nothing created.
            no_key = schema_to_pb(SCHEMA)
            del no_key.key_column_names[:]
            cases = [
                (_create_request(name="", seq_no=10), grpc.StatusCode.INVALID_ARGUMENT, "name"),
                (
                    _create_request(name="nokey", seq_no=11, schema=no_key),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "key_column_names",
                ),
                (
                    _create_request(name="even", seq_no=12, num_replicas=2),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "odd",
                ),
                (
                    # A new leader is in its warm-up: retryable, not definite (a client retries).
                    _create_request(name="toomany", seq_no=13, num_replicas=5),
                    grpc.StatusCode.UNAVAILABLE,
                    "live tablet servers, have 3",
                ),
            ]
            for request, code, words in cases:
                with pytest.raises(grpc.RpcError) as info:
                    masters[new_leader].CreateTable(request, timeout=RPC_TIMEOUT)
                err = info.value
                assert err.code() == code, (request.name, err)
                assert words in (err.details() or ""), (request.name, err.details())
            assert _table_names(masters[new_leader]) == [("metrics", table_id)]

            # The killed master restarts under the same uuid (its instance file) and rejoins
            # as a follower that points at the new leader.
            old = cluster.by_address(leader)
            cluster.start_master(old.name)
            cluster.wait_ready([old.name])
            assert (old.data_dir / "instance").read_text().strip() == old.uuid

            def follows_new_leader() -> bool | None:
                try:
                    r = masters[leader].ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=1)
                except grpc.RpcError:
                    return None
                hint = f"{r.leader_address.host}:{r.leader_address.port}"
                return True if r.role == pb.FOLLOWER and hint == new_leader else None

            wait("the restarted master follows the new leader", follows_new_leader)
            err = _error(
                lambda: masters[leader].ListTables(pb.ListTablesRequestPB(), timeout=RPC_TIMEOUT)
            )
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert _trailing(err)[LEADER_ADDRESS_KEY] == new_leader
    finally:
        masters.close()
