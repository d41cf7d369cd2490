"""The fuzzing campaign's values: hostile constants, what each field names, byte mutations.

Theory of operation
-------------------
A field's value is picked by what the field holds (`kind`, from its name and message: a
tablet id, the destination uuid, a column name, an encoded key, Arrow rows, a term...), so the
generator (fuzz_gen.py) can choose it from the live cluster's vocabulary, from the hostile
constants of its type, or at random. The hostile constants are the values that have broken
servers before: type boundaries, unknown enum numbers, empty and huge strings, NULs, path
traversal, markup, right-to-left overrides.

`Mutation`s then change a serialized message as bytes (`apply_mutations`): flip a bit,
overwrite, insert, delete or duplicate a run, truncate, append a string field of invalid UTF-8,
a length prefix running past the end, an unknown field, an overlong varint. Positions are
taken modulo the length, so a mutation applies to any message and the result depends on
nothing but the bytes and the mutation.

Placeholders (`DEST`, `LIVE_SCANNER`, `LIVE_SESSION`, `LIVE_SEQNO`, `LIVE_INCARNATION`,
`LIVE_TERM`, `LIVE_INDEX`) stand for what only the running campaign knows when it sends a case:
the uuid of the server the case goes to, a scanner or a tablet copy session it has just opened,
the member tablet server's registered instance seqno and its incarnation, and a fixture
tablet's current term and config op index (plus a small offset: "the term after the current
one"). The campaign replaces them before it encodes
the case (fuzz_prepare.bind).

`IDENTITIES` and the `Vocabulary` (the live cluster's names, filled in by the campaign) live
here too, below the generator and its templates, which both read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from service.common.partition import Partition, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema

__all__ = [
    "DEST",
    "FILES",
    "HOSTILE_BYTES",
    "HOSTILE_STRINGS",
    "HOSTS",
    "IDENTITIES",
    "INT_RANGES",
    "LIVE_INCARNATION",
    "LIVE_INDEX",
    "LIVE_SCANNER",
    "LIVE_SEQNO",
    "LIVE_SESSION",
    "LIVE_TERM",
    "NUM_OPS",
    "ODD_TYPES",
    "PORTS",
    "ROLES",
    "Mutation",
    "Vocabulary",
    "apply_mutations",
    "arrow_value",
    "keyish",
    "kind",
    "live_offset",
    "weighted",
]


@dataclass(frozen=True)
class Mutation:
    """One byte-level change of a serialized message; positions are taken modulo its length
    when applied, so a mutation drawn for one message applies to any."""

    op: int
    pos: int
    arg: int
    data: bytes


NUM_OPS = 10


def apply_mutations(data: bytes, mutations: Sequence[Mutation]) -> bytes:
    """`data` with each mutation applied in turn (deterministic)."""
    b = bytearray(data)
    for m in mutations:
        n = len(b)
        at = m.pos % (n + 1)
        op = m.op % NUM_OPS
        if op in (0, 1, 4) and not n:  # nothing to flip, overwrite or duplicate
            continue
        if op == 0:  # flip one bit
            b[at % n] ^= 1 << (m.arg % 8)
        elif op == 1:  # overwrite one byte
            b[at % n] = m.arg % 256
        elif op == 2:  # insert bytes
            b[at:at] = m.data or b"\xff"
        elif op == 3:  # delete a run
            del b[at : at + 1 + m.arg % 16]
        elif op == 4:  # duplicate a run
            run = bytes(b[at : at + 1 + m.arg % 64])
            b[at:at] = run * (1 + m.arg % 3)
        elif op == 5:  # truncate
            del b[at:]
        elif op == 6:  # a string field (1..15) of invalid UTF-8
            b += bytes([((1 + m.arg % 15) << 3) | 2, 3]) + b"\xff\xfe\xfd"
        elif op == 7:  # a length-delimited field whose length runs past the end
            b += bytes([((1 + m.arg % 15) << 3) | 2]) + b"\xff\xff\xff\xff\x0f"
        elif op == 8:  # an unknown field with a high number
            b += _varint(((1 << 20) + m.arg) << 3) + _varint(m.arg)
        else:  # an overlong varint in a field (1..15)
            b += bytes([(1 + m.arg % 15) << 3]) + b"\xff" * 10 + b"\x01"
    return bytes(b)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


# --- hostile values and kinds -------------------------------------------------------------

_I32 = (0, 1, -1, 2, 127, 128, 255, 256, 2**15 - 1, 2**16, 2**31 - 1, -(2**31), -(2**31) + 1)
_U32 = (0, 1, 2, 3, 255, 256, 65_535, 65_536, 2**31 - 1, 2**31, 2**32 - 1)
_I64 = (*_I32, 2**32, 2**53, 2**62, 2**63 - 1, -(2**63), -(2**63) + 1)
_U64 = (*_U32, 2**32, 2**53, 2**63 - 1, 2**63, 2**64 - 1)
HOSTILE_STRINGS = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "\n",
    "%s%n%x",
    "../../../../etc/passwd",
    "/",
    ".",
    "..",
    "*",
    "\\",
    "ü",
    "\u202e",
    "\U0001f600" * 8,
    "a" * 255,
    "a" * 256,
    "a" * 4096,
    "x" * 65_536,
    "y" * 262_144,
    "' OR 1=1 --",
    "<script>alert(1)</script>",
    "sys.catalog",
)
HOSTILE_BYTES = (
    b"",
    b"\x00",
    b"\xff" * 8,
    b"\x80",
    b"\x00\x01\x00",
    b"\xff\xff\xff\xff\x0f garbage",
    b"\x00" * 65_536,
    bytes(range(256)) * 16,
)
HOSTS = ("127.0.0.1", "localhost", "", "::1", "[::1]", "0.0.0.0", "256.256.256.256", "a" * 300)
PORTS = (0, 1, 65_535, 65_536, 2**32 - 1)
ROLES = ("user", "admin", "join", "tserver", "master", "", "ADMIN", "user\x00admin")
FILES = ("MANIFEST", "../../../etc/passwd", "/etc/passwd", "", ".", "..", "wal-000001", "x" * 300)

INT_RANGES: dict[int, tuple[int, int, tuple[int, ...]]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1, _I32),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1, _I32),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1, _I32),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1, _U32),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1, _U32),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1, _I64),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1, _I64),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1, _I64),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1, _U64),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1, _U64),
}

_TABLE_NAME_FIELDS = {
    "CreateTableRequestPB.name",
    "TableIdentifierPB.table_name",
    "AlterTableRequestPB.new_table_name",
    "ListTablesRequestPB.name_filter",
    "ListGrantsRequestPB.table_name",
    "CreateTabletRequestPB.table_name",
    "AlterSchemaRequestPB.new_table_name",
}
_COLUMN_FIELDS = {
    "ColumnSchemaPB.name",
    "SchemaPB.key_column_names",
    "DropColumn.name",
    "RenameColumn.old_name",
    "RenameColumn.new_name",
    "NewScanRequestPB.projected_columns",
    "ColumnPredicatePB.column",
    "SplitKeyRangeRequestPB.columns",
}
_PRINCIPAL_FIELDS = {
    "GrantPrivilegesRequestPB.user",
    "ListGrantsRequestPB.user",
    "CreateTableRequestPB.owner",
    "IssueCertificateRequestPB.name",
    "RequestIdPB.client_id",
}
_KEY_FIELD_PARTS = ("primary_key", "lower", "upper", "split_keys", "partition_key", "values")
_CALLER_FIELDS = {"src_uuid", "master_uuid", "permanent_uuid", "requestor_uuid", "from"}
"""Fields naming the caller: they take the identity's name most of the time (coherence)."""


