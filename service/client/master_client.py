"""Talking to the master leader: discovery, retries inside a deadline, exactly-once DDL.

Theory of operation
-------------------
The client knows a list of master addresses, not which one leads. `_discover()` asks every
master `ConnectToMaster` at once and takes the one that says LEADER with the highest term (two
can briefly both believe it during a failover; the higher term is the newer one). Failing that,
a follower's leader hint is tried. The leader found is cached until a call says otherwise.

Every catalog call goes through `call()`, which loops until the caller's deadline:

* NOT_THE_LEADER: follow the leader hint at once if there is one, else rediscover;
* NOT_READY (a new leader still loading the catalog) and other SERVICE_UNAVAILABLE (connection
  refused, a master shutting down): back off, then rediscover;
* a per-attempt timeout: back off and try again. Safe for every master call: reads are
  side-effect free and DDL carries a request id;
* any other error is the answer and is raised as the `TesseraError` it stands for.

Exactly-once DDL (docs/design/catalog.md#R11): each DDL call takes one `RequestIdPB`
(client_id, seq_no) before its first attempt and keeps it across attempts. The master stores the
result with the replicated entry, so a CreateTable whose reply was lost in a failover is
answered on retry with the original table id instead of failing with "already exists" or
creating a second table. `first_incomplete_seq_no` tells the master which results it may forget.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message

from service.client.channels import ChannelPool
from service.client.retry import Backoff, Deadline
from service.common.errors import (
    NotReady,
    NotTheLeader,
    ServiceUnavailable,
    TesseraError,
    Timeout,
)
from service.pb import master_pb2 as pb

__all__ = ["MasterClient", "RequestIds"]

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Message)

DISCOVERY_ATTEMPT_S = 2.0
"""Longest one ConnectToMaster may take during discovery: a hung master must not hold it up."""
ATTEMPT_CAP_S = 15.0
"""Longest one attempt of a catalog call may take; the rest of the deadline goes to retries."""
DISCOVERY_BACKOFF_CAP_S = 0.5
"""Longest pause between two rounds of discovery. No master leads for about an election
timeout after a leader dies (1.5-2 s by default); with the calls' own cap of 2 s a client
still asking then found the new leader up to 2 s after it was elected. One round is a
ConnectToMaster to each master, and the jitter still spreads many clients' rounds."""


class RequestIds:
    """Issues (client_id, seq_no) pairs in increasing order and tracks which are unanswered."""

    def __init__(self, client_id: str | None = None) -> None:
        self.client_id = client_id or f"client-{uuid.uuid4().hex}"
        self._next = 1
        self._outstanding: set[int] = set()

    def new(self) -> pb.RequestIdPB:
        seq = self._next
        self._next += 1
        self._outstanding.add(seq)
        return pb.RequestIdPB(
            client_id=self.client_id,
            seq_no=seq,
            first_incomplete_seq_no=min(self._outstanding),
        )

    def done(self, rid: pb.RequestIdPB) -> None:
        self._outstanding.discard(rid.seq_no)


def _address(hp: pb.HostPortPB) -> str:
    return f"{hp.host}:{hp.port}"


