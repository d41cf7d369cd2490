"""The transaction coordinator: the leader master drives every transaction's two-phase commit.

Theory of operation (docs/design/transactions.md#R1, #R3)
---------------------------------------------------------
A transaction is a `TxnRecord` in sys.catalog. Every change of its state is one replicated
catalog write, compare-and-set on the row's version, committed before anyone is told:

  BeginTransaction      -> OPEN (a new id; a retried request id is answered from sys.catalog)
  RegisterParticipants  -> OPEN, one more participant tablet (from the tablet server whose tablet
                           takes the transaction's first write there, for the writer)
  CommitTransaction     -> COMMITTING (the kept attempts), then the coordinator prepares every
                           participant and records COMMITTED at the highest prepare timestamp:
                           that record is the decision
  AbortTransaction      -> ABORTED (also: no keep-alive for `keepalive_s`, or a participant
                           that can never prepare)

then the participants are finalized (COMMIT or ABORT on each tablet's leader, fenced with this
master's term, repeated until each answers) and the record is marked `resolved`.

Who does it. One task per transaction at a time (`_drive`) takes a COMMITTING transaction to a
decision and an ended one to resolved; CommitTransaction starts it and waits for the decision;
the per-term loop (`_run`) starts it for every transaction that needs one, so a new leader
carries on whatever the old one left: prepares are idempotent on the participants, and so are
commits and aborts (a tablet that resolved the transaction applies a repeat as nothing).

Keep-alives are not replicated: the leader holds each OPEN transaction's deadline in memory, and
a new leader gives every OPEN transaction a fresh `keepalive_s` (R1).

Ids. A new transaction's id is the wall clock in microseconds, or one past the newest id the
catalog holds if that is higher: unique, increasing, and never reused after old records are
purged (`retention_s`), as long as the clock does not step back by more than the retention.

Streaming batches (R4). A transaction may carry (stream query, batch id). BeginTransaction for a
batch a COMMITTED transaction of the same query already carries is ALREADY_EXISTS (the batch is
done: a replay skips it); for a batch an unfinished transaction of the same owner carries, it
answers that transaction (every task of the batch begins it, and a re-run of the batch after its
driver died joins it: the commit keeps only the attempts it names). The newest committed batch
of each query is never purged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from service.common import failpoints
from service.common.config import MasterConfig
from service.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotTheLeader,
    PermissionDenied,
    ServiceUnavailable,
    TesseraError,
    Timeout,
)
from service.common.hybrid_time import describe, from_micros, physical_us
from service.common.ids import NodeId, TabletId, validate_uuid
from service.common.pki import Identity
from service.master.catalog_records import (
    CatalogWrite,
    Delete,
    Insert,
    Precondition,
    RequestId,
    TxnRecord,
    TxnState,
    Update,
    record_key,
)
from service.master.ddl_checks import check_request_id
from service.master.sys_catalog import ApplyResult, Row, SysCatalogState
from service.master.tserver_proxy import Fence, TServerProxy
from service.pb import master_pb2 as pb
from service.pb import tserver_pb2 as tpb

log = logging.getLogger(__name__)

__all__ = ["TxnCoordinator", "TxnSettings"]

Replicate = Callable[[bytes, float], Awaitable[ApplyResult]]
MAX_PARTICIPANTS = 100_000
MAX_KEPT_ATTEMPTS = 100_000
MAX_STREAM_QUERY = 256
MAX_PROPAGATED_AHEAD_S = 60.0
"""How far ahead of this master's wall clock a client's propagated timestamp may be (the
servers' clocks agree to within their max_clock_error_ms, half a second by default)."""


_MASTER = MasterConfig(data_dir=Path("txn-settings"))
"""MasterConfig with its defaults: the one home of the mirrored defaults below (its data_dir is
never opened)."""


@dataclass(frozen=True)
class TxnSettings:
    """The coordinator's knobs: MasterConfig's `txn_*` in seconds (`from_config`; their
    defaults are a default MasterConfig's, never written here again), then its own."""

    keepalive_s: float = _MASTER.txn_keepalive_ms / 1000.0
    max_keepalive_s: float = _MASTER.txn_max_keepalive_ms / 1000.0
    retention_s: float = _MASTER.txn_retention_ms / 1000.0

    # --- the coordinator's own: defined here only --------------------------------------------

    poll_s: float = 1.0
    """How often the per-term loop looks for expired and unresolved transactions."""
    replicate_timeout_s: float = 10.0
    retry_s: float = 0.5
    """Pause between rounds of participant calls that did not all succeed."""
    prepare_timeout_s: float = 60.0
    """A COMMITTING transaction whose participants cannot all be prepared for this long
    aborts."""

    @classmethod
    def from_config(cls, config: MasterConfig) -> TxnSettings:
        return cls(
            keepalive_s=config.txn_keepalive_ms / 1000.0,
            max_keepalive_s=config.txn_max_keepalive_ms / 1000.0,
            retention_s=config.txn_retention_ms / 1000.0,
        )


class TxnCoordinator:
    """The transactions of one master (module docstring): built once, started for each term
    it leads (`start`), stopped when it stops leading."""

    def __init__(
        self,
        sys_catalog: SysCatalogState,
        replicate: Replicate,
        locate: Callable[[TabletId], tuple[list[tuple[NodeId, str]], bool]],
        proxy: TServerProxy,
        now_us: Callable[[], int],
        monotonic: Callable[[], float],
        settings: TxnSettings | None = None,
    ) -> None:
        """`locate(tablet)` answers the tablet's replicas to try (uuid, address; its reported
        leader first) and whether the tablet is gone (deleted or replaced: nothing of a
        transaction is left there)."""
        self._sys = sys_catalog
        self._replicate_fn = replicate
        self._locate = locate
        self._proxy = proxy
        self._now_us = now_us
        self._monotonic = monotonic
        self.settings = settings or TxnSettings()
        self._fence: Fence | None = None
        self._deadlines: dict[int, float] = {}
        self._begin_lock = asyncio.Lock()
        self._txn_locks: dict[int, asyncio.Lock] = {}
        self._drives: dict[int, asyncio.Task[None]] = {}
        self._decided: dict[int, asyncio.Event] = {}
        self._loop: asyncio.Task[None] | None = None
        self.commits = 0
        self.aborts = 0

    # --- per term ----------------------------------------------------------------------------

    def start(self, fence: Fence) -> None:
        self.stop()
        self._fence = fence
        now = self._monotonic()
        self._deadlines = {
            r.record.txn_id: now + self._keepalive_s(r.record)
            for r in self._sys.txns()
            if r.record.state is TxnState.OPEN
        }
        self._loop = asyncio.create_task(self._run(), name=f"txn-coordinator-{fence.master_term}")

    def stop(self) -> None:
        self._fence = None
        if self._loop is not None:
            self._loop.cancel()
            self._loop = None
        for task in self._drives.values():
            task.cancel()
        self._drives.clear()
        for ev in self._decided.values():
            ev.set()  # waiters re-check and find this master no longer leads
        self._decided.clear()
        self._deadlines.clear()

    def _leading(self) -> Fence:
        if self._fence is None:
            raise NotTheLeader("this master does not coordinate transactions now (not leader)")
        return self._fence

    # --- the RPCs ----------------------------------------------------------------------------

    async def begin(
        self,
        who: Identity,
        request_id: RequestId,
        stream_query: str,
        stream_batch: int,
        propagated_timestamp: int = 0,
        keepalive_ms: int = 0,
    ) -> pb.BeginTransactionResponsePB:
        self._leading()
        req = check_request_id(request_id)
        if len(stream_query) > MAX_STREAM_QUERY:
            raise InvalidArgument(f"stream_query: longer than {MAX_STREAM_QUERY} characters")
        if stream_batch and not stream_query:
            raise InvalidArgument("stream_batch: given without stream_query")
        ahead_us = physical_us(propagated_timestamp) - self._now_us()
        if ahead_us > MAX_PROPAGATED_AHEAD_S * 1_000_000:
            raise InvalidArgument(
                f"propagated_timestamp {describe(propagated_timestamp)} is {ahead_us / 1e6:.0f}s "
                f"ahead of this master's clock (at most {MAX_PROPAGATED_AHEAD_S:.0f}s): not a "
                "timestamp any server gave out"
            )
        if keepalive_ms > self.settings.max_keepalive_s * 1000:
            raise InvalidArgument(
                f"keepalive_ms: {keepalive_ms} is more than this master allows "
                f"(txn_max_keepalive_ms {self.settings.max_keepalive_s * 1000:.0f})"
            )
        async with self._begin_lock:
            done = self._sys.remembered(req.client_id, req.seq_no)
            if done is not None:
                if done.operation != "BeginTransaction":
                    raise InvalidArgument(
                        f"request id {req} was used for {done.operation or 'another operation'}"
                    )
                return pb.BeginTransactionResponsePB.FromString(done.response)
            if stream_query:
                joined = self._stream_txn(who, stream_query, stream_batch)
                if joined is not None:
                    self._deadlines[joined.txn_id] = self._monotonic() + self._keepalive_s(joined)
                    return pb.BeginTransactionResponsePB(
                        txn_id=joined.txn_id,
                        keepalive_ms=int(self._keepalive_s(joined) * 1000),
                        start_timestamp=joined.start_timestamp,
                    )
            newest = max((r.record.txn_id for r in self._sys.txns()), default=0)
            txn_id = max(self._now_us(), newest + 1)
            # Its snapshot: now, and never before what the client has seen (its own writes).
            start = max(from_micros(self._now_us()), propagated_timestamp + 1)
            record = TxnRecord(
                txn_id,
                who.principal,
                TxnState.OPEN,
                stream_query=stream_query,
                stream_batch=stream_batch,
                started_time_us=self._now_us(),
                start_timestamp=start,
                keepalive_ms=keepalive_ms,
            )
            resp = pb.BeginTransactionResponsePB(
                txn_id=txn_id,
                keepalive_ms=int(self._keepalive_s(record) * 1000),
                start_timestamp=start,
            )
            await self._replicate(
                CatalogWrite(
                    ops=(Insert(record),),
                    expected=(Precondition(record_key(record), 0),),
                    request_id=req,
                    operation="BeginTransaction",
                    response=resp.SerializeToString(),
                )
            )
            self._deadlines[txn_id] = self._monotonic() + self._keepalive_s(record)
            log.info("transaction %d begun by %s", txn_id, who)
            return resp

    def _stream_txn(self, who: Identity, query: str, batch: int) -> TxnRecord | None:
        """A streaming batch's transaction to join: the unfinished one of (query, batch) its
        owner began (every task of the batch begins it; a batch re-run after its driver died
        joins the one the dead run began, and its commit keeps only the new run's attempts).
        ALREADY_EXISTS if a transaction committed the batch; an aborted one is not joined."""
        found = None
        for row in self._sys.txns():
            t = row.record
            if t.stream_query != query or t.stream_batch != batch:
                continue
            if t.state is TxnState.COMMITTED:
                raise AlreadyExists(
                    f"stream query {query!r} batch {batch} was committed by transaction {t.txn_id}"
                )
            if t.state in (TxnState.OPEN, TxnState.COMMITTING) and t.owner == who.principal:
                found = t
        return found

    async def register(
        self, who: Identity, txn_id: int, tablet_ids: list[str], on_behalf_of: str
    ) -> int:
        """Add participants (docs/design/transactions.md#R2). A tablet server registers the
        tablets it hosts, for the writer `on_behalf_of`, who must own the transaction.
        Returns the transaction's start timestamp (its snapshot)."""
        self._leading()
        if not tablet_ids:
            raise InvalidArgument("tablet_ids: name at least one tablet")
        tablets = [TabletId(validate_uuid(t)) for t in tablet_ids]
        if who.role == "tserver":
            for tablet in tablets:
                replicas, gone = self._locate(tablet)
                if gone or who.name not in {uuid for uuid, _ in replicas}:
                    raise PermissionDenied(
                        f"{who} does not host tablet {tablet}: a tablet server registers only "
                        "its own tablets"
                    )
            owner = on_behalf_of
        else:
            owner = who.principal
        async with self._lock(txn_id):
            row = self._row(txn_id)
            t = row.record
            if t.owner != owner:
                raise PermissionDenied(
                    f"transaction {txn_id} belongs to {t.owner!r}, not {owner!r}"
                )
            if t.state is not TxnState.OPEN:
                raise Aborted(self._not_open(t))
            new = [x for x in tablets if x not in t.participants]
            if not new:
                return t.start_timestamp
            if len(t.participants) + len(new) > MAX_PARTICIPANTS:
                raise FailedPrecondition(
                    f"transaction {txn_id}: more than {MAX_PARTICIPANTS} participant tablets"
                )
            await self._update(row, replace(t, participants=(*t.participants, *new)))
            return t.start_timestamp

    def keepalive(self, who: Identity, txn_id: int) -> TxnState:
        self._leading()
        t = self._owned(who, txn_id).record
        if t.state is TxnState.OPEN:
            self._deadlines[txn_id] = self._monotonic() + self._keepalive_s(t)
        return t.state

    async def commit(self, who: Identity, txn_id: int, kept: list[str], timeout: float) -> int:
        """Commit (idempotent): the commit timestamp once COMMITTED; Aborted naming why if it
        aborted; Timeout (retry, or ask its state) if no decision came within `timeout`."""
        self._leading()
        if len(kept) > MAX_KEPT_ATTEMPTS:
            raise InvalidArgument(f"kept_attempts: more than {MAX_KEPT_ATTEMPTS}")
        async with self._lock(txn_id):
            row = self._owned(who, txn_id)
            t = row.record
            if t.state is TxnState.OPEN:
                await self._update(
                    row, replace(t, state=TxnState.COMMITTING, kept_attempts=tuple(kept))
                )
                self._deadlines.pop(txn_id, None)
                failpoints.hit("txn_commit:after_committing")
        event = self._decided.setdefault(txn_id, asyncio.Event())
        self._ensure_drive(txn_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            t = self._row(txn_id).record
            remaining = deadline - loop.time()
            if t.state is TxnState.COMMITTED and (t.resolved or remaining <= 0):
                # Answered once every participant finalized it, so the committer's next read
                # of the newest rows sees them all; if that takes longer than the call may,
                # the decision is answered anyway (a snapshot read at the commit timestamp
                # waits for the finalization, docs/design/transactions.md#R3).
                return t.commit_timestamp
            if t.state is TxnState.ABORTED:
                raise Aborted(f"transaction {txn_id} aborted: {t.state_msg}")
            self._leading()
            if remaining <= 0:
                raise Timeout(
                    f"transaction {txn_id} is still committing (its participants are being "
                    "prepared): retry the commit, or ask its state"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 1.0)):
                    await event.wait()
            event = self._decided.setdefault(txn_id, asyncio.Event())

    async def abort(self, who: Identity, txn_id: int, reason: str) -> None:
        self._leading()
        t = self._owned(who, txn_id).record
        if t.state is TxnState.COMMITTED:
            raise FailedPrecondition(f"transaction {txn_id} has committed: it cannot abort")
        await self._abort(txn_id, reason or f"aborted by {who}")

    def state(
        self, who: Identity, txn_id: int, stream_query: str, stream_batch: int
    ) -> pb.GetTransactionStateResponsePB:
        self._leading()
        if txn_id:
            t = self._owned(who, txn_id, act=False).record
            return pb.GetTransactionStateResponsePB(
                txn_id=t.txn_id,
                state=t.state.value,
                commit_timestamp=t.commit_timestamp,
                state_msg=t.state_msg,
                resolved=t.resolved,
            )
        if not stream_query:
            raise InvalidArgument("name a txn_id, or a stream_query (and stream_batch)")
        resp = pb.GetTransactionStateResponsePB()
        last = 0
        for row in self._sys.txns():
            t = row.record
            if t.stream_query != stream_query or not self._may_see(who, t):
                continue
            if t.state is TxnState.COMMITTED:
                last = max(last, t.stream_batch)
            # The batch's transaction: the one that committed it, else an unfinished one.
            if (
                t.stream_batch == stream_batch
                and t.state is not TxnState.ABORTED
                and resp.state != TxnState.COMMITTED.value
            ):
                resp.txn_id = t.txn_id
                resp.state = t.state.value
                resp.commit_timestamp = t.commit_timestamp
        resp.last_committed_batch = last
        return resp

    # --- driving a transaction to its end -----------------------------------------------------

    def _ensure_drive(self, txn_id: int) -> None:
        task = self._drives.get(txn_id)
        if task is not None and not task.done():
            return
        task = asyncio.create_task(self._drive(txn_id), name=f"txn-{txn_id}")
        self._drives[txn_id] = task
        task.add_done_callback(functools.partial(self._drive_ended, txn_id))

    def _drive_ended(self, txn_id: int, task: asyncio.Task[None]) -> None:
        if self._drives.get(txn_id) is task:
            del self._drives[txn_id]
        if not task.cancelled() and task.exception() is not None:
            log.warning("transaction %d: %s", txn_id, task.exception())

    def _signal(self, txn_id: int) -> None:
        ev = self._decided.pop(txn_id, None)
        if ev is not None:
            ev.set()

    async def _drive(self, txn_id: int) -> None:
        """COMMITTING -> prepared everywhere -> COMMITTED; then finalize; ABORTED -> dropped
        everywhere; each ended transaction -> resolved (module docstring)."""
        started: float | None = None
        while self._fence is not None:
            row = self._sys.txn(txn_id)
            if row is None:
                return
            t = row.record
            if t.state is TxnState.COMMITTING:
                started = self._monotonic() if started is None else started
                prepared = await self._on_participants(t, tpb.TxnParticipantOpRequestPB.PREPARE)
                if prepared is None:
                    if self._monotonic() - started > self.settings.prepare_timeout_s:
                        # Nothing is decided before COMMITTED: a participant that cannot be
                        # prepared (all its replicas down, or one refusing) aborts it rather
                        # than hold every other participant's locks and safe time.
                        await self._abort(
                            txn_id,
                            f"its participants could not all be prepared within "
                            f"{self.settings.prepare_timeout_s:.0f}s",
                        )
                        continue
                    await asyncio.sleep(self.settings.retry_s)
                    continue
                if isinstance(prepared, str):
                    await self._abort(txn_id, prepared)
                    continue
                ts = max(prepared, default=0) or from_micros(self._now_us())
                failpoints.hit("txn_commit:after_prepare")
                async with self._lock(txn_id):
                    row = self._row(txn_id)
                    if row.record.state is TxnState.COMMITTING:
                        await self._update(
                            row, replace(row.record, state=TxnState.COMMITTED, commit_timestamp=ts)
                        )
                        self.commits += 1
                        log.info("transaction %d committed at %d", txn_id, ts)
                        failpoints.hit("txn_commit:after_committed")
                self._signal(txn_id)
                continue
            if t.state.ended and not t.resolved:
                op = (
                    tpb.TxnParticipantOpRequestPB.COMMIT
                    if t.state is TxnState.COMMITTED
                    else tpb.TxnParticipantOpRequestPB.ABORT
                )
                done = await self._on_participants(t, op)
                if done is None:
                    await asyncio.sleep(self.settings.retry_s)
                    continue
                async with self._lock(txn_id):
                    row = self._row(txn_id)
                    if not row.record.resolved:
                        await self._update(row, replace(row.record, resolved=True))
                self._signal(txn_id)
                continue
            self._signal(txn_id)
            return

    async def _on_participants(
        self, t: TxnRecord, op: tpb.TxnParticipantOpRequestPB.Op.ValueType
    ) -> list[int] | str | None:
        """Send `op` to every participant's leader at once: their answers (prepare
        timestamps); None if some did not answer (try again); for a prepare, a reason to
        abort if a participant can never prepare (its tablet is gone)."""
        fence = self._leading()
        results = await asyncio.gather(
            *(self._on_participant(fence, t, tablet, op) for tablet in t.participants),
            return_exceptions=True,
        )
        out: list[int] = []
        for tablet, res in zip(t.participants, results, strict=True):
            if isinstance(res, _Gone):
                if op == tpb.TxnParticipantOpRequestPB.PREPARE:
                    return f"participant tablet {tablet} was deleted before the commit"
                continue
            if isinstance(res, BaseException):
                log.info("transaction %d: %s on tablet %s: %s", t.txn_id, op, tablet, res)
                return None
            out.append(res)
        return out

    async def _on_participant(
        self,
        fence: Fence,
        t: TxnRecord,
        tablet: TabletId,
        op: tpb.TxnParticipantOpRequestPB.Op.ValueType,
    ) -> int | _Gone:
        replicas, gone = self._locate(tablet)
        if gone:
            return _Gone()
        if op != tpb.TxnParticipantOpRequestPB.PREPARE and failpoints.skipped("TxnFinalize"):
            raise ServiceUnavailable("failpoint TESSERA_FAILPOINT_SKIP=TxnFinalize")
        last: Exception = NotFound(f"tablet {tablet}: no replica with a known address")
        for uuid, address in replicas:
            try:
                return await self._proxy.txn_op(
                    address,
                    uuid,
                    fence,
                    tablet,
                    t.txn_id,
                    op,
                    t.commit_timestamp,
                    t.kept_attempts,
                )
            except TesseraError as e:
                last = e
        raise last

    async def _abort(self, txn_id: int, reason: str) -> None:
        async with self._lock(txn_id):
            row = self._row(txn_id)
            t = row.record
            if t.state.ended:
                if t.state is TxnState.COMMITTED:
                    raise FailedPrecondition(f"transaction {txn_id} has committed")
                return
            await self._update(row, replace(t, state=TxnState.ABORTED, state_msg=reason[:1024]))
            self._deadlines.pop(txn_id, None)
            self.aborts += 1
            log.info("transaction %d aborted: %s", txn_id, reason)
        self._signal(txn_id)
        self._ensure_drive(txn_id)

    # --- the per-term loop -------------------------------------------------------------------

    async def _run(self) -> None:
        while self._fence is not None:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except TesseraError as e:
                log.info("transaction coordinator round: %s", e)
            except Exception:
                log.exception("transaction coordinator round failed")
            await asyncio.sleep(self.settings.poll_s)

    async def _round(self) -> None:
        now = self._monotonic()
        purge: list[Row[TxnRecord]] = []
        newest_batch: dict[str, int] = {}
        horizon_us = self._now_us() - int(self.settings.retention_s * 1_000_000)
        rows = self._sys.txns()
        for row in rows:
            t = row.record
            if t.state is TxnState.COMMITTED and t.stream_query:
                newest_batch[t.stream_query] = max(
                    newest_batch.get(t.stream_query, 0), t.stream_batch
                )
        for row in rows:
            t = row.record
            if t.state is TxnState.OPEN:
                period = self._keepalive_s(t)
                due = self._deadlines.setdefault(t.txn_id, now + period)
                if now >= due:
                    with contextlib.suppress(TesseraError):
                        await self._abort(
                            t.txn_id,
                            f"no keep-alive for {period:.0f}s (its keep-alive period): its "
                            "client is gone",
                        )
            elif t.state is TxnState.COMMITTING or not t.resolved:
                self._ensure_drive(t.txn_id)
            elif t.started_time_us < horizon_us and not (
                t.stream_query and newest_batch.get(t.stream_query) == t.stream_batch
            ):
                purge.append(row)
        if purge:
            batch = purge[:500]
            await self._replicate(
                CatalogWrite(
                    ops=tuple(Delete(record_key(r.record)) for r in batch),
                    expected=tuple(Precondition(record_key(r.record), r.version) for r in batch),
                    operation="PurgeTransactions",
                )
            )

    # --- helpers -----------------------------------------------------------------------------

    def _keepalive_s(self, t: TxnRecord) -> float:
        return t.keepalive_ms / 1000.0 if t.keepalive_ms else self.settings.keepalive_s

    def _lock(self, txn_id: int) -> asyncio.Lock:
        lock = self._txn_locks.get(txn_id)
        if lock is None:
            if len(self._txn_locks) > 10_000:
                self._txn_locks = {k: v for k, v in self._txn_locks.items() if v.locked()}
            lock = self._txn_locks[txn_id] = asyncio.Lock()
        return lock

    def _row(self, txn_id: int) -> Row[TxnRecord]:
        if txn_id <= 0:
            raise InvalidArgument("txn_id: required (> 0)")
        row = self._sys.txn(txn_id)
        if row is None:
            raise NotFound(f"transaction {txn_id} not found (never begun, or long ended)")
        return row

    @staticmethod
    def _may_see(who: Identity, t: TxnRecord, act: bool = False) -> bool:
        """Its owner and admins act on a transaction; tablet servers may read its state."""
        if who.role in ("admin", "insecure") or t.owner == who.principal:
            return True
        return not act and who.role == "tserver"

    def _owned(self, who: Identity, txn_id: int, act: bool = True) -> Row[TxnRecord]:
        """The transaction's row, if `who` may act on it (or, with `act` false, see it)."""
        row = self._row(txn_id)
        if not self._may_see(who, row.record, act):
            raise PermissionDenied(f"transaction {txn_id} belongs to another principal than {who}")
        return row

    @staticmethod
    def _not_open(t: TxnRecord) -> str:
        why = f": {t.state_msg}" if t.state_msg else ""
        return f"transaction {t.txn_id} is {t.state.name}, not open{why}"

    async def _update(self, row: Row[TxnRecord], record: TxnRecord) -> None:
        await self._replicate(
            CatalogWrite(
                ops=(Update(record),),
                expected=(Precondition(record_key(record), row.version),),
                operation="UpdateTransaction",
            )
        )

    async def _replicate(self, write: CatalogWrite) -> ApplyResult:
        self._leading()
        result = await self._replicate_fn(write.encode(), self.settings.replicate_timeout_s)
        result.raise_for_refusal()
        return result


class _Gone:
    """A participant tablet that no longer exists (deleted with its table, or replaced)."""
