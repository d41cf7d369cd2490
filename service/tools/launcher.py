"""Server processes on loopback: how every launcher starts, waits for and stops one.

Two launchers start masters and tablet servers, both from a `cluster_spec.ClusterSpec` and with
its one command line per kind: the test clusters (`service.testing.cluster.Cluster`, which
`MasterCluster` and `MiniCluster` are built on, used by the tests, the benchmarks, the fault
campaign and the fuzzer) and the user's local cluster (`local_cluster`, behind `tessera
cluster`). A third, `service.testing.demo_cluster`, starts the KV demo's nodes. They differ in
what they keep (a test cluster holds a `ServerProcess` per server and dies with the test; a
local cluster records pids in cluster.json and outlives the command that started it) but not
in the mechanics, which live here once. The module sits in service.tools so every launcher can
import it: service.testing may import the tools (docs/design/layers.md#R3), and nothing here
imports service.testing.

Theory of operation
-------------------
Command line. A server is `python -m MODULE --conf TOML --set key=value ... --ready-file F`
(`server_args`); a secured one gets its certificate as `security.*` settings
(`security_overrides`), an insecure one `security.mode=insecure`. Which settings a master or a
tablet server gets is `cluster_spec`'s.

The record. `ServerProcess` is one server of a launcher that holds its processes: name, kind,
data dir, log, ready file, address and uuid (known before the start or read from the ready
file), and the current `Launched` process.

Spawning. `spawn` appends the process's stdout and stderr to its log, created owner-only
(0600, like everything a server writes: `service.common.private_files`), after a
`--- <time> <command>` header, and remembers where this run's output starts so an error quotes
this run only. `detach=True` is for servers that must outlive their launcher: stdin from
/dev/null and a session of their own, so neither a Ctrl-C nor a closing terminal reaches them.
Every child is registered by pid, so `pid_alive` judges (and reaps) it through its Popen.

Readiness. A server writes its ready file (JSON: address, uuid, status-page address) once it
serves. `wait_ready` polls for it; a process that exits first, or is not serving by the
deadline, is a `LaunchError` quoting the end of its log (`ServerNotReady`, also a
TimeoutError, for the deadline).

Stopping. `terminate_all` sends SIGTERM to every process, waits up to one grace period for
all of them together, then SIGKILLs the rest and waits until they are gone. It takes Popen
objects (a test's children) or bare pids (a recorded server that passed the caller's pid-reuse
check: this module never decides whose a pid is).

Ports. Servers whose addresses must be known before they start (a master group's
`master_addresses`, the KV demo's peers) get them from `free_ports`.
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
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from service.common.pki import IdentityFiles
from service.common.tls import SecuritySettings

__all__ = ["CONF_DIR", "ROOT", "LaunchError", "Launched", "ServerNotReady", "ServerProcess"]
__all__ += ["StopOnExit"]
__all__ += ["check_alive", "free_ports", "kill", "log_tail", "pid_alive", "pid_cmdline"]
__all__ += ["security_overrides"]
__all__ += ["server_args", "spawn", "terminate_all", "toml_list", "tserver_uuid", "wait_ready"]

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"


class LaunchError(RuntimeError):
    """A server exited before it served, or serves somewhere else than expected; the message
    quotes the end of its log."""


class ServerNotReady(LaunchError, TimeoutError):
    """A server did not write its ready file in time."""


# --- the command line ------------------------------------------------------------------------


def toml_list(items: Iterable[str]) -> str:
    """`["a", "b"]`: a list of strings as a `--set` value (`master_addresses`)."""
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def server_args(
    module: str,
    conf: Path | str,
    settings: Iterable[str],
    ready: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a server: `python -m MODULE --conf CONF --set S ... EXTRA
    --ready-file READY`. Later `--set`s of one key win, so callers put overrides last."""
    args = [sys.executable, "-m", module, "--conf", str(conf)]
    for s in settings:
        args += ["--set", s]
    return [*args, *extra, "--ready-file", str(ready)]


def security_overrides(identity: IdentityFiles | None) -> list[str]:
    """`--set`s giving a server its identity: the certificate, key and CA files of
    `identity` (one issued from the cluster's CA, or a credentials directory's, a join
    credential say), or `security.mode=insecure` for an insecure cluster (None)."""
    if identity is None:
        return ["security.mode=insecure"]
    return SecuritySettings.from_files(identity).overrides()


