"""A mini cluster whose every process lives in its own network namespace (`chaos_net`).

`MiniCluster` and `MasterCluster` do the launching; this class only moves each server's
addresses onto its namespace's IP before the first start and hands every launch the
environment that puts the process in its namespace, under its disk-fault file and (for clock
runs) with a skewable wall clock. A master keeps its address across restarts (its uuid follows
from it); a tablet server keeps its port too, so peers find it where they left it.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from service.testing.chaos_net import NetLab, node_env, write_site
from service.testing.master_cluster import FAST_RAFT, ROOT
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster

TSERVER_PORT = 7050
_ROW = re.compile(
    r'<tr><td><a href="/tablets\?table=([^"]+)">([^<]*)</a></td><td>[^<]*</td><td>(\w+)</td>'
)


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    """"master" or "tserver"."""


class ChaosCluster:
    """3 masters and 3 tablet servers on a `NetLab`: `start()`, then `stop()` in a `finally`
    (also run at exit: no process, namespace or link outlives the campaign)."""

    def __init__(self, base: Path, *, clocks: bool = False, masters: int = 3, tservers: int = 3):
        self.base = base
        self.clocks = clocks
        """Whether processes run with a wall clock the clock nemesis can skew."""
        self.nodes = [Node(f"master-{i}", "master") for i in range(1, masters + 1)] + [
            Node(f"ts-{i}", "tserver") for i in range(1, tservers + 1)
        ]
        self.lab = NetLab([n.name for n in self.nodes])
        self.faults = base / "faults"
        self.faults.mkdir(parents=True, exist_ok=True)
        self.site = write_site(base / "site")
        # Every interface of the lab's private namespaces; plain HTTP, which the campaign reads
        # /tables with: the lab is cut off from everything else (docs/design/security.md#R13).
        http = {"http_bind": "0.0.0.0:0", "http_auth": "none"}
        self.mini = MiniCluster(
            base,
            num_masters=masters,
            num_tservers=tservers,
            master_overrides={**FAST_RAFT, **http},
            tserver_overrides={**FAST_TSERVER, **http},
        )

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        atexit.register(self.stop)
        self.lab.up()
        for name, m in self.mini.masters.masters.items():
            m.address = f"{self.lab.ips[name]}:{m.address.rpartition(':')[2]}"
        for name, ts in self.mini.tservers.items():
            ts.address = f"{self.lab.ips[name]}:{TSERVER_PORT}"
        for n in self.nodes:
            self.disk_file(n.name).write_text("")
            self.clock_file(n.name).write_text("0\n")
        masters = [n.name for n in self.nodes if n.kind == "master"]
        for name in masters:
            self.mini.masters.start_master(name, env=self.env(name))
        self.mini.masters.wait_ready(masters, timeout=60)
        for n in self.nodes:
            if n.kind == "tserver":
                self.mini.start_tserver(n.name, wait=False, env=self.env(n.name))
        for n in self.nodes:
            if n.kind == "tserver":
                self.mini.wait_tserver(n.name, timeout=60)
        self.mini.wait_registered(timeout=60)

    def stop(self) -> None:
        """Every process gone (resumed first: a stopped one would sit out SIGTERM's grace),
        then the network."""
        for n in self.nodes:
            self.signal(n.name, signal.SIGCONT)
        try:
            self.mini.stop()
        finally:
            self.lab.down()
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)

    # --- one node ----------------------------------------------------------------------------

    def disk_file(self, name: str) -> Path:
        return self.faults / f"{name}.disk"

    def clock_file(self, name: str) -> Path:
        return self.faults / f"{name}.clock"

    def env(self, name: str) -> dict[str, str]:
        clock = self.clock_file(name) if self.clocks else None
        return node_env(self.site, self.lab.namespaces[name], self.disk_file(name), clock, ROOT)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def proc(self, name: str) -> subprocess.Popen[bytes] | None:
        if self.node(name).kind == "master":
            return self.mini.masters.masters[name].proc
        return self.mini.tservers[name].proc

    def alive(self, name: str) -> bool:
        p = self.proc(name)
        return p is not None and p.poll() is None

    def signal(self, name: str, sig: int) -> None:
        p = self.proc(name)
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        p = self.proc(name)
        if p is not None:
            p.wait(timeout=30)

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start `name` again if it is not running (same data, addresses and environment)."""
        if self.alive(name):
            return
        if self.node(name).kind == "master":
            self.mini.masters.start_master(name, env=self.env(name))
            self.mini.masters.wait_ready([name], timeout=timeout)
        else:
            self.mini.start_tserver(name, wait=False, env=self.env(name))
            self.mini.wait_tserver(name, timeout=timeout)

    # --- what the cluster says ---------------------------------------------------------------

    @property
    def master_addresses(self) -> list[str]:
        return self.mini.master_addresses

    def master_name(self, address: str) -> str:
        return self.mini.masters.by_address(address).name

    def tserver_name(self, uuid: str) -> str:
        return self.mini.tserver_by_uuid(uuid).name

    def master_leader(self, timeout: float = 5.0) -> str | None:
        try:
            address, _ = self.mini.masters.leader(timeout=timeout)
        except TimeoutError:
            return None
        return self.master_name(address)

    def master_tables(self, name: str, timeout: float = 5.0) -> dict[str, str]:
        """{table id: name} of the live tables in `name`'s own memory (its /tables page: no
        leadership check, so a follower answers with what it has applied)."""
        m = self.mini.masters.masters[name]
        port = m.http_address.rpartition(":")[2]
        url = f"http://{self.lab.ips[name]}:{port}/tables"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            html = r.read().decode()
        return {
            tid: tname
            for tid, tname, state in _ROW.findall(html)
            if state not in ("REMOVED", "DELETED")
        }
