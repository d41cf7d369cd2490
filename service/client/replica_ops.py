"""Replica changes from the client: add, remove and move one replica, compare-and-set.

Theory of operation
-------------------
A tablet's membership changes only through its Raft leader, one server at a time, each change
naming the committed config it replaces (`cas_config_opid_index`, docs/design/tablet_copy.md#R8). A
tool that moves replicas therefore works like the master's own 3-4-3
(service/master/rereplication.py): read the committed state, decide the one change it needs, send it
with the config's op index, read again. Every step is a small reconciler, so a step whose reply was
lost (a timeout, a leader change) is found done on the next read rather than repeated:

* read: GetTabletLocations from the master names the replicas and the leader it last heard of;
  the leader's own GetConsensusState gives the committed config and its op index (the master's
  record lags by a heartbeat). A replica that is not the leader names the one it follows.
* add: ADD_PEER the new server as a NON_VOTER with `promote` set. The tablet's leader starts a
  tablet copy to it and promotes it to VOTER once it has caught up (Kudu's PRE_VOTER), so
  the config never counts an empty replica in its majority.
* move = add `to` -> wait until the leader's committed config shows `to` as a VOTER (the copy
  runs meanwhile) -> remove `from`. The master's re-replication removes only *failed* extra
  voters, never a healthy one, so a move must remove its source itself. A leader cannot remove
  itself: when `from` leads, it is asked to step down (LeaderStepDown) and the removal is sent
  to the new leader.

Inside the deadline, NOT_THE_LEADER, SERVICE_UNAVAILABLE (a restarting server, a new leader
whose first entry has not committed), an attempt's timeout and a change refused because another
is pending mean: back off, read again, retry. CAS_MISMATCH means the config changed since it was
read: if the step is now done (our own earlier attempt committed after all) it succeeded; if
only the op index moved and the membership is the one the decision was based on, retry;
otherwise someone else changed the tablet (the master replacing a failed replica, an operator)
and the operation stops with `ConcurrentConfigChange`, naming the config before and after.

`execute_moves` runs a plan (`service.rebalance.rebalancing`) with at most N moves in flight per
involved server (each move is a tablet copy's disk and network load on both), moves of one
tablet in plan order. Before each move, `verify_unchanged` checks it against the tablet's live
config (`from` still a voter, `to` not holding it): a move the cluster has left behind is
skipped and reported, not forced.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from service.client.client import TesseraClient
from service.client.retry import Backoff, Deadline
from service.common.errors import (
    Aborted,
    CasMismatch,
    ConfigChangeRejected,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    WrongDestination,
    error_class,
)
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.rebalance.rebalancing import Move

__all__ = [
    "ConcurrentConfigChange",
    "ConsensusView",
    "MoveResult",
    "MoveStatus",
    "StaleMove",
    "add_replica",
    "execute_moves",
    "move_replica",
    "read_consensus",
    "remove_replica",
    "verify_unchanged",
]

ATTEMPT_CAP_S = 10.0
"""Longest one RPC may take; the rest of an operation's deadline goes to retries."""
POLL_S = 0.25
"""Pause between reads while waiting for a promotion or a new leader."""
VERIFY_PARALLELISM = 16
"""Tablets whose configs `verify_unchanged` reads at once."""

CC = tpb.ChangeConfigRequestPB


class ConcurrentConfigChange(Aborted):
    """Someone else changed the tablet's config during the operation (module docstring)."""


@dataclass(frozen=True)
class ConsensusView:
    """A tablet's committed config as its leader reported it."""

    tablet_id: str
    table_id: str
    leader_uuid: str
    leader_address: str
    opid_index: int
    voters: frozenset[str]
    non_voters: frozenset[str]
    pending: bool
    """A config change is appended but not committed (or not yet applied) on the leader."""

    @property
    def members(self) -> frozenset[str]:
        return self.voters | self.non_voters

    def describe(self) -> str:
        voters = ",".join(sorted(self.voters))
        learners = ",".join(sorted(self.non_voters)) or "-"
        return (
            f"config {self.opid_index}: voters [{voters}] non-voters [{learners}]"
            f" leader {self.leader_uuid or '-'}"
        )


def _hostport(address: str) -> mpb.HostPortPB:
    host, _, port = address.rpartition(":")
    return mpb.HostPortPB(host=host, port=int(port))


def _addr(hp: mpb.HostPortPB) -> str:
    return f"{hp.host}:{hp.port}" if hp.host else ""


