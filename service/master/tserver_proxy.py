"""The master's client of tablet servers' admin RPCs (tserver.proto, TabletServerAdminService).

Theory of operation
-------------------
The leader master changes tablet servers only through four admin RPCs (docs/design/catalog.md#R7):
CreateTablet, DeleteTablet, AlterSchema and ChangeConfig. Every request

* names its destination's permanent uuid (`dest_uuid`): a server refuses a request meant for
  another uuid (an address reused after a move, a wiped server back under a new uuid,
  docs/design/consensus.md#R9);
* carries the fence `{master_uuid, master_term}`: a server refuses a term lower than the
  highest it has seen, so a deposed leader's requests are not honoured (docs/design/failover.md#R5);
* has a deadline (`rpc_timeout_s`).

A failed call raises the `TesseraError` its status stands for (`errors.from_grpc`: a server's
CasMismatch, StaleTerm, NotFound...; a server that cannot be reached is ServiceUnavailable, a
deadline Timeout). Retrying is the caller's business (`background_tasks`).

One `grpc.aio` channel per server address, created on first use and kept until `aclose()` (a
server that re-registered at another address gets a new channel; at most `max_channels` are
kept, the least recently used closed first; renewed credentials replace them all,
`replace_credentials`). One event loop owns the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from service.common import error_mapping
from service.common.errors import InvalidArgument
from service.common.schema import Schema
from service.common.schema_codec import partition_schema_to_pb, partition_to_pb, schema_to_pb
from service.common.tls import Credentials, open_channel
from service.master.catalog_records import (
    ConsensusState,
    RaftPeer,
    TableRecord,
    TabletRecord,
    consensus_state_from_pb,
    consensus_state_to_pb,
)
from service.master.report_processing import Evidence
from service.pb import common_pb2 as cpb
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc

__all__ = ["Fence", "TServerProxy"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Fence:
    """Who sends, in which term (tserver.proto's MasterFencePB)."""

    master_uuid: str
    master_term: int

    def to_pb(self) -> tpb.MasterFencePB:
        return tpb.MasterFencePB(master_uuid=self.master_uuid, master_term=self.master_term)


def raft_config_pb(cs: ConsensusState) -> mpb.RaftConfigPB:
    """The committed config of `cs` as RaftConfigPB (peers with their last known addresses)."""
    return consensus_state_to_pb(cs).committed_config


def raft_peer_pb(peer: RaftPeer) -> mpb.RaftPeerPB:
    out = mpb.RaftPeerPB(
        permanent_uuid=peer.uuid, member_type=peer.member_type.value, promote=peer.promote
    )
    if peer.last_known_addr is not None:
        out.last_known_addr.host = peer.last_known_addr.host
        out.last_known_addr.port = peer.last_known_addr.port
    return out


class TServerProxy:
    """Admin RPCs to tablet servers (module docstring)."""

    def __init__(
        self,
        *,
        rpc_timeout_s: float,
        grpc_options: list[tuple[str, Any]] | None = None,
        max_channels: int = 4096,
        credentials: Credentials | None = None,
    ) -> None:
        if not rpc_timeout_s > 0:
            raise ValueError(f"rpc_timeout_s must be > 0, got {rpc_timeout_s}")
        self.rpc_timeout_s = rpc_timeout_s
        self._options = list(grpc_options or [])
        self._max_channels = max_channels
        self._credentials = credentials
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._stubs: dict[str, tserver_pb2_grpc.TabletServerAdminServiceStub] = {}
        self._closing: set[asyncio.Future[None]] = set()
        self._closed = False
        self._table_pb_cache: dict[
            str, tuple[TableRecord, cpb.SchemaPB, cpb.PartitionSchemaPB]
        ] = {}

    # --- the RPCs ----------------------------------------------------------------------------

    async def create_tablet(
        self,
        address: str,
        dest_uuid: str,
        fence: Fence,
        tablet: TabletRecord,
        table: TableRecord,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """CreateTablet of `tablet` (which must have its committed config) on `dest_uuid`;
        `timeout_s`: its deadline (default `rpc_timeout_s`; the background tasks give one that
        grows with the server's latency, create_pacing)."""
        timeout = self.rpc_timeout_s if timeout_s is None else timeout_s
        if tablet.consensus is None:
            raise ValueError(f"tablet {tablet.tablet_id} has no config to create it with")
        schema_pb, partition_schema_pb = self._table_pbs(table)
        req = tpb.CreateTabletRequestPB(
            dest_uuid=dest_uuid,
            fence=fence.to_pb(),
            tablet_id=tablet.tablet_id,
            table_id=tablet.table_id,
            table_name=table.name,
            partition=partition_to_pb(tablet.partition),
            schema=schema_pb,
            partition_schema=partition_schema_pb,
            config=raft_config_pb(tablet.consensus),
        )
        await self._call(address, lambda s: s.CreateTablet(req, timeout=timeout))

    def _table_pbs(self, table: TableRecord) -> tuple[cpb.SchemaPB, cpb.PartitionSchemaPB]:
        """The table's schema and partition schema as protobuf, encoded (and the partition
        schema validated) once per committed table record, not once per CreateTablet: a
        10,000-tablet table sends 30,000 of them."""
        cached = self._table_pb_cache.get(table.table_id)
        if cached is None or cached[0] is not table:
            pbs = (
                schema_to_pb(table.schema),
                partition_schema_to_pb(table.partition_schema, table.schema),
            )
            cached = self._table_pb_cache[table.table_id] = (table, *pbs)
        return cached[1], cached[2]

    async def delete_tablet(
        self,
        address: str,
        dest_uuid: str,
        fence: Fence,
        tablet_id: str,
        *,
        tombstone: bool,
        cas_config_opid_index: int | None = None,
        reason: str = "",
    ) -> None:
        """DeleteTablet: TABLET_DATA_TOMBSTONED if `tombstone` (an evicted replica, keeps its
        consensus metadata), else TABLET_DATA_DELETED (the tablet or its table was deleted)."""
        req = tpb.DeleteTabletRequestPB(
            dest_uuid=dest_uuid,
            fence=fence.to_pb(),
            tablet_id=tablet_id,
            delete_type=tpb.TABLET_DATA_TOMBSTONED if tombstone else tpb.TABLET_DATA_DELETED,
            reason=reason,
        )
        if cas_config_opid_index is not None:
            req.cas_config_opid_index = cas_config_opid_index
        await self._call(address, lambda s: s.DeleteTablet(req, timeout=self.rpc_timeout_s))

    async def alter_schema(
        self,
        address: str,
        dest_uuid: str,
        fence: Fence,
        tablet_id: str,
        schema: Schema,
        new_table_name: str = "",
    ) -> int:
        """AlterSchema to `schema` (its version); returns the version the replica runs."""
        req = tpb.AlterSchemaRequestPB(
            dest_uuid=dest_uuid,
            fence=fence.to_pb(),
            tablet_id=tablet_id,
            schema=schema_to_pb(schema),
            new_table_name=new_table_name,
        )
        resp: tpb.AlterSchemaResponsePB = await self._call(
            address, lambda s: s.AlterSchema(req, timeout=self.rpc_timeout_s)
        )
        return resp.schema_version

    async def change_config(
        self,
        address: str,
        dest_uuid: str,
        fence: Fence,
        tablet_id: str,
        change: int,
        peer: RaftPeer,
        cas_config_opid_index: int | None,
    ) -> mpb.ConsensusStatePB:
        """ChangeConfig (`change`: tpb.ChangeConfigRequestPB.ADD_PEER, REMOVE_PEER or
        PROMOTE_PEER) sent to the tablet's leader, compare-and-set on the committed config."""
        req = tpb.ChangeConfigRequestPB(
            dest_uuid=dest_uuid,
            fence=fence.to_pb(),
            tablet_id=tablet_id,
            type=change,  # type: ignore[arg-type]
            peer=raft_peer_pb(peer),
        )
        if cas_config_opid_index is not None:
            req.cas_config_opid_index = cas_config_opid_index
        resp: tpb.ChangeConfigResponsePB = await self._call(
            address, lambda s: s.ChangeConfig(req, timeout=self.rpc_timeout_s)
        )
        return resp.consensus_state

    async def consensus_states(
        self, address: str, dest_uuid: str, tablet_ids: list[str], timeout_s: float
    ) -> dict[str, Evidence]:
        """What `dest_uuid` holds for each of `tablet_ids` it hosts (GetConsensusState): its
        committed consensus state and its pending config, if any; entries it cannot decode
        are left out."""
        req = tpb.GetConsensusStateRequestPB(dest_uuid=dest_uuid, tablet_ids=tablet_ids)
        resp: tpb.GetConsensusStateResponsePB = await self._call(
            address, lambda s: s.GetConsensusState(req, timeout=timeout_s)
        )
        out: dict[str, Evidence] = {}
        for entry in resp.tablets:
            if not entry.HasField("consensus_state"):
                continue
            cs = entry.consensus_state
            with contextlib.suppress(InvalidArgument):
                committed = consensus_state_from_pb(cs, "consensus_state")
                pending = None
                if cs.HasField("pending_config") and cs.pending_config.peers:
                    as_committed = mpb.ConsensusStatePB(
                        current_term=cs.current_term, committed_config=cs.pending_config
                    )
                    pending = consensus_state_from_pb(as_committed, "pending_config")
                out[entry.tablet_id] = Evidence(committed, pending)
        return out

    async def leader_step_down(
        self, address: str, dest_uuid: str, fence: Fence, tablet_id: str
    ) -> None:
        """Ask the tablet's leader to hand leadership to its most caught-up voter (fenced, as
        every admin call of a master)."""
        req = tpb.LeaderStepDownRequestPB(
            dest_uuid=dest_uuid, tablet_id=tablet_id, fence=fence.to_pb()
        )
        await self._call(address, lambda s: s.LeaderStepDown(req, timeout=self.rpc_timeout_s))

    async def txn_op(
        self,
        address: str,
        dest_uuid: str,
        fence: Fence,
        tablet_id: str,
        txn_id: int,
        op: tpb.TxnParticipantOpRequestPB.Op.ValueType,
        commit_timestamp: int = 0,
        kept_attempts: tuple[str, ...] = (),
    ) -> int:
        """A transaction's prepare, commit or abort on a participant tablet's leader
        (docs/design/transactions.md#R3); a prepare answers with its prepare timestamp."""
        req = tpb.TxnParticipantOpRequestPB(
            dest_uuid=dest_uuid,
            fence=fence.to_pb(),
            tablet_id=tablet_id,
            txn_id=txn_id,
            op=op,
            commit_timestamp=commit_timestamp,
            kept_attempts=list(kept_attempts),
        )
        resp = await self._call(
            address, lambda s: s.TxnParticipantOp(req, timeout=self.rpc_timeout_s)
        )
        return int(resp.prepare_timestamp)

    # --- channels ----------------------------------------------------------------------------

    async def _call(self, address: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """Call `fn(stub)` (a grpc.aio call; the generated stubs are typed as sync ones). A
        failure raises its TesseraError (`error_mapping.mapped`: every call of the proxy
        comes through here, so its channels carry no interceptors, which cost a task per
        call)."""
        return await error_mapping.mapped(fn(self._stub(address)))

    def _stub(self, address: str) -> tserver_pb2_grpc.TabletServerAdminServiceStub:
        if self._closed:
            raise RuntimeError("the tablet server proxy is closed")
        stub = self._stubs.get(address)
        if stub is not None:
            self._channels.move_to_end(address)
            return stub
        while len(self._channels) >= self._max_channels:
            old, channel = self._channels.popitem(last=False)
            self._stubs.pop(old, None)
            closing = asyncio.ensure_future(channel.close(None))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        channel = open_channel(
            address,
            self._credentials,
            role="tserver",
            options=self._options,
        )
        self._channels[address] = channel
        stub = self._stubs[address] = tserver_pb2_grpc.TabletServerAdminServiceStub(channel)
        return stub

    def replace_credentials(self, creds: Credentials) -> None:
        """Call with renewed credentials from now on (service/common/cert_renewal.py): the
        channels opened with the old ones are dropped, so the next call to each server opens a
        new connection that presents the new certificate. Calls in flight on them get a grace
        period of one RPC timeout to finish."""
        self._credentials = creds
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            closing = asyncio.ensure_future(channel.close(self.rpc_timeout_s))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def __len__(self) -> int:
        return len(self._channels)

    async def aclose(self) -> None:
        """Close every channel (calls in flight fail). Idempotent."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        # All at once: a master with 300 servers' channels closed them one after another.
        await asyncio.gather(*(channel.close(None) for channel in channels), return_exceptions=True)
