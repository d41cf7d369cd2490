"""The client's zero-copy reading of scan pages (service/client/scan_reply.py) against the
generated protobuf parser: the same fields for every well-formed message, the same error for
every malformed one, and the rows read in place."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError

from service.client.scan_reply import ScanReply, parse_scan_response
from service.pb import tserver_pb2 as tpb


def _ipc(n: int) -> bytes:
    table = pa.table({"id": pa.array(range(n), pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _same(reply: ScanReply, pb: tpb.ScanResponsePB) -> None:
    assert reply.batch.to_pybytes() == pb.batch
    assert reply.to_pb() == pb
    for name in ("scanner_id", "has_more_results", "last_primary_key", "applied_index"):
        assert getattr(reply, name) == getattr(pb, name)
    assert reply.schema_version == pb.schema_version
    assert reply.snapshot_timestamp == pb.snapshot_timestamp


def test_every_field_reads_as_the_generated_parser_reads_it_and_the_rows_in_place() -> None:
    pb = tpb.ScanResponsePB(
        scanner_id=b"\x01" * 16,
        batch=_ipc(1000),
        has_more_results=True,
        last_primary_key=b"\x80\x00\x03\xe7",
        applied_index=2**40,
        schema_version=7,
        snapshot_timestamp=2**63 + 5,
    )
    data = pb.SerializeToString()
    reply = parse_scan_response(data)
    _same(reply, pb)
    assert pa.ipc.open_stream(reply.batch).read_all().num_rows == 1000
    # In place: the rows' buffer lies inside the received bytes, not in a copy.
    start = data.index(pb.batch)
    assert reply.batch.address - pa.py_buffer(data).address == start


def test_fields_in_any_order_a_repeated_batch_and_no_batch_at_all() -> None:
    head = tpb.ScanResponsePB(applied_index=3, scanner_id=b"s").SerializeToString()
    first = tpb.ScanResponsePB(batch=b"old").SerializeToString()
    last = tpb.ScanResponsePB(batch=_ipc(3)).SerializeToString()
    tail = tpb.ScanResponsePB(schema_version=2).SerializeToString()
    for data in (first + head + last + tail, last + head, head + tail, b""):
        _same(parse_scan_response(data), tpb.ScanResponsePB.FromString(data))


def test_unknown_fields_of_every_wire_type_are_kept_as_the_generated_parser_keeps_them() -> None:
    # field 20 varint, 21 fixed64, 22 length-delimited, 23 fixed32: a newer server's fields
    unknown = b"".join(
        (b"\xa0\x01\x05", b"\xa9\x01" + b"\x00" * 8, b"\xb2\x01\x02hi", b"\xbd\x01" + b"\x00" * 4)
    )
    data = tpb.ScanResponsePB(batch=_ipc(2), applied_index=9).SerializeToString() + unknown
    reply = parse_scan_response(data)
    _same(reply, tpb.ScanResponsePB.FromString(data))


def test_malformed_bytes_raise_what_the_generated_parser_raises_and_never_more() -> None:
    """Every prefix of a page, and random mutations of it: the reply equals the generated
    parser's message whenever that parses, and a DecodeError is raised whenever it does not."""
    good = tpb.ScanResponsePB(
        scanner_id=b"id", batch=_ipc(5), has_more_results=True, applied_index=300
    ).SerializeToString()
    rng = random.Random(35)
    cases = [good[:i] for i in range(len(good))]
    for _ in range(2000):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    cases += [b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x0f", b"\x12\x05ab"]
    for data in cases:
        try:
            want = tpb.ScanResponsePB.FromString(data)
        except DecodeError:
            with pytest.raises(DecodeError):
                parse_scan_response(data)
            continue
        _same(parse_scan_response(data), want)