class _Ops:
    """The RPCs of one operation under one deadline, with the leader and addresses it learned."""

    def __init__(self, client: TesseraClient, timeout: float) -> None:
        self.client = client
        self.deadline = Deadline.after(timeout)
        self.servers: dict[str, tuple[str, bool]] = {}  # uuid -> (address, live)
        self.backoff = Backoff(initial=0.05, cap=1.0)
        self.leaders: dict[str, tuple[str, str]] = {}

    def attempt(self) -> float:
        return self.deadline.attempt_timeout(ATTEMPT_CAP_S)

    async def pause(self) -> None:
        await self.backoff.sleep(self.deadline)

    async def target(self, uuid: str) -> str:
        """The address of live tablet server `uuid`, fresh from the master."""
        for s in await self.client.list_tablet_servers(timeout=self.attempt()):
            self.servers[s.uuid] = (s.address, s.live)
        if uuid not in self.servers:
            raise NotFound(f"tablet server {uuid} is not registered with the master")
        address, live = self.servers[uuid]
        if not live or not address:
            raise FailedPrecondition(f"tablet server {uuid} is not live (or has no address)")
        return address

    async def _admin(self, address: str, method: str, request: Message) -> Any:
        """TabletServerAdminService.<method>(request) at `address`; a failure raises its
        TesseraError (the pool's channels map it: service/common/error_mapping.py)."""
        stub = self.client.channels.tserver_admin(address)
        return await getattr(stub, method)(request, timeout=self.attempt())

    async def _read_once(self, tablet_id: str) -> ConsensusView:
        r: mpb.GetTabletLocationsResponsePB = await self.client.master.call(
            "GetTabletLocations",
            mpb.GetTabletLocationsRequestPB(tablet_ids=[tablet_id]),
            self.attempt(),
        )
        for e in r.errors:
            raise (error_class(e.error.code) or NotFound)(e.error.message)
        if not r.tablet_locations:
            raise NotFound(f"tablet {tablet_id!r} not found")
        loc = r.tablet_locations[0]
        queue: deque[tuple[str, str]] = deque()
        if tablet_id in self.leaders:
            queue.append(self.leaders[tablet_id])
        ordered = sorted(loc.replicas, key=lambda x: x.role != mpb.LEADER)
        queue.extend((x.ts_uuid, _addr(x.rpc_address)) for x in ordered)
        tried: set[str] = set()
        last: TesseraError | None = None
        while queue:
            uuid, address = queue.popleft()
            if uuid in tried:
                continue
            tried.add(uuid)
            address = address or self.servers.get(uuid, ("", False))[0]
            if not address:
                continue
            req = tpb.GetConsensusStateRequestPB(dest_uuid=uuid, tablet_ids=[tablet_id])
            try:
                entry = (await self._admin(address, "GetConsensusState", req)).tablets[0]
            except (ServiceUnavailable, Timeout, NotFound, WrongDestination) as e:
                last = e
                continue
            cs = entry.consensus_state
            if entry.role == mpb.LEADER and cs.leader_uuid == uuid:
                self.leaders[tablet_id] = (uuid, address)
                return _view(tablet_id, loc.table_id, uuid, address, cs)
            hint = cs.leader_uuid
            if hint and hint not in tried:
                peers = cs.committed_config.peers
                known = {p.permanent_uuid: _addr(p.last_known_addr) for p in peers}
                queue.appendleft((hint, known.get(hint, "")))
        self.leaders.pop(tablet_id, None)
        why = f": {last}" if last is not None else ""
        raise ServiceUnavailable(f"tablet {tablet_id}: no replica reports itself leader{why}")

    async def read(self, tablet_id: str) -> ConsensusView:
        """The tablet's committed config from its leader, retried until the deadline."""
        last: TesseraError | None = None
        while True:
            try:
                return await self._read_once(tablet_id)
            except (ServiceUnavailable, Timeout) as e:
                last = e
            try:
                await self.pause()
            except Timeout:
                raise Timeout(f"tablet {tablet_id}: could not read its config: {last}") from last

    async def change(self, view: ConsensusView, kind: int, peer: mpb.RaftPeerPB) -> None:
        req = CC(
            dest_uuid=view.leader_uuid,
            tablet_id=view.tablet_id,
            type=kind,  # type: ignore[arg-type]
            peer=peer,
            cas_config_opid_index=view.opid_index,
        )
        await self._admin(view.leader_address, "ChangeConfig", req)

    async def step_down(self, view: ConsensusView) -> None:
        req = tpb.LeaderStepDownRequestPB(dest_uuid=view.leader_uuid, tablet_id=view.tablet_id)
        await self._admin(view.leader_address, "LeaderStepDown", req)
        self.leaders.pop(view.tablet_id, None)


