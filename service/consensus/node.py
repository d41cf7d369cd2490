"""RaftNode: the one asyncio task that owns a RawNode, its store and its state machine.

Theory of operation
-------------------
Everything that touches the RawNode happens in `_run`, one loop iteration at a time:

  1. step every message the transport delivered since the last iteration;
  2. tick the core if the process's shared ticker fired since (ticker.py: all groups tick
     together, so their heartbeats leave in one write per peer);
  3. if no Ready is being persisted: finish the one that was (its fsync is done: send what
     waited for it, apply, advance), append the queued proposals as ONE batch, and start the
     next Ready: a leader sends its appends, the WAL records are encoded and written here (in
     the worker thread too when they are large), and the fdatasync runs in a worker thread
     (`syncer.py`) while this loop carries on. Applying takes turns with the process's other
     groups when it is given `apply_slice_s` (turns.py). A state machine that decodes large
     entries ahead (`DecodingStateMachine`) is handed each appended entry, and a Ready whose
     committed entries are still being decoded waits as during an fsync
     (docs/design/consensus.md#R11).

*Group commit, pipelined.* While a Ready's fdatasync runs, the loop does not wait for it: the
event loop keeps taking requests, and messages and proposals pile up (the core may be stepped
between `ready()` and `advance()`, rawnode.py). When the fsync completes, everything that
arrived meanwhile goes into the next Ready: one WAL write, one fdatasync, one append message
per follower, one acknowledgement back from each (`coalesce.py` merges what the core queued
per peer). At most one Ready is being persisted at a time, so nothing is acknowledged or
applied before it is durable here.

*Pacing.* A leader appends a new batch once its log has committed, and under load (batches of
8 and more) no sooner than 4 ms after the previous one (`batching.py`): a batch holds what
arrives in one commit round, and more under load, at the same per-batch cost. A commit-only
append (the new commit index for followers, no entries) is held until the next batch's appends
carry it, or the next tick: followers need it only to apply, which no client waits for.

Other coroutines talk to the task only through `_inbox`, `_proposals` and futures, so the core
needs no locks, and they wake the loop only when it has something to do (not for every message
or proposal that arrives during an fsync, or while proposals wait for a commit). `propose`
resolves when the entry is *applied*, with the state machine's result; if another entry was
committed at its index (a new leader overwrote it) it fails with `Aborted`: it definitely did
not take effect. If leadership is lost before that is known, the future stays pending until the
entry's fate is applied or the caller's deadline passes (then the outcome is unknown, which is
what DEADLINE_EXCEEDED means to a client). A proposal's deadline is checked at every tick
(`batching.Deadlines`), not with a timer of its own.

`read()` is a linearizable read barrier: a ReadIndex (or a lease), then wait until the state
machine has applied that index.

A write or fsync failure is fatal (never retry an fsync): the node stops, fails every waiter,
and `fatal` is set for the process to exit; it restarts from what is really on disk.

Shutdown order: stop accepting (closed flag), let the loop task finish the iteration under way,
wait for a persist still running in its worker thread, stop, fail waiters, close the WAL. The
task is not cancelled: a cancel would leave a persist running in its worker thread while the WAL
is closed under it, and on Python 3.11 `wait_for` swallows a cancel that races with the wakeup
event, so the task would never stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from service.common.errors import (
    Aborted,
    CasMismatch,
    ConfigChangeRejected,
    InvalidArgument,
    IOFatal,
    NotTheLeader,
    ServiceUnavailable,
    Timeout,
)
from service.consensus import syncer, ticker, turns
from service.consensus.batching import Deadlines, Pacer
from service.consensus.node_api import (
    AnchoredStateMachine,
    DecodingStateMachine,
    LeaderChange,
    NodeSettings,
    Sender,
    SlicedSnapshots,
    StateMachine,
    group_commit_stats,
)
from service.consensus.node_quiesce import NodeQuiescence
from service.consensus.quiesce import Quiescence
from service.consensus.raft_store import RaftStore, Recovered, StoreIOError
from service.consensus.snapshots import ConfigHistory, plan_snapshot
from service.consensus.wal import WalCorruption, WalIOError
from service.raft import (
    ConfigChange,
    ConfigChangeRefused,
    ConfigChangeType,
    Entry,
    EntryType,
    Message,
    MessageType,
    NodeId,
    ProposalDropped,
    RaftConfig,
    RaftOptions,
    RawNode,
    Ready,
    Role,
    Status,
    config_after,
)
from service.raft.coalesce import coalesce

__all__ = [
    "AnchoredStateMachine",
    "DecodingStateMachine",
    "LeaderChange",
    "NodeSettings",
    "RaftNode",
    "Sender",
    "StateMachine",
]

log = logging.getLogger(__name__)

_PERSIST_FREE = frozenset({MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESP})
"""Messages that promise nothing about the log, sent even while a Ready is being persisted
(`RawNode.take_messages`)."""

LEASE_FRACTION = 0.5
"""The leader lease of `RaftNode.read`, as a fraction of the election timeout."""
T = TypeVar("T")

WRITE_ON_LOOP_BYTES = 1 << 20
"""A Ready whose entries carry more than this is written to the WAL in the worker thread that
syncs it, not on the event loop (`_start_ready`): a tablet write may be tens of MiB."""


LONG_APPLY_BYTES = 256 << 10
"""Committed entries carrying more than this may hold the loop for a while to apply (a
10,000-tablet CreateTable in sys.catalog: 0.1-0.2 s of CPU, seconds on a starved host): a leader
tells its followers of their commit before it applies them (`_apply_ready`)."""


def _entry_bytes(rd: Ready) -> int:
    return sum(len(e.data) for e in rd.entries)


@dataclass(slots=True)
class _Persist:
    """A Ready being made durable: `done` resolves when its write (and fdatasync) is done, and
    the decoding ahead of its committed entries has ended (`RaftNode._decode_ahead`)."""

    ready: Ready
    done: asyncio.Future[Any]
    synced: bool
    started: float
    written: asyncio.Future[Any]
    """Resolves when the write (and fdatasync) alone is done."""
    apply_late: bool = False
    """A leader's Ready whose committed entries wait for their decoding: applied in
    `_finish_ready`, not before the fsync as a leader's otherwise are."""
    synced_at: float = 0.0
    """When the write and fdatasync ended (the fsync metrics count this, not the decoding)."""


