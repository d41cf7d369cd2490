"""Owner-only files: what a server writes to disk is readable by its own user and no one else.

Theory of operation
-------------------
A master's data directory holds sys.catalog, and sys.catalog holds the cluster's root CA private
key and the token signing keys: anyone who can read one WAL segment, snapshot or consensus
metadata file can mint certificates and tokens. A tablet server's holds every row. So:

1. Every server process (and the `tessera` command, which creates local clusters) sets its
   umask to `OWNER_ONLY_UMASK` before it creates anything: new files are 0600, new
   directories 0700, whatever code creates them (`owner_only_umask`).
2. At start a server makes its data directory owner-only (`private_dir`): created 0700, or, if
   it exists with group or other permission bits, tightened to 0700 with a warning naming it.
   That alone closes every path below it.
3. Files that hold key material are checked, not fixed (`check_private_tree`): a server whose
   key-bearing file is readable by group or others refuses to start with an error naming the
   file and the command that fixes it. Fixing it silently would hide that the key may already
   have been read; the operator decides whether to rotate.

Ownership is not checked: a server running as another user than the files' owner could not
have created them 0600 and fails on its first read, with the OS's own error.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from service.common.errors import InvalidArgument

__all__ = [
    "OWNER_ONLY_UMASK",
    "check_owner_only",
    "check_private_tree",
    "owner_only_umask",
    "private_dir",
    "write_private_file",
]

log = logging.getLogger(__name__)

OWNER_ONLY_UMASK = 0o077
"""New files 0600 and directories 0700."""

_GROUP_OTHER = stat.S_IRWXG | stat.S_IRWXO


def owner_only_umask() -> int:
    """Set the process umask to `OWNER_ONLY_UMASK`; the previous one."""
    return os.umask(OWNER_ONLY_UMASK)


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) owner-only, or tighten an existing one to 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & _GROUP_OTHER:
        os.chmod(path, mode & ~_GROUP_OTHER | stat.S_IRWXU)
        log.warning(
            "data directory %s was accessible to group or others (mode %04o): made owner-only "
            "(0700)",
            path,
            mode,
        )
    return path


def write_private_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably (a fsynced temporary file renamed over
    it), owner-only from its creation: never readable by others, even for an instant. The
    caller fsyncs the directory when the rename itself must survive a crash."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def check_owner_only(path: Path, what: str) -> None:
    """Refuse (InvalidArgument, naming the file and the fix) a key file that group or others
    may access, or one that cannot be read."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as e:
        raise InvalidArgument(f"{path}: cannot read: {e.strerror}") from None
    if mode & _GROUP_OTHER:
        raise InvalidArgument(
            f"{path}: {what} is accessible to group or others (mode {mode:04o}); refusing to "
            f"use it. Fix with: chmod 600 {path}"
        )


def check_private_tree(root: Path, what: str) -> None:
    """Refuse (InvalidArgument) if any file or directory under `root` grants group or others
    any permission; `what` says what the files hold, for the message."""
    if not root.exists():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue  # removed while we walked (a WAL segment recycled): nothing to check
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode & _GROUP_OTHER:
                raise InvalidArgument(
                    f"{p} holds {what} and is accessible to group or others (mode {mode:04o}): "
                    f"refusing to start. Fix with: chmod -R go-rwx {root} (and consider whether "
                    "the keys were read)"
                )
