"""An in-memory `FileSystem` that can lose power: the simulated disk of the deterministic tests.

Theory of operation
-------------------
Two namespaces and two copies of every file are kept:

* the *volatile* view is what a running process sees: the page cache and the in-memory
  directory entries. Every read and write uses it.
* the *durable* view is what would be found on the platter after a power cut. A file's bytes move
  from volatile to durable on `sync()`; a directory's entries move on `fsync_dir(directory)`.

Files are inodes: a path maps to an inode object, so a rename moves the inode, an unlinked file
keeps working through its open handles, and the durable namespace can still name an old inode
after the volatile one was replaced (an un-fsynced rename over an existing file).

`crash(rng)` replaces the volatile view by the durable one, except that each file keeps a random
prefix of its unsynced writes: the result is `volatile[:k] + durable[k:]` for a random `k` between
the first byte where the two differ and the end of the volatile content. That models a disk that
writes pages in order and stops anywhere, including in the middle of a record (a torn write). An
unsynced shrink (truncate) reaches the disk with probability one half. Entries created, renamed or
removed since the last `fsync_dir` of their directory revert. Open handles become invalid.
Real disks may also reorder sector writes; this model does not, which matches what the WAL relies
on (a torn tail, then zeros or end of file).

Directories: `makedirs` is durable on return (as in `RealFileSystem`); `rename` handles files only.

Fault injection: `fail_next_sync` makes a chosen future sync fail with EIO (the data stays
volatile, as after a real failed fsync); `corrupt` overwrites bytes in place, durable and volatile
alike (bit rot, or a bad sector, that every later read sees).

Everything is deterministic: no global random, no clock; iteration is in sorted path order, and
the only randomness is the `random.Random` passed to `crash`.
"""

from __future__ import annotations

import errno
import posixpath
import random
import sys
from dataclasses import dataclass
from typing import TypeAlias

from service.consensus.fs import AppendFile

_CLEAN = sys.maxsize


class _Inode:
    """A file's content, volatile and durable.

    Each view is a materialized prefix plus a size; bytes between the two read as zeros, so
    preallocating a 64 MiB segment costs nothing. Invariant: the durable and volatile views agree
    below `dirty_lo` (the lowest offset changed since the last sync), which makes a sync cost
    the bytes written since the previous one, not the file size.
    """

    __slots__ = ("data", "dirty_lo", "durable", "durable_size", "size")

    def __init__(self, data: bytes | bytearray = b"", size: int | None = None) -> None:
        self.data = bytearray(data)  # the volatile view every read and write sees
        self.size = len(data) if size is None else size
        self.durable = bytearray(data)  # what survives a crash if nothing else does
        self.durable_size = self.size
        self.dirty_lo = _CLEAN

    @property
    def clean(self) -> bool:
        return self.dirty_lo == _CLEAN and self.size == self.durable_size

    def read(self) -> bytes:
        return bytes(self.data) + bytes(self.size - len(self.data))

    def read_durable(self) -> bytes:
        return bytes(self.durable) + bytes(self.durable_size - len(self.durable))

    def write(self, pos: int, b: bytes) -> None:
        d = self.data
        if pos > len(d):
            self.dirty_lo = min(self.dirty_lo, len(d))
            d.extend(bytes(pos - len(d)))  # materialize the zeros up to the write
        else:
            self.dirty_lo = min(self.dirty_lo, pos)
        d[pos : pos + len(b)] = b
        self.size = max(self.size, len(d))

    def truncate(self, size: int) -> None:
        if size < len(self.data):
            del self.data[size:]
            self.dirty_lo = min(self.dirty_lo, size)
        self.size = size

    def preallocate(self, size: int) -> None:
        self.size = max(self.size, size)

    def sync(self) -> None:
        if self.dirty_lo != _CLEAN:
            lo = min(self.dirty_lo, len(self.durable))
            self.durable[lo:] = self.data[lo:]
        self.durable_size = self.size
        self.dirty_lo = _CLEAN

    def overwrite_both(self, offset: int, b: bytes) -> None:
        """Bit rot: the same bytes change in the durable and (where it reaches) volatile view."""
        end = offset + len(b)
        if len(self.durable) < end:
            self.durable.extend(bytes(end - len(self.durable)))
        self.durable[offset:end] = b
        if offset < self.size:
            vend = min(end, self.size)
            if len(self.data) < vend:
                self.data.extend(bytes(vend - len(self.data)))
            self.data[offset:vend] = b[: vend - offset]

    def torn(self, rng: random.Random) -> _Inode:
        """The file after a power cut: `volatile[:k] + durable[k:]` for a random k."""
        if self.clean:
            return _Inode(self.durable, self.durable_size)
        data, durable = self.data, self.durable
        lo = min(self.dirty_lo, len(data), len(durable))
        k = rng.randint(_first_diff(data, self.size, durable, self.durable_size, lo), self.size)
        m = min(k, len(data))
        out = bytearray(data[:m])
        if len(durable) > m:
            out.extend(bytes(max(0, min(k, len(durable)) - m)))  # volatile zeros up to k
            out.extend(durable[k:])
        size = max(k, self.durable_size)
        if self.size < self.durable_size and rng.random() < 0.5:
            del out[self.size :]  # the unsynced truncate did reach the disk
            size = self.size
        return _Inode(out, size)


