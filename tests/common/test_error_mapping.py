"""The one client-side error mapping (service/common/error_mapping.py), over real gRPC on
loopback.

A small server with `rpc_errors` handlers stands in for a master or tablet server; calls go
through `ChannelPool` channels, as every client call does. Unary and server-streaming calls,
successes, Tessera errors with their fields, transport failures, deadlines and cancellation.
The unary cases run twice: through the interceptors, and as `mapped(call)` on a channel without
them (the master's tablet-server proxy), which must raise exactly the same errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from service.client.channels import ChannelPool
from service.common.error_mapping import mapped
from service.common.errors import (
    NotReady,
    NotTheLeader,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    rpc_errors,
)
from service.common.tls import open_channel

SERVICE = "tessera.test.Mapping"


def _raw(b: bytes) -> bytes:
    return b


class _Servicer:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    @rpc_errors
    async def echo(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    @rpc_errors
    async def not_leader(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        raise NotTheLeader("a follower", leader_uuid="m2", leader_address="127.0.0.1:7052")

    @rpc_errors
    async def hang(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    @rpc_errors
    async def stream(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        for i in range(int(request or b"0")):
            yield b"%d" % i
        if request == b"2":
            raise NotReady("catalog still loading")

    @rpc_errors
    async def stream_hang(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        yield b"first"
        self.started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield b"never"


async def _with_server(
    body: Callable[[_Servicer, grpc.aio.Channel], Awaitable[Any]],
    *,
    stop_first: bool = False,
    style: str = "interceptors",
) -> Any:
    servicer = _Servicer()
    unary = ("echo", "not_leader", "hang")
    handlers: dict[str, grpc.RpcMethodHandler] = {
        n: grpc.unary_unary_rpc_method_handler(getattr(servicer, n), _raw, _raw) for n in unary
    }
    for n in ("stream", "stream_hang"):
        handlers[n] = grpc.unary_stream_rpc_method_handler(getattr(servicer, n), _raw, _raw)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    if stop_first:
        await server.stop(None)
    pool = ChannelPool()
    address = f"127.0.0.1:{port}"
    channel = pool.channel(address) if style == "interceptors" else open_channel(address, None)
    try:
        return await body(servicer, channel)
    finally:
        await pool.aclose()
        await channel.close(None)
        await server.stop(None)


def _unary(ch: grpc.aio.Channel, method: str) -> Any:
    return ch.unary_unary(f"/{SERVICE}/{method}", _raw, _raw)


STYLES = ("interceptors", "mapped")
"""How a unary call's failure is mapped: by the channel's interceptors, or by `mapped`."""


def _call(style: str, ch: grpc.aio.Channel, method: str, request: bytes, timeout: float) -> Any:
    call = _unary(ch, method)(request, timeout=timeout)
    return call if style == "interceptors" else mapped(call)


def _stream(ch: grpc.aio.Channel, method: str) -> Any:
    return ch.unary_stream(f"/{SERVICE}/{method}", _raw, _raw)


@pytest.mark.parametrize("style", STYLES)
def test_unary_success_passes_through(style: str) -> None:
    async def body(_: _Servicer, ch: grpc.aio.Channel) -> bytes:
        r: bytes = await _call(style, ch, "echo", b"hello", 10)
        return r

    assert asyncio.run(_with_server(body, style=style)) == b"hello"


@pytest.mark.parametrize("style", STYLES)
def test_unary_failure_is_the_servers_error_with_its_fields_and_status(style: str) -> None:
    async def body(_: _Servicer, ch: grpc.aio.Channel) -> TesseraError:
        with pytest.raises(TesseraError) as e:
            await _call(style, ch, "not_leader", b"", 10)
        return e.value

    err = asyncio.run(_with_server(body, style=style))
    assert type(err) is NotTheLeader and err.retryable
    assert (err.message, err.leader_uuid, err.leader_address) == (
        "a follower",
        "m2",
        "127.0.0.1:7052",
    )
    assert err.rpc_status is grpc.StatusCode.UNAVAILABLE and err.rpc_details == "a follower"
    assert isinstance(err.__cause__, grpc.aio.AioRpcError)
    assert not isinstance(err, grpc.RpcError)


@pytest.mark.parametrize("style", STYLES)
def test_connection_refused_is_service_unavailable(style: str) -> None:
    async def body(_: _Servicer, ch: grpc.aio.Channel) -> TesseraError:
        with pytest.raises(TesseraError) as e:
            await _call(style, ch, "echo", b"x", 5)
        return e.value

    err = asyncio.run(_with_server(body, stop_first=True, style=style))
    assert type(err) is ServiceUnavailable and err.retryable
    assert err.rpc_status is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("style", STYLES)
def test_deadline_is_timeout_and_the_server_sees_the_call_end(style: str) -> None:
    async def body(s: _Servicer, ch: grpc.aio.Channel) -> TesseraError:
        with pytest.raises(TesseraError) as e:
            await _call(style, ch, "hang", b"", 0.5)
        await asyncio.wait_for(s.cancelled.wait(), 10)
        return e.value

    err = asyncio.run(_with_server(body, style=style))
    assert type(err) is Timeout and err.rpc_status is grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("style", STYLES)
def test_cancelling_the_caller_cancels_the_rpc_and_is_not_mapped(style: str) -> None:
    async def body(s: _Servicer, ch: grpc.aio.Channel) -> None:
        task = asyncio.ensure_future(_call(style, ch, "hang", b"", 30))
        await asyncio.wait_for(s.started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(s.cancelled.wait(), 10)  # the server's handler was cancelled

    asyncio.run(_with_server(body, style=style))


def test_call_cancel_on_a_unary_call() -> None:
    async def body(s: _Servicer, ch: grpc.aio.Channel) -> None:
        call = _unary(ch, "hang")(b"", timeout=30)
        await asyncio.wait_for(s.started.wait(), 10)
        assert call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(s.cancelled.wait(), 10)

    asyncio.run(_with_server(body))


def test_server_stream_success_and_read() -> None:
    async def body(_: _Servicer, ch: grpc.aio.Channel) -> tuple[list[bytes], list[Any]]:
        got = [m async for m in _stream(ch, "stream")(b"3", timeout=10)]
        call = _stream(ch, "stream")(b"3", timeout=10)
        read = [await call.read() for _ in range(4)]
        return got, read

    got, read = asyncio.run(_with_server(body))
    assert got == [b"0", b"1", b"2"]
    assert read == [b"0", b"1", b"2", grpc.aio.EOF]


def test_server_stream_failure_part_way_is_mapped() -> None:
    async def body(_: _Servicer, ch: grpc.aio.Channel) -> tuple[list[bytes], TesseraError]:
        got: list[bytes] = []
        with pytest.raises(TesseraError) as e:
            async for m in _stream(ch, "stream")(b"2", timeout=10):
                got.append(m)
        return got, e.value

    got, err = asyncio.run(_with_server(body))
    # Messages come in order and never after the error; whether one still in flight when the
    # error status arrives is delivered is gRPC's business (one run in many on a loaded
    # machine saw fewer), so only the order is checked.
    assert got == [b"0", b"1"][: len(got)], got
    assert type(err) is NotReady and err.message == "catalog still loading"
    assert err.rpc_status is grpc.StatusCode.UNAVAILABLE


def test_server_stream_that_cannot_start_is_mapped() -> None:
    async def body(_: _Servicer, ch: grpc.aio.Channel) -> TesseraError:
        with pytest.raises(TesseraError) as e:
            async for _m in _stream(ch, "stream")(b"1", timeout=5):
                pass
        return e.value

    assert type(asyncio.run(_with_server(body, stop_first=True))) is ServiceUnavailable


def test_cancelling_a_server_stream_reaches_the_server() -> None:
    async def body(s: _Servicer, ch: grpc.aio.Channel) -> None:
        call = _stream(ch, "stream_hang")(b"", timeout=30)
        it = call.__aiter__()
        assert await it.__anext__() == b"first"
        await asyncio.wait_for(s.started.wait(), 10)
        assert call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await it.__anext__()
        await asyncio.wait_for(s.cancelled.wait(), 10)

    asyncio.run(_with_server(body))
