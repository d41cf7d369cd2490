"""The records of sys.catalog as values, and their protobuf form (master.proto).

Theory of operation
-------------------
sys.catalog is a set of rows keyed by (entry type, id), each one serialized record, as in Kudu's
sys.catalog tablet (docs/design/catalog.md): a table, a tablet, the root CA or a token signing
key (docs/design/security.md#R2, #R3). This module holds

* the records as frozen dataclasses (`TableRecord`, `TabletRecord`, `CertAuthorityRecord`,
  `TokenSigningKeyRecord`, `GrantRecord`: a user's privileges on one table,
  `JoinCredentialUseRecord`: a join credential that enrolled its one tablet server) with their
  states as enums, and `RowKey`, a row's key;
* the codec between them and master.proto. Encoding takes valid values. Decoding takes whatever
  a replicated entry or a snapshot holds and returns a *validated* record, or raises
  InvalidArgument naming the record by its id and the field by its path ("tablet 'ab12...':
  partition.partition_key_start: does not agree ..."). `sys_catalog` decodes every record it
  applies, so a record that is stored is a record that decodes;
* `CatalogWrite`, the value the catalog manager builds for one logical operation (one
  operation = one replicated entry, docs/design/catalog.md#R4), and its encoding, the payload of
  that entry.

Only this module and `sys_catalog` know master.proto's record messages (protobuf at the edges).

Validation here concerns one record alone: ids in canonical form, a decodable schema and
partitioning, known states, a sane consensus state. Rules that relate a record to the rest of
the catalog (a tablet's table exists, names are unique, REMOVED is final) are `sys_catalog`'s,
checked at apply time against the replicated state.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeAlias, cast

from service.common.errors import InvalidArgument
from service.common.ids import NodeId, TableId, TabletId, validate_node_id, validate_uuid
from service.common.partition import Partition, PartitionSchema
from service.common.schema import MAX_NAME_BYTES, Schema
from service.common.schema_codec import (
    partition_from_pb,
    partition_schema_from_pb,
    partition_schema_to_pb,
    partition_to_pb,
    schema_from_pb,
    schema_to_pb,
)
from service.common.tokens import Privilege
from service.pb import master_pb2 as pb

__all__ = [
    "CA_ENTRY_ID",
    "CatalogWrite",
    "CertAuthorityRecord",
    "ConsensusState",
    "Delete",
    "HostPort",
    "Insert",
    "JoinCredentialUseRecord",
    "MemberType",
    "Precondition",
    "RaftPeer",
    "Record",
    "RecordType",
    "RequestId",
    "RowKey",
    "RowOp",
    "TableRecord",
    "TableState",
    "TabletRecord",
    "TabletState",
    "TokenSigningKeyRecord",
    "TxnRecord",
    "TxnState",
    "Update",
    "Upsert",
    "consensus_state_from_pb",
    "consensus_state_to_pb",
    "key_from_pb",
    "key_to_pb",
    "record_from_pb",
    "record_key",
    "record_to_pb",
    "request_id_from_pb",
    "request_id_to_pb",
    "table_from_pb",
    "table_to_pb",
    "tablet_from_pb",
    "tablet_to_pb",
    "tsk_entry_id",
    "txn_entry_id",
    "txn_from_pb",
    "txn_to_pb",
]

CA_ENTRY_ID = "root-ca"
"""The id of the one cert-authority row."""


# --- keys and enums --------------------------------------------------------------------------


class RecordType(enum.Enum):
    """What a row holds. Values are EntryTypePB's: they order rows in snapshots and dumps."""

    TABLE = pb.ENTRY_TYPE_TABLE
    TABLET = pb.ENTRY_TYPE_TABLET
    CERT_AUTHORITY = pb.ENTRY_TYPE_CERT_AUTHORITY
    TOKEN_SIGNING_KEY = pb.ENTRY_TYPE_TOKEN_SIGNING_KEY
    GRANT = pb.ENTRY_TYPE_GRANT
    JOIN_CREDENTIAL_USE = pb.ENTRY_TYPE_JOIN_CREDENTIAL_USE
    TXN = pb.ENTRY_TYPE_TXN

    @property
    def noun(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True)
class RowKey:
    """A row's key, (entry type, id). Snapshots and dumps order rows by entry type number, then
    id (`SysCatalogState._sorted_rows`)."""

    entry_type: RecordType
    entry_id: str

    def __str__(self) -> str:
        return f"{self.entry_type.noun} {self.entry_id!r}"


