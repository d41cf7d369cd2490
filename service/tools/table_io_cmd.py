"""`tessera table load` and `tessera table copy`: rows in bulk, with progress.

    tessera table load NAME FILE [--format parquet|csv] [--operation upsert|insert|insert_ignore]
                       [--batch-rows 50000] [--row-errors fail|report]
    tessera table copy SRC DST [--create] [--operation ...] [--row-errors ...]

`load` reads a Parquet or CSV file in batches (the file is never held in memory whole) and
writes each batch with one write session, casting every column to the table's type (a column
the table lacks, or a value that does not fit its type, is refused naming it before anything
more is written). `copy` scans SRC tablet by tablet and writes into DST, which `--create` makes
first with SRC's schema, partitioning and replication if it does not exist. Both print a
progress line every second (rows, MB, rows/s) to stderr and a summary at the end; per-row
errors (an INSERT of a key that exists) fail the command unless `--row-errors report`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from service.client.client import TesseraClient
from service.client.write_session import WriteResult, WriteSession, format_errors
from service.common.errors import InvalidArgument, NotFound
from service.common.schema import Schema
from service.tools.admin_cmd import add_connection_args, client_of, group_actions, run_command

__all__ = ["register"]

OPERATIONS = ("upsert", "insert", "insert_ignore")


class Progress:
    """A line to stderr at most once a second (none for a command that ends within one, so a
    small load that fails prints its error alone, not a count of rows it then did not write),
    and the summary."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.rows = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._last = self.started

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        now = time.monotonic()
        if now - self._last >= 1.0:
            self._last = now
            print(f"{self.what}: {self.line()} sent so far", file=sys.stderr, flush=True)

    def line(self) -> str:
        secs = max(time.monotonic() - self.started, 1e-6)
        return (
            f"{self.rows:,} rows, {self.bytes / 1e6:.1f} MB in {secs:.1f} s "
            f"({self.rows / secs:,.0f} rows/s)"
        )


def _conform(batch: pa.RecordBatch, schema: Schema, table: str) -> pa.RecordBatch:
    target = schema.to_arrow()
    cols = []
    for name in batch.schema.names:
        if not schema.has_column(name):
            raise InvalidArgument(f"column {name!r} of the input is not a column of {table!r}")
        want = target.field(name).type
        try:
            cols.append(batch.column(name).cast(want))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidArgument(
                f"column {name!r}: its values do not fit the type {want} of table {table!r}: {e}"
            ) from None
    fields = [pa.field(n, target.field(n).type) for n in batch.schema.names]
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))


def _batches(
    path: Path, fmt: str, schema: Schema, batch_rows: int
) -> AsyncIterator[pa.RecordBatch]:
    def read() -> Iterator[pa.RecordBatch]:
        if fmt == "parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
            return
        types = {c.name: schema.to_arrow().field(c.name).type for c in schema.columns}
        yield from pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=1 << 22),
            convert_options=pacsv.ConvertOptions(column_types=types),
        )

    async def gen() -> AsyncIterator[pa.RecordBatch]:
        batches = read()
        while True:
            try:
                b = next(batches)
            except StopIteration:
                return
            except (pa.ArrowInvalid, OSError) as e:  # a malformed file or value: name it
                raise InvalidArgument(f"{path}: {e}") from None
            yield b

    return gen()


def _format_of(path: Path, given: str | None) -> str:
    if given:
        return given
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".csv", ".txt"):
        return "csv"
    raise InvalidArgument(f"{path}: say --format parquet or csv (unknown suffix {suffix!r})")


async def _write_all(
    c: TesseraClient,
    table: str,
    batches: AsyncIterator[pa.RecordBatch],
    schema: Schema,
    args: argparse.Namespace,
    progress: Progress,
) -> WriteResult:
    """Write every batch; with `--transactional` (the default) as one transaction, committed
    only once every row was staged with no refused row (or `--row-errors report`), so a load
    that fails part way leaves the table as it was (docs/design/transactions.md)."""

    async def write(session: WriteSession, what: str) -> WriteResult:
        async for b in batches:
            if b.num_rows:
                await session.apply(_conform(b, schema, table), args.operation)
                progress.add(b)
        result = await session.flush()
        if result.errors and args.row_errors == "fail":
            raise InvalidArgument(f"{table}: {format_errors(result.errors)}{what}")
        return result

    if not args.transactional:
        return await write(await c.new_session(table), "")
    async with c.transaction() as txn:
        msg = "; nothing was written (the load is one transaction)"
        return await write(await txn.new_session(table), msg)


async def table_load(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise InvalidArgument(f"{path}: no such file")
    fmt = _format_of(path, args.format)
    async with client_of(args) as c:
        info = await c.open_table(args.name)
        progress = Progress(f"load {args.name}")
        batches = _batches(path, fmt, info.schema, args.batch_rows)
        result = await _write_all(c, args.name, batches, info.schema, args, progress)
    print(
        f"loaded {path.name} into {args.name}: {progress.line()}; {result.rows_applied:,} "
        f"applied, {len(result.errors):,} refused"
    )
    return 0


async def table_copy(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        src = await c.open_table(args.src)
        try:
            dst = await c.open_table(args.dst)
        except NotFound:
            if not args.create:
                raise InvalidArgument(
                    f"table {args.dst!r} does not exist (add --create to make it like {args.src!r})"
                ) from None
            await c.create_table(
                args.dst, src.schema, src.partition_schema, num_replicas=src.num_replicas
            )
            dst = await c.open_table(args.dst)
        progress = Progress(f"copy {args.src} -> {args.dst}")

        async def scanned() -> AsyncIterator[pa.RecordBatch]:
            for token in await c.scan_tokens(args.src):
                async for b in c.scan_batches(token):
                    yield b

        result = await _write_all(c, args.dst, scanned(), dst.schema, args, progress)
    print(
        f"copied {args.src} into {args.dst}: {progress.line()}; {result.rows_applied:,} "
        f"applied, {len(result.errors):,} refused"
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tsub = group_actions(sub, "table", "create, list, describe, alter, delete and scan tables")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--operation", choices=OPERATIONS, default="upsert", help="how rows are written"
        )
        p.add_argument(
            "--row-errors",
            choices=("fail", "report"),
            default="fail",
            help="rows refused (an insert of an existing key): fail the command, or count them",
        )
        p.add_argument(
            "--transactional",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="one transaction: every row or none (default); --no-transactional writes "
            "rows as they come (a huge load: staged rows are held in the servers' memory)",
        )
        add_connection_args(p, fmt=False)

    p = tsub.add_parser("load", help="write a Parquet or CSV file into a table, with progress")
    p.add_argument("name", help="the table")
    p.add_argument("file", help="a .parquet or .csv file; its columns are the table's, by name")
    p.add_argument("--format", choices=("parquet", "csv"), help="default: from the suffix")
    p.add_argument("--batch-rows", type=int, default=50_000, help="rows per read batch")
    common(p)
    p.set_defaults(handler=run_command(table_load))

    p = tsub.add_parser("copy", help="copy every row of one table into another, with progress")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--create", action="store_true", help="create DST like SRC if it is missing")
    common(p)
    p.set_defaults(handler=run_command(table_copy))
