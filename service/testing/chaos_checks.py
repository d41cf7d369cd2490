"""Histories of the fault campaign and the checkers that judge them.

A history is Jepsen's: every operation is *invoked* by one logical process and then completes
as `ok` (it happened, with this result), `fail` (it certainly did not happen) or `info` (the
client cannot tell: a timeout, a lost connection). Times are seconds on the monotonic clock from
the run's start, so latencies can be plotted against the fault windows.

Three checkers read them:

* `register_ops` and `catalog_ops` turn histories into `service.testing.linearizability`
  operations, one register per key (Knossos' model, checked per key as Jepsen's `independent`
  does: https://github.com/jepsen-io/knossos). A table name is a register that holds "1" while
  the table exists: a create is a compare-and-set from absent to "1", a delete from "1" to
  absent, a rename both at once (checked per name, which is sound but not complete: the checker
  sees each name's half of it), and a catalog read a `get` of every name whose create began
  before the read ended. A create refused with ALREADY_EXISTS and a delete or rename refused
  with NOT_FOUND are compare-and-sets that saw another value (`b"0"`), not no-ops: DDL retries
  are exactly-once, so such an answer for a name only this run ever used is a finding.
* `check_rows` looks for lost, duplicated, phantom and stale rows in a set of inserts and scans.
* `DdlModel` computes the table names each DDL lineage (create, maybe rename, maybe delete) may
  have left, given which operations were indeterminate, and compares the survivors with a
  catalog listing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from service.testing.linearizability import Operation, OpStatus

PRESENT = b"1"
MISMATCH_CODES = frozenset({"ALREADY_EXISTS", "NOT_FOUND"})
"""Refusals that mean "the compare part of the compare-and-set failed"."""


@dataclass
class Op:
    """One operation of a history (its invocation and, once known, its completion)."""

    index: int
    process: int
    f: str
    key: str | None
    value: Any
    invoke: float
    type: str = "invoke"
    """"invoke" while pending, then "ok", "fail" or "info"."""
    complete: float | None = None
    output: Any = None
    error: str = ""

    @property
    def latency(self) -> float | None:
        return None if self.complete is None else self.complete - self.invoke


@dataclass
class History:
    """Thread-safe recorder of `Op`s with times relative to `t0` (monotonic)."""

    t0: float = field(default_factory=time.monotonic)
    ops: list[Op] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def invoke(self, process: int, f: str, key: str | None = None, value: Any = None) -> Op:
        with self._lock:
            op = Op(len(self.ops), process, f, key, value, self.now())
            self.ops.append(op)
            return op

    def complete(self, op: Op, type_: str, output: Any = None, error: str = "") -> Op:
        if type_ not in ("ok", "fail", "info"):
            raise ValueError(f"unknown completion {type_!r}")
        if op.type != "invoke":
            raise ValueError(f"operation {op.index} already completed as {op.type}")
        op.type, op.output, op.error, op.complete = type_, output, error, self.now()
        return op

    def close(self) -> None:
        """Whatever is still pending never told its outcome: info, with no completion time."""
        for op in self.ops:
            if op.type == "invoke":
                op.type = "info"
                op.error = op.error or "never completed"

    def counts(self, fs: Iterable[str] | None = None) -> Counter[str]:
        keep = None if fs is None else set(fs)
        return Counter(op.type for op in self.ops if keep is None or op.f in keep)

    def write_jsonl(self, path: Path) -> None:
        """One line per event, invocations and completions in time order (Jepsen's layout)."""
        events: list[tuple[float, int, dict[str, Any]]] = []
        for op in self.ops:
            d = asdict(op)
            base = {k: d[k] for k in ("index", "process", "f", "key", "value")}
            events.append((op.invoke, 0, {**base, "type": "invoke", "time": op.invoke}))
            if op.type != "invoke":
                done = {**base, "type": op.type, "time": op.complete, "output": op.output}
                if op.error:
                    done["error"] = op.error
                events.append((op.complete if op.complete is not None else 1e18, 1, done))
        events.sort(key=lambda e: (e[0], e[1]))
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for _, _, e in events:
                f.write(json.dumps(e, default=str) + "\n")


# --- linearizability ---------------------------------------------------------------------------


def _status(op: Op) -> OpStatus:
    return {"ok": OpStatus.OK, "fail": OpStatus.FAIL}.get(op.type, OpStatus.UNKNOWN)


def _ret(op: Op) -> float | None:
    return op.complete if op.type in ("ok", "fail") else None


def _enc(v: Any) -> bytes | None:
    return None if v is None else str(v).encode()


def register_ops(history: Sequence[Op]) -> list[Operation]:
    """Register reads and writes as checker operations (a failed or indeterminate read has
    no effect and is left out)."""
    out = []
    for op in history:
        if op.f == "read" and op.type == "ok":
            out.append(
                Operation(
                    op.process,
                    str(op.key),
                    "get",
                    None,
                    None,
                    _enc(op.output),
                    op.invoke,
                    op.complete,
                    OpStatus.OK,
                )
            )
        elif op.f == "write":
            st = _status(op)
            out.append(
                Operation(
                    op.process,
                    str(op.key),
                    "put",
                    _enc(op.value),
                    None,
                    None,
                    op.invoke,
                    _ret(op),
                    st,
                )
            )
    return out


def _cas(op: Op, key: str, expected: bytes | None, new: bytes | None) -> Operation:
    if op.type == "fail" and op.error in MISMATCH_CODES:
        return Operation(
            op.process, key, "cas", new, expected, b"0", op.invoke, op.complete, OpStatus.OK
        )
    if op.type == "ok":
        return Operation(
            op.process, key, "cas", new, expected, PRESENT, op.invoke, op.complete, OpStatus.OK
        )
    return Operation(op.process, key, "cas", new, expected, None, op.invoke, _ret(op), _status(op))


def catalog_ops(history: Sequence[Op]) -> list[Operation]:
    """DDL and catalog reads as per-name register operations (module docstring)."""
    out: list[Operation] = []
    created: list[tuple[float, str]] = []
    for op in history:
        if op.f == "create":
            out.append(_cas(op, op.value["name"], None, PRESENT))
            created.append((op.invoke, op.value["name"]))
        elif op.f == "delete":
            out.append(_cas(op, op.value["name"], PRESENT, None))
        elif op.f == "rename":
            old, new = op.value["name"], op.value["new_name"]
            if op.type == "fail" and op.error == "ALREADY_EXISTS":
                out.append(_cas(op, new, None, PRESENT))
            elif op.type == "fail" and op.error == "NOT_FOUND":
                out.append(_cas(op, old, PRESENT, None))
            else:
                out.append(_cas(op, old, PRESENT, None))
                out.append(_cas(op, new, None, PRESENT))
                created.append((op.invoke, new))
    for op in history:
        if op.f != "list" or op.type != "ok" or op.complete is None:
            continue
        seen = set(op.output)
        for t, name in created:
            if t <= op.complete:
                out.append(
                    Operation(
                        op.process,
                        name,
                        "get",
                        None,
                        None,
                        PRESENT if name in seen else None,
                        op.invoke,
                        op.complete,
                        OpStatus.OK,
                    )
                )
    return out


# --- rows -------------------------------------------------------------------------------------


@dataclass
class RowsVerdict:
    acknowledged: int = 0
    lost: list[int] = field(default_factory=list)
    """Acknowledged inserts missing from the final scan."""
    duplicates: list[int] = field(default_factory=list)
    """Keys a scan returned more than once."""
    phantoms: list[int] = field(default_factory=list)
    """Keys a scan returned that no insert ever tried."""
    stale: list[tuple[int, int]] = field(default_factory=list)
    """(scan index, key): a leader scan that missed an insert acknowledged before it began."""
    final_scan: bool = False

    @property
    def ok(self) -> bool:
        return self.final_scan and not (self.lost or self.duplicates or self.phantoms or self.stale)


def check_rows(history: Sequence[Op]) -> RowsVerdict:
    """Inserts (`value`: list of keys) against scans (`output`: list of keys, in scan order);
    the last `final_scan` decides what was lost."""
    v = RowsVerdict()
    acked: dict[int, float] = {}
    tried: set[int] = set()
    for op in history:
        if op.f == "insert":
            tried.update(op.value)
            if op.type == "ok" and op.complete is not None:
                for k in op.value:
                    acked[k] = op.complete
    v.acknowledged = len(acked)
    final: list[int] | None = None
    for op in history:
        if op.f not in ("scan", "final_scan") or op.type != "ok":
            continue
        keys = list(op.output)
        counts = Counter(keys)
        v.duplicates += sorted(k for k, n in counts.items() if n > 1)
        v.phantoms += sorted(k for k in counts if k not in tried)
        present = set(keys)
        v.stale += [(op.index, k) for k, t in acked.items() if t < op.invoke and k not in present]
        if op.f == "final_scan":
            final = keys
    if final is not None:
        v.final_scan = True
        got = set(final)
        v.lost = sorted(k for k in acked if k not in got)
    v.stale = [(i, k) for i, k in v.stale if k not in set(v.lost)]
    return v


# --- the DDL model -------------------------------------------------------------------------


@dataclass
class DdlVerdict:
    lineages: int = 0
    mismatches: list[str] = field(default_factory=list)
    """Lineages whose surviving name is not one the model allows, and unknown names."""

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _apply(f: str, value: dict[str, str], state: str | None) -> str | None:
    if f == "create":
        return value["name"] if state is None else state
    if f == "rename":
        return value["new_name"] if state == value["name"] else state
    if f == "delete":
        return None if state == value["name"] else state
    raise ValueError(f"not a DDL operation: {f}")


class DdlModel:
    """Possible final names of each lineage: its operations in order, each `ok` one applied,
    each `info` one maybe applied, each `fail` one not applied (module docstring)."""

    def __init__(self, history: Sequence[Op]) -> None:
        self.states: dict[str, set[str | None]] = {}
        self.names: dict[str, set[str]] = {}
        for op in history:
            if op.f not in ("create", "rename", "delete"):
                continue
            lineage = op.value["lineage"]
            states = self.states.setdefault(lineage, {None})
            names = self.names.setdefault(lineage, set())
            names.add(op.value["name"])
            if "new_name" in op.value:
                names.add(op.value["new_name"])
            if op.type == "ok":
                self.states[lineage] = {_apply(op.f, op.value, s) for s in states}
            elif op.type != "fail":
                self.states[lineage] = states | {_apply(op.f, op.value, s) for s in states}

    def check(self, listed: Sequence[str]) -> DdlVerdict:
        v = DdlVerdict(lineages=len(self.states))
        counts = Counter(listed)
        v.mismatches += [f"{n!r} listed {c} times" for n, c in counts.items() if c > 1]
        owned: set[str] = set()
        for lineage, states in sorted(self.states.items()):
            names = self.names[lineage]
            owned |= names
            present = sorted(n for n in names if n in counts)
            if len(present) > 1 or (present[0] if present else None) not in states:
                allowed = sorted("(none)" if s is None else s for s in states)
                v.mismatches.append(f"{lineage}: found {present or '(none)'}, allowed {allowed}")
        v.mismatches += [f"{n!r} was never created" for n in sorted(counts) if n not in owned]
        return v


def views_diverge(views: dict[str, dict[str, str] | None]) -> list[str]:
    """Masters whose catalog (table id -> name) differs from the first one that answered."""
    answered = {m: v for m, v in views.items() if v is not None}
    if not answered:
        return []
    ref_name, ref = next(iter(sorted(answered.items())))
    return [m for m, v in sorted(answered.items()) if v != ref and m != ref_name]


# --- snapshots -------------------------------------------------------------------------------


@dataclass
class SnapshotVerdict:
    reads: int = 0
    """Snapshot reads checked."""
    violations: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def check_snapshots(ops: Sequence[Op]) -> SnapshotVerdict:
    """Every snapshot read against the writes (docs/design/tablets.md#R3, #R4).

    Writes ("write": `value` = (counter, keys), output = commit timestamp) set every key they
    name to their counter; reads ("snapshot": `value` = the timestamp T, output = {key: value})
    return the whole table at T.

    What a write's output says is an upper bound, not the time each key changed: a write
    spanning tablets commits on each at its own hybrid time and reports the newest, and a
    batch retried after a lost reply may have committed the first time, earlier. So a key
    written by a write acknowledged at R changed at some time at or before R. What is certain:
    a write acknowledged at R <= T is in a read at T (it, or a write after it); a write that
    began after a read at T ended committed after T (that read moved the servers' clocks past
    T, docs/design/tablets.md#R4); and of two writes of a key, one acknowledged before the
    other began committed first. So for each key a read at T must not show
    * a write that began after the read ended (a read from the future),
    * a write that an acknowledged write at or before T followed (a stale snapshot),
    * nothing, while an acknowledged write at or before T wrote the key (lost, for the final
      read, which is taken after every acknowledged write),
    * a value nobody wrote.
    Writes whose outcome the client never learned may have committed at any time. Two reads at
    the same T, from different replicas, must be equal."""
    writes: dict[int, list[Op]] = {}  # key -> writes of it (acknowledged or outcome unknown)
    by_counter: dict[int, Op] = {}
    for op in ops:
        if op.f != "write" or op.type not in ("ok", "info"):
            continue
        counter, keys = op.value
        by_counter[counter] = op
        for k in keys:
            writes.setdefault(k, []).append(op)
    v = SnapshotVerdict()
    seen_at: dict[int, dict[int, int]] = {}
    for op in ops:
        if op.f not in ("snapshot", "final_snapshot") or op.type != "ok":
            continue
        at, rows = int(op.value), {int(k): int(x) for k, x in op.output.items()}
        v.reads += 1
        same = seen_at.setdefault(at, rows)
        if same != rows:
            diff = sorted(k for k in set(same) | set(rows) if same.get(k) != rows.get(k))[:5]
            v.violations.append(f"two reads at {at} differ at keys {diff}")
        ended = op.complete if op.complete is not None else float("inf")
        for k in sorted(set(writes) | set(rows)):
            got = rows.get(k)
            before = [
                w for w in writes.get(k, []) if w.type == "ok" and int(w.output) <= at
            ]  # certainly at or before `at`
            if got is None:
                if before:
                    newest = max(before, key=lambda w: int(w.output))
                    if op.f == "final_snapshot":
                        v.lost.append(
                            f"key {k}: write {newest.value[0]} acknowledged, missing from the "
                            "final read"
                        )
                    else:
                        v.violations.append(
                            f"read at {at}: key {k} missing, but write {newest.value[0]} "
                            f"committed at or before it ({newest.output})"
                        )
                continue
            w = by_counter.get(got)
            if w is None or k not in w.value[1]:
                v.violations.append(f"read at {at}: key {k} = {got}, a value never written")
                continue
            if w.invoke > ended:
                v.violations.append(
                    f"read at {at}: key {k} = {got}, committed after the snapshot (the write "
                    "began after the read ended)"
                )
                continue
            if w.type != "ok" or w.complete is None:
                continue  # its ack never came: it may have been applied again at any time
            later = [x for x in before if x is not w and x.invoke > w.complete]
            if later:
                newer = max(later, key=lambda x: int(x.output))
                v.violations.append(
                    f"read at {at}: key {k} = {got}, but the newest write at or before it is "
                    f"{newer.value[0]} (committed by {newer.output}, begun after {got} was "
                    "acknowledged)"
                )
    return v


@dataclass
class BankVerdict:
    reads: int = 0
    transfers: int = 0
    violations: list[str] = field(default_factory=list)


def check_bank(ops: Sequence[Op], total: int) -> BankVerdict:
    """Jepsen's bank test for transactions (docs/design/transactions.md): every snapshot read
    ("balances": output = {account: balance} of every account of both tables) must sum to
    `total` and see every account, whatever transfers committed, aborted or were cut off; a
    transfer applied in part (one account moved, not the other) breaks the sum."""
    v = BankVerdict()
    for op in ops:
        if op.type != "ok":
            continue
        if op.f == "transfer":
            v.transfers += 1
        if op.f not in ("balances", "final_balances"):
            continue
        v.reads += 1
        balances = op.output
        got = sum(balances.values())
        if got != total:
            v.violations.append(
                f"{op.f} at {op.value}: the balances sum to {got}, not {total}: {balances}"
            )
    return v