class TableState(enum.Enum):
    PREPARING = pb.TableRecordPB.PREPARING
    RUNNING = pb.TableRecordPB.RUNNING
    ALTERING = pb.TableRecordPB.ALTERING
    REMOVED = pb.TableRecordPB.REMOVED


class TabletState(enum.Enum):
    PREPARING = pb.TabletRecordPB.PREPARING
    CREATING = pb.TabletRecordPB.CREATING
    RUNNING = pb.TabletRecordPB.RUNNING
    REPLACED = pb.TabletRecordPB.REPLACED
    DELETED = pb.TabletRecordPB.DELETED

    @property
    def is_terminal(self) -> bool:
        """REPLACED and DELETED tablets never serve again (their records stay:
        docs/design/catalog.md#R8)."""
        return self in (TabletState.REPLACED, TabletState.DELETED)


class MemberType(enum.Enum):
    VOTER = pb.VOTER
    NON_VOTER = pb.NON_VOTER


def tsk_entry_id(key_seq: int) -> str:
    """A signing key's row id: 20 zero-padded digits, so id order is key_seq order."""
    return f"{key_seq:020d}"


# --- consensus state -------------------------------------------------------------------------


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class RaftPeer:
    uuid: NodeId
    member_type: MemberType
    last_known_addr: HostPort | None = None
    # NON_VOTER only: promote once caught up (Kudu's PRE_VOTER, docs/design/tablet_copy.md#R7)
    promote: bool = False


@dataclass(frozen=True)
class ConsensusState:
    """A tablet's committed consensus state: term, leader, and the committed config with the
    op index that produced it (the compare-and-set token for config changes,
    docs/design/tablet_copy.md#R8)."""

    term: int
    config_index: int
    peers: tuple[RaftPeer, ...]
    leader_uuid: NodeId | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "peers", tuple(self.peers))

    @property
    def voters(self) -> tuple[NodeId, ...]:
        return tuple(p.uuid for p in self.peers if p.member_type is MemberType.VOTER)

    def peer(self, uuid: str) -> RaftPeer | None:
        return next((p for p in self.peers if p.uuid == uuid), None)


# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRecord:
    """A table's row. `schema.version` is the table's schema version."""

    table_id: TableId
    name: str
    schema: Schema
    partition_schema: PartitionSchema
    state: TableState
    num_replicas: int
    created_time_us: int = 0
    altered_time_us: int = 0
    owner: str = ""
    state_msg: str = ""
    fully_applied_schema: Schema | None = None  # while ALTERING (Kudu's fully_applied_schema)

    @property
    def schema_version(self) -> int:
        return self.schema.version

    @property
    def is_removed(self) -> bool:
        return self.state is TableState.REMOVED


@dataclass(frozen=True)
class TabletRecord:
    """A tablet's row. `consensus` is absent while PREPARING, present once replicas are chosen."""

    tablet_id: TabletId
    table_id: TableId
    partition: Partition
    state: TabletState
    consensus: ConsensusState | None = None
    reported_schema_version: int = 0
    replaced_by: TabletId | None = None
    replaces: TabletId | None = None
    created_time_us: int = 0
    state_msg: str = ""


@dataclass(frozen=True)
class CertAuthorityRecord:
    """The internal root CA (docs/design/security.md#R2). The key never appears in a repr."""

    certificate_pem: bytes
    private_key_pem: bytes = field(repr=False)


@dataclass(frozen=True)
class TokenSigningKeyRecord:
    """A token signing key (docs/design/security.md#R3). The key never appears in a repr."""

    key_seq: int
    expire_time_us: int
    private_key_der: bytes = field(repr=False)


_PRIVILEGE_TO_PB = {
    Privilege.READ: pb.PRIVILEGE_READ,
    Privilege.WRITE: pb.PRIVILEGE_WRITE,
    Privilege.ALTER: pb.PRIVILEGE_ALTER,
}
_PRIVILEGE_OF_PB = {v: k for k, v in _PRIVILEGE_TO_PB.items()}
MAX_USER_NAME = 128


def privileges_to_pb(privileges: Iterable[Privilege]) -> list[pb.PrivilegePB.ValueType]:
    """Ascending by number, no repeats: the canonical stored order."""
    return sorted({_PRIVILEGE_TO_PB[p] for p in privileges})


def privileges_from_pb(values: Iterable[int], path: str) -> frozenset[Privilege]:
    out = set()
    for v in values:
        if v not in _PRIVILEGE_OF_PB:
            raise InvalidArgument(f"{path}: unknown privilege {v}")
        out.add(_PRIVILEGE_OF_PB[cast(pb.PrivilegePB.ValueType, v)])
    return frozenset(out)


