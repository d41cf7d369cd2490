"""Launch master processes (`python -m service.master`) on loopback, for tests and demos.

Ports are picked free on 127.0.0.1 before launch (every master must know every master's
address to bootstrap sys.catalog); each master's uuid follows from its address
(`service.master.master.master_uuid`). Status pages bind `127.0.0.1:0` (several masters share
the machine); each master's ready file names the address it got (`MasterProcess.http_address`).
Every master logs to `<base>/<name>.log` and keeps its data in `<base>/<name>/`. `stop()` sends
SIGTERM and then SIGKILL to whatever is left, so a test that uses the cluster as a context
manager never leaves a process running. How a process is started, waited for and stopped is
`service.tools.launcher`'s, shared with the other launchers; this module says what a master is.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from service.common import channel_options
from service.common.pki import ClusterPki
from service.common.tls import Credentials, open_channel, open_sync_channel
from service.master.master import master_uuid
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.tools import launcher
from service.tools.launcher import CONF_DIR, ROOT, StopOnExit, free_ports

MASTER_CONF = CONF_DIR / "master.toml"
__all__ = ["FAST_RAFT", "MASTER_CONF", "ROOT", "MasterCluster", "MasterProcess"]

FAST_RAFT: Mapping[str, str] = {
    "raft.tick_interval_ms": "50",
    "raft.heartbeat_interval_ms": "100",
    "raft.election_timeout_ms": "500",
    "raft.election_jitter_ms": "250",
}
"""Raft timing for tests: elections within about a second of a kill. The WAL keeps its real
fsync and preallocation: tests run the durable path the product runs."""


@dataclass
class MasterProcess:
    name: str
    address: str
    data_dir: Path
    log: Path
    launched: launcher.Launched | None = None
    http_address: str = ""
    """host:port of its status pages and /metrics, from its ready file ("" if not serving)."""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launched.proc if self.launched is not None else None

    @property
    def uuid(self) -> str:
        return master_uuid(self.address)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class MasterCluster(StopOnExit):
    """N masters forming one sys.catalog group. Use as a context manager."""

    base: Path
    size: int = 3
    overrides: Mapping[str, str] = field(default_factory=lambda: dict(FAST_RAFT))
    masters: dict[str, MasterProcess] = field(default_factory=dict)
    secure: bool = True
    """Mutual TLS from a CA made for the cluster in `<base>/pki` (the product's default)."""
    pki: ClusterPki | None = None
    """The CA to issue from (another cluster's, to share it); default: a new one in base."""

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self.secure and self.pki is None:
            self.pki = ClusterPki(self.base / "pki")
        elif not self.secure:
            self.pki = None
        for i, port in enumerate(free_ports(self.size), start=1):
            name = f"master-{i}"
            self.masters[name] = MasterProcess(
                name, f"127.0.0.1:{port}", self.base / name, self.base / f"{name}.log"
            )

    @property
    def addresses(self) -> list[str]:
        return [m.address for m in self.masters.values()]

    def credentials(self, role: str = "admin", name: str = "test-admin") -> Credentials | None:
        """A client's credentials for this cluster (None when it runs insecure)."""
        if self.pki is None:
            return None
        return Credentials.from_files(self.pki.files(role, name))

    def credentials_dir(self, role: str = "admin", name: str = "test-admin") -> str | None:
        """A credentials directory for this cluster (ca.pem, cert.pem, key.pem), an admin's by
        default: what `--credentials` and the Spark option `credentials` take; None when
        insecure."""
        if self.pki is None:
            return None
        where = "credentials" if (role, name) == ("admin", "test-admin") else f"{role}-{name}"
        return str(self.pki.export(role, name, self.base / where).ca_file.parent)

    def sync_channel(self, address: str) -> grpc.Channel:
        """A blocking channel to any server of this cluster, as its admin."""
        return open_sync_channel(address, self.credentials())

    def channel(self, address: str) -> grpc.aio.Channel:
        """An asyncio channel to any server of this cluster, as its admin, with the client
        library's reconnect backoff: with gRPC's (up to 120 s) a benchmark's channel to a
        master restarted a minute earlier was still waiting to redial when that master won
        the next election, and the failover was measured seconds late."""
        return open_channel(address, self.credentials(), options=channel_options.client())

    def leader(self, among: Sequence[str] | None = None, timeout: float = 30.0) -> tuple[str, int]:
        """(address, term) of the master among `among` (default: all) that answers
        ConnectToMaster as LEADER (which it does only after a majority confirmed it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for address in among if among is not None else self.addresses:
                with self.sync_channel(address) as ch:
                    try:
                        r = master_pb2_grpc.MasterServiceStub(ch).ConnectToMaster(
                            pb.ConnectToMasterRequestPB(), timeout=5
                        )
                    except grpc.RpcError:
                        continue
                if r.role == pb.LEADER:
                    return address, r.term
            time.sleep(0.1)
        raise TimeoutError(f"no master leader within {timeout}s")

    def security_overrides(self, role: str, name: str) -> list[str]:
        """`--set` arguments giving a server of (role, name) its certificate (none insecure)."""
        return launcher.security_overrides(self.pki.files(role, name) if self.pki else None)

    def by_address(self, address: str) -> MasterProcess:
        for m in self.masters.values():
            if m.address == address:
                return m
        raise KeyError(address)

    def add_master_slot(self, name: str) -> MasterProcess:
        """A master not started yet, on a new free port (for AddMaster: start it with
        `start_master(name, join=True)`)."""
        (port,) = free_ports(1)
        m = MasterProcess(name, f"127.0.0.1:{port}", self.base / name, self.base / f"{name}.log")
        self.masters[name] = m
        return m

    def start(self) -> None:
        for name in self.masters:
            self.start_master(name)
        self.wait_ready(list(self.masters))

    def start_master(
        self, name: str, *, join: bool = False, env: Mapping[str, str] | None = None
    ) -> None:
        """Launch `name`; `join` starts it as a new member of the running group
        (`join_existing`), `env` adds environment variables (failpoints)."""
        m = self.masters[name]
        settings = [
            f"data_dir={m.data_dir}",
            f"rpc_bind={m.address}",
            f"advertised_address={m.address}",
            f"master_addresses={launcher.toml_list(self.addresses)}",
            "http_bind=127.0.0.1:0",
            *(["join_existing=true"] if join else []),
            *self.security_overrides("master", m.uuid),
            *(f"{k}={v}" for k, v in self.overrides.items()),
        ]
        ready = self.base / f"{name}.ready"
        args = launcher.server_args("service.master", MASTER_CONF, settings, ready)
        m.launched = launcher.spawn(name, args, log=m.log, ready=ready, env=env)

    def wait_ready(self, names: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            m = self.masters[name]
            assert m.launched is not None, f"{name} was never started"
            info = launcher.wait_ready(m.launched, deadline, timeout, expect_address=m.address)
            m.http_address = info.get("http_address", "")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        launcher.kill(self.masters[name].proc, sig)

    def stop(self) -> None:
        launcher.terminate_all(m.proc for m in self.masters.values() if m.proc is not None)

    def exit_codes(self) -> dict[str, int | None]:
        return {n: (m.proc.poll() if m.proc else None) for n, m in self.masters.items()}
