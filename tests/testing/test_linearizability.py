"""Tests for the linearizability checker: hand-written histories, a brute-force differential test,
histories generated from a real sequential execution, and a performance bound."""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections.abc import Sequence

import pytest

from service.testing.linearizability import (
    CheckResult,
    Operation,
    OpStatus,
    Recorder,
    check,
)

OK = OpStatus.OK
FAIL = OpStatus.FAIL
UNKNOWN = OpStatus.UNKNOWN


def put(
    value: bytes | None,
    call: float,
    ret: float | None,
    *,
    key: str = "k",
    client: int = 0,
    status: OpStatus = OK,
) -> Operation:
    return Operation(client, key, "put", value, None, None, call, ret, status)


def get(
    output: bytes | None,
    call: float,
    ret: float | None,
    *,
    key: str = "k",
    client: int = 1,
    status: OpStatus = OK,
) -> Operation:
    return Operation(client, key, "get", None, None, output, call, ret, status)


def cas(
    expected: bytes | None,
    value: bytes | None,
    output: bytes | None,
    call: float,
    ret: float | None,
    *,
    key: str = "k",
    client: int = 2,
    status: OpStatus = OK,
) -> Operation:
    return Operation(client, key, "cas", value, expected, output, call, ret, status)


def assert_ok(result: CheckResult) -> None:
    assert result.ok, result.explanation
    assert not result.timed_out


def assert_violation(result: CheckResult, key: str = "k") -> None:
    assert not result.ok
    assert not result.timed_out
    assert result.key == key
    assert repr(key) in result.explanation


# --- Sequential histories -----------------------------------------------------------------------


def test_empty_history_is_linearizable() -> None:
    result = check([])
    assert_ok(result)
    assert result.ops_checked == 0


def test_sequential_put_then_get_of_the_value() -> None:
    assert_ok(check([put(b"1", 0, 1), get(b"1", 2, 3)]))


def test_sequential_put_then_get_of_another_value_fails() -> None:
    assert_violation(check([put(b"1", 0, 1), get(b"2", 2, 3)]))


def test_get_of_never_written_key_must_be_absent() -> None:
    assert_ok(check([get(None, 0, 1)]))
    assert_violation(check([get(b"ghost", 0, 1)]))


def test_put_none_deletes() -> None:
    assert_ok(check([put(b"1", 0, 1), put(None, 2, 3), get(None, 4, 5)]))
    assert_violation(check([put(b"1", 0, 1), put(None, 2, 3), get(b"1", 4, 5)]))


# --- Concurrency ----------------------------------------------------------------------------------


@pytest.mark.parametrize("read", [b"old", b"new"])
def test_get_overlapping_a_put_may_read_old_or_new(read: bytes) -> None:
    history = [put(b"old", 0, 1), put(b"new", 2, 5), get(read, 3, 4)]
    assert_ok(check(history))


def test_get_overlapping_a_put_cannot_read_a_third_value() -> None:
    history = [put(b"old", 0, 1), put(b"new", 2, 5), get(b"other", 3, 4)]
    assert_violation(check(history))


def test_stale_read_after_completed_put_is_a_violation() -> None:
    history = [
        put(b"0", 0, 1, key="x"),
        put(b"1", 2, 3, key="x"),
        get(b"0", 4, 5, key="x"),  # put(1) completed before this get was called
    ]
    result = check(history)
    assert_violation(result, key="x")
    assert "get() = b'0'" in result.explanation
    assert "Longest linearizable prefix" in result.explanation


def test_two_overlapping_reads_cannot_disagree_with_real_time_order() -> None:
    # Both reads overlap the put, but the first read (seeing new) returned before the second
    # (seeing old) was called: new-then-old is impossible.
    history = [
        put(b"old", 0, 1),
        put(b"new", 2, 10),
        get(b"new", 3, 4, client=1),
        get(b"old", 5, 6, client=2),
    ]
    assert_violation(check(history))
    history[2], history[3] = get(b"old", 3, 4, client=1), get(b"new", 5, 6, client=2)
    assert_ok(check(history))


def test_equal_timestamps_are_treated_as_overlapping() -> None:
    # put returns at t=1 and get is called at t=1: they are concurrent (documented choice), so
    # reading the old (absent) value is allowed. With a gap the same read is stale.
    assert_ok(check([put(b"1", 0, 1), get(None, 1, 2)]))
    assert_violation(check([put(b"1", 0, 1), get(None, 1.5, 2)]))