def tserver_uuid(data_dir: Path, known: str = "") -> str:
    """The uuid a tablet server has (`known`, or its data dir's instance file) or, for an empty
    data dir, a new one it will take from the certificate issued for it."""
    if known:
        return known
    try:
        return str(json.loads((data_dir / "instance").read_text())["uuid"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"ts-{uuidlib.uuid4().hex}"


# --- spawning and readiness ------------------------------------------------------------------

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Servers started by this process, kept so they are reaped (polled), not left as zombies."""


@dataclass
class Launched:
    """A server process just started: its name (for messages), process, log, ready file and
    where this run's output starts in the log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready: Path
    log_offset: int

    def failure(self, problem: str) -> str:
        tail = log_tail(self.log, self.log_offset)
        return f"{self.name} (pid {self.proc.pid}) {problem}; the end of {self.log}:\n{tail}"


@dataclass
class ServerProcess:
    """One server of a launcher that holds its processes (a test cluster, the KV demo): what
    it is, where it keeps its files, and its current process, if it was started.

    `address` is known before the start for a server that must bind a given port (a master, a
    KV node) and taken from the ready file otherwise (a tablet server binds port 0 the first
    time and the same port on a restart); `uuid` likewise (a master's follows from its
    address, a tablet server's from its data dir). A server restarted on the same record comes
    back with the same data, address and uuid."""

    name: str
    kind: str
    """"master", "tserver" or "kv" (a KV demo node)."""
    data_dir: Path
    log: Path
    ready: Path
    address: str = ""
    uuid: str = ""
    launched: Launched | None = None
    http_address: str = ""
    """host:port of its status pages and /metrics, from its ready file ("" if not serving)."""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launched.proc if self.launched is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def served(self, info: Mapping[str, Any]) -> None:
        """Take what the ready file says: the address bound, the uuid, the status pages."""
        self.address = str(info.get("address", self.address))
        self.uuid = str(info.get("uuid", self.uuid))
        self.http_address = str(info.get("http_address") or "")


def spawn(
    name: str,
    args: Sequence[str],
    *,
    log: Path,
    ready: Path,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    detach: bool = False,
) -> Launched:
    """Start `args` (from `server_args`) with its output appended to `log` (owner-only), after
    removing a stale ready file. `env` adds variables (failpoints); `detach` (module
    docstring) for servers that outlive their launcher."""
    ready.unlink(missing_ok=True)
    path = os.environ.get("PYTHONPATH")
    full_env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    full_env.update(env or {})
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with open(fd, "ab") as logf:
        offset = logf.tell()
        logf.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL if detach else None,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=full_env,
            start_new_session=detach,
        )
    _CHILDREN[proc.pid] = proc
    return Launched(name, proc, log, ready, offset)


def log_tail(path: Path, offset: int = 0, limit: int = 3000) -> str:
    """The end of `path` from `offset` on, at most `limit` characters, for an error message."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")[-limit:].rstrip()
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"
    return text or "(the log is empty)"


def check_alive(launched: Iterable[Launched]) -> None:
    """LaunchError, quoting its log, for the first of `launched` that has exited."""
    for lc in launched:
        code = lc.proc.poll()
        if code is not None:
            raise LaunchError(lc.failure(f"exited with code {code}"))


def wait_ready(
    launched: Launched, deadline: float, timeout: float, expect_address: str | None = None
) -> dict[str, Any]:
    """Wait until `launched` wrote its ready file (before the monotonic `deadline`; `timeout`
    is what the message calls it) and return what it says. `expect_address`: the address the
    server was told to bind (a master, a KV node), refused if it serves elsewhere."""
    while not launched.ready.exists():
        check_alive([launched])
        if time.monotonic() > deadline:
            raise ServerNotReady(launched.failure(f"is not serving after {timeout:g}s"))
        time.sleep(0.02)
    info: dict[str, Any] = json.loads(launched.ready.read_text())
    if expect_address is not None and info["address"] != expect_address:
        problem = f"serves on {info['address']}, expected {expect_address}"
        raise LaunchError(launched.failure(problem))
    return info


# --- stopping --------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited. For a child of this process its Popen
    decides (and reaps it): a child's command line reads empty while it is exiting, before
    it has become a zombie, so the command line cannot tell that it is gone."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    if Path("/proc/self").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie has exited
    try:  # no /proc (macOS)
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and is someone else's
    return True


def pid_cmdline(pid: int) -> str:
    """The command line of `pid` ("" if there is none: no such process, or an exiting one)."""
    if Path("/proc/self").exists():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return ""
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()
    try:  # no /proc (macOS)
        out = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True)
    except OSError:
        return ""
    return out.stdout.decode(errors="replace").strip()


def _signal(target: subprocess.Popen[bytes] | int, sig: int) -> None:
    if isinstance(target, int):
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)
    elif target.poll() is None:
        target.send_signal(sig)


def _alive(target: subprocess.Popen[bytes] | int) -> bool:
    return pid_alive(target) if isinstance(target, int) else target.poll() is None


def terminate_all(
    targets: Iterable[subprocess.Popen[bytes] | int], grace: float = 10.0
) -> set[int]:
    """SIGTERM every live process, wait up to `grace` seconds in all, SIGKILL the rest and wait
    until they are gone; the pids that needed SIGKILL. Bare pids must have passed the caller's
    pid-reuse check."""
    left = [t for t in targets if _alive(t)]
    for t in left:
        _signal(t, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while True:
        left = [t for t in left if _alive(t)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for t in left:
        _signal(t, signal.SIGKILL)
    while any(_alive(t) for t in left):
        time.sleep(0.02)
    return {t if isinstance(t, int) else t.pid for t in left}


def kill(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to a live `proc` (SIGKILL: a crash) and wait for it to exit."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=30)


class StopOnExit:
    """A group of processes used as a context manager: `start()` on entry, and `stop()` on exit
    and when `start()` fails half-way, so a test never leaves a process running."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- ports -----------------------------------------------------------------------------------

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
