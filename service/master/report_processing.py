"""Tablet report processing: what the leader master does about one reported replica. PURE.

Theory of operation
-------------------
Tablet servers heartbeat to every master with a tablet report: full after a registration or
when a (new) leader asks for it (KUDU-1374), incremental (the replicas that changed) otherwise.
Only the leader processes reports (followers record liveness only, docs/design/failover.md#R1). Each
reported replica is judged here against COMMITTED catalog state alone (the tablet's and its table's
records), in the steps of docs/design/catalog.md#R14 (Kudu's report handling, with the fixes of its
multi-master audit):

  1. No record of the tablet (or of its table): do NOTHING. A tablet the master never recorded
     is not one it deleted (records of deleted tables and tablets are kept forever), so deleting
     it would be the one unfenced decision of appendix A; such "true orphans" are left alone.
  2. The tablet is DELETED or REPLACED, or its table REMOVED: DeleteTablet(TABLET_DATA_DELETED)
     to the reporter. Appendix A case 2: persistent state consulted, a decision that cannot
     become wrong, so it needs no compare-and-set.
  3. The reporter is the LEADER of its reported committed config (role LEADER, leader_uuid is
     itself, a VOTER of that config, the replica not FAILED) and that consensus state is not
     older than the recorded one (term and config op index both >=) and differs from it: the
     reported COMMITTED state (never the pending config) becomes the tablet's consensus state.
     A CREATING tablet so reported becomes RUNNING ("if t CREATING and has leader": RUNNING
     when its leader reports it).
     A report that would ADD voters to the recorded config, or that comes from a server that
     is not a recorded voter, is a claim about other servers: one tablet server's certificate
     (stolen, or a server gone bad) must not be enough to move a tablet's membership, since
     step 4 then tombstones the replicas the claim left out. Such a report is adopted only once
     another voter (of the reported or the recorded config) confirms it with its own committed
     config: the same one, or one the claim follows from by removals with the reporter a voter
     in it (`needs_confirmation`, `confirms`; the leader asks them with GetConsensusState,
     `confirmed` holds what they answered). Until then it is ignored and listed in the plan's
     `unconfirmed`, and the heartbeat does not acknowledge the report, so the server sends it
     again. A recorded voter's report of the same voters or fewer needs no confirmation.
  4. The reporter is not a peer of the newest committed config the master knows (it was
     evicted), its replica is not already tombstoned, and its own committed config is not newer
     than the master's: DeleteTablet(TABLET_DATA_TOMBSTONED) with `cas_config_opid_index` = the
     master's config op index, so a replica re-added in a newer config is not deleted by a stale
     decision (compare-and-set, docs/design/tablet_copy.md#R8).
  5. The leader of a RUNNING tablet: its schema version is recorded as the tablet's
     `reported_schema_version` when higher; if it is older than the table's, AlterSchema to it
     (idempotent, retried by the next report).

`plan_report` runs the steps for every tablet of one report and gathers every record change
into ONE `CatalogWrite` (one replicated entry per heartbeat, not one per tablet), each updated
row with a precondition on the version it was read at. The same write moves an ALTERING table
back to RUNNING (clearing its fully applied schema) once every RUNNING tablet's leader reported
the table's schema version. Its RPCs (`actions`) are side effects, carried out after the write
committed (docs/design/catalog.md#R7); they are safe to repeat.

Nothing here does I/O, reads a clock or draws randomness; tests drive it table by table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

from service.common.ids import NodeId, TableId, TabletId
from service.master.catalog_info import CatalogMaps
from service.master.catalog_records import (
    CatalogWrite,
    ConsensusState,
    MemberType,
    Precondition,
    RaftPeer,
    RecordType,
    RowKey,
    RowOp,
    TableRecord,
    TableState,
    TabletRecord,
    TabletState,
    Update,
)

__all__ = [
    "REPORT_OPERATION",
    "AlterReplica",
    "ChangeReplicaConfig",
    "ConfigChangeType",
    "DeleteReplica",
    "ReportAction",
    "ReportPlan",
    "ReportedRole",
    "ReportedState",
    "ReportedTablet",
    "TabletDecision",
    "confirms",
    "decide",
    "needs_confirmation",
    "plan_report",
]

REPORT_OPERATION = "TabletReport"


class ReportedState(enum.Enum):
    """A replica's state on its server (master.proto's ReplicaStatePB, by name)."""

    UNKNOWN = 0
    NOT_STARTED = 1
    BOOTSTRAPPING = 2
    RUNNING = 3
    FAILED = 4
    STOPPED = 5
    COPYING = 6
    TOMBSTONED = 7


class ReportedRole(enum.Enum):
    """A replica's role in its Raft group as reported (RaftRolePB, by name)."""

    UNKNOWN = 0
    LEADER = 1
    FOLLOWER = 2
    LEARNER = 3
    NON_PARTICIPANT = 4


