"""Client transactions: writes to any rows of any tables that commit together or not at all.

    async with client.transaction() as txn:
        await txn.write("orders", rows)
        await txn.write("order_lines", lines)
    # committed here (txn.commit_timestamp); an exception in the block aborts instead

Theory of operation (docs/design/transactions.md)
-------------------------------------------------
`begin_transaction` asks the leader master for a transaction (a request id makes a retried
begin find the same one). Its writes are ordinary write sessions carrying the transaction id:
each tablet server stages them, invisible to every reader, and has the tablet registered as a
participant on the first write there. While the transaction is open the client sends a
keep-alive every third of the master's keep-alive period; a client that stops (killed, cut off)
lets it expire, and the master aborts it. `commit` waits for the decision and returns the commit
timestamp: a snapshot read at or after it sees every row of the transaction, one before it none.
A commit whose answer was lost can be sent again (it is idempotent), or the state asked with
`transaction_state`.

Isolation: snapshot isolation. A transaction has a snapshot, `start_timestamp`; reads at it
see what committed before it began. Each row it writes is locked until it ends, and a write of a
row that another writer committed after the snapshot fails ABORTED (a write conflict, "first
committer wins"): two transactions that read a row and write it back cannot both commit. Reads
inside a transaction do not see its own staged rows.

Writers elsewhere (Spark executors) join a transaction by its id with `WriteSession(...,
txn_id=..., txn_attempt=...)`, and the transaction's owner commits only the attempts it names
(`commit(kept_attempts=...)`): a failed or speculative task's rows are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import pyarrow as pa

from service.client.master_client import MasterClient
from service.client.write_session import WriteResult, WriteSession
from service.common.errors import TesseraError, Timeout
from service.pb import master_pb2 as pb

__all__ = [
    "Transaction",
    "TransactionBeginner",
    "TransactionClient",
    "TransactionScope",
    "TransactionState",
]

log = logging.getLogger(__name__)

_STATE_NAMES = {
    pb.TXN_OPEN: "OPEN",
    pb.TXN_COMMITTING: "COMMITTING",
    pb.TXN_COMMITTED: "COMMITTED",
    pb.TXN_ABORTED: "ABORTED",
}


@dataclass(frozen=True)
class TransactionState:
    txn_id: int
    state: str
    """OPEN, COMMITTING, COMMITTED, ABORTED; UNKNOWN for a stream batch nobody committed."""
    commit_timestamp: int = 0
    message: str = ""
    last_committed_batch: int = 0

    @classmethod
    def from_pb(cls, r: pb.GetTransactionStateResponsePB) -> TransactionState:
        return cls(
            r.txn_id,
            _STATE_NAMES.get(r.state, "UNKNOWN"),
            r.commit_timestamp,
            r.state_msg,
            r.last_committed_batch,
        )


class TransactionClient(Protocol):
    """What a transaction uses of its client (a `TesseraClient`, which begins it): the leader
    master for commit, abort and keep-alives, write sessions that stage in it, its state, the
    client's default timeout, and the client's newest hybrid timestamp, which a commit advances.
    Named here, rather than the client imported, so that this module does not depend on the
    client that imports it."""

    @property
    def timeout(self) -> float: ...

    @property
    def master(self) -> MasterClient: ...

    async def new_session(
        self, table: str, *, timeout: float | None = None, **kw: Any
    ) -> WriteSession: ...

    async def transaction_state(
        self, txn_id: int = 0, *, timeout: float | None = None
    ) -> TransactionState: ...

    def observe_timestamp(self, ts: int) -> None: ...


class TransactionBeginner(Protocol):
    """What a `TransactionScope` uses of its client: beginning the transaction."""

    async def begin_transaction(
        self, *, keepalive_ms: int = 0, timeout: float | None = None
    ) -> Transaction: ...


class Transaction:
    """One open transaction of this client (module docstring)."""

    def __init__(
        self,
        client: TransactionClient,
        txn_id: int,
        keepalive_s: float,
        start_timestamp: int = 0,
        *,
        keepalive: bool = True,
    ) -> None:
        self.client = client
        self.txn_id = txn_id
        self.keepalive_s = keepalive_s
        self.start_timestamp = start_timestamp
        """The transaction's snapshot: read at it (`scan_tokens(..., snapshot=txn.
        start_timestamp)`); a write of a row another writer committed after it fails ABORTED
        (a write conflict: run the transaction again)."""
        self.commit_timestamp = 0
        self._ended = False
        self._keepalive: asyncio.Task[None] | None = (
            asyncio.create_task(self._keep_alive(), name=f"txn-keepalive-{txn_id}")
            if keepalive
            else None
        )

    def __repr__(self) -> str:
        return f"Transaction({self.txn_id})"

    def _t(self, timeout: float | None) -> float:
        return self.client.timeout if timeout is None else timeout

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ended:
            return
        if et is None:
            await self.commit()  # the block ended normally: commit (and raise if it aborted)
            return
        with contextlib.suppress(TesseraError):
            await self.abort(f"{et.__name__}: {ev}"[:500])

    # --- writes ------------------------------------------------------------------------------

    async def new_session(
        self, table: str, *, attempt: str = "", timeout: float | None = None, **kw: Any
    ) -> WriteSession:
        """A write session whose rows are staged in this transaction (the client makes it, as
        it makes its plain sessions)."""
        return await self.client.new_session(
            table, timeout=timeout, txn_id=self.txn_id, txn_attempt=attempt, **kw
        )

    async def write(
        self,
        table: str,
        data: pa.Table | pa.RecordBatch,
        op: str = "upsert",
        *,
        timeout: float | None = None,
    ) -> WriteResult:
        """Stage `data` in `table` with `op` (flushed before this returns)."""
        session = await self.new_session(table, timeout=timeout)
        await session.apply(data, op)
        return await session.flush()

    # --- the end -----------------------------------------------------------------------------

    async def commit(
        self, kept_attempts: Sequence[str] | None = None, *, timeout: float | None = None
    ) -> int:
        """Commit: the commit timestamp once decided (ABORTED naming why if it aborted).
        `kept_attempts`: only these writers' rows commit (None: every writer's)."""
        req = pb.CommitTransactionRequestPB(txn_id=self.txn_id, kept_attempts=kept_attempts or [])
        try:
            resp = await self.client.master.call("CommitTransaction", req, self._t(timeout))
        except TesseraError as e:
            if not (e.retryable or isinstance(e, Timeout)):
                self._stop()  # decided (ABORTED) or refused: keep-alives are pointless now
            raise
        self._stop()
        self.commit_timestamp = int(resp.commit_timestamp)
        self.client.observe_timestamp(self.commit_timestamp)
        return self.commit_timestamp

    async def abort(self, reason: str = "", *, timeout: float | None = None) -> None:
        self._stop()
        await self.client.master.call(
            "AbortTransaction",
            pb.AbortTransactionRequestPB(txn_id=self.txn_id, reason=reason),
            self._t(timeout),
        )

    async def state(self, *, timeout: float | None = None) -> TransactionState:
        return await self.client.transaction_state(self.txn_id, timeout=timeout)

    def _stop(self) -> None:
        self._ended = True
        self.stop_keepalive()

    def stop_keepalive(self) -> None:
        """Stop sending keep-alives (the client is closing): the transaction expires unless
        it ends first."""
        if self._keepalive is not None:
            self._keepalive.cancel()

    async def _keep_alive(self) -> None:
        period = max(0.05, self.keepalive_s / 3)
        req = pb.KeepTransactionAliveRequestPB(txn_id=self.txn_id)
        while True:
            await asyncio.sleep(period)
            try:
                resp = await self.client.master.call("KeepTransactionAlive", req, period)
            except TesseraError as e:
                log.info("transaction %d: keep-alive failed: %s", self.txn_id, e)
                continue
            if resp.state != pb.TXN_OPEN:
                return


class TransactionScope:
    """`async with client.transaction(...) as txn:` begins a transaction on entry, commits it
    when the block ends normally and aborts it when the block raises."""

    def __init__(self, client: TransactionBeginner, **begin: object) -> None:
        self._client = client
        self._begin = begin
        self._txn: Transaction | None = None

    async def __aenter__(self) -> Transaction:
        self._txn = await self._client.begin_transaction(**self._begin)  # type: ignore[arg-type]
        return self._txn

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._txn is not None
        await self._txn.__aexit__(et, ev, tb)
