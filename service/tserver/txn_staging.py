"""A tablet replica's unresolved transactions: their staged rows, prepares, and row locks.

Theory of operation (docs/design/transactions.md#R2, #R3)
---------------------------------------------------------
A transaction begins on a tablet with a BEGIN entry, which the leader proposes once the
coordinator has registered the tablet as a participant; a staged write of a transaction that has
not begun here, or has ended, is refused by the log itself, identically on every replica (and
the WAL is kept from the BEGIN entry while the transaction is unresolved, so a replay meets it).
A transactional write is replicated as a *staged* entry. Applying it evaluates its rows exactly
as a plain write would (an INSERT of a live key is refused, a partial UPDATE merges over the live
version, ...) but against the committed rows plus what the same attempt staged before, and keeps
the result in a scratch memstore per (transaction, attempt) instead of the tablet's: no reader
sees it. `RowStore.stage_write` does the evaluation; this module keeps the scratch memstores.

A prepare entry records the prepare timestamp; while any transaction is prepared, the replica's
safe time stays below the lowest prepare timestamp (`safe_time_cap`), so a snapshot at or after
it waits for the transaction to be resolved. Commit entries install the kept attempts' staged
row images (full rows, or deletions) as versions committed at the commit timestamp
(`TxnState.commit_write`, `RowStore.apply_staged`): each image was decided when it was staged,
and its key has been locked since, so committing only installs it. A big transaction commits in
parts of at most COMMIT_PART_ROWS images, one entry each, so no entry holds the apply loop for
long; the last part resolves it. An abort entry drops the staged rows. Everything here is
decided by the log alone, identically on every replica.

The WAL must keep every staged entry of an unresolved transaction (its rows live only in
memory): `first_index` is where the log is kept from (tablet.py's anchor).

Row locks are the leader's, in memory (`RowLocks`): taken before a transactional write is
proposed, released when its transaction's commit or abort entry applies; a plain write that meets
a locked key waits as well. A new leader rebuilds them from the staged keys (`locked_keys`).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from service.common.errors import Aborted
from service.common.schema import Schema
from service.tserver.rowstore_memstore import MemStore, Row

__all__ = [
    "RowLocks",
    "TabletTxns",
    "TxnEntry",
    "TxnRefusal",
    "TxnState",
    "abort_entry",
    "begin_entry",
    "commit_entry",
    "decode_entry",
    "prepare_entry",
    "stage_entry",
]

# --- the Raft entries of transactions (tablet.py lists every entry kind) ---------------------

BEGIN = b"B"
STAGE = b"T"
PREPARE = b"P"
COMMIT = b"C"
ABORT = b"X"
KINDS = frozenset([BEGIN, STAGE, PREPARE, COMMIT, ABORT])
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
COMMIT_PART_ROWS = 50_000
"""Staged row images one commit entry installs at most (about 25 ms of the apply loop)."""
MAX_ATTEMPT_BYTES = 256
"""An attempt id names one writer (a Spark task attempt): short."""


def begin_entry(txn_id: int, start_ts: int, owner: str) -> bytes:
    """The transaction begins on this tablet, owned by `owner` (only it may write in it), with
    its snapshot `start_ts` (a row committed after it cannot be written in it)."""
    return BEGIN + _U64.pack(txn_id) + _U64.pack(start_ts) + owner.encode()


def stage_entry(txn_id: int, attempt: str, write: bytes) -> bytes:
    """A transactional write: `write` is tablet.write_entry's bytes (kind byte first)."""
    a = attempt.encode()
    return STAGE + _U64.pack(txn_id) + _U16.pack(len(a)) + a + write[1:]


def prepare_entry(txn_id: int, ts: int) -> bytes:
    return PREPARE + _U64.pack(txn_id) + _U64.pack(ts)


