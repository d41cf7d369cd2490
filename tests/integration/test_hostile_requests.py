"""Requests a server must refuse at once, on real processes.

* One AlterTable with 10,000 add-column steps (169 KB) froze the master leader's event loop
  for 12-39 s and cost it leadership every time. Now a request with more steps than a table
  can have columns is refused with INVALID_ARGUMENT before any step is decoded, and the
  leader keeps its term.
* A scan with read_mode = 99 and one with a garbage lower-bound key were accepted; one with
  min_applied_index = 2^64 - 1 hung for 30 s before DEADLINE_EXCEEDED. Each is now
  INVALID_ARGUMENT naming the field, within a second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from service.client.scanner import ScanToken
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import column_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("hostile-requests")) as c:
        with c.client() as client:
            client.call("create_table", "t", SCHEMA, PartitionSchema(range=RangeSchema(("id",))))
        yield c


def test_an_alter_with_ten_thousand_steps_is_refused_at_once(cluster: MiniCluster) -> None:
    leader, term = cluster.masters.leader()
    col = Schema.build([("k", ColumnType.INT64), ("c", ColumnType.INT32)], key="k").column("c")
    req = pb.AlterTableRequestPB(
        request_id=pb.RequestIdPB(client_id="hostile", seq_no=1),
        table=pb.TableIdentifierPB(table_name="t"),
    )
    for i in range(10_000):
        step = req.steps.add()
        step.add_column.column.CopyFrom(column_to_pb(col))
        step.add_column.column.name = f"c{i}"
    assert req.ByteSize() > 100_000
    with cluster.sync_channel(leader) as ch:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            master_pb2_grpc.MasterServiceStub(ch).AlterTable(req, timeout=30)
        took = time.monotonic() - t0
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "10000 alter steps" in (e.value.details() or "") and "at most 300" in (
        e.value.details() or ""
    )
    assert took < 2.0, took
    time.sleep(1.0)  # longer than an election timeout of the test's Raft timing
    assert cluster.masters.leader() == (leader, term)  # no election happened
    with cluster.client() as c:
        assert c.call("open_table", "t", refresh=True).schema.column_names == ("id", "v")


def _scan(
    cluster: MiniCluster, token: ScanToken, **fields: object
) -> grpc.RpcError | tpb.ScanResponsePB:
    leader = next(r for r in token.replicas if r.is_leader)
    ns = tpb.NewScanRequestPB(tablet_id=token.tablet_id, **fields)  # type: ignore[arg-type]
    req = tpb.ScanRequestPB(dest_uuid=leader.ts_uuid, new_scan=ns)
    with cluster.sync_channel(leader.address) as ch:
        try:
            return tserver_pb2_grpc.TabletServerServiceStub(ch).Scan(req, timeout=30)
        except grpc.RpcError as e:
            return e


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"read_mode": 99}, "read_mode: unknown read mode 99"),
        ({"lower_bound_primary_key": b"\x01garbage!!"}, "lower_bound_primary_key: not a key"),
        ({"exclusive_upper_bound_primary_key": b"\xff"}, "exclusive_upper_bound_primary_key"),
        ({"min_applied_index": 2**64 - 1}, "min_applied_index: 18446744073709551615 is beyond"),
    ],
    ids=["read_mode", "lower_key", "upper_key", "min_applied_index"],
)
def test_bad_scan_fields_are_refused_at_once(
    cluster: MiniCluster, fields: dict[str, object], names: str
) -> None:
    with cluster.client() as c:
        (token,) = c.scan_tokens("t")
    t0 = time.monotonic()
    got = _scan(cluster, token, **fields)
    took = time.monotonic() - t0
    assert isinstance(got, grpc.RpcError), got
    assert got.code() is grpc.StatusCode.INVALID_ARGUMENT, got
    assert names in (got.details() or ""), got.details()
    assert took < 2.0, took
    # A good scan still works.
    ok = _scan(cluster, token)
    assert not isinstance(ok, grpc.RpcError), ok


NOT_PROTOBUF = b"\xff\xff\xff\xff\x0f garbage"
BAD_UTF8 = b"\x0a\x03\xff\xfe\xfd"  # field 1, a string (or, nested, a message's string 1)
NESTED_BAD_UTF8 = b"\x0a\x05" + BAD_UTF8


@pytest.mark.parametrize("case", ["not protobuf", "invalid UTF-8"])
@pytest.mark.parametrize(
    ("service", "method", "server", "bad_utf8"),
    [
        ("tessera.master.MasterService", "CreateTable", "master", b"\x12\x03\xff\xfe\xfd"),
        ("tessera.master.MasterService", "GetTableLocations", "master", NESTED_BAD_UTF8),
        ("tessera.master.MasterService", "TSHeartbeat", "master", NESTED_BAD_UTF8),
        ("tessera.tserver.TabletServerService", "Write", "tserver", BAD_UTF8),
        ("tessera.tserver.TabletServerService", "Scan", "tserver", BAD_UTF8),
        ("tessera.tserver.TabletServerAdminService", "DeleteTablet", "tserver", BAD_UTF8),
    ],
    ids=["CreateTable", "GetTableLocations", "TSHeartbeat", "Write", "Scan", "DeleteTablet"],
)
def test_undecodable_requests_are_invalid_argument_naming_the_message(
    cluster: MiniCluster, service: str, method: str, server: str, bad_utf8: bytes, case: str
) -> None:
    """Garbage bodies and invalid UTF-8 were UNKNOWN with a DecodeError text and an ERROR
    traceback in the server's log; now INVALID_ARGUMENT naming the message type."""
    body = NOT_PROTOBUF if case == "not protobuf" else bad_utf8
    if server == "master":
        address = cluster.masters.leader()[0]
        creds = cluster.credentials()
    else:
        ts = next(iter(cluster.tservers.values()))
        address = ts.address
        # A role the method allows, so the decode (not the policy) is what refuses it.
        creds = cluster.credentials("tserver" if method == "TSHeartbeat" else "admin", ts.uuid)
    if method == "TSHeartbeat":
        creds = cluster.credentials("tserver", "ts-garbage")
    from service.common.tls import open_sync_channel

    with open_sync_channel(address, creds) as ch:
        call = ch.unary_unary(
            f"/{service}/{method}", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as e:
            call(body, timeout=10)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
    assert (e.value.details() or "").startswith("undecodable "), e.value.details()
    assert "RequestPB" in (e.value.details() or ""), e.value.details()
    log = next(iter(cluster.tservers.values())).log if server == "tserver" else None
    if log is not None:
        assert "Traceback" not in log.read_text()
