"""The fuzzing campaign's attacks from the integrity review, and the checks that catch them,
without a cluster: misrouted writes really lie outside the tablet they name, the member's
heartbeats make the dangerous claims (a huge term, itself alone, unknown voters, the next
term), every such case is a function of (seed, number), the guard leaves the claims alone,
the live placeholders are filled from the cluster, and each new check fails on a planted bad
state (a checker that cannot fail proves nothing). The same attacks against a live cluster
are in test_fuzz.py."""

from __future__ import annotations

import collections
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.common.keys import encode_key
from service.pb import consensus_pb2
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.fuzz_checks import (
    TERM_BOUND,
    Checksum,
    FixtureHealth,
    ReplicaConfig,
    config_mismatches,
    leaderless,
    lost_replicas,
    outside_rows,
    rows_outside,
)
from service.testing.fuzz_cluster import (
    MEMBER_UUID,
    PARTITION_A,
    PARTITION_B,
    SCHEMA_A,
    SCHEMA_B,
    offline_vocabulary,
)
from service.testing.fuzz_gen import (
    IDENTITIES,
    RPCS,
    Case,
    Generator,
    draw_case,
    rpc_by_name,
    rpc_order,
)
from service.testing.fuzz_guard import Protected, allowed, defang
from service.testing.fuzz_prepare import bind
from service.testing.fuzz_templates import UNKNOWN_SERVERS
from service.testing.fuzz_values import (
    DEST,
    LIVE_INCARNATION,
    LIVE_INDEX,
    LIVE_SEQNO,
    LIVE_TERM,
    live_offset,
)
from service.testing.hostile_arrow import outside_partition, plain_rows

VOCAB = offline_vocabulary()
A_TABLETS = range(4)
"""Indexes of fixture A's tablets in VOCAB.tablet_ids (then B's two, the scratch, a fake)."""
FIXTURE_TABLETS = range(6)
HEARTBEATS = ("MasterService/TSHeartbeat", "MasterService/TSHeartbeatStream")
SEED = 7


def _numbers(names: Sequence[str], count: int, seed: int = SEED) -> list[int]:
    """The first `count` case numbers of campaign `seed` that call one of `names`."""
    order = rpc_order(seed)
    out = [n for n in range(100 * len(RPCS) * count) if order[n % len(RPCS)].name in names]
    return out[:count]


def _cases(names: Sequence[str], count: int, seed: int = SEED) -> list[Case]:
    gen = Generator(VOCAB)
    return [draw_case(gen, seed, n) for n in _numbers(names, count, seed)]


# --- misrouted writes ------------------------------------------------------------------------


def test_plain_rows_outside_a_partition_are_in_other_tablets() -> None:
    rows = plain_rows(SCHEMA_A.to_arrow(), [*range(-100, 100), 2**63 - 1, -(2**63)])
    assert rows.schema == SCHEMA_A.to_arrow() and rows.num_rows == 202
    partitions = PARTITION_A.create_partitions(SCHEMA_A)
    outside = [outside_partition(rows, SCHEMA_A, PARTITION_A, p) for p in partitions]
    # Each row lies in exactly one of the four tablets: outside the other three.
    assert sum(t.num_rows for t in outside) == 3 * rows.num_rows
    for p, t in zip(partitions, outside, strict=True):
        keys = PARTITION_A.partition_keys_for_arrow(SCHEMA_A, t)
        assert t.num_rows and not any(p.contains(k) for k in keys)


@settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_misrouted_rows_lie_outside_the_named_tablet(data: st.DataObject) -> None:
    gen = Generator(VOCAB)
    tablet = data.draw(st.sampled_from(FIXTURE_TABLETS))
    stream = data.draw(gen.misrouted_rows(tablet))
    rows = pa.ipc.open_stream(stream).read_all()
    schema, ps = (SCHEMA_A, PARTITION_A) if tablet in A_TABLETS else (SCHEMA_B, PARTITION_B)
    assert rows.schema == schema.to_arrow()  # valid rows of the table: only their place is wrong
    named = VOCAB.tablet_partitions[tablet]
    assert named is not None
    inside = [named.contains(k) for k in ps.partition_keys_for_arrow(schema, rows)]
    assert rows.num_rows >= 1 and sum(inside) <= 3 and not all(inside)
    # Every row has a tablet of its own, another one of the same table, unless it is inside.
    others = [VOCAB.tablet_partitions[i] for i in FIXTURE_TABLETS if i != tablet]
    for k, here in zip(ps.partition_keys_for_arrow(schema, rows), inside, strict=True):
        assert here or any(p is not None and p.contains(k) for p in others)
    # Unknown partitions (a cluster that did not say): no payload rather than a wrong one.
    assert data.draw(gen.misrouted_rows(7)) == b""


