"""The tablet manager: every replica this server hosts, their life cycle, and their reports.

Theory of operation
-------------------
Replicas live in `<data_dir>/tablets/<tablet_id>/` (superblock.py explains the layout and why
each life-cycle step writes its superblock where it does). `open()` runs the startup state machine
(docs/design/tablet_copy.md#R2) over every directory:

  no superblock        an unfinished create: the directory is removed
  COPYING              an unfinished copy: data and WAL removed, kept as TOMBSTONED (its
                       consensus metadata may hold a vote)
  DELETED              a delete that may not have finished: the directory is removed
  TOMBSTONED           roll the delete forward (data and WAL removed if still present); the
                       replica is kept, not started, and reported as TOMBSTONED
  READY                started; one that fails to open, or to replay its log (an entry that
                       does not apply, tablet.py), stays offline, reported FAILED; the
                       server and its other replicas carry on

All groups share the server's one `GrpcTransport` (messages are keyed by tablet id) and each
group's ticks are a timer wait in its own task: an idle tablet costs a sleeping task.

CreateTablet work is bounded (`CreateGate`): at most `max_concurrent_creates` run at once and
`max_queued_creates` wait; a call beyond them is refused at once with RESOURCE_EXHAUSTED, which
the master takes as "later", not "failed" (docs/design/catalog.md#R16). Timing out instead
would look like a dead server and get the tablet replaced: more work for the same busy server.

Admin operations (create, delete, alter, config changes) are serialized per tablet by a lock so
that a delete cannot race a create of the same tablet. `version` rises on every change of any
replica (role, term, config, schema, state): the heartbeater wakes on it to send an incremental
report promptly (reports themselves are diffs, see heartbeater.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from service.common import failpoints
from service.common.errors import (
    AlreadyExists,
    CasMismatch,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    TabletNotRunning,
)
from service.common.schema import Schema
from service.common.schema_codec import partition_from_pb, schema_from_pb
from service.consensus.node import RaftNode
from service.consensus.transport import GrpcTransport
from service.consensus.vouch import Vouches
from service.pb import common_pb2 as cpb
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.raft import NodeId, RaftConfig
from service.tserver import superblock as sbmod
from service.tserver.superblock import DataState, Superblock
from service.tserver.tablet import ReplicaState, TabletReplica, TabletSettings
from service.tserver.vouch import consensus_state_asker

log = logging.getLogger(__name__)

_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def check_tablet_id(tablet_id: str) -> str:
    if not tablet_id:
        raise InvalidArgument("tablet_id: required")
    if len(tablet_id) > 128 or not set(tablet_id) <= _ID_CHARS or tablet_id in {".", ".."}:
        raise InvalidArgument(f"tablet_id {tablet_id[:64]!r}: not a valid tablet id")
    return tablet_id


class CreateGate:
    """At most `running` CreateTablet calls at work and `waiting` more queued; one beyond them
    is refused with RESOURCE_EXHAUSTED (module docstring). `shed` counts the refusals."""

    def __init__(self, running: int, waiting: int) -> None:
        if running < 1 or waiting < 0:
            raise ValueError(f"CreateGate needs running >= 1, waiting >= 0: {running}, {waiting}")
        self.running = running
        self.waiting = waiting
        self._sem = asyncio.Semaphore(running)
        self.inside = 0
        """Calls running or waiting now."""
        self.shed = 0

    @contextlib.asynccontextmanager
    async def enter(self, tablet_id: str) -> AsyncIterator[None]:
        if self.inside >= self.running + self.waiting:
            self.shed += 1
            raise ResourceExhausted(
                f"CreateTablet of {tablet_id}: this server is busy with {self.inside} tablet "
                f"creations ({self.running} at a time, {self.waiting} queued); retry later"
            )
        self.inside += 1
        try:
            async with self._sem:
                yield
        finally:
            self.inside -= 1


class TabletManager:
    def __init__(
        self,
        data_dir: Path,
        uuid: NodeId,
        transport: GrpcTransport,
        settings: TabletSettings,
        *,
        max_concurrent_creates: int,
        max_queued_creates: int,
    ) -> None:
        self.root = data_dir / "tablets"
        self.quarantine = data_dir / "quarantine"
        self.uuid = uuid
        self.transport = transport
        self.settings = settings
        self.replicas: dict[str, TabletReplica] = {}
        self.version = 0
        self.changed_event = asyncio.Event()
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.listeners: list[Callable[[str], None]] = []
        self.create_gate = CreateGate(max_concurrent_creates, max_queued_creates)
        self.vouches = Vouches(
            uuid,
            self._running_node,
            transport,
            consensus_state_asker(lambda: transport.credentials),
        )
        """Senders a stale replica takes as members on a member's word (consensus/vouch.py)."""
        transport.on_foreign = self.vouches.on_foreign

    # --- startup -----------------------------------------------------------------------------

    async def open(self) -> None:
        """The startup state machine (docs/design/tablet_copy.md#R2), then start READY replicas."""
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.quarantine, ignore_errors=True)
        self.quarantine.mkdir(parents=True, exist_ok=True)
        to_start: list[TabletReplica] = []
        for d in sorted(self.root.iterdir()):
            if not d.is_dir():
                continue
            try:
                sb = sbmod.load(d)
            except Exception as e:
                log.error("tablet dir %s: unreadable superblock, left offline: %s", d, e)
                continue
            if sb is None:
                log.warning("tablet dir %s has no superblock (unfinished create): removed", d)
                shutil.rmtree(d, ignore_errors=True)
                continue
            if sb.data_state is DataState.DELETED:
                log.info("tablet %s: rolling a delete forward", sb.tablet_id)
                shutil.rmtree(d, ignore_errors=True)
                continue
            replica = self.new_replica(d, sb)
            if sb.data_state is DataState.COPYING:
                log.warning("tablet %s: unfinished copy found: tombstoned", sb.tablet_id)
                replica.delete_files()
                replica.superblock = sb.with_state(DataState.TOMBSTONED, copy_source="")
                sbmod.save(d, replica.superblock)
                replica.state = ReplicaState.TOMBSTONED
            elif sb.data_state is DataState.TOMBSTONED:
                replica.delete_files()
                replica.state = ReplicaState.TOMBSTONED
            else:
                to_start.append(replica)
            self.replicas[sb.tablet_id] = replica
        for replica in to_start:
            await self.start_replica(replica)
        log.info(
            "tablet manager: %d replicas (%d started)",
            len(self.replicas),
            sum(r.state is ReplicaState.RUNNING for r in self.replicas.values()),
        )

    def new_replica(self, d: Path, sb: Superblock) -> TabletReplica:
        return TabletReplica(d, sb, self.uuid, self.transport, self.settings, self.changed)

    async def start_replica(self, replica: TabletReplica) -> None:
        await replica.start()
        node = replica.node
        if node is not None:
            tablet_id = replica.tablet_id
            self.vouches.forget(tablet_id)
            self.transport.register(
                tablet_id,
                node.step,
                node.report_unreachable,
                members=lambda: self.vouches.members(tablet_id, node),
                leader_term=node.leader_term,
                peer_gone=node.peer_gone,
            )

    def members_of(self, replica: TabletReplica) -> frozenset[str]:
        """Who counts as a member of the replica's Raft group here: its config's members and
        the senders vouched for (consensus/vouch.py); empty when it has no Raft node."""
        node = replica.node
        if node is None:
            return frozenset()
        return self.vouches.members(replica.tablet_id, node)

    def _running_node(self, tablet_id: str) -> RaftNode | None:
        r = self.replicas.get(tablet_id)
        if r is None or r.state is not ReplicaState.RUNNING:
            return None
        return r.node

    async def aclose(self) -> None:
        await self.vouches.aclose()
        for replica in list(self.replicas.values()):
            self.transport.unregister(replica.tablet_id)
            await replica.aclose()

    # --- changes -----------------------------------------------------------------------------

    def changed(self, tablet_id: str) -> None:
        self.version += 1
        self.changed_event.set()
        for fn in self.listeners:
            fn(tablet_id)

    def lock(self, tablet_id: str) -> asyncio.Lock:
        """Serializes life-cycle changes (create, delete, copy) of one tablet."""
        return self._locks[tablet_id]

    # --- lookups -----------------------------------------------------------------------------

    def get(self, tablet_id: str) -> TabletReplica:
        r = self.replicas.get(tablet_id)
        if r is not None and r.superblock.data_state is DataState.COPYING:
            # Being copied here: it will serve once the copy is done, so callers retry (or try
            # another replica) rather than conclude the tablet is gone.
            raise TabletNotRunning(
                f"tablet {tablet_id!r} on server {self.uuid} is being copied; retry"
            )
        if r is None or r.superblock.data_state is not DataState.READY:
            state = "" if r is None else f" (it is {r.superblock.data_state.name})"
            raise NotFound(f"tablet {tablet_id!r} is not hosted on server {self.uuid}{state}")
        return r

    # --- admin -------------------------------------------------------------------------------

    async def create_tablet(self, req: tpb.CreateTabletRequestPB) -> None:
        # Finish even if the caller gives up (its deadline, a master that died): cancelled half
        # way, the replica would sit in `replicas` never started, and a retry would be answered
        # "created". A retry waits on the tablet lock for this one to finish.
        await asyncio.shield(self._create_tablet(req))

    async def _create_tablet(self, req: tpb.CreateTabletRequestPB) -> None:
        tablet_id = check_tablet_id(req.tablet_id)
        if not req.table_id:
            raise InvalidArgument("table_id: required")
        schema = schema_from_pb(req.schema)
        partition_from_pb(req.partition)
        config = _config_from_pb(req.config)
        if self.uuid not in config.voters:
            raise InvalidArgument(
                f"config: this server {self.uuid} is not a voter of the initial config "
                f"{sorted(config.voters)}"
            )
        addresses = _addresses_from_pb(req.config)
        missing = sorted(p for p in config.voters if p not in addresses and p != self.uuid)
        if missing:
            raise InvalidArgument(f"config: peers without an address: {missing}")
        existing = self.replicas.get(tablet_id)
        if (
            existing is not None
            and existing.superblock.data_state is DataState.READY
            and existing.superblock.table_id == req.table_id
        ):
            return  # idempotent: a retried CreateTablet is answered without a turn
        async with self.create_gate.enter(tablet_id):
            await failpoints.delay("create_tablet")
            await self._create_locked(req, tablet_id, schema, config, addresses)

    async def _create_locked(
        self,
        req: tpb.CreateTabletRequestPB,
        tablet_id: str,
        schema: Schema,
        config: RaftConfig,
        addresses: dict[str, str],
    ) -> None:
        async with self._locks[tablet_id]:
            existing = self.replicas.get(tablet_id)
            if existing is not None:
                if existing.superblock.table_id != req.table_id:
                    raise AlreadyExists(
                        f"tablet {tablet_id} exists here for table "
                        f"{existing.superblock.table_id}, not {req.table_id}"
                    )
                if existing.superblock.data_state is DataState.READY:
                    return  # idempotent: a retried CreateTablet
                raise AlreadyExists(
                    f"tablet {tablet_id} is {existing.superblock.data_state.name} here; "
                    "a deleted replica is re-created only by a tablet copy"
                )
            d = self.root / tablet_id
            if d.exists():
                shutil.rmtree(d)
            sb = Superblock(
                tablet_id=tablet_id,
                table_id=req.table_id,
                table_name=req.table_name,
                partition_pb=req.partition.SerializeToString(),
                partition_schema_pb=req.partition_schema.SerializeToString(),
            )
            for node, addr in addresses.items():
                self.transport.set_address(node, addr)
            await asyncio.to_thread(
                TabletReplica.format, d, sb, schema, self.uuid, config, addresses, self.settings
            )
            replica = self.new_replica(d, sb)
            self.replicas[tablet_id] = replica
            await self.start_replica(replica)
            log.info("tablet %s created (table %s)", tablet_id, req.table_id)
            self.changed(tablet_id)

    async def delete_tablet(self, req: tpb.DeleteTabletRequestPB) -> None:
        # As for create_tablet: once the superblock says DELETED/TOMBSTONED the rest must run
        # even if the caller goes away, or the replica would be half closed, still listed.
        await asyncio.shield(self._delete_tablet(req))

    async def _delete_tablet(self, req: tpb.DeleteTabletRequestPB) -> None:
        tablet_id = check_tablet_id(req.tablet_id)
        kind = req.delete_type
        if kind not in (tpb.TABLET_DATA_DELETED, tpb.TABLET_DATA_TOMBSTONED):
            raise InvalidArgument(
                "delete_type: must be TABLET_DATA_DELETED or TABLET_DATA_TOMBSTONED"
            )
        async with self._locks[tablet_id]:
            replica = self.replicas.get(tablet_id)
            if replica is None:
                raise NotFound(f"tablet {tablet_id!r} is not hosted on server {self.uuid}")
            state = replica.superblock.data_state
            if state is DataState.TOMBSTONED and kind == tpb.TABLET_DATA_TOMBSTONED:
                return  # idempotent
            if req.HasField("cas_config_opid_index") and replica.node is not None:
                # Compare-and-set on the config op index (docs/design/tablet_copy.md#R8): the
                # master decided from a config at this index that excludes this replica. A
                # committed config of its own that is newer, or at that very index and naming
                # it, says the decision is stale or the config it came from is not the group's
                # (docs/design/catalog.md#R15): nothing is destroyed on such a word.
                own = replica.node.applied_config
                cas = req.cas_config_opid_index
                if own.index > cas:
                    raise CasMismatch(
                        f"tablet {tablet_id}: the replica's committed config op id is "
                        f"{own.index}, newer than the {cas} the request expects: it was "
                        "re-added since, not deleted"
                    )
                if (
                    kind == tpb.TABLET_DATA_TOMBSTONED
                    and own.index == cas
                    and self.uuid in own.voters | own.learners
                ):
                    raise CasMismatch(
                        f"tablet {tablet_id}: the replica's own committed config at op id {cas} "
                        f"names it ({'voter' if self.uuid in own.voters else 'non-voter'}): "
                        "the config the request was decided from is not its group's"
                    )
            last_index = last_term = 0
            if replica.node is not None:
                st = replica.node.status()
                last_index, last_term = st.last_index, st.term
            new_state = (
                DataState.DELETED if kind == tpb.TABLET_DATA_DELETED else (DataState.TOMBSTONED)
            )
            q = self.quarantine / f"{tablet_id}.{time.time_ns()}"
            sb = replica.superblock.with_state(
                new_state,
                tombstone_last_index=last_index,
                tombstone_last_term=last_term,
                quarantine_path=str(q),
            )
            # The commit point of the delete: written before any data goes (superblock.py).
            sbmod.save(replica.dir, sb)
            self.transport.unregister(tablet_id)
            self.vouches.forget(tablet_id)
            await replica.aclose()
            replica.superblock = sb
            if new_state is DataState.DELETED:
                del self.replicas[tablet_id]
                await asyncio.to_thread(_quarantine, replica.dir, q)
            else:
                if replica.data_dir.exists():
                    await asyncio.to_thread(_quarantine, replica.data_dir, q)
                replica.delete_files()
                replica.state = ReplicaState.TOMBSTONED
                replica.node = None
                replica.store = None
                sb = sb.with_state(DataState.TOMBSTONED, quarantine_path="")
                sbmod.save(replica.dir, sb)
                replica.superblock = sb
            log.info(
                "tablet %s %s (%s)", tablet_id, new_state.name.lower(), req.reason or "no reason"
            )
            self.changed(tablet_id)

    async def alter_schema(self, req: tpb.AlterSchemaRequestPB, timeout: float) -> int:
        replica = self.get(check_tablet_id(req.tablet_id))
        return await replica.alter_schema(req, timeout)

    # --- reports -----------------------------------------------------------------------------

    def reported_tablet(self, replica: TabletReplica) -> mpb.ReportedTabletPB:
        r = mpb.ReportedTabletPB(
            tablet_id=replica.tablet_id,
            state=mpb.ReplicaStatePB.ValueType(replica.state.value),
            role=replica.role_pb(),
            schema_version=replica.schema_version(),
        )
        if replica.node is not None and replica.state is not ReplicaState.FAILED:
            # A FAILED replica's Raft state froze when its loop stopped: the master must learn
            # nothing from it (a leader that failed would still say it leads).
            r.consensus_state.CopyFrom(replica.consensus_state())
        if replica.error is not None:
            r.error.code = replica.error.code
            r.error.message = str(replica.error)
        return r

    def replica_status(self, replica: TabletReplica) -> tpb.ReplicaStatusPB:
        sb = replica.superblock
        s = tpb.ReplicaStatusPB(
            tablet_id=sb.tablet_id,
            table_id=sb.table_id,
            table_name=sb.table_name,
            data_state=tpb.TabletDataStatePB.ValueType(sb.data_state.value),
            state=mpb.ReplicaStatePB.ValueType(replica.state.value),
            role=replica.role_pb(),
            schema_version=replica.schema_version(),
        )
        s.partition.CopyFrom(cpb.PartitionPB.FromString(sb.partition_pb))
        if replica.node is not None:
            cs = replica.consensus_state()
            s.consensus_state.CopyFrom(cs)
            s.term = cs.current_term
            s.leader_uuid = cs.leader_uuid
            s.config_opid_index = cs.committed_config.opid_index
            s.last_applied_index = replica.node.applied
        if replica.store is not None:
            s.row_count = replica.store.row_count()
            s.on_disk_bytes = replica.store.on_disk_bytes()
        if replica.error is not None:
            s.error.code = replica.error.code
            s.error.message = str(replica.error)
        return s

    def num_leaders(self) -> int:
        return sum(r.is_leader() for r in self.replicas.values())

    def num_live(self) -> int:
        return sum(r.state is ReplicaState.RUNNING for r in self.replicas.values())


