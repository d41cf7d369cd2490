"""When a leader starts its next batch of proposals, and how long a proposal may wait at all.

Theory of operation
-------------------
A Python node's cost is dominated by what it pays per batch rather than per proposal: a gRPC
message each way per follower, a thread handoff and an fdatasync on every node, a few event
loop iterations. So RaftNode (node.py) cuts as few batches as it can without making anybody
wait for nothing; `Pacer` decides when the next one may start.

*Pacing by commit.* A leader appends a new batch only when everything in its log has
committed (or a full batch is queued, or it is no longer the leader, so that those proposals
fail at once): the next batch forms while the current one makes its round trip to a quorum,
so a batch holds what arrives in one commit round. A lone client waits for nothing extra: its
batch of one goes out as soon as the previous one committed.

*Linger under load.* Once a batch of at least `linger_min_batch` (8) proposals committed,
many clients are writing at once, and the next batch starts no sooner than `batch_linger_s`
(4 ms) after the previous one did: a commit round that came back sooner (loopback, a fast disk)
waits out the rest, so a batch carries more proposals at the same per-batch cost. On the 2-core
benchmark machine (bench/raft_commit.py, 64 clients) that measured about 9 -> 16 proposals per
batch and 15-30 % more throughput, the more so the more the CPU was contended, with lower
latency too (less CPU queueing everywhere). Like PostgreSQL's commit_delay with
commit_siblings: a proposal waits at most `batch_linger_s` more, and up to 8 concurrent
writers never trigger it (a batch cannot hold more proposals than there are writers), so a
lone client's latency is untouched. `batch_linger_s = 0` turns it off.

*Deadlines.* A proposal's timeout is checked at every tick (`Deadlines.expire`), not with a
timer of its own: one `asyncio.timeout` per proposal cost a loaded leader ~30 µs per put.
Precision is one tick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from service.common.errors import Timeout
from service.consensus.node_api import NodeSettings
from service.raft import RawNode


class Pacer:
    """Whether a leader may append its next batch now (pacing by commit, linger under load).
    `wake` is called when a linger is over, so the node's loop looks again."""

    def __init__(self, settings: NodeSettings, wake: Callable[[], None]) -> None:
        self.settings = settings
        self._wake = wake
        self._last_at = 0.0
        self._last_size = 0
        self._timer: asyncio.TimerHandle | None = None

    def may_append(self, raw: RawNode) -> bool:
        if not raw.is_leader():
            return True  # its queued proposals fail at once
        return raw.commit_index() >= raw.last_index() and not self._lingering()

    def appended(self, size: int) -> None:
        """A batch of `size` proposals was appended just now."""
        self._last_at = asyncio.get_running_loop().time()
        self._last_size = size

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _lingering(self) -> bool:
        s = self.settings
        if not s.batch_linger_s or self._last_size < s.linger_min_batch:
            return False
        loop = asyncio.get_running_loop()
        until = self._last_at + s.batch_linger_s
        if loop.time() >= until:
            return False
        if self._timer is None:
            self._timer = loop.call_at(until, self._over)
        return True

    def _over(self) -> None:
        self._timer = None
        self._wake()


class Deadlines:
    """Proposals with a timeout: (deadline, future, timeout), failed with `Timeout` once due."""

    def __init__(self) -> None:
        self._due: list[tuple[float, asyncio.Future[object], float]] = []

    def add(self, fut: asyncio.Future[object], timeout: float) -> None:
        self._due.append((asyncio.get_running_loop().time() + timeout, fut, timeout))

    def expire(self, now: float) -> None:
        """Fail every proposal whose deadline passed (its outcome is unknown); forget the
        ones that are done."""
        if not self._due:
            return
        keep = []
        for entry in self._due:
            deadline, fut, timeout = entry
            if fut.done():
                continue
            if deadline <= now:
                fut.set_exception(
                    Timeout(f"proposal did not complete within {timeout}s; outcome unknown")
                )
            else:
                keep.append(entry)
        self._due = keep

    def clear(self) -> None:
        self._due.clear()
