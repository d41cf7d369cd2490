"""Deadlines and retry pacing shared by every client call.

A caller gives one deadline for a whole operation ("create this table within 30 s"); every
attempt inside it, on whichever server, gets only what is left, so retries never stretch a call
past what its caller allowed. Between attempts the client backs off exponentially with full
jitter (AWS's "Exponential Backoff and Jitter"): many clients retrying after a master failover
spread out instead of arriving together at the new leader.

Which errors are worth another attempt is `TesseraError.retryable` (service/common/errors.py):
the server did not start executing the request (NOT_THE_LEADER, SERVICE_UNAVAILABLE and its
subclasses), or the request is idempotent by construction (DDL carries a request id). A
`Timeout` of one attempt is retried only inside an operation whose retries are safe; the caller
says so.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from service.common.errors import Timeout

__all__ = ["Backoff", "Deadline"]


@dataclass
class Deadline:
    """An absolute point in monotonic time; `remaining()` for each attempt under it."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def attempt_timeout(self, cap: float | None = None) -> float:
        """The timeout for one attempt: what is left, at most `cap`; Timeout if nothing is."""
        left = self.remaining()
        if left <= 0:
            raise Timeout("deadline passed")
        return left if cap is None else min(left, cap)


@dataclass
class Backoff:
    """Exponential backoff with full jitter: sleep U(0, min(cap, initial * 2**n))."""

    initial: float = 0.05
    cap: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.initial * (2**self.attempts))
        self.attempts += 1
        return self.rng.uniform(0, ceiling)

    async def sleep(self, deadline: Deadline) -> None:
        """Sleep the next delay, but never past `deadline` (Timeout when it has passed)."""
        left = deadline.remaining()
        if left <= 0:
            raise Timeout("deadline passed")
        await asyncio.sleep(min(self.next_delay(), left))
