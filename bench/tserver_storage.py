"""Row storage throughput: apply rate of INSERT batches and scan rate against local Parquet.

Usage: python -m bench.tserver_storage [--rows N] [--batch B]

Apply: N rows of (int64 key, string, double) as B-row INSERT batches, each validated
(`decode_write`), encoded and decoded as a Raft entry would be, and applied; the rate counts the
apply step alone and the whole pipeline. Then every key is inserted again, so every row is
checked against a data file (all AlreadyExists). Then, as a tablet does it, the same batches
into a fresh store flushed every 100,000 rows: CPU seconds of the applies and the flushes.

Scan: the same rows flushed to one file (empty memstore, the fast path), scanned in full,
compared with `pyarrow.parquet.read_table` of the same rows from a local Parquet file written
with pyarrow's defaults, in the same run. The product goal is a ratio of at most 2.

Versions (`--versions-rows`, 200,000 by default; 0 skips it): a second store whose keys are
upserted in 10 rounds, flushed after each and compacted into one file with its history, in two
shapes: *rounds*, every key in every round (each key's snapshot version has the same rank in the
history, the best case), and *random*, every key in the first round and a random half of them
in each later one (keys changed at different rates). Each is scanned in full at the newest rows
and at a snapshot after round 5, every batch serialized as a scanner does; the figures are CPU
seconds of this process (best of 15, the first apart), so that other work on the machine
moves them less than it moves wall time. The line ends with the Arrow memory the store holds
after those reads (`pa.total_allocated_bytes`): what it keeps to serve later snapshots.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.common.predicates import ColumnPredicate, ScanSpec
from service.common.schema import ColumnType, Schema
from service.tserver.row_ops import RowOp, WriteBatch, decode_write
from service.tserver.rowstore import RowStore


def _ipc(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return bytes(sink.getvalue().to_pybytes())


def _times(fn: object, repeat: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of `repeat` calls of `fn`, by `clock`."""
    assert callable(fn)
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def _best(fn: object, repeat: int = 3) -> float:
    return min(_times(fn, repeat))