def commit_entry(
    txn_id: int,
    ts: int,
    kept: Sequence[str] | None,
    start: int = 0,
    end: int = 0,
    final: bool = True,
) -> bytes:
    """Commit items [start, end) of the transaction's staged row images
    (`TxnState.commit_write`) at `ts`;
    `final`: the last part (the transaction is resolved here once it applies). A big
    transaction commits in parts, so no one entry holds the apply loop for long."""
    head = _U64.pack(txn_id) + _U64.pack(ts) + _U64.pack(start) + _U64.pack(end)
    return COMMIT + head + bytes([1 if final else 0]) + json.dumps(kept).encode()


def abort_entry(txn_id: int) -> bytes:
    return ABORT + _U64.pack(txn_id)


@dataclass(frozen=True)
class TxnEntry:
    """A decoded transaction entry: its kind and whichever fields that kind has."""

    kind: bytes
    txn_id: int
    ts: int = 0
    owner: str = ""
    attempt: str = ""
    write: bytes = b""
    """STAGE: the WriteBatch's encoding."""
    kept: tuple[str, ...] | None = None
    start: int = 0
    end: int = 0
    final: bool = True


def decode_entry(data: bytes) -> TxnEntry:
    """The entry `data` (kind byte first). A malformed one raises ValueError, which fails the
    replica that applies it like any entry that cannot be applied (tablet.py)."""
    try:
        return _decode(data)
    except struct.error as e:
        raise ValueError(f"a transaction entry is truncated: {e}") from None


def _decode(data: bytes) -> TxnEntry:
    kind, body = data[:1], data[1:]
    (txn_id,) = _U64.unpack_from(body)
    rest = body[8:]
    if kind == BEGIN:
        (start_ts,) = _U64.unpack_from(rest)
        return TxnEntry(kind, txn_id, ts=start_ts, owner=rest[8:].decode())
    if kind == STAGE:
        (n,) = _U16.unpack_from(rest)
        if len(rest) < 2 + n:
            raise ValueError("a staged entry is shorter than its attempt id")
        attempt = rest[2 : 2 + n].decode()
        return TxnEntry(kind, txn_id, attempt=attempt, write=rest[2 + n :])
    if kind == PREPARE:
        (ts,) = _U64.unpack_from(rest)
        return TxnEntry(kind, txn_id, ts=ts)
    if kind == COMMIT:
        if len(rest) < 25:
            raise ValueError("a commit entry is truncated")
        ts, start, end = struct.unpack_from(">QQQ", rest)
        if start > end:
            raise ValueError("a commit entry's row range is reversed")
        final = rest[24] == 1
        listed = json.loads(rest[25:].decode())
        kept = None
        if listed is not None:
            if not isinstance(listed, list) or not all(isinstance(a, str) for a in listed):
                raise ValueError("a commit entry's kept attempts are not a list of strings")
            kept = tuple(listed)
        return TxnEntry(kind, txn_id, ts=ts, kept=kept, start=start, end=end, final=final)
    if kind == ABORT:
        return TxnEntry(kind, txn_id)
    raise ValueError(f"not a transaction entry kind: {kind!r}")


@dataclass(frozen=True)
class TxnRefusal:
    """A staged write the log refused: the same on every replica. The transaction is not open
    here, or is committing (the leader answers FAILED_PRECONDITION), or the write conflicts
    with a row committed after the transaction's snapshot (`conflict`: ABORTED)."""

    reason: str
    conflict: bool = False


