"""Spark read benchmark (`make bench-spark-read`): the tessera source against two baselines.

The same N rows (id int64, v double, tag string, flag bool) are read three ways in one run, on
the same local[2] session, each followed by the same aggregate that touches every column (so
no reader can skip columns or answer from metadata):

  (a) tessera    spark.read.format("tessera") from a local cluster (3 masters, 3 tablet
                 servers, the table in 4 hash tablets, replicated 3 ways)
  (b) pyparquet  a minimal Python DataSource yielding Arrow batches from the same rows in 4
                 local Parquet files: the floor for any Python source
  (c) parquet    Spark's native Parquet reader on those files

Each is run `--repeat` times after one warm-up; the best time counts. The last line is
`spark-read: tessera A s, pyparquet B s, parquet C s, tessera/pyparquet R1, tessera/parquet R2`
(goals: R1 <= 1.5, R2 <= 5).

Usage: python -m bench.spark_read [--rows 4000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Row
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

AGG = ["count(*) n", "sum(id) si", "sum(v) sv", "max(length(tag)) lt", "sum(cast(flag as int)) sf"]
FILES = 4
CHUNK = 250_000


def status(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def chunk(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "v": ids * 0.25,
            "tag": pa.array([f"tag-{i % 10007:05d}" for i in range(lo, hi)]),
            "flag": pa.array(ids % 3 == 0),
        }
    )


class PyParquetSource(DataSource):
    """(b): one partition per Parquet file, Arrow batches straight from pyarrow."""

    @classmethod
    def name(cls) -> str:
        return "pyparquet"

    def schema(self) -> str:
        return "id long, v double, tag string, flag boolean"

    def reader(self, schema: object) -> DataSourceReader:
        return PyParquetReader(self.options["path"])


class PyParquetReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(str(p)) for p in sorted(Path(self.path).glob("*.parquet"))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from pq.ParquetFile(partition.value).iter_batches(batch_size=65536)


def best(label: str, fn: Callable[[], Row], repeat: int) -> tuple[float, Row]:
    result = fn()  # warm-up (JIT, Python workers, caches)
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        status(f"{label} run {i + 1}/{repeat}: {times[-1]:.2f}s")
    return min(times), result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)

    from spark_jobs.session import build_session

    with tempfile.TemporaryDirectory(prefix="bench-spark-read-") as tmp:
        base = Path(tmp)
        # Spark first: a JVM forked while gRPC threads run in this process fails to start.
        spark = build_session("bench-spark-read", warehouse_dir=str(base / "wh"))
        spark.dataSource.register(PyParquetSource)

        from service.client.sync import SyncClient
        from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
        from service.common.schema import ColumnType, Schema
        from service.testing.mini_cluster import MiniCluster

        schema = Schema.build(
            [
                ("id", ColumnType.INT64),
                ("v", ColumnType.DOUBLE),
                ("tag", ColumnType.STRING),
                ("flag", ColumnType.BOOL),
            ],
            key="id",
        )
        pdir = base / "parquet"
        pdir.mkdir()
        with (
            MiniCluster(base / "cluster") as cluster,
            SyncClient(cluster.master_addresses, credentials=cluster.credentials()) as c,
        ):
            c.call(
                "create_table",
                "bench",
                schema,
                PartitionSchema(hash=(HashBucketSchema(("id",), FILES),), range=RangeSchema(())),
                num_replicas=3,
                timeout=120,
            )
            writers = [
                pq.ParquetWriter(pdir / f"part-{i}.parquet", chunk(0, 1).schema)
                for i in range(FILES)
            ]
            t0 = time.perf_counter()
            for lo in range(0, args.rows, CHUNK):
                t = chunk(lo, min(args.rows, lo + CHUNK))
                r = c.write("bench", t, "insert")
                if r.errors:
                    raise SystemExit(f"load failed: {r.errors[:3]}")
                writers[(lo // CHUNK) % FILES].write_table(t)
                done = min(args.rows, lo + CHUNK)
                rate = done / (time.perf_counter() - t0)
                status(f"loaded {done:,}/{args.rows:,} rows ({rate:,.0f} rows/s)")
            for w in writers:
                w.close()

            masters = ",".join(cluster.master_addresses)
            runs = {
                "tessera": lambda: (
                    spark.read.format("tessera")
                    .option("masters", masters)
                    .option("credentials", cluster.credentials_dir() or "")
                    .option("table", "bench")
                    .load()
                    .selectExpr(*AGG)
                    .collect()[0]
                ),
                "pyparquet": lambda: (
                    spark.read.format("pyparquet")
                    .option("path", str(pdir))
                    .load()
                    .selectExpr(*AGG)
                    .collect()[0]
                ),
                "parquet": lambda: spark.read.parquet(str(pdir)).selectExpr(*AGG).collect()[0],
            }
            results = {k: best(k, fn, args.repeat) for k, fn in runs.items()}
        answers = {k: tuple(v[1]) for k, v in results.items()}
        if len(set(answers.values())) != 1:
            raise SystemExit(f"the readers disagree: {answers}")
        a, b, cc = (results[k][0] for k in ("tessera", "pyparquet", "parquet"))
        print(f"rows {args.rows:,}; aggregate {answers['tessera']}")
        print(
            f"spark-read: tessera {a:.2f} s, pyparquet {b:.2f} s, parquet {cc:.2f} s, "
            f"tessera/pyparquet {a / b:.2f}, tessera/parquet {a / cc:.2f}"
        )
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
