"""The pure rebalancer: table-driven cases, then randomized properties over many seeds.

Properties (module docstring of service.rebalance.rebalancing): with nothing pinned every result is
balanced (each table's skew and the cluster's skew at most 1); every move takes a replica from a
server that holds it to a live server that does not (`apply_moves` checks both); a tablet keeps
its replica count; a balanced input yields no moves; the same input and seed give the same plan;
a `max_moves` plan is a prefix of the full plan.
"""

from __future__ import annotations

from collections import Counter
from random import Random

import pytest

from service.common.errors import InvalidArgument
from service.rebalance.rebalancing import (
    Distribution,
    Move,
    Placement,
    apply_moves,
    plan_moves,
    skew_report,
)


def spread(
    table: str, tablets: int, rf: int, servers: list[str], first: int = 0
) -> list[tuple[str, str, str]]:
    """`tablets` tablets of `table`, replica j of tablet i on servers[(first + i + j) % n]."""
    n = len(servers)
    return [
        (table, f"{table}-t{i}", servers[(first + i + j) % n])
        for i in range(tablets)
        for j in range(rf)
    ]


def check_plan(d: Distribution, moves: list[Move]) -> Distribution:
    """Apply `moves` (validating each) and check what every plan must satisfy."""
    after = apply_moves(d, moves)
    before_per_tablet = Counter(p.tablet_id for p in d.replicas)
    after_per_tablet = Counter(p.tablet_id for p in after.replicas)
    assert before_per_tablet == after_per_tablet
    for m in moves:
        assert m.tablet_id not in d.pinned
        assert m.from_ts in d.servers, "never moves a replica off a server that is not live"
        assert m.from_ts != m.to_ts
    placed = [(p.tablet_id, p.ts_uuid) for p in after.replicas]
    assert len(placed) == len(set(placed))
    return after


# --- table-driven ----------------------------------------------------------------------------

S3 = ["a", "b", "c"]
S4 = ["a", "b", "c", "d"]

CASES = [
    # (name, replicas, live servers, pinned, expected number of moves or None to skip)
    ("empty cluster", [], S3, (), 0),
    ("no servers", [], [], (), 0),
    ("balanced rf3 on 3", spread("T", 4, 3, S3), S3, (), 0),
    ("balanced rf1", spread("T", 6, 1, S3), S3, (), 0),
    ("one empty server rf3", spread("T", 4, 3, S3), S4, (), 3),
    ("two tables and an empty server", spread("A", 6, 3, S3) + spread("B", 4, 3, S3), S4, (), 7),
    (
        "tables skewed, cluster even",
        [("A", "a1", "a"), ("A", "a2", "a"), ("B", "b1", "b"), ("B", "b2", "b")],
        ["a", "b"],
        (),
        2,
    ),
    ("all on one server rf1", spread("T", 8, 1, ["a"]), S4, (), 6),
    ("only cluster skew", spread("A", 1, 1, ["a"]) + spread("B", 1, 1, ["a"]), ["a", "b"], (), 1),
]