@dataclass
class TxnState:
    """One unresolved transaction on this replica."""

    txn_id: int
    first_index: int
    """The Raft index of its first entry here (the WAL is kept from there)."""
    owner: str = ""
    """Who began it (a writer's identity must match: only the leader checks, before it
    proposes; the log order decides everything else)."""
    start_ts: int = 0
    """Its snapshot: a staged write of a row committed after it is a write conflict."""
    attempts: dict[str, MemStore] = field(default_factory=dict)
    """Staged rows by attempt id, in the order the attempts first wrote."""
    prepare_ts: int = 0
    """Its prepare timestamp once prepared (0: not prepared)."""
    commit_items: list[tuple[bytes, Row | None]] | None = None
    """Its commit: the kept attempts' staged row images in the order they apply, fixed by
    the first commit part that applies (`commit_write`)."""
    commit_layout: tuple[int, ...] = ()
    """The column ids the images of `commit_items` are laid out as."""
    committed_upto: int = 0
    """Items of `commit_items` applied so far (the next part starts here)."""
    live_delta: dict[str, int] = field(default_factory=dict)
    """Per attempt, the change of the tablet's live row count its staged rows make when
    committed (added up as they are staged)."""

    def staged_keys(self) -> set[bytes]:
        return {k for mem in self.attempts.values() for k in mem.rows}

    def rows(self) -> int:
        return sum(len(mem.rows) for mem in self.attempts.values())

    def kept_live_delta(self, kept: Sequence[str] | None) -> int:
        """The live row count change of the kept attempts (exact unless two kept attempts
        wrote one key, which Spark's tasks do not: the count is a statistic)."""
        wanted = None if kept is None else set(kept)
        return sum(d for a, d in self.live_delta.items() if wanted is None or a in wanted)

    def commit_write(
        self, kept: Sequence[str] | None
    ) -> tuple[list[tuple[bytes, Row | None]], tuple[int, ...]]:
        """The commit's row images (kept attempts, each in the order it staged its keys; of two
        kept attempts that wrote one key, the later one's image applies last) and their
        layout. Built once: a later part, or a repeat of the commit, goes on through it."""
        if self.commit_items is None:
            wanted = None if kept is None else set(kept)
            names = [a for a in self.attempts if wanted is None or a in wanted]
            self.commit_items = [item for a in names for item in self.attempts[a].rows.items()]
            # Every scratch memstore is laid out as the schema of the last alter
            # (`relayout`), so the attempts share one layout.
            first = self.attempts[names[0]] if names else None
            self.commit_layout = first.col_ids if first is not None else ()
        return self.commit_items, self.commit_layout

    def relayout(self, schema: Schema) -> None:
        """An alter applied: lay the staged rows out as the new schema (as the active
        memstore is), so a later write of this transaction merges over them."""
        self.attempts = {a: m.relaid_out(schema) for a, m in self.attempts.items()}