def check_user_name(user: str, path: str = "user") -> str:
    """A user name as certificates and tokens carry it: 1-128 printable characters, no spaces."""
    if not user:
        raise InvalidArgument(f"{path}: missing")
    if len(user) > MAX_USER_NAME:
        raise InvalidArgument(f"{path}: longer than {MAX_USER_NAME} characters")
    if not user.isprintable() or any(c.isspace() for c in user):
        raise InvalidArgument(f"{path}: {user!r} has spaces or unprintable characters")
    return user


def grant_entry_id(table_id: str, user: str) -> str:
    """A grant's row id: "<table_id>/<user>" (a table id is a uuid, so the first "/" splits)."""
    return f"{table_id}/{user}"


@dataclass(frozen=True)
class GrantRecord:
    """The privileges `user` holds on table `table_id` (never empty: an empty grant is deleted)."""

    table_id: TableId
    user: str
    privileges: frozenset[Privilege]


@dataclass(frozen=True)
class JoinCredentialUseRecord:
    """A join credential that enrolled its one tablet server (docs/design/security.md#R10),
    keyed by the credential's certificate fingerprint; kept until the credential expires."""

    credential_sha256: str
    """Hex SHA-256 of the join certificate (DER): the row id."""
    tserver_uuid: str
    """The uuid it enrolled."""
    public_key_sha256: str
    """Hex SHA-256 of the enrolled key (SubjectPublicKeyInfo DER): a retry must send it again."""
    expire_time_us: int
    """The join certificate's end; the row may be purged after it."""


class TxnState(enum.Enum):
    """A transaction's state (master.proto's TxnStatePB; docs/design/transactions.md#R3)."""

    OPEN = pb.TXN_OPEN
    COMMITTING = pb.TXN_COMMITTING
    COMMITTED = pb.TXN_COMMITTED
    ABORTED = pb.TXN_ABORTED

    @property
    def ended(self) -> bool:
        return self in (TxnState.COMMITTED, TxnState.ABORTED)


def txn_entry_id(txn_id: int) -> str:
    """A transaction row's id: its number, 20 digits, so rows sort in number order."""
    return f"{txn_id:020d}"


@dataclass(frozen=True)
class TxnRecord:
    """One transaction (docs/design/transactions.md#R1); kept after it ends."""

    txn_id: int
    owner: str
    state: TxnState
    participants: tuple[TabletId, ...] = ()
    commit_timestamp: int = 0
    kept_attempts: tuple[str, ...] = ()
    resolved: bool = False
    """Every participant has finalized (COMMITTED) or dropped (ABORTED) its staged rows."""
    stream_query: str = ""
    stream_batch: int = 0
    started_time_us: int = 0
    state_msg: str = ""
    start_timestamp: int = 0
    """Its snapshot (hybrid time): writes conflict with rows committed after it."""
    keepalive_ms: int = 0
    """Its keep-alive period (0: the master's default)."""


Record: TypeAlias = (
    TableRecord
    | TabletRecord
    | CertAuthorityRecord
    | TokenSigningKeyRecord
    | GrantRecord
    | JoinCredentialUseRecord
    | TxnRecord
)


def record_key(record: Record) -> RowKey:
    """The key of the row that holds `record`."""
    if isinstance(record, TableRecord):
        return RowKey(RecordType.TABLE, record.table_id)
    if isinstance(record, TabletRecord):
        return RowKey(RecordType.TABLET, record.tablet_id)
    if isinstance(record, CertAuthorityRecord):
        return RowKey(RecordType.CERT_AUTHORITY, CA_ENTRY_ID)
    if isinstance(record, GrantRecord):
        return RowKey(RecordType.GRANT, grant_entry_id(record.table_id, record.user))
    if isinstance(record, JoinCredentialUseRecord):
        return RowKey(RecordType.JOIN_CREDENTIAL_USE, record.credential_sha256)
    if isinstance(record, TxnRecord):
        return RowKey(RecordType.TXN, txn_entry_id(record.txn_id))
    return RowKey(RecordType.TOKEN_SIGNING_KEY, tsk_entry_id(record.key_seq))


# --- field checks ----------------------------------------------------------------------------


def _canonical_uuid(value: str, path: str) -> str:
    """`value` if it is a uuid in canonical form (32 lowercase hex digits): two spellings of one
    id must never make two rows."""
    try:
        canonical = validate_uuid(value)
    except InvalidArgument:
        canonical = None
    if canonical != value:
        raise InvalidArgument(f"{path}: {value!r} is not a uuid in canonical form (32 hex digits)")
    return value


def _optional_uuid(value: str, path: str) -> str | None:
    return _canonical_uuid(value, path) if value else None


