"""Launch KV demo nodes as real processes on loopback (for the demo, tests and benchmarks).

Ports are picked free on 127.0.0.1 before launch (the peers must know each other's addresses
to bootstrap); every node logs to `<dir>/<uuid>.log`. `stop()` sends SIGTERM and then SIGKILL
to whatever is left, so a test that uses the cluster as a context manager never leaves a
process running (nor does one whose start fails half-way). The process mechanics and
`free_ports` are `service.tools.launcher`'s.

`secure=True` makes a CA for the cluster in `<dir>/pki` and starts every node with its own
`tserver` certificate (`kv_demo_server --credentials`): mutual TLS between the nodes and towards
their clients, who get identities from `credentials_dir`. Off by default: the demo and its
tests speak plaintext; the benchmarks run both (bench/README.md).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.common.pki import ClusterPki
from service.tools import launcher
from service.tools.launcher import CONF_DIR, ServerProcess, StopOnExit, free_ports

DEMO_CONF = CONF_DIR / "raft-demo.toml"


@dataclass
class DemoCluster(StopOnExit):
    base: Path
    size: int = 3
    overrides: Mapping[str, str] = field(default_factory=dict)
    nodes: dict[str, ServerProcess] = field(default_factory=dict)
    secure: bool = False
    """Mutual TLS from a CA made for the cluster in `<base>/pki` (module docstring)."""

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.pki = ClusterPki(self.base / "pki") if self.secure else None
        for i, port in enumerate(free_ports(self.size), start=1):
            self._slot(f"node-{i}", port)
        self.initial = list(self.nodes)

    def _slot(self, uuid: str, port: int) -> ServerProcess:
        node = ServerProcess(
            uuid,
            "kv",
            self.base / uuid,
            self.base / f"{uuid}.log",
            self.base / f"{uuid}.ready",
            address=f"127.0.0.1:{port}",
            uuid=uuid,
        )
        self.nodes[uuid] = node
        return node

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes.values()]

    def credentials_dir(self, role: str, name: str) -> Path | None:
        """A credentials directory (ca.pem, cert.pem, key.pem) of (role, name) from the
        cluster's CA, made on first use; None when the cluster is insecure."""
        if self.pki is None:
            return None
        directory = self.base / "credentials" / f"{role}-{name}"
        if not directory.exists():
            self.pki.export(role, name, directory)
        return directory

    def _peers_toml(self, members: list[str]) -> str:
        return (
            "["
            + ", ".join(f'{{uuid = "{u}", address = "{self.nodes[u].address}"}}' for u in members)
            + "]"
        )

    def start(self) -> None:
        for uuid in self.initial:
            self.start_node(uuid)
        self.wait_ready(self.initial)

    def add_node(self, uuid: str) -> ServerProcess:
        """A new node that boots with no peers: it waits to be added as a learner."""
        (port,) = free_ports(1)
        node = self._slot(uuid, port)
        self.start_node(uuid, peers=[])
        self.wait_ready([uuid])
        return node

    def start_node(self, uuid: str, peers: list[str] | None = None) -> None:
        node = self.nodes[uuid]
        settings = [
            f"uuid={uuid}",
            f"data_dir={node.data_dir}",
            f"rpc_bind={node.address}",
            f"peers={self._peers_toml(self.initial if peers is None else peers)}",
            *(f"{k}={v}" for k, v in self.overrides.items()),
        ]
        creds = self.credentials_dir("tserver", uuid)
        extra = ["--credentials", str(creds)] if creds is not None else []
        args = launcher.server_args(
            "service.tools.kv_demo_server", DEMO_CONF, settings, node.ready, extra
        )
        node.launched = launcher.spawn(uuid, args, log=node.log, ready=node.ready)

    def wait_ready(self, uuids: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for uuid in uuids:
            node = self.nodes[uuid]
            assert node.launched is not None, f"{uuid} was never started"
            launcher.wait_ready(node.launched, deadline, timeout, expect_address=node.address)

    def kill(self, uuid: str, sig: int = signal.SIGKILL) -> None:
        launcher.kill(self.nodes[uuid].proc, sig)

    def restart(self, uuid: str) -> None:
        self.kill(uuid)
        self.start_node(uuid, peers=None if uuid in self.initial else [])
        self.wait_ready([uuid])

    def stop(self) -> None:
        launcher.terminate_all(n.proc for n in self.nodes.values() if n.proc is not None)

    def exit_codes(self) -> dict[str, int | None]:
        return {u: (n.proc.poll() if n.proc else None) for u, n in self.nodes.items()}
