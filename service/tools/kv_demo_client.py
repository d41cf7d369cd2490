"""Async client for the KV demo: leader discovery, NOT_THE_LEADER hints, retries in a deadline.

A call goes to the node believed to be the leader. NOT_THE_LEADER answers carry the leader's
address (service.common.errors), so the client follows the hint at once; UNAVAILABLE (a dead
node, an election in progress) moves it to the next address after a short backoff. Retries stop
at the caller's deadline, and the last error is raised with the addresses that were tried.

A Put retried after a lost answer may apply twice; for a put of the same value that is
harmless (the demo's puts are idempotent). The master's DDL uses request ids instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from service.common.errors import NotTheLeader, ServiceUnavailable, TesseraError, Timeout, from_grpc
from service.pb import kvdemo_pb2 as pb
from service.pb import kvdemo_pb2_grpc as pb_grpc

T = TypeVar("T")
_RETRYABLE = (NotTheLeader, ServiceUnavailable)


class KvClient:
    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("at least one address is required")
        self.addresses = list(addresses)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.KvDemoStub] = {}
        self.leader: str | None = None
        self.last_address: str | None = None  # the node that answered the last call
        self._next = 0

    def stub(self, address: str) -> pb_grpc.KvDemoStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = grpc.aio.insecure_channel(address)
            self._channels[address] = ch
            stub = self._stubs[address] = pb_grpc.KvDemoStub(ch)
        return stub

    async def aclose(self) -> None:
        for ch in self._channels.values():
            await ch.close(None)
        self._channels.clear()
        self._stubs.clear()

    async def _call(
        self, fn: Callable[[pb_grpc.KvDemoStub, float], Awaitable[T]], timeout: float
    ) -> T:
        deadline = time.monotonic() + timeout
        tried: list[str] = []
        last: TesseraError | None = None
        backoff = 0.02
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(
                    f"no answer within {timeout}s from {', '.join(dict.fromkeys(tried))}"
                    + (f": last error: {last.message}" if last else "")
                )
            address = self.leader or self.addresses[self._next % len(self.addresses)]
            tried.append(address)
            try:
                result = await fn(self.stub(address), min(remaining, 5.0))
                self.last_address = address
                return result
            except grpc.aio.AioRpcError as e:
                err = from_grpc(e)
                last = err
                if isinstance(err, NotTheLeader) and err.leader_address:
                    self.leader = err.leader_address
                    if err.leader_address not in self.addresses:
                        self.addresses.append(err.leader_address)
                    continue
                if not isinstance(err, _RETRYABLE):
                    raise err from None
                self.leader = None
                self._next += 1
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, 0.5)

    async def put(self, key: str, value: bytes, timeout: float = 10.0) -> int:
        async def call(s: pb_grpc.KvDemoStub, t: float) -> int:
            r = await s.Put(pb.PutRequest(key=key, value=value), timeout=t)  # type: ignore[misc]
            return int(r.index)

        return await self._call(call, timeout)

    async def get(self, key: str, timeout: float = 10.0) -> bytes | None:
        async def call(s: pb_grpc.KvDemoStub, t: float) -> bytes | None:
            r = await s.Get(pb.GetRequest(key=key), timeout=t)  # type: ignore[misc]
            return bytes(r.value) if r.found else None

        return await self._call(call, timeout)

    async def status(self, address: str, timeout: float = 2.0) -> pb.StatusResponse:
        r: pb.StatusResponse = await self.stub(address).Status(  # type: ignore[misc]
            pb.StatusRequest(), timeout=timeout
        )
        return r

    async def find_leader(self, timeout: float = 10.0) -> str:
        """Poll until some node reports itself leader; returns its address."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for address in list(self.addresses):
                try:
                    st = await self.status(address, timeout=0.5)
                except grpc.aio.AioRpcError:
                    continue
                if st.role == "LEADER":
                    self.leader = address
                    return address
            await asyncio.sleep(0.05)
        raise Timeout(f"no leader among {', '.join(self.addresses)} within {timeout}s")