@dataclass(frozen=True, slots=True)
class ReportedTablet:
    """One replica as its server reported it (ReportedTabletPB, decoded and validated)."""

    tablet_id: TabletId
    state: ReportedState
    role: ReportedRole
    consensus: ConsensusState | None
    """The replica's COMMITTED consensus state (current term, leader, committed config); None
    when not reported. A pending config is never recorded."""
    schema_version: int = 0


# --- actions (RPCs to send once the write committed) -----------------------------------------


@dataclass(frozen=True, slots=True)
class DeleteReplica:
    """DeleteTablet to `server`: TOMBSTONED (evicted: keep consensus metadata) with a CAS on
    the config op index, or DELETED (tablet or table deleted)."""

    tablet_id: TabletId
    server: NodeId
    tombstone: bool
    cas_config_opid_index: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class AlterReplica:
    """AlterSchema to the table's current schema, sent to `server` (the tablet's leader)."""

    tablet_id: TabletId
    table_id: TableId
    server: NodeId
    schema_version: int


class ConfigChangeType(enum.Enum):
    """tserver.proto's ChangeConfigRequestPB.ChangeType, by name."""

    ADD_PEER = 1
    REMOVE_PEER = 2
    PROMOTE_PEER = 3


@dataclass(frozen=True, slots=True)
class ChangeReplicaConfig:
    """ChangeConfig sent to the tablet's leader `leader`, compare-and-set on the committed
    config op index (docs/design/tablet_copy.md#R8). Decided by `rereplication`."""

    tablet_id: TabletId
    leader: NodeId
    change: ConfigChangeType
    peer: RaftPeer
    cas_config_opid_index: int
    reason: str


ReportAction: TypeAlias = DeleteReplica | AlterReplica | ChangeReplicaConfig


# --- one tablet ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TabletDecision:
    """What to do about one reported replica: the tablet's new record (None: unchanged) and
    the RPCs to send after it committed; `note` says why, for logs and tests."""

    update: TabletRecord | None = None
    actions: tuple[ReportAction, ...] = ()
    note: str = ""
    unconfirmed: ConsensusState | None = None
    """The reported consensus state, when it needs another voter's confirmation that
    `confirmed` did not hold (module docstring, step 3)."""


def _older(reported: ConsensusState, recorded: ConsensusState) -> bool:
    return reported.term < recorded.term or reported.config_index < recorded.config_index


def _same(a: ConsensusState, b: ConsensusState) -> bool:
    return (
        a.term == b.term
        and a.config_index == b.config_index
        and a.leader_uuid == b.leader_uuid
        and tuple((p.uuid, p.member_type, p.promote) for p in a.peers)
        == tuple((p.uuid, p.member_type, p.promote) for p in b.peers)
    )


def _with_addresses(reported: ConsensusState, recorded: ConsensusState | None) -> ConsensusState:
    """`reported`, each peer without an address given the one recorded for it, if any."""
    if recorded is None or all(p.last_known_addr is not None for p in reported.peers):
        return reported
    peers = []
    for p in reported.peers:
        if p.last_known_addr is None:
            old = recorded.peer(p.uuid)
            if old is not None and old.last_known_addr is not None:
                p = replace(p, last_known_addr=old.last_known_addr)
        peers.append(p)
    return replace(reported, peers=tuple(peers))


def _voters(cs: ConsensusState) -> frozenset[str]:
    return frozenset(p.uuid for p in cs.peers if p.member_type is MemberType.VOTER)


