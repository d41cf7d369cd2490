"""Smoke tests of the Raft commit, master and scale benchmarks: short real runs (Tessera
secured and insecure, PySyncObj; the master and scale benches' quick modes) must end with their
machine-readable summary lines, the security-overhead ratios among them, and leave no process
behind. Slow (about 20 s, 2 minutes and 5 minutes), so only in `make test-slow`."""

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
RAFT_OVERHEAD = re.compile(r"security-overhead: raft-commit (\d+\.\d\d)")
OVERHEAD = re.compile(
    r"security-overhead: raft-commit (\d+\.\d\d), get-table-locations (\d+\.\d\d)"
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _bench_processes(*modules: str) -> list[str]:
    """Command lines of running processes that name any of these modules or the benchmarks'
    temporary directories (default: raft_commit's). Masters and KV nodes are found by their
    directories: other tests may run masters meanwhile."""
    modules = modules or ("bench.pysyncobj_node", "bench.loadgen", "tessera-bench-")
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
    m = FINAL.fullmatch(lines[-2])
    assert m is not None, r.stdout
    tessera, etcd, pysyncobj, ratio = m.groups()
    assert int(tessera) > 0 and int(pysyncobj) > 0
    assert (etcd, ratio) == ("0", "0.00")  # skipped
    overhead = RAFT_OVERHEAD.fullmatch(lines[-1])
    assert overhead is not None and float(overhead.group(1)) > 0, r.stdout
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("tessera")}
    assert rows["tessera"][6] == "on" and rows["tessera-insecure"][6] == "off", r.stdout
    assert "mutual TLS" in r.stderr, r.stderr  # the secured cluster said how it runs
    assert _bench_processes() == before


def test_master_bench_quick_prints_every_figure() -> None:
    """`bench.master_bench --quick` (100 simulated servers, 3,000 replicas): every figure's line,
    the rpc line with its empty-server baseline and the master's own Ping rate, the insecure
    comparisons, the security-overhead line last, and no simulator, master or KV node left
    running."""

    ours = (
        "service.testing.ts_simulator",
        "bench.grpc_baseline",
        "grpcload",
        "master-bench-",  # the masters' directories
        "tessera-bench-",  # the KV nodes' (the raft figure)
        "bench.loadgen",
    )
    before = _bench_processes(*ours)
    r = subprocess.run(
        [sys.executable, "-m", "bench.master_bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    kinds = [line.split()[0] for line in lines]
    go = shutil.which("go") is not None
    expected = ["create", "lookup", "create", "rpc", *(["rpc-insecure"] if go else []), "rpc-py"]
    expected += ["spiral", "heartbeat", "raft", "security-overhead:"]
    assert kinds == expected, r.stdout
    for kind in ("rpc", "rpc-py"):  # rpc: the Go load generator, where Go is installed
        if kind == "rpc" and not go:
            continue
        rpc = next(line for line in lines if line.split()[0] == kind)
        m = re.search(
            r"GetTableLocations ([\d,]+) RPCs/s.*over mutual TLS.*empty grpc.aio server with TLS"
            r" ([\d,]+)/s",
            rpc,
        )
        assert m is not None and all(int(g.replace(",", "")) > 0 for g in m.groups()), rpc
        if kind == "rpc":
            own = re.search(r"the master's own Ping ([\d,]+)/s", rpc)
            assert own is not None and int(own.group(1).replace(",", "")) > 0, rpc
    ratios = [line.split()[0] for line in lines if re.search(r"secured/insecure \d+\.\d\d", line)]
    assert ratios == [*(["rpc-insecure"] if go else []), "rpc-py", "raft"], r.stdout
    assert "fewest servers live meanwhile 100/100" in r.stdout
    assert "heartbeat 100 servers x 1/s over mutual TLS" in r.stdout
    m = OVERHEAD.fullmatch(lines[-1])
    assert m is not None and all(float(g) > 0 for g in m.groups()), r.stdout
    assert _bench_processes(*ours) == before


SCALE = re.compile(
    r"scale: (\d+) tablets, (\d+) unprovoked elections, create max (\d+\.\d) s, replaced"
    r" (\d+) \((\d+\.\d\d)%\), failover lookup p100 (\d+\.\d\d) s"
)


def test_scale_bench_quick_grows_the_catalog_and_fails_over() -> None:
    """`bench.scale_bench --quick` (20,000 tablets on 100 simulated servers in 2 processes, 3
    secured masters): a row per table, the fleet line, three failovers and the summary line
    last, and no simulator or master left running."""
    ours = ("service.testing.ts_simulator", "scale-bench-")
    before = _bench_processes(*ours)
    r = subprocess.run(
        [sys.executable, "-m", "bench.scale_bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    kinds = [line.split()[0] for line in lines]
    assert kinds == [
        "table",
        "table",
        "fleet",
        "census",
        "failover",
        "failover",
        "failover",
        "scale:",
    ], r.stdout
    census = re.search(r"census +catalog (\d+) tablets, (\d+) replicas; fleet: (.*)", r.stdout)
    assert census is not None and census.group(1) == "20000", r.stdout
    assert census.group(3) == (
        "0 listed replicas not hosted, 0 tablets without a leader, 0 hosted replicas not listed"
    ), r.stdout
    m = SCALE.fullmatch(lines[-1])
    assert m is not None and int(m.group(1)) == 20_000, r.stdout
    fleet = re.search(r"fleet +(\d+) replicas, (\d+) leaders", r.stdout)
    assert fleet is not None, r.stdout
    # RUNNING needs a leader, which needs 2 of 3 replicas: at least that many exist.
    assert int(fleet.group(1)) >= 40_000 and int(fleet.group(2)) >= 20_000, r.stdout
    assert _bench_processes(*ours) == before


def test_master_promotion_and_failover_scale_print_their_figures(tmp_path: Path) -> None:
    """`bench.master_promotion` and `bench.master_failover_scale` at a small scale: each line
    of figures, and no simulator or master of the run left running."""
    r = subprocess.run(
        [sys.executable, "-m", "bench.master_promotion", "--tablets", "2000", "--servers", "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["load", "decode", "report"]
    keep = tmp_path / "scale"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.master_failover_scale",
            *("--tablets", "1000", "--servers", "30", "--rounds", "1", "--watch", "1"),
            *("--keep", str(keep)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"first correct GetTableLocations after \d+\.\d\d s", r.stdout), r.stdout
    assert _bench_processes(str(keep)) == []  # the simulator and masters name it
