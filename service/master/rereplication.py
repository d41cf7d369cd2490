"""Under-replication: the 3-4-3 decisions, as a PURE function of committed state.

Theory of operation
-------------------
docs/design/tablet_copy.md#R7: the master keeps no record of the config changes it asks for. It
evaluates a policy over committed state and sends idempotent, compare-and-set requests to the
tablet's leader, again and again until committed state shows the effect. For one RUNNING tablet
whose committed config the master knows:

  1. A replica whose server has been dead for longer than the eviction time is *failed*, and
     so is one its server reports FAILED (below).
  2. If no peer is a NON_VOTER being promoted, and the config has a failed VOTER while its
     number of voters is at most the table's replication factor: ADD_PEER a new server as a
     NON_VOTER with `promote` set (Kudu's PRE_VOTER), chosen by the placement policy among
     live servers that host no replica of the tablet. The config then has 3 voters + 1
     non-voter; the leader promotes the new peer once it has caught up (4 voters).
  3. If the voters outnumber the replication factor and one of them failed: REMOVE_PEER it
     (back to 3). A failed NON_VOTER is removed at once (its promotion would never finish).
  4. Every request carries the committed config's op index (`cas_config_opid_index`): a request
     made from stale state is refused by the leader, never applied twice.

Nothing is done without a known leader (the request goes to it), nor while the leader itself
is failed (the group elects another first). The evicted replica, if its server returns, reports
a config it is no longer in and is tombstoned by report processing (step 4 there).

FAILED replicas. A replica whose tablet server reports it FAILED (an entry of its log did not
apply, its files or log did not open: tserver/tablet.py) is lost as surely as one on a dead
server, and its server is alive to say so: it is failed at once, with no eviction time to wait
out (Kudu evicts a FAILED_UNRECOVERABLE replica at once too). The leader master keeps what
servers last reported in `FailedReplicas`, in memory only: a new leader asks every server for
a full report, which rebuilds it. Once the committed config no longer names a FAILED replica,
`plan_failed_cleanup` tombstones it (compare-and-set on the config op index, as report
processing's step 4 does). Its server must be told: a FAILED replica never changes again, so
the server sends no new report that would trigger step 4.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from random import Random

from service.common.errors import FailedPrecondition
from service.common.ids import NodeId, TabletId
from service.master.catalog_records import (
    HostPort,
    MemberType,
    RaftPeer,
    TableRecord,
    TabletRecord,
    TabletState,
)
from service.master.placement_policy import ServerLoad, choose_replacement
from service.master.report_processing import (
    ChangeReplicaConfig,
    ConfigChangeType,
    DeleteReplica,
    ReportedState,
    ReportedTablet,
)

__all__ = ["FailedReplicas", "plan_failed_cleanup", "plan_rereplication"]


class FailedReplicas:
    """The replicas tablet servers last reported FAILED, by server (module docstring).

    A full report replaces what is known of its server; an incremental one (the replicas that
    changed) updates the replicas it names. Owned by the leader's catalog manager, emptied
    whenever it loads or unloads.
    """

    def __init__(self) -> None:
        self._by_server: dict[str, frozenset[TabletId]] = {}

    def note_report(self, server: str, reported: Iterable[ReportedTablet], *, full: bool) -> bool:
        """Record one report of `server`; True if it names a FAILED replica not known before
        (re-replication has new work)."""
        reported = list(reported)
        failed = frozenset(r.tablet_id for r in reported if r.state is ReportedState.FAILED)
        before = self._by_server.get(server, frozenset())
        if full:
            now = failed
        else:
            others = {r.tablet_id for r in reported if r.state is not ReportedState.FAILED}
            now = (before - others) | failed
        if now:
            self._by_server[server] = now
        else:
            self._by_server.pop(server, None)
        return not now <= before

    def servers_of(self, tablet_id: str) -> frozenset[str]:
        """The servers where a replica of `tablet_id` is FAILED."""
        return frozenset(u for u, tablets in self._by_server.items() if tablet_id in tablets)

    def tablet_ids(self) -> frozenset[TabletId]:
        """Every tablet with a FAILED replica somewhere."""
        return frozenset(t for tablets in self._by_server.values() for t in tablets)

    def __len__(self) -> int:
        """FAILED replicas known (a gauge of the master's metrics)."""
        return sum(len(tablets) for tablets in self._by_server.values())

    def clear(self) -> None:
        self._by_server.clear()


def plan_failed_cleanup(
    tablet: TabletRecord, failed_on: Collection[str]
) -> tuple[DeleteReplica, ...]:
    """Tombstone each FAILED replica of `tablet` (on the servers `failed_on`) that the
    committed config no longer names: it was replaced. Compare-and-set on the config op
    index, so a replica re-added meanwhile in a newer config is not deleted."""
    cs = tablet.consensus
    if tablet.state is not TabletState.RUNNING or cs is None:
        return ()
    tid = tablet.tablet_id
    return tuple(
        DeleteReplica(
            tid,
            NodeId(u),
            True,
            cs.config_index,
            f"the FAILED replica of tablet {tid} on {u} was replaced (config op index "
            f"{cs.config_index})",
        )
        for u in sorted(failed_on)
        if cs.peer(u) is None
    )


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

    `failed(uuid)`: the replica on `uuid` is lost (its server has been dead longer than the
    eviction time, or reports the replica FAILED); `servers`: every server as placement sees
    it (`live` ones are candidates); `addresses`: their rpc addresses; `excluded`: servers not
    to choose (e.g. one whose addition just failed).
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
                ConfigChangeType.REMOVE_PEER,
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
                ConfigChangeType.REMOVE_PEER,
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
        ConfigChangeType.ADD_PEER,
        peer,
        cs.config_index,
        f"voter {failed_voters[0].uuid} of tablet {tid} failed: adding {chosen} "
        "as a non-voter to promote",
    )
