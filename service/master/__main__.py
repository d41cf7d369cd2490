"""Run one master: `python -m service.master --conf conf/master.toml [--set k=v] [--ready-file F]`.

With `--ready-file F` it writes {"address", "pid", "uuid", "http_address"} to F once it serves,
so launchers (`service.testing.master_cluster`) can wait for it (service/common/server_main.py).
The process runs until SIGTERM/SIGINT, or until sys.catalog's node stops on a storage failure;
then `MasterServer.aclose()` stops it in its documented order, within `SHUTDOWN_TIMEOUT_S`.

Exit codes: 0 after SIGTERM/SIGINT, 3 when the node stopped on a storage failure, 2 for a
configuration error.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from service.common import server_main
from service.common.config import MasterConfig
from service.master.master import MasterServer

SHUTDOWN_TIMEOUT_S = 4.0
"""The longest a master takes to stop after SIGTERM (`server_main.serve`): an orderly stop takes
about the gRPC server's grace period (1 s, service/master/master.py "Shutdown order"), and a
master's every acknowledged catalog write is in its synced WAL, so one that takes longer exits
as after a crash. Loaded masters once needed SIGKILL after 15 s of SIGTERM."""


async def serve(config: MasterConfig, ready_file: Path | None = None) -> int:
    """Start a master, announce it, wait for a signal or a fatal node, stop it."""
    master = MasterServer(config)

    def fatal() -> asyncio.Event | None:
        return master.node.fatal_event if master.node is not None else None

    def failed() -> bool:
        return master.node is not None and master.node.fatal is not None

    return await server_main.serve(
        master,
        "master",
        fatal,
        failed,
        ready_file=ready_file,
        shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
    )


def main(argv: list[str] | None = None) -> int:
    return server_main.main(
        argv,
        prog="python -m service.master",
        description="Tessera master",
        config_cls=MasterConfig,
        run=serve,
        node_name=lambda c: c.advertised_address or c.rpc_bind,
    )


if __name__ == "__main__":
    sys.exit(main())
