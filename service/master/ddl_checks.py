"""Checks of DDL arguments that need no catalog state: pure functions (limits from the settings
are passed in), each raising InvalidArgument with a message that names the offending field
(docs/design/catalog.md#R1: bad input gets a clear error and changes nothing). The catalog manager
runs them before it takes any lock.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import replace

from service.common.errors import InvalidArgument
from service.common.partition import Partition, PartitionSchema
from service.common.schema import (
    MAX_COLUMNS,
    AddColumn,
    AlterOp,
    ColumnSchema,
    DropColumn,
    RenameColumn,
    Schema,
)
from service.master.catalog_records import MAX_NAME_BYTES, HostPort, RequestId

__all__ = [
    "MAX_CLIENT_ID",
    "check_alter_steps",
    "check_num_replicas",
    "check_owner",
    "check_partitioning",
    "check_request_id",
    "check_schema",
    "check_table_name",
    "host_port",
    "is_int",
    "utf8_size",
]

MAX_CLIENT_ID = 128
"""Longest client id of a request id, in characters."""


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def utf8_size(s: str, what: str) -> int:
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what}: {s!r} is not valid UTF-8") from None


def check_table_name(name: object, what: str) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"{what}: a table name must be a string, got {name!r}")
    if not name:
        raise InvalidArgument(f"{what}: the table name is empty")
    if (size := utf8_size(name, what)) > MAX_NAME_BYTES:
        raise InvalidArgument(f"{what}: table name of {size} bytes, longer than {MAX_NAME_BYTES}")
    for ch in name:
        if unicodedata.category(ch) == "Cc":
            raise InvalidArgument(f"{what}: table name {name!r} contains control character {ch!r}")
    return name


def check_request_id(req: object) -> RequestId:
    if not isinstance(req, RequestId):
        raise InvalidArgument("request_id: missing (every DDL request carries a client request id)")
    if not isinstance(req.client_id, str) or not req.client_id:
        raise InvalidArgument("request_id.client_id: missing")
    if len(req.client_id) > MAX_CLIENT_ID:
        raise InvalidArgument(f"request_id.client_id: longer than {MAX_CLIENT_ID} characters")
    if not is_int(req.seq_no) or req.seq_no < 1:
        raise InvalidArgument(f"request_id.seq_no: must be an integer >= 1, got {req.seq_no!r}")
    first = req.first_incomplete_seq_no
    if not is_int(first) or not 0 <= first <= req.seq_no:
        raise InvalidArgument(f"request_id.first_incomplete_seq_no: not in 0..seq_no: {first!r}")
    return req


def check_schema(schema: object) -> Schema:
    """The schema with ids assigned in column order and version 0, validated."""
    if not isinstance(schema, Schema):
        raise InvalidArgument(f"schema: missing or not a Schema ({type(schema).__name__})")
    columns = []
    for i, c in enumerate(schema.columns):
        if not isinstance(c, ColumnSchema):
            raise InvalidArgument(f"schema: column {i} is not a ColumnSchema: {c!r}")
        columns.append(replace(c, id=i))
    out = Schema(tuple(columns), schema.key, 0, 0)
    try:
        out.validate()
    except InvalidArgument as e:
        raise InvalidArgument(f"schema: {e.message}") from None
    return out


def check_partitioning(partition_schema: object, schema: Schema) -> list[Partition]:
    if not isinstance(partition_schema, PartitionSchema):
        what = type(partition_schema).__name__
        raise InvalidArgument(f"partition_schema: missing or not a PartitionSchema ({what})")
    try:
        return partition_schema.create_partitions(schema)
    except InvalidArgument as e:
        raise InvalidArgument(f"partition_schema: {e.message}") from None


MAX_ALTER_STEPS = MAX_COLUMNS
"""Steps in one AlterTable: a table never has more than MAX_COLUMNS columns, so no valid alter
needs more, and each step costs a schema rebuild on the leader's event loop (10,000 steps once
froze a master for over 12 s and cost it leadership)."""


def check_alter_steps(ops: object) -> tuple[AlterOp, ...]:
    if isinstance(ops, str | bytes) or not isinstance(ops, Iterable):
        raise InvalidArgument(f"steps: must be a list of alter steps, got {ops!r}")
    steps = tuple(ops)
    if len(steps) > MAX_ALTER_STEPS:
        raise InvalidArgument(
            f"steps: {len(steps)} alter steps in one request; at most {MAX_ALTER_STEPS} (a table "
            f"has at most {MAX_COLUMNS} columns): split the alter"
        )
    for i, op in enumerate(steps):
        if not isinstance(op, AddColumn | DropColumn | RenameColumn):
            raise InvalidArgument(f"steps[{i}]: unknown alter step {op!r}")
    return steps


def host_port(address: str) -> HostPort:
    host, _, port = address.rpartition(":")
    return HostPort(host, int(port))


def check_num_replicas(n: int, default: int, maximum: int) -> int:
    """The replication factor asked for (0: `default`): odd, from 1 to `maximum`."""
    if not is_int(n):
        raise InvalidArgument(f"num_replicas: must be an integer, got {n!r}")
    if n == 0:
        return default
    if n < 0:
        raise InvalidArgument(f"num_replicas: must be >= 1 (0 for the default), got {n}")
    if n % 2 == 0:
        raise InvalidArgument(f"num_replicas: must be odd so a majority survives, got {n}")
    if n > maximum:
        raise InvalidArgument(f"num_replicas: {n} is above the maximum {maximum}")
    return n


def check_owner(owner: object, max_bytes: int) -> str:
    if not isinstance(owner, str):
        raise InvalidArgument(f"owner: must be a string, got {owner!r}")
    if (size := utf8_size(owner, "owner")) > max_bytes:
        raise InvalidArgument(f"owner: {size} bytes, longer than {max_bytes}")
    return owner
