"""The `main()` shared by server processes (`python -m service.master`, `service.tserver`).

`--conf F` loads the toml config, `--set k=v` overrides single settings, `--ready-file F` gets
{"address", "pid", "uuid"} once the server serves, plus "http_address" (host:port of its
status pages and /metrics) when it serves HTTP (launchers in service.testing wait for it).
The process runs until SIGTERM/SIGINT or until the server's fatal event (a storage failure
that must not be retried) is set; then `aclose()` stops it in its documented order, within
`shutdown_timeout_s` when the server sets one.

Exit codes: 0 after SIGTERM/SIGINT, 3 after a fatal storage failure, 2 for a configuration
error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from service.common.config import load_config, parse_override
from service.common.errors import TesseraError
from service.common.logging import setup_logging
from service.common.private_files import owner_only_umask

log = logging.getLogger(__name__)
C = TypeVar("C")


class Server(Protocol):
    """What `serve` runs. A server may also have `http_address` (str, "" when it serves no
    HTTP); it is optional so that servers without status pages fit too."""

    address: str

    @property
    def uuid(self) -> str: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


async def serve(
    server: Server,
    name: str,
    fatal: Callable[[], asyncio.Event | None],
    failed: Callable[[], bool],
    ready_file: Path | None = None,
    shutdown_timeout_s: float | None = None,
) -> int:
    """Start `server`, announce it, wait for a signal or a fatal failure, stop it.

    `shutdown_timeout_s`: the longest to wait for `aclose()`. A stop that takes longer is given
    up on and the process exits as it would after a crash, which a server whose every
    acknowledged write is synced to its write-ahead log survives (a torn tail is cut off at the
    next start, docs/design/consensus.md#R6), rather than make an operator reach for SIGKILL."""
    try:
        await server.start()
    except BaseException:
        await server.aclose()
        raise
    if ready_file is not None:
        write_ready_file(ready_file, server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = {asyncio.create_task(stop.wait())}
    fatal_event = fatal()
    if fatal_event is not None:
        waits.add(asyncio.create_task(fatal_event.wait()))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    code = 3 if failed() else 0
    log.info("%s %s shutting down (%s)", name, server.uuid, "fatal" if code else "signal")
    began = time.monotonic()
    try:
        async with asyncio.timeout(shutdown_timeout_s):
            await server.aclose()
    except TimeoutError:
        log.warning(
            "%s %s: shutdown not finished after %.0f s; exiting without it (as after a crash, "
            "which the write-ahead log is made to survive)",
            name,
            server.uuid,
            shutdown_timeout_s,
        )
    else:
        log.info("%s %s stopped in %.2f s", name, server.uuid, time.monotonic() - began)
    for t in waits:
        t.cancel()
    return code


def write_ready_file(path: Path, server: Server) -> None:
    """Announce a serving server: {"address", "pid", "uuid"[, "http_address"]}, atomically."""
    info: dict[str, object] = {"address": server.address, "pid": os.getpid(), "uuid": server.uuid}
    http_address = getattr(server, "http_address", "")
    if http_address:
        info["http_address"] = http_address
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(path)


def advertised_address(rpc_bind: str, advertised: str | None, bound_port: int) -> str:
    """The host:port peers and clients use: `advertised` if set, else the bind host (the
    machine's hostname for a wildcard bind) with the port actually bound (`:0` picks one)."""
    if advertised is not None:
        return advertised
    host = rpc_bind.rsplit(":", 1)[0]
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = socket.gethostname()
    return f"{host}:{bound_port}"


def main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    config_cls: type[C],
    run: Callable[[C, Path | None], Any],
    node_name: Callable[[C], str],
) -> int:
    """Parse the common flags, load `config_cls`, set up logging and `asyncio.run(run(...))`."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--conf", required=True, type=Path, help="config file (toml)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config setting, e.g. --set raft.heartbeat_interval_ms=100",
    )
    p.add_argument(
        "--ready-file", type=Path, help="write {address,pid,uuid,http_address} here when serving"
    )
    args = p.parse_args(argv)
    owner_only_umask()  # before anything is created: files 0600, directories 0700
    try:
        overrides = dict(parse_override(s) for s in args.set)
        config = load_config(config_cls, args.conf, overrides)
    except TesseraError as e:
        print(f"tessera: {e.message}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, node=node_name(config))  # type: ignore[attr-defined]
    try:
        return int(asyncio.run(run(config, args.ready_file)))
    except TesseraError as e:
        print(f"tessera: {e.message}", file=sys.stderr)
        return 2
