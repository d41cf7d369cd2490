"""Smoke test of the Raft commit benchmark: a short real run (Tessera + PySyncObj processes on
loopback, etcd skipped) must end with the machine-readable summary line and leave no process
behind. Slow (about 15 s), so only in `make test-slow`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINAL = re.compile(
    r"raft-commit: tessera (\d+)/s, etcd (\d+)/s, pysyncobj (\d+)/s, tessera/etcd (\d+\.\d\d)"
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _bench_processes(*modules: str) -> list[str]:
    """Command lines of running processes of these modules (default: raft_commit's)."""
    modules = modules or ("bench.pysyncobj_node", "bench.loadgen")
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if any(m in line for m in modules)]


def test_raft_commit_prints_the_summary_line() -> None:
    before = _bench_processes()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.raft_commit",
            "--seconds",
            "1",
            "--warmup",
            "0.5",
            "--clients",
            "8",
            "--skip-etcd",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    m = FINAL.fullmatch(lines[-1])
    assert m is not None, r.stdout
    tessera, etcd, pysyncobj, ratio = m.groups()
    assert int(tessera) > 0 and int(pysyncobj) > 0
    assert (etcd, ratio) == ("0", "0.00")  # skipped
    assert any(line.startswith("tessera ") for line in lines)
    assert _bench_processes() == before


def test_master_bench_quick_prints_every_figure() -> None:
    """`bench.master_bench --quick` (100 simulated servers, 3,000 replicas): every figure's line,
    the rpc line with its empty-server baseline and the master's own Ping rate, and no
    simulator or master left running."""

    ours = ("service.testing.ts_simulator", "bench.grpc_baseline", "grpcload")
    before = _bench_processes(*ours)
    r = subprocess.run(
        [sys.executable, "-m", "bench.master_bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = [line.split()[0] for line in r.stdout.splitlines()]
    assert kinds == ["create", "lookup", "create", "rpc", "rpc-py", "spiral", "heartbeat"], r.stdout
    for kind in ("rpc", "rpc-py"):  # rpc: the Go load generator, where Go is installed
        if kind == "rpc" and shutil.which("go") is None:
            continue
        rpc = next(line for line in r.stdout.splitlines() if line.split()[0] == kind)
        m = re.search(r"GetTableLocations ([\d,]+) RPCs/s.*empty grpc.aio server ([\d,]+)/s", rpc)
        assert m is not None and all(int(g.replace(",", "")) > 0 for g in m.groups()), rpc
        if kind == "rpc":
            own = re.search(r"the master's own Ping ([\d,]+)/s", rpc)
            assert own is not None and int(own.group(1).replace(",", "")) > 0, rpc
    assert "fewest servers live meanwhile 100/100" in r.stdout
    assert _bench_processes(*ours) == before
