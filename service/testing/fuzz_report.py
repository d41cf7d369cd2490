"""The fuzzing campaign's bookkeeping: what it counts, and how a finding reads.

Theory of operation
-------------------
`Stats` counts cases, findings by kind (the four of the final line, then unexpected statuses and
server tracebacks; state changes also by class) and what is not a finding but worth knowing
(timeouts, requests the guard rewrote, accepted catalog changes, the machine's own stalls,
checks the cluster did not answer, errors of the fuzzer itself), and every RPC's outcomes, for
the table printed at the end.

`Repro` is a finding's case as sent, with what it takes to see it again: the case's number
(`--seed S --case K` regenerates it) and its exact bytes (`--replay HEX ...`), the request as
text, and how the call ended.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from service.testing.fuzz_cluster import Outcome
from service.testing.fuzz_gen import Case

__all__ = ["Repro", "Stats", "fmt_slow", "outcome_lines"]


@dataclass
class Stats:
    """What a campaign counted (module docstring)."""

    cases: int = 0
    crashes: int = 0
    state_changes: int = 0
    stalls: int = 0
    unexpected: int = 0
    tracebacks: int = 0
    timeouts: int = 0
    defanged: int = 0
    """Requests fuzz_guard rewrote before they were sent."""
    accepted_changes: int = 0
    machine_stalls: int = 0
    """Stalls during which the control process ran late too (fuzz_checks.MachineWatch)."""
    unchecked: int = 0
    """Checks skipped because the cluster did not answer them."""
    harness_errors: int = 0
    """Exceptions of the fuzzer itself (printed; the run exits 1 but they are no finding)."""
    outcomes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    """(RPC, status) -> cases."""
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    """Findings by kind (state changes by class: "state change", "outside partition",
    "tombstoned", "config mismatch")."""

    @property
    def findings(self) -> int:
        return self.crashes + self.state_changes + self.stalls + self.unexpected + self.tracebacks

    @property
    def failed(self) -> bool:
        """Whether the run should exit non-zero: findings, or errors of the fuzzer's own."""
        return bool(self.findings or self.harness_errors)

    def line(self) -> str:
        """The line a run ends with."""
        return (
            f"fuzz: {self.cases} cases, {self.crashes} crashes, "
            f"{self.state_changes} state changes, {self.stalls} stalls"
        )

    def others(self) -> str:
        """Everything else, for the progress lines and the line before the last."""
        return (
            f"{self.unexpected} unexpected statuses, {self.tracebacks} server tracebacks, "
            f"{self.timeouts} timeouts, {self.defanged} rewritten by the guard, "
            f"{self.accepted_changes} accepted catalog changes, "
            f"{self.machine_stalls} stalls of the whole machine (not counted), "
            f"{self.unchecked} checks the cluster did not answer, "
            f"{self.harness_errors} harness errors"
            + (
                "; findings by kind: "
                + ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
                if self.kinds
                else ""
            )
        )


def outcome_lines(stats: Stats) -> list[str]:
    """Every RPC's outcomes, one line each: that every RPC was called and what it answered."""
    by_rpc: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (rpc, code), n in stats.outcomes.items():
        by_rpc[rpc][code] += n
    lines = [f"fuzz: outcomes of {len(by_rpc)} RPCs:"]
    for rpc in sorted(by_rpc):
        codes = ", ".join(f"{c} {n}" for c, n in by_rpc[rpc].most_common())
        lines.append(f"  {rpc}: {codes}")
    return lines


def fmt_slow(slow: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(slow.items()))


@dataclass
class Repro:
    """A finding's case: everything needed to run it again."""

    seed: int
    number: int
    case: Case
    payloads: tuple[bytes, ...]
    outcome: Outcome
    defanged: str

    def text(self, what: str, *, full: bool) -> str:
        c = self.case
        hexes = ",".join(p.hex() for p in self.payloads)
        if not full and len(hexes) > 600:
            hexes = hexes[:600] + f"...({sum(len(p) for p in self.payloads)} bytes)"
        shown = "; ".join(_show(m) for m in c.messages) if c.messages else "raw bytes"
        if not full and len(shown) > 400:
            shown = shown[:400] + "..."
        how = " (raw bytes)" if c.raw is not None else " (mutated)" if c.mutated else ""
        rerun = (
            f"  rerun the case: .venv/bin/python -m service.testing.fuzz --seed {self.seed} "
            f"--case {self.number}\n"
            if self.number >= 0
            else ""
        )
        which = f"case {self.number} (seed {self.seed})" if self.number >= 0 else "replayed bytes"
        return (
            f"{which}: {c.rpc.name} as {c.identity} to {c.target}"
            f"{how}"
            f"{' (redirected: ' + self.defanged + ')' if self.defanged else ''} -> "
            f"{self.outcome.code} {self.outcome.details[:200]!r} in {self.outcome.seconds:.2f}s\n"
            f"  {what}\n"
            f"  request: {shown}\n"
            f"{rerun}"
            f"  replay the bytes: .venv/bin/python -m service.testing.fuzz --rpc {c.rpc.name} "
            f"--as {c.identity} --to {c.target} --replay {hexes}"
        )


def _show(m: object) -> str:
    text = str(m).replace("\n", " ").strip()
    return f"{{{text}}}"
