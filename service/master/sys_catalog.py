"""sys.catalog: the master's replicated state machine of catalog rows.

Theory of operation
-------------------
Every master holds a `SysCatalogState`: the rows of sys.catalog (tables, tablets, the root CA, token
signing keys, grants, used join credentials; docs/design/catalog.md), keyed by (entry type, id) as
in Kudu's sys.catalog tablet, plus the table of remembered client request ids. It is built ONLY by
applying committed entries, in log order, each one `CatalogWritePB`: one logical operation in one
entry (CreateTable is the table and all its tablets, never two replications:
docs/design/catalog.md#R4). It implements the consensus layer's `StateMachine` protocol (`apply`,
`snapshot`, `restore`); `RaftNode` owns it and calls it from its one task, so no locks are needed,
and readers on the same event loop see only whole writes.

`apply(index, data)` is deterministic: a function of the state and the entry only. No clock
(times travel inside the records), no randomness, no iteration over unordered containers in
anything that reaches the output. Every replica therefore reaches the same state and the same
answer for every entry, and a snapshot is the same bytes on every replica.

An entry is applied in this fixed order:

  1. the index must exceed the last applied one (otherwise a bug: `Internal` is raised and the
     node stops); `applied_index` becomes `index` whatever happens next;
  2. remembered request results older than the retention window are forgotten (below);
  3. the payload is decoded (garbage is refused);
  4. if the write carries a request id already applied, the remembered result is returned and
     nothing is applied again (exactly-once DDL after failover: a client that retries on the new
     leader gets the original answer, not ALREADY_EXISTS or NOT_FOUND); a request id older than
     what is remembered is refused as stale;
  5. every precondition (`expected`: row version equal, or row absent) is checked: a
     compare-and-set evaluated at apply time, identically on every replica, so a write built by
     a deposed leader from stale state is refused rather than applied (fencing,
     docs/design/failover.md#R5);
  6. every op is decoded and validated (`catalog_records`), and staged against the current rows:
     INSERT needs an absent row, UPDATE and DELETE an existing one, a key appears once;
  7. the catalog invariants are checked on the staged result (below);
  8. only then are the rows written, each with `version = index`; the request id and its
     response are remembered;
  9. listeners are told (`add_listener`), the catalog manager's cue to commit the change to its
     copy-on-write caches ("commit in memory after replication": the state-change contract,
     docs/design/catalog.md#R5).

Steps 3 and 6 may have been done before the entry committed: a large entry (a CreateTable of
thousands of tablets) is decoded ahead in slices, with the event loop running between them
(`decode_ahead`, docs/design/consensus.md#R11), and apply takes those records if they are of
the same bytes at the same index, decoding whatever is left itself.

A write refused in steps 3-7 changes nothing at all, its request id included, and comes back as
an `ApplyResult` with a `Refusal` (an error code and a message naming the offending id). The
refusal means "this attempt did not happen" (before its commit point an operation leaves no
trace: docs/design/coordinator.md#R1), so a client may retry the request, and a new leader may
re-run it.

Invariants protected at apply (each refusal names the id):

* ids are unique per entry type; INSERT never overwrites; ids are canonical uuids;
* every tablet names a table that exists; a REMOVED table gets no new tablets; a tablet never
  moves to another table and its partition never changes;
* live (non-REMOVED) table names are unique;
* REMOVED is final for a table, REPLACED and DELETED are final for a tablet (DELETED may follow
  REPLACED); a table's schema version never decreases; a tablet's committed consensus state never
  goes back (term, config op index);
* no two tablets of one table in PREPARING, CREATING or RUNNING have overlapping partitions
  ([partition_key_start, partition_key_end), end b"" unbounded): a replacement tablet is
  inserted in the same write that marks the tablet it replaces REPLACED;
* `replaces` and `replaced_by` name each other: a tablet that replaces X names X of its own
  table, and X is REPLACED with `replaced_by` naming it (X may later become DELETED, whose
  record holds no `replaced_by`), and the other way round; `replaces` is fixed at creation and
  `replaced_by` once set;
* table and tablet rows are never deleted (docs/design/catalog.md#R8): the persistent state
  of deleted tables and tablets is kept forever, so that a tablet the master has no record of is
  never one it deleted, and such tablets are never deleted by the master. Only CA and signing-key
  rows (purged when expired), grants (revoked, or their table deleted) and used join credentials
  (purged when expired) can be deleted;
* a grant names a table that exists and is not REMOVED when it is written;
* a used join credential's row is never rewritten (only inserted, then purged): the uuid and
  key it enrolled are fixed (docs/design/security.md#R10).

Rows are kept as frozen dataclasses (decoded and validated once, at apply) together with the
exact bytes of their record: the snapshot writes those bytes back, so it needs no re-encoding
(re-encoding a decoded schema could canonicalize it differently) and round-trips exactly.

Request ids: `request_table` (remembered results, their deterministic bounds, and why a
forgotten request is refused as stale rather than run twice).
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar, cast

from google.protobuf.message import DecodeError

from service.common.errors import (
    Aborted,
    AlreadyExists,
    Corruption,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    TesseraError,
    error_class,
)
from service.master.catalog_records import (
    CA_ENTRY_ID,
    CertAuthorityRecord,
    GrantRecord,
    JoinCredentialUseRecord,
    Record,
    RecordType,
    RequestId,
    RowKey,
    TableRecord,
    TabletRecord,
    TabletState,
    TokenSigningKeyRecord,
    TxnRecord,
    entry_type_of_field,
    grant_entry_id,
    key_from_pb,
    record_from_pb,
    record_key,
    record_message,
    request_id_from_pb,
    txn_entry_id,
)
from service.master.request_table import RememberedResult, RequestTable
from service.pb import master_pb2 as pb

__all__ = [
    "DEFAULT_MAX_RESULTS_PER_CLIENT",
    "DEFAULT_REQUEST_RETENTION_ENTRIES",
    "SNAPSHOT_FORMAT_VERSION",
    "ApplyResult",
    "CatalogChange",
    "Listener",
    "Refusal",
    "RememberedResult",
    "Restored",
    "Row",
    "SysCatalogState",
    "TabletsView",
]

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT_VERSION = 1
SNAPSHOT_SLICE_ROWS = 20_000
"""Rows a snapshot gathers between two turns of the event loop (`snapshot_sliced`)."""
DEFAULT_REQUEST_RETENTION_ENTRIES = 100_000
"""Log entries after which a remembered request result is forgotten. A retry after a failover
comes seconds later; DDL is rare next to tablet-report writes, and even those rarely reach
100,000 entries in minutes. Memory is bounded by one result per entry in the window."""
DEFAULT_MAX_RESULTS_PER_CLIENT = 256
"""Results remembered per client: more than any client keeps in flight."""

_R = TypeVar("_R", covariant=True)


@dataclass(frozen=True)
class Row(Generic[_R]):
    """A row: its key, its version (the log index of the entry that last wrote it), its record."""

    key: RowKey
    version: int
    record: _R


@dataclass(frozen=True)
class Refusal:
    """Why a write was refused: a `TesseraError` code and a message naming the offending id."""

    code: str
    message: str

    @classmethod
    def of(cls, err: TesseraError) -> Refusal:
        return cls(err.code, err.message)

    def exception(self) -> TesseraError:
        """The error to raise for this refusal (the class registered for `code`)."""
        return (error_class(self.code) or Internal)(self.message)


@dataclass(frozen=True)
class ApplyResult:
    """What applying one entry did; also what `RaftNode.propose` resolves to.

    Exactly one of: refused (`refusal` set, nothing changed); a retry of an applied request
    (`duplicate_of` = the index it took effect at, nothing changed, `response` remembered);
    applied (`written` rows with their new versions, `deleted` keys, `response` of the write).
    """

    index: int
    refusal: Refusal | None = None
    written: tuple[Row[Record], ...] = ()
    deleted: tuple[RowKey, ...] = ()
    response: bytes = b""
    request_id: RequestId | None = None
    operation: str = ""
    duplicate_of: int | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def raise_for_refusal(self) -> None:
        if self.refusal is not None:
            raise self.refusal.exception()


@dataclass(frozen=True)
class Restored:
    """The whole state was replaced by a snapshot at `applied_index`: reload everything."""

    applied_index: int


CatalogChange: TypeAlias = ApplyResult | Restored
Listener: TypeAlias = Callable[[CatalogChange], None]


DECODE_AHEAD_BYTES = 16 * 1024
"""Entries from this size are decoded ahead of apply: about 110 tablets of a CreateTable, or 60
of an assignment round (whose tablets carry their configs). A round of 200 (60 KB) decoded at
apply held a follower's loop 0.85 s on a starved host; a small DDL entry (a few hundred bytes)
is not worth a task."""

DECODE_SLICE = 256
"""Ops decoded between two turns of the event loop (a few milliseconds)."""

_Decoded: TypeAlias = tuple[Record, RowKey, bytes]
"""An op's record, its key and its bytes as stored."""


