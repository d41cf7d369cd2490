"""The fuzzing campaign's cluster: a MiniCluster, the fuzzer's identities, its fixtures.

Theory of operation
-------------------
`FuzzCluster` starts a `MiniCluster` (3 masters, 3 tablet servers, mutual TLS) with the
product's Raft timing from conf/ (a 500 ms heartbeat interval, 1.5 s election timeout) rather
than the tests' FAST_RAFT: the campaign needs no quick failover, and the event-loop stall
bound it checks is the product's heartbeat interval (service/common/loop_lag.py). Tablet
servers keep the tests' 200 ms heartbeats to the masters, so fixtures come up quickly.

Identities (fuzz_gen.IDENTITIES), each a certificate from the cluster's CA: `admin`
(fuzz-admin), `user` (fuzz-user, granted read and write on fixture A only), `tserver` (ts-fuzz)
and `master` (fuzz-master), the last two valid certificates of uuids no member has, and
`member`: the first tablet server's own certificate (the very files its process runs with,
role tserver, its uuid `MEMBER_UUID`), which hosts a replica of every fixture tablet. Channels
are opened once per (identity, address) and reused.

Fixtures: table A (five column types, 2 hash buckets x 2 ranges: 4 tablets) and table B (a
(string, int64) key, 2 ranges), each loaded with rows, and a scratch table (1 tablet) that
destructive requests are redirected to (fuzz_guard.py). Every tablet has 3 replicas, one on
each server. The campaign keeps A and B intact and recreates the scratch table when it breaks.
Their schemas and partitioning (`FIXTURES`) are what the checks hold rows against.

`vocabulary()` hands the generator the names it may use (fuzz_gen.Vocabulary): always the same
shape, so a case drawn for one cluster names the same fixture in another (`offline_vocabulary`
is that shape without a cluster, for tests), with the tablets' partitions as the master
reports them. The tablet servers'
uuids are even the same names in every cluster (ts-1-fuzz-target ...: each data directory's
instance file is written before its server first starts, and the server takes the uuid it
finds there), so the exact bytes of a request to a tablet server replay in a new cluster.
Masters' uuids follow from their ports and tables' ids are the master's to choose: those
differ from run to run.

The fuzz master's unresponsive timeout is 5 s instead of 60: heartbeats the fuzzer sends as
ts-fuzz register a tablet server that never serves, and placement must not keep picking it
for the scratch table.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.client.sync import SyncClient
from service.common import channel_options
from service.common.keys import encode_key
from service.common.partition import HashBucketSchema, Partition, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_from_pb
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.fuzz_gen import IDENTITIES, Case, Rpc, Vocabulary
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster

__all__ = [
    "FIXTURES",
    "FIXTURE_A",
    "FIXTURE_B",
    "MEMBER_UUID",
    "SCRATCH",
    "FuzzCluster",
    "Outcome",
    "offline_vocabulary",
]

FIXTURE_A = "fuzz_a"
FIXTURE_B = "fuzz_b"
SCRATCH = "fuzz_scratch"
MEMBER_UUID = "ts-1-fuzz-target"
"""The first tablet server's uuid: the `member` identity's (module docstring)."""
PRINCIPALS = {
    "admin": "fuzz-admin",
    "user": "fuzz-user",
    "tserver": "ts-fuzz",
    "master": "fuzz-master",
    "member": MEMBER_UUID,
}
CERT_ROLES = {"member": "tserver"}
"""The role of an identity's certificate, where it is not the identity's name."""

SCHEMA_A = Schema.build(
    [
        ("k", ColumnType.INT64),
        ("s", ColumnType.STRING),
        ("d", ColumnType.DOUBLE),
        ("b", ColumnType.BINARY),
        ("t", ColumnType.TIMESTAMP),
    ],
    key="k",
)
PARTITION_A = PartitionSchema(
    hash=(HashBucketSchema(("k",), 2),), range=RangeSchema(("k",)), split_rows=((0,),)
)
SCHEMA_B = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("v", ColumnType.INT32)],
    key=("host", "ts"),
)
PARTITION_B = PartitionSchema(range=RangeSchema(("host", "ts")), split_rows=(("m", 0),))
SCHEMA_SCRATCH = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], key="k")
PARTITION_SCRATCH = PartitionSchema(range=RangeSchema(("k",)))
FIXTURES: dict[str, tuple[Schema, PartitionSchema]] = {
    FIXTURE_A: (SCHEMA_A, PARTITION_A),
    FIXTURE_B: (SCHEMA_B, PARTITION_B),
}
"""Each fixture table's schema and partitioning (neither changes: requests that would alter a
fixture are pointed at the scratch table)."""

RPC_TIMEOUT_S = 3.0
"""Deadline of one fuzzed call. Refusals come in milliseconds; a request that waits (for an
index no replica will reach, say) ends DEADLINE_EXCEEDED, counted but not a finding."""
MAX_STREAM_ITEMS = 100
"""Responses read from a server stream before the call is cancelled."""

_TSERVER_OVERRIDES = {"heartbeat_interval_ms": FAST_TSERVER["heartbeat_interval_ms"]}
_MASTER_OVERRIDES = {"unresponsive_timeout_ms": "5000"}
"""How long a tablet server the fuzzer registered (module docstring) counts as live."""


@dataclass(frozen=True)
class Outcome:
    """How one call ended: "OK" or a gRPC status name, its details, the first response."""

    code: str
    details: str = ""
    seconds: float = 0.0
    response: bytes = b""

    @property
    def ok(self) -> bool:
        return self.code == "OK"


def rows_a(lo: int, hi: int) -> pa.Table:
    ks = list(range(lo, hi))
    return pa.table(
        {
            "k": pa.array(ks, pa.int64()),
            "s": [f"s{k}" if k % 7 else None for k in ks],
            "d": [k / 3 for k in ks],
            "b": [bytes([k % 256]) * (k % 5) for k in ks],
            "t": pa.array([k * 1_000_000 for k in ks], pa.timestamp("us", tz="UTC")),
        }
    )


def rows_b(n: int) -> pa.Table:
    hosts = [f"{chr(ord('a') + i % 26)}-host" for i in range(n)]
    return pa.table(
        {
            "host": hosts,
            "ts": pa.array([i - n // 2 for i in range(n)], pa.int64()),
            "v": pa.array([i if i % 3 else None for i in range(n)], pa.int32()),
        }
    )


def _csr() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fuzz")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.DER)


@dataclass
class Table:
    """A fixture as the cluster knows it now."""

    name: str
    table_id: str
    tablets: tuple[str, ...] = ()
    partition_keys: tuple[bytes, ...] = ()
    leaders: tuple[str, ...] = ()
    """The uuid of each tablet's leader when last asked ("" if none)."""
    partitions: tuple[Partition, ...] = ()
    """Each tablet's partition, as the master reported it."""


