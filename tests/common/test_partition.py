"""Keys and partitioning: the order-preserving key encoding (seeded random property tests), the
vectorized encoders against the scalar ones, partition creation and lookup, the stable hash,
validation messages, pruning helpers and the protobuf codec of partition schemas."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import itertools
import random
from collections.abc import Callable, Sequence
from decimal import Decimal

import pyarrow as pa
import pytest

from service.common.errors import InvalidArgument
from service.common.keys import decode_key, encode_key, encode_keys_arrow
from service.common.partition import (
    MAX_TABLETS_PER_TABLE,
    HashBucketSchema,
    Partition,
    PartitionSchema,
    RangeSchema,
    bucket_for,
    bucket_for_equality,
    buckets_for_arrow,
    find_partition,
    hash_bucket,
    hash_prefix,
    partitions_for_key_range,
)
from service.common.schema import (
    AddColumn,
    ColumnSchema,
    ColumnType,
    RenameColumn,
    Schema,
    unscaled_to_decimal,
)
from service.common.schema_codec import (
    partition_from_pb,
    partition_schema_from_pb,
    partition_schema_to_pb,
    partition_to_pb,
)
from service.pb import common_pb2 as pb

T = ColumnType
KEY_TYPES = [
    T.INT8,
    T.INT16,
    T.INT32,
    T.INT64,
    T.STRING,
    T.BINARY,
    T.TIMESTAMP,
    T.DATE,
    T.DECIMAL,
]
# Characters chosen so that prefixes, embedded NULs and multi-byte UTF-8 collide often.
ALPHABET = ["\x00", "\x01", "a", "b", "\xff", "é", "\U0001f600"]


def key_column(i: int, t: ColumnType) -> ColumnSchema:
    if t is T.DECIMAL:
        return ColumnSchema(i, f"c{i}", t, False, precision=[4, 18, 38][i % 3], scale=i % 4)
    return ColumnSchema(i, f"c{i}", t, False)


def random_value(rng: random.Random, c: ColumnSchema) -> object:
    t = c.type
    if t is T.STRING:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 4)))
    if t is T.BINARY:
        return bytes(rng.choice([0, 1, 2, 0x7F, 0xFF]) for _ in range(rng.randint(0, 4)))
    if t is T.DECIMAL:
        assert c.precision is not None and c.scale is not None
        top = 10**c.precision - 1
        unscaled = rng.choice([rng.randint(-top, top), rng.randint(-3, 3), top, -top])
        return unscaled_to_decimal(unscaled, c.scale)
    lo, hi = t.int_range  # type: ignore[misc]
    return rng.choice([lo, lo + 1, -1, 0, 1, hi - 1, hi, rng.randint(-3, 3), rng.randint(lo, hi)])


def random_columns(rng: random.Random) -> list[ColumnSchema]:
    return [key_column(i, rng.choice(KEY_TYPES)) for i in range(rng.randint(1, 4))]


# --- key encoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_encoding_preserves_order(seed: int) -> None:
    rng = random.Random(seed)
    cols = random_columns(rng)
    rows = [tuple(random_value(rng, c) for c in cols) for _ in range(200)]
    encoded = {r: encode_key(cols, r) for r in rows}
    for a, b in itertools.combinations(rows[:80], 2):
        assert (a < b) == (encoded[a] < encoded[b]), (cols, a, b)
        assert (a == b) == (encoded[a] == encoded[b]), (cols, a, b)
    assert sorted(rows) == sorted(rows, key=lambda r: encoded[r])
    for r in rows:
        assert decode_key(cols, encoded[r]) == r


def test_order_of_tricky_strings_in_a_non_final_component() -> None:
    cols = [key_column(0, T.STRING), key_column(1, T.INT8)]
    words = ["", "\x00", "\x00\x00", "\x00\x01", "\x01", "a", "a\x00", "a\x00b", "ab", "é"]
    for w1, w2 in itertools.product(words, repeat=2):
        for i1, i2 in [(-128, 127), (127, -128), (0, 0)]:
            a, b = (w1, i1), (w2, i2)
            assert (a < b) == (encode_key(cols, a) < encode_key(cols, b)), (a, b)


def test_known_encodings() -> None:
    i32 = [key_column(0, T.INT32)]
    assert encode_key(i32, [-1]) == b"\x7f\xff\xff\xff"
    assert encode_key(i32, [0]) == b"\x80\x00\x00\x00"
    two = [key_column(0, T.BINARY), key_column(1, T.BINARY)]
    assert encode_key(two, [b"a\x00b", b"\x00c"]) == b"a\x00\x01b\x00\x00\x00c"
    dec = [ColumnSchema(0, "m", T.DECIMAL, False, precision=5, scale=2)]
    assert encode_key(dec, [Decimal("-0.01")]) == b"\x7f" + b"\xff" * 15
    ts = [key_column(0, T.TIMESTAMP)]
    aware = dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC)
    assert encode_key(ts, [aware]) == encode_key(ts, [1])


def test_prefix_sorts_before_its_extensions() -> None:
    rng = random.Random(7)
    for _ in range(300):
        cols = [key_column(i, rng.choice(KEY_TYPES)) for i in range(rng.randint(2, 4))]
        full = tuple(random_value(rng, c) for c in cols)
        n = rng.randint(1, len(cols) - 1)
        prefix = full[:n]
        p = encode_key(cols, prefix, allow_prefix=True)
        assert p <= encode_key(cols, full)
        assert decode_key(cols, p, allow_prefix=True) == prefix
        other = tuple(random_value(rng, c) for c in cols)
        if other[:n] < prefix:
            assert encode_key(cols, other) < p
        elif other[:n] > prefix:
            assert encode_key(cols, other) > p


def test_encode_refusals_name_the_column() -> None:
    cols = [key_column(0, T.INT64), key_column(1, T.STRING)]
    with pytest.raises(InvalidArgument, match="key column 'c1' is null"):
        encode_key(cols, [1, None])
    with pytest.raises(InvalidArgument, match=r"column 'c0'.*got str"):
        encode_key(cols, ["1", "x"])
    with pytest.raises(InvalidArgument, match=r"key \(c0, c1\) needs 2 values, got 1"):
        encode_key(cols, [1])
    with pytest.raises(InvalidArgument, match="column 'f': type DOUBLE cannot be part of a key"):
        encode_key([ColumnSchema(0, "f", T.DOUBLE, False)], [1.0])


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x80\x00", "truncated in column 'c0'"),
        (b"\x80" + b"\x00" * 7 + b"ab", "truncated in column 'c1'"),
        (b"\x80" + b"\x00" * 7 + b"a\x00\x02", "bad escape"),
        (b"\x80" + b"\x00" * 7 + b"a\x00\x00\x80\x00", "truncated in column 'c2'"),
        (b"\x80" + b"\x00" * 7 + b"a\x00\x00\x80\x00\x00\x00\x00", "trailing"),
    ],
)
def test_decode_refuses_malformed_keys(data: bytes, fragment: str) -> None:
    cols = [key_column(0, T.INT64), key_column(1, T.STRING), key_column(2, T.DATE)]
    with pytest.raises(InvalidArgument, match=fragment):
        decode_key(cols, data + (b"\x00" if fragment == "trailing" else b""))


def arrow_table(cols: Sequence[ColumnSchema], rows: Sequence[Sequence[object]]) -> pa.Table:
    schema = pa.schema([pa.field(c.name, c.arrow_type(), False) for c in cols])
    return pa.table(
        [pa.array([r[i] for r in rows], c.arrow_type()) for i, c in enumerate(cols)],
        schema=schema,
    )


@pytest.mark.parametrize("seed", range(20))
def test_arrow_encoding_matches_scalar_encoding(seed: int) -> None:
    rng = random.Random(seed)
    cols = random_columns(rng)
    rows = [tuple(random_value(rng, c) for c in cols) for _ in range(300)]
    table = arrow_table(cols, rows)
    expected = [encode_key(cols, r) for r in rows]
    assert encode_keys_arrow(cols, table) == expected
    # Chunked columns, and a sliced batch (non-zero offsets into the buffers).
    chunked = pa.concat_tables([table.slice(0, 100), table.slice(100)])
    assert encode_keys_arrow(cols, chunked) == expected
    batch = table.combine_chunks().to_batches()[0].slice(37, 100)
    assert encode_keys_arrow(cols, batch) == expected[37:137]
    assert encode_keys_arrow(cols, table, prefix=b"\x01\x02") == [b"\x01\x02" + e for e in expected]


def test_arrow_encoding_casts_safely_and_refuses_nulls() -> None:
    cols = [key_column(0, T.INT64), key_column(1, T.TIMESTAMP)]
    t = pa.table(
        {"c0": pa.array([1, -2], pa.int32()), "c1": pa.array([0, 5], pa.timestamp("us", "EST"))}
    )
    assert encode_keys_arrow(cols, t) == [encode_key(cols, [1, 0]), encode_key(cols, [-2, 5])]
    with pytest.raises(InvalidArgument, match="key column 'c0' is null in 1 rows"):
        encode_keys_arrow(cols, pa.table({"c0": [1, None], "c1": t.column("c1")}))
    with pytest.raises(InvalidArgument, match=r"key column 'c0'.*string"):
        encode_keys_arrow(cols, pa.table({"c0": ["x", "y"], "c1": t.column("c1")}))
    with pytest.raises(InvalidArgument, match="no key column 'c1'"):
        encode_keys_arrow(cols, pa.table({"c0": [1]}))


# --- partitions ------------------------------------------------------------------------------


def table_schema() -> Schema:
    return Schema.build(
        [
            ("host", T.STRING),
            ("metric", T.STRING),
            ("ts", T.TIMESTAMP),
            ("value", T.DOUBLE),
        ],
        key=["host", "metric", "ts"],
    )


def random_row(rng: random.Random, schema: Schema) -> dict[str, object]:
    return {c.name: random_value(rng, c) for c in schema.key_columns}


def check_tiling(parts: list[Partition]) -> None:
    """Sorted, first starts at the lowest possible partition key (bucket 0 of every dimension,
    unbounded range), last has no end, each ends where the next starts."""
    starts = [p.partition_key_start for p in parts]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    assert parts[0].partition_key_start == hash_prefix([0] * len(parts[0].hash_buckets))
    assert parts[-1].partition_key_end == b""
    for a, b in itertools.pairwise(parts):
        assert a.partition_key_end == b.partition_key_start


def check_rows_map_to_one_partition(
    schema: Schema, ps: PartitionSchema, parts: list[Partition], seed: int, n: int = 500
) -> None:
    rng = random.Random(seed)
    range_cols = [schema.column(c) for c in ps.range_columns(schema)]
    for _ in range(n):
        row = random_row(rng, schema)
        key = ps.partition_key_for_row(schema, row)
        owners = [p for p in parts if p.contains(key)]
        assert len(owners) == 1, (row, owners)
        (p,) = owners
        assert find_partition(parts, key) is p
        assert p.hash_buckets == tuple(bucket_for(schema, h, row) for h in ps.hash)
        rkey = encode_key(range_cols, [row[c.name] for c in range_cols])
        assert p.range_lower <= rkey and (not p.range_upper or rkey < p.range_upper)


def test_hash_only() -> None:
    s = table_schema()
    ps = PartitionSchema(hash=(HashBucketSchema(("host", "metric"), 4),), range=RangeSchema(()))
    parts = ps.create_partitions(s)
    assert [p.hash_buckets for p in parts] == [(0,), (1,), (2,), (3,)]
    assert all((p.range_lower, p.range_upper) == (b"", b"") for p in parts)
    assert parts[1].partition_key_start == b"\x00\x00\x00\x01"
    check_tiling(parts)
    check_rows_map_to_one_partition(s, ps, parts, seed=1)


def test_two_hash_dimensions() -> None:
    s = table_schema()
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 3, seed=9), HashBucketSchema(("metric",), 2)),
        range=RangeSchema(()),
    )
    parts = ps.create_partitions(s)
    assert [p.hash_buckets for p in parts] == list(itertools.product(range(3), range(2)))
    check_tiling(parts)
    check_rows_map_to_one_partition(s, ps, parts, seed=2)


def test_range_only_with_split_rows() -> None:
    s = table_schema()
    splits = (("b",), ("m", "cpu"), ("m", "cpu", 10), ("x\x00",))
    ps = PartitionSchema(split_rows=splits)  # range over the whole key, the default
    parts = ps.create_partitions(s)
    assert len(parts) == len(splits) + 1
    assert all(p.hash_buckets == () for p in parts)
    check_tiling(parts)
    assert [p.range_upper for p in parts[:-1]] == [RangeSchema().encode_key(s, r) for r in splits]
    check_rows_map_to_one_partition(s, ps, parts, seed=3)
    row = {"host": "m", "metric": "cpu", "ts": 10}
    assert find_partition(parts, ps.partition_key_for_row(s, row)) is parts[3]
    row["ts"] = 9
    assert find_partition(parts, ps.partition_key_for_row(s, row)) is parts[2]


def test_hash_times_range() -> None:
    s = table_schema()
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 3),),
        range=RangeSchema(("ts",)),
        split_rows=((-1,), (0,), (dt.datetime(2024, 1, 1, tzinfo=dt.UTC),)),
    )
    parts = ps.create_partitions(s)
    assert len(parts) == 12
    assert [p.hash_buckets[0] for p in parts] == [b for b in range(3) for _ in range(4)]
    check_tiling(parts)
    check_rows_map_to_one_partition(s, ps, parts, seed=4)


def test_range_bounds_with_holes_and_splits() -> None:
    s = Schema.build([("id", T.INT64), ("v", T.STRING)], key="id")
    enc = RangeSchema().encode_key
    ps = PartitionSchema(
        hash=(HashBucketSchema(("id",), 2),),
        range_bounds=((enc(s, (100,)), None), (None, enc(s, (0,))), (enc(s, (10,)), enc(s, (20,)))),
        split_rows=((15,), (-50,), (1000,)),
    )
    parts = ps.create_partitions(s)
    per_bucket = [(p.range_lower, p.range_upper) for p in parts if p.hash_buckets == (0,)]
    edges = [enc(s, (v,)) for v in (-50, 0, 10, 15, 20, 100, 1000)]
    assert per_bucket == [
        (b"", edges[0]),
        (edges[0], edges[1]),
        (edges[2], edges[3]),
        (edges[3], edges[4]),
        (edges[5], edges[6]),
        (edges[6], b""),
    ]
    assert len(parts) == 12
    assert parts[-1].partition_key_end == b""
    assert parts[5].partition_key_end == b"\x00\x00\x00\x01"  # unbounded range, next bucket
    rng = random.Random(5)
    for _ in range(500):
        v = rng.randint(-200, 1200)
        key = ps.partition_key_for_row(s, {"id": v})
        found = find_partition(parts, key)
        in_hole = 0 <= v < 10 or 20 <= v < 100
        assert (found is None) == in_hole, v
        assert sum(p.contains(key) for p in parts) == (0 if in_hole else 1)


def test_no_hash_no_range_is_one_partition() -> None:
    s = table_schema()
    parts = PartitionSchema(range=RangeSchema(())).create_partitions(s)
    assert parts == [Partition((), b"", b"", b"", b"")]


def test_last_bucket_carry_in_two_dimensions() -> None:
    s = table_schema()
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 2), HashBucketSchema(("metric",), 3)),
        split_rows=(("k",),),
    )
    parts = ps.create_partitions(s)
    by = {(p.hash_buckets, p.range_upper == b""): p for p in parts}
    assert by[((0, 2), True)].partition_key_end == b"\x00\x00\x00\x01\x00\x00\x00\x00"
    check_tiling(parts)


# --- hashing ---------------------------------------------------------------------------------


def test_hash_is_the_documented_blake2b() -> None:
    h = HashBucketSchema(("id",), 7, seed=12345)
    enc = b"\x80\x00\x00\x00\x00\x00\x00\x2a"
    digest = hashlib.blake2b((12345).to_bytes(4, "big") + enc, digest_size=8).digest()
    assert hash_bucket(h, enc) == int.from_bytes(digest, "big") % 7


def test_buckets_are_pinned() -> None:
    """Golden values: a change here re-partitions every existing table."""
    s = Schema.build([("id", T.INT64), ("name", T.STRING)], key=["id", "name"])
    h = HashBucketSchema(("id", "name"), 16, seed=0)
    got = [bucket_for(s, h, {"id": i, "name": f"n{i}"}) for i in range(12)]
    assert got == GOLDEN_BUCKETS


GOLDEN_BUCKETS = [12, 14, 7, 10, 5, 3, 11, 1, 7, 12, 3, 3]


def test_seed_and_values_matter_and_spread() -> None:
    s = Schema.build([("id", T.INT64)], key="id")
    a = HashBucketSchema(("id",), 16, seed=0)
    b = HashBucketSchema(("id",), 16, seed=1)
    ids = range(16_000)
    ba = [bucket_for(s, a, [i]) for i in ids]
    bb = [bucket_for(s, b, [i]) for i in ids]
    assert ba != bb
    counts = [ba.count(k) for k in range(16)]
    assert min(counts) > 800 and max(counts) < 1200, counts


@pytest.mark.parametrize("seed", range(12))
def test_vectorized_buckets_equal_scalar_buckets(seed: int) -> None:
    rng = random.Random(seed)
    cols = random_columns(rng)
    schema = Schema(tuple(cols), tuple(c.name for c in cols))
    schema.validate()
    h = HashBucketSchema(
        tuple(rng.sample([c.name for c in cols], rng.randint(1, len(cols)))),
        rng.randint(2, 1024),
        rng.randint(0, 2**32 - 1),
    )
    rows = [tuple(random_value(rng, c) for c in cols) for _ in range(400)]
    table = arrow_table(cols, rows)
    vector = buckets_for_arrow(schema, h, table)
    scalar = [bucket_for(schema, h, dict(zip(schema.key, r, strict=True))) for r in rows]
    assert vector.tolist() == scalar
    rest = [c.name for c in cols if c.name not in h.columns]
    dims = (h, HashBucketSchema((rest[0],), 3)) if rest else (h,)
    ps = PartitionSchema(hash=dims)
    want = [ps.partition_key_for_row(schema, dict(zip(schema.key, r, strict=True))) for r in rows]
    assert ps.partition_keys_for_arrow(schema, table) == want


def test_bucket_for_takes_values_in_hash_column_order() -> None:
    s = table_schema()
    h = HashBucketSchema(("metric", "host"), 8)
    row = {"host": "h1", "metric": "cpu", "ts": 0}
    assert bucket_for(s, h, row) == bucket_for(s, h, ["cpu", "h1"])
    with pytest.raises(InvalidArgument, match="row has no value for key column 'metric'"):
        bucket_for(s, h, {"host": "h1"})


# --- validation ------------------------------------------------------------------------------


def s3() -> Schema:
    return table_schema()


INVALID_PARTITIONING: list[tuple[str, Callable[[], PartitionSchema], tuple[str, ...]]] = [
    (
        "hash column not a key column",
        lambda: PartitionSchema(hash=(HashBucketSchema(("value",), 4),)),
        ("hash dimension 0", "'value' is not a key column"),
    ),
    (
        "hash column unknown",
        lambda: PartitionSchema(hash=(HashBucketSchema(("nope",), 4),)),
        ("hash dimension 0", "unknown column 'nope'"),
    ),
    (
        "hash dimension without columns",
        lambda: PartitionSchema(hash=(HashBucketSchema((), 4),)),
        ("hash dimension 0 has no columns",),
    ),
    (
        "column twice in one dimension",
        lambda: PartitionSchema(hash=(HashBucketSchema(("host", "host"), 4),)),
        ("'host' is twice in hash dimension 0",),
    ),
    (
        "column in two dimensions",
        lambda: PartitionSchema(
            hash=(HashBucketSchema(("metric",), 2), HashBucketSchema(("host", "metric"), 2))
        ),
        ("'metric' is in hash dimensions 0 and 1",),
    ),
    (
        "one bucket",
        lambda: PartitionSchema(hash=(HashBucketSchema(("host",), 1),)),
        ("hash dimension 0 (host)", "num_buckets must be in 2..1024, got 1"),
    ),
    (
        "too many buckets",
        lambda: PartitionSchema(hash=(HashBucketSchema(("host",), 1025),)),
        ("num_buckets", "got 1025"),
    ),
    (
        "negative seed",
        lambda: PartitionSchema(hash=(HashBucketSchema(("host",), 2, seed=-1),)),
        ("hash dimension 0 (host)", "seed must be in 0..4294967295"),
    ),
    (
        "range column not a key column",
        lambda: PartitionSchema(range=RangeSchema(("value",))),
        ("range column 'value' is not a key column",),
    ),
    (
        "range column twice",
        lambda: PartitionSchema(range=RangeSchema(("ts", "ts"))),
        ("range column 'ts' is listed twice",),
    ),
    (
        "split row of the wrong type",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), split_rows=((1,), ("noon",))),
        ("split row 1", "column 'ts'", "str"),
    ),
    (
        "split row too long",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), split_rows=((1, 2),)),
        ("split row 0", "1..1 values", "(ts)"),
    ),
    (
        "null in a split row",
        lambda: PartitionSchema(range=RangeSchema(("host",)), split_rows=((None,),)),
        ("split row 0", "key column 'host' is null"),
    ),
    (
        "equal split rows",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), split_rows=((5,), (6,), (5,))),
        ("split rows 0 and 2 are equal",),
    ),
    (
        "split at the minimum key",
        lambda: PartitionSchema(range=RangeSchema(("host",)), split_rows=(("",),)),
        ("split row 0", "equals the lower bound of the table"),
    ),
    (
        "overlapping bounds",
        lambda: PartitionSchema(
            range=RangeSchema(("ts",)),
            range_bounds=((_ts(0), _ts(10)), (_ts(20), None), (_ts(5), _ts(15))),
        ),
        ("range bounds 0", "and 2", "(5,)", "overlap"),
    ),
    (
        "two unbounded ranges",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), range_bounds=((None, None),) * 2),
        ("range bounds 0", "and 1", "overlap"),
    ),
    (
        "empty range",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), range_bounds=((_ts(3), _ts(3)),)),
        ("range bound 0", "lower bound (3,) is not below upper bound (3,)"),
    ),
    (
        "upper bound b''",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), range_bounds=((None, b""),)),
        ("range bound 0", "None is unbounded"),
    ),
    (
        "undecodable bound",
        lambda: PartitionSchema(range=RangeSchema(("ts",)), range_bounds=((b"\x01", None),)),
        ("range bound 0: lower", "truncated in column 'ts'"),
    ),
    (
        "split outside the bounds",
        lambda: PartitionSchema(
            range=RangeSchema(("ts",)), range_bounds=((_ts(0), _ts(10)),), split_rows=((11,),)
        ),
        ("split row 0 (11,) is outside every range bound",),
    ),
    (
        "split in a hole",
        lambda: PartitionSchema(
            range=RangeSchema(("ts",)),
            range_bounds=((_ts(0), _ts(10)), (_ts(20), None)),
            split_rows=((15,),),
        ),
        ("split row 0 (15,) is outside every range bound",),
    ),
    (
        "split on a lower bound",
        lambda: PartitionSchema(
            range=RangeSchema(("ts",)), range_bounds=((_ts(0), _ts(10)),), split_rows=((0,),)
        ),
        ("split row 0 (0,) equals the lower bound of range bound 0",),
    ),
    (
        "bounds without range columns",
        lambda: PartitionSchema(
            hash=(HashBucketSchema(("host",), 2),), range=RangeSchema(()), split_rows=((1,),)
        ),
        ("no range columns",),
    ),
    (
        "too many tablets",
        lambda: PartitionSchema(
            hash=(HashBucketSchema(("host",), 100), HashBucketSchema(("metric",), 100)),
            split_rows=(("a",),),
        ),
        ("20000 tablets", f"MAX_TABLETS_PER_TABLE {MAX_TABLETS_PER_TABLE}"),
    ),
]


def _ts(v: int) -> bytes:
    return RangeSchema(("ts",)).encode_key(s3(), (v,))


@pytest.mark.parametrize(
    ("make", "fragments"),
    [(m, f) for _, m, f in INVALID_PARTITIONING],
    ids=[n for n, _, _ in INVALID_PARTITIONING],
)
def test_validation_names_the_problem(
    make: Callable[[], PartitionSchema], fragments: tuple[str, ...]
) -> None:
    ps = make()
    with pytest.raises(InvalidArgument) as info:
        ps.validate(s3())
    for f in fragments:
        assert f in info.value.message, (f, info.value.message)
    with pytest.raises(InvalidArgument):
        ps.create_partitions(s3())


def test_exactly_max_tablets_is_fine() -> None:
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 100), HashBucketSchema(("metric",), 100)),
        range=RangeSchema(()),
    )
    assert len(ps.create_partitions(s3())) == MAX_TABLETS_PER_TABLE


# --- pruning ---------------------------------------------------------------------------------


def test_partitions_for_key_range_and_equality_buckets() -> None:
    s = s3()
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 4),),
        range=RangeSchema(("ts",)),
        split_rows=((100,), (200,), (300,)),
    )
    parts = ps.create_partitions(s)
    enc = ps.range.encode_key
    hit = partitions_for_key_range(parts, enc(s, (150,)), enc(s, (250,)))
    assert len(hit) == 8 and {p.range_lower for p in hit} == {enc(s, (100,)), enc(s, (200,))}
    # Upper bound is exclusive: [150, 200) stays in one range.
    assert len(partitions_for_key_range(parts, enc(s, (150,)), enc(s, (200,)))) == 4
    assert len(partitions_for_key_range(parts, None, None)) == 16
    assert len(partitions_for_key_range(parts, enc(s, (300,)), None)) == 4
    bucket = bucket_for_equality(s, ps.hash[0], {"host": "web-1", "ts": 5})
    assert bucket == bucket_for(s, ps.hash[0], ["web-1"])
    one = partitions_for_key_range(parts, enc(s, (150,)), enc(s, (160,)), buckets=[bucket])
    assert len(one) == 1 and one[0].hash_buckets == (bucket,)
    assert bucket_for_equality(s, HashBucketSchema(("host", "metric"), 2), {"host": "x"}) is None
    # A row's partition is among the pruned ones.
    row = {"host": "web-1", "metric": "m", "ts": 155}
    found = find_partition(parts, ps.partition_key_for_row(s, row))
    assert found is not None and found in one


# --- renames and the codec -------------------------------------------------------------------


def test_partitioning_survives_a_key_rename() -> None:
    s = s3()
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 4),), range=RangeSchema(("ts",)), split_rows=((0,),)
    )
    p = partition_schema_to_pb(ps, s)
    s2 = s.apply([RenameColumn("host", "server")])
    decoded = partition_schema_from_pb(p, s2)
    assert decoded.hash[0].columns == ("server",)
    assert decoded == ps.rebind(s, s2)
    row = {"host": "h", "metric": "m", "ts": 7}
    row2 = {"server": "h", "metric": "m", "ts": 7}
    assert decoded.partition_key_for_row(s2, row2) == ps.partition_key_for_row(s, row)
    assert decoded.create_partitions(s2) == ps.create_partitions(s)


def test_partition_schema_protobuf_round_trip() -> None:
    s = s3()
    enc = RangeSchema(("host", "ts")).encode_key
    ps = PartitionSchema(
        hash=(HashBucketSchema(("metric",), 5, seed=2**32 - 1), HashBucketSchema(("ts",), 2)),
        range=RangeSchema(("host", "ts")),
        range_bounds=((None, enc(s, ("m",))), (enc(s, ("p", 0)), None)),
        split_rows=(("c", dt.datetime(2024, 1, 1, tzinfo=dt.UTC)), ("d",)),
    )
    wire = pb.PartitionSchemaPB.FromString(partition_schema_to_pb(ps, s).SerializeToString())
    back = partition_schema_from_pb(wire, s)
    assert back == dataclasses.replace(ps, split_rows=(("c", 1_704_067_200_000_000), ("d",)))
    assert back.create_partitions(s) == ps.create_partitions(s)
    # The default range schema (the whole key) travels explicitly.
    default = PartitionSchema(hash=(HashBucketSchema(("host",), 2),))
    again = partition_schema_from_pb(partition_schema_to_pb(default, s), s)
    assert again.range.columns == s.key
    assert again.create_partitions(s) == default.create_partitions(s)


def test_partition_protobuf_round_trip() -> None:
    s = s3()
    ps = PartitionSchema(hash=(HashBucketSchema(("host",), 3),), split_rows=(("m",),))
    for p in ps.create_partitions(s):
        assert (
            partition_from_pb(pb.PartitionPB.FromString(partition_to_pb(p).SerializeToString()))
            == p
        )
    bad = partition_to_pb(ps.create_partitions(s)[1])
    bad.partition_key_start = b"\x00\x00\x00\x07"
    with pytest.raises(InvalidArgument, match=r"partition\.partition_key_start"):
        partition_from_pb(bad)
    bad.hash_buckets[0] = -1
    with pytest.raises(InvalidArgument, match=r"partition.hash_buckets\[0\]: negative"):
        partition_from_pb(bad)


def good_partition_pb() -> pb.PartitionSchemaPB:
    ps = PartitionSchema(
        hash=(HashBucketSchema(("host",), 4),), range=RangeSchema(("ts",)), split_rows=((0,),)
    )
    return partition_schema_to_pb(ps, s3())


def _set_buckets(p: pb.PartitionSchemaPB) -> None:
    p.hash_schema[0].num_buckets = 0


PB_ERRORS: list[tuple[str, Callable[[pb.PartitionSchemaPB], object], tuple[str, ...]]] = [
    (
        "unknown column id",
        lambda p: p.hash_schema[0].column_ids.append(42),
        ("partition_schema.hash_schema[0].column_ids[1]: unknown column id 42",),
    ),
    (
        "hash dimension without columns",
        lambda p: p.hash_schema[0].ClearField("column_ids"),
        ("partition_schema.hash_schema[0].column_ids: missing",),
    ),
    (
        "no range schema",
        lambda p: p.ClearField("range_schema"),
        ("partition_schema.range_schema: missing",),
    ),
    (
        "range column id unknown",
        lambda p: p.range_schema.column_ids.append(-3),
        ("partition_schema.range_schema.column_ids[1]: unknown column id -3",),
    ),
    (
        "malformed split key",
        lambda p: p.split_keys.append(b"\x01\x02"),
        ("partition_schema.split_keys[1]:", "truncated in column 'ts'"),
    ),
    (
        "num_buckets zero",
        _set_buckets,
        ("partition_schema:", "num_buckets must be in 2..1024, got 0"),
    ),
    (
        "overlapping bounds",
        lambda p: p.range_bounds.extend([pb.RangeBoundPB(), pb.RangeBoundPB()]),
        ("partition_schema:", "overlap"),
    ),
]


@pytest.mark.parametrize(
    ("fn", "fragments"), [(f, x) for _, f, x in PB_ERRORS], ids=[n for n, _, _ in PB_ERRORS]
)
def test_partition_schema_wire_errors_name_the_field(
    fn: Callable[[pb.PartitionSchemaPB], object], fragments: tuple[str, ...]
) -> None:
    p = good_partition_pb()
    fn(p)
    with pytest.raises(InvalidArgument) as info:
        partition_schema_from_pb(p, s3())
    for f in fragments:
        assert f in info.value.message, (f, info.value.message)


def test_add_column_does_not_change_partitioning() -> None:
    s = s3()
    ps = PartitionSchema(hash=(HashBucketSchema(("host",), 4),), split_rows=(("m",),))
    s2 = s.apply([AddColumn("extra", T.STRING)])
    assert ps.create_partitions(s2) == ps.create_partitions(s)
