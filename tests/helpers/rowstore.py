"""Writing to a `RowStore` the way a tablet replica does, for the storage tests."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from service.tserver.row_ops import RowOp, WriteBatch, decode_write
from service.tserver.rowstore import AppliedWrite, RowStore


class Writer:
    """Applies writes with increasing Raft indexes, through the replicated form."""

    def __init__(self, store: RowStore) -> None:
        self.store = store

    def __call__(
        self, rows: list[dict[str, Any]], op: RowOp = RowOp.INSERT, ops: list[int] | None = None
    ) -> AppliedWrite:
        schema = self.store.schema
        arrow = schema.to_arrow()
        names = list(rows[0]) if rows else list(schema.key)
        t = pa.Table.from_pylist(rows, schema=pa.schema([arrow.field(n) for n in names]))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        batch = decode_write(schema, sink.getvalue().to_pybytes(), op, ops or [])
        batch = WriteBatch.decode(batch.encode(), schema)
        return self.store.apply_write(self.store.applied_index + 1, batch)
