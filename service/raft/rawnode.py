"""RawNode: the thread-unsafe, I/O-free handle on one Raft node (etcd-io/raft's RawNode).

The owner (one asyncio task in `service/consensus/node.py`, or the simulator) drives it:

    node.tick()                       every tick interval
    node.step(message)                for every message received from a peer
    node.propose(data) -> (index, term)
    while node.has_ready():
        rd = node.ready()             (messages coalesced: see coalesce.py)
        persist rd.snapshot, rd.entries, rd.hard_state   (fsync if rd.must_sync)
        send rd.messages
        apply rd.snapshot, rd.committed_entries
        node.advance(rd)

(with `rd.send_before_persist`, a leader's Ready, the caller sends and applies first and
persists while its followers write: docs/design/consensus.md#R1).

`propose` returns the index and term the entry was appended at, so the caller can match it
with what is later applied: if the entry applied at that index has another term, the proposal
was overwritten and definitely did not take effect.

Between `ready()` and `advance(rd)` the caller may go on stepping messages, ticking and
proposing (etcd-io/raft's node.run does the same while its Ready is being handled): whatever
that produces waits in the core for the next Ready, which must not be taken before
`advance(rd)`. So the next Ready never sends an acknowledgement of, nor applies, an entry of
`rd` before `rd` is persisted. The asyncio shell relies on this to keep stepping while a
Ready's fdatasync runs in another thread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from service.raft.coalesce import coalesce
from service.raft.progress import ProgressState
from service.raft.raft import QuorumLost, Raft, RaftOptions
from service.raft.storage import Storage
from service.raft.types import (
    EMPTY_HARD_STATE,
    LOCAL_MESSAGES,
    NO_NODE,
    ConfigChange,
    EntryType,
    HardState,
    Message,
    MessageType,
    NodeId,
    RaftConfig,
    Ready,
    Role,
    SoftState,
)


@dataclass(frozen=True, slots=True)
class PeerProgress:
    match: int
    next: int
    state: ProgressState
    recent_active: bool
    is_learner: bool


@dataclass(frozen=True, slots=True)
class Status:
    id: NodeId
    term: int
    vote: NodeId
    commit: int
    applied: int
    last_index: int
    lead: NodeId
    role: Role
    config: RaftConfig
    committed_config: RaftConfig
    progress: dict[NodeId, PeerProgress]
    lead_transferee: NodeId
    election_timeout: int
    """The election timeout now, in ticks, before jitter: the configured one, stretched while
    peers' messages arrive late (lateness.py); a leader's: its check-quorum period
    (`Raft.check_quorum_period`)."""


class RawNode:
    def __init__(
        self,
        options: RaftOptions,
        storage: Storage,
        rng: random.Random,
        bootstrap_config: RaftConfig | None = None,
    ) -> None:
        self.raft = Raft(options, storage, rng, bootstrap_config)
        """The core itself, for the simulator and tests to inspect. The asyncio shell
        (service/consensus) reads the core's state only through this class's methods
        (`status`, and the accessors under "state"): tests/raft/test_boundaries.py."""
        self._prev_soft: SoftState = self.raft.soft_state()
        hs, _ = storage.initial_state()
        self._prev_hard: HardState = hs if hs != EMPTY_HARD_STATE else EMPTY_HARD_STATE
        self._prev_persisted_term = hs.term
        self._prev_persisted_vote = hs.vote

    # -- inputs ---------------------------------------------------------------------------------

    def tick(self, late_ticks: int = 0) -> None:
        """One tick of Raft time. `late_ticks`: how many more tick intervals of real time have
        passed since the last tick (the caller's timer fired late); a leader counts them toward
        its next heartbeat only (`Raft.tick`)."""
        self.raft.tick(late_ticks)

    def take_quorum_lost(self) -> QuorumLost | None:
        """Why this node last stepped down at a quorum check (`QuorumLost`), once."""
        lost, self.raft.quorum_lost = self.raft.quorum_lost, None
        return lost

    def held_applying(self, ticks: int) -> None:
        """The caller's apply of large committed entries took `ticks` tick intervals, which
        its peers are spending too (`Raft.held_applying`). Timing only."""
        self.raft.held_applying(ticks)

    def expire_election_timer(self) -> None:
        """Count a full election timeout as passed on a non-leader (a quiesced follower whose
        leader went silent, consensus/quiesce.py): it campaigns within its random jitter, and
        no longer ignores votes as if it had heard from a leader lately. Timing only."""
        r = self.raft
        if r.state is not Role.LEADER:
            r.election_elapsed = max(r.election_elapsed, r.election_timeout())

    def leader_gone(self, node: NodeId) -> None:
        """`node`'s server closed its connection (the transport says so): if it is this
        follower's leader, its election timeout stops stretching (lateness.py, `gone`); it
        still waits the configured timeout. Timing only."""
        r = self.raft
        if r.state is not Role.LEADER and r.lead == node:
            r.lateness.gone()

    def quiet_leader(self) -> bool:
        """Whether this leader's group is quiet (consensus/quiesce.py): its whole log committed
        and held by every peer, and no leadership transfer or config change under way. The
        caller adds what only it knows (applied, proposals in hand) and counts how long it
        has been so, then asks `peers_recently_active` at the moment it would stop ticking."""
        r = self.raft
        if r.state is not Role.LEADER or r.lead_transferee or r.pending_configs:
            return False
        last = r.log.last_index()
        if r.log.committed != last or r.pending_conf_index > last:
            return False
        return all(
            pr.match == last and pr.state is ProgressState.REPLICATE
            for node, pr in r.prs.items()
            if node != r.id
        )

    def peers_recently_active(self) -> bool:
        """Whether every peer answered since the last quorum check. A leader stops ticking
        only when so: woken later, it finds them still counted, and check-quorum gives it a
        full election timeout before judging them again. (Not part of `quiet_leader`: the
        flags are cleared at every quorum check, and a quiet stretch must outlast that.)"""
        r = self.raft
        return all(pr.recent_active for node, pr in r.prs.items() if node != r.id)

    def quiet_follower(self, leader: NodeId, term: int, commit: int) -> bool:
        """Whether this is a follower (or learner) of `leader` at `term` whose log ends at
        `commit`, all of it committed: what a quiesced leader's digest says it must be to stop
        its election timer too (consensus/quiesce.py)."""
        r = self.raft
        return (
            r.state in (Role.FOLLOWER, Role.LEARNER)
            and r.lead == leader
            and r.term == term
            and r.log.committed == commit
            and r.log.last_index() == commit
        )

    def heard_from_leader(self) -> None:
        """Restart a follower's election timer as a heartbeat from its leader does (a digest
        of the leader's server listed this group quiesced at this term). Timing only."""
        r = self.raft
        if r.state is not Role.LEADER and r.lead != NO_NODE:
            r.election_elapsed = 0

    def campaign(self) -> None:
        self.raft.step(Message(MessageType.HUP, frm=self.raft.id))

    def propose(self, data: bytes) -> tuple[int, int]:
        return self.raft.propose(data)

    def propose_batch(self, datas: list[bytes]) -> tuple[int, int]:
        return self.raft.propose_batch(datas)

    def propose_config_change(self, cc: ConfigChange) -> tuple[int, int]:
        return self.raft.propose_config_change(cc)

    def read_index(self, ctx: bytes) -> None:
        self.raft.read_index(ctx)

    def transfer_leader(self, target: NodeId) -> None:
        self.raft.step(Message(MessageType.TRANSFER_LEADER, frm=target))

    def step(self, m: Message) -> None:
        """Step a message received from the network. Local message types are refused."""
        if m.type in LOCAL_MESSAGES:
            raise ValueError(f"{m.type.value} is a local message and cannot be received")
        self.raft.step(m)

    def report_unreachable(self, node: NodeId) -> None:
        self.raft.step(Message(MessageType.UNREACHABLE, frm=node))

    def forget_activity(self, node: NodeId) -> None:
        """As leader: count `node` as not heard from since the last quorum check (its server
        says it does not host the group). Timing only: its progress is untouched."""
        pr = self.raft.prs.get(node)
        if self.raft.state is Role.LEADER and pr is not None and node != self.raft.id:
            pr.recent_active = False

    def report_snapshot(self, node: NodeId, ok: bool) -> None:
        self.raft.step(Message(MessageType.SNAP_STATUS, frm=node, reject=not ok))

    # -- outputs --------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        r = self.raft
        if r.msgs or r.log.unstable or r.read_states or r.log.unstable_snapshot is not None:
            return True
        # Field by field rather than building a HardState and a SoftState: called for every
        # loop iteration of the shell (the comparisons below are what `ready()` diffs).
        hs, ss = self._prev_hard, self._prev_soft
        if r.term != hs.term or r.vote != hs.vote or r.log.committed != hs.commit:
            return True
        if r.lead != ss.leader or r.term != ss.term or r.role() is not ss.role:
            return True
        return r.log.has_next_committed()

    def take_messages(self, types: frozenset[MessageType]) -> list[Message]:
        """Remove and return the queued messages of `types`, in order, leaving the rest for the
        next Ready. For heartbeats and their answers, which promise nothing about the log:
        the shell may send them while the previous Ready's persist still runs, so a slow
        fsync neither silences a leader nor keeps a follower from answering one (the leader's
        quorum check would depose it, and every member would campaign at once)."""
        r = self.raft
        taken = [m for m in r.msgs if m.type in types]
        if taken:
            r.msgs = [m for m in r.msgs if m.type not in types]
        return taken

    def ready(self) -> Ready:
        r = self.raft
        rd = Ready(
            entries=list(r.log.unstable),
            snapshot=r.log.unstable_snapshot,
            committed_entries=r.log.next_committed(),
            messages=coalesce(r.msgs, r.opts.max_size_per_msg),
            read_states=r.read_states,
        )
        r.msgs = []
        r.read_states = []
        soft = r.soft_state()
        if soft != self._prev_soft:
            rd.soft_state = soft
            self._prev_soft = soft
        hs = r.hard_state()
        if hs != self._prev_hard:
            rd.hard_state = hs
            rd.must_sync = hs.term != self._prev_hard.term or hs.vote != self._prev_hard.vote
            self._prev_hard = hs
        if rd.entries or rd.snapshot is not None:
            rd.must_sync = True
        # A leader's messages never acknowledge its own unpersisted entries (it acknowledges
        # itself in advance()), so unless this Ready changes term or vote they may be sent
        # while the entries are being written.
        term_or_vote_changed = (
            rd.hard_state is not None
            and rd.must_sync
            and (
                rd.hard_state.term != self._prev_persisted_term
                or rd.hard_state.vote != self._prev_persisted_vote
            )
        )
        rd.send_before_persist = r.state is Role.LEADER and not term_or_vote_changed
        if rd.hard_state is not None:
            self._prev_persisted_term = rd.hard_state.term
            self._prev_persisted_vote = rd.hard_state.vote
        return rd

    def advance(self, rd: Ready) -> None:
        log = self.raft.log
        if rd.snapshot is not None:
            log.stable_snap_to(rd.snapshot.meta.index)
            log.applied_to(max(log.applied, rd.snapshot.meta.index))
        # The longest prefix of rd.entries still in the log is durable and current. Usually
        # that is all of them; if an append stepped while they were being persisted replaced
        # a suffix (a new leader), only the replaced part is written again by the next
        # Ready: re-writing the rest could reach below a commit index persisted meanwhile.
        for e in reversed(rd.entries):
            if log.match_term(e.index, e.term):
                log.stable_to(e.index, e.term)
                self.raft.on_persisted(e.index)
                break
        if rd.committed_entries:
            log.applied_to(rd.committed_entries[-1].index)

    # -- state --------------------------------------------------------------------------------
    # Cheap reads of single facts, for the shell's hot paths (every proposal, every loop
    # iteration), where building a `status()` would cost a dict of every peer's progress.

    def is_leader(self) -> bool:
        """Whether this node is its group's leader (of its current term)."""
        return self.raft.state is Role.LEADER

    def leader(self) -> NodeId:
        """The leader this node knows of at its current term; NO_NODE if none."""
        return self.raft.lead

    def term(self) -> int:
        return self.raft.term

    def commit_index(self) -> int:
        return self.raft.log.committed

    def last_index(self) -> int:
        """The index of the last entry in this node's log, durable or not."""
        return self.raft.log.last_index()

    def term_at(self, index: int) -> int:
        """The term of the entry at `index`; 0 if the log does not hold it (compacted, or past
        its end)."""
        return self.raft.log.term_or_zero(index)

    def committed_in_term(self) -> bool:
        """Whether an entry of this node's current term has committed: only then is a leader's
        commit index known to be current (its reads wait for it, thesis §6.4)."""
        r = self.raft
        return r.log.term_or_zero(r.log.committed) == r.term

    def config(self) -> RaftConfig:
        """The configuration in effect: the latest in the log, committed or not
        (docs/design/consensus.md#R4)."""
        return self.raft.config

    def committed_config(self) -> RaftConfig:
        """The latest committed configuration: a change names its index (compare-and-set)."""
        return self.raft.committed_config

    def transferring_leadership(self) -> bool:
        """Whether this leader is transferring its leadership (it takes no proposals, and its
        lease does not hold, until that ends)."""
        return self.raft.lead_transferee != NO_NODE

    def config_change_pending(self) -> bool:
        """Whether a membership change is under way (appended and not yet committed, or this
        leader's first entry has not committed yet): another would be refused now."""
        r = self.raft
        return bool(r.pending_configs) or r.pending_conf_index > r.log.committed

    def match_index(self, node: NodeId) -> int | None:
        """As leader, the highest index known replicated on `node`; None if `node` is not a
        member (or this node is not the leader: followers track no progress)."""
        if self.raft.state is not Role.LEADER:
            return None
        pr = self.raft.prs.get(node)
        return None if pr is None else pr.match

    # -- introspection --------------------------------------------------------------------------

    def status(self) -> Status:
        r = self.raft
        progress: dict[NodeId, PeerProgress] = {}
        if r.state is Role.LEADER:
            progress = {
                n: PeerProgress(p.match, p.next, p.state, p.recent_active, p.is_learner)
                for n, p in r.prs.items()
            }
        return Status(
            id=r.id,
            term=r.term,
            vote=r.vote,
            commit=r.log.committed,
            applied=r.log.applied,
            last_index=r.log.last_index(),
            lead=r.lead,
            role=r.role(),
            config=r.config,
            committed_config=r.committed_config,
            progress=progress,
            lead_transferee=r.lead_transferee,
            election_timeout=(
                r.check_quorum_period() if r.state is Role.LEADER else r.election_timeout()
            ),
        )


def config_after(config: RaftConfig, entry_type: EntryType, data: bytes, index: int) -> RaftConfig:
    """The config after applying a committed entry (the shell tracks its applied config)."""
    if entry_type is EntryType.CONFIG:
        return ConfigChange.decode(data).apply_to(config, index)
    return config
