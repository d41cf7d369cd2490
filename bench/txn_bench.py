"""Transactions against plain writes (`make bench-txn`), on a real local cluster.

One master and three tablet servers on loopback (production settings), a table of 12 tablets
(hash buckets), 3 replicas each. In one run:

  plain          `--rows` rows (1,000,000) written by `--writers` concurrent write sessions
                 (fresh keys), each flush acknowledged once committed: rows/s
  transactional  the same number of fresh rows written by as many sessions inside ONE
                 transaction, then committed: rows/s from the first write to the commit's
                 answer (staging, prepare on 12 tablets, the commit applied in parts)
  commit         `--commits` (200) small transactions, each one row on every one of the 12
                 tablets, one after another: the latency of `commit()` (p50, p99)

and it ends with one line `txn: transactional/plain W, commit p99 C ms`. The goal (the
transactions issue): W at least 0.7. The two loads alternate plain, transactional, plain,
transactional (best of two each), so a slow moment of this shared machine does not fall on one
side only.

Usage: python -m bench.txn_bench [--rows 1000000] [--writers 4] [--commits 200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from service.client.client import TesseraClient
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("x", ColumnType.DOUBLE)], key="id"
)
TABLETS = 12
BATCH = 10_000


def status(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table(
        {"id": ids, "name": pa.array([f"row-{i}" for i in ids]), "x": ids.astype(np.float64) * 0.5}
    )


async def load(c: TesseraClient, table: str, base: int, n: int, writers: int, txn: bool) -> float:
    """Write rows [base, base + n) with `writers` sessions; seconds taken (to the commit)."""
    t0 = time.perf_counter()
    transaction = await c.begin_transaction() if txn else None
    per = n // writers

    async def writer(w: int) -> None:
        lo = base + w * per
        hi = base + n if w == writers - 1 else lo + per
        if transaction is not None:
            session = await transaction.new_session(table, attempt=f"w{w}", timeout=300)
        else:
            session = await c.new_session(table, timeout=300)
        for start in range(lo, hi, BATCH):
            await session.apply(rows(start, min(hi, start + BATCH)))
            r = await session.flush()
            assert not r.errors, r.errors[:3]

    await asyncio.gather(*(writer(w) for w in range(writers)))
    if transaction is not None:
        await transaction.commit(timeout=300)
    return time.perf_counter() - t0


async def run(args: argparse.Namespace, base: Path) -> None:
    with MiniCluster(base, num_masters=1, num_tservers=3, tserver_overrides={}) as cluster:
        async with TesseraClient(
            cluster.master_addresses, timeout=120, credentials=cluster.credentials()
        ) as c:
            ps = PartitionSchema(hash=(HashBucketSchema(("id",), TABLETS),), range=RangeSchema(()))
            await c.create_table("bench_txn", SCHEMA, ps, num_replicas=3)
            n = args.rows
            plain: list[float] = []
            txn: list[float] = []
            offset = 0
            for round_ in range(2):
                for kind, out in (("plain", plain), ("transactional", txn)):
                    status(f"round {round_ + 1}/2: {kind} load of {n:,} rows")
                    out.append(await load(c, "bench_txn", offset, n, args.writers, kind != "plain"))
                    offset += n
                    status(f"  {n / out[-1]:,.0f} rows/s")
            status(f"{args.commits} transactions of one row on each of the {TABLETS} tablets")
            keys = await _one_key_per_tablet(c, ps)
            lat: list[float] = []
            for i in range(args.commits):
                t = await c.begin_transaction()
                await t.write(
                    "bench_txn",
                    pa.table(
                        {
                            "id": pa.array(keys, pa.int64()),
                            "name": [f"c{i}"] * len(keys),
                            "x": [float(i)] * len(keys),
                        }
                    ),
                )
                t0 = time.perf_counter()
                await t.commit()
                lat.append((time.perf_counter() - t0) * 1000)
                if (i + 1) % 50 == 0:
                    status(f"  {i + 1}/{args.commits} commits")
    p_rate, t_rate = n / min(plain), n / min(txn)
    w = t_rate / p_rate
    p50, p99 = np.percentile(lat, [50, 99])
    print(
        f"load: {n:,} rows into {TABLETS} tablets x 3 replicas by {args.writers} writers: "
        f"plain {p_rate:,.0f} rows/s, one transaction {t_rate:,.0f} rows/s "
        f"(best of 2 each; all: plain {', '.join(f'{n / s:,.0f}' for s in plain)}, "
        f"transactional {', '.join(f'{n / s:,.0f}' for s in txn)})"
    )
    print(
        f"commit: {len(lat)} transactions of {TABLETS} tablets: p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms, max {max(lat):.1f} ms"
    )
    print(f"txn: transactional/plain {w:.2f}, commit p99 {p99:.0f} ms (goal: W >= 0.7)")


async def _one_key_per_tablet(c: TesseraClient, ps: PartitionSchema) -> list[int]:
    """A key of each tablet (the first ids whose hash buckets cover all 12)."""
    buckets: dict[int, int] = {}
    i = 10**12
    while len(buckets) < TABLETS:
        key = ps.partition_keys_for_arrow(SCHEMA, pa.table({"id": pa.array([i], pa.int64())}))[0]
        buckets.setdefault(int.from_bytes(key[:4], "big"), i)
        i += 1
    return list(buckets.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.txn_bench", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--commits", type=int, default=200)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-txn-bench-") as d:
        asyncio.run(run(args, Path(d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