# --- UNKNOWN and FAIL -----------------------------------------------------------------------------


@pytest.mark.parametrize("read", [b"0", b"1"])
def test_unknown_put_may_or_may_not_be_seen(read: bytes) -> None:
    history = [put(b"0", 0, 1), put(b"1", 2, None, status=UNKNOWN), get(read, 100, 101)]
    assert_ok(check(history))


def test_unknown_put_takes_effect_after_its_call_only() -> None:
    history = [put(b"1", 5, None, status=UNKNOWN), get(b"1", 0, 1)]
    assert_violation(check(history))


def test_unknown_put_seen_then_unseen_is_a_violation() -> None:
    history = [
        put(b"0", 0, 1),
        put(b"1", 2, None, status=UNKNOWN),
        get(b"1", 10, 11),
        get(b"0", 12, 13),
    ]
    assert_violation(check(history))
    # Unseen then seen is fine: it took effect between the reads.
    history[2], history[3] = get(b"0", 10, 11), get(b"1", 12, 13)
    assert_ok(check(history))


def test_chain_of_unknown_cas() -> None:
    history = [
        put(b"a", 0, 1),
        cas(b"a", b"b", None, 2, None, status=UNKNOWN, client=1),
        cas(b"b", b"c", None, 3, None, status=UNKNOWN, client=2),
        get(b"b", 10, 11),
        get(b"c", 12, 13),
    ]
    assert_ok(check(history))
    history[3], history[4] = get(b"c", 10, 11), get(b"b", 12, 13)
    assert_violation(check(history))
    # Nobody saw b"b": both cas took effect back to back.
    history[3], history[4] = get(b"c", 10, 11), get(b"c", 12, 13)
    assert_ok(check(history))
    # ... which needs the first to be callable before the second is read.
    history[1] = cas(b"a", b"b", None, 20, None, status=UNKNOWN, client=1)
    assert_violation(check(history))


def test_unknown_get_constrains_nothing() -> None:
    assert_ok(check([put(b"1", 0, 1), get(None, 2, None, status=UNKNOWN)]))


def test_unobserved_unknown_put_still_explains_a_failed_cas() -> None:
    # b"b" is never read, but the mismatching cas needs it to have taken effect: the checker must
    # not drop it as irrelevant.
    history = [
        put(b"a", 0, 1),
        put(b"b", 2, None, status=UNKNOWN),
        cas(b"a", b"c", b"0", 3, 4),
    ]
    assert_ok(check(history))
    history[1] = put(b"b", 2, 2.5, status=FAIL)
    assert_violation(check(history))


def test_fail_put_is_never_observed() -> None:
    history = [put(b"0", 0, 1), put(b"1", 2, 3, status=FAIL), get(b"0", 4, 5)]
    assert_ok(check(history))
    history[2] = get(b"1", 4, 5)
    assert_violation(check(history))


def test_fail_ops_are_not_counted() -> None:
    history = [put(b"0", 0, 1), put(b"1", 2, 3, status=FAIL)]
    assert check(history).ops_checked == 1


# --- Compare-and-set ------------------------------------------------------------------------------


def test_cas_swaps_when_expected_matches() -> None:
    history = [put(b"a", 0, 1), cas(b"a", b"b", b"1", 2, 3), get(b"b", 4, 5)]
    assert_ok(check(history))


def test_cas_on_absent_key_with_expected_none() -> None:
    assert_ok(check([cas(None, b"x", b"1", 0, 1), get(b"x", 2, 3)]))
    assert_violation(check([cas(None, b"x", b"0", 0, 1)]))


def test_cas_cannot_succeed_on_mismatch() -> None:
    assert_violation(check([put(b"a", 0, 1), cas(b"z", b"b", b"1", 2, 3)]))


def test_cas_cannot_fail_on_match() -> None:
    assert_violation(check([put(b"a", 0, 1), cas(b"a", b"b", b"0", 2, 3)]))


def test_failed_cas_writes_nothing() -> None:
    history = [put(b"a", 0, 1), cas(b"z", b"b", b"0", 2, 3), get(b"b", 4, 5)]
    assert_violation(check(history))
    history[2] = get(b"a", 4, 5)
    assert_ok(check(history))


def test_only_one_of_two_concurrent_cas_can_win() -> None:
    history = [
        put(b"a", 0, 1),
        cas(b"a", b"b", b"1", 2, 5, client=1),
        cas(b"a", b"c", b"1", 2, 5, client=2),
    ]
    assert_violation(check(history))
    history[2] = cas(b"a", b"c", b"0", 2, 5, client=2)
    assert_ok(check(history))


