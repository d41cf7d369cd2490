"""The fuzzing campaign (service/testing/fuzz.py): its generator is deterministic and covers
every RPC, its guard keeps destructive requests off the fixtures, a short fixed-seed run
against a live cluster finds nothing, and its checks do catch a crash and a refused request
that changes state (a checker that cannot fail proves nothing). The attacks of the integrity
review (misrouted writes, a member's forged claims, a server certificate writing rows) go
through the campaign here against a live cluster; their generators and checks are tested
without one in test_fuzz_attacks.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf.message import Message

from service.pb import consensus_pb2, master_pb2, tserver_pb2
from service.pb import tserver_pb2 as tpb
from service.testing.fuzz import Campaign
from service.testing.fuzz_checks import (
    config_mismatches,
    describe_diff,
    fixture_health,
    lost_replicas,
)
from service.testing.fuzz_cluster import (
    FIXTURE_A,
    MEMBER_UUID,
    PARTITION_A,
    SCHEMA_A,
    FuzzCluster,
    Outcome,
)
from service.testing.fuzz_gen import (
    RPCS,
    Case,
    Generator,
    Vocabulary,
    draw_case,
    rpc_by_name,
    rpc_order,
)
from service.testing.fuzz_guard import KNOWN_ISSUES, Protected, defang
from service.testing.fuzz_values import (
    DEST,
    LIVE_INDEX,
    LIVE_SEQNO,
    LIVE_TERM,
    Mutation,
    apply_mutations,
)
from service.testing.hostile_arrow import ipc, outside_partition, plain_rows

# --- the generator, no cluster ---------------------------------------------------------------


def test_every_rpc_of_every_service_is_fuzzed() -> None:
    declared = {
        f"{s.name}/{m.name}"
        for module in (master_pb2, tserver_pb2, consensus_pb2)
        for s in module.DESCRIPTOR.services_by_name.values()
        for m in s.methods
    }
    assert {r.name for r in RPCS} == declared
    assert len(RPCS) == len(declared) >= 47  # more as RPCs are added, none listed here
    # Every round of len(RPCS) cases calls each RPC once, in an order the seed decides.
    assert {r.name for r in rpc_order(1)} == declared
    assert rpc_order(1) != rpc_order(2)
    gen = Generator(Vocabulary())
    assert {draw_case(gen, 3, n).rpc.name for n in range(len(RPCS))} == declared


def _shape(case: Case) -> tuple[object, ...]:
    return (case.rpc.name, case.identity, case.target, case.mutated, len(case.encoded()))


def test_a_case_is_a_function_of_the_seed_and_its_number() -> None:
    gen = Generator(Vocabulary())
    first = [draw_case(gen, 11, n) for n in range(60)]
    again = [draw_case(Generator(Vocabulary()), 11, n) for n in range(60)]
    assert [c.encoded() for c in first] == [c.encoded() for c in again]
    other = [draw_case(gen, 12, n) for n in range(60)]
    assert [c.encoded() for c in first] != [c.encoded() for c in other]
    # Another cluster's names, the same shape: the same cases, naming the same fixtures.
    renamed = Vocabulary(
        table_names=("u",),
        table_ids=("9" * 32,),
        tablet_ids=("8" * 32,),
        tserver_uuids=("a", "b", "c"),
        master_uuids=("x", "y", "z"),
    )
    moved = [draw_case(Generator(renamed), 11, n) for n in range(60)]
    assert [(c.rpc.name, c.identity, c.target) for c in moved] == [
        (c.rpc.name, c.identity, c.target) for c in first
    ]


_DIGEST = """
import hashlib, sys
if sys.argv[1] == "more":  # other modules loaded: Hypothesis must not draw their constants
    import service.master.master, service.tserver.tablet_server  # noqa: F401
from service.testing.fuzz_gen import Generator, Vocabulary, draw_case
h = hashlib.sha256()
gen = Generator(Vocabulary())
for n in range(100):
    for b in draw_case(gen, 4, n).encoded():
        h.update(b)
