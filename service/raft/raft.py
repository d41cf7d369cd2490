"""The Raft state machine: elections, replication, membership, reads (pure, deterministic).

Theory of operation
-------------------
`Raft` is a deterministic function of the messages it is stepped with, the ticks it is given
and the injected `random.Random` (for election timeouts). It never does I/O: outgoing messages
accumulate in `self.msgs`, new log entries in the unstable part of `self.log`, and `RawNode`
packages them into a `Ready` for the caller (see `types.Ready` for the processing order that
makes this safe: persist, then send, then apply; a leader may send and apply before its own
write is durable, and counts itself toward a commit only after it, `on_persisted`:
docs/design/consensus.md#R1).

Elections (Raft §5.2, thesis §9.6): followers that miss the leader for a randomized timeout
in [election_tick, 2*election_tick) first run a *pre-vote* (a trial election at term+1 that
changes no state), and only if a quorum would vote for them start a real election. With
*check-quorum* a leader steps down when it has not heard from a quorum within an election
timeout (the longest one a follower may use, when timeouts stretch: `check_quorum_period`), and
followers ignore votes while they have a live leader ("leader stickiness"), so a
partitioned or removed node cannot depose a healthy leader. Both timeouts stretch while a live
group's messages arrive late (`lateness.py`, off unless `max_election_tick` is set). Campaigning
and voting live in `election.py`.

Commit (Figure 8): a leader only commits entries of its own term by counting replicas; earlier
entries commit indirectly. It appends an empty no-op on election so that happens promptly.

Membership (thesis §4.1, docs/design/consensus.md#R4): one server at a time. The effective
configuration is the latest one in the log, committed or not, and a node reverts when that entry is
truncated. A leader accepts a change only when no other is uncommitted (including before its own
no-op commits: the single-server bug fix from the raft-dev list), and only if it names the index of
the committed config it replaces (compare-and-set). New members join as learners and are
promoted by a later change once caught up. Removing or demoting the current leader is refused:
transfer leadership first (Kudu's rule).

Reads (thesis §6.4): ReadIndex records the commit index, confirms leadership with a heartbeat
round, and releases a ReadState once a quorum answered; the caller serves the read after
applying up to that index. An optional lease serves it at once while a quorum acknowledged a
heartbeat sent less than `election_tick - 1` ticks ago (followers ignore votes for a full
election timeout after hearing from the leader, so no other leader can exist in that window).
The bookkeeping lives in `reads.py`.

`election.py` and `reads.py` see this core only through the interfaces they declare
(`election.ElectionCore`, `reads.ReadCore`: typing Protocols listing exactly the state and the
public methods they use), which `Raft` implements; they never import this module, so the
dependency runs one way, from here to them.

`RawNode` hands the caller the messages of a Ready coalesced (`coalesce.py`): one append and one
acknowledgement per peer where the core queued several.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from service.raft import election, reads
from service.raft.lateness import DEFAULT_HALF_LIFE_TICK, Lateness
from service.raft.log import RaftLog
from service.raft.progress import Inflights, Progress, ProgressState
from service.raft.storage import Compacted, Storage, Unavailable, entries_size
from service.raft.types import (
    NO_NODE,
    ConfigChange,
    ConfigChangeType,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    NodeId,
    RaftConfig,
    ReadState,
    Role,
    Snapshot,
    SoftState,
)


@dataclass(frozen=True, slots=True)
class RaftOptions:
    id: NodeId
    election_tick: int = 10
    heartbeat_tick: int = 1
    election_jitter_tick: int | None = None
    """Randomized timeout is election_tick + [0, jitter); None means election_tick (etcd)."""
    election_backoff: bool = True
    """Widen the jitter after each election this node started and no leader followed
    (`Raft._draw_election_timeout`); False: every draw uses the configured jitter (etcd)."""
    max_election_tick: int = 0
    """Longest the election timeout may stretch to while peers' messages arrive late
    (lateness.py), and a leader's check-quorum period (`Raft.check_quorum_period`); at or
    below election_tick: never stretched."""
    lateness_half_life_tick: int = DEFAULT_HALF_LIFE_TICK
    """How long the lateness that stretches the timeouts is remembered (lateness.py)."""
    pre_vote: bool = True
    check_quorum: bool = True
    max_size_per_msg: int = 1 << 20
    max_inflight_msgs: int = 256
    max_inflight_bytes: int = 16 << 20
    max_committed_bytes_per_ready: int | None = 16 << 20
    lease_reads: bool = False
    applied: int = 0
    """Index the caller's state machine has applied already (on restart)."""
    send_snapshots: bool = True
    """False for a group whose snapshots carry no state (an anchored state machine: a tablet's
    rows live in its own files, node.py): a follower that needs entries the leader no longer
    keeps is not sent a snapshot. It is held in SNAPSHOT state, sent nothing but heartbeats,
    until the caller has given it the state some other way (a tablet copy,
    docs/design/consensus.md#R10) and reports that with `report_snapshot`."""

    def validate(self) -> None:
        if not self.id:
            raise ValueError("raft id must not be empty")
        if self.heartbeat_tick <= 0:
            raise ValueError(f"heartbeat_tick must be > 0, got {self.heartbeat_tick}")
        if self.election_tick <= self.heartbeat_tick:
            raise ValueError(
                f"election_tick ({self.election_tick}) must exceed heartbeat_tick "
                f"({self.heartbeat_tick})"
            )
        if self.max_inflight_msgs <= 0:
            raise ValueError(f"max_inflight_msgs must be > 0, got {self.max_inflight_msgs}")


