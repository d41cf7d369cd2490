"""The heartbeater: one loop per master, registration, full and incremental tablet reports.

Theory of operation
-------------------
docs/design/failover.md#R1: a tablet server heartbeats to EVERY master, so each master's registry of
servers is warm when it wins an election (KUDU-1358). Only the leader processes tablet reports,
so reports go only to the master that last answered as leader; the others get bare heartbeats
(liveness). Each loop keeps, per master:

  needs_register   set at start and whenever the master answers `needs_reregister`; the next
                   heartbeat carries the registration (addresses, version, start time), and
                   goes at once (a restarted master's registry is warm within a heartbeat)
  needs_full       the next report to this master is a full one: set at start and when the
                   leader asks (`needs_full_tablet_report`: a new leader wants one from every
                   server, ending KUDU-1374, but asks a few servers at a time); cleared when
                   one is acknowledged, or when the leader says its turn has not come
                   (`full_tablet_report_deferred`)

and, for all masters together, `acked`: the ReportedTabletPB (serialized) of every replica as
the leader last acknowledged it, with that leader's term. A leader acknowledges a report only
once what it implies is committed in sys.catalog, and every later leader has what was
committed, so `acked` stays true across a change of leader: a new leader is sent the changes
since then at once, while it waits to ask for our full report (which repairs whatever a
leader received and did not act on). An acknowledgement from a leader of an older term than
`acked`'s is ignored.

An incremental report is the difference between the replicas' current reports and `acked`:
changed or new replicas in `updated_tablets`, vanished ones in `removed_tablet_ids`
(edge-triggered: nothing changed, no report). A report is acknowledged when the master answers
as leader with `acked_report_sequence_number` at least the report's number; until then the
same difference is sent again (a leader that could not write it, or deferred it to keep
heartbeats prompt, answers 0).

Transport: one TSHeartbeatStream per master, each heartbeat a message on it and its answer
read within `rpc_timeout_s` (a unary call each would be a new call for the master to accept,
and a busy grpc.aio master accepts one per event-loop iteration). A failure closes the stream
and counts as a failed heartbeat; the next heartbeat opens a new stream.

Timing: every `heartbeat_interval_ms`; sooner (but at most every `MIN_GAP_S`) when a replica
changed and this master is the leader, so a new tablet leader is reported within milliseconds,
not a full interval, and likewise when a master turned leader or gave us our turn for a full
report. While the leader leaves our reports unacknowledged (it sheds what its writes cannot
keep up with), a change waits longer: `report_gap` doubles with each such report, up to the
leader's pace, and shrinks as reports are acknowledged (`next_report_gap`,
docs/design/catalog.md#R16). A follower may ask for a slower pace in its answers
(`heartbeat_interval_ms`, docs/design/failover.md#R1): it only records liveness, and most of a
large fleet's heartbeats would otherwise go to followers. The slower pace holds only while
another master is the known leader. The leader asks for one too while it is overloaded (its
loop lags or its CPU saturates: service/master/heartbeat_pace.py), at most a quarter of its
unresponsive timeout, so the fleet slows down instead of timing out. After
`max_failures_before_backoff` consecutive failures the loop backs off exponentially up to 10
intervals. A higher master term in any answer, an answer as follower from the leader, or a
failed heartbeat to the leader wakes every other loop at once: leadership may have moved,
maybe to a master heartbeated slowly or one that just came back. A leader is lost only after
`max_failures_before_backoff` failed heartbeats in a row (until then it is late, and the other
masters keep their slower pace), or when another master answers as leader of a term at least
as new. A server that loses every master keeps serving data: nothing here gates the data
path.

Membership (AddMaster/RemoveMaster): `master_addresses` from the configuration is only where
the loops start. Every answer carries the masters of the answering master's latest config. A
master new to any such list gets its own loop at once (an added master must have a warm
registry before it can win an election, and a server must know it before every master it was
configured with is removed); the loop of a master stops only when the leader's list no longer
has it, since a follower may not have applied the latest change yet and a removed master may
never learn it was removed. All without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc

from service.common import channel_options
from service.common.errors import from_grpc
from service.common.tls import Credentials, open_channel
from service.common.tokens import VerifyingKey
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc as mpb_grpc
from service.tserver.tablet_manager import TabletManager

log = logging.getLogger(__name__)


def failure_backoff(interval_s: float, failures: int, max_failures: int) -> float | None:
    """How long to wait before heartbeating a master again after `failures` failed heartbeats
    in a row: None (the usual pace) up to `max_failures`, then 2, 4, 8, ... intervals, at most
    10. The tablet-server simulator backs off by the same rule."""
    if failures <= max_failures:
        return None
    return min(interval_s * 2 ** (failures - max_failures), 10 * interval_s)


MIN_GAP_S = 0.05

REPORT_GAP_FLOOR_S = 0.2
"""The first step of `next_report_gap` after a report the leader did not acknowledge."""


def next_report_gap(gap_s: float, acknowledged: bool, cap_s: float) -> float:
    """The least time between this server's reports to the leader, out of its pace, after one
    more report the leader answered: doubled (from `REPORT_GAP_FLOOR_S`) when it was not
    acknowledged, up to `cap_s`; a quarter shorter when it was, and none once under
    `MIN_GAP_S`. The tablet-server simulator paces its reports by the same rule."""
    if not acknowledged:
        return min(cap_s, max(2 * gap_s, REPORT_GAP_FLOOR_S))
    gap_s *= 0.75
    return gap_s if gap_s >= MIN_GAP_S else 0.0


SOFTWARE_VERSION = "tessera-0.1"


@dataclass
class _Loop:
    """The heartbeat loop of one master: its view, channel, wake-up event and task."""

    view: MasterView
    channel: grpc.aio.Channel
    wake: asyncio.Event
    task: asyncio.Task[None]

    async def stop(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        await self.channel.close(None)


class HeartbeatStream:
    """One master's TSHeartbeatStream: a heartbeat is a write and the read of its answer,
    within `timeout_s`. Opened on first use; any failure closes it, and the next heartbeat
    opens a new one (the failure is the caller's to count, as a failed unary call's)."""

    def __init__(self, stub: mpb_grpc.MasterServiceStub, timeout_s: float) -> None:
        self._stub = stub
        self._timeout_s = timeout_s
        self._call: Any = None

    async def heartbeat(self, req: mpb.TSHeartbeatRequestPB) -> mpb.TSHeartbeatResponsePB:
        if self._call is None:
            self._call = self._stub.TSHeartbeatStream()  # type: ignore[call-arg]
        call = self._call
        try:
            async with asyncio.timeout(self._timeout_s):
                await call.write(req)
                resp = await call.read()
        except asyncio.InvalidStateError as e:  # a write on a stream that already ended
            self.close()
            raise ConnectionError(f"the heartbeat stream had ended: {e}") from e
        except BaseException:
            self.close()
            raise
        if resp is grpc.aio.EOF:  # type: ignore[attr-defined]  # ended without a status
            self.close()
            raise ConnectionError("the master ended the heartbeat stream")
        return cast(mpb.TSHeartbeatResponsePB, resp)

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


@dataclass
class MasterView:
    address: str
    needs_register: bool = True
    needs_full: bool = True
    is_leader: bool = False
    prompt: bool = False
    """Heartbeat again after `MIN_GAP_S`, not an interval: this master just turned leader or
    asked for our full report."""
    seq: int = 0
    failures: int = 0
    """Consecutive failed heartbeats (reset by a success)."""
    failures_total: int = 0
    heartbeats: int = 0
    last_ok: float = 0.0
    master_uuid: str = ""
    term: int = 0
    asked_interval_s: float = 0.0
    """The pace this master last asked for (a follower's is slower; 0: ours)."""
    report_gap: float = 0.0
    """The least time between our heartbeats to this leader that a change brings forward
    (`next_report_gap`: grown while the leader leaves our reports unacknowledged)."""


class Heartbeater:
    def __init__(
        self,
        master_addresses: tuple[str, ...],
        instance: mpb.NodeInstancePB,
        registration: Callable[[], mpb.ServerRegistrationPB],
        tablets: TabletManager,
        interval_s: float,
        rpc_timeout_s: float,
        max_failures_before_backoff: int,
        on_master_term: Callable[[int], None],
        highest_term: Callable[[], int],
        credentials: Credentials | None = None,
        on_token_keys: Callable[[list[VerifyingKey]], None] | None = None,
    ) -> None:
        self.on_token_keys = on_token_keys
        """Told the token signing keys' public halves the leader sends (authz token checks)."""
        self.views = [MasterView(a) for a in master_addresses]
        self.acked: dict[str, bytes] = {}
        """Every replica's ReportedTabletPB (serialized) as the leader of `acked_term` last
        acknowledged it (docstring)."""
        self.acked_term = 0
        self.credentials = credentials
        self.instance = instance
        self.registration = registration
        self.tablets = tablets
        self.interval_s = interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.max_failures = max_failures_before_backoff
        self.on_master_term = on_master_term
        self.highest_term = highest_term
        self._loops: dict[str, _Loop] = {}
        self._closed = False
        tablets.listeners.append(lambda _tid: self._on_change())

    async def start(self) -> None:
        for v in self.views:
            self._start_loop(v)

    def _start_loop(self, v: MasterView) -> None:
        ch = open_channel(
            v.address, self.credentials, role="master", options=channel_options.heartbeat()
        )
        ev = asyncio.Event()
        stub = mpb_grpc.MasterServiceStub(ch)
        task = asyncio.create_task(self._loop(v, stub, ev), name=f"hb-{v.address}")
        self._loops[v.address] = _Loop(v, ch, ev, task)

    def master_uuids(self) -> frozenset[str]:
        """The uuids of the masters this server heartbeats to, as their answers named them:
        the cluster's masters (the configured ones and those the masters' own answers listed)."""
        return frozenset(v.master_uuid for v in self.views if v.master_uuid)

    def masters(self) -> list[str]:
        """The masters heartbeated to now (membership changes included)."""
        return list(self._loops)

    async def replace_credentials(self, creds: Credentials) -> None:
        """Heartbeat with renewed credentials: each master's loop restarts on a new channel
        (the old connection would keep the old certificate until it dropped)."""
        self.credentials = creds
        for address, lp in list(self._loops.items()):
            if self._closed:
                return
            lp.task.cancel()
            await lp.stop()
            if self._loops.get(address) is lp:
                self._start_loop(lp.view)

    async def aclose(self) -> None:
        self._closed = True
        loops = list(self._loops.values())
        self._loops.clear()
        for lp in loops:
            lp.task.cancel()
        for lp in loops:
            await lp.stop()

    def _on_change(self) -> None:
        for lp in self._loops.values():
            if lp.view.is_leader:
                lp.wake.set()

    def _follow_membership(self, addresses: list[str], *, from_leader: bool) -> None:
        """A master named the group's masters: start loops for new ones; if it is the leader,
        stop the loops of masters it no longer names (docstring)."""
        if self._closed or not addresses:
            return
        for address in addresses:
            if address not in self._loops:
                log.info("master %s joined the group: heartbeating to it", address)
                v = MasterView(address)
                self.views.append(v)
                self._start_loop(v)
        if not from_leader:
            return
        wanted = set(addresses)
        for address in [a for a in self._loops if a not in wanted]:
            log.info("master %s left the group: no longer heartbeating to it", address)
            lp = self._loops.pop(address)
            self.views = [v for v in self.views if v is not lp.view]
            lp.task.cancel()
            # Not awaited here (this runs inside a loop, possibly the one being stopped).
            asyncio.get_running_loop().create_task(lp.stop())

    def saw_newer_term(self) -> None:
        """A master's fenced admin request (CreateTablet, DeleteTablet, ...) carried a newer
        term than any heartbeat answer had: leadership moved before this server's heartbeats
        noticed. Every loop tries its master now, so the new leader is found (and sent this
        server's reports) at once, not after the old leader's slower pace and failures.

        Why. After a leader master dies, a tablet server learns of the new one only from a
        heartbeat, and a busy leader had asked for a slower pace: the first sign is often the
        new leader's CreateTablet for a table created just after the election, and until the
        server reports the new replica to the new leader that table cannot turn RUNNING. In
        a scale run the new replicas' first reports still went to the dead master, failed,
        and reached the new leader 1-10 seconds later (bench/README.md, runs 13-18)."""
        self._reprobe_others(None)

    def _reprobe_others(self, answered: MasterView | None) -> None:
        """Leadership moved (a new master term) or the leader was lost: perhaps to a master
        heartbeated at a follower's slow pace, or one this server backed off from while it
        restarted. Every other loop tries its master now instead of waiting out its pace or
        backoff, so the new leader hears from this server (and its reports) within a
        heartbeat, and its registry fills."""
        for lp in self._loops.values():
            if lp.view is not answered:
                lp.view.report_gap = 0.0  # a new leader hears our changes at once
                lp.wake.set()

    def _failed(self, v: MasterView) -> None:
        """A heartbeat to `v`'s master failed. A leader whose heartbeat failed is late, not
        yet lost: it is tried again at our own interval (not a busy leader's slower pace),
        and every other master is asked once at once (a new leader answers as one, and a
        higher term moves us), while they keep a follower's pace; only after `max_failures`
        failures in a row is the leader lost, and every master heartbeated at our interval
        until one answers as leader.

        Why. A busy leader answers some heartbeats late. Taking the first timeout for a lost
        leader sent the whole fleet to every master each interval, at once: the followers'
        heartbeats tripled on the hosts that were already the slowest, and more of the
        leader's answers came late (docs/design/failover.md#R1)."""
        v.failures += 1
        v.failures_total += 1
        if v.is_leader:
            if v.failures >= self.max_failures:
                v.is_leader = False
            self._reprobe_others(v)

    def _delay(self, v: MasterView) -> float:
        """Seconds until the next heartbeat to `v`'s master: our interval; a slower pace when
        the master asked for one: a follower while another master is the known leader
        (without a known leader every master is heartbeated at our interval, to find one), or
        the leader while it is overloaded (service/master/heartbeat_pace.py); backed off
        after repeated failures."""
        delay = self.interval_s
        if v.prompt:
            v.prompt = False
            return MIN_GAP_S
        backoff = failure_backoff(self.interval_s, v.failures, self.max_failures)
        if backoff is not None:
            return backoff
        late_leader = v.is_leader and v.failures > 0  # tried again at our interval (`_failed`)
        if (
            v.asked_interval_s > delay
            and not late_leader
            and (v.is_leader or self.leader_address() is not None)
        ):
            delay = v.asked_interval_s  # a follower's pace, or a busy leader's
        return delay

    def leader_address(self) -> str | None:
        for v in self.views:
            if v.is_leader:
                return v.address
        return None

    # --- one master ------------------------------------------------------------------------

    async def _loop(
        self, v: MasterView, stub: mpb_grpc.MasterServiceStub, wake: asyncio.Event
    ) -> None:
        stream = HeartbeatStream(stub, self.rpc_timeout_s)
        try:
            await self._beat_forever(v, stream, wake)
        finally:
            stream.close()

    async def _beat_forever(
        self, v: MasterView, stream: HeartbeatStream, wake: asyncio.Event
    ) -> None:
        while True:
            t0 = time.monotonic()
            try:
                await self._heartbeat(v, stream)
                v.failures = 0
            except (grpc.aio.AioRpcError, TimeoutError, ConnectionError) as e:
                self._failed(v)
                if v.failures == 1 or v.failures % 30 == 0:
                    why = from_grpc(e) if isinstance(e, grpc.aio.AioRpcError) else repr(e)
                    log.warning("heartbeat to %s failed (%d): %s", v.address, v.failures, why)
            except Exception:
                self._failed(v)
                log.exception("heartbeat to %s failed", v.address)
            delay = self._delay(v)
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, delay - (time.monotonic() - t0))):
                    await wake.wait()
                    # Coalesce a burst of changes; after reports the leader left
                    # unacknowledged (shed by a busy leader), changes wait `report_gap`.
                    gap = v.report_gap if v.is_leader else 0.0
                    await asyncio.sleep(max(MIN_GAP_S, gap - (time.monotonic() - t0)))

    async def _heartbeat(self, v: MasterView, stream: HeartbeatStream) -> None:
        req = mpb.TSHeartbeatRequestPB(
            instance=self.instance,
            num_live_tablets=self.tablets.num_live(),
            num_leaders=self.tablets.num_leaders(),
            highest_master_term_seen=self.highest_term(),
        )
        if v.needs_register:
            req.registration.CopyFrom(self.registration())
        current: dict[str, bytes] = {}
        sent_seq = None
        if v.is_leader:
            reports = {
                tid: self.tablets.reported_tablet(r) for tid, r in self.tablets.replicas.items()
            }
            current = {tid: r.SerializeToString(deterministic=True) for tid, r in reports.items()}
            full = v.needs_full
            changed = [tid for tid, data in current.items() if full or self.acked.get(tid) != data]
            removed = [] if full else [tid for tid in self.acked if tid not in current]
            if full or changed or removed:
                v.seq += 1
                sent_seq = v.seq
                rep = req.tablet_report
                rep.is_incremental = not full
                rep.sequence_number = v.seq
                rep.removed_tablet_ids.extend(sorted(removed))
                for tid in sorted(changed):
                    rep.updated_tablets.append(reports[tid])
        resp = await stream.heartbeat(req)
        v.heartbeats += 1
        v.last_ok = time.monotonic()
        v.master_uuid = resp.master_instance.permanent_uuid
        newest = resp.master_term >= self.highest_term()
        if resp.master_term:
            v.term = resp.master_term
            if resp.master_term > self.highest_term():
                self._reprobe_others(v)
            self.on_master_term(resp.master_term)
        was_leader = v.is_leader
        # A leader of an older term than one seen is deposed and does not know it yet.
        v.is_leader = resp.leader_master and newest
        if v.is_leader:
            for other in self.views:
                if other is not v:
                    other.is_leader = False  # a late former leader is one no more
        v.asked_interval_s = resp.heartbeat_interval_ms / 1000.0
        if was_leader and not v.is_leader:
            self._reprobe_others(v)
        if v.needs_register and req.HasField("registration"):
            v.needs_register = False
        acknowledged = (
            sent_seq is not None
            and resp.leader_master
            and resp.acked_report_sequence_number >= sent_seq
            and resp.master_term >= self.acked_term  # never a deposed leader's over a newer's
        )
        if acknowledged:
            rep = req.tablet_report
            if rep.is_incremental:
                for tid in rep.removed_tablet_ids:
                    self.acked.pop(tid, None)
                for r in rep.updated_tablets:
                    self.acked[r.tablet_id] = current[r.tablet_id]
            else:
                self.acked = dict(current)
                v.needs_full = False
            self.acked_term = resp.master_term
        if sent_seq is not None and v.is_leader:
            cap = max(self.interval_s, v.asked_interval_s)
            v.report_gap = next_report_gap(v.report_gap, acknowledged, cap)
        elif not v.is_leader:
            v.report_gap = 0.0
        if v.is_leader and not was_leader:
            v.prompt = True  # a new leader: what it may not know goes now, not in an interval
        if resp.needs_reregister:
            # A master that restarted knows no servers until they register; it may win an
            # election a few seconds from now, so the registration goes at once, not after
            # the follower's pace it asked for. Only once per answer that lacked it: a master
            # that asks again after a registration waits for the next interval.
            v.prompt = v.prompt or not req.HasField("registration")
            v.needs_register = True
        if resp.needs_full_tablet_report:
            v.prompt = v.prompt or not v.needs_full
            v.needs_full = True
        elif resp.full_tablet_report_deferred:
            v.needs_full = False
        if resp.leader_master and resp.token_verifying_keys and self.on_token_keys is not None:
            self.on_token_keys(
                [
                    VerifyingKey(k.key_seq, k.expire_time_us, k.public_key)
                    for k in resp.token_verifying_keys
                ]
            )
        if resp.master_addresses:
            self._follow_membership(
                [f"{h.host}:{h.port}" for h in resp.master_addresses if h.host and h.port],
                from_leader=resp.leader_master,
            )
