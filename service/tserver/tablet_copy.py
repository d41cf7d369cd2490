"""Tablet copy (docs/design/tablet_copy.md#R4): a replica is (re)created on this server from a copy
of a peer's.

Theory of operation
-------------------
Trigger. A tablet's leader watches its peers (`CopyTrigger`, once a second). It sends
StartTabletCopy, naming itself as the source, to a peer that for `TRIGGER_S`
  * has acknowledged nothing (its server does not host the tablet: a tombstoned replica, a
    server that lost its data), or
  * needs entries the leader no longer keeps (its match is before the leader's first log
    index). A tablet's Raft snapshot is only an anchor to its files (tablet.py) and is never
    sent (`RaftOptions.send_snapshots` is off): the core holds such a peer in SNAPSHOT state,
    sending it nothing but heartbeats, and the copy is how it gets the state. The request
    carries the leader's first index (`retained_from_index`), so the peer knows its READY
    replica cannot catch up; or
  * hears nothing of it while its server answers (`GrpcTransport.answering`): the replica is
    lost (an operator's DeleteTablet of a member; or a master's tombstone decided from a config
    that excluded the server, landing just after a move re-added it, before the replica saw
    its new config). A server drops messages for a group it does not host, so the leader
    would otherwise wait for it forever, its match frozen where it was. Kudu's leader copies
    on the answer TABLET_NOT_FOUND; ours judges by silence, as a one-way transport must (the
    core marks a peer not recently active each election timeout it is silent). A READY
    replica that is merely slow leaves the request alone (below), so a false alarm costs one
    RPC every `RETRY_S`.
A non-voter added to be promoted (a move or a 3-4-3 replacement) is known to be empty and is
sent it at the first check, without the wait. A peer that answers normally never is; one whose
server is down makes the RPC fail, and the leader tries again later (`RETRY_S`). A peer the
core holds in SNAPSHOT state for `TRIGGER_S` is reported to it as delivered
(`report_snapshot`), so the leader probes it again from the anchor's index: a peer the copy has
filled meanwhile then matches, and one still behind is held again until its copy lands.

Source (`CopySource`, the TabletCopyService). BeginTabletCopySession flushes the tablet's
in-memory rows (`TabletReplica.flush_for_copy`, no compaction; with no rows to flush it still
moves the flushed index over the entries applied since that carry none, so the image's index,
and with it the config the new replica starts from, includes the latest config changes: a
config from before the copying leader joined would make the replica refuse that leader's
messages as a non-member's, and it would never catch up), then, without yielding to the
event loop, hard-links the row store's MANIFEST and data files into a session directory: an
image at one index N, the flushed index, which later flushes and compactions cannot change
(they replace files, never rewrite them, and a link keeps a deleted file's data). Like Kudu,
the copy ships the tablet's immutable data files; unlike Kudu, no WAL segments: the image holds
every entry up to N, the leader keeps its log from its anchor (at or below N) on, and it
replicates everything after N normally. The response carries each file's size and CRC32C, and
the Raft snapshot metadata at N (term, membership as of N: `RaftNode.config_at`), the source's
superblock and consensus state. FetchData reads a file chunk by chunk (CRC32C on each) in a
worker thread; nothing is held in memory. Sessions end on EndTabletCopySession or when idle
for `SESSION_IDLE_S`; their directories are removed then, and at start (`copy-sessions/`).

Destination (`CopyClient`). StartTabletCopy is idempotent (a READY replica or a copy under way
is left alone) and refused when the caller's term is lower than the replica's own (a deposed
leader). The exception is a READY replica whose log ends before `retained_from_index - 1`:
it is stopped and replaced by the copy, keeping its consensus metadata. Copies run as tasks
bounded by `num_tablets_to_copy_simultaneously`, can be listed and cancelled. One copy:

  1. Begin a session; write the superblock COPYING (the commit point: a crash from here on
     leaves a replica that startup tombstones, and the leader copies it again);
  2. fetch every file into the replica's data directory chunk by chunk, checking each chunk's
     CRC and then the file's; the MANIFEST is written last, atomically;
  3. the Raft state: a snapshot that is the tablet's anchor at N (tablet.py: no rows, the
     files hold them) and consensus metadata merged by the rules of docs/design/tablet_copy.md#R5
     (the highest term wins; our vote is kept only for a term we keep; the remote config is
     adopted);
  4. write the superblock READY and start the replica. It catches up from the leader by normal
     replication and, added as a non-voter with `promote`, is promoted once caught up.

Safety of replacing a READY replica. A voter must never lose an entry it acknowledged: the
leader may have counted that acknowledgement toward a commit. A replica acknowledges only
entries it has persisted, so it is replaced only if its persisted log (checked again once the
replica is stopped, `_prepare`) ends before the leader's first index - 1. The copy's image is
taken at the source's flushed index once it flushed, which is at or past that (the leader
keeps its log from its anchor minus `snapshot_catchup_entries`, and its anchor is a flushed
index it had already reached), so every entry the replica
ever acknowledged is in the image or was never committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import google_crc32c
import grpc

from service.common import channel_options
from service.common.errors import (
    Corruption,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StaleTerm,
    from_grpc,
)
from service.common.periodic import Periodic
from service.common.tls import Credentials, open_channel
from service.consensus.fs import RealFileSystem
from service.consensus.raft_store import RaftStore
from service.consensus.transport import GrpcTransport
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.raft import NO_NODE, NodeId, RaftConfig, Role, Snapshot, SnapshotMeta
from service.raft.progress import ProgressState
from service.tserver import superblock as sbmod
from service.tserver.rowstore import MANIFEST, is_store_file
from service.tserver.superblock import DataState, Superblock
from service.tserver.tablet import ReplicaState, TabletReplica, anchor_payload

log = logging.getLogger(__name__)

SESSIONS_DIR = "copy-sessions"
CHUNK_BYTES = 4 << 20
SESSION_IDLE_S = 60.0
TRIGGER_S = 3.0
RETRY_S = 5.0
RPC_TIMEOUT_S = 30.0
FAILPOINT_PAUSE = "TESSERA_FAILPOINT_COPY_PAUSE_S"
"""Environment variable (tests only): seconds to pause a copy right after COPYING is written."""


class ReplicaHost(Protocol):
    """What tablet copy uses of the replicas hosted here (`tablet_manager.TabletManager` is
    one): their directory, the server's uuid and own address, the replicas by tablet id, and
    the steps that replace one under its tablet's lock. Named here, so this module does not
    import the manager, and this list says all a copy may touch."""

    @property
    def uuid(self) -> NodeId: ...
    @property
    def root(self) -> Path: ...
    @property
    def transport(self) -> GrpcTransport: ...
    @property
    def replicas(self) -> dict[str, TabletReplica]: ...
    def get(self, tablet_id: str) -> TabletReplica: ...
    def lock(self, tablet_id: str) -> asyncio.Lock: ...
    def new_replica(self, d: Path, sb: Superblock) -> TabletReplica: ...
    async def start_replica(self, replica: TabletReplica) -> None: ...
    def changed(self, tablet_id: str) -> None: ...


# --- source ----------------------------------------------------------------------------------


@dataclass
class _Session:
    tablet_id: str
    requestor: str
    directory: Path
    """The session's hard links to the image's files."""
    files: dict[str, int]
    """File name -> size."""
    last_used: float = field(default_factory=time.monotonic)


class CopySource:
    """Serves copy sessions of the replicas hosted here (module docstring)."""

    def __init__(self, tablets: ReplicaHost, max_message_bytes: int = 64 << 20) -> None:
        self.tablets = tablets
        self.sessions: dict[str, _Session] = {}
        self.root = tablets.root.parent / SESSIONS_DIR
        # Sessions do not outlive the process: what a previous one left is removed.
        shutil.rmtree(self.root, ignore_errors=True)
        # A chunk and its envelope must fit in one response this server may send.
        self.max_chunk_bytes = max(4096, min(CHUNK_BYTES, max_message_bytes - (64 << 10)))

    async def begin(
        self, req: tpb.BeginTabletCopySessionRequestPB
    ) -> tpb.BeginTabletCopySessionResponsePB:
        self._expire()
        replica = self.tablets.get(req.tablet_id)
        node = replica.running_node()
        store = await replica.flush_for_copy()
        while store.install_pending:  # another flush began meanwhile: its manifest may be
            store = await replica.flush_for_copy()  # on disk already, its file not yet listed
        # From here to the links, no await: the manifest on disk, its files and `index` are
        # one state of the store (an install's manifest write is the only step off this loop,
        # and none is under way).
        sid = os.urandom(12).hex()
        directory = self.root / sid
        directory.mkdir(parents=True)
        # The image's index: the flushed one, or just before the first entry of a
        # transaction still unresolved here (its staged rows are in memory only: the copy
        # replays them from the leader's log, which keeps them; tablet.py).
        index = replica.log_anchor_index()
        names = store.data_files()
        for name in names:
            os.link(store.directory / name, directory / name)
        config = node.config_at(index)
        meta = {
            "snapshot_index": index,
            "snapshot_term": node.storage.term(index) if index else 0,
            "current_term": node.status().term,
            "voters": sorted(config.voters),
            "learners": sorted(config.learners),
            "config_index": config.index,
            "addresses": {
                p: a
                for p in config.voters | config.learners
                if (
                    a := replica.transport.address_of(p)
                    or (self.tablets.transport.own_address if p == self.tablets.uuid else None)
                )
            },
        }
        try:
            described = await asyncio.to_thread(_describe_files, directory, names)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.sessions[sid] = _Session(
            req.tablet_id, req.requestor_uuid, directory, {f.name: f.size for f in described}
        )
        log.info(
            "copy session %s: tablet %s at index %d for %s (%d files, %d bytes)",
            sid,
            req.tablet_id,
            index,
            req.requestor_uuid,
            len(described),
            sum(f.size for f in described),
        )
        return tpb.BeginTabletCopySessionResponsePB(
            session_id=sid,
            superblock=replica.superblock.encode(),
            consensus_meta=json.dumps(meta).encode(),
            data_files=described,
            session_idle_timeout_ms=int(SESSION_IDLE_S * 1000),
        )

    async def fetch(
        self, req: tpb.FetchDataRequestPB, owner: str | None = None
    ) -> tpb.FetchDataResponsePB:
        """A chunk of one of the session's files; `owner`: the caller, who must be the server
        that began the session (None: not checked, insecure mode)."""
        s = self._session(req.session_id, owner)
        size = s.files.get(req.file_name)
        if size is None:
            raise NotFound(f"copy session {req.session_id}: no file {req.file_name!r}")
        if req.offset > size:
            raise InvalidArgument(f"offset {req.offset} is past the end ({size} bytes)")
        n = min(req.max_length or self.max_chunk_bytes, self.max_chunk_bytes, size - req.offset)
        chunk = await asyncio.to_thread(_read_at, s.directory / req.file_name, req.offset, n)
        return tpb.FetchDataResponsePB(
            data=chunk, offset=req.offset, crc32c=google_crc32c.value(chunk), total_size=size
        )

    def end(self, req: tpb.EndTabletCopySessionRequestPB, owner: str | None = None) -> None:
        s = self.sessions.get(req.session_id)
        if s is None:
            return
        self._check_owner(req.session_id, s, owner)
        del self.sessions[req.session_id]
        shutil.rmtree(s.directory, ignore_errors=True)

    def close(self) -> None:
        for sid in list(self.sessions):
            shutil.rmtree(self.sessions.pop(sid).directory, ignore_errors=True)

    def _session(self, sid: str, owner: str | None = None) -> _Session:
        self._expire()
        s = self.sessions.get(sid)
        if s is None:
            raise NotFound(f"copy session {sid!r} not found (ended or idle past {SESSION_IDLE_S}s)")
        self._check_owner(sid, s, owner)
        s.last_used = time.monotonic()
        return s

    @staticmethod
    def _check_owner(sid: str, s: _Session, owner: str | None) -> None:
        """A session's files go only to the server that began it (which the tablet's config
        names): its id alone, if it leaked into a log, is not enough."""
        if owner is not None and owner != s.requestor:
            raise PermissionDenied(
                f"copy session {sid} belongs to tablet server {s.requestor}, not {owner}"
            )

    def _expire(self) -> None:
        now = time.monotonic()
        for sid, s in list(self.sessions.items()):
            if now - s.last_used > SESSION_IDLE_S:
                del self.sessions[sid]
                shutil.rmtree(s.directory, ignore_errors=True)


def _describe_files(directory: Path, names: list[str]) -> list[tpb.CopyFilePB]:
    """Name, size and CRC32C of each linked file (in a worker thread: reads them all)."""
    out = []
    for name in names:
        crc, size = 0, 0
        with open(directory / name, "rb") as f:
            while block := f.read(CHUNK_BYTES):
                crc = google_crc32c.extend(crc, block)
                size += len(block)
        out.append(tpb.CopyFilePB(name=name, size=size, crc32c=crc))
    return out


def _read_at(path: Path, offset: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


# --- destination -----------------------------------------------------------------------------


@dataclass
class CopyStatus:
    tablet_id: str
    source_uuid: str
    started_at: float = field(default_factory=time.time)
    bytes_copied: int = 0
    bytes_total: int = 0
    state: str = "RUNNING"
    message: str = ""
    task: asyncio.Task[None] | None = None

    def to_pb(self) -> tpb.TabletCopyStatusPB:
        return tpb.TabletCopyStatusPB(
            tablet_id=self.tablet_id,
            source_uuid=self.source_uuid,
            bytes_copied=self.bytes_copied,
            bytes_total=self.bytes_total,
            started_at_unix_s=self.started_at,
            state=self.state,
            message=self.message,
        )


class CopyClient:
    """Runs the copies this server is the destination of (module docstring)."""

    def __init__(
        self, tablets: ReplicaHost, max_concurrent: int, credentials: Credentials | None = None
    ) -> None:
        self.tablets = tablets
        self.credentials = credentials
        self.copies: dict[str, CopyStatus] = {}
        self._sem = asyncio.Semaphore(max_concurrent)

    def start(self, req: tpb.StartTabletCopyRequestPB) -> None:
        tablet_id = req.tablet_id
        if not req.copy_peer_uuid or not req.copy_peer_addr.host or not req.copy_peer_addr.port:
            raise InvalidArgument("copy_peer_uuid and copy_peer_addr: required")
        if req.copy_peer_uuid == self.tablets.uuid:
            raise InvalidArgument("copy_peer_uuid: a replica cannot copy from itself")
        running = self.copies.get(tablet_id)
        if running is not None and running.state == "RUNNING":
            return  # idempotent: that copy goes on
        existing = self.tablets.replicas.get(tablet_id)
        if existing is not None:
            if existing.superblock.data_state is DataState.READY and not _cannot_catch_up(
                existing, req.retained_from_index
            ):
                return  # already here (a late or repeated request)
            local_term = _local_term(existing)
            if req.caller_term < local_term:
                raise StaleTerm(
                    f"tablet {tablet_id}: copy requested in term {req.caller_term}, but this "
                    f"replica has seen term {local_term}"
                )
        status = CopyStatus(tablet_id, req.copy_peer_uuid)
        self.copies[tablet_id] = status
        address = f"{req.copy_peer_addr.host}:{req.copy_peer_addr.port}"
        status.task = asyncio.create_task(
            self._run(status, req.copy_peer_uuid, address, req.retained_from_index),
            name=f"copy-{tablet_id}",
        )

    def cancel(self, tablet_id: str) -> None:
        status = self.copies.get(tablet_id)
        if status is None or status.state != "RUNNING" or status.task is None:
            raise NotFound(f"no tablet copy of {tablet_id!r} is running here")
        status.task.cancel()

    async def aclose(self) -> None:
        for s in self.copies.values():
            if s.task is not None and not s.task.done():
                s.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await s.task

    async def _run(self, status: CopyStatus, source: str, address: str, retained_from: int) -> None:
        async with self._sem:
            try:
                await self._copy(status, source, address, retained_from)
                status.state = "DONE"
            except asyncio.CancelledError:
                status.state, status.message = "CANCELLED", "cancelled"
                await self._abandon(status.tablet_id)
            except Exception as e:
                err = from_grpc(e) if isinstance(e, grpc.aio.AioRpcError) else e
                status.state, status.message = "FAILED", str(err)
                log.warning("tablet copy of %s from %s failed: %s", status.tablet_id, source, err)
                await self._abandon(status.tablet_id)

    async def _copy(
        self, status: CopyStatus, source: str, address: str, retained_from: int
    ) -> None:
        tm = self.tablets
        tablet_id = status.tablet_id
        t0 = time.monotonic()
        async with open_channel(
            address,
            self.credentials,
            role="tserver",
            options=channel_options.tablet_copy(CHUNK_BYTES),
        ) as ch:
            stub = tpb_grpc.TabletCopyServiceStub(ch)
            begin: tpb.BeginTabletCopySessionResponsePB = await stub.BeginTabletCopySession(
                tpb.BeginTabletCopySessionRequestPB(
                    dest_uuid=source, tablet_id=tablet_id, requestor_uuid=tm.uuid
                ),
                timeout=RPC_TIMEOUT_S,
            )
            remote_sb = Superblock.decode(
                begin.superblock, f"superblock of {tablet_id} from {source}"
            )
            meta = json.loads(begin.consensus_meta)
            files = _check_offer(tablet_id, begin.data_files)
            status.bytes_total = sum(f.size for f in files)
            async with tm.lock(tablet_id):
                replica = await self._prepare(tablet_id, remote_sb, source, retained_from)
                pause = float(os.environ.get(FAILPOINT_PAUSE, "0") or 0)
                if pause:  # tests: a window to kill this server in the middle of a copy
                    log.warning("failpoint %s: pausing %.1fs mid-copy", FAILPOINT_PAUSE, pause)
                    await asyncio.sleep(pause)
                data_dir = replica.data_dir
                await asyncio.to_thread(RealFileSystem().makedirs, str(data_dir))
                for f in files:  # the MANIFEST last (`_check_offer`)
                    await self._fetch_file(stub, source, begin.session_id, f, data_dir, status)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.EndTabletCopySession(
                        tpb.EndTabletCopySessionRequestPB(
                            dest_uuid=source, session_id=begin.session_id, is_success=True
                        ),
                        timeout=RPC_TIMEOUT_S,
                    )
                await asyncio.to_thread(_install, replica, meta)
                sb = replica.superblock.with_state(DataState.READY, copy_source="")
                await asyncio.to_thread(sbmod.save, replica.dir, sb)
                replica.superblock = sb
                fresh = tm.new_replica(replica.dir, sb)
                tm.replicas[tablet_id] = fresh
                await tm.start_replica(fresh)
        mb = status.bytes_total / 1e6
        dt = time.monotonic() - t0
        log.info(
            "tablet copy of %s from %s done: %.1f MB in %.2fs (%.1f MB/s)",
            tablet_id,
            source,
            mb,
            dt,
            mb / dt if dt else 0.0,
        )
        tm.changed(tablet_id)

    async def _fetch_file(
        self,
        stub: tpb_grpc.TabletCopyServiceAsyncStub,
        source: str,
        session_id: str,
        f: tpb.CopyFilePB,
        data_dir: Path,
        status: CopyStatus,
    ) -> None:
        """Stream one file of the image into `data_dir`: chunk CRCs, then the whole file's CRC,
        then fsync. The MANIFEST is written to a temporary name and renamed over (atomic), so
        the store is complete exactly when it has a manifest."""
        final = data_dir / f.name
        path = final.with_name(f.name + ".tmp") if f.name == MANIFEST else final
        fd = await asyncio.to_thread(
            os.open, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644
        )
        try:
            crc, offset = 0, 0
            while offset < f.size:
                chunk: tpb.FetchDataResponsePB = await stub.FetchData(
                    tpb.FetchDataRequestPB(
                        dest_uuid=source,
                        session_id=session_id,
                        file_name=f.name,
                        offset=offset,
                        max_length=CHUNK_BYTES,
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
                data = chunk.data
                if google_crc32c.value(data) != chunk.crc32c or chunk.offset != offset:
                    raise Corruption(f"copy of {f.name}: bad chunk at offset {offset}")
                if not data:
                    raise Corruption(f"copy of {f.name}: empty chunk at offset {offset}")
                await _to_thread_to_the_end(_write_all, fd, data)
                crc = google_crc32c.extend(crc, data)
                offset += len(data)
                status.bytes_copied += len(data)
            if crc != f.crc32c:
                raise Corruption(f"copy of {f.name}: the file's checksum does not match")
            await _to_thread_to_the_end(os.fsync, fd)
        finally:
            os.close(fd)  # no thread is using it: see _to_thread_to_the_end
        if path != final:
            await asyncio.to_thread(os.replace, path, final)
            await asyncio.to_thread(RealFileSystem().fsync_dir, str(data_dir))

    async def _prepare(
        self, tablet_id: str, remote_sb: Superblock, source: str, retained_from: int
    ) -> TabletReplica:
        """Write COPYING first (the commit point), keeping the consensus metadata of the
        replica replaced (a tombstone, or a READY replica too far behind to catch up, which
        is stopped first)."""
        tm = self.tablets
        existing = tm.replicas.get(tablet_id)
        if existing is not None and existing.superblock.data_state is DataState.READY:
            if not _cannot_catch_up(existing, retained_from):
                raise FailedPrecondition(f"tablet {tablet_id} became READY here meanwhile")
            log.info(
                "tablet %s: the replica's log ends before index %d, where the leader's log "
                "starts; replacing it by a copy from %s",
                tablet_id,
                retained_from,
                source,
            )
            node = existing.node
            assert node is not None
            await existing.aclose()
            # Re-checked once stopped: what the replica may have acknowledged is what it
            # persisted, and that must all be within the copy (module docstring, Safety).
            if node.storage.last_index() >= retained_from - 1:
                fresh = tm.new_replica(existing.dir, existing.superblock)
                tm.replicas[tablet_id] = fresh
                await tm.start_replica(fresh)
                raise FailedPrecondition(f"tablet {tablet_id} caught up while being stopped")
        d = tm.root / tablet_id
        d.mkdir(parents=True, exist_ok=True)
        sb = Superblock(
            tablet_id=tablet_id,
            table_id=remote_sb.table_id,
            table_name=remote_sb.table_name,
            partition_pb=remote_sb.partition_pb,
            partition_schema_pb=remote_sb.partition_schema_pb,
            data_state=DataState.COPYING,
            copy_source=source,
        )
        await asyncio.to_thread(sbmod.save, d, sb)
        replica = tm.new_replica(d, sb)
        replica.state = ReplicaState.COPYING
        await asyncio.to_thread(replica.delete_files)
        tm.replicas[tablet_id] = replica
        tm.changed(tablet_id)
        return replica

    async def _abandon(self, tablet_id: str) -> None:
        """A failed or cancelled copy leaves a tombstone (consensus metadata kept)."""
        tm = self.tablets
        replica = tm.replicas.get(tablet_id)
        if replica is None or replica.superblock.data_state is not DataState.COPYING:
            return
        await asyncio.to_thread(replica.delete_files)
        sb = replica.superblock.with_state(DataState.TOMBSTONED, copy_source="")
        await asyncio.to_thread(sbmod.save, replica.dir, sb)
        replica.superblock = sb
        replica.state = ReplicaState.TOMBSTONED
        tm.changed(tablet_id)


def _cannot_catch_up(replica: TabletReplica, retained_from: int) -> bool:
    """Whether a running replica's log ends before `retained_from - 1`: the leader no longer
    has the entries that would follow it, so replication can never bring it up to date (and
    tablets send no snapshots). Such a replica is replaced by a copy; any other READY one is
    left alone."""
    node = replica.node
    if retained_from <= 1 or node is None or replica.state is not ReplicaState.RUNNING:
        return False
    return node.status().last_index < retained_from - 1


def _local_term(replica: TabletReplica) -> int:
    from service.consensus.cmeta import CmetaStore

    cm = CmetaStore(RealFileSystem(), str(replica.raft_dir / "cmeta")).load()
    return cm.term if cm is not None else 0


def _check_offer(tablet_id: str, offered: Sequence[tpb.CopyFilePB]) -> list[tpb.CopyFilePB]:
    """The files a session offers, validated (each a row store file named once, the MANIFEST
    among them), in fetch order: the MANIFEST last."""
    names = [f.name for f in offered]
    bad = [n for n in names if not is_store_file(n)]
    if bad or len(set(names)) != len(names) or MANIFEST not in names:
        raise Corruption(
            f"copy session of {tablet_id} offers {sorted(names)!r}: expected row store files "
            f"named once each, with a {MANIFEST}"
        )
    return sorted(offered, key=lambda f: f.name == MANIFEST)


async def _to_thread_to_the_end(fn: Callable[..., object], *args: object) -> None:
    """`asyncio.to_thread`, except that a cancelled caller waits for the call to finish before
    the cancel goes on. A copy cancelled mid-write closes its file descriptor in `finally`: had
    the worker thread still been writing, its next write could land in whatever file reused
    that number (a WAL segment)."""
    call = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([call])
        if not call.cancelled():
            call.exception()  # retrieved: the cancel is what the caller hears of
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _install(replica: TabletReplica, meta: dict[str, object]) -> None:
    """Step 3 of the module docstring, in a worker thread: the row store's files are in place;
    write the Raft state (a snapshot that anchors the log at the image's index, cmeta)."""
    index = int(meta["snapshot_index"])  # type: ignore[call-overload]
    config = RaftConfig(
        frozenset(NodeId(v) for v in meta["voters"]),  # type: ignore[attr-defined]
        frozenset(NodeId(v) for v in meta["learners"]),  # type: ignore[attr-defined]
        int(meta["config_index"]),  # type: ignore[call-overload]
    )
    addresses = {str(k): str(v) for k, v in dict(meta["addresses"]).items()}  # type: ignore[call-overload]
    s = replica.settings
    store, _ = RaftStore.open(
        RealFileSystem(),
        str(replica.raft_dir),
        replica.uuid,
        bootstrap_config=config,
        addresses=addresses,
        segment_bytes=s.wal_segment_bytes,
        preallocate=s.wal_preallocate,
        fsync=s.fsync,
    )
    try:
        remote_term = int(meta["current_term"])  # type: ignore[call-overload]
        local = store.cmeta
        if remote_term > local.term:
            term, vote = remote_term, NO_NODE
        else:
            term, vote = local.term, local.vote
        store.save_cmeta(
            term=term, vote=vote, config=config, addresses={**local.addresses, **addresses}
        )
        term_at = int(meta["snapshot_term"])  # type: ignore[call-overload]
        store.save_snapshot(Snapshot(SnapshotMeta(index, term_at, config), anchor_payload(index)))
        store.wal.sync()
    finally:
        store.close()


# --- the leader's trigger --------------------------------------------------------------------


class CopyTrigger:
    """On a tablet's leader: StartTabletCopy to peers that acknowledge nothing (module doc)."""

    def __init__(
        self,
        replica_of: Callable[[], list[TabletReplica]],
        own_uuid: str,
        own_address: Callable[[], str],
        credentials: Credentials | None = None,
        answering: Callable[[str], bool] = lambda peer: False,
    ) -> None:
        self.replica_of = replica_of
        self.credentials = credentials
        self.answering = answering
        """Whether a peer's server takes our Raft messages now (`GrpcTransport.answering`)."""
        self.own_uuid = own_uuid
        self.own_address = own_address
        self._silent_since: dict[tuple[str, str], float] = {}
        self._snapshot_since: dict[tuple[str, str], float] = {}
        self._last_try: dict[tuple[str, str], float] = {}
        self._periodic = Periodic("copy-trigger", 1.0, self._check_now, log)
        self.sent = 0
        self._sends: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._periodic.start()

    async def aclose(self) -> None:
        await self._periodic.aclose()

    async def _check_now(self) -> None:
        await self.check(time.monotonic())

    async def check(self, now: float) -> None:
        seen: set[tuple[str, str]] = set()
        waiting: set[tuple[str, str]] = set()
        for replica in self.replica_of():
            node = replica.node
            if node is None or node.quiesced or replica.state is not ReplicaState.RUNNING:
                continue  # a quiesced leader's peers all have its whole log (quiesce.py)
            st = node.status()
            if st.role is not Role.LEADER:
                continue
            first = node.storage.first_index()
            for peer, pr in st.progress.items():
                if peer == self.own_uuid:
                    continue
                key = (replica.tablet_id, str(peer))
                if pr.state is ProgressState.SNAPSHOT:
                    waiting.add(key)
                    if now - self._snapshot_since.setdefault(key, now) >= TRIGGER_S:
                        node.report_snapshot(peer, ok=True)  # probe again (module docstring)
                        del self._snapshot_since[key]
                behind = pr.match == 0 or pr.match < first - 1
                # A member whose server answers but whose replica does not: the server lost
                # the replica (module docstring, "lost").
                lost = not pr.recent_active and self.answering(str(peer))
                if not (behind or lost):
                    continue  # it can be brought up to date from the log
                seen.add(key)
                since = self._silent_since.setdefault(key, now)
                # A peer added to be promoted (Kudu's PRE_VOTER: a move, a 3-4-3
                # replacement) is known to be empty: copy at once rather than wait.
                wait = 0.0 if pr.match == 0 and node.is_promotable(peer) else TRIGGER_S
                if now - since < wait or now - self._last_try.get(key, 0.0) < RETRY_S:
                    continue
                self._last_try[key] = now
                if not behind:
                    # Probe it again (as after a failed send): a progress still replicating
                    # would take the copy's answer from below its old match for a stale one.
                    node.report_unreachable(str(peer))
                address = replica.transport.address_of(peer)
                if address:
                    t = asyncio.create_task(self._send(replica, peer, address, st.term, first))
                    self._sends.add(t)
                    t.add_done_callback(self._sends.discard)
        for key in list(self._silent_since):
            if key not in seen:
                del self._silent_since[key]
        for key in list(self._snapshot_since):
            if key not in waiting:
                del self._snapshot_since[key]

    async def _send(
        self, replica: TabletReplica, peer: str, address: str, term: int, retained_from: int
    ) -> None:
        host, _, port = self.own_address().rpartition(":")
        req = tpb.StartTabletCopyRequestPB(
            dest_uuid=peer,
            tablet_id=replica.tablet_id,
            copy_peer_uuid=self.own_uuid,
            caller_term=term,
            retained_from_index=retained_from,
        )
        req.copy_peer_addr.host, req.copy_peer_addr.port = host, int(port)
        try:
            async with open_channel(address, self.credentials, role="tserver") as ch:
                await tpb_grpc.TabletServerAdminServiceStub(ch).StartTabletCopy(
                    req, timeout=RPC_TIMEOUT_S
                )
            self.sent += 1
            log.info("asked %s to copy tablet %s from here", peer, replica.tablet_id)
        except grpc.aio.AioRpcError as e:
            log.info(
                "StartTabletCopy of %s to %s failed: %s", replica.tablet_id, peer, from_grpc(e)
            )