def _enum(cls: type[enum.Enum], value: int, path: str) -> enum.Enum:
    try:
        return cls(value)
    except ValueError:
        raise InvalidArgument(f"{path}: unknown or missing state {value}") from None


def _non_negative(value: int, path: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{path}: must be >= 0, got {value}")
    return value


def _at(prefix: str, e: InvalidArgument) -> InvalidArgument:
    return InvalidArgument(f"{prefix}: {e.message}")


# --- consensus state codec -------------------------------------------------------------------


def host_port_from_pb(p: pb.HostPortPB, path: str) -> HostPort:
    if not p.host:
        raise InvalidArgument(f"{path}.host: missing")
    if not 1 <= p.port <= 65535:
        raise InvalidArgument(f"{path}.port: {p.port} is not a port (1..65535)")
    return HostPort(p.host, p.port)


def consensus_state_to_pb(c: ConsensusState) -> pb.ConsensusStatePB:
    out = pb.ConsensusStatePB(current_term=c.term, leader_uuid=c.leader_uuid or "")
    out.committed_config.opid_index = c.config_index
    for peer in c.peers:
        p = out.committed_config.peers.add(
            permanent_uuid=peer.uuid,
            member_type=peer.member_type.value,
            promote=peer.promote,
        )
        if peer.last_known_addr is not None:
            p.last_known_addr.host = peer.last_known_addr.host
            p.last_known_addr.port = peer.last_known_addr.port
    return out


def consensus_state_from_pb(
    p: pb.ConsensusStatePB, path: str = "consensus_state"
) -> ConsensusState:
    """The committed part of a consensus state, validated (`pending_config` is not read)."""
    peers: list[RaftPeer] = []
    seen: set[str] = set()
    cfg = p.committed_config
    if not cfg.peers:
        raise InvalidArgument(f"{path}.committed_config.peers: missing")
    for i, peer in enumerate(cfg.peers):
        at = f"{path}.committed_config.peers[{i}]"
        try:
            uuid = validate_node_id(peer.permanent_uuid)
        except InvalidArgument as e:
            raise _at(f"{at}.permanent_uuid", e) from None
        if uuid in seen:
            raise InvalidArgument(f"{at}.permanent_uuid: peer {uuid!r} listed twice")
        seen.add(uuid)
        member = _enum(MemberType, peer.member_type, f"{at}.member_type")
        assert isinstance(member, MemberType)
        if peer.promote and member is not MemberType.NON_VOTER:
            raise InvalidArgument(f"{at}.promote: only a NON_VOTER can be promoted")
        addr = (
            host_port_from_pb(peer.last_known_addr, f"{at}.last_known_addr")
            if peer.HasField("last_known_addr")
            else None
        )
        peers.append(RaftPeer(uuid, member, addr, peer.promote))
    if not any(peer.member_type is MemberType.VOTER for peer in peers):
        raise InvalidArgument(f"{path}.committed_config: no VOTER")
    leader = NodeId(p.leader_uuid) if p.leader_uuid else None
    if leader is not None and not any(
        peer.uuid == leader and peer.member_type is MemberType.VOTER for peer in peers
    ):
        raise InvalidArgument(f"{path}.leader_uuid: {leader!r} is not a VOTER of the config")
    return ConsensusState(p.current_term, cfg.opid_index, tuple(peers), leader)


# --- record codecs ---------------------------------------------------------------------------


def table_to_pb(t: TableRecord) -> pb.TableRecordPB:
    """Encodes a valid record (the partition schema is validated against the schema)."""
    out = pb.TableRecordPB(
        table_id=t.table_id,
        name=t.name,
        schema=schema_to_pb(t.schema),
        partition_schema=partition_schema_to_pb(t.partition_schema, t.schema),
        schema_version=t.schema.version,
        state=t.state.value,
        num_replicas=t.num_replicas,
        created_time_us=t.created_time_us,
        altered_time_us=t.altered_time_us,
        owner=t.owner,
        state_msg=t.state_msg,
    )
    if t.fully_applied_schema is not None:
        out.fully_applied_schema.CopyFrom(schema_to_pb(t.fully_applied_schema))
    return out


def table_from_pb(p: pb.TableRecordPB) -> TableRecord:
    """A validated table record; InvalidArgument naming the table and the field."""
    table_id = TableId(_canonical_uuid(p.table_id, "table.table_id"))
    where = f"table {table_id!r}"
    try:
        if not p.name:
            raise InvalidArgument("name: missing")
        if len(p.name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise InvalidArgument(f"name: longer than {MAX_NAME_BYTES} bytes")
        state = _enum(TableState, p.state, "state")
        assert isinstance(state, TableState)
        if not p.HasField("schema"):
            raise InvalidArgument("schema: missing")
        schema = schema_from_pb(p.schema, "schema")
        if p.schema_version != schema.version:
            raise InvalidArgument(
                f"schema_version: {p.schema_version} differs from schema.version {schema.version}"
            )
        if not p.HasField("partition_schema"):
            raise InvalidArgument("partition_schema: missing")
        partition_schema = partition_schema_from_pb(p.partition_schema, schema, "partition_schema")
        if p.num_replicas < 1:
            raise InvalidArgument(f"num_replicas: must be >= 1, got {p.num_replicas}")
        fully_applied = None
        if p.HasField("fully_applied_schema"):
            fully_applied = schema_from_pb(p.fully_applied_schema, "fully_applied_schema")
            if fully_applied.version >= schema.version:
                raise InvalidArgument(
                    f"fully_applied_schema: version {fully_applied.version} is not older than "
                    f"the schema's {schema.version}"
                )
        return TableRecord(
            table_id=table_id,
            name=p.name,
            schema=schema,
            partition_schema=partition_schema,
            state=state,
            num_replicas=p.num_replicas,
            created_time_us=_non_negative(p.created_time_us, "created_time_us"),
            altered_time_us=_non_negative(p.altered_time_us, "altered_time_us"),
            owner=p.owner,
            state_msg=p.state_msg,
            fully_applied_schema=fully_applied,
        )
    except InvalidArgument as e:
        raise _at(where, e) from None


def tablet_to_pb(t: TabletRecord) -> pb.TabletRecordPB:
    out = pb.TabletRecordPB(
        tablet_id=t.tablet_id,
        table_id=t.table_id,
        partition=partition_to_pb(t.partition),
        state=t.state.value,
        state_msg=t.state_msg,
        reported_schema_version=t.reported_schema_version,
        replaced_by_tablet_id=t.replaced_by or "",
        replaces_tablet_id=t.replaces or "",
        created_time_us=t.created_time_us,
    )
    if t.consensus is not None:
        out.consensus_state.CopyFrom(consensus_state_to_pb(t.consensus))
    return out


def tablet_from_pb(p: pb.TabletRecordPB) -> TabletRecord:
    """A validated tablet record; InvalidArgument naming the tablet and the field."""
    tablet_id = TabletId(_canonical_uuid(p.tablet_id, "tablet.tablet_id"))
    where = f"tablet {tablet_id!r}"
    try:
        table_id = TableId(_canonical_uuid(p.table_id, "table_id"))
        state = _enum(TabletState, p.state, "state")
        assert isinstance(state, TabletState)
        if not p.HasField("partition"):
            raise InvalidArgument("partition: missing")
        partition = partition_from_pb(p.partition, "partition")
        consensus = None
        if p.HasField("consensus_state"):
            if p.consensus_state.HasField("pending_config"):
                raise InvalidArgument("consensus_state.pending_config: a record holds no pending")
            consensus = consensus_state_from_pb(p.consensus_state, "consensus_state")
        if state is TabletState.PREPARING and consensus is not None:
            raise InvalidArgument("consensus_state: a PREPARING tablet has no replicas yet")
        if state in (TabletState.CREATING, TabletState.RUNNING) and consensus is None:
            raise InvalidArgument(f"consensus_state: missing for a {state.name} tablet")
        replaced_by = _optional_uuid(p.replaced_by_tablet_id, "replaced_by_tablet_id")
        replaces = _optional_uuid(p.replaces_tablet_id, "replaces_tablet_id")
        if replaced_by is not None and state is not TabletState.REPLACED:
            raise InvalidArgument(f"replaced_by_tablet_id: set on a {state.name} tablet")
        if tablet_id in (replaced_by, replaces):
            raise InvalidArgument("a tablet cannot replace itself")
        return TabletRecord(
            tablet_id=tablet_id,
            table_id=table_id,
            partition=partition,
            state=state,
            consensus=consensus,
            reported_schema_version=p.reported_schema_version,
            replaced_by=TabletId(replaced_by) if replaced_by else None,
            replaces=TabletId(replaces) if replaces else None,
            created_time_us=_non_negative(p.created_time_us, "created_time_us"),
            state_msg=p.state_msg,
        )
    except InvalidArgument as e:
        raise _at(where, e) from None


def cert_authority_to_pb(c: CertAuthorityRecord) -> pb.CertAuthorityRecordPB:
    return pb.CertAuthorityRecordPB(
        certificate_pem=c.certificate_pem, private_key_pem=c.private_key_pem
    )


def cert_authority_from_pb(p: pb.CertAuthorityRecordPB) -> CertAuthorityRecord:
    if not p.certificate_pem:
        raise InvalidArgument("cert authority: certificate_pem: missing")
    if not p.private_key_pem:
        raise InvalidArgument("cert authority: private_key_pem: missing")
    return CertAuthorityRecord(p.certificate_pem, p.private_key_pem)


def tsk_to_pb(k: TokenSigningKeyRecord) -> pb.TokenSigningKeyRecordPB:
    return pb.TokenSigningKeyRecordPB(
        key_seq=k.key_seq, expire_time_us=k.expire_time_us, private_key_der=k.private_key_der
    )


def tsk_from_pb(p: pb.TokenSigningKeyRecordPB) -> TokenSigningKeyRecord:
    where = f"token signing key {p.key_seq}"
    if p.key_seq < 0:
        raise InvalidArgument(f"{where}: key_seq must be >= 0")
    if p.expire_time_us <= 0:
        raise InvalidArgument(f"{where}: expire_time_us: missing")
    if not p.private_key_der:
        raise InvalidArgument(f"{where}: private_key_der: missing")
    return TokenSigningKeyRecord(p.key_seq, p.expire_time_us, p.private_key_der)


def grant_to_pb(g: GrantRecord) -> pb.GrantRecordPB:
    return pb.GrantRecordPB(
        table_id=g.table_id, user=g.user, privileges=privileges_to_pb(g.privileges)
    )


def grant_from_pb(p: pb.GrantRecordPB) -> GrantRecord:
    where = f"grant {p.table_id}/{p.user}"
    try:
        table_id = TableId(_canonical_uuid(p.table_id, "table_id"))
        user = check_user_name(p.user)
        privileges = privileges_from_pb(p.privileges, "privileges")
    except InvalidArgument as e:
        raise _at(where, e) from None
    if not privileges:
        raise InvalidArgument(f"{where}: privileges: empty (a grant with none is deleted)")
    return GrantRecord(table_id, user, privileges)


def join_use_to_pb(u: JoinCredentialUseRecord) -> pb.JoinCredentialUseRecordPB:
    return pb.JoinCredentialUseRecordPB(
        credential_sha256=u.credential_sha256,
        tserver_uuid=u.tserver_uuid,
        public_key_sha256=u.public_key_sha256,
        expire_time_us=u.expire_time_us,
    )


def _sha256_hex(value: str, path: str) -> str:
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise InvalidArgument(f"{path}: {value!r} is not a SHA-256 in lowercase hex")
    return value


def join_use_from_pb(p: pb.JoinCredentialUseRecordPB) -> JoinCredentialUseRecord:
    where = f"join credential use {p.credential_sha256!r}"
    try:
        credential = _sha256_hex(p.credential_sha256, "credential_sha256")
        key = _sha256_hex(p.public_key_sha256, "public_key_sha256")
        if not p.tserver_uuid or len(p.tserver_uuid) > 128:
            raise InvalidArgument(f"tserver_uuid: 1-128 characters, got {p.tserver_uuid!r}")
        if p.expire_time_us <= 0:
            raise InvalidArgument("expire_time_us: missing")
    except InvalidArgument as e:
        raise _at(where, e) from None
    return JoinCredentialUseRecord(credential, p.tserver_uuid, key, p.expire_time_us)


def txn_to_pb(t: TxnRecord) -> pb.TxnRecordPB:
    return pb.TxnRecordPB(
        txn_id=t.txn_id,
        owner=t.owner,
        state=t.state.value,
        participants=list(t.participants),
        commit_timestamp=t.commit_timestamp,
        kept_attempts=list(t.kept_attempts),
        resolved=t.resolved,
        stream_query=t.stream_query,
        stream_batch=t.stream_batch,
        started_time_us=t.started_time_us,
        state_msg=t.state_msg,
        start_timestamp=t.start_timestamp,
        keepalive_ms=t.keepalive_ms,
    )


def txn_from_pb(p: pb.TxnRecordPB) -> TxnRecord:
    where = f"txn {p.txn_id}"
    if p.txn_id <= 0:
        raise InvalidArgument(f"{where}: txn_id must be > 0")
    state = _enum(TxnState, p.state, f"{where}.state")
    assert isinstance(state, TxnState)
    participants = []
    for i, t in enumerate(p.participants):
        participants.append(TabletId(_canonical_uuid(t, f"{where}.participants[{i}]")))
    if len(set(participants)) != len(participants):
        raise InvalidArgument(f"{where}.participants: a tablet is listed twice")
    if state is TxnState.COMMITTED and not p.commit_timestamp:
        raise InvalidArgument(f"{where}: COMMITTED without a commit_timestamp")
    return TxnRecord(
        p.txn_id,
        p.owner,
        state,
        tuple(participants),
        p.commit_timestamp,
        tuple(p.kept_attempts),
        p.resolved,
        p.stream_query,
        p.stream_batch,
        p.started_time_us,
        p.state_msg,
        p.start_timestamp,
        p.keepalive_ms,
    )


RecordPB: TypeAlias = (
    pb.TableRecordPB
    | pb.TabletRecordPB
    | pb.CertAuthorityRecordPB
    | pb.TokenSigningKeyRecordPB
    | pb.GrantRecordPB
    | pb.JoinCredentialUseRecordPB
    | pb.TxnRecordPB
)

# The oneof field that carries each record type in CatalogRowOpPB and CatalogRowPB.
_FIELD = {
    RecordType.TABLE: "table",
    RecordType.TABLET: "tablet",
    RecordType.CERT_AUTHORITY: "cert_authority",
    RecordType.TOKEN_SIGNING_KEY: "token_signing_key",
    RecordType.GRANT: "grant",
    RecordType.JOIN_CREDENTIAL_USE: "join_credential_use",
    RecordType.TXN: "txn",
}
_ENTRY_OF_FIELD = {v: k for k, v in _FIELD.items()}
_MESSAGE = {
    RecordType.TABLE: pb.TableRecordPB,
    RecordType.TABLET: pb.TabletRecordPB,
    RecordType.CERT_AUTHORITY: pb.CertAuthorityRecordPB,
    RecordType.TOKEN_SIGNING_KEY: pb.TokenSigningKeyRecordPB,
    RecordType.GRANT: pb.GrantRecordPB,
    RecordType.JOIN_CREDENTIAL_USE: pb.JoinCredentialUseRecordPB,
    RecordType.TXN: pb.TxnRecordPB,
}


def record_to_pb(record: Record) -> RecordPB:
    if isinstance(record, TableRecord):
        return table_to_pb(record)
    if isinstance(record, TabletRecord):
        return tablet_to_pb(record)
    if isinstance(record, CertAuthorityRecord):
        return cert_authority_to_pb(record)
    if isinstance(record, GrantRecord):
        return grant_to_pb(record)
    if isinstance(record, JoinCredentialUseRecord):
        return join_use_to_pb(record)
    if isinstance(record, TxnRecord):
        return txn_to_pb(record)
    return tsk_to_pb(record)


def record_from_pb(entry_type: RecordType, message: RecordPB) -> Record:
    """The validated record of `entry_type` held by `message` (of the matching type)."""
    if entry_type is RecordType.TABLE:
        assert isinstance(message, pb.TableRecordPB)
        return table_from_pb(message)
    if entry_type is RecordType.TABLET:
        assert isinstance(message, pb.TabletRecordPB)
        return tablet_from_pb(message)
    if entry_type is RecordType.CERT_AUTHORITY:
        assert isinstance(message, pb.CertAuthorityRecordPB)
        return cert_authority_from_pb(message)
    if entry_type is RecordType.GRANT:
        assert isinstance(message, pb.GrantRecordPB)
        return grant_from_pb(message)
    if entry_type is RecordType.JOIN_CREDENTIAL_USE:
        assert isinstance(message, pb.JoinCredentialUseRecordPB)
        return join_use_from_pb(message)
    if entry_type is RecordType.TXN:
        assert isinstance(message, pb.TxnRecordPB)
        return txn_from_pb(message)
    assert isinstance(message, pb.TokenSigningKeyRecordPB)
    return tsk_from_pb(message)


def record_message(entry_type: RecordType) -> type[RecordPB]:
    """The protobuf message class of an entry type's records."""
    return _MESSAGE[entry_type]


def entry_type_of_field(name: str) -> RecordType:
    return _ENTRY_OF_FIELD[name]


def key_to_pb(key: RowKey) -> pb.CatalogKeyPB:
    return pb.CatalogKeyPB(entry_type=key.entry_type.value, entry_id=key.entry_id)


def key_from_pb(p: pb.CatalogKeyPB, path: str = "key") -> RowKey:
    entry_type = _enum(RecordType, p.entry_type, f"{path}.entry_type")
    assert isinstance(entry_type, RecordType)
    if not p.entry_id:
        raise InvalidArgument(f"{path}.entry_id: missing")
    return RowKey(entry_type, p.entry_id)


# --- writes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestId:
    """A client's request id (exactly-once DDL). `first_incomplete_seq_no`: every request of
    this client below it has been answered, so its result may be forgotten."""

    client_id: str
    seq_no: int
    first_incomplete_seq_no: int = 0
    attempt_no: int = 0

    def __str__(self) -> str:
        return f"({self.client_id!r}, {self.seq_no})"


def request_id_to_pb(r: RequestId) -> pb.RequestIdPB:
    return pb.RequestIdPB(
        client_id=r.client_id,
        seq_no=r.seq_no,
        first_incomplete_seq_no=r.first_incomplete_seq_no,
        attempt_no=r.attempt_no,
    )


def request_id_from_pb(p: pb.RequestIdPB, path: str = "request_id") -> RequestId:
    if not p.client_id:
        raise InvalidArgument(f"{path}.client_id: missing")
    if len(p.client_id) > 128:
        raise InvalidArgument(f"{path}.client_id: longer than 128 characters")
    if p.seq_no < 1:
        raise InvalidArgument(f"{path}.seq_no: must be >= 1")
    if p.first_incomplete_seq_no > p.seq_no:
        raise InvalidArgument(
            f"{path}.first_incomplete_seq_no: {p.first_incomplete_seq_no} is above seq_no "
            f"{p.seq_no}, which is not complete yet"
        )
    return RequestId(p.client_id, p.seq_no, p.first_incomplete_seq_no, p.attempt_no)


@dataclass(frozen=True)
class Insert:
    """Write a row that must not exist yet (a new table, tablet, CA or signing key)."""

    record: Record


@dataclass(frozen=True)
class Update:
    """Replace a row that must exist."""

    record: Record


@dataclass(frozen=True)
class Upsert:
    """Write a row whether or not it exists."""

    record: Record


@dataclass(frozen=True)
class Delete:
    """Remove a row that must exist. Tables and tablets are never deleted
    (docs/design/catalog.md#R8)."""

    key: RowKey


RowOp: TypeAlias = Insert | Update | Upsert | Delete

_KIND = {
    Insert: pb.CatalogRowOpPB.INSERT,
    Update: pb.CatalogRowOpPB.UPDATE,
    Upsert: pb.CatalogRowOpPB.UPSERT,
}


@dataclass(frozen=True)
class Precondition:
    """Compare-and-set: the row's version must be `version` at apply time; 0 = must not exist.

    A row's version is the log index of the entry that last wrote it (`sys_catalog.Row`).
    """

    key: RowKey
    version: int

    @classmethod
    def absent(cls, key: RowKey) -> Precondition:
        return cls(key, 0)


@dataclass(frozen=True)
class CatalogWrite:
    """One logical catalog operation: the payload of ONE replicated entry
    (docs/design/catalog.md#R4).

    `response` is the serialized RPC response remembered for `request_id`, returned to a retry
    of the same request id instead of running the operation again.
    """

    ops: tuple[RowOp, ...] = ()
    expected: tuple[Precondition, ...] = ()
    request_id: RequestId | None = None
    operation: str = ""
    response: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "expected", tuple(self.expected))

    def to_pb(self) -> pb.CatalogWritePB:
        out = pb.CatalogWritePB(operation=self.operation, response=self.response)
        for op in self.ops:
            p = out.ops.add()
            if isinstance(op, Delete):
                p.kind = pb.CatalogRowOpPB.DELETE
                p.key.CopyFrom(key_to_pb(op.key))
                continue
            p.kind = _KIND[type(op)]
            entry_type = record_key(op.record).entry_type
            getattr(p, _FIELD[entry_type]).CopyFrom(record_to_pb(op.record))
        for cond in self.expected:
            out.expected.add(key=key_to_pb(cond.key), version=cond.version)
        if self.request_id is not None:
            out.request_id.CopyFrom(request_id_to_pb(self.request_id))
        return out

    def encode(self) -> bytes:
        """The bytes to propose as one Raft entry."""
        return self.to_pb().SerializeToString(deterministic=True)

    def encode_parts(self, ops_per_part: int) -> Iterator[bytes]:
        """`encode`'s bytes in parts, each made when asked for (so a caller on an event loop
        can yield between them): `ops_per_part` row operations a part, then the rest of the
        write. Joined, they are `encode()` byte for byte: `ops` is field 1 of CatalogWritePB, so
        a deterministic encoding writes every operation before any other field, and a repeated
        field's encoding is its elements' encodings in order."""
        n = max(1, ops_per_part)
        for i in range(0, len(self.ops), n):
            yield CatalogWrite(ops=self.ops[i : i + n]).encode()
        yield replace(self, ops=()).encode()