def _decode_op(op: pb.CatalogRowOpPB, path: str) -> _Decoded:
    """Decode and validate an INSERT, UPDATE or UPSERT op's record (a DELETE has none)."""
    if op.kind not in (
        pb.CatalogRowOpPB.INSERT,
        pb.CatalogRowOpPB.UPDATE,
        pb.CatalogRowOpPB.UPSERT,
    ):
        raise InvalidArgument(f"{path}.kind: unknown or missing kind {op.kind}")
    which = op.WhichOneof("record")
    if which is None or which == "key":
        raise InvalidArgument(f"{path}: record missing")
    entry_type = entry_type_of_field(which)
    message = getattr(op, which)
    assert isinstance(message, record_message(entry_type))
    record = record_from_pb(entry_type, message)
    return record, record_key(record), message.SerializeToString(deterministic=True)


@dataclass
class _Ahead:
    """An entry's decoding ahead of its apply (`SysCatalogState.decode_ahead`)."""

    data: bytes
    write: pb.CatalogWritePB
    index: int
    decoded: list[_Decoded | None]
    """Ops 0..len-1 decoded, in order (None: a DELETE, decoded at apply)."""
    elements: list[bytes | None]
    """Each decoded op's row as a snapshot element at version `index` (what `_commit` keeps in
    `_wire`), built here rather than in the commit, which holds the loop in one piece."""
    ended: asyncio.Future[None]
    """Done when the decoding has ended, however: what the Raft node waits for."""
    task: asyncio.Task[None] | None = None


def _end(ahead: _Ahead) -> None:
    """Stop a decoding ahead where it is and release what waits for it."""
    if ahead.task is not None:
        ahead.task.cancel()
    if not ahead.ended.done():
        ahead.ended.set_result(None)


@dataclass
class _Staged:
    key: RowKey
    record: Record | None  # None: delete
    data: bytes  # the record's serialized bytes, as stored
    old: Row[Record] | None
    element: bytes | None = None
    """The row's snapshot element at the index applied, if decoding ahead built it."""


class _KeyOrder:
    """One record type's row keys in sorted order, kept up to date cheaply: the order as of the
    last `sorted_keys`, plus the keys added and dropped since. Sorting a 200,000-row catalog's
    keys from scratch took 0.77 s on a loaded 2-core host (on the loop, for every snapshot);
    appending the new keys to the sorted ones and sorting again costs Timsort one merge of a
    long run with a short one (0.05 s for 10,000 new keys on 200,000)."""

    __slots__ = ("_added", "_dropped", "_sorted")

    def __init__(self) -> None:
        self._sorted: list[str] = []
        self._added: list[str] = []
        self._dropped: set[str] = set()

    def add(self, key: str) -> None:
        """`key` is new to the rows (not there before this write)."""
        if key in self._dropped:
            self._dropped.discard(key)  # dropped and back since: still in `_sorted`
        else:
            self._added.append(key)

    def drop(self, key: str) -> None:
        self._dropped.add(key)

    def sorted_keys(self, present: dict[str, bytes]) -> list[str]:
        """Exactly the keys of `present` (the rows now), sorted."""
        keys = self._sorted
        if self._dropped:
            keys = [k for k in keys if k in present]
        keys = keys + [k for k in self._added if k in present]
        keys.sort()
        self._sorted, self._added, self._dropped = keys, [], set()
        return keys