print(h.hexdigest())
"""


def test_cases_are_the_same_in_another_process() -> None:
    """The CLI, pytest and a long campaign load different modules and hash strings
    differently; a case must not depend on either (maps are serialized deterministically,
    Hypothesis's local constants are off: fuzz_gen._no_local_constants)."""
    digests = {
        subprocess.run(
            [sys.executable, "-c", _DIGEST, which],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout
        for which in ("few", "more", "few")
    }
    assert len(digests) == 1, digests


def test_cases_mix_valid_hostile_mutated_and_raw_requests() -> None:
    gen = Generator(Vocabulary())
    cases = [draw_case(gen, 5, n) for n in range(400)]
    raw = sum(c.raw is not None for c in cases)
    mutated = sum(c.raw is None and c.mutated for c in cases)
    assert 5 <= raw <= 40, raw
    assert 50 <= mutated <= 160, mutated
    writes = [c for c in cases if c.rpc.name == "TabletServerService/Write" and c.messages]
    assert writes and any(m.rows for c in writes for m in c.messages)
    assert {c.identity for c in cases} == {"admin", "user", "tserver", "master", "member"}


def test_mutations_are_deterministic() -> None:
    data = bytes(range(40))
    for op in range(10):
        muts = (Mutation(op, 7, 300, b"ab"), Mutation((op + 3) % 10, 1000, 5, b""))
        assert apply_mutations(data, muts) == apply_mutations(data, muts)
    assert apply_mutations(b"", (Mutation(0, 3, 1, b""),)) == b""
    assert apply_mutations(data, (Mutation(5, 10, 0, b""),)) == data[:10]


# --- the guard --------------------------------------------------------------------------------

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
)


def test_the_guard_points_destructive_requests_of_allowed_callers_at_the_scratch_table() -> None:
    delete = rpc_by_name("MasterService/DeleteTable")
    req = master_pb2.DeleteTableRequestPB(table=master_pb2.TableIdentifierPB(table_name="fuzz_a"))
    (out,), why = defang(delete, "admin", [req.SerializeToString()], _P)
    assert master_pb2.DeleteTableRequestPB.FromString(out).table.table_name == "fuzz_scratch"
    assert "scratch" in why
    # A caller the policy refuses keeps the fixture's name: the refusal is what is tested.
    (out,), why = defang(delete, "user", [req.SerializeToString()], _P)
    assert out == req.SerializeToString() and not why

    remove = rpc_by_name("MasterService/RemoveMaster")
    req2 = master_pb2.RemoveMasterRequestPB(uuid="master-1")
    (out,), _ = defang(remove, "admin", [req2.SerializeToString()], _P)
    assert master_pb2.RemoveMasterRequestPB.FromString(out).uuid != "master-1"

    step_down = rpc_by_name("TabletServerAdminService/DeleteTablet")
    req3 = tpb.DeleteTabletRequestPB(tablet_id="b" * 32)
    (out,), _ = defang(step_down, "master", [req3.SerializeToString()], _P)
    assert tpb.DeleteTabletRequestPB.FromString(out).tablet_id == "d" * 32
    # Bytes that do not parse go as they are (the server cannot parse them either).
    assert defang(delete, "admin", [b"\xff\xff"], _P) == ((b"\xff\xff",), "")


def test_no_known_issue_is_open() -> None:
    """Both findings so far are fixed; a new one goes in KNOWN_ISSUES with its test."""
    assert KNOWN_ISSUES == {}


def _csr_with_a_point_off_the_curve() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fuzz")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    point = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    der[der.index(point) + 64] ^= 1  # the last byte of y: the point leaves the curve
    return bytes(der)


def test_describe_diff_names_what_changed() -> None:
    before = {"tables": {"t1": ("a",), "t2": ("b",)}, "grants": frozenset({("t1", "u")})}
    after = {"tables": {"t1": ("a2",), "t3": ("c",)}, "grants": frozenset()}
    text = describe_diff(before, after)
    assert "+t3" in text and "-t2" in text and "~t1" in text and "-('t1', 'u')" in text


# --- against a live cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzCluster]:
    with FuzzCluster(tmp_path_factory.mktemp("fuzz") / "cluster") as fc:
        yield fc


def _campaign(fc: FuzzCluster, out: Path, seed: int = 1, **kw: bool) -> tuple[Campaign, list[str]]:
    lines: list[str] = []
    return Campaign(fc, seed, out, say=lines.append, **kw), lines


def _one_case(
    fc: FuzzCluster, out: Path, rpc: str, target: str, request: Message
) -> tuple[Campaign, Outcome]:
    """Run one case (as admin, these bytes) through the campaign's checks."""
    campaign, _ = _campaign(fc, out)
    try:
        campaign.prepare()
        case = Case(rpc_by_name(rpc), "admin", target, raw=(request.SerializeToString(),))
        return campaign, campaign.run_case(0, case)
    finally:
        campaign.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_short_fixed_seed_campaign_finds_nothing(
    fuzz_cluster: FuzzCluster, tmp_path: Path
) -> None:
    """150 cases from the campaign's fixed first seed, about 3 rounds of every RPC, with nothing
    kept out (fuzz_guard.KNOWN_ISSUES is empty)."""
    campaign, lines = _campaign(fuzz_cluster, tmp_path, skip_known=False)
    try:
        stats = campaign.run(150)
    finally:
        campaign.close()
    assert lines[-1] == "fuzz: 150 cases, 0 crashes, 0 state changes, 0 stalls", lines
    assert stats.unexpected == 0 and stats.tracebacks == 0, lines
    assert {rpc for rpc, _ in stats.outcomes} == {r.name for r in RPCS}


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_crash_is_reported_and_the_server_restarted(
    fuzz_cluster: FuzzCluster, tmp_path: Path
) -> None:
    campaign, lines = _campaign(fuzz_cluster, tmp_path)
    try:
        campaign.prepare()
        fuzz_cluster.mini.kill_tserver("ts-3", signal.SIGKILL)
        ping = rpc_by_name("TabletServerService/Ping")
        campaign.run_case(7, Case(ping, "admin", "tserver:0", raw=(b"",)))
    finally:
        campaign.close()
    assert campaign.stats.crashes == 1
    assert fuzz_cluster.mini.tservers["ts-3"].alive
    assert any("ts-3 exited" in line for line in lines)
    assert list(tmp_path.glob("case-7-crash.txt"))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_refused_fenced_request_moves_no_term(fuzz_cluster: FuzzCluster, tmp_path: Path) -> None:
    """The campaign's first finding, fixed: a CreateTablet with a fence whose term was far above
    the masters' was refused for its schema, yet the tablet server kept the term as the highest
    it had seen and then refused the real leader as deposed. An admin's fence is now refused,
    and a master's term counts only once its request succeeded."""
    ts = fuzz_cluster.mini.tservers["ts-1"]
    req = tpb.CreateTabletRequestPB(
        dest_uuid=ts.uuid,
        fence=tpb.MasterFencePB(master_uuid="fuzz-admin", master_term=2**40),
        tablet_id="e" * 32,
    )
    campaign, outcome = _one_case(
        fuzz_cluster, tmp_path, "TabletServerAdminService/CreateTablet", "tserver:0", req
    )
    assert outcome.code in ("PERMISSION_DENIED", "INVALID_ARGUMENT"), outcome
    assert campaign.stats.state_changes == 0 and campaign.stats.findings == 0
    assert not list(tmp_path.glob("case-0-*.txt"))
    assert ts.alive


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_certificate_request_with_a_bad_key_is_invalid_argument(
    fuzz_cluster: FuzzCluster, tmp_path: Path
) -> None:
    """The campaign's second finding, fixed: a certificate request with an EC point off the
    curve was answered INTERNAL with a traceback; it is INVALID_ARGUMENT naming csr_der."""
    req = master_pb2.IssueCertificateRequestPB(role="user", name="someone")
    req.csr_der = _csr_with_a_point_off_the_curve()
    campaign, outcome = _one_case(
        fuzz_cluster, tmp_path, "MasterService/IssueCertificate", "leader", req
    )
    assert outcome.code == "INVALID_ARGUMENT", outcome
    assert campaign.stats.unexpected == 0 and campaign.stats.tracebacks == 0


def _as(
    fc: FuzzCluster, out: Path, rpc: str, identity: str, target: str, *requests: Message
) -> tuple[Campaign, Outcome]:
    """Run one case (as `identity`, these messages, placeholders filled as the campaign
    fills them) through the campaign's checks."""
    campaign, _ = _campaign(fc, out)
    try:
        campaign.prepare()
        case = Case(rpc_by_name(rpc), identity, target, requests, tuple(() for _ in requests))
        return campaign, campaign.run_case(0, case)
    finally:
        campaign.close()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_members_forged_claims_are_not_adopted(fuzz_cluster: FuzzCluster, tmp_path: Path) -> None:
    """The review's second attack, as the campaign sends it: the member, with its own
    certificate and live instance, claims LEADER of a fixture tablet it follows, in term 1000
    at op index 1000 with itself the sole voter, and in the next term with the same voters.
    Not acknowledged, not adopted: no replica lost, the master's record is the replicas'.
    Where leadership sits after the campaign's earlier steps (fuzzed LeaderStepDown calls,
    restarts) is not fixed: when the member leads every fixture tablet (it once led all four,
    and the test found no tablet to attack), only the first claim is sent, to one it leads: a
    config of itself alone, in a term nobody else knows, is forged whoever leads now."""
    fc = fuzz_cluster
    fc.refresh()
    a = fc.tables[FIXTURE_A]
    followed = [t for t, lead in zip(a.tablets, a.leaders, strict=True) if lead != MEMBER_UUID]
    tablet = followed[0] if followed else a.tablets[0]
    hb = master_pb2.TSHeartbeatRequestPB(
        instance=master_pb2.NodeInstancePB(permanent_uuid=MEMBER_UUID, instance_seqno=LIVE_SEQNO)
    )
    hb.tablet_report.is_incremental = True
    hb.tablet_report.sequence_number = 7_000
    claims = [(1000, 1000, [MEMBER_UUID])]
    if followed:
        claims.append((LIVE_TERM + 1, LIVE_INDEX, [ts.uuid for ts in fc.mini.tservers.values()]))
    for term, index, voters in claims:
        t = hb.tablet_report.updated_tablets.add(
            tablet_id=tablet, state=master_pb2.REPLICA_RUNNING, role=master_pb2.LEADER
        )
        t.consensus_state.current_term = term
        t.consensus_state.leader_uuid = MEMBER_UUID
        t.consensus_state.committed_config.opid_index = index
        for uuid in voters:
            t.consensus_state.committed_config.peers.add(
                permanent_uuid=uuid, member_type=master_pb2.VOTER
            )
    campaign, outcome = _as(fc, tmp_path, "MasterService/TSHeartbeat", "member", "leader", hb)
    assert outcome.code == "OK", outcome
    assert (
        master_pb2.TSHeartbeatResponsePB.FromString(outcome.response).acked_report_sequence_number
        == 0
    )
    assert campaign.stats.findings == 0 and campaign.stats.unchecked == 0
    health = fixture_health(fc)
    assert lost_replicas(health) == [] and config_mismatches(health) == []


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_misrouted_write_is_refused_row_by_row(fuzz_cluster: FuzzCluster, tmp_path: Path) -> None:
    """The review's first attack: the user, with its write grant, sends rows of fixture A to a
    tablet whose partition does not hold them. Each is refused (OUTSIDE_PARTITION), and the
    campaign's checks (the replica's out-of-partition count) find nothing."""
    fc = fuzz_cluster
    fc.refresh()
    a = fc.tables[FIXTURE_A]
    rows = outside_partition(
        plain_rows(SCHEMA_A.to_arrow(), list(range(-100, 100, 9))),
        SCHEMA_A,
        PARTITION_A,
        a.partitions[0],
    )
    write = tpb.WriteRequestPB(
        dest_uuid=DEST,
        tablet_id=a.tablets[0],
        rows=ipc(rows),
        default_op=tpb.ROW_OP_UPSERT,
        authz_token=fc.authz_token,
    )
    for _ in range(10):  # the leader may move on a loaded machine: as a client, ask again
        campaign, outcome = _as(
            fc, tmp_path, "TabletServerService/Write", "user", "tablet-leader", write
        )
        if outcome.code != "UNAVAILABLE":
            break
        time.sleep(0.5)
        fc.refresh()
    assert outcome.code == "OK", outcome
    resp = tpb.WriteResponsePB.FromString(outcome.response)
    assert resp.rows_applied == 0
    assert len(resp.per_row_errors) == rows.num_rows > 5
    assert {e.error.code for e in resp.per_row_errors} == {"OUTSIDE_PARTITION"}
    assert campaign.stats.findings == 0


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_members_certificate_writes_no_row(fuzz_cluster: FuzzCluster, tmp_path: Path) -> None:
    """The review's third attack: a tablet server's own certificate, no authz token."""
    fc = fuzz_cluster
    fc.refresh()
    a = fc.tables[FIXTURE_A]
    write = tpb.WriteRequestPB(
        dest_uuid=DEST,
        tablet_id=a.tablets[0],
        rows=ipc(plain_rows(SCHEMA_A.to_arrow(), [5_000_001])),
        default_op=tpb.ROW_OP_UPSERT,
    )
    campaign, outcome = _as(
        fc, tmp_path, "TabletServerService/Write", "member", "tablet-leader", write
    )
    assert outcome.code == "PERMISSION_DENIED", outcome
    assert campaign.stats.findings == 0


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_a_long_campaign_finds_nothing(tmp_path: Path) -> None:
    """5,000 cases of seed 2 on a cluster of its own (`make fuzz` runs longer ones)."""
    with FuzzCluster(tmp_path / "cluster") as fc:
        campaign, _ = _campaign(fc, tmp_path / "out", seed=2, skip_known=True)
        try:
            stats = campaign.run(5000)
        finally:
            campaign.close()
    assert stats.line() == "fuzz: 5000 cases, 0 crashes, 0 state changes, 0 stalls"
    assert stats.findings == 0
