"""A tablet's leader refuses, row by row, what lies outside the tablet's partition.

`validate_write` is pure: these tests drive it with real partition schemas (hash buckets, range
bounds, both) and compare it against the definition, `Partition.contains` of each row's
partition key, for every row and every tablet of the table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from service.common.errors import OutsidePartition
from service.common.partition import (
    HashBucketSchema,
    Partition,
    PartitionSchema,
    RangeSchema,
)
from service.common.schema import ColumnType, Schema
from service.tserver.row_ops import RowOp, WriteBatch
from service.tserver.tablet import Placement, validate_write

SCHEMA = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("v", ColumnType.DOUBLE)],
    key=("host", "ts"),
)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "host": pa.array([f"h{i % 7}" for i in range(n)], pa.string()),
            "ts": pa.array([i * 37 % 1000 for i in range(n)], pa.int64()),
            "v": pa.array([float(i) for i in range(n)], pa.float64()),
        }
    )


SCHEMAS = {
    "hash": PartitionSchema(hash=(HashBucketSchema(("host", "ts"), 6),), range=RangeSchema(())),
    "range": PartitionSchema(range=RangeSchema(("ts",)), split_rows=((250,), (500,), (750,))),
    "hash x range": PartitionSchema(
        hash=(HashBucketSchema(("host",), 3),),
        range=RangeSchema(("ts",)),
        split_rows=((300,), (600,)),
    ),
    "two hashes, bounded ranges with a hole": PartitionSchema(
        hash=(HashBucketSchema(("host",), 2), HashBucketSchema(("ts",), 2, seed=7)),
        range=RangeSchema(("ts",)),
        range_bounds=(
            (
                RangeSchema(("ts",)).encode_key(SCHEMA, (0,)),
                RangeSchema(("ts",)).encode_key(SCHEMA, (400,)),
            ),
            (RangeSchema(("ts",)).encode_key(SCHEMA, (500,)), None),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_rows_outside_matches_partition_contains_for_every_tablet(name: str) -> None:
    ps = SCHEMAS[name]
    table = _rows(400)
    keys = ps.partition_keys_for_arrow(SCHEMA, table)
    partitions = ps.create_partitions(SCHEMA)
    owners = np.zeros(table.num_rows, dtype=int)
    for p in partitions:
        outside = ps.rows_outside(SCHEMA, p, table)
        expected = np.array([not p.contains(k) for k in keys])
        assert (outside == expected).all(), p
        owners += ~outside
    # Every row lies in at most one tablet (exactly one, except in a range hole).
    assert owners.max() == 1


@pytest.mark.parametrize("op", list(RowOp))
def test_a_write_keeps_only_the_rows_of_its_tablet_and_names_the_others(op: RowOp) -> None:
    ps = SCHEMAS["hash"]
    partition = ps.create_partitions(SCHEMA)[2]
    table = _rows(100)
    checked = validate_write(
        SCHEMA, Placement(SCHEMA.version, ps, partition), _ipc(table), int(op), []
    )
    inside = ~ps.rows_outside(SCHEMA, partition, table)
    assert 0 < inside.sum() < 100
    refused = dict(checked.refused)
    assert sorted(refused) == [i for i in range(100) if not inside[i]]
    for i, err in refused.items():
        assert isinstance(err, OutsidePartition)
        assert f"row {i} key (host={table['host'][i].as_py()!r}, ts={table['ts'][i].as_py()})" in (
            err.message
        )
        assert "bucket 2 of 6" in err.message
    assert checked.entry is not None and checked.kept is not None
    batch = WriteBatch.decode(checked.entry[1:], SCHEMA)
    assert batch.num_rows == int(inside.sum())
    assert [checked.request_row(j) for j in range(batch.num_rows)] == list(np.flatnonzero(inside))
    assert batch.table.column("ts").to_pylist() == [
        table["ts"][int(i)].as_py() for i in np.flatnonzero(inside)
    ]
    assert set(batch.ops.tolist()) == {int(op)}


def test_a_write_entirely_outside_replicates_nothing() -> None:
    ps = SCHEMAS["range"]
    last = ps.create_partitions(SCHEMA)[-1]  # ts >= 750
    table = pa.table(
        {"host": ["a", "b"], "ts": pa.array([1, 2], pa.int64()), "v": pa.array([0.0, 1.0])}
    )
    checked = validate_write(
        SCHEMA, Placement(SCHEMA.version, ps, last), _ipc(table), int(RowOp.UPSERT), []
    )
    assert checked.entry is None
    assert [i for i, _ in checked.refused] == [0, 1]
    assert "range(ts) [(750,), unbounded)" in checked.refused[0][1].message


def test_a_tablet_that_covers_every_key_checks_nothing() -> None:
    table = _rows(10)
    checked = validate_write(SCHEMA, None, _ipc(table), int(RowOp.INSERT), [])
    assert checked.refused == () and checked.kept is None and checked.entry is not None
    whole = Partition((), b"", b"", b"", b"")
    assert not PartitionSchema(range=RangeSchema(())).rows_outside(SCHEMA, whole, table).any()
