"""What a RaftNode decides after a tick: promote a caught-up learner, or quiesce.

A mixin of `RaftNode` (node.py), kept apart so the node's loop reads on its own; it touches
only the node's own state, from the node's event loop. Quiescence (quiesce.py has the rules:
which groups may stop ticking, what wakes them, why it is safe) waits for promotions: a
leader with a learner to promote keeps ticking until it has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from service.consensus.node_api import NodeSettings
from service.consensus.quiesce import Quiescence
from service.raft import (
    ConfigChange,
    ConfigChangeRefused,
    ConfigChangeType,
    Message,
    MessageType,
    NodeId,
    ProposalDropped,
    RawNode,
    Role,
)

__all__ = ["Quiescing", "late_answer"]

log = logging.getLogger("service.consensus.node")  # the node's own log lines


class Quiescing:
    """Quiescence methods of RaftNode; the attributes below are RaftNode's."""

    group_id: str
    uuid: NodeId
    raw: RawNode
    settings: NodeSettings
    applied: int
    _quiescence: Quiescence | None
    _quiesced: bool
    _idle_ticks: int
    _closed: bool
    _tick_due: bool
    _inbox: list[Message]
    _control: list[Callable[[], None]]
    _wakeup: asyncio.Event
    _promotable: set[NodeId]

    def _busy(self) -> bool:
        """Whether the node has proposals, reads, waiters or a Ready in hand (RaftNode)."""
        raise NotImplementedError

    @property
    def quiesced(self) -> bool:
        return self._quiesced

    def members(self) -> frozenset[str]:
        """The other members of the current config (the peers a digest goes to)."""
        return self.raw.raft.config.members - {self.uuid}

    def wake(self, *, leader_suspect: bool = False) -> None:
        """Tick again. `leader_suspect`: the leader's server went silent, so count a full
        election timeout as passed (campaign within the jitter, vote for others)."""
        if not self._quiesced:
            return
        self._quiesced = False
        self._idle_ticks = 0
        if self._quiescence is not None:
            self._quiescence.left(self.group_id)
        if leader_suspect:
            self._control.append(self.raw.expire_election_timer)
            self._wakeup.set()

    def quiesce_follower(self, leader: str, term: int, commit: int) -> bool:
        """Stop ticking if this follows `leader` at `term` and has its log up to `commit`,
        all committed, with nothing in hand (a digest from the leader's server said so). The
        digest is the leader's liveness signal, so the election timer restarts as for a
        heartbeat: woken later by a message, the follower has a whole timeout again."""
        if (
            self._quiesced
            or self._closed
            or not self.raw.quiet_follower(NodeId(leader), term, commit)
            or self._inbox
            or self._control
            or self._busy()
            or self.raw.has_ready()
        ):
            return False
        self.raw.heard_from_leader()
        self._quiesced = True
        self._tick_due = False
        return True

    def _maybe_promote(self) -> None:
        """The leader promotes a PRE_VOTER once its log has caught up
        (docs/design/consensus.md#R4)."""
        if not self.settings.auto_promote or self.raw.raft.state is not Role.LEADER:
            return
        raft = self.raw.raft
        if raft.pending_configs or raft.pending_conf_index > raft.log.committed:
            return
        for node in sorted(raft.config.learners & self._promotable):
            pr = raft.prs.get(node)
            if pr is not None and pr.match >= raft.log.committed:
                cc = ConfigChange(ConfigChangeType.PROMOTE, node, raft.committed_config.index)
                try:
                    self.raw.propose_config_change(cc)
                    self._promotable.discard(node)
                    log.info(
                        "%s/%s: promoting caught-up learner %s", self.group_id, self.uuid, node
                    )
                except (ConfigChangeRefused, ProposalDropped):
                    pass
                return

    def _maybe_quiesce(self) -> None:
        """After a tick of a leader: quiesce once its group has been quiet (RawNode.quiet_leader:
        everything committed and replicated to every peer, nothing changing) and everything
        applied with nothing in hand, for `quiesce_ticks` ticks in a row."""
        q = self._quiescence
        if q is None:
            return
        raft = self.raw.raft
        if (
            self.raw.quiet_leader()
            and self.applied == raft.log.committed
            and not self._busy()
            and not (raft.config.learners & self._promotable)
        ):
            self._idle_ticks += 1
        else:
            self._idle_ticks = 0
            return
        if (
            self._idle_ticks >= self.settings.quiesce_ticks
            and self.raw.peers_recently_active()
            and not self.raw.has_ready()
        ):
            self._quiesced = True
            q.lead(self.group_id, raft.term, raft.log.committed, self.members())


def late_answer(m: Message, term: int) -> bool:
    """A follower's answer to the heartbeat a leader sent as it quiesced: stepped, but no
    reason to tick again (it would wake every leader whose quiescing tick was a heartbeat's)."""
    return m.type is MessageType.HEARTBEAT_RESP and m.term == term and not m.context
