"""Records and writes of sys.catalog, built by hand for the state machine's unit tests.

`make_table` and `make_tablets` build a table of the two-column `SCHEMA` and its tablets (with
replicas, `make_consensus`, when servers are given); `create_table_write` is the CreateTable entry
of both; `apply_ok` and `refusal_of` apply a write to a `SysCatalogState` and check its outcome.
`FakeRaft` replicates by applying proposals straight to a `SysCatalogState`.
"""

from __future__ import annotations

import random

from service.common.ids import NodeId, TableId, TabletId
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.master.catalog_records import (
    CatalogWrite,
    ConsensusState,
    HostPort,
    Insert,
    MemberType,
    RaftPeer,
    RequestId,
    TableRecord,
    TableState,
    TabletRecord,
    TabletState,
)
from service.master.sys_catalog import ApplyResult, SysCatalogState
from service.pb import master_pb2

SCHEMA = Schema.build([("id", ColumnType.INT64), ("name", ColumnType.STRING)], "id")
"""The schema of `make_table`'s tables: id INT64 (the key), name STRING."""


class Ids:
    """Deterministic uuids (32 hex digits) from a seeded generator."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)

    def __call__(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"


def make_table(
    table_id: str,
    name: str = "t",
    *,
    buckets: int = 2,
    splits: int = 1,
    state: TableState = TableState.RUNNING,
) -> TableRecord:
    """A table record of `SCHEMA`: `buckets` hash buckets on id x `splits` ranges."""
    ps = PartitionSchema(
        hash=(HashBucketSchema(("id",), buckets),),
        split_rows=tuple((i * 1000,) for i in range(1, splits)),
    )
    return TableRecord(
        table_id=TableId(table_id),
        name=name,
        schema=SCHEMA,
        partition_schema=ps,
        state=state,
        num_replicas=3,
        created_time_us=1_700_000_000_000_000,
        altered_time_us=1_700_000_000_000_000,
        owner="alice",
    )


def make_consensus(servers: list[str], term: int = 1, config_index: int = 0) -> ConsensusState:
    """A config of `servers` as voters, the first of them leading."""
    peers = tuple(
        RaftPeer(NodeId(u), MemberType.VOTER, HostPort(f"ts-{u[:6]}.tessera.internal", 7050))
        for u in servers
    )
    return ConsensusState(term, config_index, peers, leader_uuid=NodeId(servers[0]))


def make_tablets(
    table: TableRecord,
    ids: Ids,
    *,
    servers: list[str] | None = None,
    replicas: int = 3,
) -> list[TabletRecord]:
    """`table`'s tablets: PREPARING, or CREATING on `replicas` of `servers` (round robin)."""
    out = []
    for i, partition in enumerate(table.partition_schema.create_partitions(table.schema)):
        consensus = None
        state = TabletState.PREPARING
        if servers is not None:
            chosen = [servers[(i + k) % len(servers)] for k in range(replicas)]
            consensus = make_consensus(chosen)
            state = TabletState.CREATING
        out.append(
            TabletRecord(
                tablet_id=TabletId(ids()),
                table_id=table.table_id,
                partition=partition,
                state=state,
                consensus=consensus,
                created_time_us=table.created_time_us,
            )
        )
    return out


def create_table_write(
    table: TableRecord, tablets: list[TabletRecord], request: RequestId | None = None
) -> CatalogWrite:
    """The CreateTable entry inserting `table` and its `tablets`, answered with its id."""
    response = master_pb2.CreateTableResponsePB(table_id=table.table_id).SerializeToString()
    return CatalogWrite(
        ops=(Insert(table), *(Insert(t) for t in tablets)),
        request_id=request,
        operation="CreateTable",
        response=response,
    )


def apply_ok(state: SysCatalogState, index: int, write: CatalogWrite) -> ApplyResult:
    """Apply `write` at `index`; it must not be refused."""
    result = state.apply(index, write.encode())
    assert result.ok, result.refusal
    return result


def refusal_of(state: SysCatalogState, index: int, write: CatalogWrite | bytes) -> tuple[str, str]:
    """Apply `write` at `index`; it must be refused, changing nothing: (code, message)."""
    data = write if isinstance(write, bytes) else write.encode()
    result = state.apply(index, data)
    assert result.refusal is not None, "expected a refusal"
    assert result.written == () and result.deleted == ()
    return result.refusal.code, result.refusal.message


class FakeRaft:
    """Stands in for `RaftNode.propose`: applies straight to `state` at increasing indexes
    (`index`, which a test may set), another leader's entries first if any are queued.

    The security tests' replicate; the catalog manager's tests use the fuller fake of
    tests/helpers/catalog_env.py (failures, a gate, the log).
    """

    def __init__(self, state: SysCatalogState) -> None:
        self.state = state
        self.index = 0
        self.proposals = 0
        self.other_leader_first: list[bytes] = []

    def apply(self, data: bytes) -> ApplyResult:
        self.index += 1
        return self.state.apply(self.index, data)

    async def __call__(self, data: bytes, timeout: float) -> ApplyResult:
        assert timeout > 0
        self.proposals += 1
        while self.other_leader_first:
            self.apply(self.other_leader_first.pop(0))
        return self.apply(data)
