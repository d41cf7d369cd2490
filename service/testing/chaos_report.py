"""What a fault campaign prints and writes: the workload x nemesis table, the closing line, and
per run a latency-over-time plot with the fault windows shaded, as Jepsen's `perf` checker draws
them (https://github.com/jepsen-io/jepsen, `jepsen.checker.perf`): one point per operation at its
invocation time, its latency on a log scale, coloured by outcome (ok, fail, info), grey bands
where a fault was in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from service.testing.chaos_checks import Op
from service.testing.chaos_nemesis import Window

COLORS = {"ok": "#4c9be8", "fail": "#e8604c", "info": "#f2b134"}


@dataclass
class RunResult:
    workload: str
    nemesis: str
    seed: int
    seconds: float
    ops: int = 0
    ok: int = 0
    fail: int = 0
    info: int = 0
    faults: int = 0
    valid: bool | None = None
    violations: int = 0
    lost: int = 0
    divergent: int = 0
    notes: list[str] = field(default_factory=list)
    png: str = ""
    error: str = ""
    """Set when the run itself broke (the cluster would not start, say): no verdict."""

    @property
    def verdict(self) -> str:
        if self.error:
            return "ERROR"
        if self.violations or self.lost or self.divergent or self.valid is False:
            return "INVALID"
        return "valid" if self.valid else "unknown"

    @property
    def failed(self) -> bool:
        return self.verdict in ("INVALID", "ERROR")

    def replay(self) -> str:
        return (
            f"make chaos CHAOS_SEED={self.seed} NEMESES={self.nemesis} "
            f"WORKLOADS={self.workload} CHAOS_SECONDS={round(self.seconds)}"
        )


def summary_line(results: Sequence[RunResult]) -> str:
    v = sum(r.violations for r in results)
    lost = sum(r.lost for r in results)
    d = sum(r.divergent for r in results)
    return f"chaos: {len(results)} runs, {v} violations, {lost} lost writes, {d} divergent catalogs"


def render_table(results: Sequence[RunResult]) -> str:
    """A Markdown table, one row per run."""
    head = (
        "| workload | nemesis | seconds | faults | ops | ok | fail | info | lost | verdict |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows = [
        f"| {r.workload} | {r.nemesis} | {r.seconds:.0f} | {r.faults} | {r.ops} | {r.ok} | "
        f"{r.fail} | {r.info} | {r.lost} | {r.verdict} |"
        for r in results
    ]
    return head + "\n".join(rows) + "\n"


def render_summary(results: Sequence[RunResult], command: str) -> str:
    """summary.md: the command, the table, each run's checker notes and plot, the closing line."""
    parts = [f"# Fault campaign\n\n`{command}`\n\n", render_table(results), "\n"]
    for r in results:
        parts.append(f"## {r.workload} x {r.nemesis}: {r.verdict}\n\n")
        if r.error:
            parts.append(f"- run error: {r.error}\n")
        parts += [f"- {n}\n" for n in r.notes]
        if r.png:
            parts.append(f"- plot: `{r.png}`\n")
        if r.failed:
            parts.append(f"- replay: `{r.replay()}`\n")
        parts.append("\n")
    parts.append(summary_line(results) + "\n")
    return "".join(parts)


def plot(ops: Sequence[Op], windows: Sequence[Window], path: Path, title: str) -> Path:
    """Latency over time (PNG): points by outcome, fault windows shaded and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4), dpi=80)
    try:
        for w in windows:
            end = w.end if w.end is not None else w.start
            ax.axvspan(w.start, end, color="#bbbbbb", alpha=0.35, lw=0)
            ax.text(
                w.start,
                1.02,
                w.label,
                transform=ax.get_xaxis_transform(),
                fontsize=6,
                rotation=30,
                ha="left",
                va="bottom",
                clip_on=False,
            )
        for kind, color in COLORS.items():
            pts = [(o.invoke, o.latency) for o in ops if o.type == kind and o.latency is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(
                    xs, [max(y, 1e-4) for y in ys], s=6, c=color, label=kind, edgecolors="none"
                )
        ax.set_yscale("log")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("latency (s)")
        ax.set_title(title, fontsize=9, loc="left", pad=40)
        if ops:
            ax.legend(loc="upper right", fontsize=7, markerscale=2)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
