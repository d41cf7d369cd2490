"""Read a plain local Delta table without Spark: its latest version and the Parquet files of a
version, from the transaction log.

Why: an audit snapshot (audit.py) asks a dozen small questions of its Delta tables ("which
version is the newest?", "what rows does it hold?"). Each asked through Spark is a job of half
a second to several seconds on a busy two-core machine, and they added up to most of a
snapshot's time. The log answers them in milliseconds when the table is simple enough.

Only the simple case is read here, by the public protocol
(https://github.com/delta-io/delta/blob/master/PROTOCOL.md): a table on the local file system
whose protocol needs reader version 1 (so no deletion vectors and no column mapping), with no
partition columns, and a log made of JSON commits and classic checkpoints (one Parquet file, or
a multi-part one). Anything else (a v2 checkpoint, a missing commit, an action not understood)
gives None, and the caller asks Spark instead. Nothing here writes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["LocalCommit", "LocalSnapshot", "commit", "latest_version", "local_dir", "snapshot"]

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


@dataclass(frozen=True)
class LocalSnapshot:
    """One version of a plain local Delta table: its data files, absolute paths."""

    version: int
    files: tuple[str, ...]


@dataclass(frozen=True)
class LocalCommit:
    """One commit of a local Delta table: its commitInfo action (operation, operationMetrics,
    userMetadata, ...) and the data files it added, absolute paths."""

    version: int
    info: dict[str, Any]
    added: tuple[str, ...]


class _NotPlain(Exception):
    """The table or its log is not the simple case this module reads."""


def local_dir(location: str) -> Path | None:
    """The directory of a table location (a path, or a file: URI), None when it is not on this
    machine's file system."""
    if "://" in location or location.startswith("file:"):
        u = urlparse(location)
        if u.scheme != "file":
            return None
        return Path(unquote(u.path))
    return Path(location)


def _listing(table: Path) -> tuple[dict[int, Path], dict[int, list[Path]]]:
    """(commits by version, complete classic checkpoints by version) in `table`'s log."""
    log = table / "_delta_log"
    commits: dict[int, Path] = {}
    parts: dict[int, dict[int, Path]] = {}
    totals: dict[int, int] = {}
    for p in log.iterdir():
        if m := _COMMIT.match(p.name):
            commits[int(m.group(1))] = p
        elif m := _CHECKPOINT.match(p.name):
            v = int(m.group(1))
            part, total = (int(m.group(2)), int(m.group(3))) if m.group(2) else (1, 1)
            if totals.setdefault(v, total) != total:
                continue  # two multi-part checkpoints of one version: take neither blindly
            parts.setdefault(v, {})[part] = p
    checkpoints = {
        v: [ps[i] for i in sorted(ps)]
        for v, ps in parts.items()
        if sorted(ps) == list(range(1, totals[v] + 1))
    }
    return commits, checkpoints


def latest_version(table: Path) -> int | None:
    """The newest committed version of the Delta table in `table`, None if it has no log."""
    try:
        commits, checkpoints = _listing(table)
    except OSError:
        return None
    versions = list(commits) + list(checkpoints)
    return max(versions) if versions else None


def snapshot(table: Path, version: int | None = None) -> LocalSnapshot | None:
    """Version `version` (default: the latest) of the Delta table in `table`, if it is the
    simple case (module docstring), else None."""
    try:
        return _snapshot(table, version)
    except (_NotPlain, OSError, ValueError, KeyError, TypeError):
        return None


def _snapshot(table: Path, version: int | None) -> LocalSnapshot | None:
    commits, checkpoints = _listing(table)
    if version is None:
        version = max([*commits, *checkpoints], default=-1)
    if version < 0:
        return None
    base = max((v for v in checkpoints if v <= version), default=-1)
    needed = range(base + 1, version + 1)
    if any(v not in commits for v in needed):
        return None  # cleaned up, or not written yet
    state = _State()
    if base >= 0:
        state.checkpoint(checkpoints[base])
    for v in needed:
        with commits[v].open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    state.action(json.loads(line))
    state.check()
    files = tuple(str(_resolve(table, p)) for p in sorted(state.files))
    return LocalSnapshot(version, files)


def commit(table: Path, version: int | None = None) -> LocalCommit | None:
    """Commit `version` (default: the latest) of the Delta table in `table`, read from its JSON
    commit file; None when that file is gone (a checkpoint replaced it and the log was cleaned)
    or is not understood. A backup (jobs/backup.py) asks this of the commit it just wrote:
    through Spark, `DESCRIBE HISTORY` and a count of the rows it added were two jobs and 3.4 s
    of a 6.9 s incremental backup."""
    try:
        commits, checkpoints = _listing(table)
        if version is None:
            version = max([*commits, *checkpoints], default=-1)
        path = commits.get(version)
        if path is None:
            return None
        info: dict[str, Any] = {}
        added: list[str] = []
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                action = json.loads(line)
                if "commitInfo" in action:
                    info = dict(action["commitInfo"])
                elif "add" in action:
                    if action["add"].get("deletionVector") or action["add"].get("partitionValues"):
                        return None
                    added.append(str(_resolve(table, action["add"]["path"])))
        return LocalCommit(version, info, tuple(added))
    except (_NotPlain, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _resolve(table: Path, path: str) -> Path:
    if "://" in path or path.startswith("file:"):
        local = local_dir(path)
        if local is None:
            raise _NotPlain(path)
        return local
    return table / unquote(path)


class _State:
    """The log replayed so far: live files, protocol, metadata."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.reader_version: int | None = None
        self.partitioned = False

    def action(self, a: dict[str, Any]) -> None:
        if "add" in a:
            self._add(a["add"])
        elif "remove" in a:
            self.files.discard(a["remove"]["path"])
        elif "protocol" in a:
            self.reader_version = int(a["protocol"]["minReaderVersion"])
        elif "metaData" in a:
            self.partitioned = bool(a["metaData"].get("partitionColumns") or [])
        elif not ({"commitInfo", "txn", "cdc", "domainMetadata"} & a.keys()):
            raise _NotPlain(f"a log action not understood here: {sorted(a)}")

    def _add(self, add: dict[str, Any]) -> None:
        if add.get("deletionVector"):
            raise _NotPlain("deletion vectors")
        self.files.add(add["path"])

    def checkpoint(self, parts: list[Path]) -> None:
        import pyarrow.parquet as pq

        for part in parts:
            names = set(pq.read_schema(part).names)
            if "sidecar" in names or "checkpointMetadata" in names:
                raise _NotPlain("a v2 checkpoint")
            cols = [c for c in ("add", "protocol", "metaData") if c in names]
            for row in pq.read_table(part, columns=cols).to_pylist():
                if row.get("add"):
                    self._add(row["add"])
                if row.get("protocol"):
                    self.reader_version = int(row["protocol"]["minReaderVersion"])
                if row.get("metaData"):
                    self.partitioned = bool(row["metaData"].get("partitionColumns") or [])

    def check(self) -> None:
        if self.reader_version != 1:
            raise _NotPlain(f"reader version {self.reader_version}")
        if self.partitioned:
            raise _NotPlain("partition columns")