def _quarantine(src: Path, q: Path) -> None:
    """Move to quarantine (one rename, atomic), then remove (docs/design/tablet_copy.md#R9)."""
    try:
        src.rename(q)
    except FileNotFoundError:
        return
    shutil.rmtree(q, ignore_errors=True)


def _config_from_pb(c: mpb.RaftConfigPB) -> RaftConfig:
    voters: set[NodeId] = set()
    learners: set[NodeId] = set()
    for p in c.peers:
        if not p.permanent_uuid:
            raise InvalidArgument("config.peers: a peer without permanent_uuid")
        if p.permanent_uuid in voters | learners:
            raise InvalidArgument(f"config.peers: {p.permanent_uuid} listed twice")
        if p.member_type == mpb.VOTER:
            voters.add(NodeId(p.permanent_uuid))
        elif p.member_type == mpb.NON_VOTER:
            learners.add(NodeId(p.permanent_uuid))
        else:
            raise InvalidArgument(f"config.peers: {p.permanent_uuid} has no member_type")
    if not voters:
        raise InvalidArgument("config: no voters")
    if c.opid_index != 0:
        raise FailedPrecondition(
            f"config: a new tablet starts from the initial config (opid_index 0), not "
            f"{c.opid_index}"
        )
    return RaftConfig(frozenset(voters), frozenset(learners), 0)


def _addresses_from_pb(c: mpb.RaftConfigPB) -> dict[str, str]:
    out = {}
    for p in c.peers:
        a = p.last_known_addr
        if a.host and a.port:
            out[p.permanent_uuid] = f"{a.host}:{a.port}"
    return out
