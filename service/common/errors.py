"""The one error tree of Tessera, and the one place it meets gRPC in each direction.

Theory of operation
-------------------
Every failure a component wants to report to another component, in the same process or across
the wire, is a subclass of `TesseraError`. Each class carries two class attributes:

* `code`: a stable UPPER_SNAKE name ("NOT_THE_LEADER"). It is part of the wire protocol: clients
  dispatch on it, logs and metrics group by it, and it never changes once shipped. Codes are
  unique across the tree; `__init_subclass__` refuses a duplicate at import time.
* `grpc_status`: the `grpc.StatusCode` the error travels under, so that a client that knows
  nothing of Tessera (grpcurl, a generic retry policy) still sees a sensible status.

On the server, servicer methods wear `@rpc_errors`; it turns a raised `TesseraError` into
`to_grpc()` (status, details, trailing metadata) and aborts the call with it (`abort_with`).
The trailing metadata carries the stable code under `tessera-error-code`, and the error's own
fields (the leader hint of `NotTheLeader`) under further `tessera-*` keys. Anything else that
escapes a servicer is a bug: it is logged with its traceback and sent as INTERNAL.

Servicers may carry an `RpcObserver` (`observe_rpcs(servicer, observer)`): `rpc_errors` then
reports every finished call to it (service, method, outcome code, seconds), which is how each
server counts its RPCs and their latencies (`metrics.RpcMetrics`). The observer is looked up on
the servicer instance, so this module knows nothing of metrics and several servers in one
process keep separate counts; a servicer without one behaves exactly as before.

On the client, `from_grpc()` is the inverse: it reads the code back and rebuilds the same class,
message and fields, and keeps the call's own status and details (`rpc_status`, `rpc_details`).
A status without our metadata (a proxy, a connection refused, a server of a newer version with
a code we do not know) falls back to a class chosen by the gRPC status, so callers only ever
handle `TesseraError`s. Channels opened with `error_mapping.INTERCEPTORS` (every channel of the
client library's pool) apply it to every call themselves.

Two class flags guide callers without a table of codes:

* `retryable`: the same request may be sent again, possibly elsewhere, without risk (the server
  did not start executing it, or the operation is idempotent by construction: DDL carries a
  client request id).
* `fatal`: the node that raised it must stop (WAL corruption, an fsync error:
  docs/design/consensus.md#R6 and #R7, "never retry fsync"). The flag concerns the node where the
  error happened; a client that receives a `Corruption` from a server does not stop itself.

Status choices worth a word:

* `NotTheLeader` is UNAVAILABLE rather than FAILED_PRECONDITION: generic gRPC retry policies
  retry UNAVAILABLE (and only that) by default, and "try again, possibly on another master" is
  exactly what a non-leader means. Tessera clients do better by reading the leader hint.
* `StaleTerm`, `WrongDestination`, `ConfigChangeRejected` and `CasMismatch` are
  FAILED_PRECONDITION: retrying the same request cannot succeed; the caller must refresh its
  view (term, node uuid, committed config op id) first.
* `IOFatal` is INTERNAL and `Corruption` DATA_LOSS, as gRPC's status guide prescribes.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import (
    Any,
    ClassVar,
    NoReturn,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    cast,
    overload,
)

import grpc
import grpc.aio

from service.common.registration import Undecodable

__all__ = [
    "CODE_KEY",
    "LEADER_ADDRESS_KEY",
    "LEADER_UUID_KEY",
    "Aborted",
    "AlreadyExists",
    "CasMismatch",
    "ClockError",
    "ConfigChangeRejected",
    "Corruption",
    "FailedPrecondition",
    "IOFatal",
    "Internal",
    "InvalidArgument",
    "InvalidAuthzToken",
    "NotFound",
    "NotReady",
    "NotSupported",
    "NotTheLeader",
    "OutsidePartition",
    "PermissionDenied",
    "ResourceExhausted",
    "RpcObserver",
    "ServiceUnavailable",
    "SnapshotTooOld",
    "StaleTerm",
    "TabletNotRunning",
    "TesseraError",
    "Timeout",
    "Unauthenticated",
    "WrongDestination",
    "abort_with",
    "error_class",
    "error_classes",
    "from_grpc",
    "observe_rpcs",
    "rpc_errors",
    "to_grpc",
]

_log = logging.getLogger(__name__)

CODE_KEY = "tessera-error-code"
"""Trailing metadata key carrying `TesseraError.code`."""
LEADER_UUID_KEY = "tessera-leader-uuid"
"""Trailing metadata key carrying `NotTheLeader.leader_uuid`, when known."""
LEADER_ADDRESS_KEY = "tessera-leader-address"
"""Trailing metadata key carrying `NotTheLeader.leader_address`, when known."""

Metadata: TypeAlias = tuple[tuple[str, str], ...]
_Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

_REGISTRY: dict[str, type[TesseraError]] = {}


class TesseraError(Exception):
    """Base of every Tessera error. Raise a subclass; the base exists for `except` clauses.

    Subclasses set `code` (unique, stable) and `grpc_status`. A subclass that does not set its
    own `code` is a local refinement: it travels under its parent's code and comes back as the
    parent class.
    """

    code: ClassVar[str] = "UNKNOWN"
    grpc_status: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    retryable: ClassVar[bool] = False
    fatal: ClassVar[bool] = False

    message: str
    rpc_status: grpc.StatusCode | None = None
    """For an error rebuilt from a failed call (`from_grpc`): the gRPC status the call ended
    with, which the class alone does not always tell (NOT_THE_LEADER and SERVICE_UNAVAILABLE
    share UNAVAILABLE; a status without Tessera's metadata falls back to a class). None for an
    error raised in this process."""
    rpc_details: str | None = None
    """For an error rebuilt from a failed call: the details string the call ended with, as
    received (`message` may add the status name when there were none)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return
        if not cls.code or cls.code != cls.code.upper() or not cls.code.replace("_", "").isalnum():
            raise TypeError(f"{cls.__name__}.code must be UPPER_SNAKE, got {cls.code!r}")
        other = _REGISTRY.get(cls.code)
        same = other is not None and (other.__module__, other.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )  # a module reload re-registers the same class
        if other is not None and not same:
            raise TypeError(f"{cls.__name__}.code {cls.code!r} already used by {other.__name__}")
        _REGISTRY[cls.code] = cls

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields (the leader hint) live in __dict__; Exception's default reduce
        # would rebuild from `args` alone and lose them (Spark pickles executor exceptions).
        return (type(self), (self.message,), dict(self.__dict__))

    def wire_metadata(self) -> Metadata:
        """Extra `tessera-*` trailing metadata for this error's fields (none by default)."""
        return ()

    @classmethod
    def from_wire(cls, message: str, metadata: Mapping[str, str]) -> TesseraError:
        """Rebuild an instance from the details message and trailing metadata."""
        return cls(message)


# --- the tree --------------------------------------------------------------------------------


class InvalidArgument(TesseraError):
    """The request is malformed or names an impossible value; retrying cannot help."""

    code = "INVALID_ARGUMENT"
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class OutsidePartition(InvalidArgument):
    """A written row's key belongs to another tablet: its hash buckets or range key fall
    outside the partition of the tablet it was sent to (docs/design/tablets.md#R2). A
    per-row error; the client routed the row wrongly, or someone wrote around the client."""

    code = "OUTSIDE_PARTITION"


class SnapshotTooOld(InvalidArgument):
    """A snapshot read asked for a time older than the tablet keeps history for: the versions
    it would need may be gone (docs/design/tablets.md#R5)."""

    code = "SNAPSHOT_TOO_OLD"


class NotFound(TesseraError):
    """The named table, tablet, replica or key does not exist (here)."""

    code = "NOT_FOUND"
    grpc_status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TesseraError):
    """An object with that name or id exists already."""

    code = "ALREADY_EXISTS"
    grpc_status = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(TesseraError):
    """The system is not in a state that allows the operation; refresh your view first."""

    code = "FAILED_PRECONDITION"
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class ClockError(FailedPrecondition):
    """Hybrid time cannot be kept in order: a timestamp arrived further ahead of this server's
    wall clock than `max_clock_error_ms`, or the wall clock stepped back by more than that
    (service/common/hybrid_time.py). Nothing was assigned or changed."""

    code = "CLOCK_ERROR"


