"""The tessera source as a Structured Streaming sink: `df.writeStream.format("tessera")`.

Theory of operation (docs/design/transactions.md#R4)
---------------------------------------------------
Each micro-batch is one transaction that carries (query name, batch id). Every task of the batch
begins it (BeginTransaction with the stream batch: the master answers all of them with the one
unfinished transaction of that batch) and stages its rows under its own attempt id, exactly as an
atomic batch write does (`TesseraWriter`). Spark then calls `commit` with the batch id on the
driver, which stages the batch's record in the commit table (`commit_table`, default
`tessera_stream_commits`: query name, batch id, rows, time) and commits the transaction with the
attempts whose messages Spark handed it. The rows and the record appear together at one
timestamp, or neither does.

Exactly once, whatever dies when:
  * a batch that did not commit left nothing visible: its transaction aborts (`abort`, or no
    keep-alive for `WRITE_KEEPALIVE_MS`), and Spark's checkpoint runs the batch again;
  * a batch re-run after its driver died mid-batch joins the transaction the dead run began,
    and its commit keeps only the re-run's attempts (the dead run's staged rows are dropped);
  * a batch that committed here but not in Spark's checkpoint (the driver died between the
    two) is run again by Spark: its tasks find the batch committed (ALREADY_EXISTS), write
    nothing, and the commit is a no-op.
So any operation is exactly once, `insert` included. A stopped or failed stream never shows part
of a batch to a snapshot read (the tessera source's default). A READ_LATEST scan, which reads
each tablet's newest rows, may meet a committed batch while the coordinator is still applying
its commit tablet by tablet, and so see the rows of some tablets before the others.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from service.common.errors import AlreadyExists, InvalidArgument, NotFound
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema

__all__ = ["BATCH_ID_PROPERTY", "COMMIT_SCHEMA", "DEFAULT_COMMIT_TABLE", "TesseraStreamWriter"]

log = logging.getLogger(__name__)

DEFAULT_COMMIT_TABLE = "tessera_stream_commits"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The task local property in which Spark's micro-batch execution names the batch."""
COMMIT_SCHEMA = Schema.build(
    [
        ("query", ColumnType.STRING),
        ("batch_id", ColumnType.INT64),
        ("rows_applied", ColumnType.INT64),
        ("committed_at", ColumnType.TIMESTAMP),
    ],
    key="query",
)
_COMMIT_ATTEMPT = "batch-record"


class TesseraStreamWriter(DataSourceStreamArrowWriter):
    """Writes micro-batches as transactions (module docstring). `opts` are the source's
    parsed options (spark_jobs.datasource.ReadOptions)."""

    def __init__(self, opts: object, schema_version: int, query: str, commit_table: str) -> None:
        self.opts = opts
        self.schema_version = schema_version
        self.query = query
        self.commit_table = commit_table

    @classmethod
    def create(
        cls, opts: object, schema: StructType, options: dict[str, str]
    ) -> TesseraStreamWriter:
        """The writer of one streaming query, checked on the driver before it starts."""
        from spark_jobs.datasource import ReadOptions, check_write_schema

        assert isinstance(opts, ReadOptions)
        if not opts.transactional:
            raise InvalidArgument(
                "option 'transactional': a streaming write is always one transaction per "
                "micro-batch (exactly once); transactional=false is for batch writes"
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

    def _client(self):  # type: ignore[no-untyped-def]
        from spark_jobs.datasource import ReadOptions

        assert isinstance(self.opts, ReadOptions)
        return self.opts.client()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        from spark_jobs.datasource import WRITE_KEEPALIVE_MS, TesseraCommit, TesseraWriter

        ctx = TaskContext.get()
        raw = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        if raw is None:
            raise InvalidArgument(
                f"no micro-batch id in the task ({BATCH_ID_PROPERTY}): not a streaming task"
            )
        batch_id = int(raw)
        client = self._client()
        try:
            txn = client.call(
                "begin_transaction",
                stream_query=self.query,
                stream_batch=batch_id,
                keepalive_ms=WRITE_KEEPALIVE_MS,
            )
        except AlreadyExists:
            log.info("tessera stream %r: batch %d committed already", self.query, batch_id)
            return TesseraCommit(attempt="")
        txn.stop_keepalive()  # the batch writer keeps it alive while it writes
        return TesseraWriter(self.opts, self.schema_version, txn.txn_id).write(  # type: ignore[arg-type]
            iterator
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from spark_jobs.datasource import WRITE_KEEPALIVE_MS, TesseraCommit

        client = self._client()
        state = client.call("transaction_state", stream_query=self.query, stream_batch=batchId)
        if state.state == "COMMITTED":
            log.info("tessera stream %r: batch %d was committed already", self.query, batchId)
            return
        if state.txn_id:
            txn = client.run(client.client.attach_transaction(state.txn_id))
        else:  # no task wrote (an empty batch): the record alone, in a transaction of its own
            try:
                txn = client.call(
                    "begin_transaction",
                    stream_query=self.query,
                    stream_batch=batchId,
                    keepalive_ms=WRITE_KEEPALIVE_MS,
                )
            except AlreadyExists:
                return
        applied = sum(m.rows_applied for m in messages if isinstance(m, TesseraCommit))
        row = pa.table(
            {
                "query": [self.query],
                "batch_id": pa.array([batchId], pa.int64()),
                "rows_applied": pa.array([applied], pa.int64()),
                "committed_at": pa.array([dt.datetime.now(dt.UTC)], pa.timestamp("us", tz="UTC")),
            }
        )
        session = client.run(txn.new_session(self.commit_table, attempt=_COMMIT_ATTEMPT))
        client.run(session.apply(row, "upsert"))
        result = client.run(session.flush())
        if result.errors:
            raise InvalidArgument(f"{self.commit_table}: {result.errors[0]}")
        kept = [m.attempt for m in messages if isinstance(m, TesseraCommit) and m.attempt]
        client.run(txn.commit([*kept, _COMMIT_ATTEMPT]))
        log.info("tessera stream %r: batch %d committed (%d rows)", self.query, batchId, applied)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        client = self._client()
        state = client.call("transaction_state", stream_query=self.query, stream_batch=batchId)
        if state.txn_id and state.state == "OPEN":
            txn = client.run(client.client.attach_transaction(state.txn_id))
            client.run(txn.abort(f"micro-batch {batchId} of {self.query!r} failed"))
        log.warning(
            "tessera stream %r: batch %d aborted: none of its rows shows; Spark runs it again",
            self.query,
            batchId,
        )
