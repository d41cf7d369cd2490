"""The Master RPC API: a thin grpc.aio servicer over the catalog manager and the TSManager.

Every handler does three things, in this order (docs/design/layers.md#R6):

  1. decode and validate the request into dataclasses with the existing codecs
     (`schema_codec`, `catalog_records`); a bad field is InvalidArgument naming it;
  2. the leader check, for catalog calls: a follower raises NotTheLeader carrying the leader's
     uuid and address (trailing metadata, `errors.rpc_errors`), a leader whose catalog is not
     loaded yet (still replaying, docs/design/coordinator.md#R4) raises NotReady;
  3. delegate to `CatalogManager`/`TSManager` and encode the dataclass answer.

Served on every master, leader or not: ConnectToMaster, Ping, ListMasters (this master's view)
and TSHeartbeat (registration and liveness; tablet servers heartbeat to all masters:
docs/design/failover.md#R1). ListTabletServers is leader-only (answered from the TSManager). Tablet
reports carried by heartbeats are processed by the loaded leader only (`heartbeat`), which alone
asks for full reports. AddMaster/RemoveMaster change sys.catalog's membership (`master_membership`).

The servicer is handed the parts of its master it delegates to, named one by one in
`MasterParts` (master.py builds it once the master has started); it never imports the master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from service.common.authz import ADMIN, ANYONE, Authorizer, Rule, allow
from service.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotReady,
    NotTheLeader,
    PermissionDenied,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    rpc_errors,
)
from service.common.ids import NodeId
from service.common.partition import PartitionSchema
from service.common.pki import Identity
from service.common.registration import register
from service.common.schema import AddColumn, AlterOp, DropColumn, RenameColumn, Schema
from service.common.schema_codec import (
    column_from_pb,
    partition_schema_from_pb,
    partition_schema_to_pb,
    partition_to_pb,
    schema_from_pb,
    schema_to_pb,
)
from service.common.tls import INSECURE_PEER, peer_certificate
from service.common.tokens import Privilege
from service.consensus.node import RaftNode
from service.master.background_tasks import BackgroundTasks
from service.master.catalog_info import (
    ReplicaRole,
    TabletLocations,
)
from service.master.catalog_manager import CatalogManager
from service.master.catalog_reads import TableIdentifier, TableLocations
from service.master.catalog_records import (
    HostPort,
    MemberType,
    RequestId,
    TableRecord,
    TabletRecord,
    request_id_from_pb,
    table_to_pb,
    tablet_to_pb,
)
from service.master.cert_issuer import CertIssuer, check_request, join_use
from service.master.ddl_checks import MAX_ALTER_STEPS, check_alter_steps
from service.master.grants import GrantChange
from service.master.heartbeat import HeartbeatContext, handle_heartbeat
from service.master.master_membership import MasterMembership, MasterPeer
from service.master.replica_changes import ReplicaChanges
from service.master.table_access import TableAccess
from service.master.ts_descriptor import TSDescriptor
from service.master.ts_manager import TSManager
from service.master.tserver_proxy import TServerProxy
from service.master.txn_coordinator import TxnCoordinator
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.raft import Role, Status

_MOVE_TIMEOUT_S = 300.0
"""MoveReplica's deadline when the caller set none: a tablet copy of a large tablet takes time."""
_MEMBERSHIP_TIMEOUT_S = 60.0
"""AddMaster/RemoveMaster's deadline when the caller set none (a new master copies the catalog)."""
_DEFAULT_DUMP_CHUNK = 1000
"""Catalog rows per DumpCatalog chunk unless the caller asks otherwise (about 1 MB of tablets)."""
_MAX_DUMP_CHUNK = 20_000
_READ_BARRIER_TIMEOUT_S = 5.0
"""Longest a catalog read waits to confirm leadership (a few election timeouts)."""
_JOIN_RECORD_TIMEOUT_S = 10.0
"""Longest IssueCertificate waits for a join credential's use to be replicated; a timed-out
enrollment may be retried (the same one is answered again)."""

__all__ = ["MasterParts", "MasterServicer"]

log = logging.getLogger(__name__)
Ctx = grpc.aio.ServicerContext

_ROLE_TO_PB = {
    Role.LEADER: pb.LEADER,
    Role.FOLLOWER: pb.FOLLOWER,
    Role.CANDIDATE: pb.FOLLOWER,
    Role.PRE_CANDIDATE: pb.FOLLOWER,
    Role.LEARNER: pb.LEARNER,
    Role.NON_PARTICIPANT: pb.NON_PARTICIPANT,
}
_REPLICA_ROLE_TO_PB = {
    ReplicaRole.LEADER: pb.LEADER,
    ReplicaRole.FOLLOWER: pb.FOLLOWER,
    ReplicaRole.LEARNER: pb.LEARNER,
}
_MEMBER_TYPE_TO_PB = {MemberType.VOTER: pb.VOTER, MemberType.NON_VOTER: pb.NON_VOTER}
_MAX_NAME_FILTER = 256


def _heartbeat_is_its_own(request: pb.TSHeartbeatRequestPB, who: Identity) -> str | None:
    """A tablet server heartbeats only as itself: registering, reporting or moving another
    server's address under its uuid is refused."""
    uuid = request.instance.permanent_uuid
    return None if uuid == who.name else f"the heartbeat is for {uuid!r}"


