"""One server of a local cluster: `tessera cluster start|stop|restart NAME --dir DIR`.

A local cluster (`local_cluster.up`) records its servers in DIR/cluster.json. These act on one
of them by name (`master-1`, `ts-2`, as `tessera cluster status` lists them), the way an
operator rolls one node of a Kudu cluster: stop it (SIGTERM, SIGKILL after `grace`), start it
again on its data directory, address and certificate, and wait until it serves (its ready
file). cluster.json is updated with the new pid (or none), so `status` and `down` stay right.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from service.common.errors import InvalidArgument
from service.tools import launcher
from service.tools.local_cluster import (
    ClusterRecord,
    LocalClusterError,
    ServerRecord,
    Stopped,
    is_running,
    load_record,
    save_record,
    spawn_server,
    wait_server_ready,
)

__all__ = ["restart_server", "start_server", "stop_server"]


def _server(record: ClusterRecord, name: str) -> ServerRecord:
    for s in record.servers:
        if s.name == name:
            return s
    names = ", ".join(s.name for s in record.servers)
    raise InvalidArgument(f"no server {name!r} in the cluster at {record.dir} (it has: {names})")


def stop_server(dir: Path | str, name: str, grace: float = 10.0) -> Stopped:
    """Stop server `name` if it runs; "stopped", "killed" or "not running"."""
    record = load_record(dir)
    server = _server(record, name)
    if not is_running(server) or server.pid is None:
        outcome = "not running"
    else:
        outcome = "killed" if launcher.terminate_all([server.pid], grace) else "stopped"
    save_record(record.with_servers([replace(server, pid=None)]))
    return Stopped(name, server.pid, outcome)


def start_server(dir: Path | str, name: str, timeout: float = 60.0) -> ServerRecord:
    """Start server `name` (refused if it runs) and wait until it serves; its record."""
    record = load_record(dir)
    server = _server(record, name)
    if is_running(server):
        raise LocalClusterError(f"{name} is running (pid {server.pid}): stop or restart it")
    launch = spawn_server(record, server)
    wait_server_ready(launch, time.monotonic() + timeout, timeout)
    save_record(load_record(dir).with_servers([launch.server]))
    return launch.server


def restart_server(
    dir: Path | str, name: str, grace: float = 10.0, timeout: float = 60.0
) -> tuple[Stopped, ServerRecord]:
    return stop_server(dir, name, grace), start_server(dir, name, timeout)
