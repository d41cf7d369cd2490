"""AddReplica, RemoveReplica and MoveReplica on the master, for operators.

See docs/design/tablet_copy.md#R7 (stateless replica changes) and #R8 (compare-and-set).

Theory of operation
-------------------
The master keeps no record of a config change it asks for (docs/design/tablet_copy.md#R7): each
request is checked against the committed state in the catalog and turned into one ChangeConfig sent
to the tablet's leader, carrying the master's fence and a compare-and-set on the committed config's
op index. The leader refuses it if the config moved on since (CAS_MISMATCH, the caller re-reads and
decides), and the result reaches the catalog through the leader's next tablet report, as every
config change does.

* AddReplica: the new peer joins as a NON_VOTER (Kudu's PRE_VOTER when `member_type` is
  VOTER: `promote` set), the leader copies the tablet to it and promotes it once caught up.
* RemoveReplica: REMOVE_PEER. Removing the leader is refused (move leadership first: the
  caller, or MoveReplica, asks it to step down), and so is removing the last voter.
* MoveReplica: AddReplica(to, VOTER), wait until the catalog shows `to` as a VOTER, step the
  leader down if it is `from`, then RemoveReplica(from); all within the caller's deadline.
  Each step is idempotent, so a retried MoveReplica resumes where the last one stopped.

The report-processing rules then tidy up: the removed replica, no longer in the config, is
tombstoned with a compare-and-set (report processing, step 4).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from service.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServiceUnavailable,
    Timeout,
)
from service.master.catalog_manager import CatalogManager
from service.master.catalog_records import (
    ConsensusState,
    HostPort,
    MemberType,
    RaftPeer,
    TabletState,
)
from service.master.ts_manager import TSManager
from service.master.tserver_proxy import Fence, TServerProxy
from service.pb import tserver_pb2 as tpb

__all__ = ["ReplicaChanges"]

POLL_S = 0.2


class ReplicaChanges:
    """The three operations, over the leader master's catalog, registry and proxy."""

    def __init__(
        self,
        catalog: CatalogManager,
        ts_manager: TSManager,
        proxy: TServerProxy,
        fence: Callable[[], Fence],
    ) -> None:
        self.catalog = catalog
        self.ts = ts_manager
        self.proxy = proxy
        self.fence = fence

    # --- lookups -----------------------------------------------------------------------------

    def _consensus(self, tablet_id: str) -> ConsensusState:
        info = self.catalog.maps.tablets_by_id.get(tablet_id)  # type: ignore[call-overload]
        if info is None:
            raise NotFound(f"tablet {tablet_id!r} not found")
        record = info.record
        if record.state is not TabletState.RUNNING or record.consensus is None:
            raise FailedPrecondition(
                f"tablet {tablet_id} is {record.state.name}: only a RUNNING tablet's replicas "
                "can change"
            )
        return record.consensus

    def _address(self, uuid: str) -> str:
        d = self.ts.get(uuid)
        if d is None or not d.registration.rpc_addresses:
            raise NotFound(f"tablet server {uuid!r} is not registered")
        return d.registration.rpc_addresses[0]

    def _leader(self, tablet_id: str, cs: ConsensusState) -> tuple[str, str]:
        if not cs.leader_uuid:
            raise ServiceUnavailable(f"tablet {tablet_id} has no known leader yet; retry")
        return cs.leader_uuid, self._address(cs.leader_uuid)

    @staticmethod
    def _cas(cs: ConsensusState, cas: int | None) -> int:
        if cas is not None and cas != cs.config_index:
            raise FailedPrecondition(
                f"cas_config_opid_index {cas} is not the committed config's ({cs.config_index})"
            )
        return cs.config_index

    # --- operations --------------------------------------------------------------------------

    async def add(
        self, tablet_id: str, ts_uuid: str, member_type: MemberType, cas: int | None = None
    ) -> None:
        cs = self._consensus(tablet_id)
        if cs.peer(ts_uuid) is not None:
            raise AlreadyExists(f"tablet server {ts_uuid} already has a replica of {tablet_id}")
        d = self.ts.get(ts_uuid)
        if d is None:
            raise NotFound(f"tablet server {ts_uuid!r} is not registered")
        if not d.live:
            raise FailedPrecondition(f"tablet server {ts_uuid} is not live")
        host, _, port = self._address(ts_uuid).rpartition(":")
        peer = RaftPeer(
            ts_uuid,  # type: ignore[arg-type]
            MemberType.NON_VOTER,
            HostPort(host, int(port)),
            promote=member_type is MemberType.VOTER,
        )
        await self._send(tablet_id, cs, tpb.ChangeConfigRequestPB.ADD_PEER, peer, cas)

    async def remove(self, tablet_id: str, ts_uuid: str, cas: int | None = None) -> None:
        cs = self._consensus(tablet_id)
        peer = cs.peer(ts_uuid)
        if peer is None:
            raise NotFound(f"tablet server {ts_uuid} has no replica of {tablet_id}")
        if cs.leader_uuid == ts_uuid:
            raise FailedPrecondition(
                f"{ts_uuid} leads tablet {tablet_id}: move leadership first (MoveReplica does)"
            )
        if peer.member_type is MemberType.VOTER and len(cs.voters) <= 1:
            raise FailedPrecondition(f"{ts_uuid} is the last voter of tablet {tablet_id}")
        await self._send(tablet_id, cs, tpb.ChangeConfigRequestPB.REMOVE_PEER, peer, cas)

    async def _send(
        self, tablet_id: str, cs: ConsensusState, change: int, peer: RaftPeer, cas: int | None
    ) -> None:
        """One ChangeConfig to the leader the catalog names, fenced, compare-and-set."""
        leader, address = self._leader(tablet_id, cs)
        await self.proxy.change_config(
            address, leader, self.fence(), tablet_id, change, peer, self._cas(cs, cas)
        )

    async def move(self, tablet_id: str, from_ts: str, to_ts: str, timeout: float) -> None:
        if from_ts == to_ts:
            raise InvalidArgument("from_ts_uuid and to_ts_uuid are the same server")
        deadline = time.monotonic() + timeout
        cs = self._consensus(tablet_id)
        if cs.peer(from_ts) is None and cs.peer(to_ts) is not None:
            return  # already moved (a retry)
        if cs.peer(from_ts) is None:
            raise NotFound(f"tablet server {from_ts} has no replica of {tablet_id}")
        if cs.peer(to_ts) is None:
            await self.add(tablet_id, to_ts, MemberType.VOTER)
        await self._until(
            deadline,
            f"{to_ts} to become a voter of {tablet_id}",
            lambda c: c.peer(to_ts) is not None and c.peer(to_ts).member_type is MemberType.VOTER,  # type: ignore[union-attr]
            tablet_id,
        )
        if self._consensus(tablet_id).leader_uuid == from_ts:
            await self.proxy.leader_step_down(
                self._address(from_ts), from_ts, self.fence(), tablet_id
            )
            await self._until(
                deadline,
                f"a new leader of {tablet_id}",
                lambda c: bool(c.leader_uuid) and c.leader_uuid != from_ts,
                tablet_id,
            )
        await self.remove(tablet_id, from_ts)

    async def _until(
        self,
        deadline: float,
        what: str,
        done: Callable[[ConsensusState], bool],
        tablet_id: str,
    ) -> None:
        while not done(self._consensus(tablet_id)):
            if time.monotonic() > deadline:
                raise Timeout(f"MoveReplica: timed out waiting for {what}")
            await asyncio.sleep(POLL_S)