class SysCatalogState:
    """The rows of sys.catalog and the request-id table, built only by `apply` (module docstring).

    Invariants on the fields (hold between calls):
      * `_rows[t][i].key == RowKey(t, i)`; `_wire[t][i]` is that row as it appears in a
        snapshot (`_snapshot_element`: its serialized record inside, version included);
      * `_tablets_by_table[t]` is the sorted list of (partition key start, tablet id) of
        exactly the tablets whose record names table `t`, every state (kept sorted as rows
        apply, so no reader sorts 10,000 rows on the loop);
      * `_live_names[n] == t` iff table `t` is not REMOVED and is named `n`;
      * `_live_starts[t]` is the sorted list of (partition key start, tablet id) of table `t`'s
        live (PREPARING, CREATING, RUNNING) tablets: the overlap check's index;
      * every row's version <= `_applied_index`.
    """

    def __init__(
        self,
        *,
        request_retention_entries: int = DEFAULT_REQUEST_RETENTION_ENTRIES,
        max_results_per_client: int = DEFAULT_MAX_RESULTS_PER_CLIENT,
    ) -> None:
        self._requests = RequestTable(request_retention_entries, max_results_per_client)
        self._rows: dict[RecordType, dict[str, Row[Record]]] = {t: {} for t in RecordType}
        self._wire: dict[RecordType, dict[str, bytes]] = {t: {} for t in RecordType}
        self._order: dict[RecordType, _KeyOrder] = {t: _KeyOrder() for t in RecordType}
        """`_wire`'s keys in snapshot order (`_KeyOrder`)."""
        self._tablets_by_table: dict[str, list[tuple[bytes, str]]] = {}
        self._live_starts: dict[str, list[tuple[bytes, str]]] = {}
        self._live_names: dict[str, str] = {}
        self._applied_index = 0
        self._listeners: list[Listener] = []
        self._ahead: dict[int, _Ahead] = {}
        """Large entries appended and decoded (or being decoded) before they commit, by index
        (`decode_ahead`)."""

    # --- StateMachine ------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> ApplyResult:
        """Apply the committed entry at `index` (module docstring for the order of steps)."""
        if index <= self._applied_index:
            raise Internal(
                f"sys.catalog: entry {index} applied after entry {self._applied_index}: entries "
                "must be applied once each, in log order"
            )
        self._applied_index = index
        self._requests.expire(index)
        req: RequestId | None = None
        operation = ""
        try:
            ahead = self._take_ahead(index, data)
            if ahead is not None:
                write = ahead.write
            else:
                try:
                    write = pb.CatalogWritePB.FromString(data)
                except DecodeError:
                    raise InvalidArgument(f"entry {index}: not a CatalogWritePB") from None
            operation = write.operation
            if write.HasField("request_id"):
                req = request_id_from_pb(write.request_id)
                seen = self._requests.lookup(req, operation)
                if seen is not None:
                    return ApplyResult(
                        index,
                        response=seen.response,
                        request_id=req,
                        operation=operation,
                        duplicate_of=seen.index,
                    )
            self._check_preconditions(write.expected)
            staged = self._stage(
                write.ops,
                ahead.decoded if ahead is not None else [],
                ahead.elements if ahead is not None else [],
            )
            self._check_invariants(staged)
        except TesseraError as e:
            log.info("sys.catalog: entry %d (%s) refused: %s", index, operation or "-", e)
            return ApplyResult(index, refusal=Refusal.of(e), request_id=req, operation=operation)
        written, deleted = self._commit(index, staged)
        if req is not None:
            self._requests.remember(req, index, operation, write.response)
        result = ApplyResult(
            index,
            written=written,
            deleted=deleted,
            response=write.response,
            request_id=req,
            operation=operation,
        )
        self._notify(result)
        return result

    def snapshot(self) -> bytes:
        """The whole state, request ids included, in canonical order: equal states make equal
        bytes on every replica.

        The bytes are those of `SysCatalogSnapshotPB.SerializeToString`, assembled from each
        row's encoding kept since the row was written (`_wire`): the node takes a snapshot
        on its event loop, and building the message row by row took 0.4-0.85 s at 50,000
        tablets (a leader that holds its loop past the election timeout is deposed). A
        message's fields serialize in field-number order, and a repeated field is its
        elements' encodings one after another, so head (fields 1-2) + rows (3) + tail (4-6)
        is the message's encoding."""
        head, tail = self._snapshot_ends()
        parts = [head]
        for t in sorted(RecordType, key=lambda t: t.value):  # `_sorted_rows`' order
            rows = self._wire[t]
            parts.extend(map(rows.__getitem__, self._order[t].sorted_keys(rows)))
        parts.append(tail)
        return b"".join(parts)

    async def snapshot_sliced(self) -> bytes:
        """`snapshot`'s bytes, its rows gathered `SNAPSHOT_SLICE_ROWS` at a time with the event
        loop running in between (the node's `SlicedSnapshots`). At 200,000 tablets the rows
        are 55 MB; gathered in one step on a starved host they held the leader's loop for
        seconds, and its followers elected another. The node applies nothing until this
        returns, so the state is the snapshot's index's throughout (checked)."""
        applied = self._applied_index
        head, tail = self._snapshot_ends()
        parts = [head]
        for t in sorted(RecordType, key=lambda t: t.value):
            rows = self._wire[t]
            keys = self._order[t].sorted_keys(rows)
            for i in range(0, len(keys), SNAPSHOT_SLICE_ROWS):
                await asyncio.sleep(0)
                if self._applied_index != applied:
                    raise Internal(
                        f"sys.catalog: entry {self._applied_index} applied during the snapshot "
                        f"of entry {applied}"
                    )
                parts.extend(map(rows.__getitem__, keys[i : i + SNAPSHOT_SLICE_ROWS]))
        parts.append(tail)
        return b"".join(parts)

    def _snapshot_ends(self) -> tuple[bytes, bytes]:
        """The snapshot message's fields before its rows (1-2) and after them (4-6), encoded."""
        head = pb.SysCatalogSnapshotPB(
            format_version=SNAPSHOT_FORMAT_VERSION, applied_index=self._applied_index
        )
        tail = pb.SysCatalogSnapshotPB(
            request_retention_entries=self._requests.retention_entries,
            max_results_per_client=self._requests.max_per_client,
        )
        tail.clients.extend(self._requests.to_pb())
        ends = (
            head.SerializeToString(deterministic=True),
            tail.SerializeToString(deterministic=True),
        )
        return ends

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's. A snapshot that does not decode, or whose
        records do not validate, is `Corruption` (it was written by `snapshot`); one made with
        other request-id bounds is refused (the replicas would diverge). Atomic: on error the
        state is unchanged."""
        try:
            snap = pb.SysCatalogSnapshotPB.FromString(data)
        except DecodeError:
            raise Corruption("sys.catalog snapshot does not decode") from None
        if snap.format_version != SNAPSHOT_FORMAT_VERSION:
            raise Corruption(f"sys.catalog snapshot format {snap.format_version} unknown")
        mine = (self._requests.retention_entries, self._requests.max_per_client)
        theirs = (snap.request_retention_entries, snap.max_results_per_client)
        if mine != theirs:
            raise FailedPrecondition(
                f"sys.catalog snapshot was made with request-id bounds {theirs}, this master "
                f"uses {mine}: replicas must agree"
            )
        fresh = SysCatalogState(request_retention_entries=mine[0], max_results_per_client=mine[1])
        # The cyclic collector is paused while the rows are built: every object made here
        # lives on, and the collections their allocations trigger walked the growing heap
        # again and again (half of a 50,000-tablet restore's 7 s).
        collecting = gc.isenabled()
        gc.disable()
        try:
            for i, row in enumerate(snap.rows):
                fresh._load_row(i, row)
            fresh._requests.load(snap.clients)
            fresh._check_loaded(snap.applied_index)
        except InvalidArgument as e:
            raise Corruption(f"sys.catalog snapshot: {e.message}") from None
        finally:
            if collecting:
                gc.enable()
        fresh._applied_index = snap.applied_index
        self._requests = fresh._requests
        self._rows = fresh._rows
        self._wire = fresh._wire
        self._order = fresh._order
        self._tablets_by_table = fresh._tablets_by_table
        self._live_starts = fresh._live_starts
        self._live_names = fresh._live_names
        self._applied_index = fresh._applied_index
        self._notify(Restored(self._applied_index))

    # --- decoding ahead ----------------------------------------------------------------------

    def decode_ahead(self, index: int, data: bytes) -> asyncio.Future[None] | None:
        """Decode the records of a large entry appended at `index` before it commits, in
        slices of DECODE_SLICE ops with the event loop running between them
        (docs/design/consensus.md#R11); `apply` then stages the decoded records instead of
        decoding them in one piece, and keeps the rows' snapshot elements built here. Small
        entries (under DECODE_AHEAD_BYTES) are left to apply. The decoding is a function of
        the bytes and the index alone, so it stays valid whatever is applied meanwhile (a
        snapshot included); apply uses it only for the same bytes at the same index (an entry a
        new leader overwrote is decoded again, or at apply)."""
        if index in self._ahead:
            self._forget_ahead(index)  # an entry a new leader overwrote
        if len(data) < DECODE_AHEAD_BYTES or index <= self._applied_index:
            return None
        for stale in [i for i in self._ahead if i <= self._applied_index]:
            self._forget_ahead(stale)
        try:
            write = pb.CatalogWritePB.FromString(data)
        except DecodeError:
            return None  # apply refuses it
        loop = asyncio.get_running_loop()
        ahead = _Ahead(data, write, index, [], [], loop.create_future())
        ahead.task = loop.create_task(self._decode_slices(ahead), name=f"decode-ahead-{index}")
        self._ahead[index] = ahead
        return ahead.ended

    async def _decode_slices(self, ahead: _Ahead) -> None:
        try:
            for i, op in enumerate(ahead.write.ops):
                if i and i % DECODE_SLICE == 0:
                    await asyncio.sleep(0)
                if op.kind == pb.CatalogRowOpPB.DELETE:
                    ahead.decoded.append(None)  # nothing to decode: apply reads the key
                    ahead.elements.append(None)
                    continue
                try:
                    decoded = _decode_op(op, f"ops[{i}]")
                except Exception:  # apply decodes it again, and refuses the entry naming it
                    return
                _, key, record = decoded
                ahead.elements.append(_snapshot_element(key, ahead.index, record))
                ahead.decoded.append(decoded)
        finally:
            if not ahead.ended.done():
                ahead.ended.set_result(None)

    def _take_ahead(self, index: int, data: bytes) -> _Ahead | None:
        """The decoding ahead of the entry being applied, if it is of these bytes; what it has
        not reached yet is decoded by `_stage`."""
        ahead = self._ahead.pop(index, None)
        for stale in [i for i in self._ahead if i < index]:
            self._forget_ahead(stale)
        if ahead is None:
            return None
        _end(ahead)  # its task is not running now (this is the same thread's apply)
        if ahead.data is not data and ahead.data != data:
            return None
        return ahead

    def _forget_ahead(self, index: int) -> None:
        _end(self._ahead.pop(index))

    # --- reads -------------------------------------------------------------------------------
    # Each returns immutable values; lists are fresh copies, safe to keep across awaits.

    @property
    def applied_index(self) -> int:
        """The index of the last entry applied (or of the snapshot restored)."""
        return self._applied_index

    def __len__(self) -> int:
        return sum(len(rows) for rows in self._rows.values())

    def row(self, key: RowKey) -> Row[Record] | None:
        return self._get(key)

    def rows(self) -> Iterator[Row[Record]]:
        """Every row in key order (entry type, id), from a copy taken at the call."""
        return iter(self._sorted_rows())

    def tables(self, *, include_removed: bool = True) -> list[Row[TableRecord]]:
        """Tables by id; REMOVED ones too unless `include_removed` is false."""
        rows = cast(list[Row[TableRecord]], self._of_type(RecordType.TABLE))
        return [r for r in rows if include_removed or not r.record.is_removed]

    def table(self, table_id: str) -> Row[TableRecord] | None:
        return self._table(table_id)

    def table_by_name(self, name: str) -> Row[TableRecord] | None:
        """The live (non-REMOVED) table named `name`."""
        table_id = self._live_names.get(name)
        return self._table(table_id) if table_id is not None else None

    def tablets_of(self, table_id: str) -> list[Row[TabletRecord]]:
        """The table's tablets, every state, by (partition_key_start, tablet id)."""
        rows = self._rows[RecordType.TABLET]
        order = self._tablets_by_table.get(table_id, ())
        return [cast(Row[TabletRecord], rows[t]) for _, t in order]

    def tablet(self, tablet_id: str) -> Row[TabletRecord] | None:
        return self._tablet(tablet_id)

    def tablets_view(self) -> TabletsView:
        """Every tablet row as of now, grouped by table, from copies taken in C (a dict and a
        tuple per table: a few milliseconds at 200,000 tablets, where `tablets_of` for every
        table holds the loop for tenths of a second on a starved host). Read a table's rows
        later with `TabletsView.tablets_of`, across awaits: the rows are immutable values."""
        return TabletsView(
            self._applied_index,
            {t: tuple(order) for t, order in self._tablets_by_table.items()},
            cast(dict[str, Row[TabletRecord]], dict(self._rows[RecordType.TABLET])),
        )

    def all_tablets(self) -> list[Row[TabletRecord]]:
        """Every tablet row (deleted and replaced ones included), by tablet id."""
        return cast(list[Row[TabletRecord]], self._of_type(RecordType.TABLET))

    def cert_authority(self) -> Row[CertAuthorityRecord] | None:
        row = self._rows[RecordType.CERT_AUTHORITY].get(CA_ENTRY_ID)
        return cast(Row[CertAuthorityRecord] | None, row)

    def signing_keys(self) -> list[Row[TokenSigningKeyRecord]]:
        """Token signing keys by key_seq (expired ones included until purged)."""
        return cast(list[Row[TokenSigningKeyRecord]], self._of_type(RecordType.TOKEN_SIGNING_KEY))

    def grant(self, table_id: str, user: str) -> Row[GrantRecord] | None:
        """What `user` holds on table `table_id`, if anything."""
        row = self._rows[RecordType.GRANT].get(grant_entry_id(table_id, user))
        return cast(Row[GrantRecord] | None, row)

    def grants(self) -> list[Row[GrantRecord]]:
        """Every grant, by (table id, user)."""
        return cast(list[Row[GrantRecord]], self._of_type(RecordType.GRANT))

    def grants_of(self, table_id: str) -> list[Row[GrantRecord]]:
        """The grants on one table, by user."""
        rows = self._rows[RecordType.GRANT]
        prefix = grant_entry_id(table_id, "")
        return cast(list[Row[GrantRecord]], [rows[i] for i in sorted(rows) if i.startswith(prefix)])

    def join_credential_use(self, credential_sha256: str) -> Row[JoinCredentialUseRecord] | None:
        """The enrollment a join credential made, if it made one (docs/design/security.md#R10)."""
        row = self._rows[RecordType.JOIN_CREDENTIAL_USE].get(credential_sha256)
        return cast(Row[JoinCredentialUseRecord] | None, row)

    def join_credential_uses(self) -> list[Row[JoinCredentialUseRecord]]:
        """Every used join credential not purged yet, by fingerprint."""
        rows = self._of_type(RecordType.JOIN_CREDENTIAL_USE)
        return cast(list[Row[JoinCredentialUseRecord]], rows)

    def txn(self, txn_id: int) -> Row[TxnRecord] | None:
        """Transaction `txn_id`'s row, if it was ever begun (docs/design/transactions.md#R1)."""
        return cast(Row[TxnRecord] | None, self._rows[RecordType.TXN].get(txn_entry_id(txn_id)))

    def txns(self) -> list[Row[TxnRecord]]:
        """Every transaction, by id."""
        return cast(list[Row[TxnRecord]], self._of_type(RecordType.TXN))

    def remembered(self, client_id: str, seq_no: int) -> RememberedResult | None:
        """The remembered result of a request id, if any: the catalog manager answers a retry
        from it without proposing anything."""
        client = self._requests.clients.get(client_id)
        return client.results.get(seq_no) if client is not None else None

    # --- listeners ---------------------------------------------------------------------------

    def add_listener(self, fn: Listener) -> Callable[[], None]:
        """Call `fn` after every applied write (an `ApplyResult`, not for refusals or retries)
        and every restore (`Restored`), in registration order, from the applying task. Returns
        a function that removes it. An exception from a listener is logged and does not undo
        or stop the apply: the rows are committed; the listener's copy can be rebuilt."""
        self._listeners.append(fn)

        def remove() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)

        return remove

    def _notify(self, change: CatalogChange) -> None:
        for fn in list(self._listeners):
            try:
                fn(change)
            except Exception:
                log.exception("sys.catalog listener failed")

    # --- apply steps -------------------------------------------------------------------------

    def _check_preconditions(self, expected: Iterable[pb.CatalogPreconditionPB]) -> None:
        seen: set[RowKey] = set()
        for i, cond in enumerate(expected):
            key = key_from_pb(cond.key, f"expected[{i}].key")
            if key in seen:
                raise InvalidArgument(f"expected[{i}]: {key} has two preconditions")
            seen.add(key)
            row = self._get(key)
            actual = row.version if row is not None else 0
            if actual != cond.version:
                want = "absent" if cond.version == 0 else f"at version {cond.version}"
                have = "absent" if row is None else f"at version {actual}"
                raise Aborted(f"precondition failed: {key} expected {want}, is {have}")

    def _stage(
        self,
        ops: Iterable[pb.CatalogRowOpPB],
        decoded: Sequence[_Decoded | None],
        elements: Sequence[bytes | None] = (),
    ) -> list[_Staged]:
        """Stage `ops` against the current rows; `decoded[i]`, where given, is op i's record
        already decoded (`decode_ahead`), the same as `_decode_op` gives now, and
        `elements[i]` its snapshot element at the index being applied."""
        staged: list[_Staged] = []
        seen: set[RowKey] = set()
        for i, op in enumerate(ops):
            path = f"ops[{i}]"
            record: Record | None = None
            data = b""
            done = decoded[i] if i < len(decoded) else None
            element = elements[i] if i < len(elements) else None
            if done is not None:
                record, key, data = done
            elif op.kind == pb.CatalogRowOpPB.DELETE:
                if op.WhichOneof("record") != "key":
                    raise InvalidArgument(f"{path}: a DELETE names its row by key")
                key = key_from_pb(op.key, f"{path}.key")
            else:
                record, key, data = _decode_op(op, path)
            if key in seen:
                raise InvalidArgument(f"{path}: {key} appears twice in one write")
            seen.add(key)
            old = self._get(key)
            if op.kind == pb.CatalogRowOpPB.INSERT and old is not None:
                raise AlreadyExists(f"{key} already exists (version {old.version})")
            if op.kind in (pb.CatalogRowOpPB.UPDATE, pb.CatalogRowOpPB.DELETE) and old is None:
                raise NotFound(f"{key} does not exist")
            if record is None and key.entry_type in (RecordType.TABLE, RecordType.TABLET):
                raise FailedPrecondition(
                    f"{key} cannot be deleted: table and tablet records are kept forever "
                    "(docs/design/catalog.md#R8); mark it REMOVED or DELETED instead"
                )
            if old is not None and record is not None:
                _check_transition(old.record, record)
            staged.append(_Staged(key, record, data, old, element if done is not None else None))
        return staged

    def _check_invariants(self, staged: list[_Staged]) -> None:
        new_tables = {s.key.entry_id: s.record for s in staged if isinstance(s.record, TableRecord)}
        new_tablets = {
            s.key.entry_id: s.record for s in staged if isinstance(s.record, TabletRecord)
        }

        def table_after(table_id: str) -> TableRecord | None:
            if table_id in new_tables:
                return new_tables[table_id]
            row = self._table(table_id)
            return row.record if row is not None else None

        def tablet_after(tablet_id: str) -> TabletRecord | None:
            if tablet_id in new_tablets:
                return new_tablets[tablet_id]
            row = self._tablet(tablet_id)
            return row.record if row is not None else None

        for s in staged:
            g = s.record
            if isinstance(g, GrantRecord):
                granted_on = table_after(g.table_id)
                if granted_on is None:
                    raise NotFound(f"{s.key} names unknown table {g.table_id!r}")
                if granted_on.is_removed:
                    raise FailedPrecondition(
                        f"{s.key}: table {g.table_id!r} is REMOVED; it gets no grants"
                    )
        for s in staged:
            t = s.record
            if not isinstance(t, TabletRecord):
                continue
            table = table_after(t.table_id)
            if table is None:
                raise NotFound(f"tablet {t.tablet_id!r} names unknown table {t.table_id!r}")
            if s.old is None and table.is_removed:
                raise FailedPrecondition(
                    f"tablet {t.tablet_id!r}: table {t.table_id!r} is REMOVED; it gets no new "
                    "tablets"
                )
            for what, other_id in (("replaced_by", t.replaced_by), ("replaces", t.replaces)):
                if other_id is None:
                    continue
                other = tablet_after(other_id)
                if other is None:
                    raise NotFound(f"tablet {t.tablet_id!r}: {what} names unknown {other_id!r}")
                if other.table_id != t.table_id:
                    raise InvalidArgument(
                        f"tablet {t.tablet_id!r}: {what} {other_id!r} belongs to another table"
                    )
            _check_replacement_links(t, s.old is None, tablet_after)

        self._check_no_overlap(staged, tablet_after)

        # Live names after the write: the tables written give up their old names, then claim
        # their new ones (so two tables may swap names in one write). O(tables written).
        freed = set()
        for table_id in new_tables:
            old_row = self._table(table_id)
            if old_row is not None and self._live_names.get(old_row.record.name) == table_id:
                freed.add(old_row.record.name)
        claimed: dict[str, str] = {}
        for table_id, table in new_tables.items():
            if table.is_removed:
                continue
            holder = claimed.get(table.name)
            if holder is None and table.name not in freed:
                holder = self._live_names.get(table.name)
            if holder is not None and holder != table_id:
                raise AlreadyExists(
                    f"table {table_id!r}: name {table.name!r} is taken by table {holder!r}"
                )
            claimed[table.name] = table_id

    def _check_no_overlap(
        self, staged: list[_Staged], tablet_after: Callable[[str], TabletRecord | None]
    ) -> None:
        """No two live (PREPARING, CREATING, RUNNING) tablets of one table overlap after the
        write. Partitions never change and a REPLACED or DELETED tablet never comes back, so
        only tablets inserted live can break it: each is checked against the table's other
        live tablets after the write (a replacement's old tablet must be REPLACED by then).
        The live tablets before the write are disjoint, so `_live_starts` (sorted by start)
        yields the only candidates for each new tablet: the one starting just before it, and
        those starting inside it. A replacement round over a 10,000-tablet table costs a
        few lookups per new tablet, not a sort of the table. Deterministic: candidates are
        taken in (partition start, tablet id) order."""
        fresh: dict[str, list[TabletRecord]] = {}
        for s in staged:
            t = s.record
            if isinstance(t, TabletRecord) and s.old is None and t.state in _LIVE_TABLET_STATES:
                fresh.setdefault(t.table_id, []).append(t)
        for table_id in sorted(fresh):
            new = sorted(fresh[table_id], key=_partition_order)
            # The new tablets among themselves: sorted by start, each must begin at or after
            # the end of the one before (ends are then ascending too).
            for prev, cur in itertools.pairwise(new):
                if _overlap(prev, cur):
                    raise FailedPrecondition(_overlap_message(table_id, prev, cur))
            starts = self._live_starts.get(table_id, [])
            for t in new:
                i = bisect.bisect_left(starts, _partition_order(t))
                if i > 0:
                    i -= 1  # the one starting just before may reach into t
                end = t.partition.partition_key_end
                while i < len(starts):
                    start, other_id = starts[i]
                    if end and start >= end:
                        break  # starts at or past t's end: so do all after it
                    other = tablet_after(other_id)
                    live = other is not None and other.state in _LIVE_TABLET_STATES
                    if live and other is not None and _overlap(other, t):
                        raise FailedPrecondition(_overlap_message(table_id, other, t))
                    i += 1

    def _commit(
        self, index: int, staged: list[_Staged]
    ) -> tuple[tuple[Row[Record], ...], tuple[RowKey, ...]]:
        """Write the staged rows. Nothing here may fail: the write was fully checked."""
        written: list[Row[Record]] = []
        deleted: list[RowKey] = []
        for s in staged:
            if s.old is not None and isinstance(s.old.record, TableRecord):
                old_name = s.old.record.name
                if self._live_names.get(old_name) == s.key.entry_id:
                    del self._live_names[old_name]
            if s.old is not None and isinstance(s.old.record, TabletRecord):
                self._unindex_live(s.old.record)
            wire = self._wire[s.key.entry_type]
            if s.record is None:
                del self._rows[s.key.entry_type][s.key.entry_id]
                del wire[s.key.entry_id]
                self._order[s.key.entry_type].drop(s.key.entry_id)
                deleted.append(s.key)
                continue
            row: Row[Record] = Row(s.key, index, s.record)
            self._rows[s.key.entry_type][s.key.entry_id] = row
            if s.key.entry_id not in wire:
                self._order[s.key.entry_type].add(s.key.entry_id)
            element = s.element
            if element is None:
                element = _snapshot_element(s.key, index, s.data)
            wire[s.key.entry_id] = element
            self._index_row(s.record)
            written.append(row)
        return tuple(written), tuple(deleted)

    def _unindex_live(self, record: TabletRecord) -> None:
        if record.state not in _LIVE_TABLET_STATES:
            return
        starts = self._live_starts[record.table_id]
        del starts[bisect.bisect_left(starts, _partition_order(record))]

    def _index_row(self, record: Record) -> None:
        if isinstance(record, TableRecord):
            if not record.is_removed:
                self._live_names[record.name] = record.table_id
        elif isinstance(record, TabletRecord):
            # Tablet rows are never deleted, and an update keeps the table and partition
            # (`_check_transition`), so a tablet keeps its place once listed.
            order = self._tablets_by_table.setdefault(record.table_id, [])
            key = _partition_order(record)
            i = bisect.bisect_left(order, key)
            if i == len(order) or order[i] != key:
                order.insert(i, key)
            if record.state in _LIVE_TABLET_STATES:
                bisect.insort(
                    self._live_starts.setdefault(record.table_id, []), _partition_order(record)
                )

    # --- restore helpers ---------------------------------------------------------------------

    def _load_row(self, i: int, row: pb.SysCatalogRowPB) -> None:
        key = key_from_pb(pb.CatalogKeyPB(entry_type=row.entry_type, entry_id=row.entry_id))
        if self._get(key) is not None:
            raise InvalidArgument(f"rows[{i}]: {key} appears twice")
        try:
            message = record_message(key.entry_type).FromString(row.record)
        except DecodeError:
            raise InvalidArgument(f"rows[{i}]: {key}: record does not decode") from None
        record = record_from_pb(key.entry_type, message)
        if record_key(record) != key:
            raise InvalidArgument(f"rows[{i}]: {key} holds the record of {record_key(record)}")
        self._rows[key.entry_type][key.entry_id] = Row(key, row.version, record)
        self._wire[key.entry_type][key.entry_id] = _snapshot_element(key, row.version, row.record)
        self._order[key.entry_type].add(key.entry_id)
        self._index_row(record)

    def _check_loaded(self, applied_index: int) -> None:
        for row in self._sorted_rows():
            key = row.key
            if row.version > applied_index or row.version < 1:
                raise InvalidArgument(f"{key}: version {row.version} outside 1..{applied_index}")
            if (
                isinstance(row.record, TabletRecord | GrantRecord)
                and self._table(row.record.table_id) is None
            ):
                raise InvalidArgument(f"{key} names unknown table {row.record.table_id!r}")
        live = [r for r in self.tables() if not r.record.is_removed]
        if len(live) != len(self._live_names):
            raise InvalidArgument("two live tables share a name")

    # --- lookups -----------------------------------------------------------------------------

    # Rows of each entry type hold records of that type (apply and restore check it), which is
    # what makes the casts below sound.

    def _get(self, key: RowKey) -> Row[Record] | None:
        return self._rows[key.entry_type].get(key.entry_id)

    def _of_type(self, entry_type: RecordType) -> list[Row[Record]]:
        rows = self._rows[entry_type]
        return [rows[i] for i in sorted(rows)]

    def _sorted_rows(self) -> list[Row[Record]]:
        return [row for t in sorted(RecordType, key=lambda t: t.value) for row in self._of_type(t)]

    def _table(self, table_id: str) -> Row[TableRecord] | None:
        return cast(Row[TableRecord] | None, self._rows[RecordType.TABLE].get(table_id))

    def _tablet(self, tablet_id: str) -> Row[TabletRecord] | None:
        return cast(Row[TabletRecord] | None, self._rows[RecordType.TABLET].get(tablet_id))


