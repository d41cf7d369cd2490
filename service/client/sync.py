"""`SyncClient`: the client for code that is not async (Spark executors, the CLI, scripts).

A daemon thread runs one asyncio event loop that owns a `TesseraClient`; each method submits a
coroutine to it (`run_coroutine_threadsafe`) and blocks for the answer. Scans come back as a
plain iterator that pulls one record batch at a time from the loop, so a Spark task holds at
most a page of rows in memory.

`SyncClient.shared(masters)` gives one client per process and master list: Spark runs many tasks
per executor process, and each reusing the same channels and location cache is far cheaper
than dialing the cluster per task. Shared clients live until the process exits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from service.client.client import TesseraClient
from service.client.scanner import ScanToken
from service.client.write_session import WriteResult
from service.common.tls import Credentials

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient:
    """Blocking calls onto a `TesseraClient` running in its own thread."""

    _shared: ClassVar[dict[tuple[tuple[str, ...], bytes], SyncClient]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        masters: Sequence[str],
        *,
        timeout: float = 30.0,
        credentials: Credentials | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tessera-client", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def make() -> TesseraClient:
            return TesseraClient(masters, timeout=timeout, credentials=credentials)

        self.client: TesseraClient = self.run(make())

    @classmethod
    def shared(
        cls,
        masters: Sequence[str],
        *,
        timeout: float = 30.0,
        credentials: Credentials | None = None,
    ) -> SyncClient:
        key = (tuple(masters), credentials.cert_pem if credentials else b"")
        with cls._shared_lock:
            c = cls._shared.get(key)
            if c is None or c._closed:
                c = cls._shared[key] = cls(masters, timeout=timeout, credentials=credentials)
            return c

    def run(self, coro: Awaitable[T]) -> T:
        """Run `coro` on the client's loop (it may use `self.client`) and wait for it."""
        if self._closed:
            raise RuntimeError("SyncClient is closed")
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return fut.result()

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """`await client.<name>(*args, **kwargs)` on the client's loop."""
        return self.run(getattr(self.client, name)(*args, **kwargs))

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Items of an async iterator running on the client's loop, one at a time."""
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self._closed:
                self.run(aclose())

    def scan_batches(self, token: ScanToken) -> Iterator[pa.RecordBatch]:
        return self.iterate(self.client.scan_batches(token))

    def scan_tokens(self, table: str, **kwargs: Any) -> list[ScanToken]:
        result: list[ScanToken] = self.call("scan_tokens", table, **kwargs)
        return result

    def write(self, table: str, data: pa.Table | pa.RecordBatch, op: str = "upsert") -> WriteResult:
        result: WriteResult = self.call("write", table, data, op)
        return result

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.run(self.client.aclose())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
