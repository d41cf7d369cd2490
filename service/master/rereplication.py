"""Under-replication: the 3-4-3 decisions of seed 004, as a PURE function of committed state.

Theory of operation
-------------------
Seed 004 ("Master implementation for adding a new peer"): the master keeps no record of the
config changes it asks for. It evaluates a policy over committed state and sends idempotent,
compare-and-set requests to the tablet's leader; it "periodically sends such RPCs until it sees
that it has been successful". For one RUNNING tablet whose committed config the master knows:

  1. A replica whose server has been dead for longer than the eviction time is *failed*.
  2. If no peer is a NON_VOTER being promoted, and the config has a failed VOTER while its
     number of voters is at most the table's replication factor: ADD_PEER a new server as a
     NON_VOTER with `promote` set (seed 004's PRE_VOTER), chosen by the placement policy among
     live servers that host no replica of the tablet. The config then has 3 voters + 1
     non-voter; the leader promotes the new peer once it has caught up (4 voters).
  3. If the voters outnumber the replication factor and one of them failed: REMOVE_PEER it
     (back to 3). A failed NON_VOTER is removed at once (its promotion would never finish).
  4. Every request carries the committed config's op index (`cas_config_opid_index`): a request
     made from stale state is refused by the leader, never applied twice.

Nothing is done without a known leader (the request goes to it), nor while the leader itself
is failed (the group elects another first). The evicted replica, if its server returns, reports
a config it is no longer in and is tombstoned by report processing (step 4 there).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from random import Random

from service.common.errors import FailedPrecondition
from service.common.ids import NodeId
from service.master.catalog_records import (
    HostPort,
    MemberType,
    RaftPeer,
    TableRecord,
    TabletRecord,
    TabletState,
)
from service.master.placement_policy import ServerLoad, choose_replacement
from service.master.report_processing import ChangeReplicaConfig, ConfigChange

__all__ = ["plan_rereplication"]


def plan_rereplication(
    tablet: TabletRecord,
    table: TableRecord,
    failed: Callable[[str], bool],
    servers: Sequence[ServerLoad],
    addresses: Mapping[str, HostPort],
    rng: Random,
    excluded: Collection[str] = (),
) -> ChangeReplicaConfig | None:
    """The one config change tablet `tablet` needs now (module docstring), or None.

    `failed(uuid)`: the server has been dead longer than the eviction time; `servers`: every
    server as placement sees it (`live` ones are candidates); `addresses`: their rpc addresses;
    `excluded`: servers not to choose (e.g. one whose addition just failed).
    """
    cs = tablet.consensus
    if tablet.state is not TabletState.RUNNING or table.is_removed or cs is None:
        return None
    leader = cs.leader_uuid
    if leader is None or failed(leader):
        return None
    voters = [p for p in cs.peers if p.member_type is MemberType.VOTER]
    non_voters = [p for p in cs.peers if p.member_type is MemberType.NON_VOTER]
    failed_voters = [p for p in voters if failed(p.uuid)]
    tid = tablet.tablet_id
    for p in non_voters:
        if failed(p.uuid):
            return ChangeReplicaConfig(
                tid,
                leader,
                ConfigChange.REMOVE_PEER,
                p,
                cs.config_index,
                f"non-voter {p.uuid} of tablet {tid} failed",
            )
    if failed_voters and len(voters) > table.num_replicas:
        victim = next((p for p in failed_voters if p.uuid != leader), None)
        if victim is not None:
            return ChangeReplicaConfig(
                tid,
                leader,
                ConfigChange.REMOVE_PEER,
                victim,
                cs.config_index,
                f"voter {victim.uuid} of tablet {tid} failed and {len(voters)} voters exceed "
                f"the replication factor {table.num_replicas}",
            )
    if any(p.promote for p in non_voters):
        return None  # a replacement is catching up: wait for its promotion
    if not failed_voters or len(voters) > table.num_replicas:
        return None
    try:
        chosen = choose_replacement(
            servers, table.table_id, [p.uuid for p in cs.peers], rng, exclude=excluded
        )
    except FailedPrecondition:
        return None
    peer = RaftPeer(NodeId(chosen), MemberType.NON_VOTER, addresses.get(chosen), promote=True)
    return ChangeReplicaConfig(
        tid,
        leader,
        ConfigChange.ADD_PEER,
        peer,
        cs.config_index,
        f"voter {failed_voters[0].uuid} of tablet {tid} failed: adding {chosen} "
        "as a non-voter to promote",
    )
