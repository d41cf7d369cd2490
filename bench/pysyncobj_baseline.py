"""PySyncObj baseline: 3 PySyncObj processes (bench/pysyncobj_node.py), driven by bench.loadgen.

    .venv/bin/python -m bench.pysyncobj_baseline [--clients 64] [--seconds 10]

Each node replicates a dict with PySyncObj 0.3.17 (library defaults, journal in a file under a
temporary directory) and serves the KvDemo Put/Status API over gRPC, so the load generator's
`kvdemo` target, the same client code that drives Tessera, drives it. PySyncObj does NOT fsync
(see bench/pysyncobj_node.py): its numbers are for a log that lives in the page cache.
`stop()` sends SIGTERM, then SIGKILL to whatever is left, and removes the temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from bench.loadgen import ROOT, KvDemoTarget, LoadResult, LoadSpec, log, run_load
from bench.pysyncobj_node import FSYNC
from service.tools.launcher import StopOnExit, free_ports, terminate_all


class PySyncObjCluster(StopOnExit):
    def __init__(self, base: Path | None = None, size: int = 3, *, batch: bool = True) -> None:
        self.batch = batch
        self.base = Path(tempfile.mkdtemp(prefix="pysyncobj-bench-")) if base is None else base
        ports = free_ports(2 * size)
        self.raft = [f"127.0.0.1:{p}" for p in ports[:size]]
        self.grpc = [f"127.0.0.1:{p}" for p in ports[size:]]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def addresses(self) -> list[str]:
        return list(self.grpc)

    @property
    def pids(self) -> dict[str, int]:
        return {f"pysyncobj-{i}": p.pid for i, p in enumerate(self.procs, start=1)}

    def start(self, timeout: float = 30.0) -> None:
        for i, (raft, grpc_addr) in enumerate(zip(self.raft, self.grpc, strict=True), start=1):
            args = [
                sys.executable,
                "-m",
                "bench.pysyncobj_node",
                f"--raft={raft}",
                f"--grpc={grpc_addr}",
                f"--journal={self.base / f'node-{i}.journal'}",
                f"--ready-file={self.base / f'node-{i}.ready'}",
            ]
            if not self.batch:
                args.append("--no-batch")
            for r, g in zip(self.raft, self.grpc, strict=True):
                if r != raft:
                    args.append(f"--peer={r}={g}")
            logf = (self.base / f"node-{i}.log").open("ab")
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            self.procs.append(
                subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            )
            logf.close()
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs, start=1):
            ready = self.base / f"node-{i}.ready"
            while not ready.exists():
                if proc.poll() is not None:
                    log_text = (self.base / f"node-{i}.log").read_text(errors="replace")
                    raise RuntimeError(f"pysyncobj node-{i} exited: {log_text[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pysyncobj node-{i} not serving after {timeout}s")
                time.sleep(0.05)
            assert json.loads(ready.read_text())["fsync"] is FSYNC
        asyncio.run(self._wait_leader(max(1.0, deadline - time.monotonic())))

    async def _wait_leader(self, timeout: float) -> None:
        target = KvDemoTarget(self.addresses)
        try:
            await target.ready(timeout)
        finally:
            await target.aclose()

    def stop(self) -> None:
        terminate_all(self.procs)
        shutil.rmtree(self.base, ignore_errors=True)


def run(
    clients: int = 64,
    seconds: float = 10.0,
    warmup: float = 2.0,
    value_size: int = 16,
    procs: int = 1,
    batch: bool = True,
    kind: str = "kvdemo",
) -> LoadResult:
    tuning = "library defaults" if batch else "defaults but appendEntriesUseBatch=False"
    log(
        f"pysyncobj: PySyncObj {version('pysyncobj')}, 3 nodes, {tuning}, "
        f"journal file {'with' if FSYNC else 'WITHOUT'} fsync"
    )
    with PySyncObjCluster(batch=batch) as cluster:
        spec = LoadSpec(
            kind=kind,
            addresses=tuple(cluster.addresses),
            clients=clients,
            seconds=seconds,
            warmup=warmup,
            value_size=value_size,
            procs=procs,
            label="pysyncobj",
        )
        return asyncio.run(run_load(spec, server_pids=cluster.pids))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="PySyncObj 3-node baseline under bench.loadgen")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument(
        "--no-batch",
        action="store_true",
        help="appendEntriesUseBatch=False: replicate each command at once (not the default)",
    )
    args = p.parse_args(argv)
    r = run(args.clients, args.seconds, args.warmup, procs=args.procs, batch=not args.no_batch)
    print(
        f"pysyncobj: {r.rate:.0f} puts/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, "
        f"errors {r.errors}, load generator {r.loadgen_cores:.2f} cores, "
        f"servers {sum(r.server_cores.values()):.2f} cores, fsync {'on' if FSYNC else 'off'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
