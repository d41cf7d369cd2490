"""Write validation before replication (decode_write) and the replicated form (WriteBatch)."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest

from service.client import write_session
from service.common.errors import Corruption, InvalidArgument
from service.common.schema import AddColumn, ColumnType, DropColumn, RenameColumn, Schema
from service.testing.hostile_arrow import POISONS
from service.tserver.row_ops import (
    MAX_WRITE_BYTES,
    MAX_WRITE_ROWS,
    RowOp,
    WriteBatch,
    check_write_size,
    decode_write,
)

T = ColumnType


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@pytest.fixture
def schema() -> Schema:
    return Schema.build(
        [
            ("id", T.INT64),
            ("name", T.STRING),
            AddColumn("qty", T.INT32, nullable=False, default=7),
            AddColumn("must", T.DOUBLE, nullable=False),
            AddColumn("ts", T.TIMESTAMP),
            AddColumn("price", T.DECIMAL, precision=10, scale=2),
        ],
        "id",
    )


def full(n: int = 3) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int32()),
            "name": [f"n{i}" for i in range(n)],
            "qty": pa.array(range(n), pa.int64()),
            "must": [float(i) for i in range(n)],
            "ts": pa.array([i for i in range(n)], pa.timestamp("us", tz="Europe/Paris")),
            "price": pa.array([decimal.Decimal(i) for i in range(n)], pa.decimal128(5, 0)),
        }
    )


def test_valid_batch_is_cast_and_ordered_by_schema(schema: Schema) -> None:
    t = full().select(["must", "name", "id", "price", "ts", "qty"])
    b = decode_write(schema, ipc(t), RowOp.INSERT, [])
    assert b.table.column_names == ["id", "name", "qty", "must", "ts", "price"]
    assert b.table.schema.types == [schema.column(n).arrow_type() for n in b.table.column_names]
    assert b.ops.dtype == np.uint8 and b.ops.tolist() == [1, 1, 1]
    assert b.column_ids == (0, 1, 2, 3, 4, 5)
    assert b.schema_version == schema.version
    assert b.table.column("price").to_pylist()[2] == decimal.Decimal("2.00")


def test_per_row_ops_override_default(schema: Schema) -> None:
    b = decode_write(schema, ipc(full()), 0, [RowOp.UPSERT, RowOp.DELETE, RowOp.INSERT_IGNORE])
    assert b.ops.tolist() == [2, 4, 5]


def test_malformed_stream(schema: Schema) -> None:
    with pytest.raises(InvalidArgument, match="rows: not a valid Arrow IPC stream"):
        decode_write(schema, b"garbage", RowOp.INSERT, [])
    with pytest.raises(InvalidArgument, match="not a valid Arrow IPC stream"):
        decode_write(schema, ipc(full())[:40], RowOp.INSERT, [])


def test_unknown_and_duplicate_columns(schema: Schema) -> None:
    t = full().append_column("nope", pa.array([1, 2, 3]))
    with pytest.raises(InvalidArgument, match="unknown column 'nope'"):
        decode_write(schema, ipc(t), RowOp.INSERT, [])
    dup = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["id", "id"])
    with pytest.raises(InvalidArgument, match="'id' appears more than once"):
        decode_write(schema, ipc(dup), RowOp.INSERT, [])


def test_type_mismatch_names_column_and_types(schema: Schema) -> None:
    t = full().set_column(1, "name", pa.array([1, 2, 3]))
    with pytest.raises(
        InvalidArgument, match=r"'name': Arrow type int64 does not convert to STRING"
    ):
        decode_write(schema, ipc(t), RowOp.INSERT, [])
    # Strings that happen to parse as ints are still refused: no cross-family casts.
    t = full().set_column(0, "id", pa.array(["1", "2", "3"]))
    with pytest.raises(InvalidArgument, match=r"'id'.*string does not convert to INT64"):
        decode_write(schema, ipc(t), RowOp.INSERT, [])
    # Same family, value out of range: the safe cast refuses.
    t = full().set_column(2, "qty", pa.array([0, 1, 2**40]))
    with pytest.raises(InvalidArgument, match=r"'qty'.*int64 does not convert to INT32"):
        decode_write(schema, ipc(t), RowOp.INSERT, [])
    # A zone-less timestamp is ambiguous.
    t = full().set_column(4, "ts", pa.array([1, 2, 3], pa.timestamp("us")))
    with pytest.raises(InvalidArgument, match="'ts'"):
        decode_write(schema, ipc(t), RowOp.INSERT, [])


def test_key_checks(schema: Schema) -> None:
    with pytest.raises(InvalidArgument, match="key column 'id' is missing"):
        decode_write(schema, ipc(full().drop_columns(["id"])), RowOp.INSERT, [])
    t = full().set_column(0, "id", pa.array([1, None, 3]))
    with pytest.raises(InvalidArgument, match="key column 'id' is null in 1 rows"):
        decode_write(schema, ipc(t), RowOp.DELETE, [])


def test_not_null_columns(schema: Schema) -> None:
    t = full().set_column(3, "must", pa.array([1.0, None, 3.0]))
    with pytest.raises(InvalidArgument, match="NOT NULL column 'must' is null in row 1"):
        decode_write(schema, ipc(t), RowOp.UPSERT, [])
    # DELETE needs only the key: what else it carries does not matter.
    decode_write(schema, ipc(t), RowOp.INSERT, [RowOp.INSERT, RowOp.DELETE, RowOp.INSERT])
    # Absent NOT NULL column without default: refused for rows that may create one.
    t = full().drop_columns(["must"])
    for op in (RowOp.INSERT, RowOp.UPSERT, RowOp.INSERT_IGNORE):
        with pytest.raises(InvalidArgument, match="'must' has no default and is missing"):
            decode_write(schema, ipc(t), op, [])
    # ... but fine for UPDATE and DELETE, and a NOT NULL column with a default may be absent.
    b = decode_write(schema, ipc(t.drop_columns(["qty"])), RowOp.UPDATE, [])
    assert "qty" not in b.table.column_names
    decode_write(schema, ipc(t.select(["id"])), RowOp.DELETE, [])


def test_ops_validation(schema: Schema) -> None:
    with pytest.raises(InvalidArgument, match="2 operations for 3 rows"):
        decode_write(schema, ipc(full()), RowOp.INSERT, [1, 1])
    with pytest.raises(InvalidArgument, match=r"ops\[1\]: unknown row operation 9"):
        decode_write(schema, ipc(full()), RowOp.INSERT, [1, 9, 1])
    with pytest.raises(InvalidArgument, match="default_op: unknown row operation 0"):
        decode_write(schema, ipc(full()), 0, [])


def test_empty_batch_is_allowed(schema: Schema) -> None:
    b = decode_write(schema, ipc(full(0)), 0, [])
    assert b.num_rows == 0 and len(b.ops) == 0


def test_encode_decode_round_trip(schema: Schema) -> None:
    b = decode_write(schema, ipc(full()), RowOp.UPSERT, [])
    again = WriteBatch.decode(b.encode(), schema)
    assert again.table.equals(b.table)
    assert again.ops.tolist() == b.ops.tolist()
    assert again.schema_version == b.schema_version
    assert again.encode() == b.encode()  # deterministic


def test_decode_goes_by_column_id_across_alters(schema: Schema) -> None:
    b = decode_write(schema, ipc(full()), RowOp.INSERT, [])
    newer = schema.apply(
        [RenameColumn("name", "label"), DropColumn("price"), AddColumn("extra", T.BOOL)]
    )
    again = WriteBatch.decode(b.encode(), newer)
    assert again.table.column_names == ["id", "label", "qty", "must", "ts"]
    assert again.table.column("label").to_pylist() == ["n0", "n1", "n2"]


def test_decode_damaged_entry_is_corruption(schema: Schema) -> None:
    with pytest.raises(Corruption):
        WriteBatch.decode(b"\x00" * 20, schema)


def test_timestamp_from_other_zone_is_the_same_instant(schema: Schema) -> None:
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    t = full(1).set_column(4, "ts", pa.array([when], pa.timestamp("us", tz="Asia/Tokyo")))
    b = decode_write(schema, ipc(t), RowOp.INSERT, [])
    assert b.table.column("ts").to_pylist() == [when]


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_poison_streams_are_refused_before_replication_and_at_apply(poison: str) -> None:
    """Streams that frame correctly but whose offsets, UTF-8, null counts or dictionary
    indices lie: refused by name before they reach the log, and Corruption (never a crash)
    if one is found in a log anyway."""
    kv = Schema.build([("k", T.INT64), ("v", T.STRING)], "k")
    data = POISONS[poison]()
    with pytest.raises(InvalidArgument, match="rows: invalid Arrow data"):
        decode_write(kv, data, RowOp.UPSERT, [])
    with pytest.raises(Corruption, match="write entry"):
        WriteBatch.decode(data, kv)


def test_a_write_larger_than_one_write_may_be_is_refused_naming_the_limit() -> None:
    check_write_size(MAX_WRITE_BYTES, MAX_WRITE_ROWS)  # the largest accepted
    with pytest.raises(InvalidArgument, match=f"more than the {MAX_WRITE_BYTES} one Write"):
        check_write_size(MAX_WRITE_BYTES + 1)
    with pytest.raises(InvalidArgument, match=f"{MAX_WRITE_ROWS + 1} rows, more than the"):
        check_write_size(100, MAX_WRITE_ROWS + 1)


def test_the_client_sends_writes_a_tablet_server_accepts() -> None:
    assert write_session.MAX_BATCH_ROWS <= MAX_WRITE_ROWS
    assert write_session.MAX_BATCH_BYTES <= MAX_WRITE_BYTES
