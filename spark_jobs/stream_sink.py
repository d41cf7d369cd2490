"""The tessera source as a Structured Streaming sink: `df.writeStream.format("tessera")`.

Theory of operation
-------------------
Each micro-batch is written as a batch write is (`TesseraWriter`: every task writes its rows
with one write session, all the batch write options apply), and then Spark calls `commit` with
the batch id on the driver, which records it: one upsert of (query name, batch id, rows, time)
into the commit table (`commit_table`, default `tessera_stream_commits`, made on first use
with the query name as its key).

Exactly once, the way kudu-spark's sink does it: Spark's checkpoint re-runs a micro-batch that
did not commit (the process died, a task failed for good) with the same rows, and the sink's
writes are idempotent, so a re-run leaves the table as one run would have. That is why the
operation must be one whose repetition changes nothing: `upsert` (the default),
`insert_ignore`, `update` or `delete`; `insert` is refused (its re-run would fail on the rows
the first run wrote). The commit table says which batch each query committed last, for
operators and tests; Spark's checkpoint, not the commit table, decides what runs again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from service.common.errors import InvalidArgument, NotFound
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema

__all__ = ["COMMIT_SCHEMA", "DEFAULT_COMMIT_TABLE", "IDEMPOTENT", "TesseraStreamWriter"]

log = logging.getLogger(__name__)

DEFAULT_COMMIT_TABLE = "tessera_stream_commits"
IDEMPOTENT = frozenset({"upsert", "insert_ignore", "update", "delete"})
COMMIT_SCHEMA = Schema.build(
    [
        ("query", ColumnType.STRING),
        ("batch_id", ColumnType.INT64),
        ("rows_applied", ColumnType.INT64),
        ("committed_at", ColumnType.TIMESTAMP),
    ],
    key="query",
)


class TesseraStreamWriter(DataSourceStreamArrowWriter):
    """Writes micro-batches and records their ids (module docstring). `opts` are the source's
    parsed options (spark_jobs.datasource.ReadOptions)."""

    def __init__(self, opts: object, schema_version: int, query: str, commit_table: str) -> None:
        from spark_jobs.datasource import TesseraWriter

        self._batch = TesseraWriter(opts, schema_version)  # type: ignore[arg-type]
        self.opts = opts
        self.query = query
        self.commit_table = commit_table

    @classmethod
    def create(
        cls, opts: object, schema: StructType, options: dict[str, str]
    ) -> TesseraStreamWriter:
        """The writer of one streaming query, checked on the driver before it starts."""
        from spark_jobs.datasource import ReadOptions, check_write_schema

        assert isinstance(opts, ReadOptions)
        if opts.operation not in IDEMPOTENT:
            allowed = ", ".join(sorted(IDEMPOTENT))
            raise InvalidArgument(
                f"option 'operation': a streaming write must be idempotent ({allowed}): "
                f"Spark re-runs a micro-batch that did not commit, and a re-run {opts.operation} "
                "would fail on the rows the first run wrote"
            )
        info = opts.table_info()
        check_write_schema(info, schema, opts.operation)
        lowered = {k.lower(): v for k, v in options.items()}
        query = lowered.get("query_name", "").strip() or opts.table
        commit_table = lowered.get("commit_table", "").strip() or DEFAULT_COMMIT_TABLE
        client = opts.client()
        try:
            client.call("open_table", commit_table)
        except NotFound:
            client.call(
                "create_table",
                commit_table,
                COMMIT_SCHEMA,
                PartitionSchema(range=RangeSchema(("query",))),
            )
        return cls(opts, info.schema.version, query, commit_table)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self._batch.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from spark_jobs.datasource import ReadOptions, TesseraCommit

        self._batch.commit(messages)
        applied = sum(m.rows_applied for m in messages if isinstance(m, TesseraCommit))
        row = pa.table(
            {
                "query": [self.query],
                "batch_id": pa.array([batchId], pa.int64()),
                "rows_applied": pa.array([applied], pa.int64()),
                "committed_at": pa.array([dt.datetime.now(dt.UTC)], pa.timestamp("us", tz="UTC")),
            }
        )
        assert isinstance(self.opts, ReadOptions)
        result = self.opts.client().write(self.commit_table, row, "upsert")
        if result.errors:
            raise InvalidArgument(f"{self.commit_table}: {result.errors[0]}")
        log.info("tessera stream %r: batch %d committed (%d rows)", self.query, batchId, applied)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "tessera stream %r: batch %d aborted; Spark runs it again (idempotent writes)",
            self.query,
            batchId,
        )
