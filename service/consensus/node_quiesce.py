"""What a RaftNode decides after a tick: promote a caught-up learner, or quiesce.

`NodeQuiescence` is a collaborator the node holds (`RaftNode._quiesce`), kept apart so the
node's loop reads on its own. It owns the node's side of quiescence (quiesce.py has the rules:
which groups may stop ticking, what wakes them, why it is safe): whether the node is quiesced,
how many ticks in a row its group was idle, the learners to promote once caught up, and the
handle on the server's `Quiescence` registry. What it needs from the node it is given
explicitly: the node's `RawNode` and settings, a `busy()` predicate (proposals, reads, waiters
or a Ready in hand) and a way to run a call on the node's loop and wake it. Everything here
runs on the node's event loop, as the node does (docs/design/layers.md#R5): the registry's
calls come from its periodic task and the transport, both on that loop.

Quiescence waits for promotions: a leader with a learner to promote keeps ticking until it has.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from service.consensus.node_api import NodeSettings
from service.consensus.quiesce import Quiescence, QuiescentNode
from service.raft import (
    ConfigChange,
    ConfigChangeRefused,
    ConfigChangeType,
    Message,
    MessageType,
    NodeId,
    ProposalDropped,
    RawNode,
)

__all__ = ["NodeQuiescence", "late_answer"]

log = logging.getLogger("service.consensus.node")  # the node's own log lines


class NodeQuiescence:
    """One RaftNode's quiescence and learner promotion.

    `registry` is the server's `Quiescence`, or None when quiescence is off (then only
    promotion runs). `busy()` says whether the node has proposals, reads, waiters, held
    messages or a Ready being persisted. `on_loop(fn)` queues `fn` for the node's loop (it
    runs before the next tick, with the core to itself) and wakes the loop."""

    def __init__(
        self,
        *,
        group_id: str,
        uuid: NodeId,
        raw: RawNode,
        settings: NodeSettings,
        registry: Quiescence | None,
        busy: Callable[[], bool],
        on_loop: Callable[[Callable[[], None]], None],
    ) -> None:
        self.group_id = group_id
        self.uuid = uuid
        self._raw = raw
        self._settings = settings
        self._registry = registry
        self._busy = busy
        self._on_loop = on_loop
        self._quiesced = False
        """Ticks are ignored: an idle group's leader and caught-up followers (quiesce.py)."""
        self._idle_ticks = 0
        """Consecutive ticks this leader found its group idle (`_maybe_quiesce`)."""
        self._promotable: set[NodeId] = set()
        """Learners added with the promote mark, not promoted yet
        (docs/design/consensus.md#R4)."""

    # -- the registry ---------------------------------------------------------------------------

    def register(self, node: QuiescentNode) -> None:
        """`node` (the RaftNode holding this) takes part in the server's digests."""
        if self._registry is not None:
            self._registry.register(node)

    def unregister(self) -> None:
        if self._registry is not None:
            self._registry.unregister(self.group_id)

    # -- state ----------------------------------------------------------------------------------

    @property
    def quiesced(self) -> bool:
        return self._quiesced

    def members(self) -> frozenset[str]:
        """The other members of the current config (the peers a digest goes to)."""
        return self._raw.config().members - {self.uuid}

    def promote_when_caught_up(self, node: NodeId) -> None:
        """Learner `node` was added with the promote mark: make it a voter once caught up."""
        self._promotable.add(node)

    def applied_change(self, change: ConfigChange) -> None:
        """A config change was applied (committed): a learner's promote mark ends only here,
        when it was promoted, removed, demoted or added again without the mark. Not when the
        leader proposes PROMOTE: a proposal its leader loses (deposed before it commits, its
        entry overwritten) would otherwise take the mark with it, and the leader that wins
        back would leave the learner a non-voter for good."""
        if change.type is ConfigChangeType.ADD_LEARNER and _wants_promotion(change):
            self._promotable.add(change.node)
        else:
            self._promotable.discard(change.node)

    def is_promotable(self, node: str) -> bool:
        return node in self._promotable

    # -- waking and sleeping --------------------------------------------------------------------

    def wake(self, *, leader_suspect: bool = False) -> None:
        """Tick again. `leader_suspect`: the leader's server went silent, so count a full
        election timeout as passed (campaign within the jitter, vote for others)."""
        if not self._quiesced:
            return
        self._quiesced = False
        self._idle_ticks = 0
        if self._registry is not None:
            self._registry.left(self.group_id)
        if leader_suspect:
            self._on_loop(self._raw.expire_election_timer)

    def wake_for(self, messages: list[Message]) -> None:
        """Messages are about to be stepped: any but a late heartbeat answer wakes the node."""
        if self._quiesced and not all(late_answer(m, self._raw.term()) for m in messages):
            self.wake()

    def quiesce_follower(self, leader: str, term: int, commit: int) -> bool:
        """Stop ticking if this follows `leader` at `term` and has its log up to `commit`,
        all committed, with nothing in hand (a digest from the leader's server said so). The
        digest is the leader's liveness signal, so the election timer restarts as for a
        heartbeat: woken later by a message, the follower has a whole timeout again. The node
        checks its own queues first (`RaftNode.quiesce_follower`)."""
        raw = self._raw
        if (
            self._quiesced
            or not raw.quiet_follower(NodeId(leader), term, commit)
            or self._busy()
            or raw.has_ready()
        ):
            return False
        raw.heard_from_leader()
        self._quiesced = True
        return True

    # -- after a tick ---------------------------------------------------------------------------

    def after_tick(self, applied: int) -> None:
        """What the node's loop does after each tick of the core: promote a caught-up learner,
        then (a leader with everything up to `applied` applied) perhaps quiesce."""
        self._maybe_promote()
        self._maybe_quiesce(applied)

    def _maybe_promote(self) -> None:
        """The leader promotes a PRE_VOTER once its log has caught up
        (docs/design/consensus.md#R4)."""
        raw = self._raw
        if not self._settings.auto_promote or not raw.is_leader():
            return
        if raw.config_change_pending():
            return
        commit = raw.commit_index()
        for node in sorted(raw.config().learners & self._promotable):
            match = raw.match_index(node)
            if match is not None and match >= commit:
                cc = ConfigChange(ConfigChangeType.PROMOTE, node, raw.committed_config().index)
                try:
                    raw.propose_config_change(cc)
                    log.info(
                        "%s/%s: promoting caught-up learner %s", self.group_id, self.uuid, node
                    )
                except (ConfigChangeRefused, ProposalDropped):
                    pass
                return

    def _maybe_quiesce(self, applied: int) -> None:
        """After a tick of a leader: quiesce once its group has been quiet (RawNode.quiet_leader:
        everything committed and replicated to every peer, nothing changing) and everything
        applied with nothing in hand, for `quiesce_ticks` ticks in a row."""
        q = self._registry
        if q is None:
            return
        raw = self._raw
        if (
            raw.quiet_leader()
            and applied == raw.commit_index()
            and not self._busy()
            and not (raw.config().learners & self._promotable)
        ):
            self._idle_ticks += 1
        else:
            self._idle_ticks = 0
            return
        if (
            self._idle_ticks >= self._settings.quiesce_ticks
            and raw.peers_recently_active()
            and not raw.has_ready()
        ):
            self._quiesced = True
            q.lead(self.group_id, raw.term(), raw.commit_index(), self.members())


def _wants_promotion(change: ConfigChange) -> bool:
    """Whether an ADD_LEARNER carries the promote mark (`RaftNode.add_learner`'s context)."""
    try:
        return bool(change.context and json.loads(change.context).get("promote"))
    except (ValueError, AttributeError):
        return False


def late_answer(m: Message, term: int) -> bool:
    """A follower's answer to the heartbeat a leader sent as it quiesced: stepped, but no
    reason to tick again (it would wake every leader whose quiescing tick was a heartbeat's)."""
    return m.type is MessageType.HEARTBEAT_RESP and m.term == term and not m.context
