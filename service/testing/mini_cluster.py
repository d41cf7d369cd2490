"""A mini cluster on loopback: N master processes and M real tablet-server processes.

Masters come from `MasterCluster`; tablet servers are `python -m service.tserver` processes
bound to `127.0.0.1:0` (each writes its address, uuid and status-page address to a ready file),
heartbeating to every master. Each logs to `<base>/<name>.log` and keeps its data in
`<base>/<name>/`, so a server restarted with `start_tserver(name)` comes back with the same uuid
and replicas.
`stop()` sends SIGTERM, then SIGKILL to whatever is left: used as a context manager, the
cluster never leaves a process running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from service.client.sync import SyncClient
from service.common.config import SecuritySettings
from service.common.pki import IdentityFiles
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT, ROOT, MasterCluster
from service.testing.processes import terminate_all

TSERVER_CONF = ROOT / "conf" / "tserver.toml"

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
    proc: subprocess.Popen[bytes] | None = None
    http_address: str = ""
    """host:port of its status pages and /metrics, from its ready file ("" if not serving)."""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class MiniCluster:
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

    def _tserver_uuid(self, ts: TServerProcess) -> str:
        """The uuid the server has (its instance file) or will take (from its certificate)."""
        try:
            return str(json.loads((ts.data_dir / "instance").read_text())["uuid"])
        except (OSError, ValueError, KeyError):
            return f"ts-{uuidlib.uuid4().hex}"

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
        ready = self.base / f"{name}.ready"
        ready.unlink(missing_ok=True)
        masters = "[" + ", ".join(f'"{a}"' for a in self.master_addresses) + "]"
        bind = ts.address or "127.0.0.1:0"
        args = [
            sys.executable,
            "-m",
            "service.tserver",
            "--conf",
            str(TSERVER_CONF),
            "--set",
            f"data_dir={ts.data_dir}",
            "--set",
            f"rpc_bind={bind}",
            "--set",
            f"master_addresses={masters}",
            "--set",
            "http_bind=127.0.0.1:0",
            "--ready-file",
            str(ready),
        ]
        for k, v in self.tserver_overrides.items():
            args += ["--set", f"{k}={v}"]
        if credentials_dir is not None:
            security = SecuritySettings.from_files(IdentityFiles.in_dir(credentials_dir))
            overrides = security.overrides()
        else:
            overrides = self.masters.security_overrides("tserver", self._tserver_uuid(ts))
        for s in overrides:
            args += ["--set", s]
        logf = ts.log.open("ab")
        penv = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        ts.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT, env=penv)
        logf.close()
        if wait:
            self.wait_tserver(name)
        return ts

    def wait_tserver(self, name: str, timeout: float = 30.0) -> None:
        ts = self.tservers[name]
        ready = self.base / f"{name}.ready"
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if not ts.alive:
                raise RuntimeError(f"{name} exited: {ts.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not serving after {timeout}s")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        ts.address, ts.uuid = info["address"], info["uuid"]
        ts.http_address = info.get("http_address", "")

    def kill_tserver(self, name: str, sig: int = signal.SIGKILL) -> None:
        ts = self.tservers[name]
        if ts.proc is not None and ts.proc.poll() is None:
            ts.proc.send_signal(sig)
            ts.proc.wait(timeout=30)

    def tserver_by_uuid(self, uuid: str) -> TServerProcess:
        for ts in self.tservers.values():
            if ts.uuid == uuid:
                return ts
        raise KeyError(uuid)

    def stop(self) -> None:
        terminate_all(ts.proc for ts in self.tservers.values() if ts.proc is not None)
        self.masters.stop()

    def __enter__(self) -> MiniCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
