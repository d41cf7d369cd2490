"""ksck's rules, table by table, over plain snapshots (no cluster): service/tools/ksck.py.

Each case starts from a healthy three-replica tablet (servers a, b, c; a leads term 1) and
changes one thing; the expected rating and a phrase of the reason that explains it are listed
beside it, so a failing case says which rule moved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from service.common.keys import encode_key
from service.common.schema import ColumnType, Schema
from service.tools import ksck_cmd
from service.tools.ksck import (
    ClusterSnapshot,
    Config,
    Health,
    MasterReport,
    MasterTablet,
    ReplicaChecksum,
    ReplicaReport,
    ServerHealth,
    TableSnapshot,
    TabletChecksums,
    TServerReport,
    check,
    check_masters,
    check_tservers,
    outside_partition_remedy,
    rate_table,
    rate_tablet,
)

T = "tablet-1"
ABC = Config(frozenset({"a", "b", "c"}), opid_index=0)


def rep(
    role: str = "FOLLOWER",
    term: int = 1,
    leader: str = "a",
    config: Config = ABC,
    **kw: object,
) -> ReplicaReport:
    return ReplicaReport(T, role=role, term=term, leader_uuid=leader, committed=config, **kw)  # type: ignore[arg-type]


def srv(uuid: str, *replicas: ReplicaReport, **kw: object) -> TServerReport:
    return TServerReport(uuid, f"{uuid}:7050", replicas=replicas, **kw)  # type: ignore[arg-type]


ABC_D = replace(ABC, non_voters=frozenset({"d"}))
"""ABC with d being added as a non-voter (3-4-3, docs/design/tablet_copy.md#R7)."""
ABD = Config(frozenset({"a", "b", "d"}), opid_index=9)
"""ABC once d replaced c (the end of 3-4-3)."""


def healthy_servers(config: Config = ABC) -> dict[str, TServerReport]:
    return {
        "a": srv("a", rep("LEADER", config=config)),
        "b": srv("b", rep(config=config)),
        "c": srv("c", rep(config=config)),
    }


MASTER = MasterTablet(T, ABC, leader_uuid="a")

Servers = dict[str, TServerReport]
Change = Callable[[Servers], Servers]


def with_(**changes: TServerReport) -> Change:
    return lambda s: {**s, **changes}


def without(*uuids: str) -> Change:
    return lambda s: {u: v for u, v in s.items() if u not in uuids}


def same(s: Servers) -> Servers:
    return s


def c_replaced_by_d(c: ReplicaReport) -> Change:
    """The end of 3-4-3 (config ABD, d running), c's server still hosting replica `c`."""
    return lambda s: {
        **healthy_servers(ABD),
        "c": srv("c", c),
        "d": srv("d", rep("FOLLOWER", config=ABD)),
    }


# (name, change to the servers, master record, replication factor, rating, reason phrase)
CASES: list[tuple[str, Change, MasterTablet, int, Health, str]] = [
    ("healthy", same, MASTER, 3, Health.HEALTHY, ""),
    (
        "follower's server unreachable",
        with_(c=srv("c", reachable=False, error="connection refused")),
        MASTER,
        3,
        Health.UNDER_REPLICATED,
        "replica on c:7050: tablet server unreachable",
    ),
    (
        "leader's server down, b elected in term 2",
        with_(
            a=srv("a", reachable=False, error="refused"),
            b=srv("b", rep("LEADER", 2, "b")),
            c=srv("c", rep("FOLLOWER", 2, "b")),
        ),
        replace(MASTER, leader_uuid="b"),
        3,
        Health.UNDER_REPLICATED,
        "a:7050: tablet server unreachable",
    ),
    (
        "two of three servers unreachable",
        with_(b=srv("b", reachable=False), c=srv("c", reachable=False)),
        MASTER,
        3,
        Health.UNAVAILABLE,
        "1 of 3 voters running, a majority needs 2",
    ),
    (
        "no leader",
        with_(a=srv("a", rep("FOLLOWER", 2, ""))),
        MASTER,
        3,
        Health.UNAVAILABLE,
        "no replica is leader",
    ),
    (
        "replica missing from its server",
        with_(c=srv("c")),
        MASTER,
        3,
        Health.UNDER_REPLICATED,
        "c:7050: missing from its tablet server",
    ),
    (
        "replica FAILED",
        with_(c=srv("c", rep(state="FAILED", error="disk gone"))),
        MASTER,
        3,
        Health.UNDER_REPLICATED,
        "is FAILED (data READY): disk gone",
    ),
    (
        "a FAILED replica the config no longer names, not yet tombstoned",
        c_replaced_by_d(rep(state="FAILED", error="log entry 7 could not be applied")),
        replace(MASTER, config=ABD),
        3,
        Health.RECOVERING,
        "replica on c:7050 is FAILED outside the config (replaced, not yet tombstoned): "
        "log entry 7 could not be applied",
    ),
    (
        "a TOMBSTONED replica the config no longer names",
        c_replaced_by_d(rep(state="TOMBSTONED", data_state="TOMBSTONED")),
        replace(MASTER, config=ABD),
        3,
        Health.HEALTHY,
        "",
    ),
    (
        "replica TOMBSTONED",
        with_(c=srv("c", rep(state="TOMBSTONED", data_state="TOMBSTONED"))),
        MASTER,
        3,
        Health.UNDER_REPLICATED,
        "is TOMBSTONED",
    ),
    (
        "replica bootstrapping",
        with_(c=srv("c", rep(state="BOOTSTRAPPING"))),
        MASTER,
        3,
        Health.RECOVERING,
        "c:7050 is BOOTSTRAPPING",
    ),
    (
        "replica being copied",
        with_(c=srv("c", rep(state="COPYING", data_state="COPYING"))),
        MASTER,
        3,
        Health.RECOVERING,
        "is COPYING (data COPYING)",
    ),
    (
        "3-4-3: voter down while its replacement copies",
        lambda s: {
            **healthy_servers(ABC_D),
            "c": srv("c", reachable=False),
            "d": srv("d", rep(state="COPYING", data_state="COPYING", config=ABC_D)),
        },
        replace(MASTER, config=ABC_D),
        3,
        Health.UNDER_REPLICATED,
        "RECOVERING: non-voter replica on d:7050 is COPYING",
    ),
    (
        "a running non-voter that everyone agrees on",
        lambda s: {**healthy_servers(ABC_D), "d": srv("d", rep("LEARNER", config=ABC_D))},
        replace(MASTER, config=ABC_D),
        3,
        Health.HEALTHY,
        "",
    ),
    (
        "a failed non-voter",
        lambda s: {**healthy_servers(ABC_D), "d": srv("d", reachable=False, error="refused")},
        replace(MASTER, config=ABC_D),
        3,
        Health.RECOVERING,
        "non-voter replica on d:7050: tablet server unreachable",
    ),
    (
        "a replica's committed config differs from the master's",
        with_(c=srv("c", rep(config=Config(frozenset({"a", "b", "d"}), opid_index=7)))),
        MASTER,
        3,
        Health.CONSENSUS_MISMATCH,
        "replica on c:7050 has config voters [a:7050, b:7050, d] at opid index 7, "
        "the master has voters [a:7050, b:7050, c:7050]",
    ),
    (
        "a replica follows another leader",
        with_(c=srv("c", rep(leader="b"))),
        MASTER,
        3,
        Health.CONSENSUS_MISMATCH,
        "replica on c:7050 follows b:7050 (term 1), the leader is a:7050",
    ),
    (
        "the master records another leader",
        same,
        replace(MASTER, leader_uuid="b"),
        3,
        Health.CONSENSUS_MISMATCH,
        "the master records b:7050 as leader, the replicas elected a:7050",
    ),
    (
        "two leaders in one term",
        with_(b=srv("b", rep("LEADER", 1, "b"))),
        MASTER,
        3,
        Health.CONSENSUS_MISMATCH,
        "2 replicas claim to lead term 1: a:7050, b:7050",
    ),
    (
        "a deposed leader that has not noticed",
        with_(
            b=srv("b", rep("LEADER", 2, "b")),
            c=srv("c", rep("FOLLOWER", 2, "b")),
        ),
        replace(MASTER, leader_uuid="b"),
        3,
        Health.CONSENSUS_MISMATCH,
        "replica on a:7050 still claims to lead term 1 (newest 2)",
    ),
    (
        "a config change is pending",
        with_(a=srv("a", rep("LEADER", pending=Config(frozenset({"a", "b"}), opid_index=9)))),
        MASTER,
        3,
        Health.RECOVERING,
        "config change pending on a:7050",
    ),
    (
        "fewer voters than the replication factor",
        lambda s: {
            "a": srv("a", rep("LEADER", config=Config(frozenset({"a", "b"})))),
            "b": srv("b", rep(config=Config(frozenset({"a", "b"})))),
            "c": srv("c"),
        },
        replace(MASTER, config=Config(frozenset({"a", "b"}))),
        3,
        Health.UNDER_REPLICATED,
        "config has 2 voter(s), the table wants 3",
    ),
    (
        "a replica on a server the master does not know",
        without("c"),
        MASTER,
        3,
        Health.UNDER_REPLICATED,
        "replica on c: not a tablet server the master knows",
    ),
    (
        "another server answers at the replica's address",
        with_(c=srv("c", wrong_uuid=True, error="request for tablet server 'c' reached 'x'")),
        MASTER,
        3,
        Health.UNDER_REPLICATED,
        "c:7050: the server there is not c",
    ),
    (
        "a restarted follower that has not heard from the leader yet",
        with_(c=srv("c", rep(term=0, leader=""))),
        MASTER,
        3,
        Health.HEALTHY,
        "",
    ),
    (
        "unavailable outranks a mismatch",
        with_(
            a=srv("a", reachable=False),
            b=srv("b", reachable=False),
            c=srv("c", rep(config=Config(frozenset({"c"})))),
        ),
        MASTER,
        3,
        Health.UNAVAILABLE,
        "CONSENSUS_MISMATCH: replica on c:7050 has config voters [c:7050]",
    ),
    (
        "a single replica",
        lambda s: {"a": srv("a", rep("LEADER", config=Config(frozenset({"a"}))))},
        MasterTablet(T, Config(frozenset({"a"})), "a"),
        1,
        Health.HEALTHY,
        "",
    ),
    (
        "a single replica, down",
        lambda s: {"a": srv("a", reachable=False, error="refused")},
        MasterTablet(T, Config(frozenset({"a"})), "a"),
        1,
        Health.UNAVAILABLE,
        "0 of 1 voters running, a majority needs 1",
    ),
]


@pytest.mark.parametrize(
    ("change", "master", "replicas", "expected", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_rate_tablet(
    change: Change, master: MasterTablet, replicas: int, expected: Health, reason: str
) -> None:
    v = rate_tablet(master, change(healthy_servers()), replicas, "t")
    assert v.health is expected, v.reasons
    if reason:
        assert any(reason in r for r in v.reasons), v.reasons
    else:
        assert v.reasons == ()
    if v.reasons:
        # the first reason names the rating; the rest are ordered worst first
        assert v.reasons[0].startswith(expected.name + ":")
        ranks = [Health[r.split(":")[0]] for r in v.reasons]
        assert ranks == sorted(ranks, reverse=True)


def test_rate_tablet_names_the_leader_by_address() -> None:
    assert rate_tablet(MASTER, healthy_servers(), 3).leader == "a:7050"
    no_leader = {**healthy_servers(), "a": srv("a", rep(leader=""))}
    assert rate_tablet(MASTER, no_leader, 3).leader == ""


# --- tables ----------------------------------------------------------------------------------


def test_a_table_takes_its_worst_tablet() -> None:
    servers = healthy_servers()
    servers["c"] = srv("c", rep(), ReplicaReport("tablet-2", leader_uuid="a"))
    servers["a"] = srv(
        "a", rep("LEADER"), ReplicaReport("tablet-2", role="LEADER", leader_uuid="a")
    )
    servers["b"] = srv("b", rep())  # tablet-2 missing on b
    t2 = MasterTablet("tablet-2", ABC, "a")
    v = rate_table(TableSnapshot("id", "t", 3, (MASTER, t2)), servers)
    assert v.health is Health.UNDER_REPLICATED
    assert [t.health for t in v.tablets] == [Health.HEALTHY, Health.UNDER_REPLICATED]
    assert v.count(Health.HEALTHY) == 1 and v.count(Health.UNDER_REPLICATED) == 1


def test_a_table_whose_tablets_cannot_be_listed_is_unavailable() -> None:
    v = rate_table(TableSnapshot("id", "t", 3, error="tablet x is CREATING"), {})
    assert v.health is Health.UNAVAILABLE and v.error == "tablet x is CREATING"


def test_an_empty_table_is_healthy() -> None:
    assert rate_table(TableSnapshot("id", "t", 3), {}).health is Health.HEALTHY


# --- masters ---------------------------------------------------------------------------------

GIVEN = ("m1:1", "m2:1", "m3:1")


def master(address: str, role: str = "FOLLOWER", term: int = 5, leader: str = "u1") -> MasterReport:
    return MasterReport(
        address,
        uuid="u" + address[1],
        role=role,
        term=term,
        leader_uuid=leader,
        master_addresses=GIVEN,
    )


HEALTHY_MASTERS = (master("m1:1", "LEADER"), master("m2:1"), master("m3:1"))

MASTER_CASES: list[tuple[str, tuple[str, ...], tuple[MasterReport, ...], Health, str]] = [
    ("healthy", GIVEN, HEALTHY_MASTERS, Health.HEALTHY, ""),
    (
        "one unreachable",
        GIVEN,
        (*HEALTHY_MASTERS[:2], MasterReport("m3:1", reachable=False, error="refused")),
        Health.UNDER_REPLICATED,
        "master m3:1 unreachable: refused",
    ),
    (
        "two unreachable",
        GIVEN,
        (
            HEALTHY_MASTERS[0],
            MasterReport("m2:1", reachable=False),
            MasterReport("m3:1", reachable=False),
        ),
        Health.UNAVAILABLE,
        "1 of 3 masters reachable, no majority",
    ),
    (
        "no leader",
        GIVEN,
        (master("m1:1", leader=""), master("m2:1", leader=""), master("m3:1", leader="")),
        Health.UNAVAILABLE,
        "no master is leader",
    ),
    (
        "two leaders in one term",
        GIVEN,
        (master("m1:1", "LEADER"), master("m2:1", "LEADER", leader="u2"), master("m3:1")),
        Health.CONSENSUS_MISMATCH,
        "2 masters claim to lead term 5",
    ),
    (
        "a follower in another term",
        GIVEN,
        (HEALTHY_MASTERS[0], master("m2:1", term=4), HEALTHY_MASTERS[2]),
        Health.CONSENSUS_MISMATCH,
        "master m2:1 is in term 4, the leader m1:1 in term 5",
    ),
    (
        "a follower following someone else",
        GIVEN,
        (HEALTHY_MASTERS[0], master("m2:1", leader="u3"), HEALTHY_MASTERS[2]),
        Health.CONSENSUS_MISMATCH,
        "master m2:1 follows u3, not m1:1",
    ),
    (
        "masters disagree on the master list",
        GIVEN,
        (*HEALTHY_MASTERS[:2], replace(HEALTHY_MASTERS[2], master_addresses=("m3:1", "m4:1"))),
        Health.CONSENSUS_MISMATCH,
        "masters disagree on the master list",
    ),
    (
        "a master was not given",
        GIVEN[:2],
        HEALTHY_MASTERS[:2],
        Health.CONSENSUS_MISMATCH,
        "configured with m3:1, which ksck was not given",
    ),
    (
        "an address given that is not a master of this cluster",
        (*GIVEN, "m9:1"),
        (*HEALTHY_MASTERS, MasterReport("m9:1", reachable=False, error="refused")),
        Health.CONSENSUS_MISMATCH,
        "m9:1 given but not in the masters' own list",
    ),
]


@pytest.mark.parametrize(
    ("given", "reports", "expected", "reason"),
    [c[1:] for c in MASTER_CASES],
    ids=[c[0] for c in MASTER_CASES],
)
def test_check_masters(
    given: tuple[str, ...], reports: tuple[MasterReport, ...], expected: Health, reason: str
) -> None:
    v = check_masters(given, reports)
    assert v.health is expected, v.problems
    if reason:
        assert any(reason in p for p in v.problems), v.problems
    else:
        assert v.problems == () and v.leader_address == "m1:1" and v.leader_uuid == "u1"


# --- tablet servers and the whole report ------------------------------------------------------


def test_check_tservers() -> None:
    verdicts = check_tservers(
        [
            srv("a"),
            srv("b", reachable=False, error="refused"),
            srv("c", wrong_uuid=True, error="reached 'x'"),
            srv("d", live=False),
        ]
    )
    assert [(v.uuid, v.health) for v in verdicts] == [
        ("a", ServerHealth.HEALTHY),
        ("b", ServerHealth.UNAVAILABLE),
        ("c", ServerHealth.WRONG_SERVER_UUID),
        ("d", ServerHealth.NOT_LIVE),
    ]
    assert verdicts[1].problem == "refused"


def _snapshot(**kw: object) -> ClusterSnapshot:
    base = ClusterSnapshot(
        GIVEN,
        HEALTHY_MASTERS,
        tuple(healthy_servers().values()),
        (TableSnapshot("id", "t", 3, (MASTER,)),),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_check_healthy_cluster() -> None:
    report = check(_snapshot())
    assert report.healthy and report.unhealthy_tablets == []


@pytest.mark.parametrize(
    "change",
    [
        {"error": "cannot ask the leader master: timed out"},
        {"masters": (*HEALTHY_MASTERS[:2], MasterReport("m3:1", reachable=False))},
        {"tservers": (*tuple(healthy_servers().values()), srv("d", live=False))},
        {"tables": (TableSnapshot("id", "t", 3, (replace(MASTER, leader_uuid="b"),)),)},
    ],
    ids=["gathering failed", "master down", "tserver not live", "tablet mismatch"],
)
def test_check_is_unhealthy_when_anything_is(change: dict[str, object]) -> None:
    assert not check(_snapshot(**change)).healthy


def test_check_lists_unhealthy_tablets_in_table_order() -> None:
    servers = {**healthy_servers(), "c": srv("c", reachable=False)}
    tables = (
        TableSnapshot("2", "zeta", 3, (MASTER,)),
        TableSnapshot("1", "alpha", 3, (MASTER,)),
    )
    report = check(_snapshot(tservers=tuple(servers.values()), tables=tables))
    assert [t.name for t in report.tables] == ["alpha", "zeta"]
    assert [t.table_name for t in report.unhealthy_tablets] == ["alpha", "zeta"]
    assert all(t.health is Health.UNDER_REPLICATED for t in report.unhealthy_tablets)


def test_a_dead_server_no_config_names_is_gone_not_a_problem() -> None:
    """After 3-4-3 replaced its replicas, a dead server is GONE: reported, still healthy. While
    a config names it, or while some table could not be read, it is UNAVAILABLE."""
    dead = srv("z", reachable=False, live=False, error="refused")
    report = check(_snapshot(tservers=(*healthy_servers().values(), dead)))
    assert report.healthy
    assert [v.health for v in report.tservers if v.uuid == "z"] == [ServerHealth.GONE]
    named = check_tservers([dead], frozenset({"z"}))
    assert named[0].health is ServerHealth.UNAVAILABLE
    assert check_tservers([dead], None)[0].health is ServerHealth.UNAVAILABLE
    alive_but_not_live = check_tservers([srv("y", live=False)], frozenset())
    assert alive_but_not_live[0].health is ServerHealth.NOT_LIVE


# --- checksums (--checksum) ------------------------------------------------------------------

D1, D2 = b"\x01" * 32, b"\x02" * 32


def cs(
    uuid: str, index: int = 7, rows: int = 10, digest: bytes = D1, **kw: object
) -> ReplicaChecksum:
    return ReplicaChecksum(uuid, applied_index=index, rows=rows, digest=digest, **kw)  # type: ignore[arg-type]


AGREE = (cs("a"), cs("b"), cs("c"))
KEYS = ("(id=3)", "(id=8)")
OUTSIDE = {"outside_rows": 2, "outside_sample_keys": KEYS}

# (name, the replicas' checksums, rating, a reason phrase, replicas matched, rows outside)
CHECKSUM_CASES: list[tuple[str, tuple[ReplicaChecksum, ...], Health, str, int, int]] = [
    ("all agree", AGREE, Health.HEALTHY, "", 3, 0),
    (
        "c's digest differs at the same index",
        (cs("a"), cs("b"), cs("c", digest=D2)),
        Health.CHECKSUM_MISMATCH,
        "replicas at applied index 7 disagree: a:7050: 10 rows, digest 0101010101010101; "
        "b:7050: 10 rows, digest 0101010101010101; c:7050: 10 rows, digest 0202020202020202",
        2,
        0,
    ),
    (
        "no two replicas agree",
        (cs("a"), cs("b", digest=D2), cs("c", digest=b"\x03" * 32)),
        Health.CHECKSUM_MISMATCH,
        "replicas at applied index 7 disagree",
        0,
        0,
    ),
    (
        "c has a row more at the same index",
        (cs("a"), cs("b"), cs("c", rows=11)),
        Health.CHECKSUM_MISMATCH,
        "c:7050: 11 rows",
        2,
        0,
    ),
    (
        "c answered at a later index (writes went on): not compared",
        (cs("a"), cs("b"), cs("c", index=9, digest=D2)),
        Health.RECOVERING,
        "no other replica answered at the same applied index (writes went on during the "
        "check): c:7050 at 9",
        2,
        0,
    ),
    (
        "a running replica gave no checksum",
        (cs("a"), cs("b"), ReplicaChecksum("c", error="timed out waiting for index 7")),
        Health.RECOVERING,
        "replica on c:7050: no checksum: timed out waiting for index 7",
        2,
        0,
    ),
    (
        "one replica holds rows outside the partition (and so differs)",
        (cs("a"), cs("b"), cs("c", rows=12, digest=D2, **OUTSIDE)),
        Health.CHECKSUM_MISMATCH,
        "ROWS_OUTSIDE_PARTITION: replica on c:7050 holds 2 live row(s) whose key lies outside "
        "the tablet's partition: (id=3), (id=8)",
        2,
        2,
    ),
    (
        "every replica holds the same rows outside the partition",
        (cs("a", **OUTSIDE), cs("b", **OUTSIDE), cs("c", **OUTSIDE)),
        Health.ROWS_OUTSIDE_PARTITION,
        "replicas on a:7050, b:7050, c:7050 each hold 2 live row(s) whose key lies outside the "
        "tablet's partition: (id=3), (id=8)",
        3,
        2,
    ),
    (
        "more rows outside than sample keys",
        tuple(cs(u, outside_rows=40, outside_sample_keys=KEYS) for u in "abc"),
        Health.ROWS_OUTSIDE_PARTITION,
        "each hold 40 live row(s) whose key lies outside the tablet's partition: (id=3), "
        "(id=8), ...",
        3,
        40,
    ),
    ("a single replica: nothing to compare", (cs("a"),), Health.HEALTHY, "", 0, 0),
]


@pytest.mark.parametrize(
    ("sums", "expected", "reason", "matched", "outside"),
    [c[1:] for c in CHECKSUM_CASES],
    ids=[c[0] for c in CHECKSUM_CASES],
)
def test_rate_tablet_checksums(
    sums: tuple[ReplicaChecksum, ...], expected: Health, reason: str, matched: int, outside: int
) -> None:
    v = rate_tablet(MASTER, healthy_servers(), 3, "t", checksums=sums)
    assert v.health is expected, v.reasons
    if reason:
        assert any(reason in r for r in v.reasons), v.reasons
    else:
        assert v.reasons == ()
    assert (v.checksums_matched, v.outside_partition_rows) == (matched, outside)
    ranks = [Health[r.split(":")[0]] for r in v.reasons]
    assert ranks == sorted(ranks, reverse=True)


def test_a_replica_already_rated_down_adds_no_checksum_finding() -> None:
    """c's server is unreachable: UNDER_REPLICATED says so once; its failed Checksum is not
    a second finding, and a and b still compare."""
    servers = {**healthy_servers(), "c": srv("c", reachable=False, error="refused")}
    sums = (cs("a"), cs("b"), ReplicaChecksum("c", error="refused"))
    v = rate_tablet(MASTER, servers, 3, "t", checksums=sums)
    assert v.health is Health.UNDER_REPLICATED
    assert not any("checksum" in r for r in v.reasons), v.reasons
    assert v.checksums_matched == 2


def test_data_findings_rank_between_under_replicated_and_consensus_mismatch() -> None:
    assert (
        Health.UNDER_REPLICATED
        < Health.ROWS_OUTSIDE_PARTITION
        < Health.CHECKSUM_MISMATCH
        < Health.CONSENSUS_MISMATCH
    )
    servers = {**healthy_servers(), "c": srv("c", reachable=False)}
    v = rate_tablet(MASTER, servers, 3, checksums=(cs("a", **OUTSIDE), cs("b", **OUTSIDE)))
    assert v.health is Health.ROWS_OUTSIDE_PARTITION
    assert v.reasons[1].startswith("UNDER_REPLICATED:")


def test_without_checksums_nothing_is_said_about_them() -> None:
    v = rate_tablet(MASTER, healthy_servers(), 3, "t")
    assert v.health is Health.HEALTHY and v.checksums_matched == 0


def test_check_reports_rows_outside_the_partition_with_the_remedy_once() -> None:
    t2 = MasterTablet("tablet-2", ABC, "a")
    servers = healthy_servers()
    servers = {
        u: replace(s, replicas=(*s.replicas, replace(s.replicas[0], tablet_id="tablet-2")))
        for u, s in servers.items()
    }
    table = TableSnapshot(
        "id",
        "t",
        3,
        (MASTER, t2),
        checksums=(
            TabletChecksums(T, AGREE),
            TabletChecksums("tablet-2", tuple(cs(u, **OUTSIDE) for u in "abc")),
        ),
    )
    report = check(_snapshot(tservers=tuple(servers.values()), tables=(table,), checksummed=True))
    assert not report.healthy and report.checksummed
    assert [x.tablet_id for x in report.outside_partition_tablets] == ["tablet-2"]
    assert report.remedies == (outside_partition_remedy("t"),)
    assert (
        "tessera table copy t t_rewritten --create --operation insert --no-transactional"
        in report.remedies[0]
    )
    assert "tessera table copy 'my t' 'my t_rewritten'" in outside_partition_remedy("my t")
    assert report.tables[0].count(Health.ROWS_OUTSIDE_PARTITION) == 1
    clean = check(
        _snapshot(
            tables=(
                replace(
                    TableSnapshot("id", "t", 3, (MASTER,)), checksums=(TabletChecksums(T, AGREE),)
                ),
            ),
            checksummed=True,
        )
    )
    assert clean.healthy and clean.remedies == ()


def test_the_report_prints_the_checksum_findings_and_the_remedy() -> None:
    """Plain text and JSON carry the findings, the checksum summary and the table's rewrite."""
    table = TableSnapshot(
        "id",
        "events",
        3,
        (replace(MASTER, partition="hash 0"),),
        checksums=(TabletChecksums(T, tuple(cs(u, **OUTSIDE) for u in "abc")),),
    )
    report = check(_snapshot(tables=(table,), checksummed=True))
    text = ksck_cmd.format_report(report)
    assert "ROWS_OUTSIDE_PARTITION  tablet tablet-1 of events (hash 0)" in text
    assert "replicas on a:7050, b:7050, c:7050 each hold 2 live row(s)" in text
    assert "Checksums: 1 tablet(s), 3 replica(s) agree" in text
    assert (
        "\n  tessera table copy events events_rewritten --create --operation insert "
        "--no-transactional\n" in text
    )
    assert text.endswith("1 table(s) and 1 tablet(s) not healthy")
    js = ksck_cmd.report_json(report)
    assert js["checksum"] == {
        "checked": True,
        "replicas_matched": 3,
        "rows_outside_partition": [
            {"table": "events", "tablet_id": T, "partition": "hash 0", "rows": 2}
        ],
    }
    assert js["remedies"] == [outside_partition_remedy("events")]
    clean = check(_snapshot(checksummed=True))
    assert ksck_cmd.format_report(clean).endswith("all healthy, checksums match")


def test_describe_key_decodes_with_the_schema_or_says_it_cannot() -> None:
    schema = Schema.build(
        [("host", ColumnType.STRING), ("ts", ColumnType.INT64)], key=("host", "ts")
    )
    key = encode_key(schema, ["web-1", 5])
    assert ksck_cmd.describe_key(schema, key) == "(host='web-1', ts=5)"
    assert ksck_cmd.describe_key(schema, b"\x01").startswith("0x01 (does not decode: ")
