"""Tablet reports for the master's tests: one tablet's records, and whole reports of a catalog.

`TABLE`, `CREATING` and `RUNNING` are the records report processing is judged against: a table
`T` (schema version 2) and its one tablet `X` on `PEERS`, CREATING under `CONFIG0` or RUNNING
with ts-0 leading term 1. `leader_reports` is what every server of an `Env` would report, and
`heartbeat_context` / `report_entry` hand such reports to `handle_heartbeat` as the leader
master's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from service.common.ids import NodeId, TableId, TabletId
from service.common.partition import Partition
from service.master.catalog_records import (
    ConsensusState,
    HostPort,
    MemberType,
    RaftPeer,
    TableRecord,
    TableState,
    TabletRecord,
    TabletState,
    consensus_state_to_pb,
)
from service.master.heartbeat import HeartbeatContext, ReportGate
from service.master.report_processing import ReportedRole, ReportedState, ReportedTablet
from service.pb import master_pb2 as pb
from tests.helpers.catalog_env import PARTITIONING, SCHEMA, Env

T = TableId("a" * 32)
X = TabletId("b" * 32)
PEERS = tuple(
    RaftPeer(NodeId(f"ts-{i}"), MemberType.VOTER, HostPort(f"10.0.0.{i}", 7050)) for i in range(3)
)
CONFIG0 = ConsensusState(term=0, config_index=0, peers=PEERS)
TABLE = TableRecord(
    table_id=T,
    name="t",
    schema=replace(SCHEMA, version=2),
    partition_schema=PARTITIONING,
    state=TableState.RUNNING,
    num_replicas=3,
)
CREATING = TabletRecord(
    X, T, Partition((), b"", b"", b"", b""), TabletState.CREATING, consensus=CONFIG0
)
RUNNING = replace(
    CREATING,
    state=TabletState.RUNNING,
    consensus=replace(CONFIG0, term=1, leader_uuid=NodeId("ts-0")),
    reported_schema_version=2,
)


def leader_reports(env: Env, table_id: str, schema: int = 0) -> dict[str, list[ReportedTablet]]:
    """What each server would report: LEADER for tablets it is first peer of, else FOLLOWER."""
    out: dict[str, list[ReportedTablet]] = {}
    for row in env.state.tablets_of(table_id):
        rec = row.record
        assert rec.consensus is not None
        leader = rec.consensus.peers[0].uuid
        c = dataclasses.replace(rec.consensus, term=1, leader_uuid=leader)
        for p in rec.consensus.peers:
            role = ReportedRole.LEADER if p.uuid == leader else ReportedRole.FOLLOWER
            out.setdefault(p.uuid, []).append(
                ReportedTablet(rec.tablet_id, ReportedState.RUNNING, role, c, schema)
            )
    return out


def heartbeat_context(env: Env, gate: ReportGate) -> HeartbeatContext:
    """`handle_heartbeat`'s context on the leader (term 2) of `env`'s catalog, `gate` reading."""
    return HeartbeatContext(
        master_instance=pb.NodeInstancePB(permanent_uuid="m" * 32, instance_seqno=1),
        term=2,
        leading=True,
        master_addresses=(),
        ts_manager=env.ts,
        catalog=env.cm,
        submit=lambda actions: None,
        reports=gate,
    )


def report_entry(t: ReportedTablet) -> pb.ReportedTabletPB:
    """`t` as an entry of a tablet report on the wire."""
    assert t.consensus is not None
    return pb.ReportedTabletPB(
        tablet_id=t.tablet_id,
        state=t.state.value,
        role=t.role.value,
        consensus_state=consensus_state_to_pb(t.consensus),
        schema_version=t.schema_version,
    )
