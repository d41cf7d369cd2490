"""Scan pages read without copying their rows: the client's deserializer of Scan and ScanNext.

Theory of operation
-------------------
A scan page is a ScanResponsePB whose `batch` field holds megabytes of Arrow IPC and whose
other fields are a few dozen bytes. Parsed as a protobuf message, the rows were copied twice
more after gRPC had assembled the message: into the parser's arena, and into a fresh `bytes`
object each time `batch` was read. Each copy also faulted in fresh memory, and together they
were about a quarter of a secured scan's client CPU (profiled with `perf` at 30 MB per scan).

`parse_scan_response` walks the message's top-level fields in wire format instead. The small
fields go to the generated parser as a message of their own (the bytes before and after
`batch`); `batch` itself becomes a zero-copy `pyarrow.Buffer` over the received bytes, which
Arrow's IPC reader then reads in place. The received bytes live as long as any batch read
from the page does, as they did when the page was a message.

Hostile or broken bytes get what the generated parser would give them: any field the walk
cannot frame (a truncated varint or length, a wire type protobuf does not have) makes the
whole message go to `ScanResponsePB.FromString`, which raises its `DecodeError`. The walk
never reads past the message. A `batch` field that occurs more than once is taken from its
last occurrence, as protobuf merges a singular field.

`ScanStub` is the tablet server's data service stub whose Scan and ScanNext answer with a
`ScanReply`; every other method is the generated one. The client's channel pool hands it out
for every tablet server (service/client/channels.py). Making one also has the process receive
pages into memory it reuses rather than fresh memory each page (service/client/page_memory.py).
"""

from __future__ import annotations

from typing import Any

import grpc.aio
import pyarrow as pa

from service.client.page_memory import reuse_large_blocks
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc

__all__ = ["ScanReply", "ScanStub", "parse_scan_response"]

_BATCH_FIELD = 2
_SERVICE = "/tessera.tserver.TabletServerService/"


class ScanReply:
    """A scan page: the ScanResponsePB's small fields as `header` (and as attributes of the
    reply itself, so code written for the message reads them unchanged), and `batch` as a
    zero-copy Arrow buffer over the bytes received."""

    __slots__ = ("batch", "header")

    def __init__(self, header: tpb.ScanResponsePB, batch: pa.Buffer) -> None:
        self.header = header
        self.batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.header, name)

    def to_pb(self) -> tpb.ScanResponsePB:
        """The page as a message (copies the rows: tests and diagnostics)."""
        pb = tpb.ScanResponsePB()
        pb.CopyFrom(self.header)
        pb.batch = self.batch.to_pybytes()
        return pb


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; ValueError if it runs past `end` or
    is longer than ten bytes."""
    value = shift = 0
    while pos < end and shift < 70:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated or overlong varint")


def _batch_span(data: bytes) -> tuple[int, int, int, int] | None:
    """(start, end) of the last `batch` field's whole encoding (tag to payload end) and
    (start, end) of its payload; None when there is no such field. ValueError when a field
    cannot be framed."""
    end = len(data)
    pos = 0
    found = None
    while pos < end:
        field_start = pos
        key, pos = _varint(data, pos, end)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(data, pos, end)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _varint(data, pos, end)
            if number == _BATCH_FIELD and pos + length <= end:
                found = (field_start, pos + length, pos, pos + length)
            pos += length
        else:
            raise ValueError(f"wire type {wire_type}")
        if pos > end:
            raise ValueError("field runs past the message")
    return found


def parse_scan_response(data: bytes) -> ScanReply:
    """The gRPC response deserializer of Scan and ScanNext (module docstring)."""
    try:
        span = _batch_span(data)
    except ValueError:
        header = tpb.ScanResponsePB.FromString(data)  # raises the parser's DecodeError
        return ScanReply(header, pa.py_buffer(header.batch))
    if span is None:
        return ScanReply(tpb.ScanResponsePB.FromString(data), pa.py_buffer(b""))
    field_start, field_end, lo, hi = span
    view = memoryview(data)
    rest = b"".join((view[:field_start], view[field_end:]))
    header = tpb.ScanResponsePB.FromString(rest)
    header.ClearField("batch")  # an earlier occurrence, overridden by the last
    return ScanReply(header, pa.py_buffer(view[lo:hi]))


class ScanStub(tpb_grpc.TabletServerServiceStub):
    """The data service's stub, with Scan and ScanNext answering `ScanReply`s."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        reuse_large_blocks()  # pages received into reused memory (page_memory.py)
        super().__init__(channel)  # type: ignore[call-arg]
        self.Scan = channel.unary_unary(  # type: ignore[assignment]
            _SERVICE + "Scan",
            request_serializer=tpb.ScanRequestPB.SerializeToString,
            response_deserializer=parse_scan_response,
        )
        self.ScanNext = channel.unary_unary(  # type: ignore[assignment]
            _SERVICE + "ScanNext",
            request_serializer=tpb.ScanNextRequestPB.SerializeToString,
            response_deserializer=parse_scan_response,
        )