def _view(
    tablet_id: str, table_id: str, leader: str, address: str, cs: mpb.ConsensusStatePB
) -> ConsensusView:
    peers = cs.committed_config.peers
    return ConsensusView(
        tablet_id=tablet_id,
        table_id=table_id,
        leader_uuid=leader,
        leader_address=address,
        opid_index=cs.committed_config.opid_index,
        voters=frozenset(p.permanent_uuid for p in peers if p.member_type != mpb.NON_VOTER),
        non_voters=frozenset(p.permanent_uuid for p in peers if p.member_type == mpb.NON_VOTER),
        pending=bool(cs.pending_config.peers),
    )


def _retry_change(e: TesseraError) -> bool:
    """Whether a refused or failed ChangeConfig/LeaderStepDown is worth reading and retrying."""
    transient = ServiceUnavailable | Timeout | ConfigChangeRejected | NotFound | WrongDestination
    return not isinstance(e, CasMismatch) and (isinstance(e, transient) or e.retryable)


async def _send(
    ops: _Ops,
    view: ConsensusView,
    kind: int,
    peer: mpb.RaftPeerPB,
    done: Callable[[ConsensusView], bool],
    what: str,
) -> None:
    """One compare-and-set change; CAS mismatches judged as the module docstring says."""
    try:
        await ops.change(view, kind, peer)
    except CasMismatch as e:
        now = await ops.read(view.tablet_id)
        if done(now) or (now.voters, now.non_voters) == (view.voters, view.non_voters):
            return  # ours committed after all, or only the index moved: the caller re-reads
        raise ConcurrentConfigChange(
            f"tablet {view.tablet_id}: its config changed while {what}: was {view.describe()},"
            f" now {now.describe()} ({e.message}); plan again"
        ) from e
    except TesseraError as e:
        if not _retry_change(e):
            raise
        ops.leaders.pop(view.tablet_id, None)
        await ops.pause()


async def _ensure_member(ops: _Ops, tablet_id: str, ts_uuid: str, address: str) -> ConsensusView:
    peer = mpb.RaftPeerPB(
        permanent_uuid=ts_uuid,
        member_type=mpb.NON_VOTER,
        promote=True,
        last_known_addr=_hostport(address),
    )
    while True:
        view = await ops.read(tablet_id)
        if ts_uuid in view.members:
            return view
        if view.pending:
            await ops.pause()
            continue
        await _send(
            ops, view, CC.ADD_PEER, peer, lambda v: ts_uuid in v.members, f"adding {ts_uuid}"
        )


async def _await_voter(ops: _Ops, tablet_id: str, ts_uuid: str) -> ConsensusView:
    while True:
        view = await ops.read(tablet_id)
        if ts_uuid in view.voters:
            return view
        if ts_uuid not in view.members and not view.pending:
            raise ConcurrentConfigChange(
                f"tablet {tablet_id}: {ts_uuid} left the config before its promotion"
                f" ({view.describe()}); was it removed, or did its tablet copy fail?"
            )
        await asyncio.sleep(min(POLL_S, max(0.0, ops.deadline.remaining())))
        if ops.deadline.expired():
            raise Timeout(
                f"tablet {tablet_id}: {ts_uuid} is still a non-voter (catching up: tablet copy"
                f" and log replay); {view.describe()}"
            )


async def _ensure_removed(
    ops: _Ops, tablet_id: str, ts_uuid: str, check: Callable[[ConsensusView], None]
) -> ConsensusView:
    what = f"removing {ts_uuid}"
    while True:
        view = await ops.read(tablet_id)
        if ts_uuid not in view.members:
            return view
        if view.pending:
            # Judge only a settled config: a leader just elected (the step-down below) reports
            # the config it has applied, which lags its log until its first entry commits; the
            # promotion this move waited for can be pending there for a moment.
            await ops.pause()
            continue
        check(view)
        if view.leader_uuid == ts_uuid:
            try:  # a leader cannot remove itself (Raft thesis §4.2.2): hand leadership over
                await ops.step_down(view)
            except TesseraError as e:
                if not _retry_change(e) and not isinstance(e, FailedPrecondition):
                    raise
            await ops.pause()
        else:
            peer = mpb.RaftPeerPB(permanent_uuid=ts_uuid)
            await _send(ops, view, CC.REMOVE_PEER, peer, lambda v: ts_uuid not in v.members, what)


