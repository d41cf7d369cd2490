"""A tablet-server simulator: N simulated servers in one process, for master tests and benchmarks.

    python -m service.testing.ts_simulator --masters H:P,H:P,H:P --uuid ts-1 \\
        --bind 127.0.0.1:0 --port-file F [--count N] [--heartbeat-interval-ms 1000]

It is NOT a tablet server: replicas hold no data and "consensus" is a rule, not Raft. It never
replaces the real tablet server (service/tserver) in end-to-end tests. What it does speak is
the master's side of the contract exactly:

* Heartbeats (master.proto TSHeartbeat) from every simulated server to EVERY master each
  interval: registration when a master asks for it (`needs_reregister`), a full tablet report to
  the leader when it asks for one (`needs_full_tablet_report`, after its election or a
  registration), incremental reports (replicas whose reported state changed since the last
  report the leader acknowledged, and removed ones) otherwise. Reports go to the master that
  last said it leads; followers get liveness-only heartbeats.
* TabletServerAdminService (tserver.proto) on ONE port for all simulated servers: every
  request is routed by its `dest_uuid` (an unknown uuid is refused with WrongDestination, a
  stopped server answers UNAVAILABLE), and refused with StaleTerm if its fence term is lower
  than the highest master term that server has seen (from leader heartbeat answers and fences).
  CreateTablet (idempotent), DeleteTablet (DELETED drops the replica, TOMBSTONED keeps it
  tombstoned; compare-and-set on the replica's committed config op index), AlterSchema (leader
  only), ChangeConfig (leader only, compare-and-set, one pending NON_VOTER at a time; an added
  peer hosted here gets its replica at once, as a finished tablet copy, and a NON_VOTER with
  `promote` becomes a VOTER one heartbeat round later, as "caught up").

The consensus rule: a tablet's leader is the first VOTER of its committed config whose server
is up in this process and hosts a live replica; each change of leader bumps the term (the first
leader has term 1). A replica removed from the config, or whose server is stopped, keeps the
view it had (its old config and term), so when its server comes back it reports a stale config,
as an evicted replica would.

Security: with `pki` (`--pki DIR`, a `ClusterPki` directory holding the masters' CA) the
simulator speaks to secured masters as a fleet of real tablet servers would: each simulated
server heartbeats over its own mutual-TLS connection to each master with its own `tserver`
certificate, issued from that CA on start (a master accepts a heartbeat only from the server
it names), and the admin port serves TLS with one `tserver` certificate and requires the
callers' certificates from the CA (it does not authorize further: it is a simulator). Without
it, plaintext, the fleet's heartbeats sharing HEARTBEAT_CHANNELS connections per master.

Use `Simulator` in-process (tests own its event loop, or `SimulatorThread` runs one in a
thread), or the command line, which serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from service.common.errors import (
    CasMismatch,
    ConfigChangeRejected,
    InvalidArgument,
    NotFound,
    NotTheLeader,
    ServiceUnavailable,
    StaleTerm,
    WrongDestination,
    rpc_errors,
)
from service.common.pki import ClusterPki
from service.common.tls import Credentials, add_port, open_channel
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.tserver.heartbeater import HeartbeatStream

__all__ = ["Simulator", "SimulatorThread", "main"]

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext


HEARTBEAT_CHANNELS = 16
"""Connections to each master the fleet's heartbeat streams are spread over (a real fleet has
one per server)."""


@dataclass
class _Peer:
    uuid: str
    voter: bool
    host: str = ""
    port: int = 0
    promote: bool = False

    def to_pb(self) -> mpb.RaftPeerPB:
        out = mpb.RaftPeerPB(
            permanent_uuid=self.uuid,
            member_type=mpb.VOTER if self.voter else mpb.NON_VOTER,
            promote=self.promote,
        )
        if self.host:
            out.last_known_addr.host = self.host
            out.last_known_addr.port = self.port
        return out

    @classmethod
    def from_pb(cls, p: mpb.RaftPeerPB) -> _Peer:
        return cls(
            p.permanent_uuid,
            p.member_type == mpb.VOTER,
            p.last_known_addr.host,
            p.last_known_addr.port,
            p.promote,
        )


@dataclass
class _View:
    """A replica's view of its group: committed config, term, leader, schema version."""

    opid_index: int
    peers: list[_Peer]
    term: int = 0
    leader: str = ""
    schema_version: int = 0

    def copy(self) -> _View:
        return _View(
            self.opid_index,
            [_Peer(p.uuid, p.voter, p.host, p.port, p.promote) for p in self.peers],
            self.term,
            self.leader,
            self.schema_version,
        )

    def peer(self, uuid: str) -> _Peer | None:
        return next((p for p in self.peers if p.uuid == uuid), None)