class StaleTerm(FailedPrecondition):
    """The request comes from a lower term than ours: a deposed leader is being fenced.

    Fencing (docs/design/failover.md#R5): a leader that lost its term must not have its requests
    honoured.
    """

    code = "STALE_TERM"


class WrongDestination(FailedPrecondition):
    """The message was addressed to another node uuid than ours.

    The amnesia rule (docs/design/consensus.md#R9): every RPC names its intended recipient's uuid
    and the recipient refuses one addressed to another (for example its former, pre-wipe, self).
    """

    code = "WRONG_DESTINATION"


class ConfigChangeRejected(FailedPrecondition):
    """A Raft membership change was refused (one is already pending, it would remove the last
    voter, the node is already a member, ...)."""

    code = "CONFIG_CHANGE_REJECTED"


class CasMismatch(ConfigChangeRejected):
    """The change named a committed config op id that is no longer the committed one
    (compare-and-set on config changes, docs/design/tablet_copy.md#R8)."""

    code = "CAS_MISMATCH"


class NotTheLeader(TesseraError):
    """This node is not the leader of the group addressed; the hint says who is, if known.

    UNAVAILABLE (not FAILED_PRECONDITION) so that generic gRPC clients retry; Tessera's client
    follows `leader_address` directly.
    """

    code = "NOT_THE_LEADER"
    grpc_status = grpc.StatusCode.UNAVAILABLE
    retryable = True

    leader_uuid: str | None
    leader_address: str | None

    def __init__(
        self,
        message: str = "not the leader",
        *,
        leader_uuid: str | None = None,
        leader_address: str | None = None,
    ) -> None:
        super().__init__(message)
        self.leader_uuid = leader_uuid or None
        self.leader_address = leader_address or None

    def __repr__(self) -> str:
        return (
            f"NotTheLeader({self.message!r}, leader_uuid={self.leader_uuid!r}, "
            f"leader_address={self.leader_address!r})"
        )

    def wire_metadata(self) -> Metadata:
        md: list[tuple[str, str]] = []
        if self.leader_uuid:
            md.append((LEADER_UUID_KEY, self.leader_uuid))
        if self.leader_address:
            md.append((LEADER_ADDRESS_KEY, self.leader_address))
        return tuple(md)

    @classmethod
    def from_wire(cls, message: str, metadata: Mapping[str, str]) -> NotTheLeader:
        return cls(
            message,
            leader_uuid=metadata.get(LEADER_UUID_KEY),
            leader_address=metadata.get(LEADER_ADDRESS_KEY),
        )


