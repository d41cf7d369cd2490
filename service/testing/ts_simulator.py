"""A tablet-server simulator: N simulated servers in one process, for master tests and benchmarks.

    python -m service.testing.ts_simulator --masters H:P,H:P,H:P --uuid ts-1 \\
        --bind 127.0.0.1:0 --port-file F [--count N] [--heartbeat-interval-ms 1000] [--shards K]

It is NOT a tablet server: replicas hold no data and "consensus" is a rule, not Raft. It never
replaces the real tablet server (service/tserver) in end-to-end tests. What it does speak is
the master's side of the contract exactly:

* Heartbeats (master.proto TSHeartbeat) from every simulated server to EVERY master each
  interval: registration when a master asks for it (`needs_reregister`), a full tablet report to
  the leader when it asks for one (`needs_full_tablet_report`, after its election or a
  registration), incremental reports otherwise. Reports are edge-triggered per replica: a change
  marks only the replicas it touches dirty on their server's links, an incremental report
  carries exactly those (and removed ones), and an idle server's heartbeat is its instance and
  two counters kept at each change, with no walk over its replicas. Reports go to the master
  that last said it leads; followers get liveness-only heartbeats. A link whose heartbeats fail
  backs off as a real server's does (`FleetSimulator._back_off`); a failed heartbeat to the
  leader, or an admin call fenced with a newer master term, has every other master heartbeated
  at once, as the real heartbeater wakes its loops (`FleetSimulator._wake_links`).
* TabletServerAdminService (tserver.proto) on ONE port for all simulated servers: every
  request is routed by its `dest_uuid` (an unknown uuid is refused with WrongDestination, a
  stopped server answers UNAVAILABLE), and refused with StaleTerm if its fence term is lower
  than the highest master term that server has seen (from leader heartbeat answers and fences).
  CreateTablet (idempotent), DeleteTablet (DELETED drops the replica, TOMBSTONED keeps it
  tombstoned; compare-and-set on the replica's committed config op index), AlterSchema (leader
  only), ChangeConfig (leader only, compare-and-set, one pending NON_VOTER at a time; an added
  peer hosted here gets its replica at once, as a finished tablet copy, and a NON_VOTER with
  `promote` becomes a VOTER one heartbeat round later, as "caught up").

The consensus rule is Raft's majority rule, without timers (`elect`, `commits`): a tablet's
group has a leader, and its replicas report one, only while more than half of its committed
config's voters have a live replica: created by CreateTablet or a tablet copy (a replica the
master asked for that never got created is never counted), not tombstoned, on a server that is
up. The leader keeps its place while it is live; otherwise the first live voter of the config
leads with the next term (the first leader has term 1). A config change commits only when a
majority of the new config's voters is live. A member of a led group's committed config with no
live replica (its CreateTablet never arrived, or its replica was lost) gets one copied by the
leader after `COPY_AFTER_ROUNDS` rounds and every `COPY_RETRY_ROUNDS` after that while its
server is down, as a real leader starts a tablet copy for a follower that answers that it does
not host the tablet; a live replica is left alone. A replica removed from the config, or whose
server is stopped, keeps the view it had (its old config and term), so when its server comes back it
reports a stale config, as an evicted replica would; a restarted server's replicas know no
leader until their group tells them.

Shards. Each tablet's group is decided by ONE owner (`_Group`: the committed view and which
servers hold a live replica) and each replica lives on its server's host (`_Replica`: the view
it reports); they talk in small messages (a replica is live or not; here is the committed view;
copy this replica) and owner calls (AlterSchema, ChangeConfig). In one process both sides are
this `FleetSimulator` and a message is a function call. With `--shards K` the fleet runs as K
processes, each with its own event loop, admin port and a slice of the servers; a tablet's
owner is a hash of its id, and the messages travel over Unix sockets in an owner-only directory
(service/testing/ts_simulator_shards.py), so the rule is the same whichever shard hosts which
peer.

Security: with `pki` (`--pki DIR`, a `ClusterPki` directory holding the masters' CA) the
simulator speaks to secured masters as a fleet of real tablet servers would: each simulated
server heartbeats over its own mutual-TLS connection to each master with its own `tserver`
certificate, issued from that CA on start (a master accepts a heartbeat only from the server
it names), and the admin port serves TLS with one `tserver` certificate and requires the
callers' certificates from the CA (it does not authorize further: it is a simulator). Without
it, plaintext, the fleet's heartbeats sharing HEARTBEAT_CHANNELS connections per master.

Use `FleetSimulator` in-process (tests own its event loop, or `SimulatorThread` runs one in a
thread), or the command line, which serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import re
import signal
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio

from service.common import channel_options
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
from service.common.loop_lag import LoopLagMonitor
from service.common.metrics import MetricsRegistry
from service.common.pki import ClusterPki
from service.common.tls import Credentials, add_port, open_channel
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.ts_simulator_shards import SocketBus, run_fleet, shard_uuids, uuids_for
from service.testing.ts_simulator_stats import RECENT_S, dump_stats, write_stats_every_second
from service.tserver.heartbeater import HeartbeatStream, failure_backoff, next_report_gap

__all__ = ["FleetSimulator", "SimulatorThread", "main"]

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext


TRACE_ENV = "TESSERA_SIM_TRACE_TABLES"
"""A regular expression: the replicas of tables whose name matches it are traced, one WARNING
line per step (`trace ...`: created, each view it is given, each report that carries it and
that report's answer), with wall-clock times so the shards' and the masters' logs line up. For
finding where a slow create's time goes; unset (the default), nothing is traced."""

GC_FREEZE_EVERY_S = 10.0
"""A simulator process (the command line) moves the objects alive into the collector's
permanent generation this often (`gc.freeze`, `_freeze_heap`).

Why. The fleet's state is millions of long-lived objects (600,000 replicas at 200,000
tablets, each with its view and peers), and each full collection walked all of them on the
event loop: with the scale bench at 60,000 tablets a shard's loop stalled 1-3 s every few tens
of seconds, so CreateTablet calls waited that long to be answered and a new table's replicas
were created seconds apart. Frozen objects are still freed when their last reference goes;
only cyclic garbage alive at a freeze is kept, and a simulator makes little of it. The master
does the same with its catalog (service/master/master.py)."""

HEARTBEAT_CHANNELS = 16
"""Connections to each master the fleet's heartbeat streams are spread over (a real fleet has
one per server)."""


class ShardBus(Protocol):
    """How a shard reaches the others (service/testing/ts_simulator_shards.py); a simulator
    without one is the whole fleet and every message stays in the process."""

    index: int

    def owner_of(self, tablet_id: str) -> int: ...

    def host_of(self, uuid: str) -> int | None: ...

    def send(self, shard: int, msg: dict[str, Any]) -> None: ...

    async def call(self, shard: int, msg: dict[str, Any]) -> dict[str, Any]: ...


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
        return _View.decode(self.encode())

    def peer(self, uuid: str) -> _Peer | None:
        return next((p for p in self.peers if p.uuid == uuid), None)

    def voters(self) -> list[str]:
        return [p.uuid for p in self.peers if p.voter]

    def encode(self) -> dict[str, Any]:
        """Plain data, as it travels between shards."""
        return {
            "o": self.opid_index,
            "p": [[p.uuid, p.voter, p.host, p.port, p.promote] for p in self.peers],
            "t": self.term,
            "l": self.leader,
            "s": self.schema_version,
        }

    @classmethod
    def decode(cls, d: dict[str, Any]) -> _View:
        return cls(d["o"], [_Peer(*p) for p in d["p"]], d["t"], d["l"], d["s"])

    def consensus_state(self) -> mpb.ConsensusStatePB:
        out = mpb.ConsensusStatePB(current_term=self.term)
        # A leader is named only while it is a voter of the config reported with it.
        leader_ok = any(p.uuid == self.leader and p.voter for p in self.peers)
        out.leader_uuid = self.leader if leader_ok else ""
        out.committed_config.opid_index = self.opid_index
        out.committed_config.peers.extend(p.to_pb() for p in self.peers)
        return out


def elect(view: _View, live: set[str] | frozenset[str]) -> bool:
    """The majority rule, applied to `view` in place: the group has a leader only while more
    than half of its voters have a live replica (hosted, not tombstoned, on a server that is
    up); the leader stays while it is live, else the first live voter of the config takes over
    with the next term (deterministic: no timers, no votes to lose). Without a majority there
    is no leader and the term stands, as in Raft a candidate that cannot win (the Raft paper,
    section 5.2). Returns whether the leader changed."""
    voters = view.voters()
    eligible = [u for u in voters if u in live]
    leader = ""
    if 2 * len(eligible) > len(voters):
        leader = view.leader if view.leader in eligible else eligible[0]
    if leader == view.leader:
        return False
    view.leader = leader
    if leader:
        view.term += 1
    return True


def commits(view: _View, live: set[str] | frozenset[str]) -> bool:
    """Whether a config change to `view` (the new config) can commit: a majority of ITS voters
    have live replicas (a single-server change commits on the new config's majority, the Raft
    thesis, section 4.1)."""
    voters = view.voters()
    return 2 * sum(1 for u in voters if u in live) > len(voters)


@dataclass
class _Group:
    """One tablet's Raft group, kept by the shard that owns the tablet (the only shard when
    the fleet runs in one process): the committed view and which servers host a live replica.
    Every change of either is decided here and sent to the replicas (`_publish`)."""

    tablet_id: str
    table_id: str
    view: _View
    live: set[str] = field(default_factory=set)
    """Servers (of any shard) hosting a replica that is not tombstoned, while they are up."""
    hosted: set[str] = field(default_factory=set)
    """Servers holding any replica (down, tombstoned or live): the group is forgotten once
    none does."""
    added_round: dict[str, int] = field(default_factory=dict)


@dataclass
class _TabletRef:
    tablet_id: str
    table_id: str


@dataclass
class _Replica:
    server: str
    group: _TabletRef
    """The tablet this replica belongs to (its group's state lives with the owning shard)."""
    view: _View
    tombstoned: bool = False

    @property
    def tablet_id(self) -> str:
        return self.group.tablet_id


@dataclass
class _MasterLink:
    address: str
    registered: bool = False
    leader: bool = False
    need_full: bool = True
    """The next report to this master is a full one (until the leader says its turn has not
    come: `full_tablet_report_deferred`)."""
    seq: int = 0
    in_flight: bool = False
    """A heartbeat on this link has not been answered yet (stagger mode sends no other)."""
    asked_interval_s: float = 0.0
    """The pace this link's master last asked for (a follower's is slower; 0: the fleet's)."""
    next_due: float = 0.0
    """Monotonic time before which a slow-paced follower link, or one backing off after
    failures, is not heartbeated."""
    failures: int = 0
    """Heartbeats on this link that failed in a row (reset by an answer)."""
    report_gap: float = 0.0
    """The least time between reports on this link out of its pace (`next_report_gap`)."""
    report_due: float = 0.0
    """Monotonic time before which changes wait for the link's pace (`report_gap`)."""


@dataclass
class _Server:
    uuid: str
    seqno: int
    up: bool = True
    highest_term: int = 0
    replicas: dict[str, _Replica] = field(default_factory=dict)
    links: dict[str, _MasterLink] = field(default_factory=dict)
    live_tablets: int = 0
    """Replicas not tombstoned, kept up to date at each change (never recounted)."""
    leaders: int = 0
    """Replicas whose view names this server leader, likewise."""
    dirty: set[str] = field(default_factory=set)
    """Tablets whose reported state changed (or that were removed) since the last report a
    leader acknowledged: the next incremental report, to whichever master leads, carries
    exactly these (an acknowledged report is committed, so every later leader knows it)."""
    acked_term: int = 0
    """The term of the leader that acknowledged last; a deposed leader's older term's
    acknowledgement is not taken."""
    full_report: bytes | None = None
    """Every replica's entry of a full report, serialized (a TabletReportPB holding only
    `updated_tablets`), or None after any change of this server's replicas (`_mark`).

    Why. A server sends its full report with every heartbeat until the leader acknowledges
    one, and a new leader reads them a few at a time; at 200,000 tablets each server has 600
    replicas, and building 600 entries took about 12 ms, 500 times a second in a shard of 500
    servers: the shard's loop fell so far behind that a new leader's CreateTablet calls timed
    out. A real server builds its own report on its own CPU."""


PROMPT_GAP_S = 0.05
COPY_AFTER_ROUNDS = 3
"""Rounds a led group's member goes without a live replica before its leader copies one to it
(module docstring); a replica whose CreateTablet is merely late usually arrives before."""
COPY_RETRY_ROUNDS = 5
"""Rounds between two copies to a member still without a live replica (its server down)."""
"""How soon a link heartbeats again, out of its round, when its master just turned leader or
gave it its turn for a full report (the tablet server's `MIN_GAP_S`).

Where this differs from a real server: a real one also heartbeats the leader this soon after
one of its replicas changed; here the change waits for the server's next round (up to an
interval). Simulated servers that did as the real ones made more heartbeats than the masters
could take while a 10,000-tablet table was created on 1,000 servers (tables took up to 64.7-80.1
s instead of 35-59 s), so the scale bench measures with the round only. Like a real one, a
server whose reports the leader leaves unacknowledged waits longer before its changes go
(`next_report_gap`, the link's `report_due`)."""


class FleetSimulator:
    """N simulated tablet servers sharing one admin port (module docstring)."""

    def __init__(
        self,
        masters: Sequence[str],
        uuids: Sequence[str],
        bind: str = "127.0.0.1:0",
        heartbeat_interval_s: float = 1.0,
        rpc_timeout_s: float = 5.0,
        max_failures_before_backoff: int = 3,
        location: str = "",
        stagger: bool = False,
        pki: ClusterPki | None = None,
        bus: ShardBus | None = None,
    ) -> None:
        if not masters:
            raise InvalidArgument("masters: give at least one master address")
        if not uuids or len(set(uuids)) != len(uuids):
            raise InvalidArgument("uuids: give distinct server uuids")
        self.masters = list(masters)
        self.bind = bind
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.max_failures = max_failures_before_backoff
        """After this many failed heartbeats in a row a link backs off (`_back_off`)."""
        self.location = location
        self.stagger = stagger
        """Spread each round's heartbeats evenly over the interval, as independent servers
        send them, instead of sending all at once (a burst no real fleet produces)."""
        self.pki = pki
        """Mutual TLS, each server as itself (module docstring); None: plaintext."""
        self.bus = bus
        """The other shards of the fleet (module docstring); None: this process is the fleet."""
        self._credentials: dict[str, Credentials] = {}
        seqno = time.time_ns() // 1000
        self.servers = {u: _Server(u, seqno) for u in uuids}
        for s in self.servers.values():
            s.links = {m: _MasterLink(m) for m in self.masters}
        self.groups: dict[str, _Group] = {}
        """The groups of the tablets this shard owns (every tablet, without a bus)."""
        self._promoting: set[str] = set()
        """Owned tablets with a NON_VOTER waiting to be promoted (checked each round)."""
        self._incomplete: dict[str, int] = {}
        """Owned led tablets whose config names a member without a live replica -> the round
        from which the leader's next copy is counted (`_copy_missing`)."""
        self.copies_triggered = 0
        """Replicas the leaders copied to members missing theirs (`_copy_missing`)."""
        self.address = ""
        self.rounds = 0
        self.hold_creates = False
        """Tests: refuse CreateTablet (UNAVAILABLE) while set, to keep creates pending."""
        self.send_reports = True
        """Tests: while False, heartbeats carry no tablet report at all (liveness only), so a
        master knows replicas only from its catalog (the KUDU-1353 scenario)."""
        self.full_reports: Counter[tuple[str, str]] = Counter()
        """(server uuid, master address) -> full tablet reports that master acknowledged."""
        self.reported: Counter[str] = Counter()
        """"full"/"incremental" -> tablet entries sent in reports (edge-triggered: an idle
        fleet adds none)."""
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
        self._lag: LoopLagMonitor | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._streams: dict[tuple[str, str], HeartbeatStream] = {}
        pattern = os.environ.get(TRACE_ENV, "")
        self._trace_tables = re.compile(pattern) if pattern else None
        self._traced: set[str] = set()
        """Tablets whose replicas are traced here (`TRACE_ENV`)."""

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # SO_REUSEPORT off: one server per port (see RpcSettings.server_options).
        server = grpc.aio.server(options=channel_options.server())
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
                options = channel_options.own_connection(channel_options.heartbeat())
                ch = grpc.aio.insecure_channel(m, options=options)
                self._channels[f"{m}#{i}"] = ch
                self._stubs[f"{m}#{i}"] = master_pb2_grpc.MasterServiceStub(ch)
        self._loop_task = asyncio.create_task(self._heartbeat_loop(), name="ts-sim-heartbeats")
        if self._trace_tables is not None:
            # With `TRACE_ENV` set: a line `trace-lag` whenever this process's event loop
            # wakes more than 0.2 s late (every admin call and heartbeat of its servers waits
            # that much longer).
            self._lag = LoopLagMonitor(MetricsRegistry(), stall_s=0.2, report_stalls=False)
            self._lag.listeners.append(_trace_lag)
            self._lag.start()

    async def aclose(self) -> None:
        if self._lag is not None:
            await self._lag.aclose()
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
        """The server goes silent: no heartbeats, its admin RPCs fail UNAVAILABLE. Its replicas
        keep the view they had; their groups lose them (and their leader, without a majority)."""
        s = self.servers[uuid]
        if not s.up:
            return
        s.up = False
        for r in s.replicas.values():
            if not r.tombstoned:
                self._presence(s, r, live=False)

    def start_server(self, uuid: str) -> None:
        """The server comes back as a new process (higher seqno): it registers again, sends
        full reports, and its replicas start as followers that know no leader until their group
        tells them (a restarted Raft replica knows its term, not who leads)."""
        s = self.servers[uuid]
        if s.up:
            return
        s.up = True
        s.seqno += 1
        for link in s.links.values():
            link.registered = False
            link.need_full = True
        for r in s.replicas.values():
            if not r.tombstoned:
                if r.view.leader:
                    view = r.view.copy()
                    view.leader = ""
                    self._set_view(s, r, view)
                self._presence(s, r, live=True)

    def tablet_counts(self) -> tuple[int, int]:
        """(replicas hosted, leader replicas on servers that are up) across this process's
        servers, from the per-server counts kept at each change (cheap: no replica scan)."""
        replicas = sum(len(s.replicas) for s in self.servers.values())
        leaders = sum(s.leaders for s in self.servers.values() if s.up)
        return replicas, leaders

    def replicas_of(self, uuid: str) -> dict[str, _Replica]:
        return self.servers[uuid].replicas

    def leader_of(self, tablet_id: str) -> str:
        """The leader of an owned tablet's group ("" while it has no majority)."""
        return self.groups[tablet_id].view.leader

    # --- host side: replicas and the edge-triggered reports ----------------------------------

    def _mark(self, s: _Server, tablet_id: str) -> None:
        """Edge trigger: the tablet's reported state changed on this server; the next
        incremental report carries it (and only the tablets so marked)."""
        s.dirty.add(tablet_id)
        s.full_report = None

    def _trace(self, s: _Server, tablet_id: str, what: str) -> None:
        log.warning("trace %.3f %s %s %s", time.time(), tablet_id[:8], s.uuid, what)

    def _set_view(self, s: _Server, r: _Replica, view: _View) -> None:
        if r.tablet_id in self._traced:
            link = next((li for li in s.links.values() if li.leader), None)
            due = f"{link.report_due - time.monotonic():.2f}" if link is not None else "-"
            self._trace(
                s,
                r.tablet_id,
                f"view leader={view.leader} term={view.term} report_due_in={due} "
                f"gap={link.report_gap if link is not None else '-'}",
            )
        was = not r.tombstoned and r.view.leader == s.uuid
        r.view = view
        s.leaders += (not r.tombstoned and view.leader == s.uuid) - was
        self._mark(s, r.tablet_id)

    def _set_tombstoned(self, s: _Server, r: _Replica) -> None:
        if r.tombstoned:
            return
        s.leaders -= r.view.leader == s.uuid
        s.live_tablets -= 1
        r.tombstoned = True
        self._mark(s, r.tablet_id)

    def _add_replica(self, s: _Server, ref: _TabletRef, view: _View) -> _Replica:
        old = s.replicas.get(ref.tablet_id)
        if old is not None:
            self._drop(s, old)
        r = _Replica(s.uuid, ref, view)
        s.replicas[ref.tablet_id] = r
        s.live_tablets += 1
        s.leaders += view.leader == s.uuid
        self._mark(s, ref.tablet_id)
        return r

    def _drop(self, s: _Server, r: _Replica) -> None:
        if not r.tombstoned:
            s.live_tablets -= 1
            s.leaders -= r.view.leader == s.uuid
        del s.replicas[r.tablet_id]
        self._mark(s, r.tablet_id)

    def _presence(
        self, s: _Server, r: _Replica, *, live: bool, gone: bool = False, first: bool = False
    ) -> None:
        """Tell the tablet's owner that this server's replica is live or not (and, `first`,
        the config it was created with, should the owner not know the group yet)."""
        msg: dict[str, Any] = {
            "k": "presence",
            "tablet": r.tablet_id,
            "table": r.group.table_id,
            "server": s.uuid,
            "live": live and s.up and not r.tombstoned,
            "gone": gone,
        }
        if first:
            msg["view"] = r.view.encode()
        self._post(self._owner(r.tablet_id), msg)

    def _on_view(self, m: dict[str, Any]) -> None:
        """The owner's committed view for a replica hosted here (as a follower learns the
        config, term and leader from its leader)."""
        s = self.servers.get(m["server"])
        r = s.replicas.get(m["tablet"]) if s is not None else None
        if s is None or r is None or r.tombstoned or not s.up:
            return  # a stopped server's or a tombstone's replica keeps the view it had
        self._set_view(s, r, _View.decode(m["view"]))

    def _on_copy(self, m: dict[str, Any]) -> None:
        """An added peer hosted here gets its replica at once, as a finished tablet copy."""
        s = self.servers.get(m["server"])
        if s is None or not s.up:
            return  # a down server copies nothing: the owner never counts it
        if m.get("trigger"):
            have = s.replicas.get(m["tablet"])
            if have is not None and not have.tombstoned:
                return  # created meanwhile (or its presence is on its way): keep it
        r = self._add_replica(s, _TabletRef(m["tablet"], m["table"]), _View.decode(m["view"]))
        self._presence(s, r, live=True, first=True)

    # --- owner side: the majority rule -------------------------------------------------------

    def _on_presence(self, m: dict[str, Any]) -> None:
        tid, server = m["tablet"], m["server"]
        g = self.groups.get(tid)
        if g is None:
            if "view" not in m:
                return  # a replica of a group already forgotten: nothing to decide
            view = _View.decode(m["view"])
            view.term, view.leader = 0, ""
            g = self.groups[tid] = _Group(tid, m["table"], view)
        if m["live"]:
            g.live.add(server)
            g.hosted.add(server)
        else:
            g.live.discard(server)
            if m["gone"]:
                g.hosted.discard(server)
            else:
                g.hosted.add(server)
        if not g.hosted:
            del self.groups[tid]
            self._promoting.discard(tid)
            self._incomplete.pop(tid, None)
            return
        if elect(g.view, g.live):
            self._publish(g)
        elif m["live"]:
            self._publish(g, only=server)
        self._track(g)

    def _track(self, g: _Group) -> None:
        """Note whether a led group's config names a member without a live replica."""
        if g.view.leader and any(p.uuid not in g.live for p in g.view.peers):
            self._incomplete.setdefault(g.tablet_id, self.rounds)
        else:
            self._incomplete.pop(g.tablet_id, None)

    def _copy_missing(self) -> None:
        """Each round: the leader of a group missing a member's replica for `COPY_AFTER_ROUNDS`
        copies one to it, again every `COPY_RETRY_ROUNDS` while it is still missing."""
        for tid, since in list(self._incomplete.items()):
            g = self.groups.get(tid)
            if g is None:
                del self._incomplete[tid]
                continue
            self._track(g)
            if tid not in self._incomplete or self.rounds - since < COPY_AFTER_ROUNDS:
                continue
            # The next retry is set first: in one process a copy's presence comes back inside
            # `_post` and, completing the group, drops it from `_incomplete`.
            self._incomplete[tid] = self.rounds - COPY_AFTER_ROUNDS + COPY_RETRY_ROUNDS
            encoded = g.view.encode()
            for p in [p for p in g.view.peers if p.uuid not in g.live]:
                host = self._host(p.uuid)
                if host is not None:
                    msg = {"k": "copy", "tablet": tid, "table": g.table_id, "server": p.uuid}
                    self._post(host, {**msg, "view": encoded, "trigger": True})
                    self.copies_triggered += 1

    def _publish(self, g: _Group, only: str | None = None) -> None:
        """Send the committed view to the live replicas of the config's peers (a replica
        removed from the config is no longer told anything: it keeps its old view)."""
        encoded = g.view.encode()
        for p in g.view.peers:
            if p.uuid in g.live and (only is None or p.uuid == only):
                host = self._host(p.uuid)
                if host is not None:
                    self._post(
                        host,
                        {"k": "view", "tablet": g.tablet_id, "server": p.uuid, "view": encoded},
                    )

    def _owned_leader(self, tablet_id: str, dest: str) -> _Group:
        g = self.groups.get(tablet_id)
        if g is None:
            raise NotFound(f"tablet {tablet_id} is not hosted on {dest}")
        if g.view.leader != dest:
            raise NotTheLeader(
                f"{dest} is not the leader of tablet {tablet_id}",
                leader_uuid=g.view.leader or None,
            )
        return g

    def _on_alter(self, m: dict[str, Any]) -> dict[str, Any]:
        g = self._owned_leader(m["tablet"], m["dest"])
        if m["version"] > g.view.schema_version:
            g.view.schema_version = m["version"]
            self._publish(g)
        return {"version": g.view.schema_version}

    def _on_change(self, m: dict[str, Any]) -> dict[str, Any]:
        req = tpb.ChangeConfigRequestPB.FromString(bytes.fromhex(m["req"]))
        g = self._owned_leader(req.tablet_id, req.dest_uuid)
        if req.HasField("cas_config_opid_index") and req.cas_config_opid_index != g.view.opid_index:
            raise CasMismatch(
                f"tablet {req.tablet_id}: committed config op id is {g.view.opid_index}, not "
                f"{req.cas_config_opid_index}"
            )
        v = g.view.copy()
        uuid = req.peer.permanent_uuid
        kind = req.type
        copy_to: _Peer | None = None
        if kind == tpb.ChangeConfigRequestPB.ADD_PEER:
            if v.peer(uuid) is not None:
                raise ConfigChangeRejected(f"{uuid} is already a peer of {req.tablet_id}")
            if any(p.promote and not p.voter for p in v.peers):
                raise ConfigChangeRejected(f"tablet {req.tablet_id}: a config change is pending")
            copy_to = _Peer.from_pb(req.peer)
            copy_to.voter = False
            copy_to.promote = req.peer.promote or req.peer.member_type == mpb.NON_VOTER
            v.peers.append(copy_to)
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
        if not commits(v, g.live):
            raise ServiceUnavailable(
                f"tablet {req.tablet_id}: the change cannot commit, fewer than a majority of "
                f"the new config's voters {v.voters()} have a live replica"
            )
        v.opid_index += 1
        g.view = v
        if copy_to is not None:
            g.added_round[uuid] = self.rounds
            self._promoting.add(g.tablet_id)
            host = self._host(uuid)
            if host is not None:  # the tablet copy, done at once
                msg = {"k": "copy", "tablet": g.tablet_id, "table": g.table_id, "server": uuid}
                self._post(host, {**msg, "view": v.encode()})
        elect(g.view, g.live)
        self._publish(g)
        self._track(g)
        return {"view": g.view.encode()}

    def _promote_caught_up(self) -> None:
        """ "Catch-up": a NON_VOTER to promote becomes a VOTER one round after it was added,
        once its replica is live and the new config commits."""
        for tid in list(self._promoting):
            g = self.groups.get(tid)
            if g is None:
                self._promoting.discard(tid)
                continue
            changed = False
            for p in g.view.peers:
                added = g.added_round.get(p.uuid)
                if not (p.promote and not p.voter and added is not None):
                    g.added_round.pop(p.uuid, None)
                    continue
                if self.rounds <= added or p.uuid not in g.live:
                    continue
                p.voter, p.promote = True, False
                if not commits(g.view, g.live):
                    p.voter, p.promote = False, True
                    continue
                g.view.opid_index += 1
                g.added_round.pop(p.uuid, None)
                changed = True
            if changed:
                elect(g.view, g.live)
                self._publish(g)
                self._track(g)
            if not g.added_round:
                self._promoting.discard(tid)

    # --- routing between host and owner ------------------------------------------------------

    def _owner(self, tablet_id: str) -> int:
        return 0 if self.bus is None else self.bus.owner_of(tablet_id)

    def _host(self, uuid: str) -> int | None:
        if self.bus is None:
            return 0 if uuid in self.servers else None
        return self.bus.host_of(uuid)

    def _post(self, shard: int, msg: dict[str, Any]) -> None:
        if self.bus is None or shard == self.bus.index:
            self.on_message(msg)
        else:
            self.bus.send(shard, msg)

    def on_message(self, msg: dict[str, Any]) -> None:
        """A one-way message from a shard (this one included)."""
        kind = msg["k"]
        if kind == "presence":
            self._on_presence(msg)
        elif kind == "view":
            self._on_view(msg)
        elif kind == "copy":
            self._on_copy(msg)
        else:
            log.warning("unknown shard message %r", kind)

    def on_call(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A call for the owner of a tablet; raises TesseraError to refuse."""
        if msg["k"] == "alter":
            return self._on_alter(msg)
        if msg["k"] == "change":
            return self._on_change(msg)
        raise InvalidArgument(f"unknown shard call {msg['k']!r}")

    async def _call_owner(self, tablet_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        shard = self._owner(tablet_id)
        if self.bus is None or shard == self.bus.index:
            return self.on_call(msg)
        return await self.bus.call(shard, msg)

    # --- reports -----------------------------------------------------------------------------

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
            tablet_id=r.tablet_id,
            state=mpb.REPLICA_TOMBSTONED if r.tombstoned else mpb.REPLICA_RUNNING,
            role=role,
            schema_version=v.schema_version,
        )
        out.consensus_state.CopyFrom(v.consensus_state())
        return out

    def build_report(
        self, s: _Server, link: _MasterLink, req: mpb.TSHeartbeatRequestPB
    ) -> tuple[bool, set[str]] | None:
        """Fill `req`'s tablet report for `link`'s master: every replica when it asked for a
        full one, else exactly the tablets marked dirty since its last acknowledgement (none
        at all while nothing changed). Returns (full, the dirty set taken), to put back if
        the report is not acknowledged; None when no report goes on this heartbeat."""
        if not (link.registered and link.leader and self.send_reports):
            return None
        full = link.need_full
        taken, s.dirty = s.dirty, set()
        report = req.tablet_report
        report.is_incremental = not full
        link.seq += 1
        report.sequence_number = link.seq
        if full:
            if s.full_report is None:
                entries = [self._report(s, r) for r in s.replicas.values()]
                s.full_report = mpb.TabletReportPB(updated_tablets=entries).SerializeToString()
            report.MergeFromString(s.full_report)
            self.reported["full"] += len(s.replicas)
        else:
            for tid in taken:
                r = s.replicas.get(tid)
                if r is None:
                    report.removed_tablet_ids.append(tid)
                else:
                    report.updated_tablets.append(self._report(s, r))
            self.reported["incremental"] += len(taken)
        return full, taken

    # --- heartbeats --------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.beat_once()
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.heartbeat_interval_s - elapsed))

    def owner_round(self) -> None:
        """The owner's part of a round: promote caught-up NON_VOTERs, copy missing replicas."""
        self.rounds += 1
        self._promote_caught_up()
        self._copy_missing()

    async def beat_once(self) -> None:
        """One round: every live server heartbeats to every master, concurrently (spread over
        the interval with `stagger`)."""
        self.owner_round()
        now = time.monotonic()
        pairs = [
            (s, link)
            for s in self.servers.values()
            if s.up
            for link in s.links.values()
            if now >= link.next_due or (link.leader and s.dirty and now >= link.report_due)
        ]
        if not self.stagger:
            await asyncio.gather(*(self._beat(s, link) for s, link in pairs))
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

    async def _beat(self, s: _Server, link: _MasterLink) -> None:
        """One heartbeat on `link`, marked in flight meanwhile: none if one already is (one at
        a time per stream; the check and the mark run in one step of the loop)."""
        if link.in_flight:
            return
        link.in_flight = True
        try:
            await self._heartbeat(s, link)
        finally:
            link.in_flight = False

    def _wake_links(self, s: _Server, skip: _MasterLink | None = None) -> None:
        """Heartbeat every master of `s` but `skip` now (after `PROMPT_GAP_S`), out of its
        round, as the real heartbeater wakes its loops when the leader's heartbeat fails or an
        admin call shows a newer master term (`Heartbeater.saw_newer_term`): a new leader
        answers as one, and `s`'s changes go to it at once."""
        if not s.up:
            return
        for link in s.links.values():
            if link is not skip and not link.in_flight:
                task = asyncio.create_task(self._prompt(s, link))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)

    async def _prompt(self, s: _Server, link: _MasterLink) -> None:
        await asyncio.sleep(PROMPT_GAP_S)
        if s.up:
            await self._beat(s, link)

    async def _heartbeat(self, s: _Server, link: _MasterLink) -> None:
        # An idle server's heartbeat is its instance, two counters kept at each change and
        # no report: nothing here walks its replicas (edge-triggered, `_mark`).
        req = mpb.TSHeartbeatRequestPB(
            instance=mpb.NodeInstancePB(permanent_uuid=s.uuid, instance_seqno=s.seqno),
            highest_master_term_seen=s.highest_term,
            num_live_tablets=s.live_tablets,
            num_leaders=s.leaders,
        )
        if not link.registered:
            host, _, port = self.address.rpartition(":")
            req.registration.rpc_addresses.add(host=host, port=int(port))
            req.registration.software_version = "ts-simulator"
            req.registration.start_time_us = s.seqno
            if self.location:
                req.registration.location = self.location
        sent = self.build_report(s, link, req)
        traced = []
        if sent is not None and self._traced:
            traced = [t for t in (s.replicas if sent[0] else sent[1]) if t in self._traced]
            for t in traced:
                self._trace(
                    s,
                    t,
                    f"report to={link.address} full={sent[0]} seq={link.seq} "
                    f"entries={len(req.tablet_report.updated_tablets)}",
                )
        t0 = time.perf_counter()
        try:
            resp = await self._stream(s, link).heartbeat(req)
        except Exception as e:  # counted; the fleet's heartbeat loop must go on
            for t in traced:
                self._trace(s, t, f"report seq={link.seq} failed: {type(e).__name__}")
            self.heartbeats_failed += 1
            why = e.code().name if isinstance(e, grpc.aio.AioRpcError) else type(e).__name__
            self.heartbeat_errors[why] += 1
            if sent is not None:
                s.dirty |= sent[1]
            self._back_off(link)
            if link.leader:
                # Late, and lost only after max_failures in a row; every other master is
                # tried at once (the real heartbeater's `_failed`). No backoff applies yet.
                if link.failures >= self.max_failures:
                    link.leader = False
                _reprobe(s)
                self._wake_links(s, skip=link)
            log.debug("heartbeat %s -> %s failed: %s", s.uuid, link.address, why)
            return
        link.failures = 0
        latency = time.perf_counter() - t0
        self.heartbeat_latencies.append(latency)
        now = time.monotonic()
        self.recent_latencies.append((now, latency))
        while self.recent_latencies[0][0] < now - RECENT_S:
            self.recent_latencies.popleft()
        if len(self.heartbeat_latencies) > 200_000:
            del self.heartbeat_latencies[:100_000]
        newest = resp.master_term >= s.highest_term
        was_leader, link.leader = link.leader, resp.leader_master and newest
        if link.leader:
            for other in s.links.values():
                if other is not link:
                    other.leader = False  # a late former leader is one no more
        link.asked_interval_s = resp.heartbeat_interval_ms / 1000.0
        if resp.master_term > s.highest_term or (was_leader and not link.leader):
            _reprobe(s)  # leadership moved: every master now, as the real heartbeater
        if resp.leader_master and resp.master_term > s.highest_term:
            s.highest_term = resp.master_term
        link.next_due = 0.0
        if link.asked_interval_s > self.heartbeat_interval_s and (
            link.leader or any(other.leader for other in s.links.values())
        ):
            # A follower's slower pace, or a busy leader's (service/master/heartbeat_pace.py);
            # changes to report still go to the leader at once, as the real heartbeater's.
            link.next_due = now + link.asked_interval_s - self.heartbeat_interval_s / 2
        if resp.needs_reregister:
            link.registered = False
            if not req.HasField("registration"):
                # A restarted master: registered at once, not at the follower's pace (the
                # real heartbeater's `needs_register`), so its registry is warm should it win
                # an election soon.
                link.next_due = 0.0
            if sent is not None:
                s.dirty |= sent[1]
            return
        link.registered = True
        if sent is not None:
            acked = (
                resp.acked_report_sequence_number == link.seq and resp.master_term >= s.acked_term
            )
            if acked:
                s.acked_term = resp.master_term
                if sent[0]:
                    self.full_reports[(s.uuid, link.address)] += 1
                    link.need_full = False
            else:
                s.dirty |= sent[1]
            if link.leader:
                cap = max(self.heartbeat_interval_s, link.asked_interval_s)
                link.report_gap = next_report_gap(link.report_gap, acked, cap)
                link.report_due = now + link.report_gap - self.heartbeat_interval_s / 2
            for t in traced:
                self._trace(
                    s,
                    t,
                    f"answer seq={link.seq} acked={acked} leader={link.leader} "
                    f"latency={latency:.3f} full_asked={resp.needs_full_tablet_report} "
                    f"deferred={resp.full_tablet_report_deferred} "
                    f"interval={link.asked_interval_s} gap={link.report_gap:.2f}",
                )
        if not link.leader:
            link.report_gap = link.report_due = 0.0
        prompt = link.leader and not was_leader
        if resp.needs_full_tablet_report:
            prompt = prompt or not link.need_full
            link.need_full = True
        elif resp.full_tablet_report_deferred:
            link.need_full = False
        if prompt and s.up:
            # A new leader, or our turn for a full report: heartbeat again now, not next round
            # (service/tserver/heartbeater.py does the same).
            task = asyncio.create_task(self._prompt(s, link))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    def _back_off(self, link: _MasterLink) -> None:
        """One more failed heartbeat on `link`: past `max_failures` in a row, its next one
        waits 2, 4, 8, then 10 intervals, by the real heartbeater's rule (`failure_backoff`);
        a change of leadership (`_reprobe`) still tries it at once.

        Why. A fleet that retries a master it cannot reach at the full pace keeps the load
        that made its heartbeats fail: with a busy loop beside the scale bench, the simulated
        fleet spent its share of the CPU on heartbeats that timed out (234,967 in 420 s) and
        answered none of the leader's CreateTablet calls in time."""
        link.failures += 1
        backoff = failure_backoff(self.heartbeat_interval_s, link.failures, self.max_failures)
        if backoff is not None:
            # A link is heartbeated in the first round at or after next_due (rounds come
            # every interval), hence half an interval early, as for a follower's pace.
            link.next_due = time.monotonic() + backoff - self.heartbeat_interval_s / 2

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
            options = channel_options.own_connection(channel_options.heartbeat())
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
            if fence.master_term > s.highest_term:
                # A newer leader's call before any heartbeat answer from it: find it now
                # (`_wake_links`; the real server does so once the call succeeded).
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    pass  # no loop: a test calling directly
                else:
                    _reprobe(s)
                    self._wake_links(s)
            s.highest_term = fence.master_term
        return s

    def create_tablet(self, req: tpb.CreateTabletRequestPB) -> None:
        """The replica exists from here on (and only from here on: a replica the master asked
        for and that was never created is never counted by its group)."""
        s = self._target(req.dest_uuid, req.fence if req.HasField("fence") else None)
        if self.hold_creates:
            raise ServiceUnavailable(f"{s.uuid}: CreateTablet held by the test")
        existing = s.replicas.get(req.tablet_id)
        if existing is not None and not existing.tombstoned:
            if existing.group.table_id != req.table_id:
                raise InvalidArgument(f"tablet {req.tablet_id} exists for another table")
            return
        view = _View(
            req.config.opid_index,
            [_Peer.from_pb(p) for p in req.config.peers],
            schema_version=req.schema.version,
        )
        if self._trace_tables is not None and self._trace_tables.search(req.table_name):
            self._traced.add(req.tablet_id)
            self._trace(s, req.tablet_id, f"created table={req.table_name}")
        r = self._add_replica(s, _TabletRef(req.tablet_id, req.table_id), view)
        self._presence(s, r, live=True, first=True)

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
            self._set_tombstoned(s, r)
            self._presence(s, r, live=False)
        else:
            self._drop(s, r)
            self._presence(s, r, live=False, gone=True)

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

    def _live_replica(self, dest_uuid: str, fence: tpb.MasterFencePB, tablet_id: str) -> _Server:
        s = self._target(dest_uuid, fence)
        r = s.replicas.get(tablet_id)
        if r is None or r.tombstoned:
            raise NotFound(f"tablet {tablet_id} is not hosted on {s.uuid}")
        return s

    async def alter_schema(self, req: tpb.AlterSchemaRequestPB) -> int:
        self._live_replica(req.dest_uuid, req.fence, req.tablet_id)
        msg = {"k": "alter", "tablet": req.tablet_id, "dest": req.dest_uuid}
        r = await self._call_owner(req.tablet_id, {**msg, "version": req.schema.version})
        return int(r["version"])

    async def change_config(self, req: tpb.ChangeConfigRequestPB) -> mpb.ConsensusStatePB:
        """Decided by the group's owner (leader only, compare-and-set, committed only with a
        majority of the new config's voters live: `commits`)."""
        self._live_replica(req.dest_uuid, req.fence, req.tablet_id)
        msg = {"k": "change", "req": req.SerializeToString().hex()}
        r = await self._call_owner(req.tablet_id, msg)
        return _View.decode(r["view"]).consensus_state()


class _AdminServicer(tserver_pb2_grpc.TabletServerAdminServiceServicer):
    """The admin RPCs a master sends; the others answer UNIMPLEMENTED (the base class)."""

    def __init__(self, sim: FleetSimulator) -> None:
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
        return tpb.AlterSchemaResponsePB(schema_version=await self.sim.alter_schema(request))

    @rpc_errors
    async def ChangeConfig(
        self, request: tpb.ChangeConfigRequestPB, context: Ctx
    ) -> tpb.ChangeConfigResponsePB:
        return tpb.ChangeConfigResponsePB(consensus_state=await self.sim.change_config(request))

    @rpc_errors
    async def GetConsensusState(
        self, request: tpb.GetConsensusStateRequestPB, context: Ctx
    ) -> tpb.GetConsensusStateResponsePB:
        return self.sim.consensus_states(request)


class SimulatorThread:
    """A `FleetSimulator` on its own event loop in a daemon thread (for synchronous tests).
    `call(fn)` runs `fn(sim)` on that loop and returns its result."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.sim: FleetSimulator | None = None

    def __enter__(self) -> SimulatorThread:
        self._thread.start()

        async def start() -> FleetSimulator:
            sim = FleetSimulator(*self._args, **self._kwargs)
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


async def _freeze_heap() -> None:
    """`GC_FREEZE_EVERY_S`; with `TRACE_ENV` set, each full collection that took over 0.1 s is
    logged (`trace-gc`)."""
    if os.environ.get(TRACE_ENV):
        started = [0.0]

        def timed(phase: str, info: dict[str, int]) -> None:
            if info.get("generation") != 2:
                return
            if phase == "start":
                started[0] = time.perf_counter()
            elif (took := time.perf_counter() - started[0]) > 0.1:
                log.warning("trace-gc %.3f %.3f", time.time(), took)

        gc.callbacks.append(timed)
    while True:
        await asyncio.sleep(GC_FREEZE_EVERY_S)
        gc.freeze()


async def _serve(args: argparse.Namespace) -> int:
    uuids = uuids_for(args.uuid, args.count)
    bus = None
    if args.shard_index is not None:
        bus = SocketBus(args.shard_index, args.shards, Path(args.shard_dir), uuids)
        uuids = shard_uuids(uuids, args.shard_index, args.shards)
    sim = FleetSimulator(
        [m.strip() for m in args.masters.split(",") if m.strip()],
        uuids,
        args.bind,
        args.heartbeat_interval_ms / 1000.0,
        stagger=args.stagger,
        pki=None if args.pki is None else ClusterPki(Path(args.pki)),
        bus=bus,
    )
    if bus is not None:
        bus.on_message, bus.on_call = sim.on_message, sim.on_call
        await bus.start()
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
    freezer = asyncio.create_task(_freeze_heap())
    stats_task = None
    if args.stats_file is not None:
        stats_task = asyncio.create_task(write_stats_every_second(sim, Path(args.stats_file)))
    await stop.wait()
    freezer.cancel()
    if stats_task is not None:
        stats_task.cancel()
    await sim.aclose()
    if bus is not None:
        await bus.aclose()
    if args.stats_file is not None:
        dump_stats(sim, Path(args.stats_file))
    return 0


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The arguments every shard of a `--shards K` fleet gets (the parent adds its index)."""
    out = ["--masters", args.masters, "--uuid", args.uuid, "--count", str(args.count)]
    out += ["--bind", args.bind, "--heartbeat-interval-ms", str(args.heartbeat_interval_ms)]
    out += ["--shards", str(args.shards), "--log-level", args.log_level]
    out += ["--stagger"] if args.stagger else []
    out += ["--pki", args.pki] if args.pki is not None else []
    return out


def _trace_lag(lag_s: float, _cpu_s: float, _now: float) -> None:
    """A `LoopLagMonitor` listener of trace mode: one `trace-lag` line per late wake."""
    if lag_s > 0.2:
        log.warning("trace-lag %.3f %.3f", time.time(), lag_s)


def _reprobe(s: _Server) -> None:
    """Leadership moved, or the leader's heartbeat failed: every master of `s` is heartbeated
    next round, whatever pace a follower asked for; while a leader is still known, the
    followers then go back to their pace (service/tserver/heartbeater.py does the same)."""
    for link in s.links.values():
        link.next_due = 0.0
        if not link.leader:
            link.report_gap = link.report_due = 0.0  # a new leader hears our changes at once


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
    p.add_argument(
        "--shards",
        type=int,
        default=1,
        help="run the fleet as this many processes, each with its own event loop and admin port",
    )
    p.add_argument("--shard-index", type=int, help=argparse.SUPPRESS)  # set by the parent
    p.add_argument("--shard-dir", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.count < 1:
        p.error("--count must be >= 1")
    if not 1 <= args.shards <= args.count:
        p.error("--shards must be between 1 and --count")
    if args.shard_index is not None and (args.shard_dir is None or args.shards < 2):
        p.error("--shard-index is for the shards of a --shards K fleet")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if args.shards > 1 and args.shard_index is None:
        return run_fleet(args, _child_argv(args))
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
