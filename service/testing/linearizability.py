"""Linearizability checker for client histories of a replicated key-value store.

Theory of operation
===================

A history is a set of client operations, each with the time it was *called* and the time it
*returned*. It is linearizable if every operation can be given a single instant between its call
and its return (its linearization point) such that applying the operations one at a time, in the
order of those instants, to a sequential key-value store yields exactly the results the clients
saw. Equivalently: there is a total order of the operations that (1) respects real time - if A
returned before B was called, A comes first - and (2) is a legal sequential execution.

Per-key partitioning
--------------------
Linearizability is *local* (Herlihy & Wing 1990, "P-compositionality" in porcupine's terms): a
history over several independent objects is linearizable iff the sub-history of each object is.
Keys of a KV store are independent registers, so `check` splits the history by key and checks
each part against the model of one register whose initial value is "absent" (``None``). This turns
one search over N operations into many small ones, which is what makes checking practical.

The search (Wing & Gong, with Lowe's refinements)
-------------------------------------------------
For one key, every call and every return becomes an *event*; events are sorted by time into a
doubly linked list. Call the operations that have not been linearized yet *pending*. The first
operation of any valid linearization of the pending operations must be *minimal*: it must have
been called before every pending operation returned (otherwise some pending operation finished
entirely before it and would have to come first). In the list the minimal operations are exactly
the call entries that precede the first return entry. The search therefore:

1. scans the list from its head, trying to apply each call entry it meets to the model state;
2. when one applies, pushes (entry, previous state) on a stack, removes the call entry and its
   return entry from the list (O(1) "lifting", as in dancing links) and starts again at the head;
3. when it meets a return entry, that operation returned without having been linearized: every
   choice made at this level failed, so it pops the stack, puts the last lifted operation back
   (again O(1), in reverse order) and continues the scan just after it;
4. succeeds when every operation that has a return event has been linearized, and fails when it
   must backtrack with an empty stack.

Each path of the search is, by construction, a sequence of operations that respects real time and
is legal for the model; and since every minimal operation is tried at every level, the search finds
a linearization whenever one exists. It is sound and complete.

Lowe's memoization makes it fast. What remains to be decided after a sequence of choices depends
only on *which* operations were linearized (that set fixes the shape of the remaining list) and the
model state - not on the order in which they were linearized. The search keeps a cache of
``(linearized set as a bitset int, state)`` pairs it has entered; reaching one again means its
subtree was already explored and failed (had it succeeded the search would have stopped) or is
being explored above, so the branch is pruned. With a bounded number of concurrent clients the
number of distinct configurations grows roughly linearly with the length of the history.

FAIL and UNKNOWN operations
---------------------------
``OpStatus.FAIL`` operations definitely did not take effect (refused before being proposed): they
are dropped before the search. ``OpStatus.UNKNOWN`` ones (timeout, lost connection) may have taken
effect at any instant after their call, or never: they get a call event and no return event (a
return at +infinity), so they never force a backtrack and success does not require linearizing
them. Plain WGL handles them, but each one stays pending to the end of the history and can double
the number of configurations, so four sound reductions keep them cheap:

1. *Dropping.* An UNKNOWN ``get`` has no effect and no visible result: dropped. An UNKNOWN ``cas``
   is only linearized as a successful one (a failed one is a no-op, the same as leaving it out).
   An UNKNOWN write whose value nobody observes (no ``get`` returned it, no ``cas`` expected it) is
   dropped when the key has no failed (``b"0"``) ``cas``: in a linearization it can then only be
   followed by a ``put`` or by nothing, so removing it leaves a linearization. (A failed ``cas``
   "observes" every value but its expected one, hence the proviso.)
2. *Phases.* UNKNOWN calls live on a side list. At each level the search first tries the minimal
   operations that have a return (phase 0), and only then the UNKNOWN ones called before the first
   pending return (phase 1). Any order is complete; this one tries the needed operations first.
3. *Subsumption.* If configurations have the same set of linearized *returned* operations and the
   same state, the one with fewer linearized UNKNOWN operations can do everything the other can
   (the extra ones may simply never be linearized). So the cache maps ``(returned set, state)`` to
   the UNKNOWN sets entered with it, and prunes a configuration when a subset was entered.
4. *Canonical runs.* Take a linearization with the fewest UNKNOWN operations and, among those, with
   them as late as possible. In it, a maximal run of back-to-back UNKNOWN operations (a) never
   ends the linearization or precedes a ``put`` (the run could be removed), (b) contains after its
   first operation only ``cas`` operations, each expecting the previous one's value (an UNKNOWN
   write followed by a ``put`` could be removed), and (c) is followed by an operation that could
   *not* have been applied in the state before the run: otherwise that operation is a read that
   could be moved before the run, or the run leaves the state unchanged and could be removed.
   The search therefore only extends runs with such ``cas`` operations and ends them with such
   operations. Configurations inside a run are restricted, so they are checked against the cache
   but never recorded in it; the configurations that are recorded are unrestricted, and every
   canonical continuation of a pruned configuration is a continuation of the one that pruned it,
   so completeness is kept (an induction on the length of the shortest canonical completion).

Equal timestamps
----------------
Events are sorted by time with *calls before returns* at equal timestamps: an operation that
returned at ``t`` and another called at ``t`` are treated as concurrent. Two events carrying the
same timestamp (a manual clock in a simulator, a coarse clock in an integration test) cannot be
ordered by real time, and treating them as overlapping only *adds* candidate linearizations. So a
violation reported by the checker is a violation under every way of ordering the tied events: the
checker never raises a false alarm because of a tie; the price is that it may miss a violation
that only exists if the tie is broken one particular way. Recorders that want the stricter order
should take timestamps from a strictly increasing clock.

Budgets
-------
The search is exponential in the worst case. ``max_steps`` bounds the number of list entries the
search examines per key; it is deterministic, so a run that times out times out identically on every
machine, which is what simulator seeds need. ``timeout_s`` is a wall-clock deadline for the whole
check (checked every few thousand steps); prefer ``max_steps``. When a budget is exhausted the key
is *undecided*: if no other key failed, the result is ``ok=True, timed_out=True`` - "no violation
found", not "linearizable". Callers that require a verdict must assert ``not result.timed_out``.

References: Wing & Gong, "Testing and verifying concurrent objects" (1993); Lowe, "Testing for
linearizability" (2017); the porcupine and Knossos checkers, which use the same search.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "CheckResult",
    "OpStatus",
    "Operation",
    "Recorder",
    "check",
    "describe",
]

_KINDS = frozenset({"put", "get", "cas"})
_CAS_OK = b"1"
_CAS_MISMATCH = b"0"

# Operations and lines shown in a failure explanation; longer lists are elided.
_MAX_PREFIX_SHOWN = 20
_MAX_PENDING_SHOWN = 30
# How often (in steps) the wall-clock deadline is consulted: a mask, so a power of two minus one.
_CLOCK_CHECK_MASK = 4095


class OpStatus(Enum):
    """How an operation ended, as far as the client knows."""

    OK = "ok"  # completed with a known result
    FAIL = "fail"  # definitely did not take effect; dropped from the history
    UNKNOWN = "unknown"  # may have taken effect at any point after its call, or never


@dataclass(frozen=True)
class Operation:
    """One client operation on one key.

    Invariants (checked on construction): ``kind`` is ``"put"``, ``"get"`` or ``"cas"``; ``ret`` is
    ``None`` iff ``status`` is UNKNOWN, and otherwise ``ret >= call``; a completed ``cas`` has
    output ``b"1"`` (swapped) or ``b"0"`` (mismatch).
    """

    client: int
    key: str
    kind: str
    value: bytes | None  # put: the value written (None deletes); cas: the new value
    expected: bytes | None  # cas only: the value compared against; None means "key absent"
    output: bytes | None  # get: the value read (None = not found); cas: b"1" / b"0"
    call: float
    ret: float | None
    status: OpStatus

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown operation kind {self.kind!r}")
        if (self.ret is None) != (self.status is OpStatus.UNKNOWN):
            raise ValueError(f"ret must be None exactly when the status is UNKNOWN: {self}")
        if self.ret is not None and self.ret < self.call:
            raise ValueError(f"operation returned before it was called: {self}")
        if (
            self.kind == "cas"
            and self.status is OpStatus.OK
            and self.output not in (_CAS_OK, _CAS_MISMATCH)
        ):
            raise ValueError(f"a completed cas must output b'1' or b'0': {self}")


@dataclass(frozen=True)
class CheckResult:
    """The verdict of `check`.

    ``ok`` is False only for a proven violation; ``key`` then names the first failing key (in order
    of first appearance in the history) and ``explanation`` shows the operations of that key that
    could not be linearized and the longest linearizable prefix found. ``timed_out`` means some key
    exhausted its budget: with ``ok=True`` the verdict is "no violation found", not a proof.
    """

    ok: bool
    key: str | None
    explanation: str
    ops_checked: int
    timed_out: bool


def check(
    history: Sequence[Operation],
    *,
    max_steps: int | None = None,
    timeout_s: float | None = None,
) -> CheckResult:
    """Check that ``history`` is linearizable for a key-value store of registers.

    ``max_steps`` bounds the search per key (deterministic); ``timeout_s`` bounds the whole check
    by wall clock. With neither, the search runs to a verdict.
    """
    if max_steps is not None and max_steps < 1:
        raise ValueError("max_steps must be positive")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    by_key: dict[str, list[Operation]] = {}
    for op in history:
        ops = by_key.setdefault(op.key, [])
        if op.status is not OpStatus.FAIL:
            ops.append(op)

    checked = 0
    undecided: list[str] = []
    for key, ops in by_key.items():
        outcome = _check_key(ops, max_steps, deadline)
        checked += len(ops)
        if outcome.verdict == "fail":
            return CheckResult(
                ok=False,
                key=key,
                explanation=_explain(key, ops, outcome),
                ops_checked=checked,
                timed_out=bool(undecided),
            )
        if outcome.verdict == "timeout":
            undecided.append(key)

    if undecided:
        shown = ", ".join(repr(k) for k in undecided[:10])
        more = f" and {len(undecided) - 10} more" if len(undecided) > 10 else ""
        explanation = (
            f"no violation found, but the search budget ran out on key(s) {shown}{more}: "
            "the result is unknown"
        )
    else:
        explanation = f"linearizable: {checked} operations on {len(by_key)} key(s)"
    return CheckResult(
        ok=True, key=None, explanation=explanation, ops_checked=checked, timed_out=bool(undecided)
    )


# ---------------------------------------------------------------------------------------------
# The search for one key.

# Model operation codes, precomputed per operation so the inner loop does no string compares.
_PUT = 0
_GET = 1
_CAS_SWAP = 2  # a cas that must find `expected` and write `value` (OK b"1", or UNKNOWN)
_CAS_FAIL = 3  # a cas that must find anything but `expected` and write nothing


# A search stack frame: (call entry lifted, scan phase it was chosen in, and from before it: the
# state, the phase-1 bound, in_run and run_from).
_Frame = tuple[int, int, bytes | None, int, bool, bytes | None]


@dataclass(frozen=True)
class _DeadEnd:
    """The deepest point where the search had to backtrack (or, on success, the end)."""

    depth: int
    prefix: tuple[Operation, ...]  # the linearizable prefix reached, in linearization order
    stuck: Operation | None  # the operation whose return was reached without linearizing it
    candidates: tuple[Operation, ...]  # every pending operation called before that, call order


@dataclass(frozen=True)
class _KeyOutcome:
    verdict: str  # "ok" | "fail" | "timeout"
    steps: int
    deepest: _DeadEnd


def _relevant(ops: Sequence[Operation]) -> list[Operation]:
    """Drop the UNKNOWN operations that cannot matter (see the module docstring)."""
    observed: set[bytes | None] = set()
    has_failed_cas = False
    for op in ops:
        if op.kind == "get" and op.status is OpStatus.OK:
            observed.add(op.output)
        elif op.kind == "cas":
            observed.add(op.expected)
            if op.status is OpStatus.OK and op.output == _CAS_MISMATCH:
                has_failed_cas = True
    kept = []
    for op in ops:
        if op.status is OpStatus.UNKNOWN:
            if op.kind == "get":
                continue
            if not has_failed_cas and op.value not in observed:
                continue
        kept.append(op)
    return kept


def _check_key(
    all_ops: Sequence[Operation], max_steps: int | None, deadline: float | None
) -> _KeyOutcome:
    ops = sorted(_relevant(all_ops), key=lambda o: o.call)  # stable: ties keep history order
    n = len(ops)
    code: list[int] = []
    for op in ops:
        if op.kind == "put":
            code.append(_PUT)
        elif op.kind == "get":
            code.append(_GET)
        elif op.status is OpStatus.UNKNOWN or op.output == _CAS_OK:
            code.append(_CAS_SWAP)
        else:
            code.append(_CAS_FAIL)
    value = [op.value for op in ops]
    expected = [op.expected for op in ops]
    output = [op.output for op in ops]
    unknown = [1 if op.status is OpStatus.UNKNOWN else 0 for op in ops]
    bit = [1 << i for i in range(n)]

    # Events sorted by (time, call-before-return, operation index); see "Equal timestamps". An
    # event's index in this order is its rank, so "event a precedes event b" is simply a < b.
    raw: list[tuple[float, int, int]] = []
    for i, op in enumerate(ops):
        raw.append((op.call, 0, i))
        if op.ret is not None:
            raw.append((op.ret, 1, i))
    raw.sort()
    n_ev = len(raw)
    ev_op = [i for _, _, i in raw]
    ev_is_ret = [kind for _, kind, _ in raw]
    ret_ev = [-1] * n  # operation -> its return event, if any
    for e, (_, kind, i) in enumerate(raw):
        if kind:
            ret_ev[i] = e
    partner = [ret_ev[ev_op[e]] if not ev_is_ret[e] else -1 for e in range(n_ev)]

    # Two doubly linked lists over the events, sharing the `nxt`/`prv` arrays: the main list holds
    # the calls and returns of operations that have a return; the side list holds the calls of
    # UNKNOWN operations, so that phase 0 (below) never has to step over them. Both are in rank
    # order; `head` and `side` are their sentinels and -1 ends a list.
    head, side = n_ev, n_ev + 1
    nxt = [-1] * (n_ev + 2)
    prv = [-1] * (n_ev + 2)
    tails = {head: head, side: side}
    for e in range(n_ev):
        lst = side if unknown[ev_op[e]] else head
        nxt[tails[lst]] = e
        prv[e] = tails[lst]
        tails[lst] = e

    remaining = n - sum(unknown)  # operations with a return that are not linearized yet
    lin_known = 0  # bitset of linearized operations that have a return
    lin_unknown = 0  # bitset of linearized UNKNOWN operations
    state: bytes | None = None  # the register: None means "absent"
    # A run is a sequence of UNKNOWN operations linearized back to back; `run_from` is the state
    # before it. Configurations inside a run are restricted (see "Canonical runs").
    in_run = False
    run_from: bytes | None = None
    # (lin_known, state) -> lin_unknown sets of unrestricted configurations entered with it, none a
    # subset of another.
    cache: dict[tuple[int, bytes | None], list[int]] = {}
    stack: list[_Frame] = []
    deepest = _DeadEnd(-1, (), None, ())

    # Phase 0 scans the main list and tries the calls before its first return entry. Reaching that
    # entry, phase 1 scans the side list and tries the UNKNOWN calls that precede it (`bound`);
    # running past it means every candidate failed at this level: backtrack.
    phase = 0
    bound = -1
    entry = nxt[head]
    steps = 0
    budget = max_steps if max_steps is not None else -1
    while remaining:
        steps += 1
        if (budget >= 0 and steps > budget) or (
            deadline is not None and not steps & _CLOCK_CHECK_MASK and time.monotonic() > deadline
        ):
            return _KeyOutcome("timeout", steps, deepest)
        if phase == 0:
            if ev_is_ret[entry]:
                phase = 1
                bound = entry
                entry = nxt[side]
                continue
        elif entry == -1 or entry > bound:
            if len(stack) > deepest.depth:
                deepest = _dead_end(ops, ev_op, nxt, head, side, stack, bound)
            if not stack:
                return _KeyOutcome("fail", steps, deepest)
            entry, phase, state, bound, in_run, run_from = stack.pop()
            i = ev_op[entry]
            if unknown[i]:
                lin_unknown ^= bit[i]
            else:
                lin_known ^= bit[i]
                remaining += 1
            # Unlift: relink the return entry, then the call entry (the reverse of lifting).
            r = partner[entry]
            if r != -1:
                nxt[prv[r]] = r
                if nxt[r] != -1:
                    prv[nxt[r]] = r
            nxt[prv[entry]] = entry
            if nxt[entry] != -1:
                prv[nxt[entry]] = entry
            entry = nxt[entry]
            continue

        i = ev_op[entry]
        c = code[i]
        if in_run and (
            # Inside a run the next UNKNOWN operation must be a cas reading the run's last value;
            # the known operation ending it must read a value it could not read before the run.
            (c != _CAS_SWAP)
            if phase
            else (
                c == _PUT
                or (c == _GET and run_from == output[i])
                or (c == _CAS_SWAP and run_from == expected[i])
                or (c == _CAS_FAIL and run_from != expected[i])
            )
        ):
            entry = nxt[entry]
            continue
        if c == _PUT:
            applies = True
            new_state = value[i]
        elif c == _GET:
            applies = state == output[i]
            new_state = state
        elif c == _CAS_SWAP:
            applies = state == expected[i]
            new_state = value[i]
        else:
            applies = state != expected[i]
            new_state = state
        if applies:
            if phase:
                new_known, new_unknown = lin_known, lin_unknown | bit[i]
            else:
                new_known, new_unknown = lin_known | bit[i], lin_unknown
            # Lowe's cache with subsumption: prune if an unrestricted configuration with the same
            # known set and state and a subset of these UNKNOWN operations was entered. Only
            # unrestricted configurations (phase-0 children) are recorded.
            config = (new_known, new_state)
            seen = cache.get(config)
            fresh = True
            if seen is None:
                if not phase:
                    cache[config] = [new_unknown]
            else:
                for u in seen:
                    if not u & ~new_unknown:
                        fresh = False
                        break
                if fresh and not phase:
                    seen[:] = [u for u in seen if new_unknown & ~u]
                    seen.append(new_unknown)
            if fresh:
                stack.append((entry, phase, state, bound, in_run, run_from))
                if phase:
                    if not in_run:
                        in_run = True
                        run_from = state
                else:
                    in_run = False
                    remaining -= 1
                lin_known, lin_unknown = new_known, new_unknown
                state = new_state
                # Lift: unlink the call entry, then its return entry.
                p, q = prv[entry], nxt[entry]
                nxt[p] = q
                if q != -1:
                    prv[q] = p
                r = partner[entry]
                if r != -1:
                    p, q = prv[r], nxt[r]
                    nxt[p] = q
                    if q != -1:
                        prv[q] = p
                phase = 0
                entry = nxt[head]
                continue
        entry = nxt[entry]

    return _KeyOutcome("ok", steps, _DeadEnd(len(stack), _ops_of(ops, ev_op, stack), None, ()))


def _ops_of(
    ops: Sequence[Operation],
    ev_op: Sequence[int],
    stack: Sequence[_Frame],
) -> tuple[Operation, ...]:
    return tuple(ops[ev_op[frame[0]]] for frame in stack)


def _dead_end(
    ops: Sequence[Operation],
    ev_op: Sequence[int],
    nxt: Sequence[int],
    head: int,
    side: int,
    stack: Sequence[_Frame],
    bound: int,
) -> _DeadEnd:
    """Describe the current dead end: the operation whose return entry `bound` stopped the scan
    and every candidate that was called before it."""
    candidates = []
    for start in (head, side):
        e = nxt[start]
        while e != -1 and e < bound:
            candidates.append(ops[ev_op[e]])
            e = nxt[e]
    candidates.sort(key=lambda o: o.call)
    return _DeadEnd(len(stack), _ops_of(ops, ev_op, stack), ops[ev_op[bound]], tuple(candidates))


# ---------------------------------------------------------------------------------------------
# Explanations.


def _fmt_time(t: float | None) -> str:
    return "?" if t is None else f"{t:g}"


def describe(op: Operation) -> str:
    """One line for an operation, e.g. ``c3 cas(b'a' -> b'b') = swapped [1.5, 2]``."""
    if op.kind == "put":
        body = f"put({op.value!r})"
        result = ""
    elif op.kind == "get":
        body = "get()"
        result = f" = {op.output!r}" if op.status is OpStatus.OK else ""
    else:
        body = f"cas({op.expected!r} -> {op.value!r})"
        if op.status is OpStatus.OK:
            result = " = swapped" if op.output == _CAS_OK else " = mismatch"
        else:
            result = ""
    status = "" if op.status is OpStatus.OK else f" ({op.status.value})"
    return f"c{op.client} {body}{result} [{_fmt_time(op.call)}, {_fmt_time(op.ret)}]{status}"


def _explain(key: str, ops: Sequence[Operation], outcome: _KeyOutcome) -> str:
    lines = [f"key {key!r} is not linearizable ({len(ops)} operations, {outcome.steps} steps)."]
    dead_end = outcome.deepest
    if dead_end.stuck is not None:
        lines.append(
            "After the prefix below, none of these pending operations could be linearized next, "
            "and the one marked * had already returned:"
        )
        blocked = dead_end.candidates
        for op in blocked[:_MAX_PENDING_SHOWN]:
            marker = "  * " if op is dead_end.stuck else "    "
            lines.append(marker + describe(op))
        if len(blocked) > _MAX_PENDING_SHOWN:
            lines.append(f"    ... and {len(blocked) - _MAX_PENDING_SHOWN} more")
    prefix = dead_end.prefix
    lines.append(f"Longest linearizable prefix found ({len(prefix)} operations):")
    if len(prefix) > _MAX_PREFIX_SHOWN:
        lines.append(f"    ... {len(prefix) - _MAX_PREFIX_SHOWN} earlier operations")
    for op in prefix[-_MAX_PREFIX_SHOWN:]:
        lines.append("    " + describe(op))
    if not prefix:
        lines.append("    (none: the register starts absent)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Recording histories.


@dataclass(frozen=True)
class _Invocation:
    client: int
    key: str
    kind: str
    value: bytes | None
    expected: bytes | None
    call: float


class Recorder:
    """Builds a history as operations are invoked and complete.

    ``invoke`` returns a handle; each handle is resolved at most once by ``ok``, ``fail`` or
    ``unknown``. An operation still unresolved when ``history()`` is called (its client crashed or
    the test ended first) is reported as UNKNOWN - it may have taken effect. Safe to use from
    several threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[_Invocation] = []  # indexed by handle
        self._results: dict[int, tuple[OpStatus, bytes | None, float | None]] = {}

    def invoke(
        self,
        client: int,
        key: str,
        kind: str,
        value: bytes | None = None,
        expected: bytes | None = None,
        *,
        now: float,
    ) -> int:
        if kind not in _KINDS:
            raise ValueError(f"unknown operation kind {kind!r}")
        with self._lock:
            self._calls.append(_Invocation(client, key, kind, value, expected, now))
            return len(self._calls) - 1

    def ok(self, handle: int, output: bytes | None, now: float) -> None:
        """The operation completed: ``output`` is the value read (get), b"1"/b"0" (cas), or None."""
        self._resolve(handle, OpStatus.OK, output, now)

    def fail(self, handle: int, now: float) -> None:
        """The operation definitely did not take effect."""
        self._resolve(handle, OpStatus.FAIL, None, now)

    def unknown(self, handle: int) -> None:
        """The outcome is unknown (timeout, lost connection)."""
        self._resolve(handle, OpStatus.UNKNOWN, None, None)

    def _resolve(
        self, handle: int, status: OpStatus, output: bytes | None, now: float | None
    ) -> None:
        with self._lock:
            if not 0 <= handle < len(self._calls):
                raise ValueError(f"no such operation handle {handle}")
            if handle in self._results:
                raise ValueError(f"operation {handle} was already resolved")
            self._results[handle] = (status, output, now)

    def history(self) -> list[Operation]:
        with self._lock:
            calls = list(self._calls)
            results = dict(self._results)
        out = []
        for handle, inv in enumerate(calls):
            status, output, ret = results.get(handle, (OpStatus.UNKNOWN, None, None))
            out.append(
                Operation(
                    client=inv.client,
                    key=inv.key,
                    kind=inv.kind,
                    value=inv.value,
                    expected=inv.expected,
                    output=output,
                    call=inv.call,
                    ret=ret,
                    status=status,
                )
            )
        return out
