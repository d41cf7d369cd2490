"""A replica whose config is stale takes a new leader on the word of a member it knows.

Raft messages for a tablet are taken only from members of the replica's config (`deliver` in
service/consensus/transport.py; docs/design/security.md#R12 gives the whole rule): a server
with a tablet server's certificate that is not a member could otherwise lead the replica and
write rows into it. A replica's config can be stale, though. One that was down while a move
added server D, which then took the lead, still holds the old config, and D is an outsider to
it. Nothing else brings it up to date: its leader is the only server that sends it entries, and
that leader's StartTabletCopy is refused for the same reason. Left alone, the replica stays
behind for good, a member in name that acknowledges nothing.

So a batch from a non-member makes the replica ask the members its own config names
(GetConsensusState, which a tablet server may call for the tablets whose config names it) for
their config. When one of them answers with a config newer than the replica's own (its pending
one when a change is in flight, else its committed one) that names the sender, the sender is
*vouched for*: taken as a member until the replica's own config reaches the index of the config
that vouched (by then it has the entries that name, or no longer name, the sender, and its own
config decides again).

This grants nothing new. A member could send the replica forged entries itself, so its word
about who else is a member is worth exactly as much as its own messages. A sender no member
names stays refused. Checks are bounded: one at a time per (tablet, sender), none again for
`retry_s` after one that did not vouch, and at most `max_checks` at once, so refused traffic
from a hostile certificate holder cannot become a flood of calls to the members.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from service.common.errors import from_grpc
from service.common.tls import open_channel
from service.consensus.node import RaftNode
from service.consensus.transport import GrpcTransport
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc

log = logging.getLogger(__name__)

RETRY_S = 3.0
"""After a check that did not vouch for a sender: how long before it is checked again."""
CHECK_TIMEOUT_S = 5.0
"""Each GetConsensusState call of a check."""
MAX_CHECKS = 16
"""Checks running at once, on all tablets; a batch beyond it is just refused (and retried by
its sender, so a genuine leader is checked once the others are done)."""


class Vouches:
    """The senders members have vouched for, per tablet, and the checks that find them."""

    def __init__(
        self,
        own_uuid: str,
        node_of: Callable[[str], RaftNode | None],
        transport: GrpcTransport,
        *,
        retry_s: float = RETRY_S,
        max_checks: int = MAX_CHECKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.own_uuid = own_uuid
        self.node_of = node_of
        """The running Raft node of a tablet hosted here (None: not hosted or not running)."""
        self.transport = transport
        """For members' addresses, this server's credentials, and the sender's address."""
        self.retry_s = retry_s
        self.max_checks = max_checks
        self.clock = clock
        self._vouched: dict[str, dict[str, int]] = {}
        """tablet -> sender -> the config index of the answer that named it."""
        self._last_check: dict[tuple[str, str], float] = {}
        self._checks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.vouched = 0
        """Senders admitted on a member's word (counted once per check that admitted)."""
        self.refused = 0
        """Checks that ended with no member naming the sender."""

    def members(self, tablet_id: str, node: RaftNode) -> frozenset[str]:
        """Who may send this tablet's replica Raft messages: its config's members, and the
        senders vouched for by a config newer than its own (module docstring)."""
        own = node.config_members()
        vouched = self._vouched.get(tablet_id)
        if not vouched:
            return own
        index = node.status().config.index
        live = {s: i for s, i in vouched.items() if i > index}
        if len(live) != len(vouched):
            if live:
                self._vouched[tablet_id] = live
            else:
                del self._vouched[tablet_id]
        return own | frozenset(live)

    def forget(self, tablet_id: str) -> None:
        """The replica is gone (deleted, tombstoned, replaced by a copy): so is what was
        vouched for it."""
        self._vouched.pop(tablet_id, None)

    def on_foreign(self, tablet_id: str, sender: str) -> None:
        """A batch for `tablet_id` from `sender`, a non-member, was refused: check it (module
        docstring). Never raises; called on the transport's receive path."""
        key = (tablet_id, sender)
        if key in self._checks or len(self._checks) >= self.max_checks:
            return
        now = self.clock()
        last = self._last_check.get(key)
        if last is not None and now - last < self.retry_s:
            return
        self._last_check[key] = now
        if len(self._last_check) > 4 * self.max_checks:
            # Forget old refusals so that the map stays small whatever the senders.
            for k, t in list(self._last_check.items()):
                if now - t >= self.retry_s:
                    del self._last_check[k]
        task = asyncio.get_running_loop().create_task(
            self._check(tablet_id, sender), name=f"vouch-{tablet_id}-{sender}"
        )
        self._checks[key] = task
        task.add_done_callback(lambda _t: self._checks.pop(key, None))

    async def _check(self, tablet_id: str, sender: str) -> None:
        node = self.node_of(tablet_id)
        if node is None:
            return
        index = node.status().config.index
        for member in sorted(node.config_members() - {self.own_uuid, sender}):
            config = await self._ask(member, tablet_id)
            if config is None:
                continue
            found = _naming(config, sender, above=index)
            if found is None:
                continue
            vouching_index, address = found
            node = self.node_of(tablet_id)
            if node is None:
                return
            self._vouched.setdefault(tablet_id, {})[sender] = vouching_index
            if address and self.transport.address_of(sender) is None:
                self.transport.set_address(sender, address)
            self.vouched += 1
            log.info(
                "tablet %s: %s is not in this replica's config (index %d); member %s names it "
                "in its config at index %d: taken as a member until this replica catches up",
                tablet_id,
                sender,
                index,
                member,
                vouching_index,
            )
            return
        self.refused += 1
        log.info(
            "tablet %s: raft messages from %s, which this replica's config (index %d) does not "
            "name and no member vouched for: refused",
            tablet_id,
            sender,
            index,
        )

    async def _ask(self, member: str, tablet_id: str) -> mpb.ConsensusStatePB | None:
        address = self.transport.address_of(member)
        if not address:
            return None
        req = tpb.GetConsensusStateRequestPB(dest_uuid=member, tablet_ids=[tablet_id])
        try:
            async with open_channel(address, self.transport.credentials, role="tserver") as ch:
                resp = await tpb_grpc.TabletServerAdminServiceStub(ch).GetConsensusState(
                    req, timeout=CHECK_TIMEOUT_S
                )
        except grpc.aio.AioRpcError as e:
            log.debug(
                "tablet %s: GetConsensusState at %s failed: %s", tablet_id, member, from_grpc(e)
            )
            return None
        for entry in resp.tablets:
            if entry.tablet_id == tablet_id:
                return entry.consensus_state
        return None

    async def aclose(self) -> None:
        tasks = list(self._checks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _naming(cs: mpb.ConsensusStatePB, sender: str, *, above: int) -> tuple[int, str] | None:
    """(config index, sender's address) if the newest config in `cs` (pending, else committed)
    is newer than index `above` and names `sender`; None otherwise (a config that is being
    changed to drop the sender does not vouch for it)."""
    config = cs.committed_config
    if cs.HasField("pending_config") and cs.pending_config.opid_index > config.opid_index:
        config = cs.pending_config
    if config.opid_index <= above:
        return None
    for peer in config.peers:
        if peer.permanent_uuid == sender:
            a = peer.last_known_addr
            return config.opid_index, f"{a.host}:{a.port}" if a.host and a.port else ""
    return None