def test_unknown_cas_may_have_swapped() -> None:
    history = [put(b"a", 0, 1), cas(b"a", b"b", None, 2, None, status=UNKNOWN), get(b"b", 9, 10)]
    assert_ok(check(history))
    # ... but only if its expected value was there.
    history[1] = cas(b"z", b"b", None, 2, None, status=UNKNOWN)
    assert_violation(check(history))


# --- Partitioning and reporting -------------------------------------------------------------------


def test_violation_on_one_key_is_reported_on_that_key() -> None:
    history = [
        put(b"1", 0, 1, key="a"),
        put(b"1", 0, 1, key="b"),
        get(b"1", 2, 3, key="a"),
        get(b"stale", 2, 3, key="b"),
    ]
    result = check(history)
    assert_violation(result, key="b")
    assert "'a'" not in result.explanation


def test_keys_are_independent_registers() -> None:
    # A value written to "a" is not visible under "b".
    assert_violation(check([put(b"1", 0, 1, key="a"), get(b"1", 2, 3, key="b")]), key="b")


def test_explanation_lists_the_stuck_operations_in_call_order() -> None:
    history = [
        put(b"1", 0, 1, client=0),
        get(b"1", 2, 3, client=1),
        get(b"9", 4, 7, client=2),
        get(b"2", 5, 8, client=3),  # impossible too, but returns later
    ]
    result = check(history)
    assert_violation(result)
    lines = result.explanation.splitlines()
    stuck_at = lines.index(next(line for line in lines if "b'9'" in line))
    assert lines[stuck_at].startswith("  * ")
    assert "get() = b'2'" in lines[stuck_at + 1]  # later call, listed after
    prefix_at = lines.index(next(line for line in lines if line.startswith("Longest")))
    assert "(2 operations)" in lines[prefix_at]
    assert "put(b'1')" in lines[prefix_at + 1]
    assert "get() = b'1'" in lines[prefix_at + 2]


def test_operation_invariants_are_checked() -> None:
    with pytest.raises(ValueError):
        Operation(0, "k", "delete", None, None, None, 0, 1, OK)
    with pytest.raises(ValueError):
        put(b"1", 0, None)  # OK without a return time
    with pytest.raises(ValueError):
        put(b"1", 0, 1, status=UNKNOWN)  # UNKNOWN with a return time
    with pytest.raises(ValueError):
        put(b"1", 2, 1)  # returned before called
    with pytest.raises(ValueError):
        cas(b"a", b"b", b"yes", 0, 1)


# --- Recorder -------------------------------------------------------------------------------------


def test_recorder_builds_a_history() -> None:
    rec = Recorder()
    a = rec.invoke(1, "k", "put", b"1", now=0.0)
    b = rec.invoke(2, "k", "get", now=0.5)
    c = rec.invoke(3, "k", "cas", b"2", b"1", now=0.6)
    d = rec.invoke(4, "k", "put", b"9", now=0.7)
    e = rec.invoke(5, "k", "put", b"8", now=0.8)
    rec.ok(a, None, 1.0)
    rec.ok(b, b"1", 2.0)
    rec.unknown(c)
    rec.fail(d, 0.9)
    # e is never resolved: reported as UNKNOWN.
    history = rec.history()
    assert [op.status for op in history] == [OK, OK, UNKNOWN, FAIL, UNKNOWN]
    assert history[1] == get(b"1", 0.5, 2.0, client=2)
    assert history[2] == cas(b"1", b"2", None, 0.6, None, client=3, status=UNKNOWN)
    assert history[3].ret == 0.9
    assert history[4].ret is None
    assert_ok(check(history))
    with pytest.raises(ValueError):
        rec.ok(a, None, 3.0)
    with pytest.raises(ValueError):
        rec.fail(99, 3.0)
    with pytest.raises(ValueError):
        rec.invoke(1, "k", "delete", now=4.0)
    assert e == 4


# --- Differential test against brute force --------------------------------------------------------


def brute_force_linearizable(history: Sequence[Operation]) -> bool:
    """Try every subset of UNKNOWN operations and every order; full cas semantics for UNKNOWN."""
    known = [op for op in history if op.status is OK]
    maybe = [op for op in history if op.status is UNKNOWN]
    for r in range(len(maybe) + 1):
        for chosen in itertools.combinations(maybe, r):
            ops = known + list(chosen)
            for order in itertools.permutations(ops):
                if _respects_real_time(order) and _legal(order):
                    return True
    return False