_BY_NAME = {
    "table_id": "table_id",
    "group_id": "tablet_id",
    "dest_uuid": "dest",
    "host": "host",
    "port": "port",
    "file_name": "file",
    "rows": "rows",
    "authz_token": "token",
    "csr_der": "csr",
    "scanner_id": "scanner",
    "session_id": "session",
}
"""Fields whose name alone says what they hold."""


def kind(f: Any) -> str:
    """What a field holds, by its name, for picking values from the vocabulary."""
    full = f"{f.containing_type.name}.{f.name}"
    name = f.name
    if full in _TABLE_NAME_FIELDS:
        return "table_name"
    if full in _COLUMN_FIELDS:
        return "column"
    if full in _PRINCIPAL_FIELDS:
        return "principal"
    if name in _BY_NAME:
        return _BY_NAME[name]
    if "tablet_id" in name:
        return "tablet_id"
    if name in _CALLER_FIELDS:
        return "caller"
    if name.endswith("uuid") or name in ("uuid", "to", "voters", "learners"):
        return "uuid"
    if name == "role" and f.type == FieldDescriptor.TYPE_STRING:
        return "role"
    if f.type == FieldDescriptor.TYPE_BYTES and any(p in name for p in _KEY_FIELD_PARTS):
        return "key"
    if "term" in name:
        return "term"
    if "index" in name or name in ("commit", "seq_no", "first_incomplete_seq_no"):
        return "index"
    return ""