@pytest.mark.parametrize(
    ("name", "replicas", "servers", "pinned", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_cases(
    name: str,
    replicas: list[tuple[str, str, str]],
    servers: list[str],
    pinned: tuple[str, ...],
    expected: int,
) -> None:
    d = Distribution.of(replicas, servers, pinned)
    moves = plan_moves(d)
    after = check_plan(d, moves)
    assert skew_report(after).balanced, skew_report(after)
    assert len(moves) == expected, moves
    assert plan_moves(after) == []


def test_new_server_receives_every_move_and_report_counts() -> None:
    d = Distribution.of(spread("A", 6, 3, S3) + spread("B", 4, 3, S3), S4)
    before = skew_report(d)
    assert before.totals == {"a": 10, "b": 10, "c": 10, "d": 0}
    assert before.cluster_skew == 10
    assert [(t.table_id, t.skew) for t in before.tables] == [("A", 6), ("B", 4)]
    assert before.replicas == 30 and before.offline_replicas == 0 and not before.balanced
    moves = plan_moves(d)
    assert {m.to_ts for m in moves} == {"d"}
    after = skew_report(apply_moves(d, moves))
    assert sorted(after.totals.values()) == [7, 7, 8, 8]
    assert after.tables[0].counts["d"] in (4, 5) and after.tables[1].counts["d"] == 3
    assert after.balanced and after.max_table_skew <= 1


def test_pinned_tablets_never_move() -> None:
    replicas = spread("T", 4, 1, ["a"])
    d = Distribution.of(replicas, ["a", "b"], pinned=["T-t0", "T-t1", "T-t2"])
    moves = plan_moves(d)
    assert moves == [Move("T-t3", "T", "a", "b")]
    after = check_plan(d, moves)
    assert skew_report(after).cluster_skew == 2  # balance is not reachable: reported, not forced
    assert plan_moves(after) == []


def test_replicas_on_dead_servers_count_for_nothing_but_occupy_their_tablet() -> None:
    # t0 has a replica on dead server x and on a; live b is empty.
    replicas = [("T", "t0", "x"), ("T", "t0", "a"), ("T", "t1", "a"), ("T", "t2", "a")]
    d = Distribution.of(replicas, ["a", "b"])
    rep = skew_report(d)
    assert rep.offline_replicas == 1 and rep.totals == {"a": 3, "b": 0}
    moves = plan_moves(d)
    assert all(m.from_ts == "a" and m.to_ts == "b" for m in moves) and len(moves) == 1
    check_plan(d, moves)


def test_never_two_replicas_of_a_tablet_on_a_server() -> None:
    # Every tablet of T is on both a and b; only c and d are free. Moving anything from a to b
    # would duplicate, so the plan must go to c/d.
    replicas = [("T", f"t{i}", s) for i in range(4) for s in ("a", "b")]
    d = Distribution.of(replicas, S4)
    moves = plan_moves(d)
    after = check_plan(d, moves)
    assert skew_report(after).balanced
    assert {m.to_ts for m in moves} <= {"c", "d"}


def test_max_moves_is_a_prefix_and_zero_means_none() -> None:
    d = Distribution.of(spread("A", 6, 3, S3) + spread("B", 4, 3, S3), S4)
    full = plan_moves(d)
    assert plan_moves(d, max_moves=3) == full[:3]
    assert plan_moves(d, max_moves=0) == []
    with pytest.raises(InvalidArgument):
        plan_moves(d, max_moves=-1)


def test_seeded_rng_is_reproducible_and_still_balances() -> None:
    d = Distribution.of(spread("A", 9, 3, S3) + spread("B", 5, 3, S3, 1), [*S4, "e"])
    a = plan_moves(d, rng=Random(7))
    b = plan_moves(d, rng=Random(7))
    assert a == b
    assert skew_report(check_plan(d, a)).balanced
    assert plan_moves(d) == plan_moves(d)


def test_apply_moves_refuses_impossible_moves() -> None:
    d = Distribution.of([("T", "t0", "a"), ("T", "t0", "b")], ["a", "b", "c"])
    with pytest.raises(InvalidArgument, match="holds no replica"):
        apply_moves(d, [Move("t0", "T", "c", "a")])
    with pytest.raises(InvalidArgument, match="already holds"):
        apply_moves(d, [Move("t0", "T", "a", "b")])
    with pytest.raises(InvalidArgument, match="not a live server"):
        apply_moves(d, [Move("t0", "T", "a", "z")])
    with pytest.raises(InvalidArgument, match="holds no replica"):
        apply_moves(d, [Move("t0", "OTHER", "a", "c")])
    assert apply_moves(d, []) == d


def test_a_tablet_in_two_tables_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="tables"):
        Distribution.of([("A", "t0", "a"), ("B", "t0", "b")], ["a", "b"])


# --- randomized properties -------------------------------------------------------------------


def random_distribution(rng: Random, pin: bool) -> Distribution:
    """A random cluster: a skewed initial placement on a subset of servers, empty servers,
    sometimes replicas on dead servers, sometimes pinned tablets."""
    n = rng.randint(1, 8)
    live = [f"s{i:02d}" for i in range(n)]
    dead = [f"x{i}" for i in range(rng.randint(0, 2))]
    replicas: list[tuple[str, str, str]] = []
    for t in range(rng.randint(0, 4)):
        rf = rng.choice([r for r in (1, 2, 3, 5) if r <= n + len(dead)])
        used = rng.sample(live + dead, rng.randint(min(rf, n + len(dead)), n + len(dead)))
        if len(used) < rf:
            continue
        weights = [rng.randint(1, 5) for _ in used]
        for i in range(rng.randint(1, 10)):
            chosen: list[str] = []
            while len(chosen) < rf:
                s = rng.choices(used, weights)[0]
                if s not in chosen:
                    chosen.append(s)
            replicas += [(f"T{t}", f"T{t}-{i}", s) for s in chosen]
    tablets = sorted({r[1] for r in replicas})
    pinned = [t for t in tablets if pin and rng.random() < 0.3]
    return Distribution.of(replicas, live, pinned)


@pytest.mark.parametrize("seed", range(300))
def test_random_clusters_balance(seed: int) -> None:
    rng = Random(seed)
    d = random_distribution(rng, pin=False)
    moves = plan_moves(d)
    after = check_plan(d, moves)
    report = skew_report(after)
    assert report.balanced, (seed, report)
    assert plan_moves(after) == [], "idempotent: a balanced result plans nothing"
    assert plan_moves(d) == moves, "deterministic"
    seeded = plan_moves(d, rng=Random(seed))
    assert skew_report(check_plan(d, seeded)).balanced
    assert seeded == plan_moves(d, rng=Random(seed))
    cut = rng.randint(0, len(moves))
    assert plan_moves(d, max_moves=cut) == moves[:cut]


@pytest.mark.parametrize("seed", range(150))
def test_random_clusters_with_pins_never_move_pins_and_settle(seed: int) -> None:
    rng = Random(10_000 + seed)
    d = random_distribution(rng, pin=True)
    moves = plan_moves(d, rng=Random(seed))
    after = check_plan(d, moves)
    before, now = skew_report(d), skew_report(after)
    assert now.max_table_skew <= max(before.max_table_skew, 1)
    assert plan_moves(after) == [], "the plan ran until no move helps"
    assert all(p in after.replicas for p in d.replicas if p.tablet_id in d.pinned)


def test_placement_orders_by_table_then_tablet() -> None:
    a, b = Placement("A", "t1", "z"), Placement("B", "t0", "a")
    assert sorted([b, a]) == [a, b]
