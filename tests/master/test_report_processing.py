"""Tablet report processing, table-driven from the steps of docs/design/catalog.md#R14, then whole
reports through the catalog manager (ONE write per report)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from service.common.errors import Timeout
from service.common.ids import NodeId, TabletId
from service.common.schema import AddColumn, ColumnType
from service.master.catalog_records import (
    ConsensusState,
    MemberType,
    RaftPeer,
    TableRecord,
    TableState,
    TabletRecord,
    TabletState,
)
from service.master.report_processing import (
    REPORT_OPERATION,
    AlterReplica,
    Answers,
    DeleteReplica,
    Evidence,
    ReportedRole,
    ReportedState,
    ReportedTablet,
    confirmation,
    decide,
    one_step,
)
from tests.helpers.catalog_env import (
    Ids,
    by_id,
    create,
    make_env,
    run,
)
from tests.helpers.tablet_reports import (
    CREATING,
    PEERS,
    RUNNING,
    TABLE,
    T,
    X,
    leader_reports,
)


def cs(
    term: int, leader: str | None, index: int = 0, peers: tuple[RaftPeer, ...] = PEERS
) -> ConsensusState:
    return ConsensusState(term, index, peers, NodeId(leader) if leader else None)


def rep(
    role: ReportedRole,
    consensus: ConsensusState | None,
    *,
    schema: int = 2,
    state: ReportedState = ReportedState.RUNNING,
) -> ReportedTablet:
    return ReportedTablet(X, state, role, consensus, schema)


LEADER, FOLLOWER = ReportedRole.LEADER, ReportedRole.FOLLOWER
NEW_PEERS = (*PEERS[:2], RaftPeer(NodeId("ts-3"), MemberType.VOTER))

AGREE = ("ts-0", "ts-1", "ts-2", "ts-3")
"""Every other server of the case's config says what the report says (its own word)."""