class ServiceUnavailable(TesseraError):
    """The server cannot serve now (shutting down, overloaded, unreachable); try again later."""

    code = "SERVICE_UNAVAILABLE"
    grpc_status = grpc.StatusCode.UNAVAILABLE
    retryable = True


class NotReady(ServiceUnavailable):
    """This node is the leader but cannot serve yet: its catalog is still being loaded, or the
    no-op of its term is not yet committed (replay before serving,
    docs/design/coordinator.md#R4)."""

    code = "NOT_READY"


class TabletNotRunning(ServiceUnavailable):
    """A tablet asked for is not RUNNING yet (Kudu's TABLET_NOT_RUNNING): it is still being
    created (PREPARING, CREATING) or its replicas are not placed; retry later. UNAVAILABLE, so
    generic gRPC clients retry too."""

    code = "TABLET_NOT_RUNNING"


class Timeout(TesseraError):
    """A deadline passed. The outcome is unknown: the operation may or may not have happened."""

    code = "TIMED_OUT"
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(TesseraError):
    """The operation was abandoned (leadership lost mid-flight, a conflicting operation won).

    Not `retryable` as such: the caller retries the whole read-modify-write, per gRPC's guide.
    """

    code = "ABORTED"
    grpc_status = grpc.StatusCode.ABORTED


class ResourceExhausted(TesseraError):
    """A limit was hit: a message or entry too large, too many tablets, a full queue."""

    code = "RESOURCE_EXHAUSTED"
    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDenied(TesseraError):
    """The caller is not authenticated or not allowed to do this (docs/design/security.md)."""

    code = "PERMISSION_DENIED"
    grpc_status = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(PermissionDenied):
    """The caller did not prove who it is (no client certificate, an invalid token)."""

    code = "UNAUTHENTICATED"
    grpc_status = grpc.StatusCode.UNAUTHENTICATED


class InvalidAuthzToken(PermissionDenied):
    """A tablet server refused a user's authz token: missing, expired, or signed by a key it
    does not know (yet). The client fetches the table's locations again, which carries a fresh
    token, and retries once; a token that names too few privileges is PermissionDenied."""

    code = "INVALID_AUTHZ_TOKEN"
    grpc_status = grpc.StatusCode.PERMISSION_DENIED


class NotSupported(TesseraError):
    """The server does not implement the operation or feature requested."""

    code = "NOT_SUPPORTED"
    grpc_status = grpc.StatusCode.UNIMPLEMENTED


class Corruption(TesseraError):
    """Stored data failed a check (a CRC32C mismatch before the WAL's tail). Stops the node."""

    code = "CORRUPTION"
    grpc_status = grpc.StatusCode.DATA_LOSS
    fatal = True


class IOFatal(TesseraError):
    """An I/O error after which the node cannot trust its disk state (an fsync failure: the
    kernel may have dropped the dirty pages, so retrying fsync would lie). Stops the node."""

    code = "IO_FATAL"
    grpc_status = grpc.StatusCode.INTERNAL
    fatal = True


