"""A mini cluster on loopback: N master processes and M real tablet-server processes.

Masters come from `MasterCluster`; tablet servers are `python -m service.tserver` processes
bound to `127.0.0.1:0` (each writes its address, uuid and status-page address to a ready file),
heartbeating to every master. Each logs to `<base>/<name>.log` and keeps its data in
`<base>/<name>/`, so a server restarted with `start_tserver(name)` comes back with the same uuid
and replicas.
`stop()` sends SIGTERM, then SIGKILL to whatever is left: used as a context manager, the
cluster never leaves a process running. The process mechanics are `service.tools.launcher`'s.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from service.client.sync import SyncClient
from service.common.pki import IdentityFiles
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT, MasterCluster
from service.tools import launcher
from service.tools.launcher import CONF_DIR, StopOnExit

TSERVER_CONF = CONF_DIR / "tserver.toml"

FAST_TSERVER: Mapping[str, str] = {
    **FAST_RAFT,
    "heartbeat_interval_ms": "200",
}
"""Test timing: Raft elections within about a second, heartbeats five times a second."""


@dataclass
class TServerProcess:
    name: str
    data_dir: Path
    log: Path
    address: str = ""
    uuid: str = ""
    launched: launcher.Launched | None = None
    http_address: str = ""
    """host:port of its status pages and /metrics, from its ready file ("" if not serving)."""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launched.proc if self.launched is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class MiniCluster(StopOnExit):
    """Masters plus tablet servers. Use as a context manager."""

    base: Path
    num_masters: int = 3
    num_tservers: int = 3
    master_overrides: Mapping[str, str] = field(default_factory=lambda: dict(FAST_RAFT))
    tserver_overrides: Mapping[str, str] = field(default_factory=lambda: dict(FAST_TSERVER))
    tservers: dict[str, TServerProcess] = field(default_factory=dict)
    secure: bool = True
    """Mutual TLS from a CA made for the cluster in `<base>/pki` (the product's default)."""

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.masters = MasterCluster(
            self.base, self.num_masters, self.master_overrides, secure=self.secure
        )
        for i in range(1, self.num_tservers + 1):
            self.add_tserver_slot(f"ts-{i}")

    def add_tserver_slot(self, name: str) -> TServerProcess:
        ts = TServerProcess(name, self.base / name, self.base / f"{name}.log")
        self.tservers[name] = ts
        return ts

    @property
    def master_addresses(self) -> list[str]:
        return self.masters.addresses

    def credentials(self, role: str = "admin", name: str = "test-admin") -> Credentials | None:
        """A client's credentials for this cluster (None when it runs insecure)."""
        return self.masters.credentials(role, name)

    def credentials_dir(self, role: str = "admin", name: str = "test-admin") -> str | None:
        """A credentials directory for this cluster, an admin's by default (None when
        insecure)."""
        return self.masters.credentials_dir(role, name)

    def sync_channel(self, address: str) -> grpc.Channel:
        """A blocking channel to any server of this cluster, as its admin."""
        return self.masters.sync_channel(address)

    def channel(self, address: str) -> grpc.aio.Channel:
        """An asyncio channel to any server of this cluster, as its admin."""
        return self.masters.channel(address)

    def client(self, timeout: float = 60.0, **kwargs: object) -> SyncClient:
        """A blocking client of this cluster with admin credentials."""
        return SyncClient(
            self.master_addresses, timeout=timeout, credentials=self.credentials(), **kwargs
        )

    def start(self) -> None:
        self.masters.start()
        for name in self.tservers:
            self.start_tserver(name, wait=False)
        for name in self.tservers:
            self.wait_tserver(name)
        self.wait_registered()

    def wait_registered(self, timeout: float = 30.0) -> None:
        """Wait until the master leader lists every running tablet server as live, so a test
        can create a table at once (placement needs the servers registered, not just up)."""
        want = {ts.uuid for ts in self.tservers.values() if ts.alive}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for address in self.master_addresses:
                with open_sync_channel(address, self.credentials(), role="master") as ch:
                    stub = master_pb2_grpc.MasterServiceStub(ch)
                    try:
                        r = stub.ListTabletServers(mpb.ListTabletServersRequestPB(), timeout=2)
                    except grpc.RpcError:
                        continue  # not the leader (yet), or not up
                live = {s.instance.permanent_uuid for s in r.servers if s.live}
                if want <= live:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"tablet servers not registered with the master after {timeout}s")

    def start_tserver(
        self,
        name: str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        credentials_dir: Path | None = None,
    ) -> TServerProcess:
        """Launch tablet server `name` with a certificate of its own from the cluster's CA, or
        with the credentials directory `credentials_dir` (a join credential, say)."""
        ts = self.tservers[name]
        settings = [
            f"data_dir={ts.data_dir}",
            f"rpc_bind={ts.address or '127.0.0.1:0'}",
            f"master_addresses={launcher.toml_list(self.master_addresses)}",
            "http_bind=127.0.0.1:0",
            *(f"{k}={v}" for k, v in self.tserver_overrides.items()),
        ]
        if credentials_dir is not None:
            settings += launcher.security_overrides(IdentityFiles.in_dir(credentials_dir))
        else:
            uuid = launcher.tserver_uuid(ts.data_dir)
            settings += self.masters.security_overrides("tserver", uuid)
        ready = self.base / f"{name}.ready"
        args = launcher.server_args("service.tserver", TSERVER_CONF, settings, ready)
        ts.launched = launcher.spawn(name, args, log=ts.log, ready=ready, env=env)
        if wait:
            self.wait_tserver(name)
        return ts

    def wait_tserver(self, name: str, timeout: float = 30.0) -> None:
        ts = self.tservers[name]
        assert ts.launched is not None, f"{name} was never started"
        info = launcher.wait_ready(ts.launched, time.monotonic() + timeout, timeout)
        ts.address, ts.uuid = info["address"], info["uuid"]
        ts.http_address = info.get("http_address", "")

    def kill_tserver(self, name: str, sig: int = signal.SIGKILL) -> None:
        launcher.kill(self.tservers[name].proc, sig)

    def tserver_by_uuid(self, uuid: str) -> TServerProcess:
        for ts in self.tservers.values():
            if ts.uuid == uuid:
                return ts
        raise KeyError(uuid)

    def stop(self) -> None:
        launcher.terminate_all(ts.proc for ts in self.tservers.values() if ts.proc is not None)
        self.masters.stop()
