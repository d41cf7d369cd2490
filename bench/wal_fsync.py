"""Micro benchmark: the cost of a durable WAL append, against raw write+fdatasync in the same run.

    .venv/bin/python -m bench.wal_fsync [--dir /tmp] [--ops 2000] [--size 4096]

Prints per-operation latency for
  raw          os.write + os.fdatasync on a plain appended file (the floor on this disk),
  wal          Wal.append(one entry) + Wal.sync(), preallocated segments (the default),
  wal-noprealloc   the same without preallocation,
  wal-group-N  N entries per append + one sync (group commit), per entry and per sync,
and each one's ratio to `raw`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable

from service.consensus.fs import RealFileSystem
from service.consensus.wal import Wal
from service.raft.types import Entry


def _time(ops: int, op: Callable[[int], None]) -> float:
    for i in range(min(50, ops)):  # warm up: first segment writes, page cache
        op(i)
    start = time.perf_counter()
    for i in range(50, 50 + ops):
        op(i)
    return (time.perf_counter() - start) / ops


def bench_raw(directory: str, ops: int, payload: bytes) -> float:
    path = os.path.join(directory, "raw.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:

        def op(_i: int) -> None:
            os.write(fd, payload)
            os.fdatasync(fd)

        return _time(ops, op)
    finally:
        os.close(fd)


def bench_wal(directory: str, ops: int, payload: bytes, *, preallocate: bool, group: int) -> float:
    wal, _ = Wal.open(RealFileSystem(), directory, preallocate=preallocate)
    next_index = 1

    def op(_i: int) -> None:
        nonlocal next_index
        wal.append([Entry(1, next_index + k, data=payload) for k in range(group)])
        next_index += group
        wal.sync()

    try:
        return _time(ops, op)
    finally:
        wal.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--group", type=int, default=64)
    args = p.parse_args(argv)
    payload = os.urandom(args.size)
    root = tempfile.mkdtemp(prefix="wal-bench-", dir=args.dir)
    try:
        raw = bench_raw(root, args.ops, payload)
        rows = [("raw write+fdatasync", raw, raw)]
        for name, pre in (("wal", True), ("wal-noprealloc", False)):
            t = bench_wal(os.path.join(root, name), args.ops, payload, preallocate=pre, group=1)
            rows.append((f"{name} append+sync", t, t))
        g = args.group
        group_ops = max(1, args.ops // 4)
        small = payload[: max(1, args.size // 16)]
        t = bench_wal(os.path.join(root, "group"), group_ops, small, preallocate=True, group=g)
        rows.append((f"wal-group-{g} x {len(small)} B, per sync", t, t))
        rows.append((f"wal-group-{g} x {len(small)} B, per entry", t / g, t))
        print(f"{args.size} B entries, {args.ops} ops, in {root}")
        for name, t, per_sync in rows:
            print(f"  {name:<36} {t * 1e6:9.1f} us  ({per_sync / raw:4.2f}x raw per sync)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