class Internal(TesseraError):
    """A bug: an invariant did not hold, or an unexpected exception escaped a handler."""

    code = "INTERNAL"
    grpc_status = grpc.StatusCode.INTERNAL


def error_classes() -> Mapping[str, type[TesseraError]]:
    """Every error class that has its own code, by code (a copy)."""
    return dict(_REGISTRY)


def error_class(code: str) -> type[TesseraError] | None:
    """The class registered for `code`, or None for a code this version does not know."""
    return _REGISTRY.get(code)


# --- server side -----------------------------------------------------------------------------


def to_grpc(err: TesseraError) -> tuple[grpc.StatusCode, str, Metadata]:
    """The status, details message and trailing metadata that carry `err` over gRPC."""
    return err.grpc_status, err.message, ((CODE_KEY, err.code), *err.wire_metadata())


async def abort_with(context: _Context, err: TesseraError) -> NoReturn:
    """Abort the current call with `err` (status, details and trailing metadata).

    `abort` raises grpc.aio's AbortError to unwind the handler; do not catch it.
    """
    status, details, metadata = to_grpc(err)
    await context.abort(status, details, metadata)


def _unexpected(fn: Callable[..., Any], exc: Exception) -> Internal:
    _log.exception("unexpected %s in RPC handler %s", type(exc).__name__, fn.__qualname__)
    return Internal(f"unexpected {type(exc).__name__} in {fn.__qualname__}: {exc}")


def _context_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Context:
    # grpc.aio calls handlers as (request, context) or, bound, (self, request, context).
    ctx: _Context | None = kwargs.get("context", args[-1] if args else None)
    if ctx is None:
        raise TypeError("rpc_errors: the handler was called without a servicer context")
    return ctx


class RpcObserver(Protocol):
    """Told about every call a servicer decorated with `rpc_errors` finished (module docstring).

    `code` is "OK", the `TesseraError.code` the call was aborted with, or "CANCELLED" when the
    call was cancelled (the client went away, the server is stopping). Called on the event
    loop; it must not block, and an exception it raises is logged, never sent to the client.
    """

    def rpc_done(self, service: str, method: str, code: str, seconds: float) -> None: ...


_OBSERVER_ATTR = "_tessera_rpc_observer"


def observe_rpcs(servicer: object, observer: RpcObserver | None) -> None:
    """Report the calls `servicer`'s `rpc_errors` handlers finish to `observer` (None: stop)."""
    setattr(servicer, _OBSERVER_ATTR, observer)


def _observer_of(args: tuple[Any, ...]) -> RpcObserver | None:
    # A bound handler's first argument is the servicer; a plain function's is the request,
    # which has no such attribute.
    return getattr(args[0], _OBSERVER_ATTR, None) if args else None


