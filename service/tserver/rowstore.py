"""A tablet's rows: an in-memory store of the newest versions over immutable sorted files.

Theory of operation
-------------------
Rows live in three kinds of *sources*, from newest to oldest:

* the active **memstore** (`rowstore_memstore`): a dict from encoded primary key
  (`keys.encode_key`) to the newest version of the row (a tuple of values) or None for a
  tombstone. Raft-applied writes (`apply_write`) go here, and only here;
* zero or more **frozen** memstores: former active memstores being written to disk by `flush`
  (immutable: a worker thread may be reading them);
* **data files**: immutable Arrow IPC files sorted by encoded key, listed oldest first in the
  manifest. Each holds the key column `k` (binary), a tombstone flag `d`, and one column per
  table column named by the column's *id* (`c3`), never its name.

A key's state is its version in the newest source that has one; a tombstone hides older
versions until a compaction merges the files that hold them and drops both. Because files name
columns by id, rows written under an older schema read under the current one: an added column
comes out as its default (or null), a dropped one disappears, a renamed one keeps its data.

Durability. The manifest (`MANIFEST`) lists the live files, the current schema and
`flushed_index`: every write with a Raft index at or below it is in the listed files. It is
replaced atomically (temporary file, fsync, rename, fsync of the directory), after the data file
it adds was fsynced, so a crash leaves either the old or the new manifest; a data file the
manifest does not list (a crash mid-flush or mid-compaction) is deleted by `open`. The caller
replays its WAL from `flushed_index + 1`: `apply_write` skips indexes it has already applied.

Flush runs in three steps so that the slow part can run in a worker thread while the event loop
keeps applying writes: `freeze` (swap in a new memstore), `write_frozen` (write and fsync the
file; touches only immutable data), `install` (add the file to the manifest). Compaction follows
the same pattern (`prepare_compaction`, `write_compaction`, `install_compaction`) and merges
either every file (bounding their number; the caller's policy, see tablet.py) or one group of
files whose key ranges overlap (`overlapping_files`): only overlapping files cost a scan a
merge, and a group's keys are in no other file, so its merged file can go anywhere in the list.

Reads. `scan` and `checksum` read a `Snapshot` taken when called, between two applies: the
data files and frozen memstores of that moment (immutable) and a copy of the active memstore's
dict (row tuples are never mutated, so copying the dict is enough; about a millisecond per
100,000 rows). Everything costly happens when the snapshot is read, in the reader's thread (a
worker thread for the tablet server's Scan and Checksum), while applies go on: the memstores
are materialized as sorted Arrow tables (cached until the next write) and the sources are
merged by key windows (`rowstore_merge`):
where only one source has rows, its batches pass straight through (memory-mapped, no copy);
where sources overlap they are merged, newest version first. Tombstones are dropped, then
predicates (Arrow compute) and the projection are applied. A cold tablet (one file, or files
with disjoint key ranges, and an empty memstore) is read with no merge at all.

Key checks on apply never scan files: each file keeps its sorted keys as a numpy array of
fixed-width byte strings (or a Python list when widths differ) for binary search, and a batch
of keys is looked up with one vectorized `searchsorted` per file.

Installs. Rewriting the manifest costs two fsyncs (the file, the directory): milliseconds on
an idle disk, far more on one busy with WAL syncs and data files. So an install is cut in
three too, and only the middle one, which touches no state the apply thread uses, waits for
the disk: `stage_install` (or `stage_compaction`) sets the state the manifest is to say next
(`_Staged`: its files, flushed index and live rows); `write_manifest`, in a worker thread,
writes the newest staged state; `finish_install` (`finish_compaction`) then makes reads use
the new file and moves `flushed_index` on, and only then are a compaction's inputs deleted
(`remove_compacted`). The order keeps a crash safe: the manifest lists a file only once its
data is fsynced (`write_frozen`), `flushed_index`, which anchors the WAL (the tablet's Raft
log is kept from it on), never passes what the manifest on disk says, and no input of a
compaction is deleted while a durable manifest lists it. A staged state is true of the disk
even before its manifest is written (its file is durable, its flushed index fully applied),
so whichever manifest write runs, `alter_schema`'s on the apply thread included, it writes the
newest staged state, and writes are serialized by a lock. One install is under way at a time
(the tablet's flush task runs them one after another); while one is, the manifest on disk may
be ahead of `data_files` (`install_pending`), which a tablet copy's image must not be.

A failed apply. An entry that raises while it is applied may leave part of itself in the
memstore (`apply_write` notes the index first), and a manifest written after that would say
the entry is durable: the next start would skip it and run on with part of a write, silently.
So the tablet calls `fail` when an entry cannot be applied, and from then on nothing reaches
the disk (`freeze` and every manifest write raise): the files keep saying only what was fully
applied, and the replay after a restart meets the same entry and fails the same way.

Thread safety: every method except `write_frozen`, `write_compaction`, `write_manifest`,
`remove_compacted` and a `Snapshot`'s must be called from one thread (the tablet's apply loop).
Those only read data that no one mutates, or (`write_manifest`) a staged state replaced whole,
under their own lock.

This module holds the store itself: the manifest, writes, flush, compaction and reads (a
tablet copy ships the manifest and data files as they are, tablet_copy.py). The memstores and
how a write's rows meet the newest versions of their keys are in
`rowstore_memstore`; the physical layout, the key index and data file I/O in `rowstore_files`;
the sorted merge behind scans, compaction and checksums, and checksum hashing, in
`rowstore_merge`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.common.errors import (
    AlreadyExists,
    Corruption,
    InvalidArgument,
    TesseraError,
)
from service.common.hybrid_time import describe
from service.common.keys import decode_key, encode_keys_arrow
from service.common.predicates import IS_DELETED, ScanSpec, to_arrow_expression, validate_spec
from service.common.schema import ColumnSchema, Schema
from service.common.schema_codec import schema_from_pb, schema_to_pb
from service.consensus.fs import RealFileSystem
from service.pb import common_pb2
from service.tserver.key_splitting import KeyView, MemRows
from service.tserver.row_ops import WriteBatch
from service.tserver.rowstore_files import (
    DEL_COL,
    KEY_COL,
    TS_COL,
    Source,
    file_schema,
    history_path,
    open_arrow_file,
    phys_name,
    write_arrow_file,
    write_version_files,
)
from service.tserver.rowstore_memstore import (
    Frozen,
    MemSnapshot,
    MemStore,
    OlderVersions,
    apply_batch,
    key_text,
    merge_staged,
)
from service.tserver.rowstore_merge import (
    emit_batches,
    hash_array,
    merge_sources,
    merge_versions,
)

__all__ = [
    "IS_DELETED",
    "MANIFEST",
    "OUTSIDE_SAMPLE_KEYS",
    "AppliedWrite",
    "Checksum",
    "Compaction",
    "Frozen",
    "OutsidePredicate",
    "RowStore",
    "Snapshot",
    "is_store_file",
]

MANIFEST = "MANIFEST"
"""The manifest's file name inside the store's directory."""

_FILE_RE = re.compile(r"^rs-\d{8}\.(arrow|history)(\.tmp)?$")
_MANIFEST_MAGIC = b"TESSERA-ROWSTORE-MANIFEST 1\n"


def is_store_file(name: str) -> bool:
    """Whether `name` is the manifest, a data file or a history file name (what a tablet copy
    may write)."""
    return name == MANIFEST or (_FILE_RE.match(name) is not None and not name.endswith(".tmp"))


OutsidePredicate = Callable[[pa.Table], np.ndarray]
"""Given live rows' primary-key columns (named as in the schema), a bool mask: True for each
row whose key lies outside the tablet's partition (`PartitionSchema.rows_outside`, bound to
the schema and the partition)."""

OUTSIDE_SAMPLE_KEYS = 10
"""How many encoded keys of rows outside the partition a checksum keeps, for the operator."""


@dataclass(frozen=True)
class Checksum:
    """What `Snapshot.checksum` read: the live rows and their digest, and, when it was given a
    partition to check against, how many of those rows lie outside it and the encoded keys of
    the first few (in key order). Replicas at one applied index must agree on all of it."""

    rows: int
    digest: bytes
    outside_rows: int = 0
    outside_sample_keys: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class AppliedWrite:
    """The outcome of one applied write entry.

    `rows_applied` counts rows that changed the tablet (an INSERT_IGNORE of an existing key does
    not); `errors` lists (row index, error) for rows refused; `skipped` says the entry's index
    was already applied (WAL replay) and nothing happened.
    """

    rows_applied: int = 0
    errors: tuple[tuple[int, TesseraError], ...] = ()
    skipped: bool = False


class Compaction:
    """A compaction under way: the files it merges and its output file."""

    def __init__(
        self,
        inputs: tuple[str, ...],
        sources: tuple[Source, ...],
        file_name: str,
        schema: Schema,
        horizon: int = 0,
    ) -> None:
        self.inputs = inputs
        self.sources = sources
        self.file_name = file_name
        self.schema = schema
        self.horizon = horizon
        """Versions only snapshots older than this can see are dropped (`merge_versions`)."""
        self.written: Source | None = None
        self.empty = False


# --- the store -------------------------------------------------------------------------------


class RowStore:
    """A tablet's rows (see the module docstring). Create with `create` or `open`; apply Raft
    entries in index order from one thread."""

    def __init__(
        self,
        directory: Path,
        schema: Schema,
        files: list[tuple[str, Source]],
        flushed_index: int,
        live_rows: int,
        next_seq: int,
        max_ts: int = 0,
        horizon: int = 0,
    ) -> None:
        self._dir = directory
        self._fs = RealFileSystem()
        self._schema = schema
        self._files = files  # (name, source), oldest first; only replaced, never mutated
        self._flushed = flushed_index
        self._applied = flushed_index
        self._live = live_rows  # live rows of files + frozen + memstore
        self._next_seq = next_seq
        self._max_ts = max_ts
        """The newest commit timestamp applied: the replica's safe time (`safe_time`)."""
        self._horizon = horizon
        """Versions older than this may have been dropped by a compaction (`history_horizon`)."""
        self._staged = _Staged(
            tuple(name for name, _ in files),
            flushed_index,
            live_rows,
            frozenset(name for name, src in files if src.history is not None),
            max_ts,
            horizon,
        )
        """What the manifest says, or is being rewritten to say (module docstring, Installs)."""
        self._pending: Frozen | Compaction | None = None
        """The install whose manifest is being written (between `stage_*` and `finish_*`)."""
        self._manifest_lock = threading.Lock()  # one manifest write at a time, from any thread
        self._mem = MemStore(schema, flushed_index)
        self._mem.last_ts = max_ts
        self._frozen: list[Frozen] = []
        self._compacting: Compaction | None = None
        self._lock = threading.Lock()  # guards _next_seq only when called from workers
        self._closed = False
        self._failed: str | None = None

    # --- lifecycle -----------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, schema: Schema) -> RowStore:
        """A new, empty store in `directory` (created if missing); AlreadyExists if one is
        there."""
        directory = Path(directory)
        schema.validate()
        RealFileSystem().makedirs(str(directory))
        if (directory / MANIFEST).exists():
            raise AlreadyExists(f"row store {directory} already exists")
        store = cls(directory, schema, [], 0, 0, 1)
        store.write_manifest()
        return store

    @classmethod
    def open(cls, directory: Path) -> RowStore:
        """Load the store in `directory`; Corruption naming the file if the manifest or a data
        file is missing or damaged. Data files the manifest does not list are deleted."""
        directory = Path(directory)
        path = directory / MANIFEST
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise Corruption(f"row store manifest {path}: cannot read: {e}") from None
        m = _parse_manifest(path, raw)
        try:
            schema = schema_from_pb(common_pb2.SchemaPB.FromString(base64.b64decode(m.schema)))
        except (TesseraError, ValueError) as e:
            raise Corruption(f"row store manifest {path}: bad schema: {e}") from None
        names = m.files
        files = []
        keep = set(names)
        for name in names:
            if not _FILE_RE.match(name) or not name.endswith(".arrow"):
                raise Corruption(f"row store manifest {path}: bad file name {name!r}")
            fpath = directory / name
            if not fpath.exists():
                raise Corruption(f"row store data file {fpath}: missing")
            has_history = name in m.history
            if has_history:
                keep.add(history_path(fpath).name)
            files.append((name, open_arrow_file(fpath, schema, history=has_history)))
        removed = False
        for entry in os.listdir(directory):
            if (_FILE_RE.match(entry) and entry not in keep) or entry == MANIFEST + ".tmp":
                os.remove(directory / entry)  # left by a crash mid-flush or mid-compaction
                removed = True
        if removed:
            RealFileSystem().fsync_dir(str(directory))
        return cls(
            directory,
            schema,
            files,
            m.flushed_index,
            m.live_rows,
            m.next_seq,
            m.max_ts,
            m.horizon,
        )

    def close(self) -> None:
        """Release the data files. The store must not be used afterwards."""
        self._closed = True
        self._files = []
        self._frozen = []
        self._mem = MemStore(self._schema, self._applied)

    def fail(self, reason: str) -> None:
        """An entry could not be applied: write nothing more to disk (module docstring)."""
        if self._failed is None:
            self._failed = reason

    def _check_not_failed(self) -> None:
        if self._failed is not None:
            raise Corruption(
                f"row store {self._dir}: nothing is written after a failed apply ({self._failed})"
            )

    # --- state ---------------------------------------------------------------------------

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def flushed_index(self) -> int:
        """Every entry at or below this index is durable in the data files."""
        return self._flushed

    @property
    def applied_index(self) -> int:
        """The highest index given to apply_write, alter_schema or note_index."""
        return self._applied

    @property
    def safe_time(self) -> int:
        """The newest commit timestamp applied (writes and timestamp entries alike). Entries
        are stamped in log order, so every entry at or before it is applied here and none
        that commits later can be (docs/design/tablets.md#R4)."""
        return self._max_ts

    @property
    def history_horizon(self) -> int:
        """The oldest timestamp a snapshot may read at: a compaction may have dropped the
        versions only older snapshots could see (docs/design/tablets.md#R5)."""
        return self._horizon

    def history_rows(self) -> int:
        """Superseded versions kept for snapshots, in files and memstores (an estimate for
        the memstores: their history entries)."""
        files = sum(src.history_rows for _, src in self._files)
        mems = sum(sum(len(v) for v in f.mem.history.values()) for f in self._frozen)
        return files + mems + sum(len(v) for v in self._mem.history.values())

    def memstore_rows(self) -> int:
        """Row versions in the active memstore (tombstones included)."""
        return len(self._mem.rows)

    def memstore_bytes(self) -> int:
        """A rough estimate of the active memstore's memory use."""
        return self._mem.nbytes

    def row_count(self) -> int:
        """Live rows, exactly (maintained on apply, persisted in the manifest)."""
        return self._live

    def on_disk_bytes(self) -> int:
        total = 0
        for name in self.data_files():
            with contextlib.suppress(OSError):
                total += (self._dir / name).stat().st_size
        return total

    def data_files(self) -> list[str]:
        """The manifest, the live data files and their history files, relative to the
        directory (tablet copy)."""
        out = [MANIFEST]
        for name, src in self._files:
            out.append(name)
            if src.history is not None:
                out.append(history_path(Path(name)).name)
        return out

    # --- manifest ------------------------------------------------------------------------

    def write_manifest(self) -> None:
        """Replace the manifest (atomically, fsynced) with the newest staged state and the
        current schema. Safe in a worker thread: writes are serialized, and each writes the
        newest state when it runs, so the last to finish leaves the newest state on disk."""
        with self._manifest_lock:
            self._check_not_failed()
            staged = self._staged
            body = json.dumps(
                {
                    "files": list(staged.files),
                    "schema": base64.b64encode(
                        schema_to_pb(self._schema).SerializeToString()
                    ).decode(),
                    "flushed_index": staged.flushed_index,
                    "live_rows": staged.live_rows,
                    "next_seq": self._next_seq,
                    "history": sorted(staged.history),
                    "max_ts": staged.max_ts,
                    "horizon": staged.horizon,
                },
                sort_keys=True,
            ).encode()
            digest = hashlib.blake2b(body, digest_size=16).hexdigest().encode()
            self._fs.write_atomic(
                str(self._dir / MANIFEST), _MANIFEST_MAGIC + digest + b"\n" + body
            )

    def _new_file_name(self) -> str:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
        return f"rs-{seq:08d}.arrow"

    # --- writes --------------------------------------------------------------------------

    def note_index(self, index: int) -> None:
        """A Raft entry that is not a write (no-op, config change) was applied."""
        if index > self._applied:
            self._applied = index
            self._mem.last_index = index

    def note_timestamp(self, index: int, ts: int) -> None:
        """A timestamp entry (docs/design/tablets.md#R4) was applied: no later entry commits at
        or before `ts`, so the safe time moves to it."""
        if index <= self._applied:
            return
        self.note_index(index)
        self._note_ts(ts)

    def _note_ts(self, ts: int) -> None:
        if ts > self._max_ts:
            self._max_ts = ts
            self._mem.last_ts = ts

    def alter_schema(self, index: int, schema: Schema) -> None:
        """Switch to `schema` (same key columns by id). A version at or below the current one
        is a no-op: on WAL replay the manifest may already hold a newer schema. The manifest is
        rewritten at once with the new schema (flushed_index unchanged)."""
        if index <= self._applied:
            return
        if schema.version <= self._schema.version:
            self.note_index(index)
            return
        # Checked before anything changes: a refused alter leaves the store as it was.
        schema.validate()
        old_key = tuple((c.id, c.type_name) for c in self._schema.key_columns)
        new_key = tuple((c.id, c.type_name) for c in schema.key_columns)
        if old_key != new_key:
            raise InvalidArgument(
                f"alter schema: key columns changed from {old_key} to {new_key} (id, type)"
            )
        old_types = {c.id: c.arrow_type() for c in self._schema.columns}
        for c in schema.columns:
            if c.id in old_types and old_types[c.id] != c.arrow_type():
                raise InvalidArgument(f"alter schema: column {c.name!r} changed type")
        self.note_index(index)
        # The active memstore is re-laid out for the new schema; frozen ones keep their layout
        # and are read by id like files.
        self._mem = self._mem.relaid_out(schema)
        self._schema = schema
        self.write_manifest()

    def apply_write(self, index: int, batch: WriteBatch, ts: int = 0) -> AppliedWrite:
        """Apply one replicated write (deterministic: same state and batch, same outcome),
        its rows becoming versions committed at `ts` (docs/design/tablets.md#R3).

        Rows apply in order; a refused row (INSERT of a live key: AlreadyExists; UPDATE or
        DELETE of a missing one: NotFound) is reported and the others still apply.
        """
        if index <= self._applied:
            return AppliedWrite(skipped=True)
        self.note_index(index)
        self._note_ts(ts)
        n = batch.num_rows
        if n == 0:
            return AppliedWrite()
        older = OlderVersions(self._schema, self._mem, self._frozen, [f for _, f in self._files])
        applied, errors, live_delta = apply_batch(self._mem, self._schema, batch, older, ts)
        self._live += live_delta
        return AppliedWrite(applied, tuple(errors))

    def apply_staged(
        self,
        index: int,
        items: Sequence[tuple[bytes, tuple[object, ...] | None]],
        col_ids: tuple[int, ...],
        ts: int,
        live_delta: int,
    ) -> AppliedWrite:
        """Apply part of a transaction's commit (entry `index`): its staged row images become
        versions committed at `ts` (`rowstore_memstore.merge_staged`), changing the live row
        count by `live_delta` (what staging them computed). Skipped at or below the applied
        index, like any write (the files hold it already after a restart)."""
        if index <= self._applied:
            return AppliedWrite(skipped=True)
        self.note_index(index)
        self._note_ts(ts)
        applied = merge_staged(self._mem, items, col_ids, self._schema, ts)
        self._live += live_delta
        return AppliedWrite(applied)

    def write_conflict(
        self, batch: WriteBatch, start_ts: int, own: Sequence[Mapping[bytes, object]] = ()
    ) -> str | None:
        """The first row of `batch` whose key has a version (a row or a deletion) committed
        after `start_ts`, described, or None: a transaction whose snapshot is `start_ts`
        must not write it (docs/design/transactions.md#R2; snapshot isolation's first
        committer wins). Keys staged by the transaction itself (in `own`, its scratch
        memstores' rows) are skipped. Only the memstores and files holding a version newer
        than `start_ts` are looked at: usually the active memstore alone, and nothing at all
        when the tablet took no write since the snapshot (a load into a quiet table)."""
        if not start_ts or batch.num_rows == 0:
            return None
        mems = [m for m in [*(f.mem for f in self._frozen), self._mem] if m.max_time > start_ts]
        files = [f for _, f in self._files if f.max_time > start_ts]
        if not mems and not files:
            return None
        keys = encode_keys_arrow(self._schema.key_columns, batch.table)
        if own:
            keys = [k for k in keys if not any(k in rows for rows in own)]
        if not keys:
            return None
        older = OlderVersions(self._schema, self._mem, [_AsFrozen(m) for m in mems], files)
        times = older.newest_times(list(dict.fromkeys(keys)))
        for k in keys:
            ts = times.get(k, 0)
            if ts > start_ts:
                return (
                    f"{key_text(self._schema, k)} was changed at {describe(ts)}, after the "
                    f"transaction's snapshot {describe(start_ts)}"
                )
        return None

    def stage_write(self, batch: WriteBatch, scratch: MemStore) -> tuple[AppliedWrite, int]:
        """Apply a transaction's write to its scratch memstore instead of the tablet's
        (docs/design/transactions.md#R2): each row's outcome is decided against the committed
        rows and what `scratch` already holds, exactly as `apply_write` would decide it, and
        nothing of the tablet changes. The caller keeps the scratch memstore until the
        transaction commits (`apply_staged`) or aborts. Also returns the change of the live
        row count the write makes once committed (its keys stay locked until then)."""
        if batch.num_rows == 0:
            return AppliedWrite(), 0
        active = _AsFrozen(self._mem)
        older = OlderVersions(
            self._schema, scratch, [*self._frozen, active], [f for _, f in self._files]
        )
        applied, errors, live_delta = apply_batch(scratch, self._schema, batch, older, 0)
        return AppliedWrite(applied, tuple(errors)), live_delta

    # --- flush ---------------------------------------------------------------------------

    def freeze(self) -> Frozen | None:
        """Make the active memstore immutable and start a new one; None if it is empty."""
        self._check_not_failed()
        mem = self._mem
        if not mem.rows:
            return None
        frozen = Frozen(mem, self._new_file_name(), self._live)
        self._frozen.append(frozen)
        self._mem = MemStore(self._schema, mem.last_index)
        self._mem.last_ts = mem.last_ts
        return frozen

    def write_frozen(self, f: Frozen) -> None:
        """Write `f`'s rows to its data file (and its history to the history file) and fsync
        them. Safe in a worker thread."""
        src = f.mem.source()
        path = self._dir / f.file_name
        schema = f.mem.file_schema()
        if src.history is not None:
            write_arrow_file(history_path(path), iter([src.history]), schema)
        write_arrow_file(path, iter([src.table]), schema)
        # The frozen memstore's own layout is the authority for the file it wrote: no check
        # against the (possibly newer) current schema.
        f.written = open_arrow_file(path, None, history=src.history is not None)

    def install(self, f: Frozen) -> None:
        """Add `f`'s written file to the manifest (flushed_index = f.last_index), fsync it and
        drop the frozen memstore, in this thread: `stage_install`, `write_manifest`,
        `finish_install`. Frozen memstores are installed in the order frozen."""
        self.stage_install(f)
        self.write_manifest()
        self.finish_install(f)

    def stage_install(self, f: Frozen) -> None:
        """The manifest's next state lists `f`'s file (module docstring, Installs); reads and
        `flushed_index` do not change until `finish_install`."""
        if not self._frozen or self._frozen[0] is not f:
            raise InvalidArgument("install: frozen memstores must be installed in freeze order")
        if f.written is None:
            raise InvalidArgument("install: write_frozen has not completed")
        self._stage(f)
        st = self._staged
        history = st.history | ({f.file_name} if f.written.history is not None else set())
        self._staged = _Staged(
            (*st.files, f.file_name),
            max(st.flushed_index, f.last_index),
            f.live_rows,
            history,
            max(st.max_ts, f.last_ts),
            st.horizon,
        )

    def finish_install(self, f: Frozen) -> None:
        """Once the manifest staged by `stage_install(f)` is durable: reads take the file
        instead of the frozen memstore, and `flushed_index` (the WAL's anchor) moves on."""
        self._finish(f)
        assert f.written is not None
        self._files = [*self._files, (f.file_name, f.written)]
        self._flushed = max(self._flushed, f.last_index)
        self._frozen = self._frozen[1:]

    def _stage(self, what: Frozen | Compaction) -> None:
        if self._pending is not None:
            raise InvalidArgument("install: another install is under way")
        self._pending = what

    def _finish(self, what: Frozen | Compaction) -> None:
        if self._pending is not what:
            raise InvalidArgument("install: finishing an install that was not staged")
        self._pending = None

    @property
    def install_pending(self) -> bool:
        """Whether an install's manifest is being written: the manifest on disk may then be
        ahead of what `data_files` and `flushed_index` say."""
        return self._pending is not None

    def flush(self) -> None:
        """freeze + write_frozen + install, in this thread. With nothing to flush, still
        advances flushed_index to applied_index (no-op entries need no replay)."""
        f = self.freeze()
        if f is not None:
            self.write_frozen(f)
            self.install(f)
        else:
            if self._pending is not None and self._flushed < self._applied:
                raise InvalidArgument("flush: an install is under way")
            index = self.stage_advance(self._applied)
            if index is not None:
                self.write_manifest()
                self.finish_advance(index)

    def stage_advance(self, applied: int) -> int | None:
        """With no rows to flush, but entries that carry none applied since the last flush:
        stage a manifest whose flushed index is `applied` (or the store's own applied index, if
        higher), and return it (None: nothing to advance). Then `write_manifest` (a worker
        thread may) and `finish_advance`. `applied` is the Raft applied index: the entries
        above the store's own up to it carry no rows (no-ops and config changes never reach
        the store). Called on the applying thread, with the memstore seen empty: a row applied
        while the manifest is written is above the index. A tablet copy relies on this: its
        image is at the flushed index, and the config the copy gives the new replica is the
        config as of that index (tablet_copy.py)."""
        if self._pending is not None or self._frozen or self._mem.rows:
            return None
        index = max(applied, self._applied)
        if self._flushed >= index:
            return None
        self.note_index(index)
        st = self._staged
        self._staged = _Staged(st.files, index, st.live_rows, st.history, self._max_ts, st.horizon)
        return index

    def finish_advance(self, index: int) -> None:
        """The manifest staged by `stage_advance` is durable: the WAL's anchor may move on."""
        self._flushed = max(self._flushed, index)

    # --- compaction ----------------------------------------------------------------------

    def prepare_compaction(
        self, *, overlapping: bool = False, horizon: int = 0
    ) -> Compaction | None:
        """Start merging files into one; None if there is nothing to gain.

        By default every current file (this bounds the number of files, and drops tombstones).
        With `overlapping`, only the largest group of files whose key ranges overlap, the files
        a scan has to merge window by window: rows written in key order make files with
        disjoint ranges, which scans read straight through, so they are left alone. Files
        outside the group hold none of its keys, so where the merged file goes in the
        oldest-first list cannot change which version of a key is the newest.
        """
        if self._compacting is not None or not self._files:
            return None
        files = self._files
        if overlapping:
            groups = self.overlapping_files()
            if not groups:
                return None
            chosen = set(max(groups, key=lambda g: sum(files[i][1].num_rows for i in g)))
            files = [f for i, f in enumerate(files) if i in chosen]
        elif (
            len(files) == 1
            and not files[0][1].has_tombstones
            and (files[0][1].history is None or horizon <= self._horizon)
        ):
            return None
        c = Compaction(
            tuple(name for name, _ in files),
            tuple(src for _, src in files),
            self._new_file_name(),
            self._schema,
            max(horizon, self._horizon),
        )
        self._compacting = c
        return c

    def overlapping_files(self) -> list[list[int]]:
        """Groups (of two or more) of files whose key ranges overlap, directly or through other
        files of the group, as positions in the file list; disjoint groups, in key order."""
        spans = []
        for i, (_, src) in enumerate(self._files):
            keys = src.table.column(KEY_COL)
            if len(keys):
                spans.append((keys[0].as_py(), keys[len(keys) - 1].as_py(), i))
        spans.sort()
        groups: list[list[int]] = []
        group: list[int] = []
        top = b""
        for first, last, i in spans:
            if group and first <= top:
                group.append(i)
                top = max(top, last)
                continue
            if len(group) > 1:
                groups.append(sorted(group))
            group, top = [i], last
        if len(group) > 1:
            groups.append(sorted(group))
        return groups

    def write_compaction(self, c: Compaction) -> None:
        """Merge `c`'s inputs into its output file and history file (fsynced), keeping the
        versions snapshots at or after its horizon may read (`merge_versions`). Safe in a
        worker thread."""
        cols = c.schema.columns
        path = self._dir / c.file_name
        rows, hist_rows = write_version_files(
            path, merge_versions(list(c.sources), cols, c.horizon), file_schema(cols)
        )
        if rows == 0:
            c.empty = True
            path.unlink()
            history_path(path).unlink(missing_ok=True)
            return
        c.written = open_arrow_file(path, c.schema, history=hist_rows > 0)

    def install_compaction(self, c: Compaction) -> None:
        """Swap the merged file in for its inputs (manifest first), then delete the inputs, in
        this thread: `stage_compaction`, `write_manifest`, `finish_compaction`,
        `remove_compacted`."""
        self.stage_compaction(c)
        self.write_manifest()
        self.finish_compaction(c)
        self.remove_compacted(c)

    def stage_compaction(self, c: Compaction) -> None:
        """The manifest's next state lists the merged file instead of its inputs (module
        docstring, Installs); reads do not change until `finish_compaction`."""
        if self._compacting is not c:
            raise InvalidArgument("install_compaction: not the compaction under way")
        if c.written is None and not c.empty:
            raise InvalidArgument("install_compaction: write_compaction has not completed")
        self._stage(c)
        inputs = set(c.inputs)
        st = self._staged
        head = (c.file_name,) if c.written is not None else ()
        files = head + tuple(name for name in st.files if name not in inputs)
        history = (st.history - inputs) | (
            {c.file_name} if c.written is not None and c.written.history is not None else set()
        )
        self._staged = _Staged(
            files,
            st.flushed_index,
            st.live_rows,
            history,
            st.max_ts,
            max(st.horizon, c.horizon),
        )

    def finish_compaction(self, c: Compaction) -> None:
        """Once the manifest staged by `stage_compaction(c)` is durable: reads take the merged
        file instead of its inputs."""
        self._finish(c)
        inputs = set(c.inputs)
        rest = [(name, src) for name, src in self._files if name not in inputs]
        head = [(c.file_name, c.written)] if c.written is not None else []
        self._files = head + rest
        self._horizon = max(self._horizon, c.horizon)
        self._compacting = None

    def remove_compacted(self, c: Compaction) -> None:
        """Delete `c`'s inputs, after `finish_compaction`. Safe in a worker thread: readers
        that took them before keep reading them (memory-mapped; an unlinked file lives on)."""
        for name in c.inputs:
            for path in (self._dir / name, history_path(self._dir / name)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self._fs.fsync_dir(str(self._dir))

    def compact(self, horizon: int = 0) -> None:
        """prepare + write + install compaction, in this thread."""
        c = self.prepare_compaction(horizon=horizon)
        if c is not None:
            self.write_compaction(c)
            self.install_compaction(c)

    # --- reads ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The rows as of now, cheaply (module docstring, Reads): call between two applies."""
        files = tuple(src for _, src in self._files)
        mems = [MemSnapshot(f.mem, frozen=True) for f in self._frozen]
        if self._mem.rows:
            mems.append(MemSnapshot(self._mem))
        return Snapshot(self._schema, files, tuple(mems), self._applied)

    def split_view(self) -> KeyView:
        """The sorted sources for `key_splitting`, safe to read in a worker thread: files and
        frozen memstores are immutable, the active memstore's dict is copied (not its rows)."""
        mems = [MemRows(f.mem.rows, f.mem.col_ids) for f in self._frozen]
        if self._mem.rows:
            mems.append(MemRows(dict(self._mem.rows), self._mem.col_ids))
        return KeyView(tuple(src for _, src in self._files), tuple(mems), self._live)

    def scan(self, spec: ScanSpec) -> Iterator[pa.RecordBatch]:
        """Rows matching `spec` in key order, as batches of the projected columns (exact Arrow
        types, current names). The snapshot is taken now: later writes are not seen."""
        it = self.scan_with_keys(spec)
        return (b for b, _ in it)

    def scan_with_keys(self, spec: ScanSpec) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """As `scan`, each batch with the encoded key of its last row (to resume after)."""
        schema = self._schema
        preds = validate_spec(schema, spec)
        proj = spec.projection if spec.projection is not None else schema.column_names
        out_cols = [schema.column(name) for name in proj]
        wanted = set(proj) | {p.column for p in preds}
        cols = [c for c in schema.columns if c.name in wanted]
        expr = to_arrow_expression(
            schema, preds, field_names={c.name: phys_name(c.id) for c in schema.columns}
        )
        lo = spec.lower_key
        if spec.start_after_key is not None:
            lo = max(lo, spec.start_after_key + b"\x00")  # the smallest key after it
        hi = spec.upper_key
        snap = self.snapshot()
        fields = [schema.to_arrow().field(name) for name in proj]
        if spec.diff_start is not None:
            if spec.read_at is None:
                raise InvalidArgument("a diff scan reads at a snapshot: give read_at")
            fields.append(pa.field(IS_DELETED, pa.bool_(), False))
            changes = snap.changes(cols, lo, hi, expr, spec.diff_start, spec.read_at)
            return emit_batches(
                changes, out_cols, pa.schema(fields), spec.limit, deleted_column=True
            )
        merged = snap.merged(cols, lo, hi, expr, at=spec.read_at)
        return emit_batches(merged, out_cols, pa.schema(fields), spec.limit)

    def checksum(self, outside: OutsidePredicate | None = None) -> Checksum:
        """`Snapshot.checksum` of the rows as of now, in this thread."""
        return self.snapshot().checksum(outside)


class _AsFrozen:
    """The active memstore seen as the newest frozen one (`OlderVersions` reads `.mem`): a
    staged write looks committed rows up in it like in the others."""

    def __init__(self, mem: MemStore) -> None:
        self.mem = mem


@dataclass(frozen=True)
class Snapshot:
    """A row store's rows as of one applied index, readable in any thread.

    Taken between two applies (`RowStore.snapshot`), it holds the immutable data files and
    frozen memstores of that moment and a copy of the active memstore's dict; the costly part,
    materializing memstores as Arrow and merging, happens when it is read, in the reader's
    thread, while applies go on. `applied_index` is the row store's at that moment.
    """

    schema: Schema
    files: tuple[Source, ...]
    mems: tuple[MemSnapshot, ...]
    applied_index: int

    def sources(self) -> list[Source]:
        """Every source, oldest first (memstores materialized now, in this thread)."""
        return [*self.files, *(m.source() for m in self.mems)]

    def merged(
        self,
        cols: Sequence[ColumnSchema],
        lo: bytes,
        hi: bytes,
        expr: pc.Expression | None,
        *,
        at: int | None = None,
    ) -> Iterator[pa.Table]:
        """`merge_sources` over this snapshot: a generator, so that nothing, not even the
        memstores' Arrow form, is built before its first item is asked for. `at`: the rows
        as of that timestamp (each source as of it, `Source.as_of`); None: the newest."""
        sources = self.sources()
        if at is not None:
            needed = [phys_name(c.id) for c in cols]
            sources = [src.as_of(at, needed) for src in sources]
        yield from merge_sources(sources, cols, lo, hi, expr)

    def changes(
        self,
        cols: Sequence[ColumnSchema],
        lo: bytes,
        hi: bytes,
        expr: pc.Expression | None,
        since: int,
        at: int,
    ) -> Iterator[pa.Table]:
        """A diff (docs/design/tablets.md#R3): every key whose version as of `at` was
        committed after `since`, as it is at `at`; a key deleted by then as its tombstone
        (`d` set, values null). `expr` filters live rows only. Physical tables with `d`."""
        needed = [TS_COL, *(phys_name(c.id) for c in cols)]
        # Only versions committed after `since` can be in the diff, and dropping the others
        # from each source before the merge changes nothing: a key's versions are newer in
        # newer sources, so a key whose newest version (as of `at`) is older than `since` has
        # no newer one anywhere. A source older than `since` is skipped whole, and the merge
        # sees the changed rows only (30,000 of 3 million for a 1% backup, not all of them).
        sources = [
            src.as_of(at, needed).newer_than(since)
            for src in self.sources()
            if src.max_time > since
        ]
        key_cols = [c for c in self.schema.key_columns if any(k.id == c.id for k in cols)]
        for t in merge_sources(sources, cols, lo, hi, expr, with_deleted=True):
            newer = pc.greater(t.column(TS_COL), pa.scalar(since, pa.uint64()))
            t = t.filter(newer)
            if t.num_rows:
                yield _with_deleted_keys(t, key_cols)

    def checksum(self, outside: OutsidePredicate | None = None) -> Checksum:
        """The live rows and a blake2b digest over every live row in key order, every column;
        with `outside`, also the rows it marks (those outside the tablet's partition) and the
        encoded keys of the first `OUTSIDE_SAMPLE_KEYS` of them.

        Columns are hashed as canonical value streams (validity, fixed-width values with nulls
        zeroed, lengths and bytes of variable-width values), so the digest does not depend on
        how rows are split among files, memstores or batches: replicas at the same index agree
        whatever they flushed or compacted. Costs time linear in the tablet; run it in a
        worker thread (hashing and Arrow release the GIL for most of it).

        The partition check rides on the same pass because it is ksck's only way to find rows
        a server accepted before writes were checked against the partition
        (docs/design/tablets.md#R2), and reading every row twice would double the cost of a
        check that already reads them all. The digest does not depend on it. The merged tables
        name columns by id (`phys_name`); `outside` gets the key columns under their names, as
        `PartitionSchema.rows_outside` reads them (`keys.arrow_key_column`). Its hashing runs
        row by row in Python (holding the GIL), so a partitioned tablet's checksum costs more
        than its digest alone.
        """
        schema = self.schema
        hashers = [[hashlib.blake2b(digest_size=32) for _ in range(3)] for _ in schema.columns]
        key_cols = schema.key_columns
        key_phys = [phys_name(c.id) for c in key_cols]
        key_names = [c.name for c in key_cols]
        rows = 0
        outside_rows = 0
        samples: list[bytes] = []
        for t in self.merged(schema.columns, b"", b"", None):
            rows += t.num_rows
            for c, hs in zip(schema.columns, hashers, strict=True):
                for chunk in t.column(phys_name(c.id)).chunks:
                    hash_array(chunk, c, hs)
            if outside is not None and t.num_rows:
                mask = outside(t.select(key_phys).rename_columns(key_names))
                n = int(np.count_nonzero(mask))
                outside_rows += n
                if n and len(samples) < OUTSIDE_SAMPLE_KEYS:
                    first = np.flatnonzero(mask)[: OUTSIDE_SAMPLE_KEYS - len(samples)]
                    samples.extend(t.column(KEY_COL).take(pa.array(first)).to_pylist())
        top = hashlib.blake2b(digest_size=32)
        top.update(rows.to_bytes(8, "little"))
        for c, hs in zip(schema.columns, hashers, strict=True):
            top.update(f"{c.id}:{c.type_name}".encode())
            for h in hs:
                top.update(h.digest())
        return Checksum(rows, top.digest(), outside_rows, tuple(samples))


def _with_deleted_keys(t: pa.Table, key_cols: Sequence[ColumnSchema]) -> pa.Table:
    """`t` with the key columns of its tombstones filled in from their encoded keys (a
    tombstone stores no values; a diff reports which key it deleted)."""
    deleted = np.asarray(t.column(DEL_COL).to_numpy(zero_copy_only=False), dtype=bool)
    if not deleted.any() or not key_cols:
        return t
    where = np.flatnonzero(deleted)
    keys = t.column(KEY_COL).take(pa.array(where)).to_pylist()
    decoded = [decode_key(key_cols, k) for k in keys]
    mask = pa.array(deleted)
    for j, c in enumerate(key_cols):
        name = phys_name(c.id)
        values = pa.array([row[j] for row in decoded], type=c.arrow_type())
        col = t.column(name).combine_chunks()
        i = t.schema.get_field_index(name)
        t = t.set_column(i, name, pc.replace_with_mask(col, mask, values))
    return t


@dataclass(frozen=True)
class _Staged:
    """The part of the manifest that installs change (module docstring, Installs)."""

    files: tuple[str, ...]
    flushed_index: int
    live_rows: int
    """Live rows of the state the manifest describes."""
    history: frozenset[str] = frozenset()
    """The data files that have a history file."""
    max_ts: int = 0
    """The newest commit timestamp among the entries up to `flushed_index`."""
    horizon: int = 0
    """The history horizon of the compactions behind `files`."""


@dataclass(frozen=True)
class _Manifest:
    files: list[str]
    schema: str
    """The SchemaPB, serialized, in base64."""
    flushed_index: int
    live_rows: int
    next_seq: int
    history: frozenset[str] = frozenset()
    max_ts: int = 0
    horizon: int = 0


def _parse_manifest(path: Path, raw: bytes) -> _Manifest:
    if not raw.startswith(_MANIFEST_MAGIC):
        raise Corruption(f"row store manifest {path}: bad header")
    digest, _, body = raw[len(_MANIFEST_MAGIC) :].partition(b"\n")
    if hashlib.blake2b(body, digest_size=16).hexdigest().encode() != digest:
        raise Corruption(f"row store manifest {path}: checksum mismatch")
    try:
        m = json.loads(body)
        files = m["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError("files must be a list of names")
        ints = [m[k] for k in ("flushed_index", "live_rows", "next_seq")]
        if not all(isinstance(v, int) and v >= 0 for v in ints):
            raise ValueError("bad counters")
        if not isinstance(m["schema"], str):
            raise ValueError("schema must be a string")
        # Versions (docs/design/tablets.md#R3): absent from manifests written before them.
        history = m.get("history", [])
        if not isinstance(history, list) or not set(history) <= set(files):
            raise ValueError("history must list data files of the manifest")
        stamps = [m.get(k, 0) for k in ("max_ts", "horizon")]
        if not all(isinstance(v, int) and v >= 0 for v in stamps):
            raise ValueError("bad timestamps")
        flushed, live, seq = ints
        return _Manifest(
            files, m["schema"], flushed, live, seq, frozenset(history), stamps[0], stamps[1]
        )
    except (ValueError, KeyError, TypeError) as e:
        raise Corruption(f"row store manifest {path}: {type(e).__name__}: {e}") from None
