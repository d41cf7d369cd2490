"""Scan pages received into memory the process reuses, instead of fresh memory every page.

Why
---
gRPC hands the client each scan page as a new `bytes` object of the page's whole size (2 MB by
default, up to 64 MB). glibc's malloc serves a block that large with its own `mmap` unless its
dynamic threshold has grown past the size, and returns the memory to the kernel when the page
is dropped (`munmap`, or a trim of the heap's top once more than twice the threshold is free).
The next page is then faulted in afresh, 4 KiB at a time, each page of memory zeroed by the
kernel before gRPC overwrites it. How often that happens depends on what the process did
before (which blocks it freed, in which of malloc's arenas). Measured on this project's 2-core
machines with `getrusage`, a client doing back-to-back secured scans of 30 MB of Arrow in 8 MB
pages after writing the rows one batch at a time: 5,000-10,000 minor faults per scan; with
the settings below 0-450, the client's CPU 24-27% less and its scans 15-20% faster. A client
that had written the rows with four concurrent writers first (the tablet server benchmark's)
had no faults either way, and gained nothing (bench/README.md).

What
----
`reuse_large_blocks()` sets two of glibc's malloc parameters, once per process, when the first
stub of a tablet server's data service is made (`ScanStub`, service/client/scan_reply.py, which
the client's channel pool hands out for reads and writes alike):

- `M_MMAP_THRESHOLD` = `MMAP_THRESHOLD` (32 MiB, the most glibc's dynamic threshold would
  grow to by itself): blocks below it come from malloc's heaps, so a dropped page's memory
  serves the next page;
- `M_TRIM_THRESHOLD` = `TRIM_THRESHOLD` (64 MiB): free memory at a heap's top is returned to
  the kernel only beyond this, so a scan's pages do not give their memory back between pages.

The price is memory a scanning process keeps after its scans: up to `TRIM_THRESHOLD` of free
heap at the top of each of malloc's arenas, and large freed blocks that sit between live ones
until they are reused. A data client holds pages of that size anyway while it reads them.

It is a process-wide setting, so the user's own choice wins: nothing is changed when the
environment's `GLIBC_TUNABLES` already names a `glibc.malloc.` parameter, or when
`TESSERA_CLIENT_MALLOC=system` (the client then leaves malloc as it found it). Where the C
library is not glibc (musl, macOS) there is no `mallopt` of this meaning and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Callable
from typing import cast

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "reuse_large_blocks"]

MMAP_THRESHOLD = 32 << 20
"""Blocks below this come from malloc's heaps, not from a mapping of their own (module
docstring)."""

TRIM_THRESHOLD = 64 << 20
"""Free memory at a heap's top kept by the process before it is given back (module docstring)."""

OPT_OUT_ENV = "TESSERA_CLIENT_MALLOC"
"""`system`: leave malloc's parameters as the process has them."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter numbers (malloc.h)."""

_lock = threading.Lock()
_outcome: str | None = None


def reuse_large_blocks() -> str:
    """Set malloc's large-block parameters once per process (module docstring); what was done:
    "tuned", or why not ("opted out", "GLIBC_TUNABLES", "not glibc", "refused")."""
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _apply(os.environ)
        return _outcome


def _apply(env: os._Environ[str] | dict[str, str]) -> str:
    if env.get(OPT_OUT_ENV, "").strip().lower() == "system":
        return "opted out"
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return "not glibc"
    # mallopt answers 1 on success, 0 for a value it refuses.
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return "refused"
    if mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "refused"
    return "tuned"


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt`, or None where the C library is another one."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        gnu_get_libc_version = libc.gnu_get_libc_version  # glibc alone has it
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    gnu_get_libc_version.restype = ctypes.c_char_p
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return cast(Callable[[int, int], int], mallopt)