# (name, tablet record or None, table record, reporter, report, servers whose own word agrees
#  with the report, expected update (field -> value) or None, expected actions)
CASES = [
    ("no record: never deleted (appendix A)", None, TABLE, "ts-0", rep(LEADER, cs(1, "ts-0")),
     AGREE, None, []),
    ("deleted tablet: DELETED", replace(RUNNING, state=TabletState.DELETED), TABLE, "ts-1",
     rep(FOLLOWER, cs(1, "ts-0")), (), None, ["delete ts-1 DELETED"]),
    ("replaced tablet: DELETED", replace(CREATING, state=TabletState.REPLACED,
     replaced_by=TabletId("c" * 32)), TABLE, "ts-2", rep(LEADER, cs(1, "ts-2")), (), None,
     ["delete ts-2 DELETED"]),
    ("removed table: DELETED", RUNNING, replace(TABLE, state=TableState.REMOVED), "ts-0",
     rep(LEADER, cs(1, "ts-0")), (), None, ["delete ts-0 DELETED"]),
    ("CREATING + leader of the committed config, a follower agrees: RUNNING", CREATING, TABLE,
     "ts-0", rep(LEADER, cs(1, "ts-0")), ("ts-1",),
     {"state": TabletState.RUNNING, "term": 1, "leader": "ts-0"}, []),
    ("CREATING + leader of the committed config, alone: not yet", CREATING, TABLE, "ts-0",
     rep(LEADER, cs(1, "ts-0")), (), None, []),
    ("CREATING + follower: nothing", CREATING, TABLE, "ts-1", rep(FOLLOWER, cs(1, "ts-0")),
     AGREE, None, []),
    ("CREATING + LEADER role naming another leader: nothing", CREATING, TABLE, "ts-1",
     rep(LEADER, cs(1, "ts-0")), AGREE, None, []),
    ("CREATING + leaderless report: nothing", CREATING, TABLE, "ts-0", rep(LEADER, cs(0, None)),
     AGREE, None, []),
    ("RUNNING + newer committed config from its leader, not confirmed: nothing yet", RUNNING,
     TABLE, "ts-0", rep(LEADER, cs(2, "ts-0", 5, NEW_PEERS)), (), None, []),
    ("RUNNING + newer committed config, ts-1 holds it too: recorded", RUNNING, TABLE, "ts-0",
     rep(LEADER, cs(2, "ts-0", 5, NEW_PEERS)), ("ts-1",),
     {"index": 5, "peers": ("ts-0", "ts-1", "ts-3")}, []),
    ("a leader the recorded config does not name, alone: not adopted",
     RUNNING, TABLE, "ts-9", rep(LEADER, cs(9, "ts-9", 9, (*PEERS[:2],
     RaftPeer(NodeId("ts-9"), MemberType.VOTER)))), (), None, []),
    ("RUNNING + new leader same config, a follower agrees: recorded", RUNNING, TABLE, "ts-1",
     rep(LEADER, cs(2, "ts-1")), ("ts-2",), {"term": 2, "leader": "ts-1"}, []),
    ("RUNNING + new leader same config, alone: not yet", RUNNING, TABLE, "ts-1",
     rep(LEADER, cs(2, "ts-1")), (), None, []),
    ("RUNNING + stale leader (older term): ignored", replace(RUNNING, consensus=cs(3, "ts-1")),
     TABLE, "ts-0", rep(LEADER, cs(2, "ts-0"), schema=0), AGREE, None, []),
    ("RUNNING + same state again: nothing", RUNNING, TABLE, "ts-0", rep(LEADER, cs(1, "ts-0")),
     (), None, []),
    ("evicted replica: TOMBSTONED with cas on the known config", replace(RUNNING,
     consensus=cs(2, "ts-0", 5, NEW_PEERS)), TABLE, "ts-2", rep(FOLLOWER, cs(1, "ts-0")),
     (), None, ["tombstone ts-2 cas 5"]),
    ("evicted but its config is newer than the master's: nothing", RUNNING, TABLE, "ts-9",
     rep(FOLLOWER, cs(3, "ts-0", 7, (*PEERS, RaftPeer(NodeId("ts-9"), MemberType.NON_VOTER)))),
     (), None, []),
    ("evicted and already tombstoned: nothing", replace(RUNNING,
     consensus=cs(2, "ts-0", 5, NEW_PEERS)), TABLE, "ts-2",
     rep(FOLLOWER, cs(1, "ts-0"), state=ReportedState.TOMBSTONED), (), None, []),
    ("a FAILED replica claiming to lead a newer term: nothing learned from it", RUNNING,
     TABLE, "ts-1", rep(LEADER, cs(2, "ts-1"), state=ReportedState.FAILED), AGREE, None, []),
    ("evicted FAILED replica: TOMBSTONED with cas", replace(RUNNING,
     consensus=cs(2, "ts-0", 5, NEW_PEERS)), TABLE, "ts-2",
     rep(ReportedRole.UNKNOWN, None, state=ReportedState.FAILED), (), None,
     ["tombstone ts-2 cas 5"]),
    ("leader on an old schema: AlterSchema, version recorded", replace(RUNNING,
     reported_schema_version=0), TABLE, "ts-0", rep(LEADER, cs(1, "ts-0"), schema=1), (),
     {"schema": 1}, ["alter ts-0 to 2"]),
    ("leader on the table's schema: version recorded", replace(RUNNING,
     reported_schema_version=1), TABLE, "ts-0", rep(LEADER, cs(1, "ts-0"), schema=2), (),
     {"schema": 2}, []),
    ("follower on an old schema: nothing (its leader is asked)", RUNNING, TABLE, "ts-1",
     rep(FOLLOWER, cs(1, "ts-0"), schema=0), (), None, []),
    ("CREATING + leader on an old schema, a follower agrees: RUNNING and AlterSchema",
     CREATING, TABLE, "ts-0", rep(LEADER, cs(1, "ts-0"), schema=0), ("ts-2",),
     {"state": TabletState.RUNNING, "schema": 0}, ["alter ts-0 to 2"]),
]  # fmt: skip


def _agreeing(report: ReportedTablet, servers: tuple[str, ...], reporter: str) -> Answers:
    assert report.consensus is not None or not servers or servers == AGREE
    if report.consensus is None:
        return {}
    return {NodeId(u): Evidence(report.consensus) for u in servers if u != reporter}


def _action(a: object) -> str:
    if isinstance(a, DeleteReplica):
        if a.tombstone:
            return f"tombstone {a.server} cas {a.cas_config_opid_index}"
        return f"delete {a.server} DELETED"
    assert isinstance(a, AlterReplica)
    return f"alter {a.server} to {a.schema_version}"


def _ev(c: ConsensusState, pending: ConsensusState | None = None) -> Evidence:
    return Evidence(c, pending)


