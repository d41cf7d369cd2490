"""Consensus metadata (Kudu's "cmeta"): term, vote, membership and addresses of one Raft group.

Theory of operation
-------------------
The WAL already persists term and vote in its hard-state records, but the WAL can be replaced
wholesale by a tablet copy, and a tombstoned replica keeps no WAL at all. So a node keeps a small
separate file that outlives both: the current term and vote (so a node never votes twice in a term,
even after its data was deleted or copied over), the committed membership with peer addresses, and
the node's own uuid, which lets a restarted node notice that its disk was wiped or belongs to
another server (docs/design/consensus.md#R8, #R9).

The file is rewritten whole with `FileSystem.write_atomic` (temporary file, fsync, rename,
directory fsync), so after a crash it holds the old or the new record, never a mix. The format is
JSON for inspectability::

    {"format_version": 1, "crc32c": <crc of body_json>, "body": {...}}

where the CRC covers the canonical encoding of `body` (sorted keys, no spaces). A CRC mismatch,
unparsable JSON or an unknown version raises `CmetaCorruption` naming the file. An OSError from
saving propagates: the caller must not send a reply that depends on an unsaved term or vote.

`merge_remote` implements the consensus metadata merge of tablet copy
(docs/design/tablet_copy.md#R5).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import google_crc32c

from service.common.errors import Corruption
from service.consensus.fs import FileSystem
from service.raft.types import NO_NODE, NodeId, RaftConfig

CMETA_FORMAT_VERSION = 1


class CmetaCorruption(Corruption):
    """The consensus metadata file is damaged or of an unknown format; the node must stop."""


@dataclass(frozen=True, slots=True)
class ConsensusMetadata:
    term: int
    vote: NodeId
    """Whom this node voted for in `term`; NO_NODE if nobody."""
    config: RaftConfig
    addresses: Mapping[str, str]
    """Peer uuid -> "host:port". Stored as a read-only copy."""
    uuid: str
    """This node's own permanent uuid."""

    def __post_init__(self) -> None:
        if self.term < 0:
            raise ValueError(f"negative term {self.term}")
        if not self.uuid:
            raise ValueError("consensus metadata needs the node's uuid")
        # A private read-only copy: a caller mutating its dict must not change a frozen value.
        object.__setattr__(self, "addresses", MappingProxyType(dict(self.addresses)))


def _body(meta: ConsensusMetadata) -> dict[str, Any]:
    return {
        "term": meta.term,
        "vote": meta.vote,
        "uuid": meta.uuid,
        "config": {
            "voters": sorted(meta.config.voters),
            "learners": sorted(meta.config.learners),
            "index": meta.config.index,
        },
        "addresses": dict(sorted(meta.addresses.items())),
    }


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode(meta: ConsensusMetadata) -> bytes:
    body = _body(meta)
    doc = {
        "format_version": CMETA_FORMAT_VERSION,
        "crc32c": google_crc32c.value(_canonical(body)),
        "body": body,
    }
    return json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n"


def decode(data: bytes, path: str) -> ConsensusMetadata:
    """Parse and verify a cmeta file's bytes; `path` is only for error messages."""
    try:
        doc = json.loads(data)
    except ValueError as e:  # includes UnicodeDecodeError
        raise CmetaCorruption(f"{path}: consensus metadata is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format_version") != CMETA_FORMAT_VERSION:
        version = doc.get("format_version") if isinstance(doc, dict) else None
        raise CmetaCorruption(f"{path}: unknown consensus metadata format version {version!r}")
    body: Any = doc.get("body")
    crc = google_crc32c.value(_canonical(body))
    if doc.get("crc32c") != crc:
        raise CmetaCorruption(
            f"{path}: consensus metadata CRC mismatch (stored {doc.get('crc32c')!r}, "
            f"computed {crc})"
        )
    try:
        cfg = body["config"]
        return ConsensusMetadata(
            term=int(body["term"]),
            vote=NodeId(str(body["vote"])),
            config=RaftConfig(
                voters=frozenset(NodeId(v) for v in cfg["voters"]),
                learners=frozenset(NodeId(v) for v in cfg["learners"]),
                index=int(cfg["index"]),
            ),
            addresses={str(k): str(v) for k, v in body["addresses"].items()},
            uuid=str(body["uuid"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        # The CRC matched, so the writer produced this: a bug or a foreign file, still fatal.
        raise CmetaCorruption(f"{path}: malformed consensus metadata: {e!r}") from e


class CmetaStore:
    """Loads and durably saves one group's consensus metadata file at `path`.

    The directory holding `path` must exist (the caller creates it with `fs.makedirs`).
    """

    def __init__(self, fs: FileSystem, path: str) -> None:
        self._fs = fs
        self.path = path

    def load(self) -> ConsensusMetadata | None:
        """The saved metadata, or None if none was ever saved."""
        if not self._fs.exists(self.path):
            return None
        return decode(self._fs.read_bytes(self.path), self.path)

    def save(self, meta: ConsensusMetadata) -> None:
        """Replace the file atomically and durably; returns only once it is on disk."""
        self._fs.write_atomic(self.path, encode(meta))


def merge_remote(
    local: ConsensusMetadata | None, remote: ConsensusMetadata, *, uuid: str | None = None
) -> ConsensusMetadata:
    """Merge a tablet copy source's metadata into ours (docs/design/tablet_copy.md#R5).

    1. Adopt the highest term: a term never goes backwards, or we could vote twice in it.
    2. If remote term <= local term, keep the local vote for the local term. If the remote term
       is higher, we never voted in it: the vote is NO_NODE. The remote's vote is the *remote's*
       and is never adopted (Kudu's MergeCommittedConsensusStatePB does the same).
    3. Always adopt the remote's config, and its addresses with it: the copied data and log
       match that membership, not ours.
    4. Keep our own uuid. With no local metadata, `uuid` must name this node.
    """
    if local is None:
        if not uuid:
            raise ValueError("merging into empty consensus metadata needs this node's uuid")
        return ConsensusMetadata(
            term=remote.term,
            vote=NO_NODE,
            config=remote.config,
            addresses=remote.addresses,
            uuid=uuid,
        )
    if uuid is not None and uuid != local.uuid:
        raise ValueError(f"uuid {uuid!r} does not match local consensus metadata {local.uuid!r}")
    if remote.term > local.term:
        term, vote = remote.term, NO_NODE
    else:
        term, vote = local.term, local.vote
    return ConsensusMetadata(
        term=term, vote=vote, config=remote.config, addresses=remote.addresses, uuid=local.uuid
    )
