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
     reported COMMITTED state (never the pending config) becomes the tablet's consensus state,
     once it is confirmed. A CREATING tablet so reported becomes RUNNING.
     A report is a claim, not a fact (docs/design/catalog.md#R15): one tablet server's
     certificate (stolen, or a server gone bad) must not be enough to move a tablet's
     membership or its leader, since step 4 then tombstones the replicas the claim left out,
     and a false higher term would make every true report look stale. So a claim is adopted
     only when other servers' own words (`Evidence`: what each said of its replica in its own
     reports, or answered GetConsensusState at the address it registered) confirm it
     (`confirmation`):
       * a config that differs from the recorded one: held (committed or pending, the same op
         index and members) by a majority of the recorded config's voters, or, when it is one
         Raft step from the recorded config, by a majority of its own voters (which is what
         commits such a step in Raft); a higher op index alone never wins;
       * a new term or leader: a majority of the claim's voters know that leader in that term;
         a higher term alone never wins.
     The reporter counts for itself. Until confirmed the claim is ignored and listed in the
     plan's `unconfirmed`, and the heartbeat does not acknowledge the report, so the server
     sends it again; a later report of another voter that confirms it adopts it then (the
     handler keeps it as a pending claim, `plan_report(pending=...)`).
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
    "Answers",
    "ChangeReplicaConfig",
    "Claim",
    "ConfigChangeType",
    "DeleteReplica",
    "Evidence",
    "ReportAction",
    "ReportPlan",
    "ReportedRole",
    "ReportedState",
    "ReportedTablet",
    "TabletDecision",
    "confirmation",
    "decide",
    "one_step",
    "plan_report",
    "same_config",
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
    """The reported consensus state, when the answers did not confirm it (module docstring,
    step 3)."""


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


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one server says of its own replica of a tablet: its committed consensus state
    (current term, the leader it knows, committed config) and, if it told, its pending config
    (GetConsensusState does; a tablet report carries the committed state only)."""

    committed: ConsensusState
    pending: ConsensusState | None = None

    def holds(self, config: ConsensusState) -> bool:
        """This replica's log holds `config` (committed or pending: same op index, members)."""
        return same_config(self.committed, config) or (
            self.pending is not None and same_config(self.pending, config)
        )

    def follows(self, claim: ConsensusState) -> bool:
        """This replica knows the claim's leader in the claim's term."""
        c = self.committed
        return c.term == claim.term and c.leader_uuid == claim.leader_uuid


Answers: TypeAlias = Mapping[NodeId, Evidence]
"""What servers other than a claim's reporter say of one tablet, by server uuid."""


def _members(cs: ConsensusState) -> tuple[frozenset[str], frozenset[str]]:
    voters = _voters(cs)
    return voters, frozenset(p.uuid for p in cs.peers) - voters


def same_config(a: ConsensusState, b: ConsensusState) -> bool:
    """The same Raft config: the same op index and the same voters and non-voters. (Equal
    peer tuples, the common case of a full report, answer without building sets.)"""
    return a.config_index == b.config_index and (a.peers == b.peers or _members(a) == _members(b))


def one_step(base: ConsensusState, claim: ConsensusState) -> bool:
    """`claim` is one Raft membership step after `base`: a newer op index, and exactly one
    server added, removed, promoted or demoted (docs/design/consensus.md#R4)."""
    bv, bn = _members(base)
    cv, cn = _members(claim)
    changed = ((bv | bn) ^ (cv | cn)) | ((cv - bv) & bn) | ((bv - cv) & cn)
    return claim.config_index > base.config_index and len(changed) == 1


def _majority(voters: frozenset[str], agreeing: set[str]) -> bool:
    return 2 * len(voters & agreeing) > len(voters)


