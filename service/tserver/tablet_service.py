"""Thin gRPC servicers of the tablet server: check the destination and the fence, delegate.

Every request names `dest_uuid`; one meant for another server is refused before anything else
(`WrongDestination`, FAILED_PRECONDITION). Admin requests from a master must carry its uuid and
term in `fence` (`AdminServicer._check_fence`); the server's `MasterFence` refuses a term lower
than the highest seen (a deposed leader) with `StaleTerm`. Errors map to gRPC statuses in one
place (`rpc_errors`).

Each servicer is handed the parts of the server it delegates to, and only those (its
constructor lists them): the tablet manager, the copy client and source, the scanners, the
token verifier, the fence. None imports the server that wires them (tablet_server.py).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Protocol

import grpc
import pyarrow as pa

from service.common import failpoints
from service.common.authz import ANYONE, TSERVERS, Authorizer, Rule, allow
from service.common.errors import (
    ClockError,
    InvalidArgument,
    InvalidAuthzToken,
    PermissionDenied,
    WrongDestination,
    rpc_errors,
)
from service.common.keys import decode_key
from service.common.pki import Identity
from service.common.predicates import IS_DELETED, ScanSpec, predicates_from_pb
from service.common.tls import INSECURE_PEER
from service.common.tokens import Privilege, TokenVerifier
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.raft import NodeId, Role
from service.tserver.key_splitting import check_split_args, column_ids, split_key_range
from service.tserver.scanners import ScannerManager, ScanPage
from service.tserver.tablet import TabletReplica
from service.tserver.tablet_copy import CopyClient, CopySource
from service.tserver.tablet_manager import TabletManager, check_tablet_id

Ctx = grpc.aio.ServicerContext
_Fenced = (
    tpb.CreateTabletRequestPB
    | tpb.DeleteTabletRequestPB
    | tpb.AlterSchemaRequestPB
    | tpb.ChangeConfigRequestPB
    | tpb.LeaderStepDownRequestPB
    | tpb.TxnParticipantOpRequestPB
)


_ADMINS_AND_MASTERS = allow("master", "admin")

# Least privilege (docs/design/security.md#R12): each identity may call what its role needs and
# no more. A master changes replicas (fenced, and only while this server heartbeats to it) and
# reads their state; a tablet server takes part in the Raft groups and copies of the tablets
# whose config names it; rows are for users (with an authz token) and admins.
ADMIN_POLICY: dict[str, Rule] = {
    # Changes to replicas: the master (fenced by its term), or an admin's repair tool.
    **dict.fromkeys(
        [
            "CreateTablet",
            "DeleteTablet",
            "AlterSchema",
            "ChangeConfig",
            "LeaderStepDown",
        ],
        _ADMINS_AND_MASTERS,
    ),
    # A transaction's prepare, commit or abort: its coordinator, the leader master (fenced),
    # only. Nothing else knows what it decided; a staged state nobody will resolve is dropped
    # by the tablet's own sweep (`TabletReplica.sweep_txns`).
    "TxnParticipantOp": allow("master"),
    # A tablet's leader asks a lagging follower to copy from it (tablet_copy.CopyTrigger); an
    # admin's repair tool may too. Masters never do (they add a peer; its leader copies).
    "StartTabletCopy": allow("admin", "tserver"),
    "CancelTabletCopy": allow("admin"),
    # Reading replica state: masters (confirming a report's claims) and admins (ksck). A
    # tablet server may read only the tablets whose config names it (`GetConsensusState`).
    "GetConsensusState": allow("master", "admin", "tserver"),
    **dict.fromkeys(["ListTablets", "ListTabletCopies"], _ADMINS_AND_MASTERS),
}
COPY_POLICY: dict[str, Rule] = dict.fromkeys(
    ["BeginTabletCopySession", "FetchData", "EndTabletCopySession"], TSERVERS
)
"""A tablet copy's data goes only to another tablet server, and a session begins only for a
member of the tablet's Raft config, as itself, and continues only for the server that began it
(`CopyServicer`)."""
DATA_POLICY: dict[str, Rule] = {
    **dict.fromkeys(
        ["Write", "Scan", "ScanNext", "ScanClose", "Checksum", "SplitKeyRange"],
        allow("admin", "user", "tserver"),
    ),
    # A follower with a snapshot read to serve asks its tablet's leader (a member only:
    # `DataServicer.AdvanceSafeTime`); an admin's tool may too.
    "AdvanceSafeTime": allow("tserver", "admin"),
    "Ping": ANYONE,
}
"""Rows: admins, and users or tablet servers with an authz token for the tablet's table naming
the caller and the privilege the call needs (`DataServicer._authorize`); a scanner continues
only for whoever opened it. A master reads and writes no rows: its certificate is not enough."""


_READ_MODES = frozenset(tpb.ReadModePB.values())


def check_scan_fields(ns: tpb.NewScanRequestPB, replica: TabletReplica) -> None:
    """Refuse at once what a scan can never satisfy, naming the field: an unknown read mode,
    key bounds that do not decode under the tablet's key, and a `min_applied_index` beyond the
    log of a replica that leads (no write can have been acknowledged past its last index;
    waiting would only run out the caller's deadline). A follower may lag its leader, so it
    waits for such an index as before."""
    if ns.read_mode not in _READ_MODES:
        raise InvalidArgument(
            f"read_mode: unknown read mode {ns.read_mode} (READ_LATEST = 0, READ_AT_LEADER = 1, "
            "READ_AT_SNAPSHOT = 2)"
        )
    snapshot = ns.read_mode == tpb.READ_AT_SNAPSHOT
    if not snapshot and (ns.snapshot_timestamp or ns.diff_start_timestamp):
        raise InvalidArgument(
            "snapshot_timestamp and diff_start_timestamp: only with read_mode READ_AT_SNAPSHOT"
        )
    if ns.diff_start_timestamp and ns.diff_start_timestamp >= (ns.snapshot_timestamp or 2**64):
        raise InvalidArgument(
            f"diff_start_timestamp {ns.diff_start_timestamp} is not before "
            f"snapshot_timestamp {ns.snapshot_timestamp}: a diff covers (start, snapshot]"
        )
    store = replica.store
    if store is not None:
        cols = store.schema.key_columns
        for field in (
            "lower_bound_primary_key",
            "exclusive_upper_bound_primary_key",
            "start_after_primary_key",
        ):
            key = getattr(ns, field)
            if key:
                try:
                    decode_key(cols, key, allow_prefix=True)
                except InvalidArgument as e:
                    raise InvalidArgument(
                        f"{field}: not a key of this table: {e.message}"
                    ) from None
    if ns.min_applied_index:
        node = replica.running_node()
        st = node.status()
        if st.role is Role.LEADER and ns.min_applied_index > st.last_index:
            raise InvalidArgument(
                f"min_applied_index: {ns.min_applied_index} is beyond the log of this tablet's "
                f"leader (last index {st.last_index}): no write was acknowledged there"
            )


def require_member(who: Identity, members: frozenset[str], tablet_id: str, only: str) -> None:
    """PermissionDenied unless `who` is one of `members`: the committed or pending config of the
    tablet's Raft group here, or a sender a member vouched for (`TabletManager.members_of`,
    docs/design/security.md#R12); `only` says who may, for the message."""
    if who.name not in members:
        raise PermissionDenied(f"{who} is not a member of tablet {tablet_id}'s Raft config: {only}")


class MasterFence(Protocol):
    """The server's record of master terms (tablet_server.py, "Fencing"), as the admin
    servicer asks it: is a caller one of this cluster's masters, is a fence's term current,
    and count a succeeded request's term as seen."""

    def is_cluster_master(self, uuid: str) -> bool: ...
    def check_fence(self, fence: tpb.MasterFencePB | None) -> None: ...
    def note_fence(self, fence: tpb.MasterFencePB | None) -> None: ...


class _Base:
    authorizer: Authorizer | None = None
    """Set by a secured server to the servicer's policy; None in unit tests."""

    def __init__(self, uuid: NodeId, tablets: TabletManager, *, rpc_timeout_s: float) -> None:
        self.uuid = uuid
        """This server's: a request naming another is refused (`_dest`)."""
        self.tablets = tablets
        self.rpc_timeout_s = rpc_timeout_s
        """The longest a call waits here, whatever the caller's deadline."""

    def _dest(self, dest_uuid: str) -> None:
        if dest_uuid != self.uuid:
            raise WrongDestination(f"request for tablet server {dest_uuid!r} reached {self.uuid!r}")

    def _timeout(self, context: Ctx) -> float:
        remaining = context.time_remaining()
        default = self.rpc_timeout_s
        return default if remaining is None else max(0.01, min(remaining, default))


class AdminServicer(_Base, tpb_grpc.TabletServerAdminServiceServicer):
    def __init__(
        self,
        uuid: NodeId,
        tablets: TabletManager,
        copies: CopyClient,
        fence: MasterFence,
        *,
        rpc_timeout_s: float,
    ) -> None:
        super().__init__(uuid, tablets, rpc_timeout_s=rpc_timeout_s)
        self.copies = copies
        self.fence = fence

    def _check_fence(self, request: _Fenced, context: Ctx) -> None:
        """A master's change to a replica must carry its fence (its uuid and term), and the
        fence must be the caller's own: a call without one, or with another master's, is
        refused, so no change can bypass the deposed-leader check. An admin's repair tool may
        omit it (it acts outside the masters' terms); insecure mode cannot tell callers apart
        and checks a fence only when one is sent."""
        fence = request.fence if request.HasField("fence") else None
        who = self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER
        if who is not INSECURE_PEER and who.role != "master" and fence is not None:
            raise PermissionDenied(
                f"{who}: a fence is a master's (its uuid and term); an admin's call carries none"
            )
        if who is not INSECURE_PEER and who.role == "master":
            if fence is None:
                raise PermissionDenied(
                    f"{who}: a master's admin call carries its fence (uuid and term); refused "
                    "without one"
                )
            if fence.master_uuid != who.name:
                raise PermissionDenied(
                    f"{who}: the fence names master {fence.master_uuid!r}, not the caller"
                )
            if not self.fence.is_cluster_master(who.name):
                raise PermissionDenied(
                    f"{who}: not one of the masters this tablet server heartbeats to; a "
                    "master certificate alone does not make a cluster's master"
                )
        self.fence.check_fence(fence)

    def _check_master(self, context: Ctx) -> None:
        """A master's unfenced admin call (reads of replica state) must come from one of the
        masters this server heartbeats to: a master certificate alone is not a cluster's
        master (docs/design/security.md#R12)."""
        who = self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER
        if (
            who is not INSECURE_PEER
            and who.role == "master"
            and not self.fence.is_cluster_master(who.name)
        ):
            raise PermissionDenied(
                f"{who}: not one of the masters this tablet server heartbeats to; a "
                "master certificate alone does not make a cluster's master"
            )

    def _note_fence(self, request: _Fenced) -> None:
        """The request succeeded: its fence's term may now count as seen (note_fence)."""
        self.fence.note_fence(request.fence if request.HasField("fence") else None)

    @rpc_errors
    async def CreateTablet(
        self, request: tpb.CreateTabletRequestPB, context: Ctx
    ) -> tpb.CreateTabletResponsePB:
        self._dest(request.dest_uuid)
        self._check_fence(request, context)
        await self.tablets.create_tablet(request)
        self._note_fence(request)
        return tpb.CreateTabletResponsePB()

    @rpc_errors
    async def DeleteTablet(
        self, request: tpb.DeleteTabletRequestPB, context: Ctx
    ) -> tpb.DeleteTabletResponsePB:
        self._dest(request.dest_uuid)
        self._check_fence(request, context)
        who = self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER
        if (
            who is not INSECURE_PEER
            and who.role == "master"
            and request.delete_type == tpb.TABLET_DATA_TOMBSTONED
            and not request.HasField("cas_config_opid_index")
        ):
            raise InvalidArgument(
                "cas_config_opid_index: a master's tombstone names the op index of the "
                "committed config it was decided from (docs/design/tablet_copy.md#R8)"
            )
        await self.tablets.delete_tablet(request)
        self._note_fence(request)
        return tpb.DeleteTabletResponsePB()

    @rpc_errors
    async def AlterSchema(
        self, request: tpb.AlterSchemaRequestPB, context: Ctx
    ) -> tpb.AlterSchemaResponsePB:
        self._dest(request.dest_uuid)
        self._check_fence(request, context)
        version = await self.tablets.alter_schema(request, self._timeout(context))
        self._note_fence(request)
        return tpb.AlterSchemaResponsePB(schema_version=version)

    @rpc_errors
    async def ChangeConfig(
        self, request: tpb.ChangeConfigRequestPB, context: Ctx
    ) -> tpb.ChangeConfigResponsePB:
        self._dest(request.dest_uuid)
        self._check_fence(request, context)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        await replica.change_config(request, self._timeout(context))
        self._note_fence(request)
        return tpb.ChangeConfigResponsePB(consensus_state=replica.consensus_state())

    @rpc_errors
    async def LeaderStepDown(
        self, request: tpb.LeaderStepDownRequestPB, context: Ctx
    ) -> tpb.LeaderStepDownResponsePB:
        self._dest(request.dest_uuid)
        self._check_fence(request, context)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        await replica.step_down(request.new_leader_uuid, self._timeout(context))
        self._note_fence(request)
        return tpb.LeaderStepDownResponsePB()

    @rpc_errors
    async def TxnParticipantOp(
        self, request: tpb.TxnParticipantOpRequestPB, context: Ctx
    ) -> tpb.TxnParticipantOpResponsePB:
        self._dest(request.dest_uuid)
        self._check_fence(request, context)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        ts = await replica.txn_op(request, self._timeout(context))
        self._note_fence(request)
        if request.op == tpb.TxnParticipantOpRequestPB.PREPARE:
            return tpb.TxnParticipantOpResponsePB(prepare_timestamp=ts)
        return tpb.TxnParticipantOpResponsePB()

    @rpc_errors
    async def GetConsensusState(
        self, request: tpb.GetConsensusStateRequestPB, context: Ctx
    ) -> tpb.GetConsensusStateResponsePB:
        self._dest(request.dest_uuid)
        self._check_master(context)
        who = self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER
        peer = who is not INSECURE_PEER and who.role == "tserver"
        if peer and not request.tablet_ids:
            raise PermissionDenied(
                f"{who}: a tablet server asks about the tablets it is a peer of, by id; the "
                "state of every replica here is for masters and admins"
            )
        tablets = self.tablets
        ids = list(request.tablet_ids) or sorted(tablets.replicas)
        resp = tpb.GetConsensusStateResponsePB()
        for tid in ids:
            r = tablets.get(check_tablet_id(tid))
            if peer:
                require_member(
                    who,
                    tablets.members_of(r),
                    tid,
                    "only its peers, the masters and admins read its consensus state",
                )
            resp.tablets.add(tablet_id=tid, consensus_state=r.consensus_state(), role=r.role_pb())
        return resp

    @rpc_errors
    async def ListTablets(
        self, request: tpb.ListTabletsRequestPB, context: Ctx
    ) -> tpb.ListTabletsResponsePB:
        self._dest(request.dest_uuid)
        self._check_master(context)
        tablets = self.tablets
        return tpb.ListTabletsResponsePB(
            replicas=[tablets.replica_status(r) for _, r in sorted(tablets.replicas.items())]
        )

    @rpc_errors
    async def StartTabletCopy(
        self, request: tpb.StartTabletCopyRequestPB, context: Ctx
    ) -> tpb.StartTabletCopyResponsePB:
        self._dest(request.dest_uuid)
        tablet_id = check_tablet_id(request.tablet_id)
        who = self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER
        if who is not INSECURE_PEER and who.role == "tserver":
            # A tablet server asks as the tablet's leader: for a replica this server hosts, a
            # member of its config must ask (nobody else may have it overwritten). A new peer
            # hosts nothing yet and knows no config; what it copies is known to no config and
            # the source must still admit it (BeginTabletCopySession: members only).
            if request.copy_peer_uuid != who.name:
                raise PermissionDenied(
                    f"{who} may start a copy only from itself, not from {request.copy_peer_uuid!r}"
                )
            replica = self.tablets.replicas.get(tablet_id)
            if replica is not None and replica.node is not None:
                require_member(
                    who,
                    self.tablets.members_of(replica),
                    tablet_id,
                    "only the master, an admin or the tablet's own leader starts a copy of it",
                )
        self.copies.start(request)
        return tpb.StartTabletCopyResponsePB()

    @rpc_errors
    async def ListTabletCopies(
        self, request: tpb.ListTabletCopiesRequestPB, context: Ctx
    ) -> tpb.ListTabletCopiesResponsePB:
        self._dest(request.dest_uuid)
        self._check_master(context)
        copies = self.copies.copies
        return tpb.ListTabletCopiesResponsePB(copies=[c.to_pb() for _, c in sorted(copies.items())])

    @rpc_errors
    async def CancelTabletCopy(
        self, request: tpb.CancelTabletCopyRequestPB, context: Ctx
    ) -> tpb.CancelTabletCopyResponsePB:
        self._dest(request.dest_uuid)
        self.copies.cancel(check_tablet_id(request.tablet_id))
        return tpb.CancelTabletCopyResponsePB()


class CopyServicer(_Base, tpb_grpc.TabletCopyServiceServicer):
    """The source side of tablet copy (tablet_copy.CopySource)."""

    def __init__(
        self, uuid: NodeId, tablets: TabletManager, copy_source: CopySource, *, rpc_timeout_s: float
    ) -> None:
        super().__init__(uuid, tablets, rpc_timeout_s=rpc_timeout_s)
        self.copy_source = copy_source

    def _caller(self, context: Ctx) -> Identity:
        return self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER

    def _owner(self, context: Ctx) -> str | None:
        """Whose sessions the caller may read or end: its own (None in insecure mode)."""
        who = self._caller(context)
        return None if who is INSECURE_PEER else who.name

    @rpc_errors
    async def BeginTabletCopySession(
        self, request: tpb.BeginTabletCopySessionRequestPB, context: Ctx
    ) -> tpb.BeginTabletCopySessionResponsePB:
        self._dest(request.dest_uuid)
        who = self._caller(context)
        if who is not INSECURE_PEER:
            if request.requestor_uuid != who.name:
                raise PermissionDenied(
                    f"{who} begins a copy session as itself, not as {request.requestor_uuid!r}"
                )
            # Only a peer the tablet's config names copies it: the master (or the repair tool)
            # adds the new replica as a non-voter first, then it is told to copy.
            replica = self.tablets.get(check_tablet_id(request.tablet_id))
            replica.running_node()
            require_member(
                who,
                self.tablets.members_of(replica),
                request.tablet_id,
                "only a replica the config names copies it",
            )
        return await self.copy_source.begin(request)

    @rpc_errors
    async def FetchData(
        self, request: tpb.FetchDataRequestPB, context: Ctx
    ) -> tpb.FetchDataResponsePB:
        self._dest(request.dest_uuid)
        return await self.copy_source.fetch(request, self._owner(context))

    @rpc_errors
    async def EndTabletCopySession(
        self, request: tpb.EndTabletCopySessionRequestPB, context: Ctx
    ) -> tpb.EndTabletCopySessionResponsePB:
        self._dest(request.dest_uuid)
        self.copy_source.end(request, self._owner(context))
        return tpb.EndTabletCopySessionResponsePB()


class DataServicer(_Base, tpb_grpc.TabletServerServiceServicer):
    def __init__(
        self,
        uuid: NodeId,
        tablets: TabletManager,
        scanners: ScannerManager,
        tokens: TokenVerifier,
        *,
        rpc_timeout_s: float,
    ) -> None:
        super().__init__(uuid, tablets, rpc_timeout_s=rpc_timeout_s)
        self.scanners = scanners
        self.tokens = tokens
        """Verifies users' authz tokens with the keys the leader master sent (`_authorize`)."""

    def _caller(self, context: Ctx) -> Identity:
        return self.authorizer.identity(context) if self.authorizer is not None else INSECURE_PEER

    def _authorize(
        self, context: Ctx, replica: TabletReplica, token: bytes, needed: Privilege
    ) -> None:
        """A user's or a tablet server's call needs an authz token (service/common/tokens.py)
        that verifies with a signing key the leader master sent, names the caller, this
        tablet's table and `needed` (docs/design/security.md#R12: a server's certificate is no
        key to every table). Admins pass on their role (DATA_POLICY); insecure mode passes
        everyone."""
        who = self._caller(context)
        if who is INSECURE_PEER or who.role == "admin":
            return
        claim = self.tokens.authz(token, int(time.time() * 1_000_000))
        if claim.user != who.name:
            raise InvalidAuthzToken(f"the authz token is for user {claim.user!r}, not {who}")
        table_id = replica.superblock.table_id
        if claim.table_id != table_id:
            raise InvalidAuthzToken(
                f"the authz token is for table {claim.table_id}, not this tablet's {table_id}"
            )
        if needed not in claim.privileges:
            raise PermissionDenied(
                f"{who} lacks the {needed.value!r} privilege on table "
                f"{replica.superblock.table_name!r}"
            )

    @rpc_errors
    async def Write(self, request: tpb.WriteRequestPB, context: Ctx) -> tpb.WriteResponsePB:
        self._dest(request.dest_uuid)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        self._authorize(context, replica, request.authz_token, Privilege.WRITE)
        who = self._caller(context)
        return await replica.write(request, self._timeout(context), who.principal)

    # Scan and ScanNext answer with a pre-serialized ScanResponsePB (`ScanPage`), which the
    # serializer that `add_data_servicer` registers sends as it is.
    @rpc_errors
    async def Scan(  # type: ignore[override]
        self, request: tpb.ScanRequestPB, context: Ctx
    ) -> ScanPage:
        self._dest(request.dest_uuid)
        if not request.HasField("new_scan"):
            raise InvalidArgument("new_scan: required (use ScanNext to continue a scanner)")
        ns = request.new_scan
        replica = self.tablets.get(check_tablet_id(ns.tablet_id))
        self._authorize(context, replica, request.authz_token, Privilege.READ)
        check_scan_fields(ns, replica)
        timeout = self._timeout(context)
        await replica.wait_readable(
            ns.read_mode == tpb.READ_AT_LEADER, ns.min_applied_index, timeout
        )
        read_at: int | None = None
        if ns.read_mode == tpb.READ_AT_SNAPSHOT:
            read_at = await self._snapshot_time(replica, ns, timeout)
        store = replica.store
        node = replica.running_node()
        assert store is not None
        schema = store.schema
        projection = tuple(ns.projected_columns) or None
        names = projection if projection is not None else schema.column_names
        for name in names:
            if not schema.has_column(name):
                raise InvalidArgument(
                    f"projected_columns: no column {name!r} in table "
                    f"{replica.superblock.table_name!r} (schema version {schema.version})"
                )
        if projection is not None and len(set(projection)) != len(projection):
            raise InvalidArgument("projected_columns: a column is listed twice")
        key_cols = schema.key_columns
        with_keys = tuple(names) + tuple(c.name for c in key_cols if c.name not in names)
        spec = ScanSpec(
            projection=with_keys,
            predicates=predicates_from_pb(schema, ns.predicates),
            lower_key=ns.lower_bound_primary_key,
            upper_key=ns.exclusive_upper_bound_primary_key,
            start_after_key=ns.start_after_primary_key or None,
            limit=ns.limit,
            read_at=read_at,
            diff_start=ns.diff_start_timestamp or None,
        )
        full = schema.to_arrow()
        fields = [full.field(n) for n in names]
        if spec.diff_start is not None:
            fields.append(pa.field(IS_DELETED, pa.bool_(), False))
        projected = pa.schema(fields)
        applied = node.applied
        it = replica.scan(spec)
        return await self.scanners.open(
            ns.tablet_id,
            projected,
            it,
            key_cols,
            applied,
            schema.version,
            ns.limit,
            request.batch_size_bytes,
            owner=str(self._caller(context)),
            snapshot_timestamp=read_at or 0,
        )

    async def _snapshot_time(
        self, replica: TabletReplica, ns: tpb.NewScanRequestPB, timeout: float
    ) -> int:
        """The timestamp a READ_AT_SNAPSHOT scan reads at, once this replica can read it
        exactly (docs/design/tablets.md#R4): the one asked for, or this replica's safe time
        (not older than what the client saw, nor than the history horizon)."""
        clock = replica.settings.clock
        try:
            if ns.propagated_timestamp:
                clock.update(ns.propagated_timestamp)
            ts = ns.snapshot_timestamp
            if not ts:
                ts = max(replica.safe_time, ns.propagated_timestamp)
                if ts < replica.history_horizon():
                    ts = clock.now()  # quiet for longer than history is kept: read now
            replica.check_snapshot_time(ts)
            if ns.diff_start_timestamp:
                if ns.diff_start_timestamp >= ts:
                    raise InvalidArgument(
                        f"diff_start_timestamp {ns.diff_start_timestamp} is not before the "
                        f"snapshot time {ts}"
                    )
                replica.check_snapshot_time(ns.diff_start_timestamp)
        except ClockError as e:
            # This server's clock stepped: another replica reads the same snapshot.
            raise replica.clock_refusal(e) from None
        await replica.wait_safe(ts, timeout)
        return ts

    @rpc_errors
    async def AdvanceSafeTime(
        self, request: tpb.AdvanceSafeTimeRequestPB, context: Ctx
    ) -> tpb.AdvanceSafeTimeResponsePB:
        self._dest(request.dest_uuid)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        who = self._caller(context)
        if who is not INSECURE_PEER and who.role == "tserver":
            replica.running_node()
            require_member(
                who,
                self.tablets.members_of(replica),
                request.tablet_id,
                "only its followers ask its leader to move the safe time",
            )
        if not request.timestamp:
            raise InvalidArgument("timestamp: required")
        index = await replica.advance_safe_time(request.timestamp, self._timeout(context))
        return tpb.AdvanceSafeTimeResponsePB(index=index)

    @rpc_errors
    async def ScanNext(  # type: ignore[override]
        self, request: tpb.ScanNextRequestPB, context: Ctx
    ) -> ScanPage:
        self._dest(request.dest_uuid)
        failpoints.hit("scan_next")
        return await self.scanners.next(
            request.scanner_id,
            request.call_seq_id,
            request.batch_size_bytes,
            owner=str(self._caller(context)),
        )

    @rpc_errors
    async def ScanClose(
        self, request: tpb.ScanCloseRequestPB, context: Ctx
    ) -> tpb.ScanCloseResponsePB:
        self._dest(request.dest_uuid)
        self.scanners.close(request.scanner_id, owner=str(self._caller(context)))
        return tpb.ScanCloseResponsePB()

    @rpc_errors
    async def Checksum(
        self, request: tpb.ChecksumRequestPB, context: Ctx
    ) -> tpb.ChecksumResponsePB:
        self._dest(request.dest_uuid)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        self._authorize(context, replica, request.authz_token, Privilege.READ)
        await replica.wait_readable(False, request.min_applied_index, self._timeout(context))
        node = replica.running_node()
        store = replica.store
        assert store is not None
        applied = node.applied
        # The snapshot is taken here, between two applies, at `applied`; hashing the whole
        # tablet costs time linear in its size, so it runs in a worker thread while the loop
        # goes on applying (service/common/loop_lag.py). The same pass counts the rows outside
        # the tablet's partition when asked, as ksck --checksum does (docs/design/tablets.md#R2).
        snap = store.snapshot()
        placement = replica.placement(snap.schema) if request.check_partition else None
        outside = (
            None
            if placement is None
            else functools.partial(
                placement.partition_schema.rows_outside, snap.schema, placement.partition
            )
        )
        result = await asyncio.to_thread(snap.checksum, outside)
        return tpb.ChecksumResponsePB(
            row_count=result.rows,
            digest=result.digest,
            applied_index=applied,
            out_of_partition_rows=result.outside_rows,
            out_of_partition_sample_keys=result.outside_sample_keys,
        )

    @rpc_errors
    async def SplitKeyRange(
        self, request: tpb.SplitKeyRangeRequestPB, context: Ctx
    ) -> tpb.SplitKeyRangeResponsePB:
        # Local and read-only: any replica answers (no leader check), like Kudu's.
        self._dest(request.dest_uuid)
        start, stop = request.start_primary_key, request.stop_primary_key
        check_split_args(start, stop, request.target_chunk_rows, request.target_chunk_bytes)
        replica = self.tablets.get(check_tablet_id(request.tablet_id))
        self._authorize(context, replica, request.authz_token, Privilege.READ)
        node = replica.running_node()
        store = replica.store
        assert store is not None
        ids = column_ids(store.schema, request.columns)
        applied = node.applied
        view = store.split_view()  # on the loop, between applies; the rest in a worker thread
        split = await asyncio.to_thread(
            split_key_range,
            view,
            start,
            stop,
            target_rows=request.target_chunk_rows,
            target_bytes=request.target_chunk_bytes,
            column_ids=ids,
        )
        return tpb.SplitKeyRangeResponsePB(
            split_keys=split.split_keys,
            chunks=[
                tpb.KeyRangeChunkPB(estimated_rows=c.rows, estimated_bytes=c.bytes)
                for c in split.chunks
            ],
            applied_index=applied,
        )

    @rpc_errors
    async def Ping(self, request: mpb.PingRequestPB, context: Ctx) -> mpb.PingResponsePB:
        return mpb.PingResponsePB()
