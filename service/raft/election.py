"""Elections: pre-vote, vote, and when a node refuses to take part (Raft §5.2, thesis §9.6).

Theory of operation
-------------------
Split out of `raft.py` along the seam etcd-io/raft also draws around campaigning: these
functions take the core they act on as their first argument and change only its election
state (term, vote, votes, role) through the same helpers the rest of the core uses, so the
behaviour is exactly that of the methods they replaced. They see the core only through
`ElectionCore`, the part of it they need (`raft.Raft` implements it): this module never imports
`raft.py`, which imports it, and calls no private method of the core.

A follower whose election timer fires calls `hup`: with pre-vote it first becomes a
PRE_CANDIDATE and asks the voters whether they *would* vote for it at term + 1 (nothing
durable changes), and only with a quorum of yeses does it `campaign` for real (term + 1, vote
for itself). A TIMEOUT_NOW from a leader transferring leadership skips the pre-vote and marks
its VOTE with `TRANSFER_CONTEXT`.

A node grants a vote if it has not voted for someone else in this term (or the request is a
pre-vote for a later term) and the candidate's log is at least as up to date as its own
(§5.4.1). With check-quorum, a node that heard from a live leader within the election timeout
ignores (pre-)votes for a higher term altogether (`ignores_vote`, leader stickiness, thesis
§4.2.3), unless the vote comes from a leadership transfer; with lease reads, a node that has
just started waits a full election timeout first, because it cannot know whether a leader
holds a lease that counted on it.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from service.raft.log import RaftLog
from service.raft.types import NO_NODE, Message, MessageType, NodeId, RaftConfig, Role

TRANSFER_CONTEXT = b"transfer"
"""Context of a VOTE sent after TIMEOUT_NOW: voters must not ignore it as "in lease"."""


class ElectionOptions(Protocol):
    """The options a campaign and a vote read (`raft.RaftOptions` has them)."""

    @property
    def pre_vote(self) -> bool: ...
    @property
    def check_quorum(self) -> bool: ...
    @property
    def lease_reads(self) -> bool: ...
    @property
    def election_tick(self) -> int: ...


class ElectionCore(Protocol):
    """What campaigning and voting need of the Raft core (`raft.Raft` implements it).

    Read: who this node is, its options, log, configuration, role, term, leader and tick
    count. Written: its vote, the votes it collected and its election timer. Transitions and
    messages go through the core's own methods, so a campaign changes the core exactly as the
    rest of the core would."""

    @property
    def id(self) -> NodeId: ...
    @property
    def opts(self) -> ElectionOptions: ...
    @property
    def log(self) -> RaftLog: ...
    @property
    def config(self) -> RaftConfig: ...
    @property
    def state(self) -> Role: ...
    @property
    def term(self) -> int: ...
    @property
    def lead(self) -> NodeId: ...
    @property
    def tick_count(self) -> int: ...
    @property
    def votes(self) -> dict[NodeId, bool]:
        """(Pre-)votes received in the current campaign (mutated in place)."""
        ...

    vote: NodeId
    election_elapsed: int

    def promotable(self) -> bool: ...
    def election_timeout(self) -> int:
        """The election timeout now, in ticks, before jitter (stretched while peers are late)."""
        ...

    def become_follower(self, term: int, lead: NodeId) -> None: ...
    def become_pre_candidate(self) -> None: ...
    def become_candidate(self) -> None: ...
    def become_leader(self) -> None: ...
    def send_to(self, type: MessageType, to: NodeId, **fields: object) -> None:
        """Queue a message from this node (at its current term unless `term` is given)."""
        ...

    def handle_from_leader(self, m: Message) -> None:
        """Handle an APP, HEARTBEAT or SNAP from this term's leader as a follower does."""
        ...

    def broadcast_append(self) -> None:
        """As leader, send every peer the entries it lacks."""
        ...