POLICY: dict[str, Rule] = {
    # DDL, replica moves and master membership: admins.
    **dict.fromkeys(
        [
            "CreateTable",
            "DeleteTable",
            "AddReplica",
            "RemoveReplica",
            "MoveReplica",
            "AddMaster",
            "RemoveMaster",
            "DumpCatalog",
            "GrantPrivileges",
            "RevokePrivileges",
            "ListGrants",
        ],
        ADMIN,
    ),
    # A user may alter a table they hold the `alter` privilege on (table_access.py).
    "AlterTable": allow("admin", "user"),
    # Reads of the catalog's public face: any authenticated party; a user sees only tables
    # they hold a privilege on (table_access.py).
    **dict.fromkeys(
        [
            "IsCreateTableDone",
            "IsAlterTableDone",
            "ListTables",
            "GetTableSchema",
            "GetTableLocations",
            "GetTabletLocations",
            "ConnectToMaster",
            "Ping",
            "ListMasters",
            "ListTabletServers",
        ],
        ANYONE,
    ),
    # Transactions (txn_coordinator.py): users and admins run their own; a tablet server
    # registers its tablets for a writer and reads a transaction's state.
    **dict.fromkeys(
        ["BeginTransaction", "KeepTransactionAlive", "CommitTransaction", "AbortTransaction"],
        allow("admin", "user"),
    ),
    "RegisterParticipants": allow("admin", "tserver"),
    "GetTransactionState": allow("admin", "user", "tserver"),
    # Certificates on request (cert_issuer.py decides what each may get).
    "IssueCertificate": allow("admin", "tserver", "join"),
    # Heartbeats: a tablet server, as itself.
    "TSHeartbeat": allow("tserver", check=_heartbeat_is_its_own),
    "TSHeartbeatStream": allow("tserver", check=_heartbeat_is_its_own),
}
"""Who may call each MasterService method (service/common/authz.py; default deny)."""


@dataclass(frozen=True)
class MasterParts:
    """What the Master API uses of its master (module docstring), each part named. The
    callables read what changes while the master runs: the group's members and their
    addresses, the state a heartbeat is answered from, the leader's tasks of this term."""

    uuid: NodeId
    instance_seqno: int
    """Which start of this master answers (ListMasters)."""
    node: RaftNode
    """sys.catalog's Raft node: the leader check and the read barrier."""
    catalog: CatalogManager
    ts_manager: TSManager
    proxy: TServerProxy
    """Channels to the tablet servers (replica changes)."""
    txns: TxnCoordinator
    access: TableAccess
    issuer: CertIssuer | None
    """Signs certificates (IssueCertificate); None when the master runs insecure."""
    membership: MasterMembership
    closing: asyncio.Event
    """Set when the master begins to shut down: heartbeat streams end at once."""
    peers: Callable[[], tuple[MasterPeer, ...]]
    address_of: Callable[[str], str | None]
    heartbeat_context: Callable[[], HeartbeatContext]
    background: Callable[[], BackgroundTasks | None]
    """The leader's background tasks of its term; None while it runs none."""