def _aborted_code(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The code of a call the handler aborted itself (`abort_with` inside the handler)."""
    try:
        ctx = _context_of(args, kwargs)
        for key, value in ctx.trailing_metadata() or ():
            if key == CODE_KEY:
                return value.decode() if isinstance(value, bytes) else str(value)
        status = ctx.code()
        if isinstance(status, grpc.StatusCode):
            return status.name
    except Exception:
        pass
    return "UNKNOWN"


def _report(observer: RpcObserver, names: tuple[str, str], code: str, started: float) -> None:
    """Tell `observer` of a finished call of `names` = (service, method)."""
    try:
        observer.rpc_done(names[0], names[1], code, time.perf_counter() - started)
    except Exception:
        _log.exception("RPC observer failed for %s.%s", *names)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _admit(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Before a handler runs: ask the servicer's `authorizer` (service/common/authz.py), when
    it has one, whether the caller may make this call (PermissionDenied if not), then refuse a
    request that did not decode (`registration.Undecodable`) as InvalidArgument. Returns the
    arguments to call the handler with: a streaming request is wrapped so that an undecodable
    message in it is refused the same way, and is passed to the authorizer as None (the handler
    checks each message itself)."""
    request = args[1] if len(args) > 2 else None
    streaming = request is not None and hasattr(request, "__aiter__")
    authorizer = getattr(args[0], "authorizer", None) if args else None
    if authorizer is not None:
        checked = None if streaming or isinstance(request, Undecodable) else request
        authorizer.check(method, checked, _context_of(args, kwargs))
    if isinstance(request, Undecodable):
        raise InvalidArgument(request.describe())
    if streaming:
        return (args[0], _decoded(cast(AsyncIterator[Any], request)), *args[2:])
    return args


async def _decoded(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for r in requests:
        if isinstance(r, Undecodable):
            raise InvalidArgument(r.describe())
        yield r


@overload
def rpc_errors(fn: Callable[_P, AsyncIterator[_R]]) -> Callable[_P, AsyncIterator[_R]]: ...


@overload
def rpc_errors(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]: ...


def rpc_errors(fn: Callable[_P, Any]) -> Callable[_P, Any]:
    """Decorate a grpc.aio handler (unary, or server-streaming async generator) so that a raised
    `TesseraError` aborts the call through `abort_with`, and any other exception is logged and
    sent as `Internal`. The context is the handler's last positional argument (or `context=`).

    Cancellation (a BaseException) and grpc.aio's own AbortError pass through untouched.

    Before the handler runs, the servicer's `authorizer` (if it has one) decides whether the
    caller may make the call (service/common/authz.py); a refusal is raised like any error.

    If the servicer carries an `RpcObserver` (`observe_rpcs`), every finished call is reported
    to it with its outcome code and duration; without one nothing else changes.
    """
    service, _, method = fn.__qualname__.rpartition(".")
    names = (service, method)
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream_wrapper(*args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[Any]:
            observer = _observer_of(args)
            started = time.perf_counter() if observer is not None else 0.0
            code = "CANCELLED"  # unless the call ends one of the ways below
            try:
                args = _admit(method, args, kwargs)  # type: ignore[assignment]
                async for item in fn(*args, **kwargs):
                    yield item
                code = "OK"
            except grpc.aio.AbortError:
                if observer is not None:
                    code = _aborted_code(args, kwargs)
                raise
            except TesseraError as e:
                code = e.code
                await abort_with(_context_of(args, kwargs), e)
            except Exception as e:
                code = Internal.code
                await abort_with(_context_of(args, kwargs), _unexpected(fn, e))
            finally:
                if observer is not None:
                    _report(observer, names, code, started)

        return stream_wrapper

    @functools.wraps(fn)
    async def unary_wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
        observer = _observer_of(args)
        started = time.perf_counter() if observer is not None else 0.0
        code = "CANCELLED"  # unless the call ends one of the ways below
        try:
            args = _admit(method, args, kwargs)  # type: ignore[assignment]
            result = await fn(*args, **kwargs)
            code = "OK"
            return result
        except grpc.aio.AbortError:
            if observer is not None:
                code = _aborted_code(args, kwargs)
            raise
        except TesseraError as e:
            code = e.code
            await abort_with(_context_of(args, kwargs), e)
        except Exception as e:
            code = Internal.code
            await abort_with(_context_of(args, kwargs), _unexpected(fn, e))
        finally:
            if observer is not None:
                _report(observer, names, code, started)

    return unary_wrapper


# --- client side -----------------------------------------------------------------------------

_BY_STATUS: dict[grpc.StatusCode, type[TesseraError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: ServiceUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Timeout,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.CANCELLED: Aborted,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNIMPLEMENTED: NotSupported,
    grpc.StatusCode.DATA_LOSS: Corruption,
}
"""Fallback when the code metadata is missing or unknown. Everything else maps to Internal."""


def _metadata_of(e: grpc.RpcError) -> dict[str, str]:
    getter = getattr(e, "trailing_metadata", None)
    raw: Iterable[Any] | None = getter() if callable(getter) else None
    md: dict[str, str] = {}
    # Sync grpc gives a tuple of (key, value) namedtuples, grpc.aio a Metadata that iterates as
    # (key, value) pairs; both unpack alike. The first value of a key wins.
    for key, value in raw or ():
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        md.setdefault(str(key).lower(), str(value))
    return md


def from_grpc(e: grpc.RpcError | grpc.aio.AioRpcError) -> TesseraError:
    """The `TesseraError` a failed call stands for; the inverse of `to_grpc`.

    Use as `except grpc.RpcError as e: raise from_grpc(e) from e`.
    """
    code_getter = getattr(e, "code", None)
    status = code_getter() if callable(code_getter) else None
    details_getter = getattr(e, "details", None)
    details = details_getter() if callable(details_getter) else None
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    metadata = _metadata_of(e)
    cls = error_class(metadata.get(CODE_KEY, ""))
    if cls is not None:
        err = cls.from_wire(details or "", metadata)
    else:
        # Not from a Tessera handler (a proxy, connection refused, a newer server's code): go
        # by status, and say which status it was when there is no message.
        cls = _BY_STATUS.get(status, Internal)
        err = cls.from_wire(details or f"{status.name} (no details)", metadata)
    err.rpc_status, err.rpc_details = status, details
    return err