class VoteResult(Enum):
    PENDING = "PENDING"
    WON = "WON"
    LOST = "LOST"


def hup(r: ElectionCore, transfer: bool = False) -> None:
    """Start an election (after a pre-vote, unless this is a leadership transfer)."""
    if r.state is Role.LEADER or not r.promotable():
        return
    if r.opts.pre_vote and not transfer:
        campaign(r, pre=True, transfer=False)
    else:
        campaign(r, pre=False, transfer=transfer)


def campaign(r: ElectionCore, pre: bool, transfer: bool) -> None:
    if pre:
        r.become_pre_candidate()
        vote_type, term = MessageType.PRE_VOTE, r.term + 1
    else:
        r.become_candidate()
        vote_type, term = MessageType.VOTE, r.term
    if poll(r, r.id, True) is VoteResult.WON:
        # A single-voter group wins at once.
        if pre:
            campaign(r, pre=False, transfer=transfer)
        else:
            r.become_leader()
        return
    ctx = TRANSFER_CONTEXT if transfer else b""
    for node in sorted(r.config.voters):
        if node == r.id:
            continue
        r.send_to(
            vote_type,
            node,
            term=term,
            index=r.log.last_index(),
            log_term=r.log.last_term(),
            context=ctx,
        )


def poll(r: ElectionCore, node: NodeId, granted: bool) -> VoteResult:
    r.votes.setdefault(node, granted)
    yes = sum(1 for n in r.config.voters if r.votes.get(n) is True)
    no = sum(1 for n in r.config.voters if r.votes.get(n) is False)
    q = r.config.quorum()
    if yes >= q:
        return VoteResult.WON
    if no > len(r.config.voters) - q:
        return VoteResult.LOST
    return VoteResult.PENDING


def ignores_vote(r: ElectionCore, m: Message) -> bool:
    """Whether a (pre-)vote request `m` for a higher term is dropped unanswered because this
    node believes a leader is alive (leader stickiness)."""
    if m.context == TRANSFER_CONTEXT:
        return False
    # With lease reads, a node that just started does not know whether a leader holds a
    # lease that counts on it: it waits one election timeout before voting.
    return r.opts.check_quorum and (
        (r.lead != NO_NODE and r.election_elapsed < r.election_timeout())
        or (r.opts.lease_reads and r.tick_count < r.opts.election_tick)
    )


def handle_vote_request(r: ElectionCore, m: Message) -> None:
    resp_type = MessageType.VOTE_RESP if m.type is MessageType.VOTE else MessageType.PRE_VOTE_RESP
    can_vote = (
        r.vote == m.frm
        or (r.vote == NO_NODE and r.lead == NO_NODE)
        or (m.type is MessageType.PRE_VOTE and m.term > r.term)
    )
    if can_vote and r.log.is_up_to_date(m.index, m.log_term):
        # Grant with the message's term: for a pre-vote that is the future term.
        r.send_to(resp_type, m.frm, term=m.term)
        if m.type is MessageType.VOTE:
            r.election_elapsed = 0
            r.vote = m.frm
    else:
        r.send_to(resp_type, m.frm, term=r.term, reject=True)


def step_candidate(r: ElectionCore, m: Message) -> None:
    """A (pre-)candidate's step: count votes, or yield to a leader of its term."""
    t = m.type
    if t in (MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP):
        r.become_follower(m.term, m.frm)
        r.handle_from_leader(m)
    elif (t is MessageType.PRE_VOTE_RESP and r.state is Role.PRE_CANDIDATE) or (
        t is MessageType.VOTE_RESP and r.state is Role.CANDIDATE
    ):
        result = poll(r, m.frm, not m.reject)
        if result is VoteResult.WON:
            if r.state is Role.PRE_CANDIDATE:
                campaign(r, pre=False, transfer=False)
            else:
                r.become_leader()
                r.broadcast_append()
        elif result is VoteResult.LOST:
            r.become_follower(r.term, NO_NODE)
