"""Placement policy: live servers only, fewest replicas of the table, then fewest in total, ties
broken by the injected rng; even spread of a large table; deterministic; bad input refused."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from random import Random
from types import MappingProxyType

import pytest

from service.common.errors import FailedPrecondition, InvalidArgument
from service.master.placement_policy import (
    ServerLoad,
    choose_leader,
    choose_replacement,
    place_table,
    place_tablet,
)

T = "table-1"


def load(
    uuid: str,
    *,
    live: bool = True,
    table: int = 0,
    other: int = 0,
    location: str | None = None,
) -> ServerLoad:
    """A server with `table` replicas of T and `other` replicas of another table."""
    by_table = {T: table, "table-2": other}
    return ServerLoad(uuid, live, table + other, by_table, location)


def empty_cluster(n: int, **kw: object) -> list[ServerLoad]:
    return [ServerLoad(f"ts-{i:03d}", True, 0, {}, **kw) for i in range(n)]  # type: ignore[arg-type]


# --- place_tablet: who is chosen ------------------------------------------------------------

CHOICE_CASES: list[tuple[str, list[ServerLoad], int, set[str]]] = [
    (
        "fewest replicas of this table wins over fewest in total",
        [load("a", table=5), load("b", table=0, other=50), load("c", table=1)],
        1,
        {"b"},
    ),
    (
        "then fewest in total",
        [load("a", table=1, other=9), load("b", table=1, other=2), load("c", table=1, other=4)],
        1,
        {"b"},
    ),
    (
        "the n least loaded, in any order",
        [load("a", table=3), load("b", table=0), load("c", table=1), load("d", table=2)],
        3,
        {"b", "c", "d"},
    ),
    (
        "dead servers are never chosen, however empty",
        [load("dead", live=False), load("a", table=9), load("b", table=7), load("c", table=8)],
        3,
        {"a", "b", "c"},
    ),
    (
        "all live servers when n equals their number",
        [load("a", table=1), load("b", live=False), load("c", table=4)],
        2,
        {"a", "c"},
    ),
]


@pytest.mark.parametrize(
    ("servers", "n", "expected"),
    [c[1:] for c in CHOICE_CASES],
    ids=[c[0] for c in CHOICE_CASES],
)
def test_place_tablet_chooses_least_loaded_live_servers(
    servers: list[ServerLoad], n: int, expected: set[str]
) -> None:
    for seed in range(20):
        chosen = place_tablet(servers, T, n, Random(seed))
        assert len(chosen) == n == len(set(chosen))
        assert set(chosen) == expected


def test_excluded_servers_are_never_chosen() -> None:
    servers = empty_cluster(6)
    exclude = {"ts-000", "ts-001", "ts-002"}
    for seed in range(50):
        chosen = place_tablet(servers, T, 3, Random(seed), exclude=exclude)
        assert set(chosen) == {"ts-003", "ts-004", "ts-005"}


def test_ties_are_broken_by_the_rng_and_every_tied_server_gets_chosen() -> None:
    servers = empty_cluster(5)
    seen = Counter(u for seed in range(200) for u in place_tablet(servers, T, 2, Random(seed)))
    assert set(seen) == {s.uuid for s in servers}
    # 400 picks over 5 servers: each about 80; a biased tie-break would starve someone.
    assert min(seen.values()) > 40


def test_fixed_seed_is_deterministic_and_independent_of_input_order() -> None:
    servers = [load(f"ts-{i}", table=i % 3, other=i % 2) for i in range(12)]
    first = place_tablet(servers, T, 3, Random(7))
    for perm_seed in range(10):
        shuffled = list(servers)
        Random(perm_seed).shuffle(shuffled)
        assert place_tablet(shuffled, T, 3, Random(7)) == first
    table_a = place_table(servers, T, 50, 3, Random(11))
    assert place_table(list(reversed(servers)), T, 50, 3, Random(11)) == table_a


def test_location_spread_comes_first_when_servers_have_locations() -> None:
    # Rack r0 is emptier, but each tablet must still get one replica per rack.
    servers = [
        load("a0", location="r0"),
        load("b0", location="r0"),
        load("c0", location="r0"),
        load("a1", table=4, location="r1"),
        load("b1", table=5, location="r1"),
        load("a2", table=6, location="r2"),
    ]
    racks = {s.uuid: s.location for s in servers}
    for seed in range(30):
        chosen = place_tablet(servers, T, 3, Random(seed))
        assert sorted(racks[u] or "" for u in chosen) == ["r0", "r1", "r2"]
        assert "a1" in chosen and "a2" in chosen  # least loaded within its rack


def test_place_table_with_locations_spreads_every_tablet_over_the_racks() -> None:
    servers = [ServerLoad(f"ts-{i}", True, 0, {}, f"rack-{i % 3}") for i in range(9)]
    racks = {s.uuid: s.location for s in servers}
    placements = place_table(servers, T, 300, 3, Random(3))
    for chosen in placements:
        assert {racks[u] for u in chosen} == {"rack-0", "rack-1", "rack-2"}
    counts = Counter(itertools.chain.from_iterable(placements))
    assert max(counts.values()) - min(counts.values()) <= 1


# --- place_tablet: errors -------------------------------------------------------------------

ERROR_CASES: list[tuple[str, list[ServerLoad], int, Sequence[str], type[Exception], str]] = [
    (
        "not enough live servers names the dead",
        [load("a"), load("b"), load("c", live=False)],
        3,
        (),
        FailedPrecondition,
        "need 3 live tablet servers, have 2 (dead: c)",
    ),
    (
        "excluded servers do not count and are named",
        [load("a"), load("b"), load("c"), load("d", live=False)],
        3,
        ("c",),
        FailedPrecondition,
        "need 3 live tablet servers, have 2 (dead: d; excluded: c)",
    ),
    (
        "an empty cluster",
        [],
        1,
        (),
        FailedPrecondition,
        "need 1 live tablet server, have 0",
    ),
    ("zero replicas", [load("a")], 0, (), InvalidArgument, "num_replicas must be"),
    ("negative replicas", [load("a")], -3, (), InvalidArgument, "num_replicas must be"),
    (
        "duplicate uuids",
        [load("a"), load("b"), load("a", table=2)],
        1,
        (),
        InvalidArgument,
        "duplicate tablet server uuids: a",
    ),
]


@pytest.mark.parametrize(
    ("servers", "n", "exclude", "error", "message"),
    [c[1:] for c in ERROR_CASES],
    ids=[c[0] for c in ERROR_CASES],
)
def test_place_tablet_refuses_what_cannot_be_done(
    servers: list[ServerLoad],
    n: int,
    exclude: Sequence[str],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error) as excinfo:
        place_tablet(servers, T, n, Random(0), exclude=exclude)
    assert str(excinfo.value).startswith(message), str(excinfo.value)


def test_long_lists_of_dead_servers_are_abbreviated() -> None:
    servers = [load(f"d{i:02d}", live=False) for i in range(25)]
    with pytest.raises(FailedPrecondition, match="and 15 more"):
        place_tablet(servers, T, 3, Random(0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uuid": "", "live": True}, "uuid"),
        ({"uuid": "a", "live": True, "total_replicas": -1}, "total_replicas"),
        ({"uuid": "a", "live": True, "total_replicas": 1, "replicas_by_table": {T: -1}}, ">= 0"),
        ({"uuid": "a", "live": True, "total_replicas": 1, "replicas_by_table": {T: 2}}, "sum"),
    ],
)
def test_server_load_validates(kwargs: Mapping[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ServerLoad(**kwargs)  # type: ignore[arg-type]


def test_server_load_is_an_immutable_hashable_value() -> None:
    counts = {T: 2}
    s = ServerLoad("a", True, 3, counts)
    counts[T] = 99  # the caller's dict is copied
    assert s.replicas_of(T) == 2 and s.replicas_of("nope") == 0
    with pytest.raises(TypeError):
        s.replicas_by_table[T] = 5  # type: ignore[index]
    assert s == ServerLoad("a", True, 3, {T: 2})
    assert len({s, ServerLoad("a", True, 3, {T: 2})}) == 1


# --- place_table ----------------------------------------------------------------------------


@pytest.mark.parametrize(("num_servers", "num_replicas"), [(3, 3), (7, 3), (10, 3), (50, 5)])
def test_a_thousand_tablets_spread_evenly_on_an_empty_cluster(
    num_servers: int, num_replicas: int
) -> None:
    servers = empty_cluster(num_servers)
    placements = place_table(servers, T, 1000, num_replicas, Random(42))
    assert len(placements) == 1000
    assert all(len(set(p)) == num_replicas for p in placements)
    counts = Counter(itertools.chain.from_iterable(placements))
    assert set(counts) == {s.uuid for s in servers}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_place_table_fills_an_added_empty_server_with_only_its_share_of_the_table() -> None:
    # Nine busy servers and one new, empty one: the new table spreads over all ten (fewest of
    # this table first), instead of the empty server getting a replica of every tablet.
    servers = [load(f"old-{i}", other=300) for i in range(9)] + [load("new")]
    placements = place_table(servers, T, 100, 3, Random(5))
    counts = Counter(itertools.chain.from_iterable(placements))
    assert max(counts.values()) - min(counts.values()) <= 1
    assert counts["new"] == 30


def test_place_table_evens_out_existing_replicas_of_the_table() -> None:
    servers = [load("a", table=10), load("b", table=0), load("c", table=0), load("d", table=0)]
    placements = place_table(servers, T, 10, 1, Random(0))
    counts = Counter(itertools.chain.from_iterable(placements))
    assert "a" not in counts
    assert sorted(counts.values()) == [3, 3, 4]


def test_place_table_never_uses_dead_servers_and_fails_before_choosing_anything() -> None:
    servers = [*empty_cluster(4), load("dead", live=False)]
    placements = place_table(servers, T, 100, 3, Random(1))
    assert "dead" not in set(itertools.chain.from_iterable(placements))
    with pytest.raises(FailedPrecondition, match=r"need 5 live tablet servers, have 4 \(dead"):
        place_table(servers, T, 100, 5, Random(1))


@pytest.mark.parametrize(
    ("num_tablets", "num_replicas", "message"),
    [(-1, 3, "num_tablets"), (10, 0, "num_replicas"), (True, 3, "num_tablets")],
)
def test_place_table_bad_input(num_tablets: int, num_replicas: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        place_table(empty_cluster(3), T, num_tablets, num_replicas, Random(0))


def test_place_table_of_zero_tablets_is_empty_and_table_id_is_required() -> None:
    assert place_table(empty_cluster(3), T, 0, 3, Random(0)) == []
    with pytest.raises(InvalidArgument, match="table id"):
        place_table(empty_cluster(3), "", 1, 3, Random(0))


# --- choose_replacement ---------------------------------------------------------------------


def test_replacement_goes_elsewhere_to_the_least_loaded_live_server() -> None:
    servers = [
        load("r1", live=False),
        load("r2"),
        load("r3"),
        load("x", table=3),
        load("y", table=1, other=10),
        load("z", live=False),
        load("w", table=1, other=2),
    ]
    for seed in range(20):
        assert choose_replacement(servers, T, ["r1", "r2", "r3"], Random(seed)) == "w"
        assert choose_replacement(servers, T, ["r1", "r2", "r3"], Random(seed), ["w"]) == "y"


def test_replacement_restores_the_location_spread() -> None:
    servers = [
        load("a0", live=False, location="r0"),  # the dead replica
        load("a1", location="r1"),
        load("a2", location="r2"),
        load("b0", table=9, location="r0"),
        load("b1", location="r1"),
        load("b2", location="r2"),
    ]
    assert choose_replacement(servers, T, ["a0", "a1", "a2"], Random(0)) == "b0"


def test_replacement_without_a_candidate_says_why() -> None:
    servers = [load("r1"), load("r2"), load("r3"), load("d", live=False), load("x")]
    with pytest.raises(FailedPrecondition) as excinfo:
        choose_replacement(servers, T, ["r1", "r2", "r3"], Random(0), exclude=["x"])
    msg = str(excinfo.value)
    assert "outside the current replicas (r1, r2, r3)" in msg
    assert "dead: d" in msg and "excluded: x" in msg
    with pytest.raises(InvalidArgument, match="duplicate uuids in current_replicas: r1"):
        choose_replacement(servers, T, ["r1", "r1"], Random(0))
    with pytest.raises(InvalidArgument, match="not the string"):
        choose_replacement(servers, T, "r1", Random(0))


def test_a_bare_string_is_not_taken_for_a_list_of_uuids() -> None:
    with pytest.raises(InvalidArgument, match="exclude must be a collection"):
        place_tablet(empty_cluster(3), T, 1, Random(0), exclude="ts-000")


# --- choose_leader --------------------------------------------------------------------------


def test_choose_leader_is_one_of_the_replicas_random_and_order_independent() -> None:
    replicas = ("a", "b", "c")
    leaders = Counter(choose_leader(replicas, Random(seed)) for seed in range(300))
    assert set(leaders) == set(replicas) and min(leaders.values()) > 60
    for seed in range(20):
        assert choose_leader(replicas, Random(seed)) == choose_leader(("c", "a", "b"), Random(seed))


def test_choose_leader_balances_with_leader_counts() -> None:
    assert choose_leader(("a", "b", "c"), Random(0), {"a": 3, "b": 1, "c": 2}) == "b"
    assert choose_leader(("a", "b", "c"), Random(0), {"a": 3, "b": 3}) == "c"
    leaders: Counter[str] = Counter()
    rng = Random(9)
    for replicas in place_table(empty_cluster(6), T, 600, 3, Random(9)):
        leaders[choose_leader(replicas, rng, leaders)] += 1
    assert max(leaders.values()) - min(leaders.values()) <= 10


@pytest.mark.parametrize("replicas", [(), ("a", "a"), "abc"])
def test_choose_leader_bad_input(replicas: tuple[str, ...]) -> None:
    with pytest.raises(InvalidArgument):
        choose_leader(replicas, Random(0))


# --- purity ---------------------------------------------------------------------------------


def test_the_module_imports_only_stdlib_and_common_errors_or_ids() -> None:
    import ast

    import service.master.placement_policy as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    allowed = {
        "__future__",
        "bisect",
        "collections",
        "collections.abc",
        "dataclasses",
        "random",
        "types",
        "service.common.errors",
        "service.common.ids",
    }
    assert imported <= allowed, imported - allowed


def test_an_unchecked_load_equals_the_checked_one_and_places_alike() -> None:
    counts = {"t1": 2, "t2": 1}
    checked = [ServerLoad(f"ts-{i}", True, 3 + i, counts) for i in range(5)]
    unchecked = [
        ServerLoad.unchecked(f"ts-{i}", True, 3 + i, MappingProxyType(dict(counts)), None)
        for i in range(5)
    ]
    assert unchecked == checked
    assert place_table(unchecked, "t1", 4, 3, Random(7)) == place_table(
        checked, "t1", 4, 3, Random(7)
    )
