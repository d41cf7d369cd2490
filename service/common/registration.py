"""Registering servicers so that a request that does not decode is an ordinary, named error.

The generated `add_XServicer_to_server` functions hand gRPC each request message's
`FromString` as the deserializer. When it raises (garbage bytes, invalid UTF-8 in a string
field), grpc.aio answers UNKNOWN with the DecodeError's text and logs an ERROR traceback, before
any of our code runs. `register` installs the same handlers with a lenient deserializer that
returns an `Undecodable` value instead; `rpc_errors` (service/common/errors.py) turns it into
INVALID_ARGUMENT naming the message type and the problem, after the caller's role is checked,
and without a traceback in the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import grpc

__all__ = ["Undecodable", "register"]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands in for a request message whose bytes did not decode."""

    message_type: str
    size: int
    problem: str

    def describe(self) -> str:
        return f"undecodable {self.message_type} ({self.size} bytes): {self.problem}"


def _lenient(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any]:
    owner = getattr(deserializer, "__self__", None)
    type_name = getattr(owner, "__name__", None) or f"{method} request"

    def deserialize(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as e:  # DecodeError, or a UTF-8 error from a string field
            return Undecodable(type_name, len(data), str(e) or type(e).__name__)

    return deserialize


def register(
    add_to_server: Callable[[Any, Any], None],
    servicer: Any,
    server: Any,
    *,
    response_serializers: Mapping[str, Callable[[Any], bytes]] | None = None,
) -> None:
    """Register `servicer` as `add_to_server` (a generated function) would, with lenient
    request deserializers, and `response_serializers` replacing the generated ones by method."""
    captured: dict[str, dict[str, Any]] = {}

    class _Capture:
        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
            captured[name] = handlers

    add_to_server(servicer, cast(Any, _Capture()))
    for name, handlers in captured.items():
        for method, h in list(handlers.items()):
            h = h._replace(request_deserializer=_lenient(h.request_deserializer, method))
            if response_serializers and method in response_serializers:
                h = h._replace(response_serializer=response_serializers[method])
            handlers[method] = h
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)