def _follows(reporter: str, claim: ConsensusState, base: ConsensusState) -> bool:
    """`claim` can only have come from `base` by removing voters (or by none), and its
    reporter is a voter of `base`: it names no server `base` did not already trust."""
    voters = _voters(base)
    return (
        reporter in voters and _voters(claim) <= voters and claim.config_index >= base.config_index
    )


def needs_confirmation(
    reporter: str, reported: ConsensusState, recorded: ConsensusState | None
) -> bool:
    """A leader report that adds voters to the recorded config, or whose reporter is not a
    recorded voter, claims something about other servers (module docstring, step 3). A new
    leader of the same voters, or a config that only removed voters, reported by a recorded
    voter, needs nobody's word (a bad member could shrink its tablets' configs, but it holds
    their data already). A tablet with no recorded config has none to protect."""
    if recorded is None:
        return False
    return not _follows(reporter, reported, recorded)


def confirms(answer: ConsensusState | None, claim: ConsensusState, reporter: str) -> bool:
    """Another voter's own committed consensus state `answer` confirms `claim`: the same
    config (op index and voters), or one the claim follows from by removals with the reporter
    a voter of it (the voter saw the reporter added, and the claim removed voters since: a
    replica moved off a one-replica tablet is reported as the new replica alone, and nobody
    else is left in its config to ask). Its term may differ (it may not have heard of the
    latest election yet)."""
    if answer is None:
        return False
    same = answer.config_index == claim.config_index and _voters(answer) == _voters(claim)
    return same or _follows(reporter, claim, answer)


def is_leader_report(reporter: str, reported: ReportedTablet) -> bool:
    """The reporter says it leads its committed config (step 3 of the module docstring). A
    FAILED replica never does: its Raft loop stopped in whatever role it had."""
    cs = reported.consensus
    if reported.state is ReportedState.FAILED:
        return False
    if reported.role is not ReportedRole.LEADER or cs is None or cs.leader_uuid != reporter:
        return False
    peer = cs.peer(reporter)
    return peer is not None and peer.member_type is MemberType.VOTER


def decide(
    reporter: NodeId,
    reported: ReportedTablet,
    tablet: TabletRecord | None,
    table: TableRecord | None,
    confirmed: ConsensusState | None = None,
) -> TabletDecision:
    """Steps 1-5 of the module docstring for one reported replica; `confirmed`: another
    voter's answer about this tablet, if one was asked (step 3)."""
    tid = reported.tablet_id
    if tablet is None or table is None:
        return TabletDecision(
            note="no record of the tablet: left alone (docs/design/failover.md#R6)"
        )
    if tablet.state.is_terminal or table.is_removed:
        if tablet.state is TabletState.REPLACED:
            why = f"tablet {tid} was replaced by {tablet.replaced_by}"
        elif table.is_removed:
            why = f"table {table.name!r} was deleted"
        else:
            why = f"tablet {tid} was deleted"
        return TabletDecision(
            actions=(DeleteReplica(tid, reporter, False, None, why),), note="deleted"
        )
    new = tablet
    rcs = reported.consensus
    leader = is_leader_report(reporter, reported)
    notes: list[str] = []
    unconfirmed = None
    if leader and rcs is not None and new.state in (TabletState.CREATING, TabletState.RUNNING):
        known = new.consensus
        if known is not None and _older(rcs, known):
            leader = False  # a deposed leader's late report: nothing to learn from it
            notes.append("stale leader report ignored")
        elif (
            (known is None or not _same(rcs, known))
            and needs_confirmation(reporter, rcs, known)
            and not confirms(confirmed, rcs, reporter)
        ):
            leader = False
            unconfirmed = rcs
            notes.append("membership claim not confirmed by another voter: ignored for now")
        else:
            if known is None or not _same(rcs, known):
                new = replace(new, consensus=_with_addresses(rcs, known))
                notes.append("consensus state recorded")
            if new.state is TabletState.CREATING:
                new = replace(new, state=TabletState.RUNNING, state_msg="")
                notes.append("RUNNING")
    else:
        leader = False
    actions: list[ReportAction] = []
    cs = new.consensus
    if (
        cs is not None
        and cs.peer(reporter) is None
        and reported.state is not ReportedState.TOMBSTONED
        and (rcs is None or rcs.config_index <= cs.config_index)
    ):
        actions.append(
            DeleteReplica(
                tid,
                reporter,
                True,
                cs.config_index,
                f"server {reporter} is not a peer of tablet {tid}'s committed config "
                f"(op index {cs.config_index})",
            )
        )
        notes.append("evicted: tombstone")
    elif leader and new.state is TabletState.RUNNING:
        version = min(reported.schema_version, table.schema_version)
        if version > new.reported_schema_version:
            new = replace(new, reported_schema_version=version)
            notes.append(f"schema version {version} recorded")
        if reported.schema_version < table.schema_version:
            actions.append(AlterReplica(tid, table.table_id, reporter, table.schema_version))
            notes.append("alter")
    return TabletDecision(
        new if new != tablet else None, tuple(actions), "; ".join(notes), unconfirmed
    )


