"""A tablet replica's superblock: what the replica is and the state of its data.

See docs/design/tablet_copy.md#R1 (data states) and #R2 (the startup state machine).

Theory of operation
-------------------
Each replica directory `<data_dir>/tablets/<tablet_id>/` holds:

  superblock   this file: identity (tablet, table, partition), data state, the last logged op id
               at tombstoning, the quarantine path of a delete under way
  raft/        the replica's RaftStore (WAL segments, consensus metadata, snapshot)
  data/        the RowStore (manifest and columnar files)

The data state is the commit point of every life-cycle step, so the startup state machine
(docs/design/tablet_copy.md#R2) can finish or undo whatever a crash interrupted:

  * create: the directories are made first and the superblock (READY) written LAST; a directory
    without a superblock is a create that never finished, deleted at startup;
  * copy: COPYING is written FIRST and READY last; COPYING at startup means a half-done copy:
    its data and WAL are deleted and the replica becomes TOMBSTONED (its consensus metadata is
    kept: it may have voted in a term the copy source had not seen);
  * delete: the new state (DELETED or TOMBSTONED) and the quarantine path are written FIRST,
    then the data is moved to quarantine and removed; DELETED/TOMBSTONED at startup with data
    still present rolls the delete forward.

A TOMBSTONED replica keeps `raft/cmeta` forever (term and vote): a replica re-created here by
a later tablet copy merges it, so it can never vote twice in one term from amnesia.

The file is JSON with a CRC32C, replaced atomically (write temp, fsync, rename, fsync dir).
"""

from __future__ import annotations

import enum
import json
import os
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import google_crc32c

from service.common.errors import Corruption
from service.common.private_files import write_private_file

_HEADER = struct.Struct("<4sI")  # magic, crc32c(body)
_MAGIC = b"TSBK"
FILE_NAME = "superblock"


class DataState(enum.Enum):
    """Values match tserver.proto's TabletDataStatePB."""

    READY = 1
    COPYING = 2
    DELETED = 3
    TOMBSTONED = 4


@dataclass(frozen=True)
class Superblock:
    tablet_id: str
    table_id: str
    table_name: str
    partition_pb: bytes
    """tessera.common.PartitionPB, serialized (the replica does not interpret it)."""
    partition_schema_pb: bytes
    data_state: DataState = DataState.READY
    tombstone_last_index: int = 0
    """Last index in the WAL when the replica was tombstoned (its log is gone after that)."""
    tombstone_last_term: int = 0
    quarantine_path: str = ""
    """Where the data of a delete under way is moved before it is removed ("" none)."""
    copy_source: str = ""
    """uuid of the peer a COPYING replica copies from."""

    def with_state(self, state: DataState, **changes: object) -> Superblock:
        return replace(self, data_state=state, **changes)  # type: ignore[arg-type]

    def encode(self) -> bytes:
        d = asdict(self)
        d["data_state"] = self.data_state.name
        d["partition_pb"] = self.partition_pb.hex()
        d["partition_schema_pb"] = self.partition_schema_pb.hex()
        body = json.dumps(d, sort_keys=True).encode()
        return _HEADER.pack(_MAGIC, google_crc32c.value(body)) + body

    @staticmethod
    def decode(data: bytes, what: str = "superblock") -> Superblock:
        if len(data) < _HEADER.size:
            raise Corruption(f"{what}: {len(data)} bytes, shorter than its header")
        magic, crc = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        if magic != _MAGIC or google_crc32c.value(body) != crc:
            raise Corruption(f"{what}: bad magic or checksum")
        try:
            d = json.loads(body)
            d["data_state"] = DataState[d["data_state"]]
            d["partition_pb"] = bytes.fromhex(d["partition_pb"])
            d["partition_schema_pb"] = bytes.fromhex(d["partition_schema_pb"])
            return Superblock(**d)
        except (ValueError, KeyError, TypeError) as e:
            raise Corruption(f"{what}: undecodable: {e}") from None


def path_of(tablet_dir: Path) -> Path:
    return tablet_dir / FILE_NAME


def load(tablet_dir: Path) -> Superblock | None:
    """The replica's superblock, None when the directory has none (an unfinished create)."""
    p = path_of(tablet_dir)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    return Superblock.decode(data, str(p))


def save(tablet_dir: Path, sb: Superblock) -> None:
    """Replace the superblock atomically and durably."""
    write_private_file(path_of(tablet_dir), sb.encode())
    fsync_dir(tablet_dir)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