def _timed_out(what: str, e: Timeout) -> Timeout:
    return Timeout(f"{what}: not done before the deadline: {e.message}")


async def read_consensus(
    client: TesseraClient, tablet_id: str, *, timeout: float = 30.0
) -> ConsensusView:
    """The committed config of `tablet_id` as its leader reports it now."""
    return await _Ops(client, timeout).read(tablet_id)


async def add_replica(
    client: TesseraClient,
    tablet_id: str,
    ts_uuid: str,
    *,
    timeout: float = 120.0,
    wait_for_voter: bool = True,
) -> ConsensusView:
    """Add a replica of `tablet_id` on `ts_uuid` (a promotable NON_VOTER); with
    `wait_for_voter`, return once the leader has promoted it. Done already: returns at once."""
    ops = _Ops(client, timeout)
    what = f"adding a replica of tablet {tablet_id} on {ts_uuid}"
    try:
        view = await ops.read(tablet_id)
        if ts_uuid not in view.members:
            view = await _ensure_member(ops, tablet_id, ts_uuid, await ops.target(ts_uuid))
        return await _await_voter(ops, tablet_id, ts_uuid) if wait_for_voter else view
    except Timeout as e:
        raise _timed_out(what, e) from e


async def remove_replica(
    client: TesseraClient,
    tablet_id: str,
    ts_uuid: str,
    *,
    timeout: float = 60.0,
    allow_under_replication: bool = False,
) -> ConsensusView:
    """Remove `ts_uuid`'s replica of `tablet_id` (asking it to step down first if it leads).

    Refused (FailedPrecondition) when it would leave fewer voters than the table's replication
    factor, unless `allow_under_replication`: nothing would add one back (the master replaces
    only failed replicas)."""
    ops = _Ops(client, timeout)
    what = f"removing the replica of tablet {tablet_id} on {ts_uuid}"
    try:
        view = await ops.read(tablet_id)
        if ts_uuid not in view.members:
            return view
        if ts_uuid in view.voters and not allow_under_replication:
            schema = await client.master.call(
                "GetTableSchema",
                mpb.GetTableSchemaRequestPB(table=mpb.TableIdentifierPB(table_id=view.table_id)),
                ops.attempt(),
            )
            left = len(view.voters) - 1
            if left < schema.num_replicas:
                raise FailedPrecondition(
                    f"tablet {tablet_id}: removing {ts_uuid} leaves {left} voter(s), fewer than"
                    f" the replication factor {schema.num_replicas} ({view.describe()})"
                )
        return await _ensure_removed(ops, tablet_id, ts_uuid, lambda v: None)
    except Timeout as e:
        raise _timed_out(what, e) from e


async def move_replica(
    client: TesseraClient,
    tablet_id: str,
    from_ts: str,
    to_ts: str,
    *,
    timeout: float = 120.0,
) -> ConsensusView:
    """Move `tablet_id`'s replica from `from_ts` to `to_ts`: add `to_ts`, wait for its
    promotion, remove `from_ts` (module docstring). Idempotent: a move found done returns."""
    if from_ts == to_ts:
        raise InvalidArgument(f"move of tablet {tablet_id}: source and destination are {to_ts}")
    ops = _Ops(client, timeout)
    what = f"moving tablet {tablet_id} from {from_ts} to {to_ts}"
    try:
        view = await ops.read(tablet_id)
        if from_ts not in view.members:
            if to_ts in view.voters:
                return view
            raise FailedPrecondition(f"{what}: {from_ts} holds no replica ({view.describe()})")
        if from_ts not in view.voters:
            raise FailedPrecondition(f"{what}: {from_ts} is not a voter ({view.describe()})")
        if to_ts not in view.members:
            await _ensure_member(ops, tablet_id, to_ts, await ops.target(to_ts))
        await _await_voter(ops, tablet_id, to_ts)

        def still_placed(v: ConsensusView) -> None:
            if to_ts not in v.voters:
                raise ConcurrentConfigChange(
                    f"{what}: {to_ts} is no longer a voter ({v.describe()}); not removing {from_ts}"
                )

        return await _ensure_removed(ops, tablet_id, from_ts, still_placed)
    except Timeout as e:
        raise _timed_out(what, e) from e


# --- plans -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaleMove:
    """A planned move the cluster no longer matches, and why."""

    move: Move
    reason: str


def _stale_reason(view: ConsensusView, m: Move, voters: set[str]) -> str | None:
    if m.from_ts not in voters:
        return f"{m.from_ts} no longer holds a voter of the tablet ({view.describe()})"
    if m.to_ts in voters:
        return f"{m.to_ts} already holds the tablet ({view.describe()})"
    others = view.non_voters - {m.to_ts}
    if others:
        return f"a config change is under way: non-voter(s) {sorted(others)} ({view.describe()})"
    return None


