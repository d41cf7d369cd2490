"""A leader's promotion of caught-up learners (NodeQuiescence._maybe_promote), against a scripted
Raft core: which learners it promotes, and that a promotion its leader loses is proposed again.

Pure decision logic (no node, no network): the fake core answers what the promotion reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from service.consensus.node_api import NodeSettings
from service.consensus.node_quiesce import NodeQuiescence
from service.raft import ConfigChange, ConfigChangeType, NodeId, RaftConfig


@dataclass
class FakeCore:
    """What `_maybe_promote` reads of a leader's core, set by the test."""

    voters: frozenset[NodeId] = frozenset({NodeId("a"), NodeId("b"), NodeId("c")})
    learners: frozenset[NodeId] = frozenset({NodeId("d")})
    commit: int = 10
    matches: dict[NodeId, int] = field(default_factory=dict)
    pending: bool = False
    proposed: list[ConfigChange] = field(default_factory=list)

    def is_leader(self) -> bool:
        return True

    def config_change_pending(self) -> bool:
        return self.pending

    def commit_index(self) -> int:
        return self.commit

    def config(self) -> RaftConfig:
        return RaftConfig(self.voters, self.learners, 7)

    committed_config = config

    def match_index(self, node: NodeId) -> int | None:
        return self.matches.get(node)

    def propose_config_change(self, cc: ConfigChange) -> None:
        self.proposed.append(cc)
        self.pending = True


def promoter(core: FakeCore) -> NodeQuiescence:
    return NodeQuiescence(
        group_id="t",
        uuid=NodeId("a"),
        raw=core,  # type: ignore[arg-type]  # the part of RawNode promotion reads
        settings=NodeSettings(),
        registry=None,
        busy=lambda: False,
        on_loop=lambda fn: None,
    )


def add(node: str, promote: bool) -> ConfigChange:
    ctx = json.dumps({"address": "h:1", "promote": promote}).encode()
    return ConfigChange(ConfigChangeType.ADD_LEARNER, NodeId(node), 6, ctx)


def test_a_caught_up_learner_with_the_mark_is_promoted_and_one_behind_is_not() -> None:
    core = FakeCore(matches={NodeId("d"): 9})
    q = promoter(core)
    q.applied_change(add("d", promote=True))
    q.after_tick(applied=10)
    assert core.proposed == []  # behind the commit index
    core.matches[NodeId("d")] = 10
    q.after_tick(applied=10)
    assert [(c.type, c.node) for c in core.proposed] == [(ConfigChangeType.PROMOTE, "d")]


def test_a_promotion_the_leader_lost_is_proposed_again() -> None:
    """Deposed before its PROMOTE committed, the entry overwritten by another leader, this
    node leads again: the learner is still a learner and still to be promoted."""
    core = FakeCore(matches={NodeId("d"): 10})
    q = promoter(core)
    q.applied_change(add("d", promote=True))
    q.after_tick(applied=10)
    assert len(core.proposed) == 1
    core.pending = False  # the proposal is gone; d is still a learner of the config
    q.after_tick(applied=10)
    assert len(core.proposed) == 2, "the lost promotion was not proposed again"
    # Once the promotion is applied, the mark ends: demoted later, d stays a learner.
    q.applied_change(ConfigChange(ConfigChangeType.PROMOTE, NodeId("d"), 7))
    core.pending = False
    q.after_tick(applied=10)
    assert len(core.proposed) == 2
    assert not q.is_promotable("d")


def test_the_mark_follows_the_newest_applied_add() -> None:
    """Added without the mark after being removed (a read replica now), or the other way round:
    the newest applied change decides, whatever order the entries were appended in."""
    core = FakeCore(matches={NodeId("d"): 10})
    q = promoter(core)
    q.promote_when_caught_up(NodeId("d"))  # appended: ADD(promote) ... REMOVE, ADD(no mark)
    q.applied_change(add("d", promote=True))
    q.applied_change(ConfigChange(ConfigChangeType.REMOVE, NodeId("d"), 7))
    q.applied_change(add("d", promote=False))
    q.after_tick(applied=10)
    assert core.proposed == [] and not q.is_promotable("d")
    q.applied_change(ConfigChange(ConfigChangeType.REMOVE, NodeId("d"), 8))
    q.applied_change(add("d", promote=True))
    assert q.is_promotable("d")