@dataclass
class _Group:
    """One tablet's Raft group as this process simulates it (module docstring)."""

    tablet_id: str
    table_id: str
    view: _View
    version: int = 0
    epoch: int = -1
    """The simulator epoch the leader was computed at."""
    added_round: dict[str, int] = field(default_factory=dict)


@dataclass
class _Replica:
    server: str
    group: _Group
    view: _View
    tombstoned: bool = False
    version: int = 0


@dataclass
class _MasterLink:
    address: str
    registered: bool = False
    leader: bool = False
    need_full: bool = True
    acked: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    seq: int = 0
    in_flight: bool = False
    """A heartbeat on this link has not been answered yet (stagger mode sends no other)."""
    clean_at: int = -1
    """The simulator's change count when this link's master last acknowledged a report of
    every replica's state: while the count is unchanged there is nothing to report."""


@dataclass
class _Server:
    uuid: str
    seqno: int
    up: bool = True
    highest_term: int = 0
    replicas: dict[str, _Replica] = field(default_factory=dict)
    links: dict[str, _MasterLink] = field(default_factory=dict)
    counted_at: int = -1
    """The change count `live_tablets` and `leaders` were counted at."""
    live_tablets: int = 0
    leaders: int = 0


RECENT_S = 10.0
"""The window of the `recent_*` heartbeat statistics (a benchmark's steady-state window)."""


