"""Poison already in a log: a committed write entry no replica can apply, planted straight into
one stopped replica's WAL.

Writes are validated before they are replicated (row_ops.py), so no client can get such an
entry into a log any more; one written by an older version that validated less, or by a bug,
can still be there. The tests plant one with the WAL's own API, bypassing every check, to show
what its replay does: it fails that replica (FAILED, tablet.py) and nothing else.

The entry is the tablet's own write entry format (`tablet.write_entry`) for {key, value} with
the second string's offset pointing far outside its buffer (`hostile_arrow.WILD_OFFSETS`): the
bytes that read wild memory in native code if anything touched them unvalidated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from service.common.schema import Schema
from service.consensus.fs import RealFileSystem
from service.consensus.wal import Wal
from service.raft.types import Entry, HardState
from service.testing.hostile_arrow import TWO_STRING_OFFSETS, WILD_OFFSETS, patch_last
from service.tserver.row_ops import RowOp, WriteBatch
from service.tserver.tablet import write_entry

__all__ = ["plant_committed_entry", "poison_write_entry"]


def poison_write_entry(schema: Schema, key: str, value: str) -> bytes:
    """A write entry (UPSERT of two rows) of `schema`, whose INT64 column `key` and STRING
    column `value` frame correctly but whose `value` offsets lie."""
    table = pa.table(
        {
            key: pa.array([1, 2], schema.column(key).arrow_type()),
            value: pa.array(["ab", "cd"], schema.column(value).arrow_type()),
        }
    )
    batch = WriteBatch(
        table,
        np.full(2, int(RowOp.UPSERT), dtype=np.uint8),
        schema.version,
        (schema.column(key).id, schema.column(value).id),
    )
    return patch_last(write_entry(batch), TWO_STRING_OFFSETS, WILD_OFFSETS)


def plant_committed_entry(tablet_dir: Path, data: bytes) -> int:
    """Append `data` as the next entry of the replica's WAL in `tablet_dir` (its server must be
    stopped), in the term of the log's last entry, and mark it committed; its index.

    Committed, the entry is applied by the replay when the server starts, before the replica
    hears from any peer. The other replicas never see it (their logs are not touched): pick a
    follower of a tablet that takes no more writes meanwhile, so that the leader never sends
    this replica another entry at that index."""
    wal, contents = Wal.open(RealFileSystem(), str(tablet_dir / "raft" / "wal"), preallocate=False)
    try:
        if not contents.entries:
            raise ValueError(f"{tablet_dir}: the WAL holds no entry to follow")
        last = contents.entries[-1]
        entry = Entry(last.term, last.index + 1, data=data)
        hs = contents.hard_state
        wal.append([entry], HardState(hs.term, hs.vote, entry.index))
        wal.sync()
    finally:
        wal.close()
    return entry.index