# --- one report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportPlan:
    """One report's decisions: ONE write (None when nothing changes) and the RPCs to send once
    it committed, in report order."""

    write: CatalogWrite | None
    actions: tuple[ReportAction, ...] = ()
    updated_tablets: tuple[TabletId, ...] = ()
    updated_tables: tuple[TableId, ...] = ()
    orphans: tuple[TabletId, ...] = ()
    """Reported tablets with no catalog record (left alone)."""
    unconfirmed: tuple[tuple[TabletId, ConsensusState], ...] = ()
    """Leader reports that need another voter's confirmation (module docstring, step 3):
    not adopted, and the report must not be acknowledged."""


def plan_report(
    maps: CatalogMaps,
    reporter: NodeId,
    reported: Sequence[ReportedTablet],
    confirmed: Mapping[TabletId, ConsensusState] | None = None,
) -> ReportPlan:
    """Decide about every replica of one report (the first of a repeated tablet id counts) and
    gather the record changes into one write. `confirmed`: other voters' answers about the
    tablets a previous plan of this report listed as `unconfirmed`."""
    seen: set[str] = set()
    ops: list[RowOp] = []
    expected: list[Precondition] = []
    actions: list[ReportAction] = []
    updated: list[TabletId] = []
    orphans: list[TabletId] = []
    new_records: dict[TabletId, TabletRecord] = {}
    unconfirmed: list[tuple[TabletId, ConsensusState]] = []
    for r in reported:
        if r.tablet_id in seen:
            continue
        seen.add(r.tablet_id)
        info = maps.tablets_by_id.get(r.tablet_id)
        table = maps.tables_by_id.get(info.table_id) if info is not None else None
        d = decide(
            reporter,
            r,
            info.record if info is not None else None,
            table.record if table is not None else None,
            confirmed.get(r.tablet_id) if confirmed else None,
        )
        if info is None:
            orphans.append(r.tablet_id)
        if d.unconfirmed is not None:
            unconfirmed.append((r.tablet_id, d.unconfirmed))
        actions.extend(d.actions)
        if d.update is not None and info is not None:
            ops.append(Update(d.update))
            expected.append(Precondition(RowKey(RecordType.TABLET, info.tablet_id), info.version))
            updated.append(info.tablet_id)
            new_records[info.tablet_id] = d.update
    tables_done: list[TableId] = []
    for table_id in sorted({new_records[t].table_id for t in new_records}):
        table_info = maps.tables_by_id[table_id]
        rec = table_info.record
        if rec.state is not TableState.ALTERING:
            continue
        version = rec.schema_version
        if all(
            new_records.get(t.tablet_id, t.record).reported_schema_version >= version
            for t in table_info.live_tablets()
            if new_records.get(t.tablet_id, t.record).state is TabletState.RUNNING
        ):
            ops.append(Update(replace(rec, state=TableState.RUNNING, fully_applied_schema=None)))
            expected.append(Precondition(RowKey(RecordType.TABLE, table_id), table_info.version))
            tables_done.append(table_id)
    write = (
        CatalogWrite(ops=tuple(ops), expected=tuple(expected), operation=REPORT_OPERATION)
        if ops
        else None
    )
    return ReportPlan(
        write,
        tuple(actions),
        tuple(updated),
        tuple(tables_done),
        tuple(orphans),
        tuple(unconfirmed),
    )