class MasterServicer(master_pb2_grpc.MasterServiceServicer):
    """Thin: validate, leader check, delegate, return (module docstring)."""

    authorizer: Authorizer | None = None
    """Set by a secured master (POLICY); None in unit tests that call handlers directly."""

    def __init__(self, parts: MasterParts) -> None:
        self.parts = parts
        self._locations_responses = _LocationsResponses(_LOCATIONS_RESPONSES_MAX_TABLETS)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        # Lenient request decoding: garbage is INVALID_ARGUMENT naming the message type.
        register(master_pb2_grpc.add_MasterServiceServicer_to_server, self, server)

    # --- the leader check --------------------------------------------------------------------

    def _leader_catalog(self) -> CatalogManager:
        """The catalog manager if this master is the leader and has loaded it; else raise."""
        m = self.parts
        st = m.node.status()
        if st.role is not Role.LEADER:
            raise NotTheLeader(
                f"master {m.uuid} is not the leader (term {st.term})",
                leader_uuid=st.lead or None,
                leader_address=m.address_of(st.lead) if st.lead else None,
            )
        if not m.catalog.loaded:
            raise NotReady(
                f"master {m.uuid} was just elected (term {st.term}) and is still loading the "
                "catalog; retry"
            )
        return m.catalog

    async def _read_catalog(self, context: Ctx) -> CatalogManager:
        """The catalog manager for a read a client will see: `_leader_catalog`, then a ReadIndex
        round (batched, `RaftNode.read`) that confirms this master still leads a majority and
        waits until everything committed before the read is applied here.

        Without it a leader that was paused (SIGSTOP, a long GC, a stalled disk) past an
        election answered from memory after it resumed: LEADER of its old term, tables created
        meanwhile missing, deleted ones still there. A lease would not do here: a paused
        process's ticks stop too, so its lease looks fresh when it resumes."""
        self._leader_catalog()  # not the leader, or not loaded yet: refused at once
        node = self.parts.node
        remaining = context.time_remaining()
        timeout = (
            _READ_BARRIER_TIMEOUT_S
            if remaining is None
            else min(remaining, _READ_BARRIER_TIMEOUT_S)
        )
        try:
            await node.read(timeout=max(0.01, timeout))
        except Timeout:
            raise ServiceUnavailable(
                f"master {self.parts.uuid} could not confirm its leadership within "
                f"{timeout:.1f}s; retry (another master may be taking over)"
            ) from None
        return self._leader_catalog()

    # --- DDL ---------------------------------------------------------------------------------

    @rpc_errors
    async def CreateTable(
        self, request: pb.CreateTableRequestPB, context: Ctx
    ) -> pb.CreateTableResponsePB:
        req = _request_id(request)
        schema, partition_schema = _schema_and_partitioning(request)
        catalog = self._leader_catalog()
        table_id = await catalog.create_table(
            request.name, schema, partition_schema, request.num_replicas, req, request.owner
        )
        return pb.CreateTableResponsePB(table_id=table_id)

    @rpc_errors
    async def IsCreateTableDone(
        self, request: pb.IsCreateTableDoneRequestPB, context: Ctx
    ) -> pb.IsCreateTableDoneResponsePB:
        catalog = await self._read_catalog(context)
        table = await self._check_table(context, catalog, _table(request))
        status = await catalog.is_create_table_done(table)
        return pb.IsCreateTableDoneResponsePB(
            done=status.done,
            tablets_running=status.tablets_running,
            tablets_total=status.tablets_total,
        )

    @rpc_errors
    async def AlterTable(
        self, request: pb.AlterTableRequestPB, context: Ctx
    ) -> pb.AlterTableResponsePB:
        req = _request_id(request)
        table = _table(request)
        steps = _alter_steps(request)
        new_name = request.new_table_name if request.HasField("new_table_name") else None
        expected = (
            request.expected_schema_version if request.HasField("expected_schema_version") else None
        )
        catalog = self._leader_catalog()
        if self._user(context) is not None:  # a user alters the table its privilege is on
            table = await self._check_table(context, catalog, table, Privilege.ALTER)
        version = await catalog.alter_table(
            table, steps, req, new_name=new_name, expected_schema_version=expected
        )
        table_id = table.table_id
        if table_id is None:  # named by name: look the id up under the name it has now
            now = TableIdentifier(name=new_name if new_name is not None else table.name)
            table_id = (await catalog.get_table_schema(now)).table_id
        return pb.AlterTableResponsePB(table_id=table_id, schema_version=version)

    @rpc_errors
    async def IsAlterTableDone(
        self, request: pb.IsAlterTableDoneRequestPB, context: Ctx
    ) -> pb.IsAlterTableDoneResponsePB:
        catalog = await self._read_catalog(context)
        table = await self._check_table(context, catalog, _table(request))
        status = await catalog.is_alter_table_done(table)
        return pb.IsAlterTableDoneResponsePB(done=status.done, schema_version=status.schema_version)

    @rpc_errors
    async def DeleteTable(
        self, request: pb.DeleteTableRequestPB, context: Ctx
    ) -> pb.DeleteTableResponsePB:
        req = _request_id(request)
        table = _table(request)
        table_id = await self._leader_catalog().delete_table(table, req)
        return pb.DeleteTableResponsePB(table_id=table_id)

    # --- reads -------------------------------------------------------------------------------

    @rpc_errors
    async def ListTables(
        self, request: pb.ListTablesRequestPB, context: Ctx
    ) -> pb.ListTablesResponsePB:
        if len(request.name_filter) > _MAX_NAME_FILTER:
            raise InvalidArgument(f"name_filter: longer than {_MAX_NAME_FILTER} characters")
        tables = await (await self._read_catalog(context)).list_tables(request.name_filter)
        user = self._user(context)
        if user is not None:
            tables = [t for t in tables if self._access().privileges(user, t.table_id)]
        return pb.ListTablesResponsePB(
            tables=[
                pb.ListTablesResponsePB.TableInfo(
                    table_id=t.table_id,
                    name=t.name,
                    state=pb.TableRecordPB.State.Value(t.state.name),
                    schema_version=t.schema_version,
                    num_replicas=t.num_replicas,
                    num_tablets=t.num_tablets,
                    owner=t.owner,
                )
                for t in tables
            ]
        )

    @rpc_errors
    async def GetTableSchema(
        self, request: pb.GetTableSchemaRequestPB, context: Ctx
    ) -> pb.GetTableSchemaResponsePB:
        catalog = await self._read_catalog(context)
        info = await catalog.get_table_schema(
            await self._check_table(context, catalog, _table(request))
        )
        return pb.GetTableSchemaResponsePB(
            table_id=info.table_id,
            table_name=info.name,
            schema=schema_to_pb(info.schema),
            partition_schema=partition_schema_to_pb(info.partition_schema, info.schema),
            num_replicas=info.num_replicas,
            create_table_done=info.create_table_done,
        )

    @rpc_errors
    async def GetTableLocations(
        self, request: pb.GetTableLocationsRequestPB, context: Ctx
    ) -> pb.GetTableLocationsResponsePB:
        catalog = await self._read_catalog(context)
        table = _table(request)
        user = self._user(context)
        if user is not None:
            table = await self._check_table(context, catalog, table)
        locations = await catalog.get_table_locations(
            table,
            request.partition_key_start,
            request.partition_key_end,
            request.max_returned_locations,
        )
        response = self._locations_responses.response(locations)
        if user is None:
            return response
        # A user's copy carries their authz token (the cached message is shared: not modified).
        token = self._access().authz_token(user, locations.table_id, table.name or "")
        out = pb.GetTableLocationsResponsePB()
        out.CopyFrom(response)
        out.authz_token = token
        return out

    @rpc_errors
    async def GetTabletLocations(
        self, request: pb.GetTabletLocationsRequestPB, context: Ctx
    ) -> pb.GetTabletLocationsResponsePB:
        result = await (await self._read_catalog(context)).get_tablet_locations(
            list(request.tablet_ids)
        )
        found, errors = list(result.locations), list(result.errors)
        user = self._user(context)
        if user is not None:  # a user sees tablets of the tables they hold a privilege on
            access = self._access()
            visible = [t for t in found if access.privileges(user, t.table_id)]
            errors += [
                (t.tablet_id, PermissionDenied(f"{user} holds no privilege on its table"))
                for t in found
                if t not in visible
            ]
            found = visible
        return pb.GetTabletLocationsResponsePB(
            tablet_locations=[_tablet_locations_pb(t) for t in found],
            errors=[
                pb.GetTabletLocationsResponsePB.Error(
                    tablet_id=tablet_id, error=pb.ErrorPB(code=err.code, message=err.message)
                )
                for tablet_id, err in errors
            ],
        )

    # --- grants ------------------------------------------------------------------------------

    @rpc_errors
    async def GrantPrivileges(
        self, request: pb.GrantPrivilegesRequestPB, context: Ctx
    ) -> pb.GrantPrivilegesResponsePB:
        return await self._change_grant(request, revoke=False)

    @rpc_errors
    async def RevokePrivileges(
        self, request: pb.GrantPrivilegesRequestPB, context: Ctx
    ) -> pb.GrantPrivilegesResponsePB:
        return await self._change_grant(request, revoke=True)

    async def _change_grant(
        self, request: pb.GrantPrivilegesRequestPB, *, revoke: bool
    ) -> pb.GrantPrivilegesResponsePB:
        req = _request_id(request)
        table = _table(request)
        change = GrantChange.from_pb(request, revoke=revoke)
        grant = await self._leader_catalog().change_grant(table, change, req)
        return pb.GrantPrivilegesResponsePB(grant=grant)

    @rpc_errors
    async def ListGrants(
        self, request: pb.ListGrantsRequestPB, context: Ctx
    ) -> pb.ListGrantsResponsePB:
        if len(request.table_name) > _MAX_NAME_FILTER or len(request.user) > _MAX_NAME_FILTER:
            raise InvalidArgument(f"table_name, user: longer than {_MAX_NAME_FILTER} characters")
        catalog = await self._read_catalog(context)
        return pb.ListGrantsResponsePB(grants=catalog.list_grants(request.table_name, request.user))

    # --- transactions (txn_coordinator.py) ---------------------------------------------------

    def _coordinator(self, context: Ctx) -> tuple[TxnCoordinator, Identity]:
        """The leader's transaction coordinator and the caller (INSECURE_PEER if insecure)."""
        self._leader_catalog()
        txns = self.parts.txns
        who = self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER
        return txns, who

    @rpc_errors
    async def BeginTransaction(
        self, request: pb.BeginTransactionRequestPB, context: Ctx
    ) -> pb.BeginTransactionResponsePB:
        txns, who = self._coordinator(context)
        if not request.HasField("request_id"):
            raise InvalidArgument("request_id: missing (a retried begin must find its answer)")
        return await txns.begin(
            who,
            request_id_from_pb(request.request_id),
            request.stream_query,
            request.stream_batch,
            request.propagated_timestamp,
            request.keepalive_ms,
        )

    @rpc_errors
    async def RegisterParticipants(
        self, request: pb.RegisterParticipantsRequestPB, context: Ctx
    ) -> pb.RegisterParticipantsResponsePB:
        txns, who = self._coordinator(context)
        start = await txns.register(
            who, request.txn_id, list(request.tablet_ids), request.on_behalf_of
        )
        return pb.RegisterParticipantsResponsePB(start_timestamp=start)

    @rpc_errors
    async def KeepTransactionAlive(
        self, request: pb.KeepTransactionAliveRequestPB, context: Ctx
    ) -> pb.KeepTransactionAliveResponsePB:
        txns, who = self._coordinator(context)
        state = txns.keepalive(who, request.txn_id)
        return pb.KeepTransactionAliveResponsePB(state=state.value)

    @rpc_errors
    async def CommitTransaction(
        self, request: pb.CommitTransactionRequestPB, context: Ctx
    ) -> pb.CommitTransactionResponsePB:
        txns, who = self._coordinator(context)
        remaining = context.time_remaining()
        timeout = 30.0 if remaining is None else max(0.05, remaining - 0.05)
        ts = await txns.commit(who, request.txn_id, list(request.kept_attempts), timeout)
        return pb.CommitTransactionResponsePB(commit_timestamp=ts)

    @rpc_errors
    async def AbortTransaction(
        self, request: pb.AbortTransactionRequestPB, context: Ctx
    ) -> pb.AbortTransactionResponsePB:
        txns, who = self._coordinator(context)
        await txns.abort(who, request.txn_id, request.reason[:1024])
        return pb.AbortTransactionResponsePB()

    @rpc_errors
    async def GetTransactionState(
        self, request: pb.GetTransactionStateRequestPB, context: Ctx
    ) -> pb.GetTransactionStateResponsePB:
        txns, who = self._coordinator(context)
        return txns.state(who, request.txn_id, request.stream_query, request.stream_batch)

    # --- certificates (cert_issuer.py) -------------------------------------------------------

    @rpc_errors
    async def IssueCertificate(
        self, request: pb.IssueCertificateRequestPB, context: Ctx
    ) -> pb.IssueCertificateResponsePB:
        issuer = self.parts.issuer
        if issuer is None or self.authorizer is None:
            raise FailedPrecondition("this master runs insecure: it has no CA to sign with")
        caller = self.authorizer.identity(context)
        self._leader_catalog()  # one signer: the leader (it also knows every live server)
        ts = self.parts.ts_manager
        # A join credential enrolls one server (cert_issuer.py): a repeat of its recorded
        # enrollment is answered again, anything else it asks after that is refused.
        use = (
            join_use(peer_certificate(context), request.name, request.csr_der)
            if caller.role == "join"
            else None
        )
        retry = use is not None and issuer.join_retry(use)
        validity = check_request(
            caller,
            request.role,
            request.name,
            request.validity_s,
            (lambda _: False)
            if retry
            else lambda name: issuer.known_server(name, lambda uuid: uuid in ts),
        )
        issued = issuer.issue(request.role, request.name, request.csr_der, validity)
        if use is not None and not retry:
            await issuer.record_join_use(use, _JOIN_RECORD_TIMEOUT_S)
        log.info(
            "issued a %s certificate for %r to %s, valid until %d us",
            request.role,
            request.name,
            caller,
            issued.expire_time_us,
        )
        return pb.IssueCertificateResponsePB(
            certificate_pem=issued.certificate_pem,
            ca_certificate_pem=issued.ca_certificate_pem,
            expire_time_us=issued.expire_time_us,
        )

    # --- per-table access (table_access.py) --------------------------------------------------

    def _access(self) -> TableAccess:
        return self.parts.access

    def _user(self, context: Ctx) -> Identity | None:
        """The caller if it has the user role (subject to per-table grants), else None."""
        if self.authorizer is None:
            return None
        who = self.authorizer.identity(context)
        return who if TableAccess.is_user(who) else None

    async def _check_table(
        self,
        context: Ctx,
        catalog: CatalogManager,
        table: TableIdentifier,
        needed: Privilege | None = None,
    ) -> TableIdentifier:
        """For a user: PermissionDenied unless they hold `needed` (None: any privilege) on the
        table, told the same way whether the table exists or not; the table by id, so the call
        then acts on the table that was checked even if it is renamed meanwhile. Other callers:
        `table` unchanged."""
        user = self._user(context)
        if user is None:
            return table
        try:
            table_id, name = catalog.table_identity(table)
        except NotFound:
            raise PermissionDenied(
                f"{user} holds no privilege on table {table.name or table.table_id!r}"
            ) from None
        self._access().require(user, table_id, name, needed)
        return TableIdentifier(table_id=table_id, name=name)

    # --- masters -----------------------------------------------------------------------------

    @rpc_errors
    async def ConnectToMaster(
        self, request: pb.ConnectToMasterRequestPB, context: Ctx
    ) -> pb.ConnectToMasterResponsePB:
        m = self.parts
        confirmed = False
        if m.node.status().role is Role.LEADER:
            # Claim leadership only once a majority confirmed it (a ReadIndex round): a leader
            # resuming from a pause must not tell clients it leads a term that has moved on.
            with contextlib.suppress(TesseraError):
                await m.node.read(timeout=_READ_BARRIER_TIMEOUT_S)
                confirmed = True
        st = m.node.status()
        role = _own_role(m.uuid, st)
        if role == pb.LEADER and not confirmed:
            role = pb.ROLE_UNKNOWN  # leads in its own view only: no majority answered
        out = pb.ConnectToMasterResponsePB(
            role=role,
            leader_uuid=st.lead,
            term=st.term,
            master_addresses=[_host_port_pb(p.address) for p in m.peers()],
        )
        lead_address = m.address_of(st.lead) if st.lead else None
        if lead_address:
            out.leader_address.CopyFrom(_host_port_pb(lead_address))
        return out

    @rpc_errors
    async def Ping(self, request: pb.PingRequestPB, context: Ctx) -> pb.PingResponsePB:
        return pb.PingResponsePB()

    @rpc_errors
    async def ListMasters(
        self, request: pb.ListMastersRequestPB, context: Ctx
    ) -> pb.ListMastersResponsePB:
        """Every member of the group's latest config (and this master) as this master sees it:
        full figures for itself; for the others their role as far as known here (the leader,
        or followers if this master leads) and, on the leader, the index each has replicated
        (its match index). Terms are given only where known: this master's and the leader's."""
        m = self.parts
        st = m.node.status()
        entries = []
        for peer in m.peers():
            entry = pb.ListMastersResponsePB.Entry(
                instance=pb.NodeInstancePB(permanent_uuid=peer.uuid),
                rpc_addresses=[_host_port_pb(peer.address)],
                member_type=pb.VOTER if peer.uuid in st.config.voters else pb.NON_VOTER,
            )
            if peer.uuid == m.uuid:
                entry.instance.instance_seqno = m.instance_seqno
                entry.role = _own_role(m.uuid, st)
                entry.term = st.term
                entry.committed_index = st.commit
                entry.applied_index = m.node.applied
            elif peer.uuid == st.lead:
                entry.role = pb.LEADER
                entry.term = st.term
            elif st.role is Role.LEADER:
                entry.role = pb.FOLLOWER
                progress = st.progress.get(peer.uuid)
                if progress is not None:
                    entry.committed_index = min(progress.match, st.commit)
            entries.append(entry)
        return pb.ListMastersResponsePB(masters=entries, config_index=st.config.index)

    # --- heartbeats --------------------------------------------------------------------------

    @rpc_errors
    async def TSHeartbeat(
        self, request: pb.TSHeartbeatRequestPB, context: Ctx
    ) -> pb.TSHeartbeatResponsePB:
        """Registration and liveness on every master; reports on the loaded leader only
        (`heartbeat.handle_heartbeat`)."""
        return await handle_heartbeat(self.parts.heartbeat_context(), request)

    @rpc_errors
    async def TSHeartbeatStream(
        self, request_iterator: AsyncIterator[pb.TSHeartbeatRequestPB], context: Ctx
    ) -> AsyncIterator[pb.TSHeartbeatResponsePB]:
        """TSHeartbeat, request after request, on one stream per tablet server; the first
        error ends it (rpc_errors).

        The stream ends (OK) as soon as the master starts shutting down, even between two
        requests: a stream still open when the gRPC server's grace period ends is cancelled
        by gRPC, which logs a traceback for each, one per tablet server."""
        who = self.authorizer.identity(context) if self.authorizer is not None else None
        closing = asyncio.ensure_future(self.parts.closing.wait())
        try:
            requests = aiter(request_iterator)
            while True:
                nxt = asyncio.ensure_future(anext(requests))
                # Retrieved whatever happens: when the server cancels this stream (it gave up
                # on a slow answer), this handler is cancelled mid-wait and `nxt` ends later,
                # with StopAsyncIteration, that nobody would read ("Task exception was never
                # retrieved", hundreds of times when a large fleet's heartbeats timed out).
                nxt.add_done_callback(_retrieve)
                await asyncio.wait((nxt, closing), return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    return
                try:
                    request = nxt.result()
                except StopAsyncIteration:
                    return
                if self.authorizer is not None:
                    self.authorizer.check("TSHeartbeatStream", request, context, who)
                yield await handle_heartbeat(self.parts.heartbeat_context(), request)
                if closing.done():
                    return
        finally:
            closing.cancel()

    @rpc_errors
    async def ListTabletServers(
        self, request: pb.ListTabletServersRequestPB, context: Ctx
    ) -> pb.ListTabletServersResponsePB:
        """Every registered tablet server (live or dead; servers are never forgotten), sorted by
        uuid, all as of one instant. Leader only: a follower's registry is warm too
        (docs/design/failover.md#R1), but answers come from the leader like every other
        catalog-facing call. `num_leaders` is what each server said in its last heartbeat."""
        self._leader_catalog()
        ts_manager = self.parts.ts_manager
        return pb.ListTabletServersResponsePB(
            servers=[_tablet_server_pb(d) for d in ts_manager.descriptors()]
        )

    # --- membership of replicas and masters ---------------------------------------------------

    def _replica_changes(self) -> ReplicaChanges:
        catalog = self._leader_catalog()
        m = self.parts
        background = m.background()
        if background is None:
            raise NotReady(f"master {m.uuid} is not running its leader tasks yet; retry")
        return ReplicaChanges(catalog, m.ts_manager, m.proxy, lambda: background.fence)

    @rpc_errors
    async def AddReplica(
        self, request: pb.AddReplicaRequestPB, context: Ctx
    ) -> pb.AddReplicaResponsePB:
        """One ChangeConfig(ADD_PEER) to the tablet's leader, compare-and-set
        (docs/design/tablet_copy.md#R7, #R8)."""
        member = MemberType.NON_VOTER if request.member_type == pb.NON_VOTER else MemberType.VOTER
        cas = request.cas_config_opid_index if request.HasField("cas_config_opid_index") else None
        await self._replica_changes().add(
            _required(request.tablet_id, "tablet_id"),
            _required(request.ts_uuid, "ts_uuid"),
            member,
            cas,
        )
        return pb.AddReplicaResponsePB()

    @rpc_errors
    async def RemoveReplica(
        self, request: pb.RemoveReplicaRequestPB, context: Ctx
    ) -> pb.RemoveReplicaResponsePB:
        cas = request.cas_config_opid_index if request.HasField("cas_config_opid_index") else None
        await self._replica_changes().remove(
            _required(request.tablet_id, "tablet_id"), _required(request.ts_uuid, "ts_uuid"), cas
        )
        return pb.RemoveReplicaResponsePB()

    @rpc_errors
    async def MoveReplica(
        self, request: pb.MoveReplicaRequestPB, context: Ctx
    ) -> pb.MoveReplicaResponsePB:
        remaining = context.time_remaining()
        await self._replica_changes().move(
            _required(request.tablet_id, "tablet_id"),
            _required(request.from_ts_uuid, "from_ts_uuid"),
            _required(request.to_ts_uuid, "to_ts_uuid"),
            timeout=remaining if remaining is not None else _MOVE_TIMEOUT_S,
        )
        return pb.MoveReplicaResponsePB()

    @rpc_errors
    async def AddMaster(
        self, request: pb.AddMasterRequestPB, context: Ctx
    ) -> pb.AddMasterResponsePB:
        """Add a running, joining master as a voter (`master_membership`)."""
        self._leader_catalog()
        a = request.rpc_address
        if not a.host or not a.port:
            raise InvalidArgument("rpc_address: the new master's host and port are required")
        remaining = context.time_remaining()
        await self.parts.membership.add(
            f"{a.host}:{a.port}",
            request.uuid,
            timeout=remaining if remaining is not None else _MEMBERSHIP_TIMEOUT_S,
        )
        return pb.AddMasterResponsePB()

    @rpc_errors
    async def RemoveMaster(
        self, request: pb.RemoveMasterRequestPB, context: Ctx
    ) -> pb.RemoveMasterResponsePB:
        """Remove a master from the group (`master_membership`)."""
        self._leader_catalog()
        a = request.rpc_address
        remaining = context.time_remaining()
        await self.parts.membership.remove(
            request.uuid,
            f"{a.host}:{a.port}" if a.host else "",
            timeout=remaining if remaining is not None else _MEMBERSHIP_TIMEOUT_S,
        )
        return pb.RemoveMasterResponsePB()

    @rpc_errors
    async def DumpCatalog(
        self, request: pb.DumpCatalogRequestPB, context: Ctx
    ) -> AsyncIterator[pb.DumpCatalogChunkPB]:
        if request.max_rows_per_chunk > _MAX_DUMP_CHUNK:
            raise InvalidArgument(
                f"max_rows_per_chunk: at most {_MAX_DUMP_CHUNK}, got {request.max_rows_per_chunk}"
            )
        index, rows = await (await self._read_catalog(context)).dump(request.include_removed)
        size = request.max_rows_per_chunk or _DEFAULT_DUMP_CHUNK
        for start in range(0, max(len(rows), 1), size):
            chunk = pb.DumpCatalogChunkPB(committed_index=index)
            for row in rows[start : start + size]:
                out = chunk.rows.add(version=row.version)
                if isinstance(row.record, TableRecord):
                    out.table.CopyFrom(table_to_pb(row.record))
                else:
                    assert isinstance(row.record, TabletRecord)
                    out.tablet.CopyFrom(tablet_to_pb(row.record))
            yield chunk


# --- decoding ----------------------------------------------------------------------------------


def _request_id(
    request: pb.CreateTableRequestPB
    | pb.AlterTableRequestPB
    | pb.DeleteTableRequestPB
    | pb.GrantPrivilegesRequestPB,
) -> RequestId:
    if not request.HasField("request_id"):
        raise InvalidArgument("request_id: missing (DDL requests carry a client request id)")
    return request_id_from_pb(request.request_id)


def _table(
    request: pb.IsCreateTableDoneRequestPB
    | pb.AlterTableRequestPB
    | pb.IsAlterTableDoneRequestPB
    | pb.DeleteTableRequestPB
    | pb.GetTableSchemaRequestPB
    | pb.GetTableLocationsRequestPB
    | pb.GrantPrivilegesRequestPB,
) -> TableIdentifier:
    if not request.HasField("table"):
        raise InvalidArgument("table: missing (give table.table_id or table.table_name)")
    t = request.table
    return TableIdentifier.checked(TableIdentifier(t.table_id or None, t.table_name or None))


def _schema_and_partitioning(request: pb.CreateTableRequestPB) -> tuple[Schema, PartitionSchema]:
    if not request.HasField("schema"):
        raise InvalidArgument("schema: missing")
    schema = schema_from_pb(request.schema)
    if not request.HasField("partition_schema"):
        raise InvalidArgument("partition_schema: missing")
    return schema, partition_schema_from_pb(request.partition_schema, schema)


def _alter_steps(request: pb.AlterTableRequestPB) -> list[AlterOp]:
    if len(request.steps) > MAX_ALTER_STEPS:  # before decoding them (ddl_checks.MAX_ALTER_STEPS)
        check_alter_steps(request.steps)
    steps: list[AlterOp] = []
    for i, step in enumerate(request.steps):
        path = f"steps[{i}]"
        kind = step.WhichOneof("step")
        if kind == "add_column":
            c = column_from_pb(step.add_column.column, f"{path}.add_column.column")
            steps.append(
                AddColumn(c.name, c.type, c.nullable, c.default, c.precision, c.scale, c.comment)
            )
        elif kind == "drop_column":
            if not step.drop_column.name:
                raise InvalidArgument(f"{path}.drop_column.name: missing")
            steps.append(DropColumn(step.drop_column.name))
        elif kind == "rename_column":
            r = step.rename_column
            if not r.old_name or not r.new_name:
                raise InvalidArgument(f"{path}.rename_column: old_name and new_name are required")
            steps.append(RenameColumn(r.old_name, r.new_name))
        else:
            raise InvalidArgument(
                f"{path}: empty step (set add_column, drop_column or rename_column)"
            )
    return steps


# --- encoding ----------------------------------------------------------------------------------


def _own_role(uuid: str, st: Status) -> pb.RaftRolePB.ValueType:
    """This master's role; NON_PARTICIPANT while it is in no config (joining, or removed)."""
    if uuid not in st.config.voters | st.config.learners:
        return pb.NON_PARTICIPANT
    return _ROLE_TO_PB[st.role]


def _host_port_pb(address: str | HostPort) -> pb.HostPortPB:
    if isinstance(address, HostPort):
        return pb.HostPortPB(host=address.host, port=address.port)
    host, _, port = address.rpartition(":")
    return pb.HostPortPB(host=host, port=int(port) if port.isdigit() else 0)


def _tablet_server_pb(d: TSDescriptor) -> pb.ListTabletServersResponsePB.Entry:
    reg = d.registration
    return pb.ListTabletServersResponsePB.Entry(
        instance=pb.NodeInstancePB(permanent_uuid=d.uuid, instance_seqno=d.instance_seqno),
        registration=pb.ServerRegistrationPB(
            rpc_addresses=[_host_port_pb(a) for a in reg.rpc_addresses],
            http_addresses=[_host_port_pb(a) for a in reg.http_addresses],
            software_version=reg.software_version,
            start_time_us=int(reg.start_time * 1_000_000),
            location=reg.location or "",
        ),
        live=d.live,
        millis_since_heartbeat=max(0, int(d.heartbeat_age_s * 1000)),
        num_replicas=d.total_replicas,
        num_leaders=d.num_leaders,
    )


_LOCATIONS_RESPONSES_MAX_TABLETS = 200_000
"""Tablets in all the GetTableLocations responses a servicer keeps (about 250 bytes each)."""


class _LocationsResponses:
    """GetTableLocations responses by the identity of the `TableLocations` they encode.

    The catalog hands out the same `TableLocations` object for as long as nothing it was built
    from changed (`locations_cache`), so a hit is exact, and the call answers with the message
    built the first time. The message is shared: nothing may modify it (gRPC only serializes
    it). An entry holds its key's object, so the id cannot be reused while cached. Least
    recently used entries go first once the responses hold more than `max_tablets` tablets.
    """

    def __init__(self, max_tablets: int) -> None:
        self._max_tablets = max_tablets
        self._tablets = 0
        self._by_id: OrderedDict[int, tuple[TableLocations, pb.GetTableLocationsResponsePB]] = (
            OrderedDict()
        )

    def response(self, locations: TableLocations) -> pb.GetTableLocationsResponsePB:
        hit = self._by_id.get(id(locations))
        if hit is not None:  # the entry holds its object: an id in use is that object's
            self._by_id.move_to_end(id(locations))
            return hit[1]
        out = pb.GetTableLocationsResponsePB(
            table_id=locations.table_id,
            tablet_locations=[_tablet_locations_pb(t) for t in locations.tablets],
            ttl_ms=locations.ttl_ms,
        )
        self._by_id[id(locations)] = (locations, out)
        self._tablets += len(locations.tablets)
        while self._tablets > self._max_tablets and len(self._by_id) > 1:
            self._drop(next(iter(self._by_id)))
        return out

    def _drop(self, key: int) -> None:
        locations, _ = self._by_id.pop(key)
        self._tablets -= len(locations.tablets)


_LOCATIONS_PB_MEMO: dict[int, tuple[TabletLocations, pb.TabletLocationsPB]] = {}
"""TabletLocationsPB by the identity of the TabletLocations value it encodes. `catalog_info`
hands out the same value for a tablet for as long as its record and its servers' addresses are
unchanged (`_running_locations`), so a hit is exact; the entry holds the value, so its id
cannot be reused while cached. Building these messages field by field was most of the Python
time of a GetTableLocations call."""
_LOCATIONS_PB_MEMO_MAX = 200_000


def _tablet_locations_pb(t: TabletLocations) -> pb.TabletLocationsPB:
    """The message for `t`, memoized (the caller copies it into its response)."""
    hit = _LOCATIONS_PB_MEMO.get(id(t))
    if hit is not None and hit[0] is t:
        return hit[1]
    out = _encode_tablet_locations(t)
    if len(_LOCATIONS_PB_MEMO) >= _LOCATIONS_PB_MEMO_MAX:
        _LOCATIONS_PB_MEMO.clear()
    _LOCATIONS_PB_MEMO[id(t)] = (t, out)
    return out


def _encode_tablet_locations(t: TabletLocations) -> pb.TabletLocationsPB:
    out = pb.TabletLocationsPB(
        tablet_id=t.tablet_id,
        table_id=t.table_id,
        partition=partition_to_pb(t.partition),
        config_opid_index=t.config_index,
    )
    for r in t.replicas:
        replica = out.replicas.add(
            ts_uuid=r.ts_uuid,
            role=_REPLICA_ROLE_TO_PB[r.role],
            member_type=_MEMBER_TYPE_TO_PB[r.member_type],
        )
        if r.address is not None:
            replica.rpc_address.CopyFrom(_host_port_pb(r.address))
    return out


def _required(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(f"{field}: required")
    return value


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's outcome as seen (an error here was answered, or moot)."""
    if not task.cancelled():
        task.exception()