def _synced_at(p: _Persist, _: asyncio.Future[Any]) -> None:
    p.synced_at = time.perf_counter()


class RaftNode:
    def __init__(
        self,
        *,
        group_id: str,
        uuid: NodeId,
        store: RaftStore,
        recovered: Recovered,
        state_machine: StateMachine | AnchoredStateMachine,
        transport: Sender,
        settings: NodeSettings,
        rng: random.Random | None = None,
        quiescence: Quiescence | None = None,
    ) -> None:
        self.group_id = group_id
        self.uuid = uuid
        self.store = store
        self.storage = recovered.storage
        self.sm = state_machine
        self.transport = transport
        self.settings = settings
        snap = recovered.applied_snapshot
        if snap is not None:
            state_machine.restore(snap.data)
        self.applied = snap.meta.index if snap is not None else 0
        self.applied_config: RaftConfig = snap.meta.config if snap else recovered.bootstrap_config
        self.last_snapshot_index = self.applied
        self._anchored = isinstance(state_machine, AnchoredStateMachine)
        """Snapshots are anchors to the state machine's own files, never sent (snapshots.py)."""
        self._sliced = isinstance(state_machine, SlicedSnapshots)
        """Snapshots are taken beside the loop (`_snapshotting`)."""
        self._snapshotting: asyncio.Task[None] | None = None
        """A snapshot being taken and the log compacted beside the loop: it holds Readies,
        proposals and applies as an fsync does, while heartbeats and their answers go on."""
        self._decoder = state_machine if isinstance(state_machine, DecodingStateMachine) else None
        self._decoding: dict[int, asyncio.Future[None]] = {}
        """Entries appended and still being decoded ahead of their apply, by index."""
        self._configs = ConfigHistory(self.applied, self.applied_config)
        for node, addr in recovered.addresses.items():
            transport.set_address(node, addr)
        opts = RaftOptions(
            id=uuid,
            election_tick=settings.election_ticks,
            heartbeat_tick=settings.heartbeat_ticks,
            election_jitter_tick=settings.election_jitter_ticks,
            max_election_tick=settings.max_election_ticks,
            lateness_half_life_tick=settings.lateness_half_life_ticks,
            pre_vote=settings.pre_vote,
            check_quorum=settings.check_quorum,
            lease_reads=settings.lease_reads,
            max_size_per_msg=settings.max_size_per_msg,
            max_inflight_msgs=settings.max_inflight_msgs,
            max_inflight_bytes=settings.max_inflight_bytes,
            applied=self.applied,
            send_snapshots=not self._anchored,
        )
        self.raw = RawNode(opts, self.storage, rng or random.Random(), recovered.bootstrap_config)
        self._inbox: list[Message] = []
        self._proposals: list[tuple[bytes, asyncio.Future[object]]] = []
        self._deadlines = Deadlines()
        self._control: list[Callable[[], None]] = []
        self._wakeup = asyncio.Event()
        self._waiting: dict[int, tuple[int, asyncio.Future[object]]] = {}
        self._reads: dict[bytes, asyncio.Future[int]] = {}
        self._read_index: dict[bytes, int] = {}
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._snapshot_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._read_seq = 0
        self._read_batch: asyncio.Future[int] | None = None
        """The ReadIndex batch new reads join until the loop issues it (`read`)."""
        self._read_inflight: bytes | None = None
        """The context of the ReadIndex round in flight, if any."""
        self._read_pending: Callable[[], None] | None = None
        """Issues the next batch once the round in flight completes."""
        self._read_issued_at = 0.0
        """Monotonic time the round in flight was issued (its heartbeats left after it)."""
        self._lease_until = 0.0
        """Monotonic time until which reads are served without a round (`read`); 0: none."""
        self._lease_s = (
            settings.election_ticks * settings.tick_interval_s * LEASE_FRACTION
            if settings.check_quorum
            else 0.0
        )
        self._ticked_at: float | None = None
        """Loop time of the last tick: a late one tells the core how late (`RawNode.tick`)."""
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.fatal: BaseException | None = None
        self.fatal_event = asyncio.Event()
        self.listeners: list[Callable[[LeaderChange], None]] = []
        self._status: Status | None = None  # built on demand, dropped at every iteration
        self._was_leader = False
        self._persisting: _Persist | None = None
        """The Ready whose fdatasync is running in a worker thread (at most one)."""
        self._tick_due = False
        self._pacer = Pacer(settings, self._wakeup.set)
        self._held: list[Message] = []
        """Commit-only appends of a leader, sent with its next appends or at the next tick."""
        self._syncer = syncer.shared()
        self._turns: turns.Turns | None = None
        """Slices of the loop shared with the process's other groups (set in `_run`)."""
        self._quiesce = NodeQuiescence(
            group_id=group_id,
            uuid=uuid,
            raw=self.raw,
            settings=settings,
            registry=quiescence if settings.quiesce_ticks > 0 else None,
            busy=self._busy,
            on_loop=self._on_loop,
        )
        """Quiescence and learner promotion (node_quiesce.py): whether ticks are ignored."""
        self.metrics: dict[str, float] = {
            "proposals": 0,
            "batches": 0,
            "fsyncs": 0,
            "fsync_seconds": 0.0,
            "fsync_entries": 0,
            "messages_sent": 0,
        }
        """Counters: proposals appended, in batches; fdatasyncs (of WAL records, or a Ready with
        a term/vote change or snapshot), their seconds and the entries they made durable (so
        fsync_entries / fsyncs is the group commit's size); messages handed to the transport."""

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.raw.config().voters == {self.uuid} and not self.raw.is_leader():
            # The only voter needs nobody's vote: it campaigns at once instead of waiting out
            # an election timeout with nobody to hear from (Kudu does the same for a
            # single-voter config). Safety never depends on when a node campaigns.
            self._control.append(self.raw.campaign)
        self._task = asyncio.create_task(self._run(), name=f"raft-{self.group_id}-{self.uuid}")
        self._quiesce.register(self)

    async def aclose(self) -> None:
        self._closed = True
        self._quiesce.unregister()
        if self._task is not None:
            self._wakeup.set()  # the loop sees the closed flag at its next iteration
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_all(ServiceUnavailable("node is shutting down"))
        self.store.close()

    # -- inputs from other coroutines ---------------------------------------------------------

    def step(self, messages: list[Message]) -> None:
        """Called by the transport; never blocks. During an fsync the messages wait for it
        (nothing stepped now could leave before it ends), so the loop is not woken for them."""
        if self._closed:
            return
        self._quiesce.wake_for(messages)
        self._inbox.extend(messages)
        if self._persisting is None and self._snapshotting is None:
            self._wakeup.set()

    def leader_term(self) -> int:
        """The term this node leads now; 0 when it is not the leader. The transport drops a
        leader's queued message of any other term instead of sending it late (transport.py)."""
        raw = self.raw
        return raw.term() if raw.is_leader() else 0

    # -- quiescence (quiesce.py: the node as the server's registry sees it) --------------------

    @property
    def quiesced(self) -> bool:
        """Whether ticks are ignored (an idle group's leader or caught-up follower)."""
        return self._quiesce.quiesced

    def members(self) -> frozenset[str]:
        """The other members of the current config (the peers a digest goes to)."""
        return self._quiesce.members()

    def wake(self, *, leader_suspect: bool = False) -> None:
        """Tick again. `leader_suspect`: the leader's server went silent, so count a full
        election timeout as passed (campaign within the jitter, vote for others)."""
        self._quiesce.wake(leader_suspect=leader_suspect)

    def peer_lost(self, peer: str) -> None:
        """`peer`'s server says it does not host this group (quiesce.py, "A lost replica"):
        wake, and count it as not heard from, as a quorum check does."""
        if not self._closed:
            self.wake()
            self._control.append(lambda: self.raw.forget_activity(NodeId(peer)))
            self._wakeup.set()

    def peer_gone(self, peer: str) -> None:
        """`peer`'s server closed or refused the connection (transport.py, `report_gone`): if
        it leads this group, stop stretching the election timeout (RawNode.leader_gone)."""
        if not self._closed and self.raw.leader() == peer:
            self._on_loop(lambda: self.raw.leader_gone(NodeId(peer)))

    def quiesce_follower(self, leader: str, term: int, commit: int) -> bool:
        """Stop ticking if this follows `leader` at `term` with its log up to `commit`, all
        committed, and nothing in hand: no messages or calls queued for the loop here, the
        rest is `NodeQuiescence.quiesce_follower`'s to check. A tick already due is dropped
        with it: the loop would otherwise run it, quiesced."""
        if self._closed or self._inbox or self._control:
            return False
        if not self._quiesce.quiesce_follower(leader, term, commit):
            return False
        self._tick_due = False
        return True

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run `fn` at the loop's next iteration, before its tick, and wake the loop."""
        self._control.append(fn)
        self._wakeup.set()

    # -- membership ---------------------------------------------------------------------------

    def config_members(self) -> frozenset[str]:
        """Every node of this group's latest and committed configs (voters and learners), this
        one included: who may send it Raft messages. (Not `members`, the peers a digest goes
        to.) Empty for a node that knows no config yet (a master joining
        empty), which accepts the leader that is about to send it one."""
        st = self.status()
        return frozenset(st.config.members | st.committed_config.members)

    def report_unreachable(self, peer: str) -> None:
        """Called by the transport when a send to `peer` failed."""
        if not self._closed:
            self.wake()
            self._control.append(lambda: self.raw.report_unreachable(NodeId(peer)))
            self._wakeup.set()

    def report_snapshot(self, peer: str, ok: bool) -> None:
        """The leader's snapshot for `peer` landed (`ok`: probe from the snapshot's index) or
        did not (probe from the peer's match). A peer waiting for a snapshot is sent nothing
        else, so a snapshot that never arrives (too large, lost) holds it until this is
        called; a tablet's leader calls it once it has had the tablet copied to the peer."""
        if not self._closed:
            self.wake()
            self._control.append(lambda: self.raw.report_snapshot(NodeId(peer), ok))
            self._wakeup.set()

    def snapshot_sent(self, peer: str) -> None:
        """Called by the transport once a snapshot for `peer` went out (report_snapshot ok)."""
        self.report_snapshot(peer, True)

    def _check_open(self) -> None:
        """Called first by every request for the loop's work, so it also ends quiescence."""
        self._quiesce.wake()
        if self.fatal is not None:
            raise IOFatal(f"node stopped after a storage failure: {self.fatal}")
        if self._closed:
            raise ServiceUnavailable("node is shutting down")

    def _not_leader(self) -> NotTheLeader:
        lead = self.raw.leader()
        return NotTheLeader(
            f"{self.uuid} is not the leader of {self.group_id}",
            leader_uuid=lead or None,
            leader_address=self.transport.address_of(lead) if lead else None,
        )

    def not_leader_error(self) -> NotTheLeader:
        """The error to answer a request that needs the leader, with the leader hint."""
        return self._not_leader()

    def is_promotable(self, node: str) -> bool:
        """Whether learner `node` was added to be promoted once caught up
        (docs/design/consensus.md#R4)."""
        return self._quiesce.is_promotable(node)

    async def propose(self, data: bytes, timeout: float | None = None) -> object:
        """Replicate `data`; returns the state machine's result once applied here.

        Raises `Timeout` (outcome unknown) once `timeout` has passed, checked at every tick."""
        self._check_open()
        if not self.raw.is_leader():
            raise self._not_leader()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        if timeout is not None:
            self._deadlines.add(fut, timeout)
        if not self._proposals and self._persisting is None and self._may_append():
            self._wakeup.set()  # otherwise the loop is awake already, or will be when it can
        self._proposals.append((data, fut))
        return await fut  # a cancelled caller cancels `fut`: the loop skips it

    @property
    def lease_s(self) -> float:
        """How long a confirmed leadership serves reads without a round (`read`); 0: never."""
        return self._lease_s

    async def read(self, timeout: float | None = None) -> int:
        """Linearizable read barrier: returns an applied index that reflects every write
        acknowledged before this call started.

        Lease: a round that a quorum acknowledged also proves that, by the time it was issued,
        every node of that quorum had heard from this leader; with check-quorum none of them
        will vote for another candidate within an election timeout of that (their timers never
        fire early, they count ticks of at least `tick_interval_s`). So for `LEASE_FRACTION` of
        an election timeout after the round was issued, measured on this process's monotonic
        clock, reads are served at once at the leader's commit index (once its term has a
        committed entry). The lease is dropped with leadership and never used during a
        leadership transfer (whose votes bypass that rule). It is wall-clock time, not ticks: a
        process paused longer than the lease (SIGSTOP, a stall) finds it expired when it
        resumes, and must confirm its leadership with a round, which a deposed leader fails.
        Clock drift between nodes only matters as a rate difference over the lease (half an
        election timeout): the margin covers any drift under 50%.

        Reads are batched (as etcd's and TiKV's ReadIndex users do): one ReadIndex round is in
        flight at a time, and every read that arrives meanwhile joins the next batch, issued
        when the round in flight completes, after all of its reads arrived; so its index covers
        every write acknowledged before any of them. A catalog serving thousands of lookups a
        second costs one heartbeat round per round trip to a majority, not one per lookup. A
        caller that times out leaves the batch to the others (the shared future is shielded)."""
        self._check_open()
        raw = self.raw
        if not raw.is_leader():
            raise self._not_leader()
        if (
            time.monotonic() < self._lease_until
            and not raw.transferring_leadership()
            and raw.committed_in_term()
        ):
            index = raw.commit_index()  # under the lease no other leader can have committed
            await self.wait_applied(index, timeout)
            return index
        fut = self._read_batch
        if fut is None or fut.done():
            fut = self._read_batch = asyncio.get_running_loop().create_future()
            # Retrieved here in case every waiter gave up (shield): no "never retrieved" noise.
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._read_seq += 1
            ctx = f"{self.uuid}:{self._read_seq}".encode()
            self._reads[ctx] = fut
            batch = fut

            def issue() -> None:
                if self._read_batch is batch:
                    self._read_batch = None  # later reads start the next batch
                if batch.done():  # failed already (leadership lost)
                    self._reads.pop(ctx, None)
                    self._read_issue_next()
                    return
                self._read_inflight = ctx
                self._read_issued_at = time.monotonic()
                try:
                    self.raw.read_index(ctx)
                except ProposalDropped:
                    self._reads.pop(ctx, None)
                    self._read_inflight = None
                    if not batch.done():
                        batch.set_exception(self._not_leader())

            if self._read_inflight is None and self._read_pending is None:
                self._control.append(issue)
                self._wakeup.set()
            else:
                self._read_pending = issue  # issued when the round in flight completes
        index = await self._wait(asyncio.shield(fut), timeout, "read")
        await self.wait_applied(index, timeout)
        return index

    async def wait_term_applied(self, timeout: float | None = None) -> None:
        """As leader, wait until an entry of this leader's own term (its no-op) is applied here:
        then every entry of earlier terms that will ever commit is applied too. A tablet's
        leader waits for this before it assigns hybrid timestamps, so the entries it inherited
        have moved its clock past theirs first (docs/design/tablets.md#R4)."""
        raw = self.raw
        if not raw.is_leader():
            raise self._not_leader()
        term = raw.term()
        if raw.term_at(self.applied) == term:
            return
        first = raw.last_index()
        while first > self.applied and raw.term_at(first - 1) == term:
            first -= 1
        await self.wait_applied(first, timeout)
        if not raw.is_leader() or raw.term() != term:
            # Leadership lost meanwhile, or lost and won again: the entries of the new term
            # are not known to be applied, so this leader must not act on them yet.
            raise self._not_leader()

    async def wait_applied(self, index: int, timeout: float | None = None) -> None:
        if self.applied >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, fut))
        await self._wait(fut, timeout, "apply")

    async def change_config(
        self,
        type: ConfigChangeType,
        node: NodeId,
        *,
        address: str | None = None,
        expected_index: int,
        timeout: float | None = None,
        promote: bool = True,
    ) -> int:
        """One membership change with compare-and-set; returns the new config's index.

        An ADD_LEARNER with `promote` is turned into a voter by the leader once caught up
        (Kudu's PRE_VOTER, docs/design/tablet_copy.md#R7); without it the learner stays a non-voter
        (a read replica)."""
        self._check_open()
        if type is ConfigChangeType.ADD_LEARNER and not address:
            raise InvalidArgument(f"adding {node} needs its address")
        ctx = json.dumps({"address": address or "", "promote": promote}).encode()
        cc = ConfigChange(type, node, expected_index, ctx)
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def issue() -> None:
            if fut.done():  # the caller gave up before the change was proposed: skip it
                return
            try:
                index, term = self.raw.propose_config_change(cc)
            except ProposalDropped:
                fut.set_exception(self._not_leader())
                return
            except ConfigChangeRefused as e:
                cls = CasMismatch if "stale config" in str(e) else ConfigChangeRejected
                fut.set_exception(cls(str(e)))
                return
            self._waiting[index] = (term, fut)

        self._control.append(issue)
        self._wakeup.set()
        await self._wait(fut, timeout, "config change")
        return self.applied_config.index

    async def transfer_leadership(self, target: NodeId, timeout: float = 5.0) -> None:
        self._check_open()
        if not self.raw.is_leader():
            raise self._not_leader()
        if target not in self.raw.config().voters:
            raise InvalidArgument(f"{target} is not a voter of {self.group_id}")
        self._control.append(lambda: self.raw.transfer_leader(target))
        self._wakeup.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.raw.leader() == target:
                return
            await asyncio.sleep(self.settings.tick_interval_s)
        raise Timeout(f"leadership did not move to {target} within {timeout}s")

    def status(self) -> Status:
        """The core's status (built when first asked for after the loop last changed it)."""
        st = self._status
        if st is None:
            st = self._status = self.raw.status()
        return st

    async def _wait(self, fut: asyncio.Future[T], timeout: float | None, what: str) -> T:
        # asyncio.timeout (not wait_for + shield): no extra task or futures per call. A
        # timed-out or cancelled waiter cancels `fut`; the loop skips futures already done.
        # (Proposals, the hot path, use the tick's deadline sweep instead.)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise Timeout(f"{what} did not complete within {timeout}s; outcome unknown") from None

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # The process's groups tick together (ticker.py): their heartbeats leave as one write.
        stop_ticking = ticker.shared(self.settings.tick_interval_s).add(self._tick_timer)
        if self.settings.apply_slice_s > 0:
            self._turns = turns.shared(self.settings.apply_slice_s)
        try:
            while not self._closed:
                if not self._has_work():
                    await self._wakeup.wait()
                self._wakeup.clear()
                inbox, self._inbox = self._inbox, []
                for m in inbox:
                    self.raw.step(m)
                control, self._control = self._control, []
                for fn in control:
                    fn()
                if self._tick_due:
                    self._tick_due = False
                    self._flush_held()
                    self._deadlines.expire(loop.time())
                    now = loop.time()
                    last, self._ticked_at = self._ticked_at, now
                    late = 0 if last is None else int((now - last) / self.settings.tick_interval_s)
                    self.raw.tick(late_ticks=late - 1)
                    self._quiesce.after_tick(self.applied)
                if self._snapshotting is not None:
                    if not self._snapshotting.done():
                        early = self.raw.take_messages(_PERSIST_FREE)  # as during an fsync
                        if early:
                            self._send(early, hold_commit_only=True)
                        self._status = None
                        continue
                    job, self._snapshotting = self._snapshotting, None
                    job.result()  # a storage failure stops the node, as a failed fsync does
                if self._persisting is not None:
                    if not self._persisting.done.done():
                        # Heartbeats and their answers go out now, not after the fsync: a
                        # disk that stalls for longer than an election timeout (seen at
                        # 110,000 tablets, three masters sharing one disk) otherwise
                        # silenced every member at once, and the group re-elected.
                        early = self.raw.take_messages(_PERSIST_FREE)
                        if early:
                            self._send(early, hold_commit_only=True)
                        self._status = None
                        continue
                    await self._finish_ready()
                if self._may_propose():
                    self._propose_batch()
                while (
                    self._persisting is None and self._snapshotting is None and self.raw.has_ready()
                ):
                    await self._start_ready(self.raw.ready())
                if self._persisting is None and self._snapshot_waiters:
                    await self._maybe_snapshot()
                self._status = None
        except asyncio.CancelledError:
            raise
        except (WalIOError, StoreIOError, WalCorruption, OSError) as e:
            log.critical("%s/%s: storage failure, stopping: %s", self.group_id, self.uuid, e)
            self.fatal = e
            self._fail_all(IOFatal(f"storage failure: {e}"))
            self.fatal_event.set()
        except Exception as e:  # a bug: stop loudly rather than run on with broken state
            log.exception("%s/%s: raft loop crashed", self.group_id, self.uuid)
            self.fatal = e
            self._fail_all(IOFatal(f"raft loop crashed: {e!r}"))
            self.fatal_event.set()
        finally:
            stop_ticking()
            self._pacer.close()
            if self._persisting is not None:
                # Never return (and let the store be closed) with a write still in its thread;
                # a decoding ahead is not waited for (nothing will apply what it decodes).
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._persisting.written)
            if self._snapshotting is not None:  # nor with a compaction in its thread
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._snapshotting)

    def _tick_timer(self) -> None:
        if self._quiesce.quiesced:
            return
        self._tick_due = True
        self._wakeup.set()

    def _busy(self) -> bool:
        return bool(
            self._proposals
            or self._waiting
            or self._reads
            or self._held
            or self._snapshot_waiters
            or self._persisting is not None
            or self._snapshotting is not None
        )

    def _has_work(self) -> bool:
        """Whether the loop has something to do before the next tick. While an fsync runs,
        only its end or a control call is: messages and proposals wait for it."""
        if self._control or self._tick_due:
            return True
        if self._snapshotting is not None:
            return self._snapshotting.done()
        if self._persisting is not None:
            return self._persisting.done.done()
        return bool(self._inbox) or self._may_propose()

    def _may_append(self) -> bool:
        return self._pacer.may_append(self.raw)

    def _may_propose(self) -> bool:
        """Whether to append the queued proposals now: not during an fsync (they join the next
        Ready), and on a leader when the pacer says so (batching.py) or a full batch is
        queued; on a node that is no longer the leader at once, so that they fail at once."""
        if not self._proposals or self._persisting is not None or self._snapshotting is not None:
            return False
        return len(self._proposals) >= self.settings.max_batch or self._may_append()

    def _propose_batch(self) -> None:
        batch = self._proposals[: self.settings.max_batch]
        self._proposals = self._proposals[self.settings.max_batch :]
        if self._proposals:
            self._wakeup.set()
        # A proposal whose caller gave up (timed out, cancelled) is not appended at all.
        batch = [(d, fut) for d, fut in batch if not fut.done()]
        if not batch:
            return
        try:
            first, term = self.raw.propose_batch([d for d, _ in batch])
        except ProposalDropped:
            err = self._not_leader()
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        for i, (_, fut) in enumerate(batch):
            self._waiting[first + i] = (term, fut)
        self.metrics["proposals"] += len(batch)
        self.metrics["batches"] += 1
        self._pacer.appended(len(batch))

    async def _start_ready(self, rd: Ready) -> None:
        """etcd-io/raft's order: persist, send, apply, advance. A leader (send_before_persist)
        sends its appends first, so followers write while it writes, and applies what is
        already committed before waiting for its own fsync: those entries came in earlier
        Readies, durable here already (an entry cannot commit before the Ready that sends its
        appends, and this one was taken only after the previous one's fsync); the leader
        counts itself toward a commit only in `advance` (docs/design/consensus.md#R1). The
        fdatasync runs in a worker thread; `_finish_ready` completes the Ready once it is done."""
        self._learn_addresses(rd.entries)
        decoding = self._decode_ahead(rd)
        if rd.send_before_persist:
            self._send(rd.messages, hold_commit_only=True)
            if not decoding:
                await self._apply_ready(rd)
        store = self.store
        job: Callable[[], None] | None = None
        if store.writes_metadata(rd) or _entry_bytes(rd) > WRITE_ON_LOOP_BYTES:
            # cmeta/snapshot fsyncs, or a large write (copying it into the page cache takes
            # a while on a busy disk): all off-loop.
            job = functools.partial(store.persist, rd)
        elif store.write(rd):  # WAL records, written here; only the fdatasync is left
            job = store.sync
        started = time.perf_counter()
        done: asyncio.Future[Any]
        if job is None:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
        else:
            done = self._syncer.submit(job)
            done.add_done_callback(self._persisted)
        synced = done
        apply_late = rd.send_before_persist and bool(decoding)
        if decoding:
            # Heartbeats and their answers go on meanwhile, as during an fsync (`_run`).
            done = asyncio.gather(done, *decoding)
            done.add_done_callback(self._persisted)
        self._persisting = _Persist(rd, done, job is not None, started, synced, apply_late)
        if job is not None:
            synced.add_done_callback(functools.partial(_synced_at, self._persisting))
        if job is None and not decoding:
            await self._finish_ready()

    def _decode_ahead(self, rd: Ready) -> list[asyncio.Future[None]]:
        """Hand the state machine the entries this Ready appends, to decode before they
        commit, and return the decodings its committed entries still wait for
        (docs/design/consensus.md#R11). Those hold the Ready as its fsync does: the loop goes on
        stepping messages and sending heartbeats and their answers, and applies once they end,
        so a large entry's decoding never holds the loop in one piece."""
        if self._decoder is None:
            return []
        for e in rd.entries:
            if e.type is EntryType.NORMAL and e.data:
                fut = self._decoder.decode_ahead(e.index, e.data)
                if fut is None:
                    self._decoding.pop(e.index, None)  # an overwritten entry's decoding
                else:
                    self._decoding[e.index] = fut
        if not self._decoding:
            return []
        waits = []
        for e in rd.committed_entries:
            fut = self._decoding.pop(e.index, None)
            if fut is not None and not fut.done():
                waits.append(fut)
        return waits

    def _persisted(self, _: asyncio.Future[Any]) -> None:
        self._wakeup.set()

    async def _finish_ready(self) -> None:
        p = self._persisting
        assert p is not None and p.done.done()
        self._persisting = None
        p.done.result()  # a storage failure stops the node (raised into `_run`)
        rd = p.ready
        if p.synced:
            m = self.metrics
            m["fsyncs"] += 1
            m["fsync_seconds"] += (p.synced_at or time.perf_counter()) - p.started
            m["fsync_entries"] += len(rd.entries)
        RaftStore.apply_to_memory(self.storage, rd)
        if not rd.send_before_persist:
            # 2. send, only now that what the messages promise is durable; 3. apply.
            self._send(rd.messages, hold_commit_only=False)
            await self._apply_ready(rd)
        elif p.apply_late:
            await self._apply_ready(rd)
        self.raw.advance(rd)
        self._wake_applied()
        await self._maybe_snapshot()

    def _send(self, messages: list[Message], *, hold_commit_only: bool) -> None:
        """Hand `messages` to the transport, with any held commit-only appends merged in. With
        `hold_commit_only` (a leader's own Ready), messages that are all appends without
        entries are held instead, for the next batch's appends or the next tick."""
        if self._held:
            messages = coalesce(self._held + messages, self.settings.max_size_per_msg)
            self._held = []
        if not messages:
            return
        if hold_commit_only and all(m.type is MessageType.APP and not m.entries for m in messages):
            self._held = messages
            return
        self.metrics["messages_sent"] += len(messages)
        self.transport.send(self.group_id, messages)

    def _flush_held(self) -> None:
        if self._held:
            self._send([], hold_commit_only=False)

    async def _apply_ready(self, rd: Ready) -> None:
        long_apply = sum(len(e.data) for e in rd.committed_entries) > LONG_APPLY_BYTES
        if long_apply:
            # The commit-only appends held for the next tick carry these entries' commit: sent
            # now, and given one loop turn to be written (they, or appends a tick just sent,
            # would otherwise wait in the transport's queue for the whole apply), the followers
            # apply alongside this leader instead of ticking toward an election while it is
            # silent (docs/design/consensus.md#R11). A follower's answers go out the same way.
            self._flush_held()
            await asyncio.sleep(0)
        if rd.soft_state is not None:
            ss = rd.soft_state
            self._on_soft_state(ss.leader, ss.term, ss.role)
        if rd.snapshot is not None:
            log.info(
                "%s/%s: installing snapshot at index %d from the leader",
                self.group_id,
                self.uuid,
                rd.snapshot.meta.index,
            )
            self.sm.restore(rd.snapshot.data)
            self.applied = rd.snapshot.meta.index
            self.applied_config = rd.snapshot.meta.config
            self.last_snapshot_index = self.applied
            self._configs.reset(self.applied, self.applied_config)
            for index in [i for i in self._decoding if i <= self.applied]:
                del self._decoding[index]  # never applied: the snapshot holds them
            for index in [i for i in self._waiting if i <= self.applied]:
                _, fut = self._waiting.pop(index)
                if not fut.done():
                    fut.set_exception(Aborted("outcome lost in a snapshot install; retry"))
        started = time.monotonic()
        for e in rd.committed_entries:
            if self._turns is not None and e.data:
                # Between entries, never within one: each applies whole, in log order, by this
                # task alone (turns.py); only when the loop's slice is used up does this yield.
                await self._turns.turn()
            self._apply(e)
        if long_apply:
            # The peers apply the same entries meanwhile, and are as silent for as long: that
            # silence stretches the timeouts and restarts a leader's check-quorum period
            # (`Raft.held_applying`, docs/design/consensus.md#R11).
            held = int((time.monotonic() - started) / self.settings.tick_interval_s)
            self.raw.held_applying(held)
        for rs in rd.read_states:
            read = self._reads.pop(rs.context, None)
            if read is not None and not read.done():
                read.set_result(rs.index)
            if rs.context == self._read_inflight:
                self._read_inflight = None
                if self._lease_s and not self.raw.transferring_leadership():
                    self._lease_until = self._read_issued_at + self._lease_s
                self._read_issue_next()
        self._wake_applied()

    def _learn_addresses(self, entries: list[Entry]) -> None:
        for e in entries:
            if e.type is EntryType.CONFIG:
                cc = ConfigChange.decode(e.data)
                if cc.context:
                    ctx = json.loads(cc.context)
                    if ctx.get("address"):
                        self.transport.set_address(cc.node, ctx["address"])
                        self.store.add_addresses({cc.node: ctx["address"]})
                    if cc.type is ConfigChangeType.ADD_LEARNER and ctx.get("promote"):
                        self._quiesce.promote_when_caught_up(cc.node)

    def _apply(self, e: Entry) -> None:
        result: object = None
        if e.type is EntryType.NORMAL and e.data:
            result = self.sm.apply(e.index, e.data)
        elif e.type is EntryType.CONFIG:
            self.applied_config = config_after(self.applied_config, e.type, e.data, e.index)
            self._quiesce.applied_change(ConfigChange.decode(e.data))
            self._configs.applied(e.index, self.applied_config)
            result = self.applied_config.index
            log.info("%s/%s: config %s", self.group_id, self.uuid, _fmt_config(self.applied_config))
        self.applied = e.index
        waiting = self._waiting.pop(e.index, None)
        if waiting is not None:
            term, fut = waiting
            if fut.done():
                return
            if term == e.term:
                fut.set_result(result)
            else:
                fut.set_exception(
                    Aborted(f"entry {e.index} was overwritten by a new leader; not applied")
                )

    def _wake_applied(self) -> None:
        if not self._applied_waiters:
            return
        still = []
        for index, fut in self._applied_waiters:
            if index <= self.applied:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((index, fut))
        self._applied_waiters = still

    def _read_issue_next(self) -> None:
        """Queue the batch that waited for the round in flight (issued on the next loop turn)."""
        pending, self._read_pending = self._read_pending, None
        if pending is not None:
            self._control.append(pending)
            self._wakeup.set()

    def _reset_reads(self, err: Exception) -> None:
        for read in self._reads.values():
            if not read.done():
                read.set_exception(err)
        self._reads.clear()
        self._read_inflight = self._read_pending = None
        self._lease_until = 0.0

    def _on_soft_state(self, leader: NodeId, term: int, role: Role) -> None:
        was_leader, self._was_leader = self._was_leader, role is Role.LEADER
        self._status = None
        if was_leader and role is not Role.LEADER:
            self._reset_reads(self._not_leader())
        lost = self.raw.take_quorum_lost()
        if lost is not None:
            # A step-down nobody provoked: how long each follower had been silent tells a
            # dead one (silent for ever) from a starved group (all a little over the period).
            log.warning(
                "%s/%s: stepping down in term %d: no quorum heard in the last %d ticks; "
                "last heard: %s",
                self.group_id,
                self.uuid,
                lost.term,
                lost.period,
                ", ".join(
                    f"{peer} {'never' if ago is None else f'{ago} ticks ago'}"
                    for peer, ago in lost.silent
                ),
            )
        log.info(
            "%s/%s: term %d, role %s, leader %s",
            self.group_id,
            self.uuid,
            term,
            role.value,
            leader or "-",
        )
        change = LeaderChange(leader, term, role)
        for fn in list(self.listeners):
            try:
                fn(change)
            except Exception:
                log.exception("leader-change listener failed")

    async def snapshot_now(self, timeout: float | None = None) -> int:
        """Take a snapshot of what is applied now, before the next periodic one; its index.

        For adding a member that was never in the bootstrap config (a joining master): the
        leader sends such a peer a snapshot rather than the log from index 1, so it learns
        the membership (`Raft._send_append`), and that needs a snapshot to exist."""
        self._check_open()
        target = self.applied
        if self.last_snapshot_index >= target and target > 0:
            return self.last_snapshot_index
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._snapshot_waiters.append((target, fut))
        self._wakeup.set()
        await self._wait(fut, timeout, "snapshot")
        return self.last_snapshot_index

    async def _maybe_snapshot(self) -> None:
        """Take a snapshot if one is due (snapshots.py) and drop the log it covers; beside the
        loop for a state machine with `SlicedSnapshots` (`_snapshotting`)."""
        if self._snapshotting is not None:
            return  # one at a time; the next is planned when it ends
        # `_anchored` was decided once: isinstance on a Protocol is slow for every Ready.
        anchor = cast(AnchoredStateMachine, self.sm) if self._anchored else None
        plan = plan_snapshot(
            anchored=self._anchored,
            applied=self.applied,
            durable=anchor.durable_index() if anchor is not None else 0,
            last_snapshot=self.last_snapshot_index,
            interval=self.settings.snapshot_interval_entries,
            waiting_for=max((i for i, _ in self._snapshot_waiters), default=0),
        )
        if plan is None:
            return
        if self._sliced:
            job = asyncio.create_task(self._snapshot(plan.index), name=f"snapshot-{self.group_id}")
            job.add_done_callback(self._persisted)  # wakes the loop
            self._snapshotting = job
            return
        await self._snapshot(plan.index, anchor)

    async def _snapshot(self, index: int, anchor: AnchoredStateMachine | None = None) -> None:
        if anchor is not None:
            data = anchor.anchor(index)
        elif self._sliced:
            data = await cast(SlicedSnapshots, self.sm).snapshot_sliced()
        else:
            data = cast(StateMachine, self.sm).snapshot()
        snap = self.storage.create_snapshot(index, self._configs.at(index), data)
        # The in-memory log is compacted here, not in the worker: with a snapshot taken
        # beside the loop, the loop reads it meanwhile (stepping a follower's appends).
        upto = await asyncio.to_thread(
            self.store.compact, None, snap, self.settings.snapshot_catchup_entries
        )
        RaftStore.compact_memory(self.storage, upto)
        self.last_snapshot_index = index
        self._configs.snapshotted(index)
        if not self._anchored:  # anchors follow every flush of a tablet: too many to log
            log.info("%s/%s: snapshot at %d (%d bytes)", self.group_id, self.uuid, index, len(data))
        still = []
        for target, fut in self._snapshot_waiters:
            if target > index:
                still.append((target, fut))
            elif not fut.done():
                fut.set_result(None)
        self._snapshot_waiters = still

    def config_at(self, index: int) -> RaftConfig:
        """The applied membership as of `index`, from the last snapshot's index on (a tablet
        copy's image is taken at its flushed index, below what is applied)."""
        return self._configs.at(index)

    def _fail_all(self, err: Exception) -> None:
        for _, fut in self._proposals:
            if not fut.done():
                fut.set_exception(err)
        self._proposals.clear()
        for _, fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self._waiting.clear()
        self._reset_reads(err)
        for _, f in self._applied_waiters + self._snapshot_waiters:
            if not f.done():
                f.set_exception(err)
        self._applied_waiters.clear()
        self._snapshot_waiters.clear()
        self._deadlines.clear()
        self._held.clear()

    def stats(self) -> str:
        """One line on how well commits are grouped (logged at shutdown by the demo server)."""
        return group_commit_stats(self.metrics)


def _fmt_config(c: RaftConfig) -> str:
    learners = f" learners {sorted(c.learners)}" if c.learners else ""
    return f"#{c.index} voters {sorted(c.voters)}{learners}"
