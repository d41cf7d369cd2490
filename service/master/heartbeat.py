"""TSHeartbeat: registration and liveness on every master, tablet reports on the leader.

Theory of operation
-------------------
Tablet servers heartbeat to ALL masters (docs/design/failover.md#R1, which ends KUDU-1358). One
heartbeat is handled in this order:

  1. decode and validate the whole request (instance, registration, tablet report) into
     dataclasses; a bad field is InvalidArgument naming it, and nothing has changed. A large
     report is decoded in a thread (`read_report`), at most `ReportGate.max_reading` at once
     (more are shed, not decoded): sys.catalog's Raft ticks share this loop. Of a shed
     report, the entries naming a CREATING tablet are still read (`urgent_entries`), as a
     partial report that is processed and never acknowledged;
  2. `TSManager.heartbeat`: registration and liveness, on every master alike;
  3. only on the leader whose catalog is loaded, and only for a registered instance: note
     which replicas the report says are FAILED (`CatalogManager.note_replica_states`, in
     memory: re-replication replaces them), process the tablet report, full or incremental
     (`CatalogManager.process_report`: ONE write for the whole report, which may share its
     sys.catalog entry with other reports' writes, group_commit.py), then hand
     the RPCs it calls for to the background tasks.
     A failed replication is logged and the report is not acknowledged (the server sends it
     again); it never fails the heartbeat nor crashes the master (KUDU-495). A follower
     ignores the report (its maps follow sys.catalog, never reports). Reports go through a
     `ReportGate`: liveness (step 2) must never wait on catalog writes;
  4. answer: while the leader still wants a full report (after this master's election,
     KUDU-1374, or a registration), either `needs_full_tablet_report` (the server's turn: a
     few at a time, report_turns.py) or `full_tablet_report_deferred` (send changes only
     until asked); a full report processed under the token of the latest request clears
     that wish; `acked_report_sequence_number` is the report's sequence number once
     processed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from service.common.config import MasterConfig
from service.common.errors import InvalidArgument, TesseraError
from service.common.ids import NodeId, TabletId, validate_uuid
from service.master.catalog_manager import CatalogManager
from service.master.catalog_records import ConsensusState, consensus_state_from_pb
from service.master.claims import ConfirmClaims
from service.master.report_processing import (
    Answers,
    ReportAction,
    ReportedRole,
    ReportedState,
    ReportedTablet,
    ReportPlan,
)
from service.master.report_turns import FullReportTurns
from service.master.ts_descriptor import NodeInstance, TSRegistration
from service.master.ts_manager import HeartbeatOutcome, TSManager
from service.pb import master_pb2 as pb

__all__ = [
    "HeartbeatContext",
    "ReportGate",
    "decode_report",
    "handle_heartbeat",
    "read_report",
    "urgent_entries",
]

log = logging.getLogger(__name__)

_DECODE_BEFORE_SHEDDING = 64
"""An incremental report of at most this many replicas is decoded even when the gate is full,
and on the event loop; a larger one is decoded in a thread (`read_report`)."""
FULL_REPORT_TURN_LAPSE_S = 5.0
"""A server asked for its full report that has not had one processed this long after is
asked no longer; its turn goes to another (report_turns.py). Several heartbeat intervals:
a turn's report can be shed once or twice and still be read within it."""
UNCONFIRMED_LOG_S = 10.0
"""Reports deferred for unconfirmed claims are logged at most once per this many seconds, with
how many there were (`ReportGate.note_unconfirmed`)."""
MAX_REPORTED_TABLETS = 100_000
"""More replicas than this in one report is refused (a runaway or hostile sender)."""
DECODED_STATES_KEPT = 20_000
"""Consensus states kept decoded (`_consensus_state`), about 1 KB each."""
_MASTER = MasterConfig(data_dir=Path("report-gate"))
"""MasterConfig with its defaults, the gate's defaults (its data_dir is never opened)."""


