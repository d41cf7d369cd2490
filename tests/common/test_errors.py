"""The error tree: unique stable codes, and the gRPC mapping round trip (fake and real)."""

from __future__ import annotations

import asyncio
import logging
import pickle
import re
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from service.common import errors
from service.common.errors import (
    CODE_KEY,
    LEADER_ADDRESS_KEY,
    LEADER_UUID_KEY,
    Aborted,
    CasMismatch,
    ConfigChangeRejected,
    Corruption,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    IOFatal,
    NotFound,
    NotReady,
    NotTheLeader,
    ServiceUnavailable,
    StaleTerm,
    TabletNotRunning,
    TesseraError,
    Timeout,
    WrongDestination,
    abort_with,
    error_class,
    error_classes,
    from_grpc,
    rpc_errors,
    to_grpc,
)


def _all_subclasses(cls: type[TesseraError]) -> list[type[TesseraError]]:
    out: list[type[TesseraError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


class FakeRpcError(grpc.RpcError):
    """What a failed call looks like to a client: code(), details(), trailing_metadata()."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str | None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__()
        self._code = code
        self._details = details
        self._metadata = metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._metadata


def _round_trip(err: TesseraError) -> TesseraError:
    return from_grpc(FakeRpcError(*to_grpc(err)))


def _instance(cls: type[TesseraError]) -> TesseraError:
    if issubclass(cls, NotTheLeader):
        return cls("not the leader", leader_uuid="abc", leader_address="10.0.0.1:7051")
    return cls(f"a {cls.__name__} happened")


# --- the tree ----------------------------------------------------------------------------


def test_every_error_class_has_a_unique_upper_snake_code() -> None:
    classes = [c for c in _all_subclasses(TesseraError) if c.__module__ == errors.__name__]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), codes
    for cls in classes:
        assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", cls.code), cls
        assert isinstance(cls.grpc_status, grpc.StatusCode)
        assert error_class(cls.code) is cls
    assert set(codes) <= set(error_classes())


def test_the_tree_covers_the_required_errors() -> None:
    expected = {
        "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
        "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
        "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
        "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_THE_LEADER": grpc.StatusCode.UNAVAILABLE,
        "SERVICE_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
        "NOT_READY": grpc.StatusCode.UNAVAILABLE,
        "TABLET_NOT_RUNNING": grpc.StatusCode.UNAVAILABLE,
        "TIMED_OUT": grpc.StatusCode.DEADLINE_EXCEEDED,
        "ABORTED": grpc.StatusCode.ABORTED,
        "STALE_TERM": grpc.StatusCode.FAILED_PRECONDITION,
        "WRONG_DESTINATION": grpc.StatusCode.FAILED_PRECONDITION,
        "CONFIG_CHANGE_REJECTED": grpc.StatusCode.FAILED_PRECONDITION,
        "CAS_MISMATCH": grpc.StatusCode.FAILED_PRECONDITION,
        "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
        "CORRUPTION": grpc.StatusCode.DATA_LOSS,
        "IO_FATAL": grpc.StatusCode.INTERNAL,
        "INTERNAL": grpc.StatusCode.INTERNAL,
    }
    for code, status in expected.items():
        cls = error_class(code)
        assert cls is not None, code
        assert cls.grpc_status == status, code
    assert Corruption.fatal and IOFatal.fatal and not Internal.fatal
    assert NotTheLeader.retryable and ServiceUnavailable.retryable and NotReady.retryable
    assert TabletNotRunning.retryable and issubclass(TabletNotRunning, ServiceUnavailable)
    assert not Timeout.retryable and not Aborted.retryable
    assert issubclass(CasMismatch, ConfigChangeRejected)
    assert issubclass(StaleTerm, FailedPrecondition)
    assert issubclass(WrongDestination, FailedPrecondition)


def test_duplicate_code_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match="NOT_FOUND"):

        class Twin(TesseraError):
            code = "NOT_FOUND"


def test_subclass_without_its_own_code_travels_as_its_parent() -> None:
    class LocalDetail(NotFound):
        pass

    back = _round_trip(LocalDetail("no such table"))
    assert type(back) is NotFound
    assert back.message == "no such table"


def test_errors_pickle_with_their_fields() -> None:
    err = NotTheLeader("go away", leader_uuid="u1", leader_address="h:1")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NotTheLeader
    assert (back.message, back.leader_uuid, back.leader_address) == ("go away", "u1", "h:1")
    assert str(pickle.loads(pickle.dumps(NotFound("x")))) == "x"


# --- mapping -------------------------------------------------------------------------------


def test_to_grpc_carries_code_and_leader_hint() -> None:
    status, details, md = to_grpc(NotTheLeader("nope", leader_uuid="u", leader_address="h:1"))
    assert status == grpc.StatusCode.UNAVAILABLE
    assert details == "nope"
    assert dict(md) == {CODE_KEY: "NOT_THE_LEADER", LEADER_UUID_KEY: "u", LEADER_ADDRESS_KEY: "h:1"}
    _, _, md = to_grpc(NotTheLeader())
    assert dict(md) == {CODE_KEY: "NOT_THE_LEADER"}
    assert to_grpc(StaleTerm("term 3 < 5")) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "term 3 < 5",
        ((CODE_KEY, "STALE_TERM"),),
    )


@pytest.mark.parametrize(
    "cls",
    [c for c in _all_subclasses(TesseraError) if c.__module__ == errors.__name__],
    ids=lambda c: c.__name__,
)
def test_round_trip_yields_same_class_message_and_fields(cls: type[TesseraError]) -> None:
    err = _instance(cls)
    back = _round_trip(err)
    assert type(back) is cls
    assert back.message == err.message
    if isinstance(err, NotTheLeader):
        assert isinstance(back, NotTheLeader)
        assert back.leader_uuid == "abc"
        assert back.leader_address == "10.0.0.1:7051"


def test_tablet_not_running_round_trips_under_its_own_code() -> None:
    err = TabletNotRunning("tablet abc of table 't' is CREATING, not RUNNING yet; retry")
    status, details, md = to_grpc(err)
    assert (status, details, md) == (
        grpc.StatusCode.UNAVAILABLE,
        err.message,
        ((CODE_KEY, "TABLET_NOT_RUNNING"),),
    )
    back = _round_trip(err)
    assert type(back) is TabletNotRunning and back.message == err.message
    assert isinstance(back, ServiceUnavailable) and back.retryable
    # A client that does not know the code still sees a retryable SERVICE_UNAVAILABLE.
    bare = from_grpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, err.message))
    assert type(bare) is ServiceUnavailable and bare.retryable


def test_not_the_leader_without_hint_round_trips_without_hint() -> None:
    back = _round_trip(NotTheLeader("no leader known"))
    assert isinstance(back, NotTheLeader)
    assert back.leader_uuid is None and back.leader_address is None


def test_unavailable_without_metadata_is_service_unavailable() -> None:
    back = from_grpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all"))
    assert type(back) is ServiceUnavailable
    assert back.message == "failed to connect to all"
    assert type(from_grpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, None))) is ServiceUnavailable


def test_unknown_code_falls_back_to_status() -> None:
    md = ((CODE_KEY, "SOME_FUTURE_CODE"),)
    assert type(from_grpc(FakeRpcError(grpc.StatusCode.NOT_FOUND, "x", md))) is NotFound
    assert type(from_grpc(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "x"))) is Timeout
    assert type(from_grpc(FakeRpcError(grpc.StatusCode.UNKNOWN, "x"))) is Internal


def test_metadata_values_may_be_bytes() -> None:
    md = ((CODE_KEY, b"NOT_THE_LEADER"), (LEADER_ADDRESS_KEY, b"h:2"))
    back = from_grpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x", md))  # type: ignore[arg-type]
    assert isinstance(back, NotTheLeader) and back.leader_address == "h:2"


# --- a real grpc.aio round trip ------------------------------------------------------------

SERVICE = "tessera.test.Errors"


def _raw(data: bytes) -> bytes:
    """Identity (de)serializer: the test RPCs carry raw bytes, no protobuf."""
    return data


class _Servicer:
    def __init__(self) -> None:
        self.calls = 0

    @rpc_errors
    async def not_leader(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        self.calls += 1
        raise NotTheLeader(
            "this master is a follower", leader_uuid="leader-1", leader_address="127.0.0.1:7051"
        )

    @rpc_errors
    async def boom(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        raise KeyError("oops")

    @rpc_errors
    async def echo(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    @rpc_errors
    async def direct_abort(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        await abort_with(context, CasMismatch("config op id 7 is not committed config 9"))

    @rpc_errors
    async def stream(
        self,
        request: bytes,
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> AsyncIterator[bytes]:
        yield b"one"
        raise NotReady("catalog still loading")


async def _serve_and_call(
    method: str, payload: bytes = b"ping", *, streaming: bool = False
) -> tuple[list[bytes], grpc.RpcError | None]:
    servicer = _Servicer()
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=_raw, response_serializer=_raw
        )
        for name in ("not_leader", "boom", "echo", "direct_abort")
    }
    handlers["stream"] = grpc.unary_stream_rpc_method_handler(
        servicer.stream, request_deserializer=_raw, response_serializer=_raw
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    got: list[bytes] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                if streaming:
                    call = channel.unary_stream(f"/{SERVICE}/{method}", _raw, _raw)(
                        payload, timeout=10
                    )
                    async for item in call:
                        got.append(item)
                else:
                    got.append(
                        await channel.unary_unary(f"/{SERVICE}/{method}", _raw, _raw)(
                            payload, timeout=10
                        )
                    )
            except grpc.RpcError as e:
                return got, e
        return got, None
    finally:
        await server.stop(None)


def test_real_grpc_round_trip_of_not_the_leader() -> None:
    _, rpc_error = asyncio.run(_serve_and_call("not_leader"))
    assert isinstance(rpc_error, grpc.aio.AioRpcError)
    assert rpc_error.code() == grpc.StatusCode.UNAVAILABLE
    err = from_grpc(rpc_error)
    assert isinstance(err, NotTheLeader)
    assert err.message == "this master is a follower"
    assert err.leader_uuid == "leader-1"
    assert err.leader_address == "127.0.0.1:7051"


def test_real_grpc_success_passes_through() -> None:
    got, rpc_error = asyncio.run(_serve_and_call("echo", b"hello"))
    assert rpc_error is None and got == [b"hello"]


def test_real_grpc_unexpected_exception_is_internal_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger=errors.__name__):
        _, rpc_error = asyncio.run(_serve_and_call("boom"))
    assert rpc_error is not None and rpc_error.code() == grpc.StatusCode.INTERNAL
    err = from_grpc(rpc_error)
    assert type(err) is Internal
    assert "KeyError" in err.message
    assert any("KeyError" in r.getMessage() and r.exc_info for r in caplog.records)


def test_real_grpc_abort_with_inside_handler() -> None:
    _, rpc_error = asyncio.run(_serve_and_call("direct_abort"))
    assert rpc_error is not None
    err = from_grpc(rpc_error)
    assert type(err) is CasMismatch
    assert err.message == "config op id 7 is not committed config 9"


def test_real_grpc_streaming_handler() -> None:
    got, rpc_error = asyncio.run(_serve_and_call("stream", streaming=True))
    assert got == [b"one"]
    assert rpc_error is not None
    err = from_grpc(rpc_error)
    assert type(err) is NotReady and err.message == "catalog still loading"


def test_connection_refused_is_service_unavailable() -> None:
    async def call_nobody() -> grpc.RpcError:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await server.stop(None)  # the port is now (very likely) closed
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                await channel.unary_unary(f"/{SERVICE}/echo", _raw, _raw)(b"x", timeout=5)
            except grpc.RpcError as e:
                return e
        raise AssertionError("call unexpectedly succeeded")

    rpc_error = asyncio.run(call_nobody())
    err = from_grpc(rpc_error)
    assert type(err) is ServiceUnavailable
    assert err.retryable


def test_invalid_argument_is_the_config_error_parent() -> None:
    from service.common.config import ConfigError

    assert issubclass(ConfigError, InvalidArgument)
    assert type(_round_trip(ConfigError("raft.x: bad", key="raft.x"))) is ConfigError
