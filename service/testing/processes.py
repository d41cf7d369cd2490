"""Stopping child processes the same way everywhere: SIGTERM, a grace period, then SIGKILL.

Used by every launcher of real processes (the demo cluster, the benchmark baselines) so that a
test or benchmark never leaves a server running, even when it fails half-way.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable


def terminate_all(procs: Iterable[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """Ask every live process to stop, wait up to `grace` seconds in all, kill the rest."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