def _misrouted(case: Case) -> bool:
    """Whether the Write `case` sends valid rows of fixture A, every one (but up to 3) outside
    the tablet it names."""
    if case.mutated or not case.messages:
        return False
    m: Any = case.messages[0]
    if m.tablet_id not in VOCAB.tablet_ids[:4]:
        return False
    try:
        rows = pa.ipc.open_stream(m.rows).read_all()
    except (pa.ArrowException, ValueError, OSError):  # hostile rows, merged over the template
        return False
    if rows.schema != SCHEMA_A.to_arrow() or rows.num_rows == 0:
        return False
    named = VOCAB.tablet_partitions[VOCAB.tablet_ids.index(m.tablet_id)]
    assert named is not None
    keys = PARTITION_A.partition_keys_for_arrow(SCHEMA_A, rows)
    return sum(not named.contains(k) for k in keys) >= max(1, rows.num_rows - 3)


def test_the_user_writes_misrouted_rows_to_fixture_a_with_its_token() -> None:
    cases = _cases(["TabletServerService/Write"], 120)
    user = [c for c in cases if c.identity == "user"]
    misrouted = [c for c in user if _misrouted(c)]
    assert len(user) >= 30, len(user)
    # Misrouted rows six times in ten, half of them left as made (the rest take hostile
    # values or byte mutations): a good share reaches the partition check.
    assert len(misrouted) >= len(user) // 5, (len(misrouted), len(user))
    # With the user's token for fixture A (a hostile value merged over it now and then).
    tokens = [c.messages[0].authz_token == VOCAB.authz_tokens[0] for c in misrouted]  # type: ignore[attr-defined]
    assert sum(tokens) >= len(tokens) // 2, tokens


# --- the member ------------------------------------------------------------------------------


