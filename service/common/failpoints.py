"""Crash failpoints: make a server process die at an exact point, for fault-injection tests.

A test that wants "a tablet server killed in the middle of a read" cannot get it reliably by
sending SIGKILL from outside at some moment: the read may not have started, or may be over.
Instead the server is started with

    TESSERA_FAILPOINT_CRASH_AT=<point>[:<n>]   e.g. scan_next:3, create_table:after_replicate:1

and dies with `os._exit(137)` (what SIGKILL looks like to a parent) the n-th time (default the
first) it reaches `hit("<point>")`, before answering. With several servers started this way,

    TESSERA_FAILPOINT_ONCE_FILE=<path>

lets only the first one that reaches the point die: it creates `path` exclusively first, and a
server that finds the file already there carries on. The file also tells the test that the
crash happened.

Points. Tablet server: `scan_next` (TabletServerService.ScanNext, before the page is read),
`write:after_apply` (a plain write committed and applied on its leader; the client not
answered: tests/integration/test_write_retries_once.py).
Master, the steps of its DDL (catalog_manager, background_tasks), in the order they happen:

  CreateTable
    `create_table:before_replicate`   validated, name reserved; the entry not proposed yet
    `create_table:after_replicate`    the entry (table RUNNING, tablets PREPARING) committed and
                                      applied on the leader; the client not answered yet
    `assign_tablets:after_replicate`  an assignment entry (PREPARING -> CREATING, replicas
                                      chosen) committed; no CreateTablet sent for it yet
    `create_tablet:after_rpc`         CreateTablet sent to (and answered by, or failed on)
                                      every replica of one CREATING tablet; not marked done
    `process_report:after_replicate`  a tablet report's changes committed (a CREATING tablet
                                      whose leader reported -> RUNNING; the consensus state;
                                      ALTERING -> RUNNING); its RPCs not sent, the report not
                                      answered. The first hit in a master's life is the first
                                      tablet reported RUNNING, so `:1` is a CreateTable step.
  AlterTable
    `alter_table:before_replicate`    validated, under the table lock; not proposed yet
    `alter_table:after_replicate`     the new schema (table ALTERING) committed and applied;
                                      the client not answered yet
    `alter_schema:after_rpc`          AlterSchema accepted by one tablet's leader (the
                                      background task's); the task not marked done
  DeleteTable
    `delete_table:before_replicate`   under the table and tablet locks; not proposed yet
    `delete_table:after_replicate`    table REMOVED, tablets DELETED committed and applied;
                                      the client not answered yet
    `delete_tablet:after_rpc`         DeleteTablet sent to every replica of one deleted tablet
                                      (the background task's); not marked done

`tests/integration/test_master_ddl_crash.py` kills the leader at each of them.

Transactions (docs/design/transactions.md#R3), master then tablet server:

    `txn_commit:after_committing`     COMMITTING recorded; no participant prepared yet
    `txn_commit:after_prepare`        every participant prepared; COMMITTED not recorded
    `txn_commit:after_committed`      COMMITTED recorded (the decision); nothing finalized
    `txn_participant:after_prepare`   a participant's prepare entry applied on its leader;
                                      the coordinator not answered
    `txn_participant:after_commit`    a participant's commit entry applied on its leader;
                                      the coordinator not answered

`tests/integration/test_transactions.py` kills the process at each of them.

A master started with

    TESSERA_FAILPOINT_SKIP=<Kind>[,<Kind>...]     e.g. AlterReplicas,DeleteReplicas,DeleteReplica

never performs those side effects (`skipped(kind)`: background tasks count them as failed and
retry, report actions are dropped): the state a master that crashed before its side effects
leaves behind, which the reconciliation jobs must find and repair. `TxnFinalize` keeps the
transaction coordinator from ever reaching a participant with a commit or an abort (the
participants' own sweep must then drop what an abort left).

A server started with

    TESSERA_FAILPOINT_DELAY=<point>:<ms>           e.g. create_tablet:3000

waits that long each time it reaches `await delay("<point>")` (the event loop goes on): a slow
disk or an overloaded host, at one step. Tablet server: `create_tablet` (a CreateTablet call,
inside the server's creation gate, before the replica is formatted).

Unset variables cost one dictionary lookup per hit.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter

__all__ = ["CRASH_AT", "DELAY", "ONCE_FILE", "SKIP", "delay", "hit", "skipped"]

log = logging.getLogger(__name__)

CRASH_AT = "TESSERA_FAILPOINT_CRASH_AT"
ONCE_FILE = "TESSERA_FAILPOINT_ONCE_FILE"
SKIP = "TESSERA_FAILPOINT_SKIP"
DELAY = "TESSERA_FAILPOINT_DELAY"
_counts: Counter[str] = Counter()


def hit(point: str) -> None:
    """Count a pass through `point`; exit the process if the failpoint says so."""
    spec = os.environ.get(CRASH_AT)
    if not spec:
        return
    name, _, n = spec.rpartition(":")
    if not n.isdigit():  # no count: points are named `<operation>:<step>`
        name, n = spec, "1"
    if name != point:
        return
    _counts[point] += 1
    if _counts[point] != int(n):
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


async def delay(point: str) -> None:
    """Wait at `point` as long as TESSERA_FAILPOINT_DELAY says (`<point>:<ms>`), if it names
    this point; otherwise return at once."""
    spec = os.environ.get(DELAY)
    if not spec:
        return
    name, _, ms = spec.rpartition(":")
    if name == point and ms.isdigit():
        await asyncio.sleep(int(ms) / 1000.0)
