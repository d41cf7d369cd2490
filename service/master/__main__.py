"""Run one master: `python -m service.master --conf conf/master.toml [--set k=v] [--ready-file F]`.

With `--ready-file F` it writes {"address", "pid", "uuid"} to F once it serves, so launchers
(`service.testing.master_cluster`) can wait for it. The process runs until SIGTERM/SIGINT, or
until sys.catalog's node stops on a storage failure; then `MasterServer.aclose()` stops it in
its documented order.

Exit codes: 0 after SIGTERM/SIGINT, 3 when the node stopped on a storage failure, 2 for a
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from service.common.config import MasterConfig, load_config, parse_override
from service.common.errors import TesseraError
from service.common.logging import setup_logging
from service.master.master import MasterServer

log = logging.getLogger("service.master")


async def serve(config: MasterConfig, ready_file: Path | None = None) -> int:
    """Start a master, announce it, wait for a signal or a fatal node, stop it."""
    master = MasterServer(config)
    try:
        await master.start()
    except BaseException:
        await master.aclose()
        raise
    node = master.node
    assert node is not None
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"address": master.address, "pid": os.getpid(), "uuid": master.uuid})
        )
        tmp.replace(ready_file)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stop_task = asyncio.create_task(stop.wait())
    fatal_task = asyncio.create_task(node.fatal_event.wait())
    await asyncio.wait({stop_task, fatal_task}, return_when=asyncio.FIRST_COMPLETED)
    code = 3 if node.fatal is not None else 0
    log.info("master %s shutting down (%s)", master.uuid, "fatal" if code else "signal")
    await master.aclose()
    for t in (stop_task, fatal_task):
        t.cancel()
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m service.master", description="Tessera master")
    p.add_argument("--conf", required=True, type=Path, help="master config (toml)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config setting, e.g. --set raft.heartbeat_interval_ms=100",
    )
    p.add_argument("--ready-file", type=Path, help="write {address,pid,uuid} here when serving")
    args = p.parse_args(argv)
    try:
        overrides = dict(parse_override(s) for s in args.set)
        config = load_config(MasterConfig, args.conf, overrides)
    except TesseraError as e:
        print(f"tessera: {e.message}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, node=config.advertised_address or config.rpc_bind)
    try:
        return asyncio.run(serve(config, args.ready_file))
    except TesseraError as e:
        print(f"tessera: {e.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
