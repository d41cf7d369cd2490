"""Periodic (service/common/periodic.py): runs every interval, survives its function's
exceptions, and runs nothing after aclose returns."""

from __future__ import annotations

import asyncio
import logging

import pytest

from service.common.periodic import Periodic

log = logging.getLogger("test_periodic")


def test_runs_sync_and_async_functions_and_survives_their_exceptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def sync_fn() -> None:
        calls.append("sync")
        if len(calls) == 1:
            raise RuntimeError("first run fails")

    async def async_fn() -> None:
        await asyncio.sleep(0)
        calls.append("async")

    async def main() -> None:
        p, q = Periodic("s", 0.01, sync_fn, log), Periodic("a", 0.01, async_fn, log)
        p.start()
        q.start()
        while calls.count("sync") < 3 or calls.count("async") < 2:
            await asyncio.sleep(0.01)
        await p.aclose()
        await q.aclose()
        n = len(calls)
        await asyncio.sleep(0.05)
        assert len(calls) == n, "ran after aclose"
        assert asyncio.all_tasks() == {asyncio.current_task()}

    with caplog.at_level(logging.ERROR, logger="test_periodic"):
        asyncio.run(main())
    assert "s failed" in caplog.text and "first run fails" in caplog.text


def test_aclose_before_start_and_twice_is_harmless() -> None:
    async def main() -> None:
        p = Periodic("idle", 10.0, lambda: None, log)
        await p.aclose()
        p.start()
        await p.aclose()
        await p.aclose()

    asyncio.run(main())
