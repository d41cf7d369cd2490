"""Crash failpoints: make a server process die at an exact point, for fault-injection tests.

A test that wants "a tablet server killed in the middle of a read" cannot get it reliably by
sending SIGKILL from outside at some moment: the read may not have started, or may be over.
Instead the server is started with

    TESSERA_FAILPOINT_CRASH_AT=<point>:<n>     e.g. scan_next:3

and dies with `os._exit(137)` (what SIGKILL looks like to a parent) the n-th time it reaches
`hit("<point>")`, before answering. With several servers started this way,

    TESSERA_FAILPOINT_ONCE_FILE=<path>

lets only the first one that reaches the point die: it creates `path` exclusively first, and a
server that finds the file already there carries on. The file also tells the test that the
crash happened.

Points: `scan_next` (TabletServerService.ScanNext, before the page is read).

A master started with

    TESSERA_FAILPOINT_SKIP=<Kind>[,<Kind>...]     e.g. AlterReplicas,DeleteReplicas,DeleteReplica

never performs those side effects (`skipped(kind)`: background tasks count them as failed and
retry, report actions are dropped): the state a master that crashed before its side effects
leaves behind, which the reconciliation jobs must find and repair.

Unset variables cost one dictionary lookup per hit.
"""

from __future__ import annotations

import logging
import os
from collections import Counter

__all__ = ["CRASH_AT", "ONCE_FILE", "SKIP", "hit", "skipped"]

log = logging.getLogger(__name__)

CRASH_AT = "TESSERA_FAILPOINT_CRASH_AT"
ONCE_FILE = "TESSERA_FAILPOINT_ONCE_FILE"
SKIP = "TESSERA_FAILPOINT_SKIP"
_counts: Counter[str] = Counter()


def hit(point: str) -> None:
    """Count a pass through `point`; exit the process if the failpoint says so."""
    spec = os.environ.get(CRASH_AT)
    if not spec:
        return
    name, _, n = spec.partition(":")
    if name != point:
        return
    _counts[point] += 1
    if _counts[point] != int(n or 1):
        return
    once = os.environ.get(ONCE_FILE)
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
    log.error("failpoint %s=%s: crashing now", CRASH_AT, spec)
    logging.shutdown()
    os._exit(137)


def skipped(kind: str) -> bool:
    """Whether side effects of `kind` are switched off by TESSERA_FAILPOINT_SKIP."""
    spec = os.environ.get(SKIP)
    if not spec:
        return False
    return kind in {k.strip() for k in spec.split(",")}
