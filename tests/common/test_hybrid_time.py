"""The hybrid logical clock: monotone, causal, close to the wall clock, and refusing what would
break the order (service/common/hybrid_time.py)."""

from __future__ import annotations

import threading

import pytest

from service.common.errors import ClockError
from service.common.hybrid_time import (
    LOGICAL_BITS,
    MAX_TIMESTAMP,
    HybridClock,
    describe,
    from_micros,
    from_millis,
    logical,
    physical_us,
)

T0 = 1_700_000_000_000_000  # microseconds


class Wall:
    """A wall clock the test sets."""

    def __init__(self, us: int = T0) -> None:
        self.us = us

    def __call__(self) -> int:
        return self.us


def test_timestamps_follow_the_wall_clock_and_never_repeat() -> None:
    wall = Wall()
    c = HybridClock(wall_us=wall)
    a = c.now()
    assert physical_us(a) == T0 and logical(a) == 0
    b = c.now()  # the wall clock stood still: the logical counter moves
    assert b == a + 1 and physical_us(b) == T0 and logical(b) == 1
    wall.us += 5
    d = c.now()
    assert physical_us(d) == T0 + 5 and logical(d) == 0 and d > b


def test_a_wall_clock_that_steps_back_within_the_bound_is_absorbed() -> None:
    wall = Wall()
    c = HybridClock(max_error_us=1000, wall_us=wall)
    first = c.now()
    wall.us -= 900
    seen = [c.now() for _ in range(10)]
    assert seen == sorted(seen) and seen[0] > first
    assert all(physical_us(t) == T0 for t in seen)


def test_a_wall_clock_that_steps_back_past_the_bound_refuses_to_assign() -> None:
    wall = Wall()
    c = HybridClock(max_error_us=1000, wall_us=wall)
    last = c.now()
    wall.us -= 1001
    with pytest.raises(ClockError) as e:
        c.now()
    assert (
        "behind the last timestamp" in e.value.message and "max_clock_error_ms" in e.value.message
    )
    assert c.last == last  # nothing assigned
    wall.us += 2  # caught up to within the bound
    assert c.now() > last


def test_update_orders_what_follows_after_the_message() -> None:
    wall = Wall()
    c = HybridClock(max_error_us=1000, wall_us=wall)
    remote = from_micros(T0 + 800, 7)  # a peer whose clock is 0.8 ms ahead
    c.update(remote)
    assert c.now() > remote
    c.update(from_micros(T0 - 50))  # older: nothing changes
    assert c.now() > remote


def test_a_timestamp_further_ahead_than_the_bound_is_refused_and_changes_nothing() -> None:
    wall = Wall()
    c = HybridClock(max_error_us=1000, wall_us=wall)
    before = c.now()
    with pytest.raises(ClockError) as e:
        c.update(from_micros(T0 + 1001))
    assert "ahead of this server's wall clock" in e.value.message
    assert c.last == before
    with pytest.raises(ClockError):
        c.check(from_micros(T0 + 5000))
    c.check(from_micros(T0 + 999))
    c.check(MAX_TIMESTAMP)  # "the latest" is no time in the future


def test_from_millis_covers_the_whole_millisecond_and_encodings_round_trip() -> None:
    ms = T0 // 1000
    t = from_millis(ms)
    assert from_micros(ms * 1000 + 999, (1 << LOGICAL_BITS) - 1) == t
    assert from_micros((ms + 1) * 1000) == t + 1
    assert "2023-11-14T22:13:20.000999Z" in describe(t)
    assert describe(MAX_TIMESTAMP) == "latest"


def test_threads_never_get_the_same_timestamp() -> None:
    c = HybridClock(wall_us=Wall())
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [c.now() for _ in range(2000)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == len(got) == 8000


def test_a_wall_clock_that_jumps_against_the_monotonic_one_stops_timestamps_until_it_is_back() -> (
    None
):
    """A forward step would have this server stamp writes in the future, which every replica
    must then follow; a backward step beyond the bound is refused too. Back within the bound,
    timestamps flow again."""
    wall, mono = [1_000_000_000_000], [5_000_000]
    clock = HybridClock(500_000, wall_us=lambda: wall[0], mono_us=lambda: mono[0])
    first = clock.now()
    wall[0] += 2_000_000
    mono[0] += 2_000_000  # both moved: time passed
    assert clock.now() > first
    assert not clock.stepped()
    wall[0] += 600_000_000  # stepped ten minutes ahead
    assert clock.stepped()
    for call in (clock.now, lambda: clock.check(first), lambda: clock.update(clock.last + 1)):
        with pytest.raises(ClockError, match=r"moved \+600\.000 s against its monotonic clock"):
            call()
    assert clock.observe(clock.last + 2) is False  # applied entries are still taken in
    wall[0] -= 600_000_000 + 300_000  # set back, 0.3 s behind where it should be: within
    later = clock.now()
    assert later > first and not clock.stepped()
    wall[0] -= 700_000  # now 1 s behind
    assert clock.stepped()
    with pytest.raises(ClockError, match=r"moved -1\.000 s"):
        clock.now()
    plain = HybridClock(500_000, wall_us=lambda: wall[0])  # no monotonic clock: not watched
    wall[0] += 600_000_000
    assert plain.now() > 0 and not plain.stepped()