async def verify_unchanged(
    client: TesseraClient, plan: Sequence[Move], *, timeout: float = 30.0
) -> list[StaleMove]:
    """The moves of `plan` that no longer apply: each tablet's live committed config must still
    have `from` as a voter and not have `to`, after the plan's earlier moves of that tablet."""
    ops = _Ops(client, timeout)
    tablets = list(dict.fromkeys(m.tablet_id for m in plan))
    sem = asyncio.Semaphore(VERIFY_PARALLELISM)

    async def read(tablet_id: str) -> ConsensusView:
        async with sem:
            return await ops.read(tablet_id)

    views = await asyncio.gather(*(read(t) for t in tablets), return_exceptions=True)
    by_tablet = dict(zip(tablets, views, strict=True))
    voters: dict[str, set[str]] = {}
    stale: list[StaleMove] = []
    for m in plan:
        view = by_tablet[m.tablet_id]
        if isinstance(view, BaseException):
            if not isinstance(view, TesseraError):
                raise view
            stale.append(StaleMove(m, f"cannot read the tablet's config: {view}"))
            continue
        vs = voters.setdefault(m.tablet_id, set(view.voters))
        reason = _stale_reason(view, m, vs)
        if reason is not None:
            stale.append(StaleMove(m, reason))
            continue
        vs.discard(m.from_ts)
        vs.add(m.to_ts)
    return stale


class MoveStatus(enum.Enum):
    STARTED = "started"
    DONE = "done"
    SKIPPED = "skipped"  # the cluster changed under the plan
    FAILED = "failed"


@dataclass(frozen=True)
class MoveResult:
    """What became of move number `index` (0-based) of the plan."""

    index: int
    move: Move
    status: MoveStatus
    detail: str = ""
    seconds: float = 0.0


async def _run_move(client: TesseraClient, index: int, m: Move, timeout: float) -> MoveResult:
    started = time.monotonic()

    def result(status: MoveStatus, detail: str) -> MoveResult:
        return MoveResult(index, m, status, detail, time.monotonic() - started)

    stale = await verify_unchanged(client, [m], timeout=min(timeout, 30.0))
    if stale:
        return result(MoveStatus.SKIPPED, stale[0].reason)
    try:
        view = await move_replica(client, m.tablet_id, m.from_ts, m.to_ts, timeout=timeout)
    except TesseraError as e:
        return result(MoveStatus.FAILED, e.message)
    return result(MoveStatus.DONE, f"config {view.opid_index}, leader {view.leader_uuid}")


async def execute_moves(
    client: TesseraClient,
    moves: Sequence[Move],
    *,
    max_in_flight_per_server: int = 1,
    move_timeout: float = 180.0,
    progress: Callable[[MoveResult], None] | None = None,
) -> list[MoveResult]:
    """Run `moves` concurrently, at most `max_in_flight_per_server` in flight on any server
    (as source or destination), moves of one tablet in plan order. One result per move, in
    plan order; `progress` hears each start and each outcome as they happen."""
    limit = max_in_flight_per_server
    if limit < 1:
        raise InvalidArgument(f"max_in_flight_per_server: must be >= 1, got {limit}")
    pending = list(enumerate(moves))
    results: dict[int, MoveResult] = {}
    load: Counter[str] = Counter()
    busy: set[str] = set()
    running: dict[asyncio.Task[MoveResult], tuple[int, Move]] = {}
    try:
        while pending or running:
            blocked: set[str] = set()  # tablets with an earlier move still waiting
            for item in list(pending):
                i, m = item
                free = load[m.from_ts] < limit and load[m.to_ts] < limit
                if m.tablet_id in busy or m.tablet_id in blocked or not free:
                    blocked.add(m.tablet_id)
                    continue
                pending.remove(item)
                load[m.from_ts] += 1
                load[m.to_ts] += 1
                busy.add(m.tablet_id)
                task = asyncio.create_task(_run_move(client, i, m, move_timeout))
                running[task] = item
                if progress is not None:
                    progress(MoveResult(i, m, MoveStatus.STARTED))
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i, m = running.pop(task)
                load[m.from_ts] -= 1
                load[m.to_ts] -= 1
                busy.discard(m.tablet_id)
                results[i] = task.result()
                if progress is not None:
                    progress(results[i])
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    return [results[i] for i in range(len(moves))]
