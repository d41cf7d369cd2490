"""Run one tablet server: `python -m service.tserver --conf conf/tserver.toml [--set k=v]
[--ready-file F]` (flags and exit codes: service/common/server_main.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from service.common import server_main
from service.common.config import TServerConfig
from service.tserver.tablet_server import TabletServer

SHUTDOWN_TIMEOUT_S = 10.0
"""The longest a tablet server gives its orderly stop (`TabletServer.aclose`) after SIGTERM.
An orderly stop takes about the gRPC server's grace period; past the bound the process exits
as after a crash, which loses nothing acknowledged: every acknowledged write is in a majority
of replicas' fsynced WALs, replayed at the next start. Longer than the master's (4 s): a
tablet server closes a Raft group, WAL included, for each of its replicas."""


async def serve(config: TServerConfig, ready_file: Path | None = None) -> int:
    server = TabletServer(config)
    return await server_main.serve(
        server,
        "tablet server",
        fatal=lambda: None,
        failed=lambda: False,
        ready_file=ready_file,
        shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
    )


def main(argv: list[str] | None = None) -> int:
    return server_main.main(
        argv,
        prog="python -m service.tserver",
        description="Tessera tablet server",
        config_cls=TServerConfig,
        run=serve,
        node_name=lambda c: c.advertised_address or c.rpc_bind,
    )


if __name__ == "__main__":
    sys.exit(main())