DEST = "\x00dest"
"""The uuid of the server the case is sent to (a hint of `dest_uuid` fields)."""
LIVE_SCANNER = b"\x00live-scanner"
"""A scanner id the campaign replaces by one it has just opened (ScanNext, ScanClose)."""
LIVE_SESSION = "\x00live-session"
"""A tablet copy session id the campaign replaces by one it has just begun."""
LIVE_INCARNATION = "\x00live-incarnation"
"""The member tablet server's incarnation (its data directory's id, which every Raft message
it sends names): the campaign reads it from that directory."""
LIVE_SEQNO = 0x5E90_0000_0000_0000
"""An instance seqno the campaign replaces by the member tablet server's registered one (a
heartbeat with another seqno is only told to re-register: its report is never read)."""
LIVE_TERM = 0x7E40_0000_0000_0000
"""`LIVE_TERM + k`: the named tablet's current term plus k."""
LIVE_INDEX = 0x1D40_0000_0000_0000
"""`LIVE_INDEX + k`: the named tablet's committed config op index plus k."""
LIVE_SPAN = 1 << 16
"""Offsets a live placeholder may carry. Random 64-bit draws land in a span with odds of
2**-48: a hostile value is never mistaken for one."""


def live_offset(value: int, base: int) -> int | None:
    """k if `value` is the placeholder `base + k`, else None."""
    k = value - base
    return k if 0 <= k < LIVE_SPAN else None


# --- strategies of values ---------------------------------------------------------------

ODD_TYPES = (pa.int8(), pa.float32(), pa.string(), pa.binary(), pa.bool_(), pa.null())


def weighted(
    usual: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any], anything: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """`usual` seven times in ten, `hostile` two, `anything` one."""
    return st.integers(0, 9).flatmap(lambda i: usual if i < 7 else hostile if i < 9 else anything)


def keyish(key: bytes) -> bytes:
    """A key cut short or with one byte past its end: near-miss encodings."""
    return key[:-1] if len(key) > 1 else key + b"\x00\x01"