class _Dir:
    """Marker for a directory entry (directories hold no data here)."""

    __slots__ = ()


_DIR = _Dir()
_Node: TypeAlias = _Inode | _Dir
_ROOTS = frozenset({"/", "."})


@dataclass
class _SyncFault:
    substring: str | None
    skip: int


def _norm(path: str) -> str:
    return posixpath.normpath(path)


def _parent(path: str) -> str:
    return posixpath.dirname(path) or "."


_BLOCK = 4096


def _first_diff(a: bytearray, a_size: int, b: bytearray, b_size: int, lo: int) -> int:
    """First offset >= lo where the views (a zero-padded to a_size, b to b_size) differ.

    Only the first min(a_size, b_size) bytes are compared; equal that far, that is the answer.
    Compares in blocks so multi-megabyte files stay cheap.
    """
    limit = min(a_size, b_size)
    both = min(len(a), len(b))
    i = lo
    while i < both and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    if i < both:
        end = min(i + _BLOCK, both)
        while i < end and a[i] == b[i]:
            i += 1
        if i < end:
            return i
    # Past the shorter materialized prefix, the other side reads as zeros.
    i = both
    longer = a if len(a) > len(b) else b
    end = min(len(longer), limit)
    while i < end:
        block = longer[i : min(i + _BLOCK, end)]
        if block.count(0) != len(block):
            return i + len(block) - len(block.lstrip(b"\0"))
        i += _BLOCK
    return limit


class SimAppendFile:
    """An open handle on a simulated file; it dies with the "process" at `crash`."""

    __slots__ = ("_closed", "_fs", "_generation", "_inode", "_path", "_pos")

    def __init__(self, fs: SimFileSystem, path: str, inode: _Inode, position: int) -> None:
        self._fs = fs
        self._path = path
        self._inode = inode
        self._pos = position
        self._generation = fs.generation
        self._closed = False

    @property
    def path(self) -> str:
        return self._path

    def _check(self) -> None:
        if self._closed or self._generation != self._fs.generation:
            raise OSError(
                errno.EBADF, "bad file descriptor (closed or lost in a crash)", self._path
            )

    def write(self, data: bytes) -> None:
        self._check()
        self._inode.write(self._pos, data)
        self._pos += len(data)
        self._fs.bytes_written += len(data)

    def sync(self) -> None:
        self._check()
        self._fs._maybe_fail_sync(self._path)
        self._inode.sync()
        self._fs.syncs += 1

    def truncate(self, size: int) -> None:
        self._check()
        self._inode.truncate(size)
        self._pos = min(self._pos, size)

    def preallocate(self, size: int) -> None:
        self._check()
        self._inode.preallocate(size)

    def tell(self) -> int:
        self._check()
        return self._pos

    def close(self) -> None:
        self._closed = True