class Simulator:
    """N simulated tablet servers sharing one admin port (module docstring)."""

    def __init__(
        self,
        masters: Sequence[str],
        uuids: Sequence[str],
        bind: str = "127.0.0.1:0",
        heartbeat_interval_s: float = 1.0,
        rpc_timeout_s: float = 5.0,
        location: str = "",
        stagger: bool = False,
        pki: ClusterPki | None = None,
    ) -> None:
        if not masters:
            raise InvalidArgument("masters: give at least one master address")
        if not uuids or len(set(uuids)) != len(uuids):
            raise InvalidArgument("uuids: give distinct server uuids")
        self.masters = list(masters)
        self.bind = bind
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.location = location
        self.stagger = stagger
        """Spread each round's heartbeats evenly over the interval, as independent servers
        send them, instead of sending all at once (a burst no real fleet produces)."""
        self.pki = pki
        """Mutual TLS, each server as itself (module docstring); None: plaintext."""
        self._credentials: dict[str, Credentials] = {}
        seqno = time.time_ns() // 1000
        self.servers = {u: _Server(u, seqno) for u in uuids}
        for s in self.servers.values():
            s.links = {m: _MasterLink(m) for m in self.masters}
        self.groups: dict[str, _Group] = {}
        self.address = ""
        self.epoch = 0
        self._tablet_counts = (-1, 0, 0)
        """(change count, replicas, leaders) as last counted for the statistics."""
        self.rounds = 0
        self._counter = 0
        self.hold_creates = False
        """Tests: refuse CreateTablet (UNAVAILABLE) while set, to keep creates pending."""
        self.send_reports = True
        """Tests: while False, heartbeats carry no tablet report at all (liveness only), so a
        master knows replicas only from its catalog (the KUDU-1353 scenario)."""
        self.full_reports: Counter[tuple[str, str]] = Counter()
        """(server uuid, master address) -> full tablet reports that master acknowledged."""
        self.heartbeat_latencies: list[float] = []
        self.recent_latencies: deque[tuple[float, float]] = deque()
        """(monotonic end time, latency) of the heartbeats of the last RECENT_S seconds."""
        self.heartbeats_failed = 0
        self.heartbeat_errors: Counter[str] = Counter()
        """gRPC status name -> heartbeats that failed with it."""
        self._server: grpc.aio.Server | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._streams: dict[tuple[str, str], HeartbeatStream] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # SO_REUSEPORT off: one server per port (see RpcSettings.server_options).
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        if self.pki is not None:
            self._credentials = {
                u: Credentials.from_files(self.pki.files("tserver", u)) for u in self.servers
            }
        admin_creds = next(iter(self._credentials.values()), None)
        port = add_port(server, self.bind, admin_creds)
        if port == 0:
            raise OSError(f"could not bind {self.bind}")
        host = self.bind.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        servicer = _AdminServicer(self)  # type: ignore[abstract]
        tserver_pb2_grpc.add_TabletServerAdminServiceServicer_to_server(servicer, server)
        await server.start()
        self._server = server
        for m in self.masters if self.pki is None else ():
            for i in range(HEARTBEAT_CHANNELS):
                ch = grpc.aio.insecure_channel(m, options=[("grpc.use_local_subchannel_pool", 1)])
                self._channels[f"{m}#{i}"] = ch
                self._stubs[f"{m}#{i}"] = master_pb2_grpc.MasterServiceStub(ch)
        self._loop_task = asyncio.create_task(self._heartbeat_loop(), name="ts-sim-heartbeats")

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        for task in list(self._in_flight):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.stop(grace=0.2)
        for stream in self._streams.values():
            stream.close()
        for ch in self._channels.values():
            await ch.close(None)

    # --- control (tests) ---------------------------------------------------------------------

    def stop_server(self, uuid: str) -> None:
        """The server goes silent: no heartbeats, its admin RPCs fail UNAVAILABLE."""
        self.servers[uuid].up = False
        self.epoch += 1
        self._bump()

    def start_server(self, uuid: str) -> None:
        """The server comes back as a new process (higher seqno): it registers again."""
        s = self.servers[uuid]
        s.up = True
        s.seqno += 1
        for link in s.links.values():
            link.registered = False
            link.need_full = True
            link.acked.clear()
        self.epoch += 1
        self._bump()

    def tablet_counts(self) -> tuple[int, int]:
        """(replicas hosted, tablets with a leader) across the fleet; counted again only
        when something changed since (the change count)."""
        if self._tablet_counts[0] != self._counter:
            replicas = sum(len(s.replicas) for s in self.servers.values())
            leaders = sum(1 for g in self.groups.values() if g.view.leader)
            self._tablet_counts = (self._counter, replicas, leaders)
        return self._tablet_counts[1], self._tablet_counts[2]

    def replicas_of(self, uuid: str) -> dict[str, _Replica]:
        return self.servers[uuid].replicas

    def leader_of(self, tablet_id: str) -> str:
        g = self.groups[tablet_id]
        self._refresh(g)
        return g.view.leader

    def _bump(self) -> int:
        self._counter += 1
        return self._counter

    # --- the consensus rule ------------------------------------------------------------------

    def _refresh(self, g: _Group) -> None:
        """Recompute the group's leader if liveness or the config changed since."""
        if g.epoch == self.epoch and not g.added_round:
            return
        # "Catch-up": a NON_VOTER to promote becomes a VOTER one round after it was added.
        for p in g.view.peers:
            added = g.added_round.get(p.uuid)
            if p.promote and not p.voter and added is not None and self.rounds > added:
                host = self.servers.get(p.uuid)
                if host is not None and host.up and g.tablet_id in host.replicas:
                    p.voter, p.promote = True, False
                    g.view.opid_index += 1
                    g.added_round.pop(p.uuid, None)
                    g.version = self._bump()
        leader = ""
        for p in g.view.peers:
            s = self.servers.get(p.uuid)
            r = s.replicas.get(g.tablet_id) if s is not None else None
            if p.voter and s is not None and s.up and r is not None and not r.tombstoned:
                leader = p.uuid
                break
        if leader != g.view.leader:
            g.view.leader = leader
            if leader:
                g.view.term += 1
            g.version = self._bump()
        g.epoch = self.epoch
        for p in g.view.peers:
            s = self.servers.get(p.uuid)
            r = s.replicas.get(g.tablet_id) if s is not None else None
            in_sync = r is None or r.view.__dict__ == g.view.__dict__
            if s is not None and s.up and r is not None and not r.tombstoned and not in_sync:
                r.view = g.view.copy()
                r.version = self._bump()

    def _report(self, s: _Server, r: _Replica) -> mpb.ReportedTabletPB:
        v = r.view
        me = v.peer(s.uuid)
        if r.tombstoned:
            role = mpb.NON_PARTICIPANT
        elif v.leader == s.uuid:
            role = mpb.LEADER
        elif me is None:
            role = mpb.NON_PARTICIPANT
        else:
            role = mpb.FOLLOWER if me.voter else mpb.LEARNER
        out = mpb.ReportedTabletPB(
            tablet_id=r.group.tablet_id,
            state=mpb.REPLICA_TOMBSTONED if r.tombstoned else mpb.REPLICA_RUNNING,
            role=role,
            schema_version=v.schema_version,
        )
        leader_ok = any(p.uuid == v.leader and p.voter for p in v.peers)
        out.consensus_state.current_term = v.term
        out.consensus_state.leader_uuid = v.leader if leader_ok else ""
        out.consensus_state.committed_config.opid_index = v.opid_index
        out.consensus_state.committed_config.peers.extend(p.to_pb() for p in v.peers)
        return out

    # --- heartbeats --------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.beat_once()
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.heartbeat_interval_s - elapsed))

    async def beat_once(self) -> None:
        """One round: every live server heartbeats to every master, concurrently (spread over
        the interval with `stagger`)."""
        self.rounds += 1
        for g in self.groups.values():
            self._refresh(g)
        pairs = [(s, link) for s in self.servers.values() if s.up for link in s.links.values()]
        if not self.stagger:
            await asyncio.gather(*(self._heartbeat(s, link) for s, link in pairs))
            return
        # Independent servers: each link heartbeats at its own phase of the interval, one
        # heartbeat at a time, and a slow answer delays only that link's next heartbeat (as
        # a real heartbeater), not the whole fleet's next round.
        step = self.heartbeat_interval_s / max(1, len(pairs))
        t0 = time.monotonic()
        for i, (s, link) in enumerate(pairs):
            delay = t0 + i * step - time.monotonic()
            if delay > 0.001:
                await asyncio.sleep(delay)
            if link.in_flight:
                continue
            link.in_flight = True
            task = asyncio.create_task(self._heartbeat(s, link))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            task.add_done_callback(functools.partial(_answered, link))

    async def _heartbeat(self, s: _Server, link: _MasterLink) -> None:
        req = mpb.TSHeartbeatRequestPB(
            instance=mpb.NodeInstancePB(permanent_uuid=s.uuid, instance_seqno=s.seqno),
            highest_master_term_seen=s.highest_term,
        )
        # Every change to any replica bumps the change count (`_bump`): while it stands still
        # (a fleet in steady state) nothing a server reports has changed, and the counts and
        # reports are not recomputed. Real tablet servers track dirty tablets the same way;
        # scanning every replica of 1,000 servers each second made the simulator, not the
        # master, the bottleneck of bench-master's heartbeat latency.
        stamp = self._counter
        if s.counted_at != stamp:
            live = [r for r in s.replicas.values() if not r.tombstoned]
            s.live_tablets = len(live)
            s.leaders = sum(1 for r in live if r.view.leader == s.uuid)
            s.counted_at = stamp
        req.num_live_tablets = s.live_tablets
        req.num_leaders = s.leaders
        if not link.registered:
            host, _, port = self.address.rpartition(":")
            req.registration.rpc_addresses.add(host=host, port=int(port))
            req.registration.software_version = "ts-simulator"
            req.registration.start_time_us = s.seqno
            if self.location:
                req.registration.location = self.location
        sent: dict[str, tuple[int, int, int]] = {}
        full = False
        if link.registered and link.leader and self.send_reports:
            full = link.need_full
            report = req.tablet_report
            report.is_incremental = not full
            link.seq += 1
            report.sequence_number = link.seq
            if full or link.clean_at != stamp:
                for tid, r in s.replicas.items():
                    key = (r.version, r.group.version, id(r))
                    sent[tid] = key
                    if full or link.acked.get(tid) != key:
                        report.updated_tablets.append(self._report(s, r))
                if not full:
                    report.removed_tablet_ids.extend(t for t in link.acked if t not in s.replicas)
        t0 = time.perf_counter()
        try:
            resp = await self._stream(s, link).heartbeat(req)
        except Exception as e:  # counted; the fleet's heartbeat loop must go on
            self.heartbeats_failed += 1
            why = e.code().name if isinstance(e, grpc.aio.AioRpcError) else type(e).__name__
            self.heartbeat_errors[why] += 1
            link.leader = False
            log.debug("heartbeat %s -> %s failed: %s", s.uuid, link.address, why)
            return
        latency = time.perf_counter() - t0
        self.heartbeat_latencies.append(latency)
        now = time.monotonic()
        self.recent_latencies.append((now, latency))
        while self.recent_latencies[0][0] < now - RECENT_S:
            self.recent_latencies.popleft()
        if len(self.heartbeat_latencies) > 200_000:
            del self.heartbeat_latencies[:100_000]
        link.leader = resp.leader_master
        if resp.leader_master and resp.master_term > s.highest_term:
            s.highest_term = resp.master_term
        if resp.needs_reregister:
            link.registered = False
            link.need_full = True
            return
        link.registered = True
        if sent and resp.acked_report_sequence_number == link.seq:
            if full:
                self.full_reports[(s.uuid, link.address)] += 1
                link.acked = sent
            else:
                link.acked.update(sent)
                for t in [t for t in link.acked if t not in sent]:
                    del link.acked[t]
            link.need_full = False
            link.clean_at = stamp  # every replica as of `stamp` is acknowledged
        link.need_full = link.need_full or resp.needs_full_tablet_report

    def _stream(self, s: _Server, link: _MasterLink) -> HeartbeatStream:
        """The server's heartbeat stream to the link's master (as a tablet server keeps one),
        on one of a few connections the fleet shares, or secured on its own connection."""
        key = (s.uuid, link.address)
        stream = self._streams.get(key)
        if stream is None:
            stream = HeartbeatStream(self._stub(s.uuid, link.address), self.rpc_timeout_s)
            self._streams[key] = stream
        return stream

    def _stub(self, uuid: str, master: str) -> Any:
        """A stub on a shared plaintext connection, or (secured) on a mutual-TLS connection of
        this server's own, made on first use."""
        creds = self._credentials.get(uuid)
        if creds is None:
            return self._stubs[f"{master}#{zlib.crc32(uuid.encode()) % HEARTBEAT_CHANNELS}"]
        key = f"{master}#{uuid}"
        stub = self._stubs.get(key)
        if stub is None:
            options = [("grpc.use_local_subchannel_pool", 1)]
            ch = self._channels[key] = open_channel(master, creds, role="master", options=options)
            stub = self._stubs[key] = master_pb2_grpc.MasterServiceStub(ch)
        return stub

    # --- admin operations (called by the servicer) -------------------------------------------

    def _target(self, dest_uuid: str, fence: tpb.MasterFencePB | None) -> _Server:
        s = self.servers.get(dest_uuid)
        if s is None:
            raise WrongDestination(f"no simulated tablet server {dest_uuid!r} here")
        if not s.up:
            raise ServiceUnavailable(f"simulated tablet server {dest_uuid} is down")
        if fence is not None:
            if fence.master_term < s.highest_term:
                raise StaleTerm(
                    f"master {fence.master_uuid} sent term {fence.master_term}, but server "
                    f"{s.uuid} has seen term {s.highest_term}"
                )
            s.highest_term = fence.master_term
        return s

    def create_tablet(self, req: tpb.CreateTabletRequestPB) -> None:
        s = self._target(req.dest_uuid, req.fence if req.HasField("fence") else None)
        if self.hold_creates:
            raise ServiceUnavailable(f"{s.uuid}: CreateTablet held by the test")
        existing = s.replicas.get(req.tablet_id)
        if existing is not None and not existing.tombstoned:
            if existing.group.table_id != req.table_id:
                raise InvalidArgument(f"tablet {req.tablet_id} exists for another table")
            return
        g = self.groups.get(req.tablet_id)
        if g is None:
            view = _View(
                req.config.opid_index,
                [_Peer.from_pb(p) for p in req.config.peers],
                schema_version=req.schema.version,
            )
            g = self.groups[req.tablet_id] = _Group(req.tablet_id, req.table_id, view)
        g.version = self._bump()
        s.replicas[req.tablet_id] = _Replica(s.uuid, g, g.view.copy(), version=self._bump())
        g.epoch = -1

    def delete_tablet(self, req: tpb.DeleteTabletRequestPB) -> None:
        s = self._target(req.dest_uuid, req.fence if req.HasField("fence") else None)
        r = s.replicas.get(req.tablet_id)
        if r is None:
            raise NotFound(f"tablet {req.tablet_id} is not hosted on {s.uuid}")
        tombstone = req.delete_type == tpb.TABLET_DATA_TOMBSTONED
        if tombstone and r.tombstoned:
            return
        if req.HasField("cas_config_opid_index") and r.view.opid_index > req.cas_config_opid_index:
            raise CasMismatch(
                f"tablet {req.tablet_id} on {s.uuid}: committed config op id "
                f"{r.view.opid_index} is newer than {req.cas_config_opid_index}"
            )
        if tombstone:
            r.tombstoned = True
            r.version = self._bump()
        else:
            del s.replicas[req.tablet_id]
            self._bump()
        r.group.epoch = -1

    def consensus_states(
        self, req: tpb.GetConsensusStateRequestPB
    ) -> tpb.GetConsensusStateResponsePB:
        """Each asked replica's committed consensus state as its server sees it (every live
        replica when none is named): what a master asks to confirm a membership claim."""
        s = self._target(req.dest_uuid, None)
        out = tpb.GetConsensusStateResponsePB()
        for tablet_id in list(req.tablet_ids) or list(s.replicas):
            r = s.replicas.get(tablet_id)
            if r is None or r.tombstoned:
                continue
            reported = self._report(s, r)
            out.tablets.add(
                tablet_id=tablet_id, consensus_state=reported.consensus_state, role=reported.role
            )
        return out

    def _leader_replica(self, dest_uuid: str, fence: tpb.MasterFencePB, tablet_id: str) -> _Group:
        s = self._target(dest_uuid, fence)
        r = s.replicas.get(tablet_id)
        if r is None or r.tombstoned:
            raise NotFound(f"tablet {tablet_id} is not hosted on {s.uuid}")
        g = r.group
        self._refresh(g)
        if g.view.leader != s.uuid:
            raise NotTheLeader(
                f"{s.uuid} is not the leader of tablet {tablet_id}",
                leader_uuid=g.view.leader or None,
            )
        return g

    def alter_schema(self, req: tpb.AlterSchemaRequestPB) -> int:
        g = self._leader_replica(req.dest_uuid, req.fence, req.tablet_id)
        if req.schema.version > g.view.schema_version:
            g.view.schema_version = req.schema.version
            g.version = self._bump()
            g.epoch = -1
        return g.view.schema_version

    def change_config(self, req: tpb.ChangeConfigRequestPB) -> mpb.ConsensusStatePB:
        g = self._leader_replica(req.dest_uuid, req.fence, req.tablet_id)
        v = g.view
        if req.HasField("cas_config_opid_index") and req.cas_config_opid_index != v.opid_index:
            raise CasMismatch(
                f"tablet {req.tablet_id}: committed config op id is {v.opid_index}, not "
                f"{req.cas_config_opid_index}"
            )
        uuid = req.peer.permanent_uuid
        kind = req.type
        if kind == tpb.ChangeConfigRequestPB.ADD_PEER:
            if v.peer(uuid) is not None:
                raise ConfigChangeRejected(f"{uuid} is already a peer of {req.tablet_id}")
            if any(p.promote and not p.voter for p in v.peers):
                raise ConfigChangeRejected(f"tablet {req.tablet_id}: a config change is pending")
            peer = _Peer.from_pb(req.peer)
            peer.voter = False
            peer.promote = req.peer.promote or req.peer.member_type == mpb.NON_VOTER
            v.peers.append(peer)
            g.added_round[uuid] = self.rounds
            host = self.servers.get(uuid)
            if host is not None:  # the tablet copy, done at once
                host.replicas[req.tablet_id] = _Replica(uuid, g, v.copy(), version=self._bump())
        elif kind == tpb.ChangeConfigRequestPB.REMOVE_PEER:
            if v.peer(uuid) is None:
                raise ConfigChangeRejected(f"{uuid} is not a peer of {req.tablet_id}")
            if uuid == v.leader:
                raise ConfigChangeRejected(f"{uuid} leads {req.tablet_id}: step down first")
            v.peers = [p for p in v.peers if p.uuid != uuid]
        elif kind == tpb.ChangeConfigRequestPB.PROMOTE_PEER:
            p = v.peer(uuid)
            if p is None or p.voter:
                raise ConfigChangeRejected(f"{uuid} is not a non-voter of {req.tablet_id}")
            p.voter, p.promote = True, False
        else:
            raise InvalidArgument(f"type: unknown change {kind}")
        v.opid_index += 1
        g.version = self._bump()
        g.epoch = -1
        self._refresh(g)
        leader_server = self.servers[req.dest_uuid]
        return self._report(leader_server, leader_server.replicas[req.tablet_id]).consensus_state