def _respects_real_time(order: Sequence[Operation]) -> bool:
    for i, later in enumerate(order):
        for earlier in order[i + 1 :]:
            if earlier.ret is not None and earlier.ret < later.call:
                return False
    return True


def _legal(order: Sequence[Operation]) -> bool:
    state: bytes | None = None
    for op in order:
        if op.kind == "put":
            state = op.value
        elif op.kind == "get":
            if op.status is OK and op.output != state:
                return False
        else:
            swapped = state == op.expected
            if op.status is OK and op.output != (b"1" if swapped else b"0"):
                return False
            if swapped:
                state = op.value
    return True


def random_small_history(rng: random.Random, n_ops: int) -> list[Operation]:
    """Arbitrary (mostly not linearizable) histories over few values, with many UNKNOWN ops and
    integer timestamps so that equal timestamps are common."""
    values: list[bytes | None] = [None, b"a", b"b", b"c"][: rng.randint(2, 4)]
    history = []
    for client in range(n_ops):
        call = float(rng.randint(0, 10))
        status = rng.choice([OK, OK, OK, UNKNOWN, UNKNOWN, FAIL])
        ret = None if status is UNKNOWN else call + rng.randint(0, 5)
        kind = rng.choice(["put", "get", "cas", "cas"])
        if kind == "put":
            op = put(rng.choice(values), call, ret, client=client, status=status)
        elif kind == "get":
            output = rng.choice(values) if status is OK else None
            op = get(output, call, ret, client=client, status=status)
        else:
            output = rng.choice([b"0", b"1"]) if status is OK else None
            op = cas(
                rng.choice(values),
                rng.choice(values),
                output,
                call,
                ret,
                client=client,
                status=status,
            )
        history.append(op)
    return history


def test_agrees_with_brute_force_on_small_random_histories() -> None:
    rng = random.Random(20240611)
    verdicts = {True: 0, False: 0}
    for _ in range(1500):
        history = random_small_history(rng, rng.randint(1, 7))
        expected = brute_force_linearizable([op for op in history if op.status is not FAIL])
        result = check(history)
        assert not result.timed_out
        assert result.ok == expected, (history, result.explanation)
        verdicts[expected] += 1
    # The generator exercises both outcomes.
    assert verdicts[True] > 300 and verdicts[False] > 300, verdicts


# --- Histories generated from a real sequential execution ---------------------------------------


def generate_history(
    rng: random.Random,
    n_ops: int,
    n_clients: int,
    keys: Sequence[str] = ("k",),
    unknown_rate: float = 0.0,
    fail_rate: float = 0.0,
) -> list[Operation]:
    """Clients issue operations one at a time; each takes effect at a random instant inside its
    interval, and outputs come from applying the operations to a dict in the order of those
    instants. UNKNOWN operations take effect or not at random; FAIL operations never do."""
    free = [0.0] * n_clients
    plans = []  # (linearization point, index, client, key, kind, call, ret, status, applies)
    for index in range(n_ops):
        client = min(range(n_clients), key=lambda c: free[c])
        call = free[client] + rng.uniform(0.0, 0.5)
        ret = call + rng.uniform(0.05, 3.0)
        free[client] = ret
        kind = rng.choice(["put", "put", "get", "get", "get", "cas"])
        roll = rng.random()
        if roll < unknown_rate:
            status, applies = UNKNOWN, rng.random() < 0.5
        elif roll < unknown_rate + fail_rate:
            status, applies = FAIL, False
        else:
            status, applies = OK, True
        point = rng.uniform(call, ret)
        plans.append((point, index, client, rng.choice(keys), kind, call, ret, status, applies))

    store: dict[str, bytes] = {}
    ops: list[Operation] = []
    for point, index, client, key, kind, call, ret, status, applies in sorted(plans):
        del point
        current = store.get(key)
        value: bytes | None = None
        expected: bytes | None = None
        output: bytes | None = None
        if kind == "put":
            value = b"v%d" % index
            if applies:
                store[key] = value
        elif kind == "get":
            output = current
        else:
            value = b"c%d" % index
            # Expect the current value half the time, some other value otherwise.
            expected = current if rng.random() < 0.5 else rng.choice([None, b"v%d" % (index - 1)])
            swapped = expected == current
            output = b"1" if swapped else b"0"
            if swapped and applies:
                store[key] = value
        if status is UNKNOWN:
            output = None
        ops.append(
            Operation(
                client,
                key,
                kind,
                value,
                expected,
                output if status is OK else None,
                call,
                None if status is UNKNOWN else ret,
                status,
            )
        )
    ops.sort(key=lambda o: o.call)
    return ops