def test_a_config_claim_needs_a_majority_of_the_recorded_voters_to_hold_it() -> None:
    """A leader report that changes the config is a claim about other servers: adopted only
    when a majority of the recorded config's voters hold it (the reporter counting for
    itself), never on the reporter's word, whatever its term or op index."""
    claim = cs(2, "ts-0", 5, NEW_PEERS)
    report = rep(LEADER, claim)
    d = decide(NodeId("ts-0"), report, RUNNING, TABLE)
    assert d.update is None and d.unconfirmed == claim
    # ts-1 holds it, committed or pending: with the reporter, 2 of the 3 recorded voters.
    for said in (_ev(cs(2, "ts-0", 5, NEW_PEERS)), _ev(cs(2, "ts-0"), cs(2, "ts-0", 5, NEW_PEERS))):
        d = decide(NodeId("ts-0"), report, RUNNING, TABLE, {NodeId("ts-1"): said})
        assert d.update is not None and d.update.consensus is not None and d.unconfirmed is None
        assert tuple(p.uuid for p in d.update.consensus.peers) == ("ts-0", "ts-1", "ts-3")
    # A voter that holds another config, or ts-3 (in the claim only: one step is not this
    # claim, which swaps two servers), or nobody: not confirmed.
    for answers in (
        {NodeId("ts-1"): _ev(cs(2, "ts-0", 5, PEERS))},
        {NodeId("ts-1"): _ev(cs(2, "ts-0", 6, NEW_PEERS))},
        {NodeId("ts-3"): _ev(cs(2, "ts-0", 5, NEW_PEERS))},
        {},
    ):
        d = decide(NodeId("ts-0"), report, RUNNING, TABLE, answers)
        assert d.update is None and d.unconfirmed == claim


def test_the_attack_of_one_member_claiming_to_be_the_only_voter_is_never_adopted() -> None:
    """A follower's server claims LEADER, term 1000, op index 1000, voters = {itself}. The
    other voters say what they really hold; adopted, the claim would have had them
    tombstoned."""
    forged = cs(1000, "ts-1", 1000, (PEERS[1],))
    honest = {NodeId("ts-0"): _ev(cs(1, "ts-0")), NodeId("ts-2"): _ev(cs(1, "ts-0"))}
    for answers in (honest, {}):
        d = decide(NodeId("ts-1"), rep(LEADER, forged), RUNNING, TABLE, answers)
        assert d.update is None and d.unconfirmed == forged and d.actions == ()
    # The same with the recorded voters, a higher term alone: no new leader either.
    term_only = cs(1000, "ts-1")
    d = decide(NodeId("ts-1"), rep(LEADER, term_only), RUNNING, TABLE, honest)
    assert d.update is None and d.unconfirmed == term_only
    assert confirmation("ts-1", forged, RUNNING.consensus, honest) is not None


def test_one_step_is_committed_by_its_own_majority() -> None:
    """A single Raft step is committed by a majority of the new config (Raft thesis, 4.1):
    the removal of a voter that never heard of it is still adopted when the remaining voters
    hold it; a two-voter config losing one is adopted on the remaining voter's word."""
    removal = cs(2, "ts-0", 5, PEERS[:2])
    assert one_step(RUNNING.consensus, removal)  # type: ignore[arg-type]
    d = decide(NodeId("ts-0"), rep(LEADER, removal), RUNNING, TABLE, {NodeId("ts-1"): _ev(removal)})
    assert d.update is not None
    # Remove ts-2 AND ts-1 (two steps) on ts-0's word: refused.
    two = cs(2, "ts-0", 5, PEERS[:1])
    assert not one_step(RUNNING.consensus, two)  # type: ignore[arg-type]
    d = decide(NodeId("ts-0"), rep(LEADER, two), RUNNING, TABLE, {})
    assert d.update is None
    # A one-replica tablet moved from ts-0 to ts-3: ts-3 added, promoted, ts-0 removed; the
    # last step reported by ts-3 is adopted on its word once the master knows the step before.
    pair = replace(
        RUNNING, consensus=cs(2, "ts-3", 6, (PEERS[0], RaftPeer(NodeId("ts-3"), MemberType.VOTER)))
    )
    moved = cs(2, "ts-3", 7, (RaftPeer(NodeId("ts-3"), MemberType.VOTER),))
    d = decide(NodeId("ts-3"), rep(LEADER, moved), pair, TABLE)
    assert d.update is not None and d.update.consensus == moved


def test_a_new_leader_needs_a_majority_that_knows_it() -> None:
    claim = cs(2, "ts-1")
    knows = _ev(cs(2, "ts-1"))
    voted_elsewhere = _ev(cs(2, "ts-2"))
    assert decide(NodeId("ts-1"), rep(LEADER, claim), RUNNING, TABLE, {NodeId("ts-2"): knows})
    for answers in ({NodeId("ts-2"): voted_elsewhere}, {NodeId("ts-9"): knows}, {}):
        d = decide(NodeId("ts-1"), rep(LEADER, claim), RUNNING, TABLE, answers)
        assert d.update is None and d.unconfirmed == claim