@dataclass(frozen=True, slots=True)
class QuorumLost:
    """Why a leader stepped down at a quorum check (`Raft.quorum_lost`): the check-quorum period
    in ticks, stretched or not, and for each other voter how many ticks ago it was last heard
    (None: not since this node became leader). For the shell to log: a step-down that nobody
    provoked is then told from a dead follower (one silent for ever) or a starved group (all
    silent for a little over the period)."""

    term: int
    period: int
    silent: tuple[tuple[NodeId, int | None], ...]


class ProposalDropped(Exception):
    """The proposal was not appended: not the leader, or a leadership transfer is running."""

    def __init__(self, message: str, leader: NodeId = NO_NODE) -> None:
        super().__init__(message)
        self.leader = leader


class ConfigChangeRefused(Exception):
    """A membership change was refused: stale expected index (CAS), one already pending, or
    an invalid change for the current config."""


class Raft:
    """Mutable Raft state for one node of one group. Owned by exactly one `RawNode`.

    Implements `election.ElectionCore` and `reads.ReadCore` (checked by mypy wherever it is
    passed to those modules' functions)."""

    def __init__(
        self,
        options: RaftOptions,
        storage: Storage,
        rng: random.Random,
        bootstrap_config: RaftConfig | None = None,
    ) -> None:
        options.validate()
        self.id = options.id
        self.opts = options
        self.rng = rng
        self.log = RaftLog(storage, options.max_committed_bytes_per_ready)
        hs, snap_config = storage.initial_state()

        self.term = hs.term
        self.vote = hs.vote
        self.lead = NO_NODE
        self.state = Role.FOLLOWER
        self.msgs: list[Message] = []
        self.read_states: list[ReadState] = []
        self.votes: dict[NodeId, bool] = {}
        self.prs: dict[NodeId, Progress] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = options.election_tick
        self.campaigns_without_leader = 0
        """Elections this node started since it last heard from a leader: each widens the
        jitter of its next timeout (`_draw_election_timeout`)."""
        self.lateness = Lateness(
            options.heartbeat_tick,
            options.election_tick,
            options.max_election_tick,
            options.lateness_half_life_tick,
        )
        """How late peers' messages arrive: stretches the timeouts (lateness.py)."""
        self.tick_count = 0
        self.quorum_lost: QuorumLost | None = None
        """Set when this leader steps down at a quorum check; the shell takes it to log."""
        self.lead_transferee = NO_NODE
        self.last_transfer_tick = -(10**9)
        self.pending_conf_index = 0
        self.reads = reads.ReadIndexQueue()

        # Membership: committed config plus uncommitted config entries in log order.
        boot = bootstrap_config or RaftConfig(frozenset())
        self.bootstrap_members = boot.voters | boot.learners
        """The config before entry 1 (not itself an entry): `_send_append` needs it."""
        base = snap_config or bootstrap_config or RaftConfig(frozenset())
        self.committed_config = base
        self.pending_configs: list[tuple[int, RaftConfig]] = []
        self.config = base
        self.config_grounded = bool(base.voters or base.learners)
        """Whether this node's config rests on a known base (a bootstrap config or a
        snapshot's). A node that started with none and replayed membership changes from
        index 1 applied them to an empty config and may believe in a quorum of itself: it
        never campaigns until a snapshot gives it the real config (`promotable`)."""
        if hs.commit:
            if not (self.log.committed <= hs.commit <= self.log.last_index()):
                raise ValueError(
                    f"hard state commit {hs.commit} outside log "
                    f"[{self.log.committed}, {self.log.last_index()}]"
                )
            self.log.committed = hs.commit
        self._scan_configs(self.log.first_index())
        self._commit_configs()
        applied = max(options.applied, self.log.first_index() - 1)
        if applied:
            self.log.applied_to(min(applied, self.log.committed))
        self._reconfigure(self._effective_config())
        self.become_follower(self.term, NO_NODE)

    # -- small helpers -----------------------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.role(), self.term)

    def role(self) -> Role:
        if self.state in (Role.LEADER, Role.CANDIDATE, Role.PRE_CANDIDATE):
            return self.state
        if self.id in self.config.voters:
            return Role.FOLLOWER
        if self.id in self.config.learners:
            return Role.LEARNER
        return Role.NON_PARTICIPANT

    def promotable(self) -> bool:
        return self.config_grounded and self.id in self.config.voters

    def send_to(self, type: MessageType, to: NodeId, **fields: object) -> None:
        """Queue a message from this node to `to`, at its current term unless `term` is given
        (the next Ready hands it to the caller)."""
        fields.setdefault("term", self.term)
        self.msgs.append(Message(type=type, to=to, frm=self.id, **fields))  # type: ignore[arg-type]

    # -- membership --------------------------------------------------------------------------

    def _effective_config(self) -> RaftConfig:
        return self.pending_configs[-1][1] if self.pending_configs else self.committed_config

    def _scan_configs(self, from_index: int) -> None:
        """Entries from `from_index` on were (re)written: rebuild the uncommitted configs."""
        self.pending_configs = [(i, c) for i, c in self.pending_configs if i < from_index]
        lo = max(from_index, self.log.first_index(), self.committed_config.index + 1)
        last = self.log.last_index()
        current = self._effective_config()
        while lo <= last:
            batch = self.log.slice(lo, last + 1, 8 << 20)
            for e in batch:
                if e.type is EntryType.CONFIG:
                    current = ConfigChange.decode(e.data).apply_to(current, e.index)
                    self.pending_configs.append((e.index, current))
            lo = batch[-1].index + 1

    def _commit_configs(self) -> None:
        """Move configs at or below the commit index into `committed_config`."""
        while self.pending_configs and self.pending_configs[0][0] <= self.log.committed:
            self.committed_config = self.pending_configs.pop(0)[1]

    def _log_written(self, first_index: int, plain: bool = False) -> None:
        """Entries from `first_index` on were appended or replaced. `plain`: a batch of NORMAL
        entries appended after the last one (proposals): the rescan would drop no pending
        config (none sits at a new index) and find none, so it is skipped."""
        if plain and (not self.pending_configs or self.pending_configs[-1][0] < first_index):
            return
        before = self.config
        self._scan_configs(first_index)
        after = self._effective_config()
        if after != before:
            self._reconfigure(after)

    def _commit_changed(self) -> None:
        self._commit_configs()
        reads.on_commit(self)

    def _reconfigure(self, config: RaftConfig) -> None:
        self.config = config
        last = self.log.last_index()
        for node in list(self.prs):
            if node not in config.members:
                del self.prs[node]
        for node in sorted(config.members):  # sorted: a seed must replay in any process
            pr = self.prs.get(node)
            if pr is None:
                pr = Progress(
                    match=0,
                    next=last + 1,
                    inflights=Inflights(self.opts.max_inflight_msgs, self.opts.max_inflight_bytes),
                )
                if node == self.id:
                    pr.match = last
                self.prs[node] = pr
            pr.is_learner = node in config.learners
        if self.state is Role.LEADER:
            if self.lead_transferee and self.lead_transferee not in config.voters:
                self._abort_transfer()
            if self.id not in config.voters:
                # Unreachable through this node's own proposals (removing the leader is
                # refused); kept as a guard for configs appended by a previous leader.
                self.become_follower(self.term, NO_NODE)
                return
            self.maybe_commit()  # a smaller quorum may already hold more entries
        if self.state in (Role.CANDIDATE, Role.PRE_CANDIDATE) and not self.promotable():
            self.become_follower(self.term, NO_NODE)

    # -- state transitions -------------------------------------------------------------------

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NO_NODE
        self.lead = NO_NODE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.lateness.forget()
        self._draw_election_timeout()
        self._abort_transfer()
        self.votes = {}
        last = self.log.last_index()
        for node, pr in self.prs.items():
            pr.reset_state(ProgressState.PROBE)
            pr.match = self.persisted_index() if node == self.id else 0
            pr.next = last + 1
            pr.recent_active = False
            pr.lease_tick = -(10**9)
        self.pending_conf_index = 0
        self.reads.clear()

    def _draw_election_timeout(self) -> None:
        """Draw the next election timeout: election_tick plus a random part of the jitter.

        The jitter doubles with each election this node started since it last heard from a
        leader, up to a whole election timeout (etcd's range; Kudu backs off the same way
        after failed elections). A short jitter makes a failover quick, but with few distinct
        draws (500 ms of 100 ms ticks is five) two candidates often start within one vote's
        round trip of each other, more so on a loaded host where that round trip is long, and
        split the vote. Each split widens both draws, so a repeat grows less likely each term.
        """
        jitter = self._election_jitter()
        self.randomized_election_timeout = self.opts.election_tick + self.rng.randrange(jitter)

    def _election_jitter(self) -> int:
        base = self.opts.election_jitter_tick or self.opts.election_tick
        widest = max(base, self.opts.election_tick)
        if not self.opts.election_backoff:
            return base
        return min(widest, base << min(self.campaigns_without_leader, 16))

    def become_follower(self, term: int, lead: NodeId) -> None:
        self._reset(term)
        self.lead = lead
        self.state = Role.FOLLOWER

    def become_pre_candidate(self) -> None:
        # A pre-candidate changes neither term nor vote (thesis §9.6).
        self.votes = {}
        self.lead = NO_NODE
        self.state = Role.PRE_CANDIDATE

    def become_candidate(self) -> None:
        self.campaigns_without_leader += 1
        self._reset(self.term + 1)
        self.vote = self.id
        self.state = Role.CANDIDATE

    def become_leader(self) -> None:
        self.campaigns_without_leader = 0
        self._reset(self.term)
        self.lead = self.id
        self.state = Role.LEADER
        me = self.prs.get(self.id)
        if me is not None:
            me.become_replicate()
            me.match = self.persisted_index()
            me.recent_active = True
        # No config change until this term's no-op commits (single-server change safety).
        self.pending_conf_index = self.log.last_index() + 1
        self._append_entries([Entry(term=0, index=0)])

    # -- ticks -------------------------------------------------------------------------------

    def tick(self, late_ticks: int = 0) -> None:
        """One tick. A leader whose caller's timer fired `late_ticks` intervals late counts
        them toward its next heartbeat, so heartbeats keep to real time on a starved host
        (each stall would otherwise push them back by its length: five late ticks spread a
        heartbeat interval over seconds). Elections and check-quorum count only ticks: time
        the node did not run is time it did not hear, so a stall never makes it campaign or
        step down."""
        self.tick_count += 1
        self.lateness.tick()
        if self.state is Role.LEADER:
            self.heartbeat_elapsed += max(0, min(late_ticks, self.opts.heartbeat_tick))
            self._tick_heartbeat()
        else:
            self._tick_election()

    def held_applying(self, ticks: int) -> None:
        """The caller just spent `ticks` tick intervals applying committed entries so large
        that its peers, applying the same entries at about the same time (a leader tells them
        of the commit first: docs/design/consensus.md#R11), are as busy and as silent. That
        silence is expected, not a failure. It counts as lateness (`Lateness.held`), which
        stretches a follower's election timeout; a leader starts its check-quorum period afresh, so
        its followers get a whole period (already the stretch cap: `check_quorum_period`) from
        the end of this apply to be heard. Without the restart a leader whose apply ended
        first stepped down while its followers were still applying (a 10,000-tablet
        CreateTable on a starved host). Timing only: safety never depends on
        it, and leases count from their own ticks (`reads.lease_valid`)."""
        if ticks <= 0:
            return
        self.lateness.held(ticks)
        if self.state is Role.LEADER:
            self.election_elapsed = 0

    def _live_contact(self, m: Message) -> bool:
        """Whether `m` is what a live group sends this node: a leader's append, heartbeat or
        snapshot, or, to a leader, a follower's answer."""
        if m.type in (MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP):
            return True
        return self.state is Role.LEADER and m.type in (
            MessageType.APP_RESP,
            MessageType.HEARTBEAT_RESP,
        )

    def election_timeout(self) -> int:
        """The election timeout now, in ticks, before jitter: the configured one, stretched
        while peers' messages arrive late (lateness.py)."""
        return self.opts.election_tick + self.lateness.stretch()

    def check_quorum_period(self) -> int:
        """Ticks a leader waits to hear from a quorum before it steps down: at least as long
        as a follower may wait for it, the stretch cap (`max_election_tick`). A leader that
        gives up sooner starts the very election its followers, still waiting, would not
        have: on a starved host both followers went silent for 1.9 s together, the leader
        stepped down at its unstretched 1.5 s while their own timeouts stood at 2.2-3 s. Only
        how soon a cut-off leader tells its clients to look elsewhere depends on this; its
        writes cannot commit meanwhile, and a lease counts its own ticks (`reads.lease_valid`)."""
        return max(self.election_timeout(), self.opts.max_election_tick)

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        timeout = self.randomized_election_timeout + self.lateness.stretch()
        if self.promotable() and self.election_elapsed >= timeout:
            self.election_elapsed = 0
            self.step(Message(MessageType.HUP, frm=self.id))

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.check_quorum_period():
            self.election_elapsed = 0
            if self.opts.check_quorum:
                self.step(Message(MessageType.CHECK_QUORUM, frm=self.id))
            if self.state is Role.LEADER and self.lead_transferee:
                self._abort_transfer()  # the transfer did not finish within an election timeout
        if self.state is not Role.LEADER:
            return
        if self.heartbeat_elapsed >= self.opts.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self.step(Message(MessageType.BEAT, frm=self.id))

    # -- elections (election.py) -------------------------------------------------------------

    def _hup(self, transfer: bool = False) -> None:
        election.hup(self, transfer)

    # -- the step function -------------------------------------------------------------------

    def step(self, m: Message) -> None:
        if m.term and m.term >= self.term and self._live_contact(m):
            # Before any role change below: the gap since this peer's last message counts
            # even if the message ends a pre-vote (lateness.py).
            self.lateness.heard(m.frm, self.tick_count)
        if m.term == 0:
            pass  # local message
        elif m.term > self.term:
            if m.type in (MessageType.VOTE, MessageType.PRE_VOTE) and election.ignores_vote(
                self, m
            ):
                return  # leader stickiness (thesis §4.2.3): we have a live leader
            if m.type is MessageType.PRE_VOTE or (
                m.type is MessageType.PRE_VOTE_RESP and not m.reject
            ):
                pass  # pre-vote traffic never changes our term
            elif m.type in (MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP):
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, NO_NODE)
        elif m.term < self.term:
            if (self.opts.check_quorum or self.opts.pre_vote) and m.type in (
                MessageType.HEARTBEAT,
                MessageType.APP,
            ):
                # A deposed leader would otherwise never learn of the new term (its pre-votes
                # are refused): tell it, so it steps down.
                self.send_to(MessageType.APP_RESP, m.frm)
            elif m.type is MessageType.PRE_VOTE:
                self.send_to(MessageType.PRE_VOTE_RESP, m.frm, reject=True)
            return

        if m.type is MessageType.HUP:
            self._hup()
        elif m.type in (MessageType.VOTE, MessageType.PRE_VOTE):
            election.handle_vote_request(self, m)
        elif self.state is Role.LEADER:
            self._step_leader(m)
        elif self.state in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            election.step_candidate(self, m)
        else:
            self._step_follower(m)

    # -- leader ------------------------------------------------------------------------------

    def _step_leader(self, m: Message) -> None:
        t = m.type
        if t is MessageType.BEAT:
            self.broadcast_heartbeat(reads.last_pending(self))
            return
        if t is MessageType.CHECK_QUORUM:
            if not self._quorum_active():
                self.quorum_lost = self._silence()
                self.become_follower(self.term, NO_NODE)
                return
            for node, pr in self.prs.items():
                pr.recent_active = node == self.id
            return
        found = self.prs.get(m.frm)
        if found is None:
            return  # not a member (any more)
        pr = found
        if t is MessageType.APP_RESP:
            self._handle_append_response(m, pr)
        elif t is MessageType.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            pr.lease_tick = max(pr.lease_tick, m.index)
            if pr.state is ProgressState.REPLICATE and pr.inflights.full():
                pr.inflights.free_first_one()
            if pr.match < self.log.last_index():
                self._send_append(m.frm)
            if m.context:
                reads.on_heartbeat_ack(self, m.context, m.frm)
        elif t is MessageType.SNAP_STATUS:
            if pr.state is not ProgressState.SNAPSHOT:
                return
            if m.reject:
                pr.pending_snapshot = 0
            pr.become_probe()
            pr.probe_sent = True  # wait for the next heartbeat response before probing
        elif t is MessageType.UNREACHABLE:
            if pr.state is ProgressState.REPLICATE:
                pr.become_probe()
            elif pr.state is ProgressState.SNAPSHOT:
                # The snapshot may be what failed to go out, and a peer waiting for one is
                # sent nothing else: without this it would wait for the rest of the term.
                # Treated as a failed snapshot (etcd's ReportSnapshot(failure)): probe again
                # from its match at the next heartbeat response, which re-sends the snapshot.
                pr.pending_snapshot = 0
                pr.become_probe()
                pr.probe_sent = True
        elif t is MessageType.TRANSFER_LEADER:
            self._handle_transfer(m.frm, pr)

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        if m.reject:
            hint = m.reject_hint
            if m.log_term > 0:
                hint = self.log.find_conflict_by_term(hint, m.log_term)
            if pr.maybe_decr_to(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.frm)
            return
        old_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        elif pr.state is ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        if self.maybe_commit():
            self.broadcast_append()
        elif old_paused:
            self._send_append(m.frm)
        # Fill the pipeline while the window allows (flow control by count and bytes).
        while self._send_append(m.frm, send_if_empty=False):
            pass
        if m.frm == self.lead_transferee and pr.match == self.log.last_index():
            self.send_to(MessageType.TIMEOUT_NOW, m.frm)

    def maybe_commit(self) -> bool:
        """Advance commit to the highest index replicated on a quorum of voters, if that
        entry is from the current term (Figure 8)."""
        voters = self.config.voters
        if not voters:
            return False
        matches = sorted((self.prs[n].match for n in voters if n in self.prs), reverse=True)
        q = self.config.quorum()
        if len(matches) < q:
            return False
        if self.log.maybe_commit(matches[q - 1], self.term):
            self._commit_changed()
            return True
        return False

    def _silence(self) -> QuorumLost:
        def ago(n: NodeId) -> int | None:
            at = self.lateness.last_heard(n)
            return None if at is None else self.tick_count - at

        return QuorumLost(
            self.term,
            self.check_quorum_period(),
            tuple((n, ago(n)) for n in sorted(self.config.voters) if n != self.id),
        )

    def _quorum_active(self) -> bool:
        active = sum(
            1
            for n in self.config.voters
            if n == self.id or (n in self.prs and self.prs[n].recent_active)
        )
        return active >= self.config.quorum()

    def _append_entries(self, entries: list[Entry]) -> int:
        last = self.log.last_index()
        stamped = [
            Entry(term=self.term, index=last + 1 + i, type=e.type, data=e.data)
            for i, e in enumerate(entries)
        ]
        self.log.append(stamped)
        self._log_written(stamped[0].index)
        # The leader's own copy counts toward a quorum only once it is durable: see
        # `on_persisted` (this is what lets the caller send appends before its own fsync).
        return self.log.last_index()

    def persisted_index(self) -> int:
        """Last index known durable here (entries before the unstable ones)."""
        if self.log.unstable:
            return self.log.unstable_offset - 1
        return self.log.last_index()

    def on_persisted(self, index: int) -> None:
        """The caller made entries up to `index` durable. A leader acknowledges itself now
        (thesis §10.2.1: the leader's disk write runs in parallel with replication)."""
        if self.state is not Role.LEADER:
            return
        me = self.prs.get(self.id)
        if me is not None and me.maybe_update(index) and self.maybe_commit():
            self.broadcast_append()

    def _send_append(self, to: NodeId, send_if_empty: bool = True) -> bool:
        """Send the follower what it lacks (entries, or a snapshot). Returns whether sent."""
        pr = self.prs[to]
        if pr.is_paused() or (not send_if_empty and pr.next > self.log.last_index()):
            return False
        # The bootstrap config is no log entry: a peer that did not bootstrap with it and
        # replayed the log from index 1 would apply the membership changes onto an empty
        # config and believe in a wrong quorum. Such a peer (a master added to a running
        # group) gets a snapshot, which carries the config, when there is one.
        outsider = self.bootstrap_members and to not in self.bootstrap_members
        if pr.next == 1 and outsider and self.log.snapshot().meta.index > 0:
            return self._send_snapshot(to, pr)
        try:
            prev_term = self.log.term(pr.next - 1)
            ents = self.log.entries_from(pr.next, self.opts.max_size_per_msg)
        except Compacted:
            return self._send_snapshot(to, pr)
        except Unavailable:
            return False
        if not ents and not send_if_empty:
            return False
        self.send_to(
            MessageType.APP,
            to,
            index=pr.next - 1,
            log_term=prev_term,
            entries=tuple(ents),
            commit=self.log.committed,
        )
        if ents:
            if pr.state is ProgressState.REPLICATE:
                last = ents[-1].index
                pr.optimistic_update(last)
                pr.inflights.add(last, entries_size(ents))
            elif pr.state is ProgressState.PROBE:
                pr.probe_sent = True
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: NodeId, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # do not ship a snapshot to a node we have not heard from
        snap = self.log.snapshot()
        if snap.meta.index == 0:
            return False
        if not self.opts.send_snapshots:
            # Held until the caller reports the state delivered (RaftOptions.send_snapshots).
            pr.become_snapshot(snap.meta.index)
            return False
        self.send_to(MessageType.SNAP, to, snapshot=snap)
        pr.become_snapshot(snap.meta.index)
        return True

    def broadcast_append(self) -> None:
        """As leader, send every peer what it lacks (`_send_append`)."""
        for node in self.prs:
            if node != self.id:
                self._send_append(node)

    def broadcast_heartbeat(self, ctx: bytes) -> None:
        """As leader, send every peer a heartbeat carrying `ctx`: a ReadIndex round's context
        (reads.py), or b"" for none."""
        for node, pr in self.prs.items():
            if node == self.id:
                continue
            self.send_to(
                MessageType.HEARTBEAT,
                node,
                commit=min(pr.match, self.log.committed),
                index=self.tick_count,
                context=ctx,
            )

    # -- proposals (called by RawNode) -------------------------------------------------------

    def propose(self, data: bytes, type: EntryType = EntryType.NORMAL) -> tuple[int, int]:
        """Append a proposal; returns its (index, term). Raises ProposalDropped."""
        if self.state is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader is {self.lead or 'unknown'})", self.lead)
        if self.lead_transferee:
            raise ProposalDropped(
                f"leadership transfer to {self.lead_transferee} in progress", self.lead
            )
        index = self._append_entries([Entry(term=0, index=0, type=type, data=data)])
        self.broadcast_append()
        return index, self.term

    def propose_batch(self, datas: list[bytes]) -> tuple[int, int]:
        """Append several proposals as one batch; returns (first index, term)."""
        if self.state is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader is {self.lead or 'unknown'})", self.lead)
        if self.lead_transferee:
            raise ProposalDropped(
                f"leadership transfer to {self.lead_transferee} in progress", self.lead
            )
        first = self.log.last_index() + 1
        term = self.term
        normal = EntryType.NORMAL
        self.log.append([Entry(term, first + i, normal, d) for i, d in enumerate(datas)])
        self._log_written(first, plain=True)
        self.broadcast_append()
        return first, term

    def propose_config_change(self, cc: ConfigChange) -> tuple[int, int]:
        if self.state is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader is {self.lead or 'unknown'})", self.lead)
        if self.pending_conf_index > self.log.committed or self.pending_configs:
            raise ConfigChangeRefused(
                "a configuration change is already pending (or this leader's first entry has "
                "not committed yet); retry after it commits"
            )
        if cc.expected_index != self.committed_config.index:
            raise ConfigChangeRefused(
                f"stale config: change names committed config {cc.expected_index}, "
                f"current committed config is {self.committed_config.index}"
            )
        cfg = self.config
        n = cc.node
        if cc.type is ConfigChangeType.ADD_LEARNER and n in cfg.members:
            raise ConfigChangeRefused(f"{n} is already a member")
        if cc.type is ConfigChangeType.PROMOTE and n not in cfg.learners:
            raise ConfigChangeRefused(f"{n} is not a learner")
        if cc.type is ConfigChangeType.DEMOTE and n not in cfg.voters:
            raise ConfigChangeRefused(f"{n} is not a voter")
        if cc.type is ConfigChangeType.REMOVE and n not in cfg.members:
            raise ConfigChangeRefused(f"{n} is not a member")
        if cc.type in (ConfigChangeType.REMOVE, ConfigChangeType.DEMOTE) and n == self.id:
            raise ConfigChangeRefused(f"{n} is the leader: transfer leadership first")
        index, term = self.propose(cc.encode(), EntryType.CONFIG)
        self.pending_conf_index = index
        return index, term

    # -- leadership transfer (thesis §3.10) --------------------------------------------------

    def _handle_transfer(self, target: NodeId, pr: Progress) -> None:
        if target == self.id or target not in self.config.voters:
            return
        if self.lead_transferee == target:
            return
        self._abort_transfer()
        self.lead_transferee = target
        self.last_transfer_tick = self.tick_count
        self.election_elapsed = 0  # the transfer must finish within one election timeout
        if pr.match == self.log.last_index():
            self.send_to(MessageType.TIMEOUT_NOW, target)
        else:
            self._send_append(target)

    def _abort_transfer(self) -> None:
        self.lead_transferee = NO_NODE

    # -- reads (reads.py) ----------------------------------------------------------------------

    def lease_valid(self) -> bool:
        return reads.lease_valid(self)

    def read_index(self, ctx: bytes) -> None:
        if self.state is not Role.LEADER:
            raise ProposalDropped(f"not the leader (leader is {self.lead or 'unknown'})", self.lead)
        if not ctx or self.reads.known(ctx):
            raise ValueError("read contexts must be non-empty and unique")
        reads.issue(self, ctx)

    # -- follower (a candidate's step: election.py) ------------------------------------------

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t in (MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP):
            self.election_elapsed = 0
            self.lead = m.frm
            self.handle_from_leader(m)
        elif t is MessageType.TIMEOUT_NOW:
            self._hup(transfer=True)

    def handle_from_leader(self, m: Message) -> None:
        """Handle an APP, HEARTBEAT or SNAP from the leader of this node's term, as a follower
        (a candidate that learns of the leader becomes one first: election.step_candidate)."""
        if self.campaigns_without_leader:
            # The group has a leader again: the next failover starts from the short jitter.
            widened = self._election_jitter()
            self.campaigns_without_leader = 0
            if self._election_jitter() != widened:
                self._draw_election_timeout()
        if m.type is MessageType.APP:
            self._handle_append(m)
        elif m.type is MessageType.HEARTBEAT:
            self._handle_heartbeat(m)
        else:
            self._handle_snapshot(m)

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self.send_to(MessageType.APP_RESP, m.frm, index=self.log.committed)
            return
        result = self.log.maybe_append(m.index, m.log_term, m.commit, list(m.entries))
        if result is not None:
            last_new, written_from = result
            if written_from:
                self._log_written(written_from)
            self._commit_changed()
            self.send_to(MessageType.APP_RESP, m.frm, index=last_new)
            return
        hint = self.log.find_conflict_by_term(min(m.index, self.log.last_index()), m.log_term)
        self.send_to(
            MessageType.APP_RESP,
            m.frm,
            index=m.index,
            reject=True,
            reject_hint=hint,
            log_term=self.log.term_or_zero(hint),
        )

    def _handle_heartbeat(self, m: Message) -> None:
        if m.commit > self.log.committed and m.commit <= self.log.last_index():
            self.log.commit_to(m.commit)
            self._commit_changed()
        self.send_to(MessageType.HEARTBEAT_RESP, m.frm, index=m.index, context=m.context)

    def _handle_snapshot(self, m: Message) -> None:
        assert m.snapshot is not None
        if self._restore(m.snapshot):
            self.send_to(MessageType.APP_RESP, m.frm, index=self.log.last_index())
        else:
            self.send_to(MessageType.APP_RESP, m.frm, index=self.log.committed)

    def _restore(self, snap: Snapshot) -> bool:
        meta = snap.meta
        if meta.index <= self.log.committed:
            return False
        if self.log.match_term(meta.index, meta.term):
            # We already have the snapshot's last entry: just fast-forward the commit index.
            self.log.commit_to(meta.index)
            self._commit_changed()
            return False
        self.log.restore(snap)
        self.config_grounded = True
        self.committed_config = meta.config
        self.pending_configs = []
        self._reconfigure(meta.config)
        for node, pr in self.prs.items():
            pr.match = meta.index if node == self.id else 0
            pr.next = meta.index + 1
        return True