def arrow_value(t: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_integer(t):
        bits = t.bit_width
        if pa.types.is_unsigned_integer(t):
            lo, hi = 0, 2**bits - 1
        else:
            lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        edges = st.sampled_from((lo, hi, 0, 1))
        small = st.integers(max(lo, -300), min(hi, 300))
        return st.one_of(st.none(), edges, st.integers(lo, hi), small)
    if pa.types.is_floating(t):
        return st.one_of(st.none(), st.floats(width=32 if t == pa.float32() else 64))
    if pa.types.is_boolean(t):
        return st.one_of(st.none(), st.booleans())
    if pa.types.is_binary(t):
        return st.one_of(st.none(), st.binary(max_size=32), st.sampled_from(HOSTILE_BYTES[:6]))
    if pa.types.is_string(t):
        return st.one_of(st.none(), st.text(max_size=32), st.sampled_from(HOSTILE_STRINGS[:20]))
    if pa.types.is_timestamp(t):
        return st.one_of(st.none(), st.integers(-(2**62), 2**62))
    return st.none()


# --- who calls, and the names they use ------------------------------------------------------

IDENTITIES = ("admin", "user", "tserver", "master", "member")
"""Who calls: an admin (allowed nearly everything, so requests reach the handlers), a user
with read and write grants on one fixture table, a tablet server and a master whose
certificates are valid but name no member of the cluster, and a member: the first tablet
server of the cluster, with its own real certificate (it hosts a replica of every fixture
tablet), as a stolen certificate or a server gone bad would call."""


@dataclass(frozen=True)
class Vocabulary:
    """The live cluster's names the generator picks from (module docstring). Tuples, so that
    the same index names the same fixture in another cluster set up the same way."""

    table_names: tuple[str, ...] = ("t",)
    table_ids: tuple[str, ...] = ("0" * 32,)
    """Parallel to `table_names`."""
    tablet_ids: tuple[str, ...] = ("1" * 32,)
    tablet_schemas: tuple[int, ...] = (0,)
    """For each of `tablet_ids`, the index in `row_schemas` of its table's schema."""
    tserver_uuids: tuple[str, ...] = ("ts-1", "ts-2", "ts-3")
    master_uuids: tuple[str, ...] = ("m-1", "m-2", "m-3")
    principals: tuple[str, ...] = ("fuzz-admin", "fuzz-user", "ts-fuzz", "fuzz-master", "ts-1")
    """The names of the fuzzer's identities, in the order of IDENTITIES (the member's is the
    first tablet server's uuid)."""
    column_names: tuple[str, ...] = ("k", "v")
    hostports: tuple[tuple[str, int], ...] = tuple(
        ("127.0.0.1", p) for p in (7051, 7052, 7053, 7050, 7060, 7070)
    )
    """Every server's address, the masters' first, then the tablet servers'."""
    keys: tuple[bytes, ...] = (b"",)
    """Encoded primary and partition keys that decode under a fixture's key."""
    authz_tokens: tuple[bytes, ...] = (b"",)
    """The first is the fuzz user's valid token for the table it may use."""
    terms: tuple[int, ...] = (1,)
    """Terms and indexes the cluster is at now, so that some requests are current."""
    row_schemas: tuple[pa.Schema, ...] = (pa.schema([("k", pa.int64()), ("v", pa.string())]),)
    """The tables' Arrow schemas (Write rows are built for them)."""
    table_schemas: tuple[Schema, ...] = (
        Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], key="k"),
    )
    """The same tables' schemas, parallel to `row_schemas`."""
    partition_schemas: tuple[PartitionSchema, ...] = (PartitionSchema(range=RangeSchema(("k",))),)
    """Their partitioning, parallel to `row_schemas`."""
    tablet_partitions: tuple[Partition | None, ...] = ()
    """For each of `tablet_ids` (as far as known), its partition as the master reported it:
    misrouted rows are made for the tablets whose partition does not cover every key."""
    csrs: tuple[bytes, ...] = (b"",)
    """Valid PKCS#10 requests (DER), for IssueCertificate."""

    def principal(self, identity: str) -> str:
        return self.principals[IDENTITIES.index(identity)]

    def tserver_address(self, i: int) -> tuple[str, int]:
        return self.hostports[(len(self.master_uuids) + i) % len(self.hostports)]

    def partition(self, tablet: int) -> Partition | None:
        """The partition of `tablet_ids[tablet]`, if known and not all of its table."""
        p = self.tablet_partitions[tablet] if tablet < len(self.tablet_partitions) else None
        if p is None or (not p.partition_key_start and not p.partition_key_end):
            return None
        return p
