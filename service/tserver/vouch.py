"""How a tablet replica asks a member of its config for that member's view of the tablet's Raft
group, so that a replica with a stale config can take a new leader on a member's word
(service/consensus/vouch.py): GetConsensusState, which a tablet server may call for the tablets
whose config names it (docs/design/security.md#R12)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from service.common.errors import from_grpc
from service.common.tls import Credentials, open_channel
from service.consensus.vouch import CHECK_TIMEOUT_S, Ask, MemberView
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc

log = logging.getLogger(__name__)


def consensus_state_asker(credentials: Callable[[], Credentials | None]) -> Ask:
    """An `Ask` by GetConsensusState, with this server's credentials as of each call."""

    async def ask(member: str, address: str, tablet_id: str) -> MemberView | None:
        req = tpb.GetConsensusStateRequestPB(dest_uuid=member, tablet_ids=[tablet_id])
        try:
            async with open_channel(address, credentials(), role="tserver") as ch:
                resp = await tpb_grpc.TabletServerAdminServiceStub(ch).GetConsensusState(
                    req, timeout=CHECK_TIMEOUT_S
                )
        except grpc.aio.AioRpcError as e:
            log.debug("tablet %s: GetConsensusState at %s: %s", tablet_id, member, from_grpc(e))
            return None
        for entry in resp.tablets:
            if entry.tablet_id == tablet_id:
                return newest_view(entry.consensus_state)
        return None

    return ask


def newest_view(cs: mpb.ConsensusStatePB) -> MemberView:
    """The newest config in `cs`: the pending one when a change is in flight (a config being
    changed to drop a sender does not vouch for it), else the committed one."""
    config = cs.committed_config
    if cs.HasField("pending_config") and cs.pending_config.opid_index > config.opid_index:
        config = cs.pending_config
    members = {}
    for peer in config.peers:
        a = peer.last_known_addr
        members[peer.permanent_uuid] = f"{a.host}:{a.port}" if a.host and a.port else ""
    return MemberView(config.opid_index, members)
