"""The file-system seam: every byte the WAL and consensus metadata put on disk goes through here.

Theory of operation
-------------------
Durability code is only as good as the crashes it was tested against, and a real disk does not
crash on demand. So the WAL (`wal.py`) and consensus metadata (`cmeta.py`) never call `os`
directly: they take a `FileSystem`. `RealFileSystem` maps it onto POSIX calls;
`service.testing.simdisk.SimFileSystem` keeps files in memory, tracks which bytes and which
directory entries are durable, and can lose the rest in a simulated power cut. The same WAL code
runs on both, which is what makes the crash tests meaningful.

The protocol is deliberately small and spells out the durability contract of each call:

* File *contents* become durable only through `AppendFile.sync()` (fdatasync) or `write_atomic`.
* Directory *entries* (create, rename, remove) become durable only through `fsync_dir(parent)`.
  `write_atomic` and `makedirs` do that themselves; everything else leaves it to the caller.
* An error from fsync/fdatasync propagates and is never retried: after a failed fsync Linux may
  already have dropped the dirty pages and marked them clean, so a retry can "succeed" without the
  data ever reaching the disk ("fsyncgate", PostgreSQL 2018). The caller must treat it as fatal.

Preallocation design
--------------------
`AppendFile.preallocate(size)` reserves blocks *and* extends the file to `size` bytes
(posix_fallocate without FALLOC_FL_KEEP_SIZE; the new range reads as zeros). Consequently the file
size is not the end of the data: the writer keeps its own logical position (`tell()`), writes with
pwrite at that position, and readers of a preallocated file must find the end themselves. The WAL
does: a zero length field ends the log. We chose this over KEEP_SIZE because appending within the
file size does not change i_size, so fdatasync need not commit a size update on every batch (the
reason Kudu preallocates segments, docs/design/consensus.md#R5). On ext4 and xfs the first write
into a preallocated (unwritten) extent still costs an extent-conversion commit, so the gain is
modest; `bench/wal_fsync.py` measures both ways. Where fallocate is unsupported we fall back to
ftruncate, which gives the same zero-read semantics with a sparse file.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Protocol


class AppendFile(Protocol):
    """A file opened for sequential writing at a logical position (see module docstring)."""

    @property
    def path(self) -> str: ...

    def write(self, data: bytes) -> None:
        """Write all of `data` at the current position and advance it. Not durable until sync."""
        ...

    def sync(self) -> None:
        """fdatasync: make every byte written so far (and the file size) durable."""
        ...

    def truncate(self, size: int) -> None:
        """Set the file size to `size`; the position moves back to `size` if it was beyond."""
        ...

    def preallocate(self, size: int) -> None:
        """Reserve space and extend the file (zero-filled) to at least `size` bytes.

        The logical position does not move.
        """
        ...

    def tell(self) -> int:
        """The logical position: where the next write lands."""
        ...

    def close(self) -> None: ...


class FileSystem(Protocol):
    """All disk access of the WAL and consensus metadata. Paths are plain strings."""

    def open_append(self, path: str, *, position: int | None = None) -> AppendFile:
        """Open (creating if missing) for writing at `position`, default the end of the file.

        Creating a file is a directory operation: durable only after `fsync_dir(parent)`.
        """
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace `path` durably and atomically: after a crash it holds old or new, never a mix.

        Write a temporary file, fsync it, rename it over `path`, fsync the directory.
        """
        ...

    def listdir(self, directory: str) -> list[str]:
        """Names (not paths) in `directory`, sorted."""
        ...

    def exists(self, path: str) -> bool: ...

    def remove(self, path: str) -> None:
        """Unlink a file. Durable only after `fsync_dir(parent)`."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Rename, atomically replacing `dst`. Durable only after `fsync_dir(parent)`."""
        ...

    def makedirs(self, directory: str) -> None:
        """Create `directory` and missing parents; durable on return (parents are fsynced)."""
        ...

    def fsync_dir(self, directory: str) -> None:
        """Make the creates, renames and removes of entries in `directory` durable."""
        ...


class RealAppendFile:
    """`AppendFile` on a POSIX file descriptor, writing with pwrite at a logical position."""

    __slots__ = ("_fd", "_path", "_pos")

    def __init__(self, path: str, position: int | None) -> None:
        self._path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(self._fd).st_size
            if position is not None and not 0 <= position <= size:
                raise ValueError(f"{path}: position {position} outside file of {size} bytes")
            self._pos = size if position is None else position
        except BaseException:
            os.close(self._fd)
            raise

    @property
    def path(self) -> str:
        return self._path

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            # pwrite may write less than asked (signals, quotas); loop until all of it is down.
            n = os.pwrite(self._fd, view, self._pos)
            self._pos += n
            view = view[n:]

    def sync(self) -> None:
        # Never retried on error: see "fsyncgate" in the module docstring.
        os.fdatasync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._pos = min(self._pos, size)

    def preallocate(self, size: int) -> None:
        try:
            os.posix_fallocate(self._fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            # No fallocate on this file system: a sparse extension reads as zeros too.
            if os.fstat(self._fd).st_size < size:
                os.ftruncate(self._fd, size)

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class RealFileSystem:
    """`FileSystem` on the local disk through `os` calls."""

    def open_append(self, path: str, *, position: int | None = None) -> AppendFile:
        return RealAppendFile(path, position)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _remove_quietly(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")

    def listdir(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def remove(self, path: str) -> None:
        os.remove(path)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def makedirs(self, directory: str) -> None:
        missing: list[str] = []
        d = os.path.abspath(directory)
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
            # A new directory's own entry lives in its parent: fsync the parent to keep it.
            self.fsync_dir(os.path.dirname(d))

    def fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