class MasterClient:
    """Catalog RPCs to whichever master leads, retried inside the caller's deadline."""

    def __init__(
        self,
        addresses: Sequence[str],
        channels: ChannelPool | None = None,
        *,
        client_id: str | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("at least one master address is required")
        self.addresses = list(dict.fromkeys(addresses))
        self._pool = channels or ChannelPool()
        self._owns_pool = channels is None
        self._leader: str | None = None
        self._discovering: asyncio.Task[str] | None = None
        self.request_ids = RequestIds(client_id)

    @property
    def leader(self) -> str | None:
        """The master believed to lead (None until discovered or after it failed)."""
        return self._leader

    async def aclose(self) -> None:
        if self._discovering is not None:
            self._discovering.cancel()
        if self._owns_pool:
            await self._pool.aclose()

    # --- discovery ---------------------------------------------------------------------------

    async def _connect(self, address: str, deadline: Deadline) -> pb.ConnectToMasterResponsePB:
        stub = self._pool.master(address)
        resp: pb.ConnectToMasterResponsePB = await stub.ConnectToMaster(  # type: ignore[misc]
            pb.ConnectToMasterRequestPB(),
            timeout=deadline.attempt_timeout(DISCOVERY_ATTEMPT_S),
        )
        return resp

    async def _discover_once(self, deadline: Deadline) -> str:
        results = await asyncio.gather(
            *(self._connect(a, deadline) for a in self.addresses), return_exceptions=True
        )
        best: tuple[int, str, pb.ConnectToMasterResponsePB] | None = None
        hints: list[str] = []
        errors: list[str] = []
        timeouts = 0
        for address, r in zip(self.addresses, results, strict=True):
            if isinstance(r, BaseException):
                errors.append(f"{address}: {r}")
                timeouts += isinstance(r, Timeout)
                continue
            if r.role == pb.LEADER and (best is None or r.term > best[0]):
                best = (r.term, address, r)
            elif r.HasField("leader_address"):
                hints.append(_address(r.leader_address))
        if best is not None:
            self._learn_masters(best[2])
            return best[1]
        for hint in hints:
            try:
                r = await self._connect(hint, deadline)
            except TesseraError:
                continue
            if r.role == pb.LEADER:
                self._learn_masters(r)
                return hint
        tried = ", ".join(self.addresses)
        answered = len(self.addresses) - len(errors)
        detail = "; ".join(
            [
                *errors,
                *([f"{answered} answered, none as leader (election running?)"] if answered else []),
            ]
        )
        if errors and timeouts == len(errors):
            raise Timeout(f"no answer from the masters {tried} in time")
        raise ServiceUnavailable(f"no master leader among {tried}: {detail}")

    def _learn_masters(self, leader: pb.ConnectToMasterResponsePB) -> None:
        """Add the masters the leader names (AddMaster may have added some since the client
        was configured), so discovery still works once every configured master is gone."""
        for hp in leader.master_addresses:
            if hp.host and hp.port and _address(hp) not in self.addresses:
                self.addresses.append(_address(hp))

    async def find_leader(self, deadline: Deadline) -> str:
        """The leader's address, discovered (with backoff) if not cached."""
        if self._leader is not None:
            return self._leader
        backoff = Backoff(cap=DISCOVERY_BACKOFF_CAP_S)
        last: TesseraError | None = None
        while True:
            try:
                self._leader = await self._discover_once(deadline)
                return self._leader
            except Timeout as e:
                last = last or e  # an attempt cut short says less than the one before it
            except TesseraError as e:
                last = e
            log.debug("no master leader found: %s; retrying", last)
            if deadline.remaining() <= 0:
                break
            try:
                await backoff.sleep(deadline)
            except Timeout:
                break
        raise Timeout(f"timed out finding the master leader: {last}")

    # --- calls -------------------------------------------------------------------------------

    async def call(self, method: str, request: Message, timeout: float) -> Any:
        """`MasterService.<method>(request)` on the leader, retried until `timeout` seconds."""

        async def attempt(stub: Any, t: float) -> Any:
            return await getattr(stub, method)(request, timeout=t)

        return await self._retrying(method, attempt, timeout)

    async def stream(self, method: str, request: Message, timeout: float) -> list[Any]:
        """Every message of the server-streaming `MasterService.<method>(request)`, from one
        attempt that ran to the end (a stream broken part-way is started over)."""

        async def attempt(stub: Any, t: float) -> list[Any]:
            return [m async for m in getattr(stub, method)(request, timeout=t)]

        result: list[Any] = await self._retrying(method, attempt, timeout)
        return result

    async def _retrying(
        self, method: str, attempt: Callable[[Any, float], Awaitable[Any]], timeout: float
    ) -> Any:
        """Run `attempt(leader stub, attempt timeout)` until it succeeds or the deadline."""
        deadline = Deadline.after(timeout)
        backoff = Backoff()
        last: TesseraError | None = None
        while True:
            try:
                address = await self.find_leader(deadline)
            except Timeout:
                if last is None:
                    raise
                raise Timeout(f"{method}: timed out after retries; last error: {last}") from last
            stub = self._pool.master(address)
            try:
                attempt_s = deadline.attempt_timeout(ATTEMPT_CAP_S)
            except Timeout:
                raise Timeout(f"{method}: timed out; last error: {last}") from last
            try:
                return await attempt(stub, attempt_s)
            except TesseraError as e:
                # The call failed (the pool maps it: service/common/error_mapping.py). An
                # attempt that ran out of its own time is a Timeout here, retried below.
                err = e
            last = err
            if isinstance(err, NotTheLeader):
                hint = err.leader_address
                self._leader = hint if hint and hint != address else None
                if self._leader is not None:
                    continue  # follow the hint at once
            elif isinstance(err, NotReady):
                pass  # same leader, later
            elif isinstance(err, ServiceUnavailable | Timeout):
                self._leader = None
            else:
                raise err
            log.debug("%s on %s: %s; retrying", method, address, err)
            try:
                await backoff.sleep(deadline)
            except Timeout:
                raise Timeout(f"{method}: timed out after retries; last error: {err}") from err

    async def ddl(self, method: str, request: Any, timeout: float) -> Any:
        """A DDL call with a fresh request id kept across every retry (exactly once)."""
        rid = self.request_ids.new()
        request.request_id.CopyFrom(rid)
        try:
            return await self.call(method, request, timeout)
        finally:
            self.request_ids.done(rid)