def confirmation(
    reporter: str, claim: ConsensusState, recorded: ConsensusState | None, answers: Answers
) -> str | None:
    """None when the other servers' words confirm `claim` against `recorded` (module
    docstring, step 3; docs/design/catalog.md#R15); otherwise why not, for logs. A tablet with
    no recorded config has none to protect."""
    if recorded is None:
        return None
    if not same_config(claim, recorded):
        if claim.config_index <= recorded.config_index:
            return (
                f"config op index {claim.config_index} is not newer than the recorded "
                f"{recorded.config_index}, yet its members differ"
            )
        holders = {reporter} | {u for u, e in answers.items() if e.holds(claim)}
        old, new = _voters(recorded), _voters(claim)
        if not (_majority(old, holders) or (one_step(recorded, claim) and _majority(new, holders))):
            return (
                f"config op index {claim.config_index} (voters {sorted(new)}) is held by "
                f"{sorted(holders & (old | new))} only: a majority of the recorded voters "
                f"{sorted(old)} must hold it (of its own voters, for a single step)"
            )
    if claim.term != recorded.term or claim.leader_uuid != recorded.leader_uuid:
        followers = {reporter} | {u for u, e in answers.items() if e.follows(claim)}
        voters = _voters(claim)
        if not _majority(voters, followers):
            return (
                f"leader {claim.leader_uuid} in term {claim.term} is known by "
                f"{sorted(followers & voters)} only, not by a majority of voters {sorted(voters)}"
            )
    return None


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
    answers: Answers | None = None,
) -> TabletDecision:
    """Steps 1-5 of the module docstring for one reported replica; `answers`: what the
    tablet's other servers said of it (step 3)."""
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
        elif (known is None or not _same(rcs, known)) and (
            refusal := confirmation(reporter, rcs, known, answers or {})
        ) is not None:
            leader = False
            unconfirmed = rcs
            notes.append(f"claim not confirmed, ignored for now: {refusal}")
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


@dataclass(frozen=True, slots=True)
class Claim:
    """A leader report that is waiting for confirmation (module docstring, step 3)."""

    reporter: NodeId
    reported: ReportedTablet

    @property
    def tablet_id(self) -> TabletId:
        return self.reported.tablet_id

    @property
    def consensus(self) -> ConsensusState:
        assert self.reported.consensus is not None
        return self.reported.consensus

    def changes_config(self, recorded: ConsensusState | None) -> bool:
        return recorded is not None and not same_config(self.consensus, recorded)


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
    unconfirmed: tuple[Claim, ...] = ()
    """Leader reports of this reporter that the answers did not confirm (module docstring,
    step 3): not adopted, and the report must not be acknowledged."""
    adopted: tuple[Claim, ...] = ()
    """Other servers' pending claims that this report's evidence confirmed: adopted by this
    plan's write."""


def plan_report(
    maps: CatalogMaps,
    reporter: NodeId,
    reported: Sequence[ReportedTablet],
    answers: Mapping[TabletId, Answers] | None = None,
    pending: Mapping[TabletId, Claim] | None = None,
) -> ReportPlan:
    """Decide about every replica of one report (the first of a repeated tablet id counts) and
    gather the record changes into one write. `answers`: what other servers said of each
    tablet (their reports, or GetConsensusState), the reporter's own word excluded. `pending`:
    other servers' unconfirmed claims about tablets of this report, adopted here when the
    answers (this report among them) now confirm them."""
    seen: set[str] = set()
    ops: list[RowOp] = []
    expected: list[Precondition] = []
    actions: list[ReportAction] = []
    updated: list[TabletId] = []
    orphans: list[TabletId] = []
    new_records: dict[TabletId, TabletRecord] = {}
    unconfirmed: list[Claim] = []
    adopted: list[Claim] = []
    for r in reported:
        if r.tablet_id in seen:
            continue
        seen.add(r.tablet_id)
        info = maps.tablets_by_id.get(r.tablet_id)
        table = maps.tables_by_id.get(info.table_id) if info is not None else None
        tablet_answers = _others(answers, r.tablet_id, reporter)
        d = decide(
            reporter,
            r,
            info.record if info is not None else None,
            table.record if table is not None else None,
            tablet_answers,
        )
        if info is None:
            orphans.append(r.tablet_id)
        if d.unconfirmed is not None:
            unconfirmed.append(Claim(reporter, r))
        actions.extend(d.actions)
        claim = pending.get(r.tablet_id) if pending else None
        if (
            d.update is None
            and claim is not None
            and claim.reporter != reporter
            and info is not None
            and table is not None
        ):
            # Another server's claim that this report may be the missing word for.
            theirs = decide(
                claim.reporter,
                claim.reported,
                info.record,
                table.record,
                _others(answers, r.tablet_id, claim.reporter),
            )
            if theirs.update is not None:
                adopted.append(claim)
                actions.extend(theirs.actions)
                d = theirs
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
        tuple(adopted),
    )


def _others(
    answers: Mapping[TabletId, Answers] | None, tablet_id: TabletId, reporter: NodeId
) -> Answers:
    """The answers about one tablet from servers other than `reporter` (whose own word is its
    report, counted once)."""
    if not answers:
        return {}
    got = answers.get(tablet_id)
    if not got:
        return {}
    if reporter not in got:
        return got
    return {u: e for u, e in got.items() if u != reporter}
