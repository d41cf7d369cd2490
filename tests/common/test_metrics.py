"""The metrics registry: exposition format 0.0.4 exactly, histogram buckets, label escaping,
callback families, thread safety, and the RPC observer hook of `errors.rpc_errors`."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from service.common.errors import CasMismatch, NotTheLeader, abort_with, observe_rpcs, rpc_errors
from service.common.metrics import (
    CONTENT_TYPE,
    MetricsRegistry,
    RpcMetrics,
    format_value,
    wal_sync_histogram,
)
from service.consensus.fs import RealFileSystem
from service.consensus.wal import Wal
from service.raft.types import Entry


def test_counter_and_gauge_golden() -> None:
    r = MetricsRegistry()
    c = r.counter("app_requests_total", "Requests handled.", ("method", "code"))
    g = r.gauge("app_temperature", "Degrees.")
    c.labels("Get", "OK").inc()
    c.labels("Get", "OK").inc(2)
    c.labels("Put", "NOT_FOUND").inc()
    g.set(21.5)
    assert r.render() == (
        "# HELP app_requests_total Requests handled.\n"
        "# TYPE app_requests_total counter\n"
        'app_requests_total{method="Get",code="OK"} 3\n'
        'app_requests_total{method="Put",code="NOT_FOUND"} 1\n'
        "# HELP app_temperature Degrees.\n"
        "# TYPE app_temperature gauge\n"
        "app_temperature 21.5\n"
    )
    assert c.get("Get", "OK") == 3
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_an_empty_registry_renders_nothing_and_unlabelled_families_start_at_zero() -> None:
    r = MetricsRegistry()
    assert r.render() == ""
    r.counter("x_total", "X.")
    r.counter("y_total", "Y.", ("k",))  # labelled: no child yet, no sample
    assert r.render() == (
        "# HELP x_total X.\n# TYPE x_total counter\nx_total 0\n"
        "# HELP y_total Y.\n# TYPE y_total counter\n"
    )


def test_histogram_golden_buckets_are_cumulative_and_le_is_inclusive() -> None:
    r = MetricsRegistry()
    h = r.histogram("rpc_seconds", "Latency.", ("method",), buckets=(0.1, 1.0, 2.5))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.labels("Get").observe(v)
    assert r.render() == (
        "# HELP rpc_seconds Latency.\n"
        "# TYPE rpc_seconds histogram\n"
        'rpc_seconds_bucket{method="Get",le="0.1"} 2\n'
        'rpc_seconds_bucket{method="Get",le="1"} 3\n'
        'rpc_seconds_bucket{method="Get",le="2.5"} 3\n'
        'rpc_seconds_bucket{method="Get",le="+Inf"} 4\n'
        'rpc_seconds_sum{method="Get"} 3.65\n'
        'rpc_seconds_count{method="Get"} 4\n'
    )
    assert h.count("Get") == 4


def test_unlabelled_histogram_starts_empty_and_rejects_bad_buckets() -> None:
    r = MetricsRegistry()
    h = r.histogram("d_seconds", "D.", buckets=(1.0,))
    assert r.render().splitlines()[2:] == [
        'd_seconds_bucket{le="1"} 0',
        'd_seconds_bucket{le="+Inf"} 0',
        "d_seconds_sum 0",
        "d_seconds_count 0",
    ]
    h.observe(math.inf)
    assert 'd_seconds_bucket{le="+Inf"} 1' in r.render()
    with pytest.raises(ValueError, match="strictly increasing"):
        r.histogram("e_seconds", "E.", buckets=(1.0, 0.5))


def test_label_values_and_help_are_escaped() -> None:
    r = MetricsRegistry()
    g = r.gauge("t_info", 'Help with a \\ backslash\nand a "quote".', ("name",))
    g.labels('a "quoted" \\ name\nwith newline').set(1)
    lines = r.render().splitlines()
    assert lines[0] == '# HELP t_info Help with a \\\\ backslash\\nand a "quote".'
    assert lines[2] == 't_info{name="a \\"quoted\\" \\\\ name\\nwith newline"} 1'


def test_values_are_formatted_like_prometheus() -> None:
    assert format_value(3) == "3"
    assert format_value(3.0) == "3"
    assert format_value(-2.0) == "-2"
    assert format_value(0.25) == "0.25"
    assert format_value(1e-05) == "1e-05"
    assert format_value(math.inf) == "+Inf"
    assert format_value(-math.inf) == "-Inf"
    assert format_value(math.nan) == "NaN"
    assert format_value(2.0**60) == repr(2.0**60)


def test_names_labels_and_misuse_are_refused() -> None:
    r = MetricsRegistry()
    r.counter("ok_total", "ok")
    with pytest.raises(ValueError, match="already registered"):
        r.gauge("ok_total", "again")
    with pytest.raises(ValueError, match="invalid metric name"):
        r.counter("bad-name", "x")
    with pytest.raises(ValueError, match="invalid label name"):
        r.counter("x_total", "x", ("le",))
    with pytest.raises(ValueError, match="invalid label name"):
        r.counter("y_total", "x", ("__reserved",))
    c = r.counter("z_total", "z", ("a",))
    with pytest.raises(ValueError, match="expected 1 label values"):
        c.labels("1", "2")
    with pytest.raises(ValueError, match="cannot decrease"):
        c.labels("1").inc(-1)
    with pytest.raises(ValueError, match="cannot be set"):
        c.labels("1").set(5)
    g = r.gauge("g", "g")
    g.inc(5)
    g.dec(2)
    assert g.get() == 3


def test_callback_families_are_read_at_scrape_time_and_a_broken_one_is_skipped() -> None:
    r = MetricsRegistry()
    state = {"term": 1}
    r.gauge_callback("raft_term", "Term.", lambda: state["term"])
    r.counter_callback(
        "hb_total", "Heartbeats.", lambda: [(("m2", "ok"), 7), (("m1", "ok"), 5)], ("master", "r")
    )

    def broken() -> float:
        raise RuntimeError("boom")

    r.gauge_callback("broken", "Broken.", broken)
    state["term"] = 4
    assert r.render() == (
        "# HELP raft_term Term.\n# TYPE raft_term gauge\nraft_term 4\n"
        "# HELP hb_total Heartbeats.\n# TYPE hb_total counter\n"
        'hb_total{master="m1",r="ok"} 5\n'
        'hb_total{master="m2",r="ok"} 7\n'
        "# HELP broken Broken.\n# TYPE broken gauge\n"
    )


def test_histogram_observations_from_threads_are_not_lost() -> None:
    r = MetricsRegistry()
    h = wal_sync_histogram(r)

    def work() -> None:
        for _ in range(20_000):
            h.observe(0.0003)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.count() == 80_000
    assert 'tessera_wal_sync_seconds_bucket{le="0.0005"} 80000' in r.render()


def test_the_wal_reports_each_fdatasync_to_its_observer(tmp_path: Path) -> None:
    r = MetricsRegistry()
    h = wal_sync_histogram(r)
    wal, _ = Wal.open(RealFileSystem(), str(tmp_path / "wal"), preallocate=False, on_sync=h.observe)
    try:
        wal.sync()  # nothing appended: no fdatasync, nothing observed
        assert h.count() == 0
        for i in (1, 2):
            wal.append([Entry(1, i, data=b"x")])
            wal.sync()
        assert h.count() == 2 == wal.metrics.syncs
    finally:
        wal.close()


# --- the RPC observer hook of rpc_errors -------------------------------------------------------


class _Ctx:
    """Just enough of a ServicerContext for rpc_errors: abort raises like grpc.aio does."""

    def __init__(self) -> None:
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.status: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str, metadata: Any = ()) -> None:
        self.status, self.trailing = code, tuple(metadata)
        raise grpc.aio.AbortError()

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.trailing

    def code(self) -> grpc.StatusCode | None:
        return self.status


class _Servicer:
    @rpc_errors
    async def Echo(self, request: bytes, context: Any) -> bytes:
        return request

    @rpc_errors
    async def Follower(self, request: bytes, context: Any) -> bytes:
        raise NotTheLeader("follower")

    @rpc_errors
    async def Boom(self, request: bytes, context: Any) -> bytes:
        raise KeyError("x")

    @rpc_errors
    async def SelfAbort(self, request: bytes, context: Any) -> bytes:
        await abort_with(context, CasMismatch("stale config"))
        return b""

    @rpc_errors
    async def Slow(self, request: bytes, context: Any) -> bytes:
        await asyncio.sleep(10)
        return b""

    @rpc_errors
    async def Stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"


def test_rpc_errors_reports_each_call_to_the_servicer_observer() -> None:
    r = MetricsRegistry()
    rpc = RpcMetrics(r)
    s = _Servicer()
    observe_rpcs(s, rpc)

    async def main() -> None:
        assert await s.Echo(b"hi", _Ctx()) == b"hi"
        for call in (s.Follower, s.Boom, s.SelfAbort):
            with pytest.raises(grpc.aio.AbortError):
                await call(b"", _Ctx())
        assert [x async for x in s.Stream(b"", _Ctx())] == [b"a", b"b"]
        task = asyncio.create_task(s.Slow(b"", _Ctx()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    counts = rpc.requests
    assert counts.get("_Servicer", "Echo", "OK") == 1
    assert counts.get("_Servicer", "Follower", "NOT_THE_LEADER") == 1
    assert counts.get("_Servicer", "Boom", "INTERNAL") == 1
    assert counts.get("_Servicer", "SelfAbort", "CAS_MISMATCH") == 1
    assert counts.get("_Servicer", "Stream", "OK") == 1
    assert counts.get("_Servicer", "Slow", "CANCELLED") == 1
    assert rpc.latency.count("_Servicer", "Echo") == 1
    assert 'tessera_rpc_requests_total{service="_Servicer",method="Echo",code="OK"} 1' in (
        r.render()
    )


def test_without_an_observer_and_with_a_failing_one_calls_behave_as_before() -> None:
    class Failing:
        def rpc_done(self, service: str, method: str, code: str, seconds: float) -> None:
            raise RuntimeError("observer bug")

    plain, failing = _Servicer(), _Servicer()
    observe_rpcs(failing, Failing())

    async def main() -> None:
        for s in (plain, failing):
            assert await s.Echo(b"x", _Ctx()) == b"x"
            ctx = _Ctx()
            with pytest.raises(grpc.aio.AbortError):
                await s.Follower(b"", ctx)
            assert ctx.status == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())
    observe_rpcs(failing, None)
    assert asyncio.run(failing.Echo(b"y", _Ctx())) == b"y"
