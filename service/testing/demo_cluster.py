"""Launch KV demo nodes as real processes on loopback (for the demo, tests and benchmarks).

Ports are picked free on 127.0.0.1 before launch (the peers must know each other's addresses
to bootstrap); every node logs to `<dir>/<uuid>.log`. `stop()` sends SIGTERM and then SIGKILL
to whatever is left, so a test that uses the cluster as a context manager never leaves a
process running.

`secure=True` makes a CA for the cluster in `<dir>/pki` and starts every node with its own
`tserver` certificate (`kv_demo_server --credentials`): mutual TLS between the nodes and towards
their clients, who get identities from `credentials_dir`. Off by default: the demo and its
tests speak plaintext; the benchmarks run both (bench/README.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.common.pki import ClusterPki
from service.testing.processes import terminate_all

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONF = ROOT / "conf" / "raft-demo.toml"


_LOW_PORT = 10_000
"""Ports below this are left alone (well-known and registered services)."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports free now, for servers whose addresses must be known before
    they start (a master group's `master_addresses`).

    Chosen below the kernel's ephemeral range: a port from that range (what binding port 0
    gives) can be taken, between this call and the server's bind, as the local port of any
    outgoing connection on the machine -- a test once failed to start a master that way
    ("Failed to bind to address 127.0.0.1:40757"). Nothing takes ports below the range unless
    asked for them by number."""
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    tries = min(max(0, low - _LOW_PORT), 64 * n)  # random draws, not a shuffle of the range
    tried: set[int] = set()
    socks: list[socket.socket] = []
    try:
        while len(socks) < n and len(tried) < tries:
            port = rng.randrange(_LOW_PORT, low)
            if port in tried:
                continue
            tried.add(port)
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # no room below the range: let the kernel choose
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class DemoNode:
    uuid: str
    address: str
    data_dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class DemoCluster:
    base: Path
    size: int = 3
    overrides: Mapping[str, str] = field(default_factory=dict)
    nodes: dict[str, DemoNode] = field(default_factory=dict)
    secure: bool = False
    """Mutual TLS from a CA made for the cluster in `<base>/pki` (module docstring)."""

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.pki = ClusterPki(self.base / "pki") if self.secure else None
        ports = free_ports(self.size)
        for i, port in enumerate(ports, start=1):
            uuid = f"node-{i}"
            self.nodes[uuid] = DemoNode(
                uuid, f"127.0.0.1:{port}", self.base / uuid, self.base / f"{uuid}.log"
            )
        self.initial = list(self.nodes)

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

    def add_node(self, uuid: str) -> DemoNode:
        """A new node that boots with no peers: it waits to be added as a learner."""
        (port,) = free_ports(1)
        node = DemoNode(uuid, f"127.0.0.1:{port}", self.base / uuid, self.base / f"{uuid}.log")
        self.nodes[uuid] = node
        self.start_node(uuid, peers=[])
        self.wait_ready([uuid])
        return node

    def start_node(self, uuid: str, peers: list[str] | None = None) -> None:
        node = self.nodes[uuid]
        ready = self.base / f"{uuid}.ready"
        ready.unlink(missing_ok=True)
        members = self.initial if peers is None else peers
        args = [
            sys.executable,
            "-m",
            "service.tools.kv_demo_server",
            "--conf",
            str(DEMO_CONF),
            "--set",
            f"uuid={uuid}",
            "--set",
            f"data_dir={node.data_dir}",
            "--set",
            f"rpc_bind={node.address}",
            "--set",
            f"peers={self._peers_toml(members)}",
            "--ready-file",
            str(ready),
        ]
        for k, v in self.overrides.items():
            args += ["--set", f"{k}={v}"]
        creds = self.credentials_dir("tserver", uuid)
        if creds is not None:
            args += ["--credentials", str(creds)]
        logf = node.log.open("ab")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        node.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        logf.close()

    def wait_ready(self, uuids: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for uuid in uuids:
            ready = self.base / f"{uuid}.ready"
            while not ready.exists():
                node = self.nodes[uuid]
                if not node.alive:
                    raise RuntimeError(f"{uuid} exited: {node.log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{uuid} not serving after {timeout}s")
                time.sleep(0.02)
            info = json.loads(ready.read_text())
            assert info["address"] == self.nodes[uuid].address

    def kill(self, uuid: str, sig: int = signal.SIGKILL) -> None:
        node = self.nodes[uuid]
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)
            node.proc.wait(timeout=30)

    def restart(self, uuid: str) -> None:
        self.kill(uuid)
        self.start_node(uuid, peers=None if uuid in self.initial else [])
        self.wait_ready([uuid])

    def stop(self) -> None:
        terminate_all(n.proc for n in self.nodes.values() if n.proc is not None)

    def exit_codes(self) -> dict[str, int | None]:
        return {u: (n.proc.poll() if n.proc else None) for u, n in self.nodes.items()}

    def __enter__(self) -> DemoCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_cluster(base: Path, size: int = 3, **overrides: str) -> Iterator[DemoCluster]:
    cluster = DemoCluster(base, size, overrides)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