@dataclass(frozen=True)
class TabletsView:
    """`SysCatalogState.tablets_view`: the tablet rows of one applied index."""

    applied_index: int
    order_by_table: dict[str, tuple[tuple[bytes, str], ...]]
    """Each table's (partition key start, tablet id), sorted."""
    rows: dict[str, Row[TabletRecord]]

    def tablets_of(self, table_id: str) -> list[Row[TabletRecord]]:
        """`SysCatalogState.tablets_of` as of the view: every state, by (partition_key_start,
        tablet id)."""
        rows = self.rows
        return [rows[t] for _, t in self.order_by_table.get(table_id, ())]


_ROWS_TAG = bytes([3 << 3 | 2])
"""The key of `SysCatalogSnapshotPB.rows` (field 3, length-delimited) on the wire."""


def _snapshot_element(key: RowKey, version: int, record: bytes) -> bytes:
    """The row as one element of `SysCatalogSnapshotPB.rows`, key and length included."""
    body = pb.SysCatalogRowPB(
        entry_type=key.entry_type.value, entry_id=key.entry_id, version=version, record=record
    ).SerializeToString(deterministic=True)
    return _ROWS_TAG + _varint(len(body)) + body


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_LIVE_TABLET_STATES = frozenset({TabletState.PREPARING, TabletState.CREATING, TabletState.RUNNING})
"""States in which a tablet owns its partition: no two of one table may overlap."""


