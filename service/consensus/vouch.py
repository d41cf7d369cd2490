"""A replica whose config is stale takes a new leader on the word of a member it knows.

Raft messages for a group are taken only from members of the receiving node's config (`deliver`
in transport.py; docs/design/security.md#R12 gives the whole rule): a server holding a
certificate of the group's role that is not a member could otherwise lead the node and write
into its state. A node's config can be stale, though. One that was down while server D was added
and then took the lead still holds the old config, and D is an outsider to it. Nothing else
brings it up to date: its leader is the only server that sends it entries (and, for a tablet,
that leader's StartTabletCopy is refused for the same reason). Left alone, the node stays
behind for good, a member in name that acknowledges nothing.

So a batch from a non-member makes the node ask the members its own config names for their
view of the group (`ask`: GetConsensusState between tablet servers, service/tserver/vouch.py;
ListMasters between masters, service/master/master_membership.py). When one of them answers
with a config newer than the node's own that names the sender, the sender is *vouched for*:
taken as a member until the node's own config reaches the index of the config that vouched (by
then it has the entries that name, or no longer name, the sender, and its own config decides
again).

This grants nothing new. A member could send the node forged entries itself, so its word about
who else is a member is worth exactly as much as its own messages. A sender no member names
stays refused. Checks are bounded: one at a time per sender (whatever the group), none for a
sender within `retry_s` after one of its checks did not vouch (in any group), none again for the
same (group, sender) within `retry_s`, and at most `max_checks` at once. So the refused traffic
of a hostile certificate holder, however many groups it names, costs the members at most one
check every `retry_s`, while a genuine new leader of many groups is checked group after group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from service.consensus.node import RaftNode
from service.consensus.transport import GrpcTransport

log = logging.getLogger(__name__)

RETRY_S = 3.0
"""After a check that did not vouch for a sender: how long before it is checked again."""
CHECK_TIMEOUT_S = 5.0
"""Each call of a check to one member (`ask`)."""
MAX_CHECKS = 16
"""Checks running at once, on all groups; a batch beyond it is just refused (and retried by
its sender, so a genuine leader is checked once the others are done)."""


@dataclass(frozen=True)
class MemberView:
    """A member's newest config of a group: its log index, and its members with the address
    each is known at there ("" if none)."""

    index: int
    members: dict[str, str]


Ask = Callable[[str, str, str], Awaitable[MemberView | None]]
"""`ask(member, address, group)`: that member's view of the group, None if it gave none (it did
not answer, does not host the group, refused the caller). Raises nothing."""


class Vouches:
    """The senders members have vouched for, per group, and the checks that find them."""

    def __init__(
        self,
        own_uuid: str,
        node_of: Callable[[str], RaftNode | None],
        transport: GrpcTransport,
        ask: Ask,
        *,
        retry_s: float = RETRY_S,
        max_checks: int = MAX_CHECKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.own_uuid = own_uuid
        self.node_of = node_of
        """The running Raft node of a group hosted here (None: not hosted or not running)."""
        self.transport = transport
        """For members' addresses, and to learn the sender's."""
        self.ask = ask
        self.retry_s = retry_s
        self.max_checks = max_checks
        self.clock = clock
        self._vouched: dict[str, dict[str, int]] = {}
        """group -> sender -> the config index of the view that named it."""
        self._last_check: dict[tuple[str, str], float] = {}
        self._cooldown: dict[str, float] = {}
        """sender -> no check before this time (one of its checks found no vouch)."""
        self._checks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._busy: set[str] = set()
        """Senders with a check running."""
        self.vouched = 0
        """Senders admitted on a member's word (counted once per check that admitted)."""
        self.refused = 0
        """Checks that ended with no member naming the sender."""

    def members(self, group_id: str, node: RaftNode) -> frozenset[str]:
        """Who may send this group's node Raft messages: its config's members, and the senders
        vouched for by a config newer than its own (module docstring)."""
        own = node.config_members()
        vouched = self._vouched.get(group_id)
        if not vouched:
            return own
        index = node.status().config.index
        live = {s: i for s, i in vouched.items() if i > index}
        if len(live) != len(vouched):
            if live:
                self._vouched[group_id] = live
            else:
                del self._vouched[group_id]
        return own | frozenset(live)

    def forget(self, group_id: str) -> None:
        """The node is gone (deleted, tombstoned, replaced by a copy): so is what was vouched
        for it."""
        self._vouched.pop(group_id, None)

    def on_foreign(self, group_id: str, sender: str) -> None:
        """A batch for `group_id` from `sender`, a non-member, was refused: check it (module
        docstring). Never raises; called on the transport's receive path."""
        key = (group_id, sender)
        if sender in self._busy or len(self._checks) >= self.max_checks:
            return
        now = self.clock()
        if now < self._cooldown.get(sender, now):
            return
        last = self._last_check.get(key)
        if last is not None and now - last < self.retry_s:
            return
        self._last_check[key] = now
        if len(self._last_check) > 4 * self.max_checks or len(self._cooldown) > 4 * self.max_checks:
            # Forget what has run out, so that the maps stay small whatever the senders.
            self._last_check = {k: t for k, t in self._last_check.items() if now - t < self.retry_s}
            self._cooldown = {k: t for k, t in self._cooldown.items() if now < t}
        task = asyncio.get_running_loop().create_task(
            self._check(group_id, sender), name=f"vouch-{group_id}-{sender}"
        )
        self._checks[key] = task
        self._busy.add(sender)

        def done(_t: asyncio.Task[None]) -> None:
            self._checks.pop(key, None)
            self._busy.discard(sender)

        task.add_done_callback(done)

    async def _check(self, group_id: str, sender: str) -> None:
        node = self.node_of(group_id)
        if node is None:
            return
        index = node.status().config.index
        for member in sorted(node.config_members() - {self.own_uuid, sender}):
            address = self.transport.address_of(member)
            if not address:
                continue
            view = await self.ask(member, address, group_id)
            if view is None or view.index <= index or sender not in view.members:
                continue
            if self.node_of(group_id) is not node:
                return  # replaced or stopped meanwhile
            self._vouched.setdefault(group_id, {})[sender] = view.index
            sender_address = view.members[sender]
            if sender_address and self.transport.address_of(sender) is None:
                self.transport.set_address(sender, sender_address)
            self.vouched += 1
            log.info(
                "group %s: %s is not in this node's config (index %d); member %s names it in "
                "its config at index %d: taken as a member until this node catches up",
                group_id,
                sender,
                index,
                member,
                view.index,
            )
            return
        self.refused += 1
        self._cooldown[sender] = self.clock() + self.retry_s
        log.info(
            "group %s: raft messages from %s, which this node's config (index %d) does not "
            "name and no member vouched for: refused",
            group_id,
            sender,
            index,
        )

    async def aclose(self) -> None:
        tasks = list(self._checks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
