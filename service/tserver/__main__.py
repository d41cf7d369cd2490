"""Run one tablet server: `python -m service.tserver --conf conf/tserver.toml [--set k=v]
[--ready-file F]` (flags and exit codes: service/common/server_main.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from service.common import server_main
from service.common.config import TServerConfig
from service.tserver.tablet_server import TabletServer


async def serve(config: TServerConfig, ready_file: Path | None = None) -> int:
    server = TabletServer(config)
    return await server_main.serve(
        server, "tablet server", fatal=lambda: None, failed=lambda: False, ready_file=ready_file
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