class TabletTxns:
    """The unresolved transactions of one replica (module docstring). Used by the apply loop;
    every method is deterministic in the log, except `recently_ended`, which only the leader
    consults as a shortcut."""

    def __init__(self) -> None:
        self.txns: dict[int, TxnState] = {}
        self.pins: dict[int, tuple[int, int]] = {}
        """Committed transactions whose rows are not yet in the data files: txn -> (first
        index, commit index). Their entries stay in the WAL until a flush passes the commit
        (a restart replays the staged entries, then the commit)."""
        self.recently_ended: OrderedDict[int, None] = OrderedDict()

    def begin(self, index: int, txn_id: int, owner: str, start_ts: int = 0) -> TxnState:
        """A BEGIN entry: the transaction's state here (created once; a repeat is a no-op)."""
        t = self.txns.get(txn_id)
        if t is None:
            t = self.txns[txn_id] = TxnState(txn_id, index, owner, start_ts=start_ts)
        return t

    def stage(self, txn_id: int) -> TxnState | TxnRefusal:
        """The state a STAGE entry of `txn_id` applies to, or why it is refused: the
        transaction must have begun here and not be preparing (after a prepare, its rows are
        fixed: the coordinator is deciding)."""
        t = self.txns.get(txn_id)
        if t is None:
            return TxnRefusal(
                f"transaction {txn_id} is not open on this tablet (it ended, or its first "
                "write here did not land): begin a new transaction"
            )
        if t.prepare_ts:
            return TxnRefusal(
                f"transaction {txn_id} is committing: its writes ended when its commit began"
            )
        return t

    def scratch(self, t: TxnState, attempt: str, schema: Schema, index: int) -> MemStore:
        """The scratch memstore a staged entry of (`t`, attempt) is applied to."""
        mem = t.attempts.get(attempt)
        if mem is None:
            mem = t.attempts[attempt] = MemStore(schema, index)
        return mem

    def prepare(self, index: int, txn_id: int, ts: int) -> int:
        """A PREPARE entry: record the prepare timestamp (the first one stands: a prepare is
        idempotent) and return it. A transaction with nothing here is prepared too, empty, so
        a write that arrives after the prepare is refused rather than staged and lost."""
        t = self.txns.get(txn_id)
        if t is None:
            t = self.txns[txn_id] = TxnState(txn_id, index)
        if not t.prepare_ts:
            t.prepare_ts = ts
        return t.prepare_ts

    def prepare_timestamp(self, txn_id: int) -> int:
        t = self.txns.get(txn_id)
        return t.prepare_ts if t is not None else 0

    def resolve(self, txn_id: int) -> TxnState | None:
        """Forget the transaction (committed or aborted here); its state, if it had any."""
        self.recently_ended[txn_id] = None
        while len(self.recently_ended) > 4096:
            self.recently_ended.popitem(last=False)
        return self.txns.pop(txn_id, None)

    def pin(self, t: TxnState, commit_index: int) -> None:
        self.pins[t.txn_id] = (t.first_index, commit_index)

    def unpin(self, flushed_index: int) -> None:
        """Drop the pins of commits the data files now hold."""
        if self.pins:
            self.pins = {k: v for k, v in self.pins.items() if v[1] > flushed_index}

    def safe_time_cap(self) -> int | None:
        """One below the lowest prepare timestamp of a prepared transaction (None: none)."""
        prepared = [t.prepare_ts for t in self.txns.values() if t.prepare_ts]
        return min(prepared) - 1 if prepared else None

    def first_index(self) -> int | None:
        """The first entry of any unresolved transaction, or of a committed one whose rows
        are not flushed yet (None: none): the WAL is kept from there."""
        firsts = [t.first_index for t in self.txns.values()]
        firsts.extend(first for first, _ in self.pins.values())
        return min(firsts, default=None)

    def locked_keys(self) -> dict[bytes, int]:
        """Every staged key and the transaction that holds it."""
        return {k: t.txn_id for t in self.txns.values() for k in t.staged_keys()}


class RowLocks:
    """The leader's row locks: key -> holding transaction, with waiters (module docstring)."""

    def __init__(self) -> None:
        self.held: dict[bytes, int] = {}
        self._released = asyncio.Event()

    def rebuild(self, held: dict[bytes, int]) -> None:
        """A new leader: the staged keys of the unresolved transactions are locked."""
        self.held = dict(held)
        self.wake()

    def wake(self) -> None:
        self._released.set()
        self._released = asyncio.Event()

    def release(self, txn_id: int) -> None:
        self.held = {k: t for k, t in self.held.items() if t != txn_id}
        self.wake()

    def conflict(self, keys: Iterable[bytes], txn_id: int | None) -> tuple[bytes, int] | None:
        """A key of `keys` another transaction holds (and which), or None."""
        held = self.held
        if not held:
            return None
        for k in keys:
            owner = held.get(k)
            if owner is not None and owner != txn_id:
                return k, owner
        return None

    async def acquire(
        self, keys: Sequence[bytes], txn_id: int | None, timeout: float, describe: object
    ) -> None:
        """Wait until no other transaction holds any of `keys`, then (for a transaction) take
        them. Aborted naming the key and its holder after `timeout`. `describe(key)` renders
        a key for the message."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            hit = self.conflict(keys, txn_id)
            if hit is None:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                key, owner = hit
                what = describe(key) if callable(describe) else key.hex()
                raise Aborted(
                    f"{what} is locked by transaction {owner}: waited {timeout:.1f}s for it "
                    "(docs/design/transactions.md#R2)"
                )
            released = self._released
            try:
                async with asyncio.timeout(remaining):
                    await released.wait()
            except TimeoutError:
                continue
        if txn_id is not None:
            for k in keys:
                self.held[k] = txn_id