def mutate_one_read(rng: random.Random, history: list[Operation]) -> tuple[list[Operation], str]:
    reads = [i for i, op in enumerate(history) if op.kind == "get" and op.status is OK]
    i = rng.choice(reads)
    mutated = list(history)
    mutated[i] = dataclasses.replace(history[i], output=b"never-written")
    return mutated, history[i].key


@pytest.mark.parametrize("seed", range(12))
def test_generated_histories_are_linearizable_and_mutants_are_not(seed: int) -> None:
    rng = random.Random(seed)
    history = generate_history(
        rng,
        n_ops=rng.randint(20, 300),
        n_clients=rng.randint(1, 8),
        keys=["a", "b", "c"][: rng.randint(1, 3)],
        unknown_rate=0.1 if seed % 2 else 0.0,
        fail_rate=0.1 if seed % 3 else 0.0,
    )
    assert_ok(check(history))
    mutated, key = mutate_one_read(rng, history)
    assert_violation(check(mutated), key=key)


@pytest.mark.parametrize("seed", range(4))
def test_generated_histories_with_a_delayed_read_are_caught(seed: int) -> None:
    # A subtler mutant than an impossible value: a read keeps its output but is moved to after a
    # put that really followed the write it observed. Values are unique, so it is now stale.
    rng = random.Random(1000 + seed)
    history = generate_history(rng, n_ops=150, n_clients=4)
    written_at: dict[bytes | None, float] = {None: float("-inf")}  # value -> its writer's return
    for op in history:
        wrote = op.kind == "put" or (op.kind == "cas" and op.output == b"1")
        if wrote and op.ret is not None:
            written_at[op.value] = op.ret
    delayable = []
    for i, read in enumerate(history):
        if read.kind != "get":
            continue
        overwrite = next(
            (w for w in history if w.kind == "put" and w.call > written_at[read.output]), None
        )
        if overwrite is not None and overwrite.ret is not None:
            delayable.append((i, overwrite.ret))
    assert len(delayable) >= 10
    for i, after in rng.sample(delayable, 10):
        mutated = list(history)
        mutated[i] = dataclasses.replace(history[i], call=after + 0.01, ret=after + 0.02)
        assert_violation(check(mutated))


# --- Budget and performance -----------------------------------------------------------------------


def test_exhausted_step_budget_is_reported_as_unknown() -> None:
    rng = random.Random(7)
    history = generate_history(rng, n_ops=400, n_clients=5)
    mutated, _ = mutate_one_read(random.Random(8), history)
    full = check(mutated)
    assert not full.ok
    budgeted = check(mutated, max_steps=50)
    assert budgeted.ok and budgeted.timed_out
    assert "unknown" in budgeted.explanation
    # Deterministic: the same budget gives the same answer.
    assert check(mutated, max_steps=50) == budgeted
    assert check(history, max_steps=1_000_000) == check(history)


def test_wall_clock_deadline_is_reported_as_unknown() -> None:
    # The refutation below takes tens of thousands of steps; the clock is consulted every 4,096.
    history = generate_history(random.Random(7), n_ops=2000, n_clients=5, unknown_rate=0.05)
    mutated, _ = mutate_one_read(random.Random(8), history)
    result = check(mutated, timeout_s=0.0)
    assert result.ok and result.timed_out


def test_two_thousand_ops_on_one_key_with_five_clients_is_fast() -> None:
    rng = random.Random(42)
    history = generate_history(rng, n_ops=2000, n_clients=5, unknown_rate=0.02, fail_rate=0.02)
    start = time.perf_counter()
    result = check(history)
    elapsed = time.perf_counter() - start
    assert_ok(result)
    assert elapsed < 2.0, f"checking 2,000 ops took {elapsed:.2f}s"

    mutated, _ = mutate_one_read(rng, history)
    start = time.perf_counter()
    result = check(mutated)
    elapsed = time.perf_counter() - start
    assert_violation(result)
    assert elapsed < 3.0, f"refuting 2,000 ops took {elapsed:.2f}s"