class _AdminServicer(tserver_pb2_grpc.TabletServerAdminServiceServicer):
    """The admin RPCs a master sends; the others answer UNIMPLEMENTED (the base class)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    @rpc_errors
    async def CreateTablet(
        self, request: tpb.CreateTabletRequestPB, context: Ctx
    ) -> tpb.CreateTabletResponsePB:
        self.sim.create_tablet(request)
        return tpb.CreateTabletResponsePB()

    @rpc_errors
    async def DeleteTablet(
        self, request: tpb.DeleteTabletRequestPB, context: Ctx
    ) -> tpb.DeleteTabletResponsePB:
        self.sim.delete_tablet(request)
        return tpb.DeleteTabletResponsePB()

    @rpc_errors
    async def AlterSchema(
        self, request: tpb.AlterSchemaRequestPB, context: Ctx
    ) -> tpb.AlterSchemaResponsePB:
        return tpb.AlterSchemaResponsePB(schema_version=self.sim.alter_schema(request))

    @rpc_errors
    async def ChangeConfig(
        self, request: tpb.ChangeConfigRequestPB, context: Ctx
    ) -> tpb.ChangeConfigResponsePB:
        return tpb.ChangeConfigResponsePB(consensus_state=self.sim.change_config(request))

    @rpc_errors
    async def GetConsensusState(
        self, request: tpb.GetConsensusStateRequestPB, context: Ctx
    ) -> tpb.GetConsensusStateResponsePB:
        return self.sim.consensus_states(request)


class SimulatorThread:
    """A `Simulator` on its own event loop in a daemon thread (for synchronous tests).
    `call(fn)` runs `fn(sim)` on that loop and returns its result."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.sim: Simulator | None = None

    def __enter__(self) -> SimulatorThread:
        self._thread.start()

        async def start() -> Simulator:
            sim = Simulator(*self._args, **self._kwargs)
            await sim.start()
            return sim

        self.sim = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        return self

    def call(self, fn: Any) -> Any:
        async def run() -> Any:
            return fn(self.sim)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def __exit__(self, *exc: object) -> None:
        if self.sim is not None:
            asyncio.run_coroutine_threadsafe(self.sim.aclose(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def uuids_for(uuid: str, count: int) -> list[str]:
    """`uuid` alone, or `uuid-0001` ... `uuid-<count>` for a fleet."""
    return [uuid] if count == 1 else [f"{uuid}-{i:04d}" for i in range(1, count + 1)]


async def _serve(args: argparse.Namespace) -> int:
    # Imported here: the statistics module imports this one.
    from service.testing.ts_simulator_stats import dump_stats, write_stats_every_second

    sim = Simulator(
        [m.strip() for m in args.masters.split(",") if m.strip()],
        uuids_for(args.uuid, args.count),
        args.bind,
        args.heartbeat_interval_ms / 1000.0,
        stagger=args.stagger,
        pki=None if args.pki is None else ClusterPki(Path(args.pki)),
    )
    await sim.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.port_file is not None:
        path = Path(args.port_file)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"address": sim.address, "pid": os.getpid(), "uuids": list(sim.servers)})
        )
        tmp.replace(path)
    stats_task = None
    if args.stats_file is not None:
        stats_task = asyncio.create_task(write_stats_every_second(sim, Path(args.stats_file)))
    await stop.wait()
    if stats_task is not None:
        stats_task.cancel()
    await sim.aclose()
    if args.stats_file is not None:
        dump_stats(sim, Path(args.stats_file))
    return 0


def _answered(link: _MasterLink, _: asyncio.Task[None]) -> None:
    link.in_flight = False


def main(argv: Iterable[str] | None = None) -> int:

    p = argparse.ArgumentParser(prog="python -m service.testing.ts_simulator")
    p.add_argument("--masters", required=True, help="comma-separated master host:port list")
    p.add_argument("--uuid", required=True, help="server uuid (prefix with --count > 1)")
    p.add_argument("--count", type=int, default=1, help="simulated servers in this process")
    p.add_argument("--bind", default="127.0.0.1:0", help="admin RPC address (port 0: free)")
    p.add_argument("--port-file", help="write {address, pid, uuids} here once serving")
    p.add_argument("--stats-file", help="write heartbeat statistics here every second")
    p.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    p.add_argument(
        "--stagger",
        action="store_true",
        help="spread each round's heartbeats over the interval, as independent servers do",
    )
    p.add_argument(
        "--pki",
        metavar="DIR",
        help="mutual TLS: each server's certificate issued from the ClusterPki CA in DIR",
    )
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.count < 1:
        p.error("--count must be >= 1")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