class ReportGate:
    """Tablet reports' admission to the catalog: at most `max_in_flight` report writes at
    once, and a heartbeat waits at most `budget_s`, for a turn and for its report's write
    together.

    Why. Every report is a replicated write, applied on the one event loop; when a fleet's
    reports come in faster than they apply (a 10,000-tablet table becoming RUNNING on 1,000
    servers), heartbeats that waited for their report piled up past their deadline, failed,
    and healthy servers were declared dead (the starvation spiral, docs/design/failover.md#R8).
    Through the gate a heartbeat answers within the budget whatever happens to its report: one that
    finds every slot taken waits its turn (first come, first served, at most `max_waiting` waiting,
    like Kudu's bounded service queue) and is not processed if the queue is full or the budget
    runs out first (shed); one still being written when the budget is spent goes on alone
    (late). Either way it is not acknowledged, and the server sends what it has not had
    acknowledged with its next heartbeat, judged then against committed state (report
    processing is idempotent). A late report's RPCs are still handed to the background tasks
    when its write commits. Liveness was recorded before the gate (step 2): waiting here
    delays only the answer.

    Waiting rather than shedding at once matters when a few dozen servers report together
    (30 servers each told a tablet of theirs is RUNNING): the writes share fsyncs and finish
    in milliseconds, while a shed report comes again only after a gap, longer with each one
    shed, up to a heartbeat interval (heartbeater.next_report_gap): 1,000 tablets x 3 on 30
    servers took 2.8 s to RUNNING, 5.7 s when shed at once. The queue
    is bounded because when a thousand servers report together, waiting only makes every
    heartbeat as slow as the budget (p99 1.3 s) without writing reports any faster.
    Many slots, though: a report write is latency-bound (its fsync, a majority's answer) and
    concurrent ones share fsyncs, so slots are throughput. With 8, a 10,000-tablet CreateTable
    on 1,000 servers wrote about 12 reports a second, shed over 100,000 and ran past the
    creation timeout (a third of its tablets were replaced, and the create took ten minutes);
    with 64 it was RUNNING in 65 s on the same loaded machine.

    Invariant: `in_flight` counts the report tasks started and not yet finished;
    `in_flight + _granted <= max_in_flight`, `_granted` counting the woken waiters that have
    not resumed yet (a slot handed to a waiter that gives up is handed on)."""

    def __init__(
        self,
        max_in_flight: int = _MASTER.max_concurrent_tablet_reports,
        budget_s: float = _MASTER.tablet_report_budget_ms / 1000.0,
        max_waiting: int = _MASTER.max_queued_tablet_reports,
        max_reading: int = 2,
        full_report_turns: int = _MASTER.full_report_turns,
    ) -> None:
        """The defaults are MasterConfig's (`from_config`); `max_reading` is this class's own."""
        if max_in_flight < 1 or not budget_s > 0 or max_waiting < 0 or max_reading < 1:
            raise InvalidArgument(
                f"report gate: max_in_flight must be >= 1, budget_s > 0, max_waiting >= 0 and "
                f"max_reading >= 1, got {max_in_flight}, {budget_s}, {max_waiting} and "
                f"{max_reading}"
            )
        self.max_in_flight = max_in_flight
        self.max_reading = max_reading
        self.reading = 0
        """Large reports being decoded now (`start_reading`)."""
        self._readers: collections.deque[asyncio.Future[None]] = collections.deque()
        """Full reports sent in their turn, waiting for a reading slot (`wait_reading`)."""
        self.turns = FullReportTurns(full_report_turns, lapse_s=FULL_REPORT_TURN_LAPSE_S)
        """Which servers are asked for their full report now (report_turns.py)."""
        self.max_waiting = max_waiting
        self.budget_s = budget_s
        self.in_flight = 0
        self.shed = 0
        """Reports not processed: `max_waiting` were already waiting, or no slot came free
        within the budget."""
        self.late = 0
        """Reports whose heartbeat answered before their write committed."""
        self.unconfirmed = 0
        """Reports not acknowledged because they claim a leader or config the other voters do
        not confirm yet (report_processing, step 3): sent again with the next heartbeat."""
        self._unconfirmed_logged_at = float("-inf")
        self._unconfirmed_since_log = 0
        self._unconfirmed_tablets_since_log = 0
        self._tasks: set[asyncio.Task[ReportPlan]] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._granted = 0
        """Slots handed to woken waiters that have not started their write yet."""

    def note_unconfirmed(self, tablets: int, now: float) -> tuple[int, int] | None:
        """Count a report deferred for `tablets` unconfirmed claims. Returns (reports, tablets)
        deferred since the last time this returned non-None when a log line is due (at most one
        per `UNCONFIRMED_LOG_S`), None otherwise. A server sends such a report with every
        heartbeat until the claim is settled, so a fleet with claims outstanding after a
        failover logged one line per heartbeat (60,618 in one scale run)."""
        self.unconfirmed += 1
        self._unconfirmed_since_log += 1
        self._unconfirmed_tablets_since_log += tablets
        if now - self._unconfirmed_logged_at < UNCONFIRMED_LOG_S:
            return None
        out = (self._unconfirmed_since_log, self._unconfirmed_tablets_since_log)
        self._unconfirmed_logged_at = now
        self._unconfirmed_since_log = self._unconfirmed_tablets_since_log = 0
        return out

    @classmethod
    def from_config(cls, config: MasterConfig) -> ReportGate:
        return cls(
            config.max_concurrent_tablet_reports,
            config.tablet_report_budget_ms / 1000.0,
            config.max_queued_tablet_reports,
            full_report_turns=config.full_report_turns,
        )

    async def process(
        self,
        catalog: CatalogManager,
        reporter: NodeId,
        reported: list[ReportedTablet],
        submit: Callable[[Iterable[ReportAction]], None],
        confirm: ConfirmClaims | None = None,
    ) -> ReportPlan | None:
        """The report's plan once its write committed within the budget (the caller
        acknowledges it, unless the plan lists `unconfirmed` claims, and submits its actions);
        None if it was shed or is late. Replication errors propagate (not acknowledged
        either). `confirm` asks other voters about membership claims (`report_processing`,
        step 3); without it such claims stay unconfirmed."""
        # Most reports change nothing (a steady server's incremental report): judged at once,
        # with no task, turn or timer. One that needs a write is judged again under its
        # locks by `process_report`.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget_s
        plan = catalog.judge_report(reporter, reported)
        ask = catalog.claims_to_ask(plan.unconfirmed) if plan.unconfirmed and confirm else []
        if ask and confirm is not None:
            answers: dict[TabletId, Answers] = {}
            try:
                async with asyncio.timeout_at(deadline):
                    answers = await confirm(ask)
            except TimeoutError:
                pass
            if answers:
                catalog.note_answers(answers)
                plan = catalog.judge_report(reporter, reported)
        if plan.write is None:
            return plan
        fresh = self._free()  # no wait: the plan is still current and names what to lock
        if not await self._turn(deadline):
            self.shed += 1
            return None
        self.in_flight += 1
        judged = plan if fresh else None
        task = asyncio.ensure_future(catalog.process_report(reporter, reported, judged))
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if task in done:
            return task.result()
        self.late += 1
        task.add_done_callback(functools.partial(_submit_late, reporter, submit))
        return None

    async def _turn(self, deadline: float) -> bool:
        """True once a slot is free for this report (FIFO behind earlier waiters); False if
        the deadline passed first."""
        if self._free():
            return True
        if len(self._waiters) >= self.max_waiting:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        taken = False
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
            taken = True
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.remove(waiter)
            if waiter.done() and not waiter.cancelled():  # a slot was handed to this waiter
                self._granted -= 1
                if not taken:  # ...too late (or cancelled): pass it on
                    self._wake()

    def _free(self) -> bool:
        """A slot is free and nobody waits for one."""
        return self.in_flight + self._granted < self.max_in_flight and not self._waiters

    def _finished(self, task: asyncio.Task[ReportPlan]) -> None:
        self.in_flight -= 1
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here: the heartbeat that started it may be gone (its caller hung up,
            # or it answered late), and an error nobody retrieves is logged by asyncio as
            # "Task exception was never retrieved" with a traceback, at every leader change.
            log.debug("tablet report write ended: %s", task.exception())
        self._wake()

    @property
    def saturated(self) -> bool:
        """Every slot is taken and the waiting queue is full: a report that needs a write
        would be shed now, so the heartbeat need not even decode it."""
        return (
            self.in_flight + self._granted >= self.max_in_flight
            and len(self._waiters) >= self.max_waiting
        )

    def start_reading(self) -> bool:
        """Take one of `max_reading` slots for decoding and judging a large report; False
        (the report is to be shed, counted here) when every slot is taken.

        Why. Most of a new leader's full reports change nothing, so they never take a write
        slot and `saturated` never sheds them: when 300 servers sent ~1,000-replica full
        reports at once, all 300 were decoded and judged at once, and the Raft ticks of
        sys.catalog queued behind them for longer than the election timeout (masters flapped
        at 95,000 tablets). Decoding runs in a thread (`read_report`), which takes the
        interpreter lock from the loop every few milliseconds; bounding the readers keeps the
        loop's share of it. A shed report is sent again with the next heartbeat."""
        if self._take_reading():
            return True
        self.shed += 1
        return False

    def _take_reading(self) -> bool:
        """A reading slot, if one is free and no full report waits for one."""
        if self.reading >= self.max_reading or self._readers:
            return False
        self.reading += 1
        return True

    async def wait_reading(self) -> bool:
        """`start_reading` for a full report sent in its turn (report_turns.py): when every
        slot is taken it waits for one, first come first served, for at most half of
        `budget_s` (then it is shed like any other). The leader asked for this report, and the few
        servers holding a turn send theirs within milliseconds of one another: shedding all
        but `max_reading` of them would waste a heartbeat interval of each. Half the budget:
        the report's write, if it needs one, has a budget of its own (`process`)."""
        if self._take_reading():
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._readers.append(waiter)
        taken = False
        try:
            async with asyncio.timeout(self.budget_s / 2):
                await waiter
            taken = True
        except TimeoutError:
            pass
        finally:
            self._readers.remove(waiter)
            if waiter.done() and not waiter.cancelled() and not taken:
                self.done_reading()  # handed a slot too late (or cancelled): pass it on
        if not taken:
            self.shed += 1
        return taken

    def done_reading(self) -> None:
        """A reading slot is given back: to the first full report waiting for one, if any
        (the slot passes to it without being freed), else freed."""
        for waiter in self._readers:
            if not waiter.done():
                waiter.set_result(None)
                return
        self.reading -= 1

    def _wake(self) -> None:
        """Hand the free slots to the first waiters still waiting."""
        for waiter in self._waiters:
            if self.in_flight + self._granted >= self.max_in_flight:
                break
            if not waiter.done():
                waiter.set_result(None)
                self._granted += 1

    async def aclose(self) -> None:
        """Cancel the report writes still running (a change of role: nothing to hand on)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task


def _submit_late(
    reporter: NodeId,
    submit: Callable[[Iterable[ReportAction]], None],
    task: asyncio.Task[ReportPlan],
) -> None:
    if task.cancelled():
        return
    err = task.exception()
    if err is not None:
        log.warning("tablet report of %s (late) not processed: %s", reporter, err)
        return
    if task.result().actions:
        submit(task.result().actions)


@dataclass(frozen=True)
class HeartbeatContext:
    """What the handler needs of the master, read at the time of the heartbeat."""

    master_instance: pb.NodeInstancePB
    term: int
    leading: bool
    """Leader with its catalog loaded: processes reports and asks for full ones."""
    master_addresses: tuple[pb.HostPortPB, ...]
    ts_manager: TSManager
    catalog: CatalogManager
    submit: Callable[[Iterable[ReportAction]], None]
    """Where the RPCs a report calls for go (the background tasks of this term)."""
    reports: ReportGate
    """Admission of reports to the catalog (this master's, for every heartbeat)."""
    token_keys: tuple[pb.TokenVerifyingKeyPB, ...] = ()
    """The public halves of the token signing keys (sent by the leader): tablet servers verify
    authz tokens with them."""
    confirm_claims: ConfirmClaims | None = None
    """Asks other voters about a report's membership claims (`report_processing`, step 3)."""
    heartbeat_interval_ms: int = 0
    """How often this master asks for heartbeats (0: the servers' own interval): a follower's
    slower pace (MasterConfig.follower_heartbeat_interval_ms, docs/design/failover.md#R1)."""


def decode_report(
    report: pb.TabletReportPB, only: Sequence[int] | None = None
) -> list[ReportedTablet]:
    """The report's replicas as values, validated; InvalidArgument naming the field. `only`:
    just the entries at these indexes (`urgent_entries`)."""
    if len(report.updated_tablets) > MAX_REPORTED_TABLETS:
        raise InvalidArgument(
            f"tablet_report.updated_tablets: {len(report.updated_tablets)} replicas, more than "
            f"{MAX_REPORTED_TABLETS}"
        )
    entries = report.updated_tablets
    indexes: Iterable[int] = range(len(entries)) if only is None else only
    return [_decode_entry(i, entries[i]) for i in indexes]


def _decode_entry(i: int, t: pb.ReportedTabletPB) -> ReportedTablet:
    path = f"tablet_report.updated_tablets[{i}]"
    try:
        tablet_id = TabletId(validate_uuid(t.tablet_id))
    except InvalidArgument as e:
        raise InvalidArgument(f"{path}.tablet_id: {e.message}") from None
    try:
        state = ReportedState(t.state)
    except ValueError:
        raise InvalidArgument(f"{path}.state: unknown replica state {t.state}") from None
    try:
        role = ReportedRole(t.role)
    except ValueError:
        raise InvalidArgument(f"{path}.role: unknown role {t.role}") from None
    consensus: ConsensusState | None = None
    if t.HasField("consensus_state") and t.consensus_state.committed_config.peers:
        consensus = _consensus_state(t.consensus_state, f"{path}.consensus_state")
    return ReportedTablet(tablet_id, state, role, consensus, t.schema_version)


_decoded_states: dict[bytes, ConsensusState] = {}


def _consensus_state(cs: pb.ConsensusStatePB, path: str) -> ConsensusState:
    """`consensus_state_from_pb`, remembered by the message's bytes. Why: decoding and checking
    a state was a sixth of a leader's CPU while a 10,000-tablet table was created (a profile
    of the scale bench), and the same bytes come again and again: the replicas of a tablet
    report the same term, leader and config, and a full report repeats what incremental ones
    said. Serializing the message and a dict lookup take about 0.4 us against 64 us to decode.
    The values are immutable, so a state is shared by every report that names it. Only states
    that decoded are kept (a bad one fails each time, with its own path); the oldest go first.
    Reports are decoded on the event loop and in threads (`read_report`): each step here is
    one dict operation, which the GIL makes atomic."""
    key = cs.SerializeToString(deterministic=True)
    state = _decoded_states.get(key)
    if state is None:
        state = consensus_state_from_pb(cs, path)
        if len(_decoded_states) >= DECODED_STATES_KEPT:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                _decoded_states.pop(next(iter(_decoded_states)))
        _decoded_states[key] = state
    return state


def urgent_entries(report: pb.TabletReportPB, creating: AbstractSet[TabletId]) -> list[int]:
    """The indexes of the report's entries that name a CREATING tablet: at most
    `_DECODE_BEFORE_SHEDDING` of them, and none when the report is too large to be read.

    Why. After an election the new leader asks every server for a full report and reads them
    a few at a time (`ReportGate.start_reading`): with 1,000 servers of 400 replicas each that
    took 36-40 s, and until a server's full report was read, a table created meanwhile could
    not turn RUNNING (each server sends its full report, with the new replicas in it, until
    one is acknowledged). Picking out the entries that would make a CREATING tablet RUNNING
    costs a tablet id read and a set lookup per entry (about 0.1 ms for 600 entries), and only
    while some tablet is CREATING."""
    if not creating or len(report.updated_tablets) > MAX_REPORTED_TABLETS:
        return []
    out = []
    for i, t in enumerate(report.updated_tablets):
        if t.tablet_id in creating:
            out.append(i)
            if len(out) >= _DECODE_BEFORE_SHEDDING:
                break
    return out


async def read_report(report: pb.TabletReportPB) -> list[ReportedTablet]:
    """`decode_report`, in a thread for a report of more than `_DECODE_BEFORE_SHEDDING`
    replicas: decoding a 1,000-replica full report takes tens of milliseconds of Python (most
    of it `consensus_state_from_pb`), which on the event loop would hold up sys.catalog's Raft
    ticks and votes. The thread only reads the request, which nothing else touches meanwhile."""
    if len(report.updated_tablets) <= _DECODE_BEFORE_SHEDDING:
        return decode_report(report)
    return await asyncio.to_thread(decode_report, report)


def _registration(request: pb.TSHeartbeatRequestPB) -> TSRegistration:
    r = request.registration
    try:
        return TSRegistration(
            rpc_addresses=tuple(f"{h.host}:{h.port}" for h in r.rpc_addresses),
            http_addresses=tuple(f"{h.host}:{h.port}" for h in r.http_addresses),
            software_version=r.software_version,
            start_time=r.start_time_us / 1_000_000,
            location=r.location or None,
        )
    except InvalidArgument as e:
        raise InvalidArgument(f"registration: {e.message}") from None


async def handle_heartbeat(
    ctx: HeartbeatContext, request: pb.TSHeartbeatRequestPB
) -> pb.TSHeartbeatResponsePB:
    """One heartbeat, steps 1-4 of the module docstring."""
    if not request.HasField("instance"):
        raise InvalidArgument("instance: missing")
    try:
        instance = NodeInstance(
            NodeId(request.instance.permanent_uuid), request.instance.instance_seqno
        )
    except InvalidArgument as e:
        raise InvalidArgument(f"instance: {e.message}") from None
    registration = _registration(request) if request.HasField("registration") else None
    has_report = request.HasField("tablet_report")
    report = request.tablet_report
    big = not report.is_incremental or len(report.updated_tablets) > _DECODE_BEFORE_SHEDDING
    reading = False
    only: list[int] | None = None  # the entries read when the rest is shed (a partial report)
    if has_report and ctx.leading and big:
        # Shed before decoding: at 100,000 tablets, decoding full reports that the gate then
        # shed was most of a new leader's time; and at most `max_reading` large reports are
        # decoded and judged at once (`ReportGate.start_reading`). Not acknowledged: sent
        # again next heartbeat. Small incremental reports are cheap to decode and mostly
        # change nothing (answered at once, without the gate), so they still go through.
        if ctx.reports.saturated:
            ctx.reports.shed += 1
            has_report = False
        else:
            # A full report sent in its turn waits for a reading slot (report_turns.py).
            turn = (
                not report.is_incremental
                and ctx.ts_manager.needs_full_report(instance.permanent_uuid)
                and ctx.reports.turns.take(instance.permanent_uuid, _now())
            )
            reading = await ctx.reports.wait_reading() if turn else ctx.reports.start_reading()
            if not reading:
                # ...but the entries that turn a CREATING tablet RUNNING are read now, as a
                # partial report, never acknowledged (`urgent_entries`).
                only = urgent_entries(report, ctx.catalog.creating_tablets())
            has_report = reading or bool(only)
    reported: list[ReportedTablet] = []
    if has_report and ctx.leading:
        try:
            reported = decode_report(report, only) if only else await read_report(report)
        finally:
            # Given back before the judging in `process`, which runs in this same step of the
            # loop (no await before it): at most `max_reading` reports are between decoding
            # and judged.
            if reading:
                ctx.reports.done_reading()

    ts = ctx.ts_manager
    outcome = ts.heartbeat(instance, registration, request.num_leaders)
    acked = 0
    if ctx.leading and has_report and not outcome.needs_reregister:
        uuid = instance.permanent_uuid
        partial = bool(only)
        full = not request.tablet_report.is_incremental and not partial
        ctx.catalog.note_replica_states(uuid, reported, full=full)
        try:
            plan = await ctx.reports.process(
                ctx.catalog, uuid, reported, ctx.submit, ctx.confirm_claims
            )
        except TesseraError as e:
            log.warning(
                "tablet report of %s (%d replicas) not processed, not acknowledged: %s",
                uuid,
                len(reported),
                e,
            )
        else:
            if plan is None:  # shed or late (ReportGate): sent again with the next heartbeat
                return _answer(ctx, ts, instance, outcome, 0)
            if plan.unconfirmed:
                # Not acknowledged: the server sends these replicas again, and another voter
                # is asked again (report_processing, step 3).
                due = ctx.reports.note_unconfirmed(len(plan.unconfirmed), time.monotonic())
                if due is not None:
                    log.info(
                        "%d tablet reports (%d tablets) claimed a leader or config the other "
                        "voters do not (yet) confirm, in the last %.0f s at most (not adopted, "
                        "not acknowledged); the latest, from %s: %s",
                        *due,
                        UNCONFIRMED_LOG_S,
                        uuid,
                        ", ".join(c.tablet_id for c in plan.unconfirmed[:5]),
                    )
            elif not partial:
                acked = request.tablet_report.sequence_number
            if plan.orphans:
                log.info(
                    "tablet server %s hosts %d tablets the catalog has no record of; left "
                    "alone (docs/design/failover.md#R6): %s",
                    uuid,
                    len(plan.orphans),
                    ", ".join(plan.orphans[:5]),
                )
            if plan.actions:
                ctx.submit(plan.actions)
            if full and outcome.report_token is not None:
                ts.full_report_processed(outcome.report_token)
    return _answer(ctx, ts, instance, outcome, acked)


def _answer(
    ctx: HeartbeatContext,
    ts: TSManager,
    instance: NodeInstance,
    outcome: HeartbeatOutcome,
    acked: int,
) -> pb.TSHeartbeatResponsePB:
    """Step 4 of the module docstring."""
    uuid = instance.permanent_uuid
    due = ctx.leading and not outcome.needs_reregister and ts.needs_full_report(uuid)
    turn = due and ctx.reports.turns.take(uuid, _now())
    if ctx.leading and not due:
        ctx.reports.turns.done(uuid)
    return pb.TSHeartbeatResponsePB(
        master_instance=ctx.master_instance,
        leader_master=ctx.leading,
        master_term=ctx.term,
        needs_reregister=outcome.needs_reregister,
        needs_full_tablet_report=turn,
        full_tablet_report_deferred=due and not turn,
        acked_report_sequence_number=acked,
        master_addresses=list(ctx.master_addresses),
        token_verifying_keys=list(ctx.token_keys) if ctx.leading else [],
        heartbeat_interval_ms=ctx.heartbeat_interval_ms,
    )


def _now() -> float:
    """The clock of full-report turns: the event loop's (monotonic)."""
    return asyncio.get_running_loop().time()