class SimFileSystem:
    """A `FileSystem` in memory with durable/volatile state, crashes and injected faults."""

    def __init__(self) -> None:
        self._ns: dict[str, _Node] = {}  # the volatile namespace: what the process sees
        self._durable_ns: dict[str, _Node] = {}  # what a crash leaves behind
        self._sync_faults: list[_SyncFault] = []
        self.generation = 0
        """Bumped by every crash; handles from an older generation are dead."""
        self.syncs = 0
        """File syncs that succeeded (directory fsyncs not included)."""
        self.dir_syncs = 0
        self.bytes_written = 0

    # --- FileSystem ----------------------------------------------------------------------------

    def open_append(self, path: str, *, position: int | None = None) -> AppendFile:
        p = _norm(path)
        node = self._ns.get(p)
        if isinstance(node, _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if node is None:
            self._require_dir(_parent(p), path)
            node = _Inode()
            self._ns[p] = node
        size = node.size
        if position is not None and not 0 <= position <= size:
            raise ValueError(f"{path}: position {position} outside file of {size} bytes")
        return SimAppendFile(self, p, node, size if position is None else position)

    def read_bytes(self, path: str) -> bytes:
        return self._file(path).read()

    def write_atomic(self, path: str, data: bytes) -> None:
        p = _norm(path)
        tmp = p + ".tmp"
        self._require_dir(_parent(p), path)
        inode = _Inode()
        inode.write(0, data)  # written, not yet durable
        self._ns[tmp] = inode
        try:
            self._maybe_fail_sync(tmp)
        except OSError:
            del self._ns[tmp]  # as RealFileSystem: the temporary file is cleaned up
            raise
        inode.sync()
        self.syncs += 1
        self._ns[p] = self._ns.pop(tmp)
        self.fsync_dir(_parent(p))

    def listdir(self, directory: str) -> list[str]:
        d = _norm(directory)
        if d not in _ROOTS and not isinstance(self._ns.get(d), _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such directory", directory)
        return sorted(posixpath.basename(p) for p in self._ns if _parent(p) == d)

    def exists(self, path: str) -> bool:
        p = _norm(path)
        return p in _ROOTS or p in self._ns

    def remove(self, path: str) -> None:
        p = _norm(path)
        self._file(path)
        del self._ns[p]

    def rename(self, src: str, dst: str) -> None:
        s, d = _norm(src), _norm(dst)
        self._file(src)
        if isinstance(self._ns.get(d), _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", dst)
        self._require_dir(_parent(d), dst)
        self._ns[d] = self._ns.pop(s)

    def makedirs(self, directory: str) -> None:
        d = _norm(directory)
        chain: list[str] = []
        while d not in _ROOTS:
            chain.append(d)
            d = _parent(d)
        for p in reversed(chain):
            node = self._ns.get(p)
            if isinstance(node, _Inode):
                raise FileExistsError(errno.EEXIST, "a file is in the way", p)
            if node is None:
                # Durable at once: RealFileSystem.makedirs fsyncs each new directory's parent.
                self._ns[p] = _DIR
                self._durable_ns[p] = _DIR

    def fsync_dir(self, directory: str) -> None:
        d = _norm(directory)
        if d not in _ROOTS and not isinstance(self._ns.get(d), _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such directory", directory)
        self._maybe_fail_sync(d)
        for p in [p for p in self._durable_ns if _parent(p) == d]:
            if p not in self._ns:
                del self._durable_ns[p]
        for p, node in self._ns.items():
            if _parent(p) == d:
                self._durable_ns[p] = node
        self.dir_syncs += 1

    # --- crashes and faults --------------------------------------------------------------------

    def crash(self, rng: random.Random) -> None:
        """Power loss: keep durable state plus a random prefix of unsynced writes (module doc)."""
        self.generation += 1
        self._sync_faults.clear()  # pending faults belonged to the dead process
        survivors: dict[str, _Node] = {}
        torn: dict[int, _Inode] = {}  # old inode id -> its post-crash replacement
        for p in sorted(self._durable_ns):
            # A file whose directory vanished vanishes with it (not reachable here, as
            # directories are durable on creation, but cheap to keep honest).
            if _parent(p) not in _ROOTS and not isinstance(self._durable_ns.get(_parent(p)), _Dir):
                continue
            node = self._durable_ns[p]
            if isinstance(node, _Inode):
                replacement = torn.get(id(node))
                if replacement is None:
                    replacement = node.torn(rng)
                    torn[id(node)] = replacement
                node = replacement
            survivors[p] = node
        self._ns = dict(survivors)
        self._durable_ns = dict(survivors)

    def fail_next_sync(self, path_substring: str | None = None, *, skip: int = 0) -> None:
        """Make a future sync whose path contains `path_substring` (any, if None) raise EIO.

        `skip` lets that many matching syncs succeed first. Covers file syncs, directory
        fsyncs and the fsync inside `write_atomic` (whose temporary file is `path + ".tmp"`).
        A failed sync leaves the data volatile.
        """
        self._sync_faults.append(_SyncFault(path_substring, skip))

    def _maybe_fail_sync(self, path: str) -> None:
        for i, fault in enumerate(self._sync_faults):
            if fault.substring is not None and fault.substring not in path:
                continue
            if fault.skip > 0:
                fault.skip -= 1
                continue
            del self._sync_faults[i]
            raise OSError(errno.EIO, "injected I/O error on sync", path)

    def corrupt(self, path: str, offset: int, data: bytes) -> None:
        """Overwrite bytes at `offset` in both the durable and the volatile content."""
        inode = self._file(path)
        end = offset + len(data)
        if offset < 0 or end > inode.durable_size:
            raise ValueError(
                f"{path}: corrupt range [{offset}, {end}) outside the durable "
                f"{inode.durable_size} bytes"
            )
        inode.overwrite_both(offset, data)

    # --- inspection for tests ------------------------------------------------------------------

    def durable_bytes(self, path: str) -> bytes:
        """The synced content of the file the volatile namespace names `path`."""
        return self._file(path).read_durable()

    def files(self) -> list[str]:
        """Every file path (not directory) in the volatile namespace, sorted."""
        return sorted(p for p, n in self._ns.items() if isinstance(n, _Inode))

    # --- helpers -------------------------------------------------------------------------------

    def _file(self, path: str) -> _Inode:
        node = self._ns.get(_norm(path))
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        if isinstance(node, _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return node

    def _require_dir(self, directory: str, for_path: str) -> None:
        if directory not in _ROOTS and not isinstance(self._ns.get(directory), _Dir):
            raise FileNotFoundError(errno.ENOENT, "parent directory missing", for_path)