def versions(n: int, shape: str, tmp: Path) -> None:
    """The versions figure of one shape (module docstring)."""
    schema = Schema.build(
        [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("x", ColumnType.DOUBLE)], "id"
    )
    rng = np.random.default_rng(2)
    ids = np.arange(n, dtype=np.int64)
    names = pa.array([f"name-{i}" for i in ids])
    store = RowStore.create(tmp / f"versions-{shape}", schema)
    index = ts = at = 0
    for rnd in range(1, 11):
        keys = ids if shape == "rounds" or rnd == 1 else np.sort(rng.permutation(n)[: n // 2])
        for lo in range(0, len(keys), 10_000):
            part = keys[lo : lo + 10_000]
            t = pa.table(
                {"id": part, "name": names.take(pa.array(part)), "x": np.full(len(part), rnd)}
            )
            batch = decode_write(schema, _ipc(t), RowOp.UPSERT, []).encode()
            index += 1
            ts += 1
            store.apply_write(index, WriteBatch.decode(batch, schema), ts)
        if rnd == 5:
            at = ts
        store.flush()
    store.compact()

    def scan(read_at: int | None) -> None:
        rows = 0
        for b in store.scan(ScanSpec(read_at=read_at)):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, b.schema) as w:
                w.write_batch(b)
            rows += b.num_rows
        assert rows == n

    held = pa.total_allocated_bytes()
    latest = min(_times(lambda: scan(None), 15, time.process_time))
    snaps = _times(lambda: scan(at), 15, time.process_time)
    snap, snap_first = min(snaps), snaps[0]
    held = pa.total_allocated_bytes() - held  # what the store keeps for later snapshot reads
    print(
        f"versions ({shape}): {n:,} rows, {store.history_rows():,} in history; CPU of a full "
        f"scan at the newest rows {latest * 1e3:.1f} ms, at a snapshot after round 5 "
        f"{snap * 1e3:.1f} ms (first {snap_first * 1e3:.1f} ms): ratio {snap / latest:.2f}; "
        f"Arrow memory held after the reads {held / 1e6:+.1f} MB"
    )
    store.close()


def tablet_like(schema: Schema, batches: list[WriteBatch], tmp: Path, every: int = 100_000) -> None:
    """The same INSERTs into a fresh store flushed every `every` rows, as a tablet flushes
    (`flush_rows`): CPU seconds of the applies (each key checked against the files flushed so
    far) and of the flushes."""
    store = RowStore.create(tmp / "tablet-like", schema)
    applying = flushing = 0.0
    rows = 0
    for i, b in enumerate(batches):
        t0 = time.process_time()
        store.apply_write(i + 1, b)
        applying += time.process_time() - t0
        rows += b.num_rows
        if rows % every < b.num_rows:
            t0 = time.process_time()
            store.flush()
            flushing += time.process_time() - t0
    print(
        f"apply as a tablet ({rows:,} rows, a flush every {every:,}): CPU {applying:.2f} s "
        f"applying, {flushing:.2f} s flushing"
    )
    store.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--versions-rows", type=int, default=200_000)
    ap.add_argument("--versions-only", action="store_true", help="only the versions figures")
    args = ap.parse_args(argv)
    if args.versions_rows:
        with tempfile.TemporaryDirectory() as tmp:
            for shape in ("rounds", "random"):
                versions(args.versions_rows, shape, Path(tmp))
    if args.versions_only:
        return
    n, size = args.rows, args.batch
    schema = Schema.build(
        [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("x", ColumnType.DOUBLE)], "id"
    )
    rng = np.random.default_rng(1)
    ids = rng.permutation(n).astype(np.int64)
    table = pa.table({"id": ids, "name": pa.array([f"name-{i}" for i in ids]), "x": rng.random(n)})
    payloads = [_ipc(table.slice(i, size)) for i in range(0, n, size)]
    with tempfile.TemporaryDirectory() as tmp:
        store = RowStore.create(Path(tmp) / "t", schema)
        t0 = time.perf_counter()
        batches = [
            WriteBatch.decode(decode_write(schema, p, RowOp.INSERT, []).encode(), schema)
            for p in payloads
        ]
        t1 = time.perf_counter()
        for i, b in enumerate(batches):
            store.apply_write(i + 1, b)
        t2 = time.perf_counter()
        print(f"apply: {n / (t2 - t1):,.0f} rows/s ({size}-row INSERT batches into the memstore)")
        print(f"validate+encode+decode+apply: {n / (t2 - t0):,.0f} rows/s")
        t3 = time.perf_counter()
        store.flush()
        print(f"flush of {n:,} rows: {time.perf_counter() - t3:.2f} s")
        t4 = time.perf_counter()
        errors = 0
        for i, b in enumerate(batches):
            errors += len(store.apply_write(len(batches) + i + 1, b).errors)
        t5 = time.perf_counter()
        assert errors == n
        print(f"apply of duplicate keys against a file: {n / (t5 - t4):,.0f} rows/s")
        store.flush()
        tablet_like(schema, batches, Path(tmp))

        def scan() -> None:
            rows = sum(b.num_rows for b in store.scan(ScanSpec()))
            assert rows == n

        sorted_table = pa.Table.from_batches(list(store.scan(ScanSpec())))
        parquet = Path(tmp) / "same.parquet"
        pq.write_table(sorted_table, parquet)

        def read_parquet() -> None:
            assert pq.read_table(parquet).num_rows == n

        def scan_to_ipc() -> None:
            # What a scanner does with each batch: serialize it for the wire (touches every byte).
            total = 0
            for b in store.scan(ScanSpec()):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, b.schema) as w:
                    w.write_batch(b)
                total += sink.getvalue().size
            assert total > 0

        def scan_filtered() -> None:
            pred = ColumnPredicate("x", "LT", (0.5,))
            rows = sum(b.num_rows for b in store.scan(ScanSpec(predicates=(pred,))))
            assert 0 < rows < n

        tp = _best(read_parquet)
        print(f"pyarrow.parquet.read_table:            {n / tp:,.0f} rows/s")
        for label, fn in (
            ("scan (zero-copy, mmapped file)", scan),
            ("scan + IPC serialization per batch", scan_to_ipc),
            ("scan with a predicate (x < 0.5)", scan_filtered),
        ):
            ts = _best(fn)
            print(f"{label + ':':38} {n / ts:,.0f} rows/s, time ratio to Parquet {ts / tp:.2f}")


if __name__ == "__main__":
    main()
