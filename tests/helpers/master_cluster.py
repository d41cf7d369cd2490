"""Real master processes in the integration tests: stubs, a serving leader, and the table and
settings of the tests whose tablet servers are simulated (service/testing/ts_simulator.py).

`Masters` holds a sync stub per master of a `MasterCluster`; `serving_leader` finds the leader
that answers catalog calls and `wait` polls for it (or for anything else). `SCHEMA` and
`PARTITIONING` are the table those tests create; `OVERRIDES` are the master settings of a
cluster whose failovers and background tasks must be quick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from service.common.errors import NotReady, from_grpc
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT, MasterCluster

T = TypeVar("T")

SCHEMA = Schema.build([("k", ColumnType.STRING), ("v", ColumnType.INT64)], ("k",))
"""k STRING (the key), v INT64."""
PARTITIONING = PartitionSchema(hash=(HashBucketSchema(("k",), 4),), range=RangeSchema(()))
"""4 hash buckets on k: 4 tablets."""
OVERRIDES = {
    **FAST_RAFT,
    "bg_task_interval_ms": "100",
    "task_retry_initial_ms": "100",
    "task_retry_max_ms": "300",
    "tserver_rpc_timeout_ms": "2000",
    "unresponsive_timeout_ms": "3000",
}
"""Fast elections and quick task retries; servers unresponsive after 3 s."""


class Masters:
    """Sync stubs by address."""

    def __init__(self, cluster: MasterCluster) -> None:
        self.channels = {a: cluster.sync_channel(a) for a in cluster.addresses}
        self.stubs = {a: master_pb2_grpc.MasterServiceStub(c) for a, c in self.channels.items()}

    def __getitem__(self, address: str) -> master_pb2_grpc.MasterServiceStub:
        return self.stubs[address]

    def close(self) -> None:
        for c in self.channels.values():
            c.close()


def wait(what: str, fn: Callable[[], T | None], timeout: float = 20.0) -> T:
    """Poll `fn` until it returns something other than None, and return that; fail naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout}s")


def serving_leader(masters: Masters, candidates: list[str]) -> str | None:
    """The address of a leader that answers catalog calls (its catalog loaded), or None."""
    for address in candidates:
        try:
            r = masters[address].ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=1)
        except grpc.RpcError:
            continue
        if r.role != pb.LEADER:
            continue
        try:
            masters[address].ListTables(pb.ListTablesRequestPB(), timeout=1)
        except grpc.RpcError as e:
            if isinstance(from_grpc(e), NotReady):
                return None
            continue
        return address
    return None
