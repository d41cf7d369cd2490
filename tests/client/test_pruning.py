"""Partition pruning: never skips a tablet that holds a matching row, and skips the rest for
the shapes it handles (hash equality, range prefix, integer bounds)."""

from __future__ import annotations

import random

import pytest

from service.client.pruning import allowed_buckets, prune, range_interval, successor
from service.common.partition import (
    HashBucketSchema,
    Partition,
    PartitionSchema,
    RangeSchema,
    find_partition,
)
from service.common.predicates import ColumnPredicate as P
from service.common.schema import ColumnType, Schema

SCHEMA = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("v", ColumnType.DOUBLE)],
    key=("host", "ts"),
)
# 4 hash buckets on host, ranges on ts split at 100, 200, 300.
PS = PartitionSchema(
    hash=(HashBucketSchema(("host",), 4),),
    range=RangeSchema(("ts",)),
    split_rows=((100,), (200,), (300,)),
)
PARTS = PS.create_partitions(SCHEMA)


def _row_partition(host: str, ts: int) -> Partition:
    p = find_partition(PARTS, PS.partition_key_for_row(SCHEMA, {"host": host, "ts": ts}))
    assert p is not None
    return p


def _matches(p: P, row: dict[str, object]) -> bool:
    v = row[p.column]
    x = p.values[0] if p.values else None
    return {
        "EQ": lambda: v == x,
        "LT": lambda: v < x,  # type: ignore[operator]
        "LE": lambda: v <= x,  # type: ignore[operator]
        "GT": lambda: v > x,  # type: ignore[operator]
        "GE": lambda: v >= x,  # type: ignore[operator]
        "IN": lambda: v in p.values,
    }[p.op]()


def test_successor() -> None:
    assert successor(b"ab") == b"ac"
    assert successor(b"a\xff\xff") == b"b"
    assert successor(b"\xff") is None
    assert successor(b"") is None


def test_hash_equality_keeps_one_bucket_and_range_bounds_cut_ranges() -> None:
    kept = prune(SCHEMA, PS, [P("host", "EQ", ("h1",))], PARTS)
    assert len(kept) == 4  # one bucket x 4 ranges
    assert {p.hash_buckets for p in kept} == {_row_partition("h1", 0).hash_buckets}
    kept = prune(SCHEMA, PS, [P("ts", "GE", (150,)), P("ts", "LT", (200,))], PARTS)
    assert len(kept) == 4  # every bucket x the [100, 200) range
    kept = prune(SCHEMA, PS, [P("host", "EQ", ("h1",)), P("ts", "EQ", (250,))], PARTS)
    assert kept == [_row_partition("h1", 250)]
    assert prune(SCHEMA, PS, [P("ts", "GT", (2**63 - 1,))], PARTS) == []
    assert prune(SCHEMA, PS, [P("host", "IN", ())], PARTS) == []


def test_in_list_keeps_the_buckets_of_its_values() -> None:
    buckets = allowed_buckets(SCHEMA, PS, [P("host", "IN", ("a", "b", "c"))])
    assert buckets[0] == frozenset(_row_partition(h, 0).hash_buckets[0] for h in "abc")


def test_non_key_and_string_range_predicates_prune_nothing() -> None:
    assert prune(SCHEMA, PS, [P("v", "GT", (1.0,))], PARTS) == PARTS
    assert range_interval(SCHEMA, PS, [P("ts", "IS_NOT_NULL")]).lower is None


def test_multi_column_range_prefix_equality() -> None:
    ps = PartitionSchema(range=RangeSchema(("host", "ts")), split_rows=(("m",), ("m", 50)))
    parts = ps.create_partitions(SCHEMA)
    kept = prune(SCHEMA, ps, [P("host", "EQ", ("m",)), P("ts", "GE", (60,))], parts)
    assert kept == [
        find_partition(parts, ps.partition_key_for_row(SCHEMA, {"host": "m", "ts": 60}))
    ]
    kept = prune(SCHEMA, ps, [P("host", "EQ", ("a",))], parts)
    assert len(kept) == 1


@pytest.mark.parametrize("seed", range(20))
def test_pruning_never_drops_a_matching_row(seed: int) -> None:
    """Random rows and random predicate sets: every matching row's tablet is kept."""
    rng = random.Random(seed)
    hosts = [f"h{i}" for i in range(8)]
    rows = [{"host": rng.choice(hosts), "ts": rng.randrange(-50, 400)} for _ in range(300)]
    for _ in range(30):
        preds: list[P] = []
        for _ in range(rng.randrange(1, 4)):
            kind = rng.choice(["EQ", "LT", "LE", "GT", "GE", "IN", "HOST_EQ", "HOST_IN"])
            if kind == "HOST_EQ":
                preds.append(P("host", "EQ", (rng.choice(hosts),)))
            elif kind == "HOST_IN":
                preds.append(P("host", "IN", tuple(rng.sample(hosts, 3))))
            elif kind == "IN":
                preds.append(P("ts", "IN", tuple(rng.randrange(-50, 400) for _ in range(3))))
            else:
                preds.append(P("ts", kind, (rng.randrange(-60, 410),)))
        kept = set(prune(SCHEMA, PS, preds, PARTS))
        for r in rows:
            if all(_matches(p, r) for p in preds):
                assert _row_partition(str(r["host"]), int(r["ts"])) in kept, (preds, r)  # type: ignore[call-overload]
