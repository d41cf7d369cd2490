"""The fault campaign: Jepsen's method on real Tessera processes, sized for one machine.

    python -m service.testing.chaos --seconds 600 --seed 7 \\
        --nemeses kill,pause,partition,clock,disk --workloads register,ddl,catalog_reads,rows \\
        --out chaos-out

Theory of operation
-------------------
Jepsen (https://jepsen.io, https://github.com/jepsen-io/jepsen) tests a distributed system from
the outside: clients run a workload and record a *history* of operations, each invoked and then
completed as ok, fail or info (indeterminate); a *nemesis* injects faults meanwhile; and a
*checker* decides afterwards, from the history alone, whether the system kept its promises. No
assertion runs inside the system, so the verdict holds for the processes as shipped.

Here a *run* is one (workload, nemesis) pair on a fresh cluster of 3 masters and 3 tablet
servers (`chaos_cluster`), each process in a network namespace of its own (`chaos_net`), so
that partitions are real dropped packets between real processes. A run:

1. starts the cluster and the workload's tables, then starts the clock (time 0 of the plot);
2. runs the workload's processes and the nemesis side by side for the run's seconds: the
   nemesis alternates quiet periods and fault windows (`chaos_nemesis`);
3. heals everything (network whole, every process resumed or restarted, disks and clocks
   right), lets the workload make its final reads, and stops the cluster;
4. checks the history (`chaos_checks`): linearizability per key with the project's checker
   (`service.testing.linearizability`, the Wing-Gong-Lowe search Knossos uses:
   https://github.com/jepsen-io/knossos), lost, duplicated and stale rows, the DDL model, and
   whether every master's catalog agrees; then writes the history, the plot and a table row.

Indeterminate operations are never guessed: an info write may have happened at any time after
its invocation, or never, and the checkers accept either (Knossos' treatment of :info). The
anomalies looked for are Elle's and Knossos' (https://github.com/jepsen-io/elle): a read that
misses an acknowledged write or sees a deleted table is a linearizability violation, not a
"lost write", which is reserved for an acknowledged insert absent once everything is healed.

`--seconds` is the campaign's fault time, split evenly between the runs (at least
`MIN_RUN_SECONDS` each); starting and checking a run adds half a minute or so. Seeds fix each
run's schedule of faults and each client's choice of operations, not the timing of a loaded
machine, so a replay reproduces the same faults in the same order, not the same interleaving.
The campaign ends with one line, `chaos: N runs, V violations, L lost writes, D divergent
catalogs`, and exits 1 when any of them is non-zero or a run broke; each failing run prints the
`make chaos` line that replays it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
import time
from pathlib import Path

from service.testing.chaos_checks import History
from service.testing.chaos_cluster import ChaosCluster
from service.testing.chaos_nemesis import NEMESES, Nemesis
from service.testing.chaos_report import RunResult, plot, render_summary, summary_line
from service.testing.chaos_workloads import WORKLOADS, Workload

MIN_RUN_SECONDS = 20.0
PROGRESS_EVERY = 10.0


def _log(msg: str) -> None:
    print(msg, flush=True)


async def _progress(label: str, history: History, nemesis: Nemesis, until: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY)
        c = history.counts()
        _log(
            f"chaos: {label} t={history.now():.0f}/{until:.0f}s ops={len(history.ops)} "
            f"ok={c['ok']} fail={c['fail']} info={c['info']} faults={len(nemesis.windows)}"
        )


async def _drive(
    cluster: ChaosCluster, workload: str, nemesis: str, seed: int, seconds: float, label: str
) -> tuple[Workload, Nemesis, History]:
    history = History()
    stream = f"{seed}/{workload}/{nemesis}"
    wl = WORKLOADS[workload](cluster, history, random.Random(stream).randrange(1 << 30))
    try:
        await wl.setup()
        nem = NEMESES[nemesis](cluster, random.Random(stream), wl.focus, wl.leader)
        history.t0 = time.monotonic()
        progress = asyncio.create_task(_progress(label, history, nem, seconds))
        try:
            await asyncio.gather(wl.run(seconds), nem.run(seconds, history.now))
        finally:
            progress.cancel()
        await wl.finish()
        history.close()
        return wl, nem, history
    finally:
        await wl.close()


def run_one(workload: str, nemesis: str, seed: int, seconds: float, out: Path) -> RunResult:
    """One run on a fresh cluster; never raises (a broken run is an ERROR row)."""
    result = RunResult(workload, nemesis, seed, seconds)
    base = out / "runs" / f"{workload}-{nemesis}"
    shutil.rmtree(base, ignore_errors=True)
    label = f"{workload} x {nemesis}"
    try:
        cluster = ChaosCluster(base, clocks=nemesis == "clock")
        try:
            cluster.start()
            wl, nem, history = asyncio.run(_drive(cluster, workload, nemesis, seed, seconds, label))
        finally:
            cluster.stop()
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"[:500]
        return result
    counts = history.counts()
    result.ops = len(history.ops)
    result.ok, result.fail, result.info = counts["ok"], counts["fail"], counts["info"]
    result.faults = len(nem.windows)
    history.write_jsonl(out / "histories" / f"{workload}-{nemesis}.jsonl")
    try:
        verdict = wl.check()
    except Exception as e:
        result.error = f"checker: {type(e).__name__}: {e}"[:500]
        return result
    result.valid, result.violations = verdict.valid, verdict.violations
    result.lost, result.divergent, result.notes = verdict.lost, verdict.divergent, verdict.notes
    png = out / f"{workload}-{nemesis}.png"
    with contextlib.suppress(Exception):
        result.png = str(plot(history.ops, nem.windows, png, f"{label} (seed {seed})"))
    if not result.failed:
        shutil.rmtree(base, ignore_errors=True)  # keep data and logs of failing runs only
    return result


def campaign(
    workloads: list[str], nemeses: list[str], seconds: float, seed: int, out: Path
) -> list[RunResult]:
    pairs = [(w, n) for n in nemeses for w in workloads]
    per_run = max(MIN_RUN_SECONDS, seconds / max(1, len(pairs)))
    out.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    command = (
        f"python -m service.testing.chaos --seconds {seconds:.0f} --seed {seed} "
        f"--nemeses {','.join(nemeses)} --workloads {','.join(workloads)} --out {out}"
    )
    for i, (w, n) in enumerate(pairs, start=1):
        _log(f"chaos: run {i}/{len(pairs)}: {w} x {n}, {per_run:.0f}s, seed {seed}")
        started = time.monotonic()
        r = run_one(w, n, seed, per_run, out)
        results.append(r)
        _log(
            f"chaos: run {i}/{len(pairs)}: {w} x {n}: {r.verdict} ({r.ops} ops, ok {r.ok}, "
            f"fail {r.fail}, info {r.info}, {r.faults} faults, "
            f"{time.monotonic() - started:.0f}s wall)"
        )
        for note in r.notes[:6] + ([r.error] if r.error else []):
            _log(f"chaos:     {note[:300]}")
        if r.failed:
            _log(f"chaos:     replay: {r.replay()}")
        (out / "summary.md").write_text(render_summary(results, command))
    return results


def _names(arg: str, known: dict[str, object], what: str) -> list[str]:
    names = [s.strip() for s in arg.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"unknown {what}: {unknown}; choose from {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600, help="fault time over all runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nemeses", default="kill,pause,partition,clock,disk")
    p.add_argument("--workloads", default="register,ddl,catalog_reads,rows")
    p.add_argument("--out", type=Path, default=Path("chaos-out"))
    a = p.parse_args(argv)
    nemeses = _names(a.nemeses, NEMESES, "nemeses")  # type: ignore[arg-type]
    workloads = _names(a.workloads, WORKLOADS, "workloads")  # type: ignore[arg-type]
    started = time.monotonic()
    results = campaign(workloads, nemeses, a.seconds, a.seed, a.out)
    _log(f"chaos: summary in {a.out / 'summary.md'}, {time.monotonic() - started:.0f}s wall")
    for r in results:
        if r.failed:
            _log(f"chaos: FAILED {r.workload} x {r.nemesis} (seed {r.seed}): {r.replay()}")
    _log(summary_line(results))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