@dataclass
class FuzzCluster:
    """The cluster under fuzz (module docstring). Use as a context manager."""

    base: Path
    mini: MiniCluster = field(init=False)
    creds: dict[str, Credentials] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    leader_address: str = ""
    leader_term: int = 0
    authz_token: bytes = b""
    token_time: float = 0.0
    csr: bytes = b""
    _channels: dict[tuple[str, str], grpc.Channel] = field(default_factory=dict)
    _admin: SyncClient | None = None

    def __post_init__(self) -> None:
        self.mini = MiniCluster(
            self.base,
            master_overrides=dict(_MASTER_OVERRIDES),
            tserver_overrides=_TSERVER_OVERRIDES,
        )
        for i in range(1, self.mini.num_tservers + 1):  # uuids that read the same in every run
            data_dir = self.base / f"ts-{i}"
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            instance = data_dir / "instance"
            if not instance.exists():
                instance.write_text(json.dumps({"uuid": f"ts-{i}-fuzz-target"}))

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> FuzzCluster:
        self.mini.__enter__()
        try:
            first = next(iter(self.mini.tservers.values()))
            assert first.uuid == MEMBER_UUID, f"the member is {first.uuid}, not {MEMBER_UUID}"
            for role in IDENTITIES:
                creds = self.mini.credentials(CERT_ROLES.get(role, role), PRINCIPALS[role])
                assert creds is not None, "the fuzz cluster is secured"
                self.creds[role] = creds
            self._admin = SyncClient(
                self.mini.master_addresses, timeout=60, credentials=self.creds["admin"]
            )
            self.csr = _csr()
            self._create_fixtures()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None
        self.mini.stop()

    @property
    def admin(self) -> SyncClient:
        assert self._admin is not None
        return self._admin

    def _create_fixtures(self) -> None:
        c = self.admin
        self.leader_address, self.leader_term = self.mini.masters.leader()
        c.call("create_table", FIXTURE_A, SCHEMA_A, PARTITION_A, num_replicas=3)
        c.call("create_table", FIXTURE_B, SCHEMA_B, PARTITION_B, num_replicas=3)
        assert c.write(FIXTURE_A, rows_a(-100, 100), "insert").rows_applied == 200
        assert c.write(FIXTURE_B, rows_b(100), "insert").rows_applied == 100
        c.call("grant", FIXTURE_A, PRINCIPALS["user"], ["read", "write"])
        self.create_scratch()
        self.refresh()

    def create_scratch(self) -> None:
        """(Re)create the scratch table: delete whatever is left of it, wait until no fake
        tablet server counts as live (placement would pick it), create, wait until RUNNING."""
        c = self.admin
        old = self.tables.pop(SCRATCH, None)
        if old is not None:
            with contextlib.suppress(Exception):
                self.delete_table(old.table_id)
        with contextlib.suppress(Exception):
            c.call("delete_table", SCRATCH)
        self.wait_no_fake_servers()
        c.call("create_table", SCRATCH, SCHEMA_SCRATCH, PARTITION_SCRATCH, num_replicas=3)
        c.call("open_table", SCRATCH, refresh=True)  # the client cached the old one's id
        c.write(SCRATCH, pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
        self.tables[SCRATCH] = self._table_by_name(SCRATCH)

    def wait_no_fake_servers(self, timeout: float = 15.0) -> None:
        real = {ts.uuid for ts in self.mini.tservers.values()}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            servers = self.admin.call("list_tablet_servers")
            if not any(s.live and s.uuid not in real for s in servers):
                return
            time.sleep(0.25)

    def delete_table(self, table_id: str) -> None:
        req = mpb.DeleteTableRequestPB(table=mpb.TableIdentifierPB(table_id=table_id))
        self.admin.run(self.admin.client.master.ddl("DeleteTable", req, 30.0))

    # --- names -------------------------------------------------------------------------------

    def _table_by_name(self, name: str) -> Table:
        return self._table(mpb.TableIdentifierPB(table_name=name))

    def _table(self, ident: mpb.TableIdentifierPB) -> Table:
        r = self.stub().GetTableLocations(mpb.GetTableLocationsRequestPB(table=ident), timeout=10)
        schema = self.stub().GetTableSchema(mpb.GetTableSchemaRequestPB(table=ident), timeout=10)
        locs = r.tablet_locations
        return Table(
            schema.table_name,
            r.table_id,
            tuple(t.tablet_id for t in locs),
            tuple(t.partition.partition_key_start for t in locs),
            tuple(next((p.ts_uuid for p in t.replicas if p.role == mpb.LEADER), "") for t in locs),
            tuple(partition_from_pb(t.partition) for t in locs),
        )

    def leader_of(self, tablet_id: str) -> int:
        """The index of the tablet server leading `tablet_id` when last asked (0 if unknown)."""
        uuids = [ts.uuid for ts in self.mini.tservers.values()]
        for t in self.tables.values():
            if tablet_id in t.tablets:
                leader = t.leaders[t.tablets.index(tablet_id)]
                return uuids.index(leader) if leader in uuids else 0
        return 0

    def refresh(self) -> None:
        """Find the master leader again and re-read the fixtures' ids and the user's token."""
        self.leader_address, self.leader_term = self.mini.masters.leader()
        for name in (FIXTURE_A, FIXTURE_B):
            self.tables[name] = self._table_by_name(name)
        scratch = self.tables.get(SCRATCH)
        if scratch is not None:
            with contextlib.suppress(grpc.RpcError):
                self.tables[SCRATCH] = self._table(mpb.TableIdentifierPB(table_id=scratch.table_id))
        if time.monotonic() - self.token_time > 60:
            r = master_pb2_grpc.MasterServiceStub(self.channel("user", self.leader_address))
            got = r.GetTableLocations(
                mpb.GetTableLocationsRequestPB(table=mpb.TableIdentifierPB(table_name=FIXTURE_A)),
                timeout=10,
            )
            self.authz_token, self.token_time = got.authz_token, time.monotonic()

    def scratch_healthy(self) -> bool:
        """Whether the scratch table exists with every tablet on 3 replicas and a leader."""
        scratch = self.tables.get(SCRATCH)
        if scratch is None:
            return False
        try:
            r = self.stub().GetTableLocations(
                mpb.GetTableLocationsRequestPB(
                    table=mpb.TableIdentifierPB(table_id=scratch.table_id)
                ),
                timeout=10,
            )
        except grpc.RpcError:
            return False
        return bool(r.tablet_locations) and all(
            len(t.replicas) == 3 and any(p.role == mpb.LEADER for p in t.replicas)
            for t in r.tablet_locations
        )

    def fixture_tablets(self) -> tuple[str, ...]:
        return self.tables[FIXTURE_A].tablets + self.tables[FIXTURE_B].tablets

    def fixture_of(self, tablet_id: str) -> str:
        """The fixture table holding `tablet_id` ("" if none)."""
        for name in FIXTURES:
            if tablet_id in self.tables[name].tablets:
                return name
        return ""

    def member_incarnation(self) -> str:
        """The member tablet server's incarnation: the id of its data directory, which its
        Raft messages name ("" if not found)."""
        ts = next(t for t in self.mini.tservers.values() if t.uuid == MEMBER_UUID)
        try:
            return str(json.loads((ts.data_dir / "incarnations.json").read_text())["own"])
        except (OSError, ValueError, KeyError):
            return ""

    def instance_seqno(self, uuid: str) -> int | None:
        """The instance seqno the master leader has registered for tablet server `uuid`."""
        r = self.stub().ListTabletServers(mpb.ListTabletServersRequestPB(), timeout=10)
        for s in r.servers:
            if s.instance.permanent_uuid == uuid:
                return int(s.instance.instance_seqno)
        return None

    def consensus_states(self, index: int, tablet_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(current term, committed config op index) of tablet server `index`'s replicas of
        `tablet_ids` (those it has), asked as the admin."""
        address, uuid = self.address_of(f"tserver:{index}")
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(self.channel("admin", address))
        r = stub.GetConsensusState(
            tpb.GetConsensusStateRequestPB(dest_uuid=uuid, tablet_ids=list(tablet_ids)), timeout=5
        )
        return {
            e.tablet_id: (
                e.consensus_state.current_term,
                e.consensus_state.committed_config.opid_index,
            )
            for e in r.tablets
        }

    def vocabulary(self) -> Vocabulary:
        a, b = self.tables[FIXTURE_A], self.tables[FIXTURE_B]
        scratch = self.tables.get(SCRATCH, Table(SCRATCH, "0" * 32, ("0" * 32,)))
        tservers = list(self.mini.tservers.values())
        masters = list(self.mini.masters.masters.values())
        addresses = [m.address for m in masters] + [t.address for t in tservers]
        hostports = [(h, int(p)) for h, _, p in (a.rpartition(":") for a in addresses)]
        keys = (
            *a.partition_keys,
            *b.partition_keys,
            encode_key(SCHEMA_A.key_columns, (0,)),
            encode_key(SCHEMA_A.key_columns, (-(2**63),)),
            encode_key(SCHEMA_A.key_columns, (2**63 - 1,)),
            encode_key(SCHEMA_B.key_columns, ("m", 0)),
            encode_key(SCHEMA_B.key_columns, ("",), allow_prefix=True),
        )
        return Vocabulary(
            table_names=(a.name, b.name, scratch.name, "fuzz_absent"),
            table_ids=(a.table_id, b.table_id, scratch.table_id, "f" * 32),
            tablet_ids=(*a.tablets[:4], *b.tablets[:2], scratch.tablets[0], "f" * 32),
            tablet_schemas=(0,) * len(a.tablets[:4]) + (1,) * len(b.tablets[:2]) + (2, 0),
            tablet_partitions=(
                *a.partitions[:4],
                *b.partitions[:2],
                *(scratch.partitions[:1] or (None,)),
                None,
            ),
            tserver_uuids=tuple(ts.uuid for ts in tservers),
            master_uuids=tuple(m.uuid for m in masters),
            principals=tuple(PRINCIPALS[r] for r in IDENTITIES),
            column_names=(*SCHEMA_A.column_names, *SCHEMA_B.column_names),
            hostports=tuple(hostports),
            keys=keys,
            authz_tokens=(self.authz_token, self.authz_token[:-1] + b"\x00", b""),
            terms=(self.leader_term, self.leader_term + 1, max(0, self.leader_term - 1)),
            row_schemas=tuple(s.to_arrow() for s in _SCHEMAS),
            table_schemas=_SCHEMAS,
            partition_schemas=_PARTITIONINGS,
            csrs=(self.csr,),
        )

    # --- calls -------------------------------------------------------------------------------

    def channel(self, role: str, address: str) -> grpc.Channel:
        key = (role, address)
        ch = self._channels.get(key)
        if ch is None:
            ch = self._channels[key] = open_sync_channel(
                address, self.creds[role], options=channel_options.tool()
            )
        return ch

    def stub(self, address: str = "") -> master_pb2_grpc.MasterServiceStub:
        return master_pb2_grpc.MasterServiceStub(
            self.channel("admin", address or self.leader_address)
        )

    def address_of(self, target: str) -> tuple[str, str]:
        """(address, uuid) of a case's target (fuzz_gen.Case.target)."""
        kind, _, i = target.partition(":")
        if kind == "tserver":
            ts = list(self.mini.tservers.values())[int(i)]
            return ts.address, ts.uuid
        if kind == "master":
            m = list(self.mini.masters.masters.values())[int(i)]
            return m.address, m.uuid
        return self.leader_address, self.mini.masters.by_address(self.leader_address).uuid

    def send(self, case: Case, payloads: Sequence[bytes]) -> Outcome:
        """Send `payloads` as `case.rpc` to the case's target as its identity."""
        address, _ = self.address_of(case.target)
        return call_raw(self.channel(case.identity, address), case.rpc, payloads)

    def processes(self) -> Iterator[tuple[str, object]]:
        """(name, process) of every server, for liveness and restarts."""
        for m in self.mini.masters.masters.values():
            yield m.name, m
        for ts in self.mini.tservers.values():
            yield ts.name, ts

    def restart(self, name: str) -> None:
        """Start a server that died (or that a finding left in a bad state) again."""
        if name in self.mini.tservers:
            self.mini.kill_tserver(name)
            self.mini.start_tserver(name)
        else:
            self.mini.masters.kill(name)
            self.mini.masters.start_master(name)
            self.mini.masters.wait_ready([name])
        for key in [k for k in self._channels if k[1] not in self._live_addresses()]:
            self._channels.pop(key).close()

    def _live_addresses(self) -> set[str]:
        return {*self.mini.master_addresses, *(t.address for t in self.mini.tservers.values())}

    def logs(self) -> dict[str, Path]:
        out = {m.name: m.log for m in self.mini.masters.masters.values()}
        out.update({ts.name: ts.log for ts in self.mini.tservers.values()})
        return out


_SCHEMAS = (SCHEMA_A, SCHEMA_B, SCHEMA_SCRATCH)
_PARTITIONINGS = (PARTITION_A, PARTITION_B, PARTITION_SCRATCH)


def offline_vocabulary() -> Vocabulary:
    """A vocabulary of the shape `FuzzCluster.vocabulary` gives, without a cluster: made-up
    ids, the fixtures' real schemas and partitions (in the master's order, by partition key).
    For tests of the generator."""
    a = PARTITION_A.create_partitions(SCHEMA_A)
    b = PARTITION_B.create_partitions(SCHEMA_B)
    scratch = PARTITION_SCRATCH.create_partitions(SCHEMA_SCRATCH)
    tablets = (*(f"{i:032x}" for i in range(1, len(a) + len(b) + 2)), "f" * 32)
    return Vocabulary(
        table_names=(FIXTURE_A, FIXTURE_B, SCRATCH, "fuzz_absent"),
        table_ids=("a" * 32, "b" * 32, "c" * 32, "f" * 32),
        tablet_ids=tablets,
        tablet_schemas=(0,) * len(a) + (1,) * len(b) + (2, 0),
        tablet_partitions=(*a, *b, *scratch, None),
        tserver_uuids=(MEMBER_UUID, "ts-2-fuzz-target", "ts-3-fuzz-target"),
        principals=tuple(PRINCIPALS[r] for r in IDENTITIES),
        column_names=(*SCHEMA_A.column_names, *SCHEMA_B.column_names),
        row_schemas=tuple(s.to_arrow() for s in _SCHEMAS),
        table_schemas=_SCHEMAS,
        partition_schemas=_PARTITIONINGS,
    )


def call_raw(
    ch: grpc.Channel, rpc: Rpc, payloads: Sequence[bytes], timeout: float = RPC_TIMEOUT_S
) -> Outcome:
    """One call of `rpc` with serialized requests (a client stream sends all of them)."""
    t0 = time.monotonic()
    first = b""
    try:
        kw = {"request_serializer": None, "response_deserializer": None}
        if rpc.client_streaming and rpc.server_streaming:
            responses = ch.stream_stream(rpc.path, **kw)(iter(payloads), timeout=timeout)
            first = _drain(responses)
        elif rpc.client_streaming:
            first = ch.stream_unary(rpc.path, **kw)(iter(payloads), timeout=timeout)
        elif rpc.server_streaming:
            first = _drain(ch.unary_stream(rpc.path, **kw)(payloads[0], timeout=timeout))
        else:
            first = ch.unary_unary(rpc.path, **kw)(payloads[0], timeout=timeout)
    except grpc.RpcError as e:
        code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
        details = e.details() if callable(getattr(e, "details", None)) else str(e)
        return Outcome(code.name, (details or "")[:500], time.monotonic() - t0)
    return Outcome("OK", "", time.monotonic() - t0, bytes(first or b""))


def _drain(responses: Any) -> bytes:
    first = b""
    for i, r in enumerate(responses):
        if i == 0:
            first = r
        if i + 1 >= MAX_STREAM_ITEMS:
            cancel = getattr(responses, "cancel", None)
            if cancel is not None:
                cancel()
            break
    return first