def test_the_member_is_an_identity_of_its_own() -> None:
    assert "member" in IDENTITIES
    assert VOCAB.principal("member") == MEMBER_UUID == VOCAB.tserver_uuids[0]
    # Its certificate is a tablet server's: the policies treat it as one.
    assert allowed(rpc_by_name("MasterService/TSHeartbeat"), "member")
    assert allowed(rpc_by_name("TabletServerAdminService/StartTabletCopy"), "member")
    assert not allowed(rpc_by_name("TabletServerAdminService/DeleteTablet"), "member")
    out = subprocess.run(
        [sys.executable, "-m", "service.testing.fuzz", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert "member" in out  # `--as member` replays its cases


@dataclass
class _Shapes:
    cases: int = 0
    dangerous: int = 0
    seen: collections.Counter[str] = field(default_factory=collections.Counter)


def _shape(t: Any) -> str:
    """What a reported tablet claims, for the counts below ("" if nothing dangerous)."""
    cs = t.consensus_state
    peers = {p.permanent_uuid for p in cs.committed_config.peers if p.member_type == mpb.VOTER}
    voters = set(VOCAB.tserver_uuids)
    leads = t.role == mpb.LEADER and cs.leader_uuid == MEMBER_UUID
    term_k = live_offset(cs.current_term, LIVE_TERM)
    huge = term_k is None and cs.current_term >= 1000
    if leads and huge and peers == voters:
        return "usurp"
    if leads and peers == {MEMBER_UUID}:
        return "alone"
    if peers > voters and peers & set(UNKNOWN_SERVERS):
        return "grow"
    if leads and peers == voters and term_k and cs.committed_config.opid_index == LIVE_INDEX:
        return "next-term"
    if leads and len(peers) == 2 and MEMBER_UUID in peers and peers < voters:
        return "one-step"
    return ""


def test_the_members_heartbeats_make_the_dangerous_claims() -> None:
    """The shapes of docs/design/catalog.md#R15 about fixture tablets, from the member's own
    live instance (so that the master reads them), in a good share of its heartbeats."""
    got = _Shapes()
    for case in _cases(HEARTBEATS, 260):
        if case.identity != "member" or case.mutated:
            continue
        got.cases += 1
        danger = False
        for m in case.messages:
            msg: Any = m
            live = msg.instance.instance_seqno == LIVE_SEQNO
            for t in msg.tablet_report.updated_tablets:
                shape = _shape(t)
                if shape and t.tablet_id in VOCAB.tablet_ids[:6]:
                    got.seen[shape] += 1
                    danger = danger or (live and msg.instance.permanent_uuid == MEMBER_UUID)
        got.dangerous += danger
    assert got.cases >= 60, got
    assert set(got.seen) == {"usurp", "alone", "grow", "next-term", "one-step"}, got
    assert got.dangerous >= got.cases // 3, got


def test_the_members_raft_messages_go_to_its_peers_in_its_own_name() -> None:
    cases = [c for c in _cases(["ConsensusService/Step"], 150) if c.identity == "member"]
    assert len(cases) >= 30
    to_peers = [c for c in cases if c.target in ("tserver:1", "tserver:2")]
    assert len(to_peers) >= len(cases) // 3
    framed = [
        c
        for c in to_peers
        if not c.mutated
        and c.messages[0].src_instance == LIVE_INCARNATION  # type: ignore[attr-defined]
        and c.messages[0].src_uuid == MEMBER_UUID  # type: ignore[attr-defined]
    ]
    assert framed, "no member Raft message the receiver would read"


_DIGEST = """
import hashlib, sys
if sys.argv[1] == "more":
    import service.master.master, service.tserver.tablet_server  # noqa: F401
from service.testing.fuzz_cluster import offline_vocabulary
from service.testing.fuzz_gen import RPCS, Generator, draw_case, rpc_order
names = {"TabletServerService/Write", "MasterService/TSHeartbeat", "ConsensusService/Step"}
order = rpc_order(9)
gen = Generator(offline_vocabulary())
h = hashlib.sha256()
for n in [n for n in range(5000) if order[n % len(RPCS)].name in names][:60]:
    case = draw_case(gen, 9, n)
    h.update(case.identity.encode() + case.target.encode())
    for b in case.encoded():
        h.update(b)
print(h.hexdigest())
"""


def test_the_new_cases_are_a_function_of_the_seed_and_number() -> None:
    """Misrouted writes, member heartbeats and Raft messages: the same bytes in another
    process, whatever modules it loaded."""
    digests = {
        subprocess.run(
            [sys.executable, "-c", _DIGEST, which],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout
        for which in ("few", "more")
    }
    assert len(digests) == 1, digests


# --- the guard ---------------------------------------------------------------------------------

_P = Protected(
    table_ids=frozenset({"a" * 32}),
    table_names=frozenset({"fuzz_a"}),
    tablet_ids=frozenset({"b" * 32}),
    scratch_table_id="c" * 32,
    scratch_table_name="fuzz_scratch",
    scratch_tablet_id="d" * 32,
    master_uuids=frozenset({"master-1"}),
    master_ports=frozenset({7051}),
    user="fuzz-user",
    master_term=3,
    member_uuid=MEMBER_UUID,
)


def _heartbeat(uuid: str = MEMBER_UUID) -> mpb.TSHeartbeatRequestPB:
    req = mpb.TSHeartbeatRequestPB(instance=mpb.NodeInstancePB(permanent_uuid=uuid))
    req.instance.instance_seqno = 42
    req.registration.rpc_addresses.add(host="10.9.9.9", port=1)
    req.tablet_report.is_incremental = True
    forged = req.tablet_report.updated_tablets.add(
        tablet_id="b" * 32, state=mpb.REPLICA_RUNNING, role=mpb.LEADER
    )
    forged.consensus_state.current_term = 1000
    forged.consensus_state.leader_uuid = uuid
    forged.consensus_state.committed_config.opid_index = 1000
    forged.consensus_state.committed_config.peers.add(permanent_uuid=uuid)
    req.tablet_report.updated_tablets.add(tablet_id="b" * 32, state=mpb.REPLICA_FAILED)
    return req


def test_the_guard_keeps_the_members_claims_and_takes_out_its_own_business() -> None:
    hb = rpc_by_name("MasterService/TSHeartbeat")
    (out,), why = defang(hb, "member", [_heartbeat().SerializeToString()], _P)
    sent = mpb.TSHeartbeatRequestPB.FromString(out)
    assert not sent.HasField("registration")  # would lock the real process out
    claim, failed = sent.tablet_report.updated_tablets
    assert claim == _heartbeat().tablet_report.updated_tablets[0]  # the claim goes as made
    assert failed.tablet_id == "d" * 32  # a FAILED replica is replaced: the scratch tablet's
    assert "registration" in why and "FAILED" in why
    # Another identity's heartbeat, or the member's for another uuid: as generated (refused).
    for role, uuid in (("tserver", MEMBER_UUID), ("member", "ts-2"), ("tserver", "ts-fuzz")):
        data = _heartbeat(uuid).SerializeToString()
        assert defang(hb, role, [data], _P) == ((data,), "")
    # A copy the member starts from itself of a fixture tablet: the scratch tablet's.
    copy = rpc_by_name("TabletServerAdminService/StartTabletCopy")
    req = tpb.StartTabletCopyRequestPB(tablet_id="b" * 32, copy_peer_uuid=MEMBER_UUID)
    (out,), _ = defang(copy, "member", [req.SerializeToString()], _P)
    assert tpb.StartTabletCopyRequestPB.FromString(out).tablet_id == "d" * 32
    # Its Raft messages go as made.
    step = rpc_by_name("ConsensusService/Step")
    msg = consensus_pb2.StepRequest(src_uuid=MEMBER_UUID)
    msg.groups.add(group_id="b" * 32).messages.add(type=consensus_pb2.MSG_APP, term=10**6)
    assert defang(step, "member", [msg.SerializeToString()], _P)[1] == ""


# --- filling the live placeholders -------------------------------------------------------------


@dataclass
class _TS:
    uuid: str


@dataclass
class _Mini:
    tservers: dict[str, _TS]


@dataclass
class _FakeCluster:
    """What `bind` asks of the cluster."""

    mini: _Mini = field(
        default_factory=lambda: _Mini(
            {f"ts-{i}": _TS(u) for i, u in enumerate(VOCAB.tserver_uuids)}
        )
    )
    asked: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)

    def address_of(self, target: str) -> tuple[str, str]:
        return "127.0.0.1:1", "ts-2-fuzz-target"

    def leader_of(self, tablet_id: str) -> int:
        return 1

    def instance_seqno(self, uuid: str) -> int | None:
        return 12345 if uuid == MEMBER_UUID else None

    def consensus_states(self, index: int, tablet_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        self.asked.append((index, tuple(tablet_ids)))
        return dict.fromkeys(tablet_ids, (7, 3))

    def member_incarnation(self) -> str:
        return "inc-of-ts-1"


def test_bind_fills_the_members_live_numbers() -> None:
    hb = _heartbeat()
    hb.ClearField("registration")
    hb.instance.instance_seqno = LIVE_SEQNO
    cs = hb.tablet_report.updated_tablets[0].consensus_state
    cs.current_term, cs.committed_config.opid_index = LIVE_TERM + 1, LIVE_INDEX
    fc = _FakeCluster()
    case = bind(fc, Case(rpc_by_name("MasterService/TSHeartbeat"), "member", "leader", (hb,)))  # type: ignore[arg-type]
    got: Any = case.messages[0]
    assert got.instance.instance_seqno == 12345
    filled = got.tablet_report.updated_tablets[0].consensus_state
    assert (filled.current_term, filled.committed_config.opid_index) == (
        8,
        3,
    )  # next term, same config
    assert fc.asked == [(0, ("b" * 32,))]  # the member's own replica (the first server) was asked

    step = consensus_pb2.StepRequest(dest_uuid=DEST, src_uuid=MEMBER_UUID)
    step.src_instance = LIVE_INCARNATION
    step.groups.add(group_id="b" * 32).messages.add(type=consensus_pb2.MSG_VOTE, term=LIVE_TERM + 2)
    case = bind(fc, Case(rpc_by_name("ConsensusService/Step"), "member", "tserver:1", (step,)))  # type: ignore[arg-type]
    sent: Any = case.messages[0]
    assert (sent.dest_uuid, sent.src_instance) == ("ts-2-fuzz-target", "inc-of-ts-1")
    assert sent.groups[0].messages[0].term == 9


def test_live_placeholders_are_not_hostile_values() -> None:
    assert live_offset(LIVE_TERM + 3, LIVE_TERM) == 3
    for v in (0, 1, 1000, 2**63 - 1, 2**64 - 1, LIVE_TERM - 1, LIVE_INDEX):
        assert live_offset(v, LIVE_TERM) is None


# --- the checks, on planted views ---------------------------------------------------------------

_VOTERS = frozenset((u, mpb.VOTER) for u in VOCAB.tserver_uuids)
_TABLETS = ("t1" * 16, "t2" * 16)
_SERVERS = ("ts-1", "ts-2", "ts-3")


def _health(
    replicas: dict[str, dict[str, ReplicaConfig]] | None = None,
    master: dict[str, tuple[frozenset[tuple[str, int]], int]] | None = None,
) -> FixtureHealth:
    ok = ReplicaConfig(tpb.TABLET_DATA_READY, mpb.REPLICA_RUNNING, _VOTERS, 0)
    if replicas is None:
        replicas = {s: dict.fromkeys(_TABLETS, ok) for s in _SERVERS}
    if master is None:
        master = dict.fromkeys(_TABLETS, (_VOTERS, 0))
    return FixtureHealth(_TABLETS, _SERVERS, replicas, master)


def test_a_healthy_view_has_no_problems() -> None:
    h = _health()
    assert lost_replicas(h) == [] and config_mismatches(h) == []


def test_lost_replicas_finds_a_tombstoned_a_deleted_and_a_missing_replica() -> None:
    h = _health()
    replicas = {s: dict(v) for s, v in h.replicas.items()}
    ok = replicas["ts-2"][_TABLETS[0]]
    replicas["ts-2"][_TABLETS[0]] = ReplicaConfig(
        tpb.TABLET_DATA_TOMBSTONED, mpb.REPLICA_STATE_UNKNOWN, ok.members, ok.opid_index
    )
    replicas["ts-3"][_TABLETS[1]] = ReplicaConfig(
        tpb.TABLET_DATA_DELETED, mpb.REPLICA_STATE_UNKNOWN, ok.members, ok.opid_index
    )
    del replicas["ts-1"][_TABLETS[1]]
    problems = lost_replicas(_health(replicas))
    assert len(problems) == 3, problems
    assert any("ts-2 is TABLET_DATA_TOMBSTONED" in p for p in problems)
    assert any("ts-3 is TABLET_DATA_DELETED" in p for p in problems)
    assert any("no replica on ts-1" in p for p in problems)
    # A server that did not answer (restarting) is not judged.
    del replicas["ts-2"], replicas["ts-3"], replicas["ts-1"]
    assert lost_replicas(_health(replicas)) == []


def test_config_mismatches_finds_a_forged_claim_in_the_masters_record() -> None:
    alone = (frozenset({(MEMBER_UUID, mpb.VOTER)}), 1000)
    problems = config_mismatches(_health(master={_TABLETS[0]: alone, _TABLETS[1]: (_VOTERS, 0)}))
    assert len(problems) == 3, problems  # each of the three replicas committed another config
    assert f"[{MEMBER_UUID}] at op index 1000" in problems[0]
    # The same voters at another op index, a learner, or no record at all: mismatches too.
    learner = _VOTERS - {(VOCAB.tserver_uuids[2], mpb.VOTER)} | {
        (VOCAB.tserver_uuids[2], mpb.NON_VOTER)
    }
    assert config_mismatches(_health(master={_TABLETS[0]: (_VOTERS, 1), _TABLETS[1]: (_VOTERS, 0)}))
    assert config_mismatches(_health(master={_TABLETS[0]: (learner, 0), _TABLETS[1]: (_VOTERS, 0)}))
    assert config_mismatches(_health(master={_TABLETS[1]: (_VOTERS, 0)})) == [
        f"tablet {_TABLETS[0]}: the master has no record of it"
    ]


def test_config_mismatches_waits_for_a_replica_to_run() -> None:
    h = _health()
    replicas = {s: dict(v) for s, v in h.replicas.items()}
    replicas["ts-1"][_TABLETS[0]] = ReplicaConfig(
        tpb.TABLET_DATA_READY, mpb.REPLICA_BOOTSTRAPPING, frozenset(), 0
    )
    assert config_mismatches(_health(replicas)) == []


def test_leaderless_finds_a_group_without_a_leader_or_with_a_runaway_term() -> None:
    led = ReplicaConfig(tpb.TABLET_DATA_READY, mpb.REPLICA_RUNNING, _VOTERS, 0, "ts-1", 3)
    replicas = {s: dict.fromkeys(_TABLETS, led) for s in _SERVERS}
    assert leaderless(_health(replicas)) == set()
    # One replica that has not heard of the leader yet is no finding; all of them is.
    replicas["ts-2"][_TABLETS[0]] = _health().replicas["ts-2"][_TABLETS[0]]
    assert leaderless(_health(replicas)) == set()
    for s in _SERVERS:
        replicas[s][_TABLETS[0]] = _health().replicas[s][_TABLETS[0]]
    assert leaderless(_health(replicas)) == {f"tablet {_TABLETS[0]}: no replica knows a leader"}
    # A term pushed past the bound wedges the group even while a leader is still known.
    replicas["ts-3"][_TABLETS[1]] = ReplicaConfig(
        tpb.TABLET_DATA_READY, mpb.REPLICA_RUNNING, _VOTERS, 0, "ts-1", TERM_BOUND + 2
    )
    problems = leaderless(_health(replicas))
    assert len(problems) == 2 and any("past 2^62" in p for p in problems), problems


def test_rows_outside_finds_keys_of_another_tablet() -> None:
    partitions = PARTITION_A.create_partitions(SCHEMA_A)
    rows = plain_rows(SCHEMA_A.to_arrow(), list(range(-20, 20)))
    own = outside_partition(rows, SCHEMA_A, PARTITION_A, partitions[1])
    keys = rows.filter(pa.array([r not in own.column("k").to_pylist() for r in range(-20, 20)]))
    assert rows_outside("t", "ts-1", keys, SCHEMA_A, PARTITION_A, partitions[1]) == ""
    planted = pa.concat_tables([keys, own.slice(0, 2)])
    problem = rows_outside("t", "ts-1", planted, SCHEMA_A, PARTITION_A, partitions[1])
    assert "holds 2 rows outside its partition" in problem, problem
    assert repr((own.column("k")[0].as_py(),)) in problem


def test_outside_rows_reads_the_checksum_count() -> None:
    clean = Checksum(200, b"d", 0, ())
    assert outside_rows("t", "ts-1", clean, SCHEMA_A) == ""
    key = encode_key(SCHEMA_A.key_columns, (5,))
    planted = Checksum(201, b"e", 1, (key,))
    assert outside_rows("t", "ts-1", planted, SCHEMA_A) == (
        "tablet t on ts-1 holds 1 rows outside its partition (keys (5,))"
    )
    assert clean.content != planted.content


@pytest.mark.parametrize("who", ["user", "member"])
def test_identities_are_drawn_for_what_they_send(who: str) -> None:
    rpc = "TabletServerService/Write" if who == "user" else HEARTBEATS[0]
    cases = _cases([rpc], 80)
    share = sum(c.identity == who for c in cases) / len(cases)
    assert share >= 0.25, share


@dataclass
class _Quiet:
    """The little of a FuzzCluster a Campaign touches before it sends anything."""

    def logs(self) -> dict[str, Path]:
        return {}


def test_a_standing_problem_is_reported_once_while_it_lasts(tmp_path: Path) -> None:
    from service.testing.fuzz import Campaign
    from service.testing.fuzz_cluster import Outcome
    from service.testing.fuzz_report import Repro

    lines: list[str] = []
    campaign = Campaign(_Quiet(), 1, tmp_path, say=lines.append)  # type: ignore[arg-type]
    try:
        case = Case(rpc_by_name("MasterService/TSHeartbeat"), "member", "leader", raw=(b"",))
        repro = Repro(1, 5, case, (b"",), Outcome("OK"), "")
        lost = "tablet t: the replica on ts-2 is TABLET_DATA_TOMBSTONED"
        campaign._standing("tombstoned", [lost], repro)
        campaign._standing("tombstoned", [lost], repro)  # the next case sees the same
        assert campaign.stats.state_changes == 1 and campaign.stats.kinds["tombstoned"] == 1
        campaign._standing("tombstoned", [], repro)  # gone (the replica was copied back)...
        campaign._standing("tombstoned", [lost], repro)  # ...and lost again: a new finding
        campaign._standing("config mismatch", ["m"], None)  # found by a periodic look
        assert campaign.stats.state_changes == 3
        assert campaign.stats.line() == "fuzz: 0 cases, 0 crashes, 3 state changes, 0 stalls"
        assert "findings by kind: config mismatch 1, tombstoned 2" in campaign.stats.others()
        assert sum("FINDING [tombstoned]" in line for line in lines) == 2
        assert (tmp_path / "case-5-tombstoned.txt").exists()
    finally:
        campaign.close()