def _partition_order(t: TabletRecord) -> tuple[bytes, str]:
    return (t.partition.partition_key_start, t.tablet_id)


def _overlap(a: TabletRecord, b: TabletRecord) -> bool:
    """[start, end) partition key intervals meet (end b"": unbounded)."""
    pa, pb_ = a.partition, b.partition
    a_before_b_ends = not pb_.partition_key_end or pa.partition_key_start < pb_.partition_key_end
    b_before_a_ends = not pa.partition_key_end or pb_.partition_key_start < pa.partition_key_end
    return a_before_b_ends and b_before_a_ends


def _overlap_message(table_id: str, a: TabletRecord, b: TabletRecord) -> str:
    def span(t: TabletRecord) -> str:
        p = t.partition
        end = f"0x{p.partition_key_end.hex()}" if p.partition_key_end else "unbounded"
        return f"[0x{p.partition_key_start.hex()}, {end})"

    return (
        f"table {table_id!r}: tablets {a.tablet_id!r} ({a.state.name}, {span(a)}) and "
        f"{b.tablet_id!r} ({b.state.name}, {span(b)}) would both own overlapping partitions; "
        "a replacement must mark the tablet it replaces REPLACED in the same write"
    )


def _check_replacement_links(
    t: TabletRecord, inserted: bool, tablet_after: Callable[[str], TabletRecord | None]
) -> None:
    """`replaces` and `replaced_by` name each other, after the write (both exist in one table:
    checked by the caller). A tablet that replaces X: X is REPLACED with `replaced_by` naming
    it. One exception: X may have gone on from REPLACED to DELETED later (a DELETED record holds
    no `replaced_by`); never at the insert of the replacement, which must mark X REPLACED in the
    same write. Together with `_check_transition` (`replaces` fixed at creation, `replaced_by`
    fixed once set) this keeps the links consistent for every row, not only the ones written."""
    if t.replaces is not None:
        old = tablet_after(t.replaces)
        if old is not None and old.replaced_by != t.tablet_id:
            later_deleted = old.state is TabletState.DELETED and not inserted
            if not later_deleted:
                raise InvalidArgument(
                    f"table {t.table_id!r}: tablet {t.tablet_id!r} replaces tablet "
                    f"{t.replaces!r}, which is {old.state.name} with replaced_by "
                    f"{old.replaced_by!r}; it must be REPLACED, replaced_by {t.tablet_id!r}, "
                    "after the same write"
                )
    if t.replaced_by is not None:
        new = tablet_after(t.replaced_by)
        if new is not None and new.replaces != t.tablet_id:
            raise InvalidArgument(
                f"table {t.table_id!r}: tablet {t.tablet_id!r} is replaced_by tablet "
                f"{t.replaced_by!r}, which replaces {new.replaces!r}, not {t.tablet_id!r}"
            )