@pytest.mark.parametrize(
    ("tablet", "table", "reporter", "report", "agree", "update", "actions"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide(
    tablet: TabletRecord | None,
    table: TableRecord,
    reporter: str,
    report: ReportedTablet,
    agree: tuple[str, ...],
    update: dict[str, object] | None,
    actions: list[str],
) -> None:
    d = decide(NodeId(reporter), report, tablet, table, _agreeing(report, agree, reporter))
    assert [_action(a) for a in d.actions] == actions
    if update is None:
        assert d.update is None, d.note
        return
    assert d.update is not None and tablet is not None, d.note
    got = d.update
    assert got.consensus is not None
    view = {
        "state": got.state,
        "term": got.consensus.term,
        "leader": got.consensus.leader_uuid,
        "index": got.consensus.config_index,
        "peers": tuple(p.uuid for p in got.consensus.peers),
        "schema": got.reported_schema_version,
    }
    assert {k: view[k] for k in update} == update
    # Unchanged fields stay; a recorded peer's address is kept when the report has none.
    assert (got.tablet_id, got.table_id, got.partition) == (X, T, tablet.partition)
    for p in got.consensus.peers:
        old = tablet.consensus.peer(p.uuid) if tablet.consensus else None
        if old is not None and old.last_known_addr is not None:
            assert p.last_known_addr == old.last_known_addr


# --- whole reports through the catalog manager -----------------------------------------------


def _note_all(env: object, reports: dict[str, list[ReportedTablet]]) -> None:
    """What the heartbeats do before they process: every server's word is heard (claims.py),
    so each leader's claim finds its followers' agreement."""
    for uuid, tablets in sorted(reports.items()):
        env.cm.note_replica_states(NodeId(uuid), tablets, full=True)  # type: ignore[attr-defined]


def test_a_full_report_is_one_write_and_makes_tablets_running() -> None:
    async def main() -> None:
        env = make_env()
        table_id = await create(env)
        await env.cm.assign_tablets()
        before = env.raft.proposals
        reports = leader_reports(env, table_id)
        _note_all(env, reports)
        for uuid, tablets in sorted(reports.items()):
            plan = await env.cm.process_report(NodeId(uuid), tablets)
            assert plan.actions == ()
        # One write per reporting server that leads something, none for pure followers.
        leaders = {t.consensus.leader_uuid for ts in reports.values() for t in ts if t.consensus}
        assert env.raft.proposals - before == len(leaders)
        status = await env.cm.is_create_table_done(by_id(table_id))
        assert status.done and status.tablets_running == 6
        entry = env.raft.log[-1]
        assert REPORT_OPERATION.encode() in entry
        # Processing the same reports again changes nothing and writes nothing.
        before = env.raft.proposals
        for uuid, tablets in sorted(reports.items()):
            await env.cm.process_report(NodeId(uuid), tablets)
        assert env.raft.proposals == before

    run(main())


def test_reports_processed_together_share_one_entry() -> None:
    async def main() -> None:
        env = make_env(servers=6)
        table_id = await create(env)
        await env.cm.assign_tablets()
        reports = leader_reports(env, table_id)
        leaders = {t.consensus.leader_uuid for ts in reports.values() for t in ts if t.consensus}
        assert len(leaders) > 1
        _note_all(env, reports)
        before = env.raft.proposals
        await asyncio.gather(
            *(env.cm.process_report(NodeId(u), tablets) for u, tablets in reports.items())
        )
        assert env.raft.proposals - before == 1  # group commit: one entry for all of them
        rows = [r.record for r in env.state.tablets_of(table_id)]
        assert {r.state for r in rows} == {TabletState.RUNNING}

    run(main())


def test_alter_done_when_every_leader_reports_the_version_in_the_same_write() -> None:
    async def main() -> None:
        env = make_env()
        table_id = await create(env)
        await env.cm.assign_tablets()
        first = leader_reports(env, table_id)
        _note_all(env, first)
        for uuid, tablets in sorted(first.items()):
            await env.cm.process_report(NodeId(uuid), tablets)
        version = await env.cm.alter_table(
            by_id(table_id), [AddColumn("extra", ColumnType.INT32)], Ids()()
        )
        assert version == 1
        assert env.state.table(table_id).record.state is TableState.ALTERING  # type: ignore[union-attr]
        old = leader_reports(env, table_id, schema=0)
        actions = []
        for uuid, tablets in sorted(old.items()):
            actions += (await env.cm.process_report(NodeId(uuid), tablets)).actions
        assert sorted(a.tablet_id for a in actions) == sorted(
            r.tablet_id for rs in old.values() for r in rs if r.role is LEADER
        )
        assert all(isinstance(a, AlterReplica) and a.schema_version == 1 for a in actions)
        assert not (await env.cm.is_alter_table_done(by_id(table_id))).done
        for uuid, tablets in sorted(leader_reports(env, table_id, schema=1).items()):
            await env.cm.process_report(NodeId(uuid), tablets)
        assert (await env.cm.is_alter_table_done(by_id(table_id))).done
        rec = env.state.table(table_id).record  # type: ignore[union-attr]
        assert rec.state is TableState.RUNNING and rec.fully_applied_schema is None

    run(main())


def test_a_failed_replication_changes_nothing_and_raises() -> None:
    async def main() -> None:
        env = make_env()
        table_id = await create(env)
        await env.cm.assign_tablets()
        snap = env.snapshot()
        env.raft.fail_before.append(Timeout("lost the lease"))
        reports = leader_reports(env, table_id)
        _note_all(env, reports)
        uuid, tablets = sorted(reports.items())[0]
        with pytest.raises(Timeout):
            await env.cm.process_report(NodeId(uuid), tablets)
        assert env.snapshot() == snap
        # The next report goes through.
        await env.cm.process_report(NodeId(uuid), tablets)
        assert env.snapshot() != snap

    run(main())


def test_a_leaders_claim_waits_for_its_followers_word_and_is_adopted_when_it_comes() -> None:
    """The leader's report comes before its followers': its claim is pending (not adopted, not
    acknowledged); the first follower's report that knows the leader adopts it in its own
    write, without waiting for the leader to send its report again."""

    async def main() -> None:
        env = make_env()
        table_id = await create(env)
        await env.cm.assign_tablets()
        reports = leader_reports(env, table_id)
        leader_of = {
            t.tablet_id: t.consensus.leader_uuid
            for ts in reports.values()
            for t in ts
            if t.role is LEADER and t.consensus is not None
        }
        uuid = sorted(u for u in reports if any(t.role is LEADER for t in reports[u]))[0]
        env.cm.note_replica_states(NodeId(uuid), reports[uuid], full=True)
        plan = await env.cm.process_report(NodeId(uuid), reports[uuid])
        claimed = {c.tablet_id for c in plan.unconfirmed}
        assert claimed == {t for t, u in leader_of.items() if u == uuid} and plan.write is None
        follower = next(
            u
            for u, ts in sorted(reports.items())
            if u != uuid and any(t.tablet_id in claimed for t in ts)
        )
        env.cm.note_replica_states(NodeId(follower), reports[follower], full=True)
        plan = await env.cm.process_report(NodeId(follower), reports[follower])
        adopted = {c.tablet_id for c in plan.adopted}
        assert adopted and adopted <= claimed
        for t in adopted:
            rec = env.state.tablet(t).record  # type: ignore[union-attr]
            assert rec.state is TabletState.RUNNING
            assert rec.consensus is not None and rec.consensus.leader_uuid == uuid

    run(main())


def test_orphans_are_listed_and_left_alone() -> None:
    async def main() -> None:
        env = make_env()
        orphan = ReportedTablet(TabletId("f" * 32), ReportedState.RUNNING, LEADER, cs(1, "ts-0"), 0)
        plan = await env.cm.process_report(NodeId("ts-0"), [orphan])
        assert plan.write is None and plan.actions == () and plan.orphans == (orphan.tablet_id,)

    run(main())


def test_failed_replicas_are_noted_by_the_loaded_leader_only_and_wake_its_tasks() -> None:
    env = make_env(load=False)
    woken: list[int] = []
    env.cm.add_work_listener(lambda: woken.append(1))
    failed = [ReportedTablet(X, ReportedState.FAILED, ReportedRole.UNKNOWN, None)]
    env.cm.note_replica_states(NodeId("ts-1"), failed, full=True)
    assert len(env.cm.failed_replicas) == 0 and not woken  # not the leader: nothing kept
    env.cm.load()
    woken.clear()
    env.cm.note_replica_states(NodeId("ts-1"), failed, full=True)
    assert env.cm.failed_replicas.servers_of(X) == {"ts-1"} and woken == [1]
    env.cm.note_replica_states(NodeId("ts-1"), failed, full=False)
    assert woken == [1]  # nothing new to replace
    env.cm.unload()  # a new leader learns them again from the full reports it asks for
    assert len(env.cm.failed_replicas) == 0
