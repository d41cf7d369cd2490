"""Heartbeat pacing by load (service/master/heartbeat_pace.py): a leader whose loop lags or whose
CPU saturates asks for a longer interval, within a quarter of the unresponsive timeout, and
comes back to the servers' own once it recovers."""

from __future__ import annotations

from service.master.heartbeat_pace import HeartbeatPace


def feed(p: HeartbeatPace, seconds: float, lag_s: float, busy: float, start: float) -> float:
    """Wake-ups every 100 ms for `seconds`, each `lag_s` late with the loop busy `busy` of it."""
    t = start
    while t < start + seconds - 1e-9:
        t += 0.1 + lag_s
        p.observe(lag_s, busy * (0.1 + lag_s), t)
    return t


def test_a_lagging_loop_stretches_the_interval_up_to_the_cap_then_it_comes_back() -> None:
    p = HeartbeatPace(base_ms=1000, max_ms=15_000)
    t = feed(p, 3.0, 0.0, 0.2, 0.0)
    assert p.asked_ms() == 0  # quiet: the servers' own interval
    t = feed(p, 3.0, 0.2, 0.2, t)
    assert 2000 < p.asked_ms() <= 3375
    t = feed(p, 30.0, 0.2, 0.2, t)
    assert p.asked_ms() == 15_000  # capped: liveness is judged as before
    t = feed(p, 60.0, 0.0, 0.1, t)
    assert p.asked_ms() == 0 and p.interval == 1000.0
    assert p.stretches >= 6


def test_a_saturated_cpu_stretches_even_without_lag() -> None:
    p = HeartbeatPace(base_ms=1000, max_ms=15_000)
    feed(p, 3.0, 0.0, 0.95, 0.0)
    assert p.asked_ms() > 1000


def test_between_the_thresholds_the_interval_holds() -> None:
    p = HeartbeatPace(base_ms=1000, max_ms=15_000)
    t = feed(p, 2.0, 0.2, 0.2, 0.0)
    t = feed(p, 1.5, 0.03, 0.5, t)  # the period that straddles the change
    held = p.asked_ms()
    feed(p, 10.0, 0.03, 0.5, t)  # some lag, some CPU: neither overloaded nor idle
    assert p.asked_ms() == held > 0