def _check_transition(old: Record, new: Record) -> None:
    """Rules on how one row may change (module docstring, invariants)."""
    if isinstance(old, JoinCredentialUseRecord):
        raise FailedPrecondition(
            f"join credential {old.credential_sha256!r} already enrolled {old.tserver_uuid!r}: "
            "its record is never rewritten (docs/design/security.md#R10)"
        )
    if isinstance(old, TableRecord) and isinstance(new, TableRecord):
        where = f"table {old.table_id!r}"
        if old.is_removed and not new.is_removed:
            raise FailedPrecondition(f"{where} is REMOVED; it cannot become {new.state.name}")
        if new.schema.version < old.schema.version:
            raise FailedPrecondition(
                f"{where}: schema version {new.schema.version} is older than the recorded "
                f"{old.schema.version}"
            )
        if new.created_time_us != old.created_time_us:
            raise InvalidArgument(f"{where}: created_time_us is fixed at creation")
    elif isinstance(old, TabletRecord) and isinstance(new, TabletRecord):
        where = f"tablet {old.tablet_id!r}"
        if new.table_id != old.table_id:
            raise InvalidArgument(
                f"{where} belongs to table {old.table_id!r}; it cannot move to {new.table_id!r}"
            )
        if new.partition != old.partition:
            raise InvalidArgument(f"{where}: its partition is fixed at creation")
        if old.state is TabletState.DELETED and new.state is not TabletState.DELETED:
            raise FailedPrecondition(f"{where} is DELETED; it cannot become {new.state.name}")
        if old.state is TabletState.REPLACED and not new.state.is_terminal:
            raise FailedPrecondition(f"{where} is REPLACED; it cannot become {new.state.name}")
        if new.replaces != old.replaces:
            raise InvalidArgument(
                f"{where}: replaces is fixed at creation ({old.replaces!r}), got {new.replaces!r}"
            )
        if (
            old.replaced_by is not None
            and new.state is TabletState.REPLACED
            and new.replaced_by != old.replaced_by
        ):
            raise FailedPrecondition(
                f"{where} was replaced by {old.replaced_by!r}; it cannot be replaced by "
                f"{new.replaced_by!r}"
            )
        if old.consensus is not None:
            if new.consensus is None:
                raise InvalidArgument(f"{where}: its consensus state cannot be cleared")
            # One tablet id is one Raft group: its term and committed config only move on.
            if (
                new.consensus.term < old.consensus.term
                or new.consensus.config_index < old.consensus.config_index
            ):
                raise FailedPrecondition(
                    f"{where}: consensus state (term {new.consensus.term}, config op index "
                    f"{new.consensus.config_index}) is older than the recorded (term "
                    f"{old.consensus.term}, config op index {old.consensus.config_index})"
                )
