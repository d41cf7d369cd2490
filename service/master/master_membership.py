"""AddMaster and RemoveMaster: changing the membership of sys.catalog's Raft group.

The masters are the voters of one Raft group, so adding or removing a master is one Raft
membership change at a time (Raft thesis 4.1; docs/design/consensus.md#R4), proposed by the
leader with a compare-and-set on the committed config's index:

AddMaster(address)
  1. The new master's uuid is derived from its address (`master_uuid`), as for every
     master. A uuid given in the request must match it.
  2. The new master must be running and in no group: it is asked ConnectToMaster and
     ListMasters, and must answer with that uuid and as a NON_PARTICIPANT. It is started with
     `join_existing = true` and an empty data dir, so it waits outside any config.
  3. The leader takes a snapshot, then proposes ADD_LEARNER with the address and the promote
     mark. It ships the new master sys.catalog as that snapshot, never as the log from index 1:
     the group's first config was bootstrapped, not logged, so a master that replayed the log
     would apply every membership change onto an empty config and count a wrong quorum (found
     by this module's tests; `Raft._send_append`). Then the leader's RaftNode turns it into a
     voter once its log has caught up (`NodeQuiescence._maybe_promote`, after every tick; Kudu's
     PRE_VOTER, docs/design/tablet_copy.md#R7), so
     the quorum never counts on a master that cannot vote sensibly yet.
  4. The call returns once the master is a voter in the committed config, or fails with
     TIMED_OUT naming what is left (the change itself stays: the master is promoted when it
     catches up).

  A master that is already a voter is a success with nothing done, so a call retried after a
  leader failover (the first attempt may have committed) does not fail.

RemoveMaster(uuid or address)
  - NOT_FOUND if no member has that uuid or address; FAILED_PRECONDITION for the last voter.
  - The leader does not remove itself while leading: it hands leadership to the most caught-up
    other voter and answers NOT_THE_LEADER naming it, so the client's retry reaches the new
    leader, which removes it (Kudu refuses instead; handing over is what an operator would do
    next anyway).
  - REMOVE, with compare-and-set. The removed master is no longer asked for votes or sent the
    log; it should then be shut down (`tessera master remove --dir` does so for a local cluster)
    and its data dir wiped before the address is used again: its peers remember its incarnation
    (`transport.Incarnations`).

Tablet servers learn the new membership from heartbeat responses (`master_addresses` is the
leader's current config), so they heartbeat to an added master and stop heartbeating to a
removed one without a restart.

`MasterMembership` is handed what it uses of its master (master.py wires it): the Raft node of
sys.catalog, the master's uuid, the addresses the transport knows, and its credentials as of
each call (a renewal replaces them). `MasterPeer` and `master_uuid` live here, beside the code
that derives a new master's uuid, for every module that names masters.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.common import error_mapping
from service.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotTheLeader,
    TesseraError,
    Timeout,
)
from service.common.ids import NodeId
from service.common.tls import Credentials, open_channel
from service.consensus.node import RaftNode
from service.consensus.vouch import CHECK_TIMEOUT_S, Ask, MemberView
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.raft import ConfigChangeType, Role

__all__ = ["MasterMembership", "MasterPeer", "list_masters_asker", "master_uuid"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
"""Deadline of the ConnectToMaster asked of a master about to be added."""
POLL_S = 0.05
"""Pause between checks of the config while waiting for a promotion or a leader change."""


_NOT_IN_NODE_ID = re.compile(r"[^A-Za-z0-9._-]")


def master_uuid(address: str) -> NodeId:
    """The uuid of the master reachable at `address` (host:port): ``master-<host>-<port>``
    (`master` module docstring: identity)."""
    host, _, port = address.rpartition(":")
    raw = f"master-{_NOT_IN_NODE_ID.sub('-', host.strip('[]'))}-{port}"
    return NodeId(raw[:64])


@dataclass(frozen=True, slots=True)
class MasterPeer:
    """One master of the group, as every master derives it from `master_addresses`."""

    uuid: NodeId
    address: str


class MasterMembership:
    """The leader's side of AddMaster/RemoveMaster (module docstring)."""

    def __init__(
        self,
        node: RaftNode,
        uuid: NodeId,
        address_of: Callable[[str], str | None],
        credentials: Callable[[], Credentials | None],
    ) -> None:
        self.node = node
        """sys.catalog's Raft node on this master: the membership changes go through it."""
        self.uuid = uuid
        """This master's: it hands leadership over before it is removed."""
        self.address_of = address_of
        """A master's address by uuid (`MasterServer.address_of`), for messages and the
        handover's redirect."""
        self.credentials = credentials
        """This master's certificate and key now (None when insecure), to probe a new one."""

    # --- AddMaster ----------------------------------------------------------------------------

    async def add(self, address: str, uuid: str, timeout: float) -> NodeId:
        """Add the master at `address` as a voter (module docstring); returns its uuid."""
        node = self._leader_node()
        _check_address(address)
        derived = master_uuid(address)
        if uuid and uuid != derived:
            raise InvalidArgument(
                f"uuid: the master at {address} has uuid {derived!r} (derived from its address), "
                f"not {uuid!r}"
            )
        deadline = time.monotonic() + timeout
        config = node.status().committed_config
        if derived in config.voters:
            return derived
        if derived not in config.learners:
            await self._probe(address, derived)
            # The new master must start from a snapshot (`Raft._send_append`): make one.
            await node.snapshot_now(timeout=_left(deadline, "taking a snapshot"))
            await node.change_config(
                ConfigChangeType.ADD_LEARNER,
                derived,
                address=address,
                expected_index=node.applied_config.index,
                timeout=_left(deadline, f"adding master {derived}"),
            )
        while time.monotonic() < deadline:
            st = node.status()
            if st.role is not Role.LEADER:
                raise node.not_leader_error()
            if derived in st.committed_config.voters:
                return derived
            await asyncio.sleep(POLL_S)
        match = node.status().progress.get(derived)
        raise Timeout(
            f"master {derived} ({address}) was added as a non-voter but has not caught up within "
            f"{timeout:.0f}s (replicated to index {match.match if match else 0} of "
            f"{node.status().commit}); it is promoted to voter when it does"
        )

    async def _probe(self, address: str, uuid: NodeId) -> None:
        """The master to add must be up, have `uuid`, and not lead a group of its own."""
        try:
            # Over mutual TLS in a secure cluster: the new master must hold a master
            # certificate of the cluster's CA, or the handshake fails here.
            async with open_channel(
                address,
                self.credentials(),
                role="master",
                interceptors=error_mapping.INTERCEPTORS,
            ) as channel:
                stub = master_pb2_grpc.MasterServiceStub(channel)
                resp: pb.ConnectToMasterResponsePB = await stub.ConnectToMaster(
                    pb.ConnectToMasterRequestPB(), timeout=PROBE_TIMEOUT_S
                )
                masters: pb.ListMastersResponsePB = await stub.ListMasters(
                    pb.ListMastersRequestPB(), timeout=PROBE_TIMEOUT_S
                )
        except TesseraError as e:
            raise FailedPrecondition(
                f"master to add at {address} did not answer ({e}): start it first, "
                "with join_existing = true and an empty data dir"
            ) from None
        own = [e for e in masters.masters if e.instance.instance_seqno]
        reported = own[0].instance.permanent_uuid if own else ""
        if reported and reported != uuid:
            raise FailedPrecondition(
                f"the server at {address} is master {reported!r}, not {uuid!r}: it was started "
                "with another advertised address"
            )
        if resp.role == pb.LEADER:
            raise FailedPrecondition(
                f"master at {address} leads a group of its own (term {resp.term}): restart it "
                "with join_existing = true and an empty data dir"
            )
        if resp.role != pb.NON_PARTICIPANT:
            raise FailedPrecondition(
                f"master at {address} is a {pb.RaftRolePB.Name(resp.role)} of another group: "
                "only a master in no group (join_existing = true, empty data dir) can be added"
            )

    # --- RemoveMaster -------------------------------------------------------------------------

    async def remove(self, uuid: str, address: str, timeout: float) -> NodeId:
        """Remove the master named by `uuid` or `address` (module docstring)."""
        node = self._leader_node()
        if not uuid and not address:
            raise InvalidArgument("uuid or rpc_address: name the master to remove")
        config = node.status().committed_config
        members = sorted(config.voters | config.learners)
        target = None
        for member in members:
            if (uuid and member == uuid) or (address and self.address_of(member) == address):
                target = member
                break
        if target is None:
            raise NotFound(
                f"no master {uuid or address!r} in the group (members: "
                f"{', '.join(f'{x} ({self.address_of(x)})' for x in members)})"
            )
        if target in config.voters and len(config.voters) == 1:
            raise FailedPrecondition(f"master {target} is the only voter: the group needs one")
        deadline = time.monotonic() + timeout
        if target == self.uuid:
            await self._hand_over(deadline)
        await node.change_config(
            ConfigChangeType.REMOVE,
            target,
            expected_index=node.applied_config.index,
            timeout=_left(deadline, f"removing master {target}"),
        )
        return target

    async def _hand_over(self, deadline: float) -> None:
        """The leader is to be removed: make the most caught-up other voter leader, and send the
        caller there (NOT_THE_LEADER with the new leader's address)."""
        node = self._leader_node()
        st = node.status()
        others = [v for v in st.committed_config.voters if v != self.uuid]
        target = max(others, key=lambda v: st.progress[v].match if v in st.progress else 0)
        await node.transfer_leadership(target, timeout=_left(deadline, "handing leadership over"))
        raise NotTheLeader(
            f"master {self.uuid} handed leadership to {target} so that it can be removed; "
            "retry there",
            leader_uuid=target,
            leader_address=self.address_of(target),
        )

    def _leader_node(self) -> RaftNode:
        node = self.node
        if node.status().role is not Role.LEADER:
            raise node.not_leader_error()
        return node


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"rpc_address: {address!r} is not host:port with a port in 1..65535")


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout(f"out of time before {what}")
    return left


def list_masters_asker(credentials: Callable[[], Credentials | None]) -> Ask:
    """How a master asks another for its view of sys.catalog's group, so that a master whose
    config is stale takes a new leader on a member's word (service/consensus/vouch.py):
    ListMasters, with this master's credentials as of each call."""

    async def ask(member: str, address: str, group: str) -> MemberView | None:
        try:
            async with open_channel(
                address, credentials(), role="master", interceptors=error_mapping.INTERCEPTORS
            ) as channel:
                resp: pb.ListMastersResponsePB = await master_pb2_grpc.MasterServiceStub(
                    channel
                ).ListMasters(pb.ListMastersRequestPB(), timeout=CHECK_TIMEOUT_S)
        except TesseraError as e:
            log.debug("ListMasters at master %s: %s", member, e)
            return None
        members = {}
        for entry in resp.masters:
            a = entry.rpc_addresses[0] if entry.rpc_addresses else None
            members[entry.instance.permanent_uuid] = f"{a.host}:{a.port}" if a and a.port else ""
        return MemberView(resp.config_index, members)

    return ask
