"""A local Tessera cluster of real background processes (`tessera cluster up|status|down`).

Theory of operation
-------------------
`up(dir)` starts N masters and M tablet servers as detached processes and returns; they keep
running after the command that started them exits, until `down(dir)`. Everything about the
cluster lives under DIR:

    DIR/cluster.json        the record: each server's name, address, pid, uuid, data dir, log,
                            the conf files and --set overrides (tmp + rename: never half a file)
    DIR/data/<name>/        the server's data_dir (WAL, consensus metadata, instance file), and
                            its working directory
    DIR/logs/<name>.log     its stdout and stderr, appended to across restarts
    DIR/run/<name>.ready    the ready file it writes once it serves ({"address","pid","uuid"})
    DIR/pki/ca/             the cluster's CA (ca.pem, ca.key) and every identity it issued:
                            read by this command only, named to no server
    DIR/pki/<name>/         the server's own credentials (ca.pem, cert.pem, key.pem), plus the
                            CA's key (ca.key) for a master only
    DIR/credentials/        the admin's credentials, which every `--dir DIR` command uses

Each server is given its own directories and files only, and a tablet server none that holds
or contains the CA's key (docs/design/security.md#R14): `tessera security provision` lays
out a deployment the same way. All of it is owner-only (directories 0700, files 0600). A
directory made before this layout (the CA's files directly in DIR/pki) is moved into it on
the next `up`.

Fixed master ports. Masters bootstrap sys.catalog from `master_addresses` and a master's uuid is
derived from its address (service/master/master.py), so every master must know every master's
address before any of them starts, and must come back at the same address to reopen its data.
`up` picks free loopback ports once, records them, and reuses them on every restart. Tablet
servers bind `127.0.0.1:0` the first time (their uuid lives in their data_dir, not in their
address); the address they got is recorded and reused on restart, because their replicas' Raft
configurations and the masters' registry name it.

Processes. The cluster is a `cluster_spec.ClusterSpec` (`ClusterRecord.spec`: the recorded
counts, conf files and overrides, the conf files' timing), and each server's command line is
`ClusterSpec.command`'s, the one the test clusters use; owner-only logs, ready files,
SIGTERM-grace-SIGKILL and free ports are `launcher`'s. What differs here, on purpose: servers
are started detached and recorded in cluster.json, and only a pid that passes the pid-reuse
check below is ever signalled, so `down` never kills what it did not start. `local_servers`
acts on one recorded server with this module's public `spawn_server`, `wait_server_ready` and
`save_record`.

Detached sessions. Servers run in a session of their own (`start_new_session=True`), read
/dev/null and write to their log file: a Ctrl-C in the terminal that ran `up`, or that terminal
closing, does not reach them, and no pipe ties them to the command that started them.

The pid-reuse check. cluster.json may outlive its processes by days (a reboot, a crash), and the
kernel hands out pids again. Before it counts a recorded pid as running, or signals it, this
module checks that the pid is still a process whose command line runs `service.master` or
`service.tserver` with this server's data_dir; anything else belongs to someone else now and the
server counts as not running. A zombie counts as gone; a child of this very process (tests run
`up` and `down` in one process) is judged and reaped by its Popen.

Readiness. Configs are loaded before anything starts (a bad `--set` names the setting). `up`
returns once every process wrote its ready file, a master leader serves and every tablet server
is live at it (`healthcheck.probe_masters`). If anything fails or times out, the processes it
started are stopped again and the error quotes the end of the failed process's log: `up` leaves
a serving cluster or nothing running. Status pages (`http_bind`, when the config has it) take a
free port on each start; cluster.json and `status` name them.

`down` stops tablet servers first, then masters (SIGTERM, a grace period, then SIGKILL), so no
tablet server is left heartbeating to masters that are gone. RPCs use grpc.aio; the public
functions are synchronous (`asyncio.run`): they block on processes and serve the command line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from service.client.credentials import find_credentials
from service.common.config import MasterConfig, TServerConfig, load_config, parse_override
from service.common.errors import FailedPrecondition, InvalidArgument
from service.common.http_status import requires_client_certificates
from service.common.pki import ClusterPki, Identity, IdentityFiles, ca_key_file, identity_of
from service.common.tls import Credentials
from service.master.master import master_uuid
from service.tools import launcher
from service.tools.cluster_spec import MANAGED_KEYS, MASTER_CONF, MODULES, TSERVER_CONF, ClusterSpec
from service.tools.healthcheck import ClusterStatus, ServerStatus, probe_masters
from service.tools.launcher import Launched, LaunchError, free_ports

__all__ = ["CLUSTER_FILE", "ClusterRecord", "LocalClusterError", "ServerRecord", "Stopped"]
__all__ += ["down", "is_running", "load_record", "master_addresses", "status", "up"]
__all__ += ["add_master", "http_scheme", "remove_master"]
__all__ += ["Launch", "save_record", "spawn_server", "wait_server_ready"]

CLUSTER_FILE = "cluster.json"
FORMAT = 1
DEFAULT_MASTER_CONF = MASTER_CONF
DEFAULT_TSERVER_CONF = TSERVER_CONF

Progress = Callable[[str], None]


class LocalClusterError(FailedPrecondition):
    """The cluster directory is not what the command expects, or the cluster failed to start."""


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """One server as cluster.json records it. `pid` is None once `down` stopped it; `address`
    is "" for a tablet server that never started; `uuid` is "" until it first served."""

    name: str
    kind: str  # "master" | "tserver"
    address: str
    data_dir: str
    log: str
    pid: int | None = None
    uuid: str = ""
    http_address: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """The content of DIR/cluster.json (`dir` itself is where it was read from)."""

    dir: Path
    master_conf: str
    tserver_conf: str
    master_overrides: tuple[str, ...] = ()
    tserver_overrides: tuple[str, ...] = ()
    masters: tuple[ServerRecord, ...] = ()
    tservers: tuple[ServerRecord, ...] = ()

    @property
    def servers(self) -> tuple[ServerRecord, ...]:
        return self.masters + self.tservers

    @property
    def master_addresses(self) -> list[str]:
        return [m.address for m in self.masters]

    @property
    def spec(self) -> ClusterSpec:
        """The cluster as a `ClusterSpec`: what its servers are started with (the conf
        files' timing; insecure if an override says so, for comparison runs)."""
        insecure = any(
            s.replace(" ", "") == "security.mode=insecure"
            for s in (*self.master_overrides, *self.tserver_overrides)
        )
        return ClusterSpec(
            self.dir,
            masters=len(self.masters),
            tservers=len(self.tservers),
            security="insecure" if insecure else "secure",
            timing="conf",
            master_overrides=self.master_overrides,
            tserver_overrides=self.tserver_overrides,
            master_conf=Path(self.master_conf),
            tserver_conf=Path(self.tserver_conf),
        )

    def with_servers(self, servers: Sequence[ServerRecord]) -> ClusterRecord:
        """This record with `servers` replacing the recorded ones of the same names."""
        by_name = {s.name: s for s in servers}
        return replace(
            self,
            masters=tuple(by_name.get(s.name, s) for s in self.masters),
            tservers=tuple(by_name.get(s.name, s) for s in self.tservers),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "conf": {"master": self.master_conf, "tserver": self.tserver_conf},
            "overrides": {
                "master": list(self.master_overrides),
                "tserver": list(self.tserver_overrides),
            },
            "masters": [dataclasses.asdict(s) for s in self.masters],
            "tservers": [dataclasses.asdict(s) for s in self.tservers],
        }

    @classmethod
    def from_json(cls, dir: Path, data: dict[str, Any]) -> ClusterRecord:
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        return cls(
            dir=dir,
            master_conf=data["conf"]["master"],
            tserver_conf=data["conf"]["tserver"],
            master_overrides=tuple(data["overrides"]["master"]),
            tserver_overrides=tuple(data["overrides"]["tserver"]),
            masters=tuple(ServerRecord(**s) for s in data["masters"]),
            tservers=tuple(ServerRecord(**s) for s in data["tservers"]),
        )


# --- the record on disk ----------------------------------------------------------------------


def load_record(dir: Path | str) -> ClusterRecord:
    """DIR/cluster.json, or LocalClusterError saying what DIR should hold."""
    dir = Path(dir).resolve()
    path = dir / CLUSTER_FILE
    if not path.is_file():
        raise LocalClusterError(
            f"no cluster in {dir}: expected {path}, written by `tessera cluster up --dir {dir}`"
        )
    try:
        return ClusterRecord.from_json(dir, json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LocalClusterError(f"{path} is not a cluster record: {e}") from None


def save_record(record: ClusterRecord) -> None:
    """Write DIR/cluster.json (tmp + rename: never half a file)."""
    path = record.dir / CLUSTER_FILE
    tmp = path.with_name(CLUSTER_FILE + ".tmp")
    with tmp.open("w") as f:
        json.dump(record.to_json(), f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def master_addresses(dir: Path | str) -> list[str]:
    """The masters' addresses of the cluster in DIR, for commands given `--dir` not `--masters`."""
    return load_record(dir).master_addresses


# --- processes -------------------------------------------------------------------------------


def is_running(server: ServerRecord) -> bool:
    """Whether the recorded pid is still this server (the pid-reuse check, see the docstring)."""
    if server.pid is None or not launcher.pid_alive(server.pid):
        return False
    cmd = launcher.pid_cmdline(server.pid) + " "
    return f" {MODULES[server.kind]} " in cmd and f" data_dir={server.data_dir} " in cmd


@dataclass
class Launch:
    """A server started detached: its record (completed from the ready file) and its process."""

    server: ServerRecord
    launched: Launched


def _settings(record: ClusterRecord, server: ServerRecord) -> tuple[Path, list[str]]:
    """The conf file and the `--set`s `server` runs with (`ClusterSpec.settings`), its
    identity from its own directory (module docstring)."""
    spec = record.spec
    return spec.conf(server.kind), spec.settings(
        server.kind,
        data_dir=server.data_dir,
        address=server.address,
        master_addresses=record.master_addresses,
        identity=IdentityFiles.in_dir(_identity_dir(record, server)),
    )


def _pki(record: ClusterRecord) -> ClusterPki:
    """The cluster's CA in DIR/pki/ca, created with the cluster (module docstring). A CA kept
    directly in DIR/pki (the layout before each server had its own directory) moves there."""
    root = record.dir / "pki"
    store = root / "ca"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    if (root / "ca.key").is_file() and not (store / "ca.key").exists():
        store.mkdir(mode=0o700, exist_ok=True)
        for f in list(root.iterdir()):
            if f.is_file():
                f.rename(store / f.name)
    return ClusterPki(store)


def _identity_dir(record: ClusterRecord, server: ServerRecord) -> Path:
    """Where `server`'s own credentials live: DIR/pki/<name>."""
    return record.dir / "pki" / server.name


def _held_identity(files: IdentityFiles) -> Identity | None:
    """The identity of the certificate in a credentials directory, if it has a usable one."""
    if not (files.cert_file.is_file() and files.key_file.is_file() and files.ca_file.is_file()):
        return None
    try:
        return identity_of(files.cert_file.read_bytes())
    except (OSError, InvalidArgument):
        return None


def _issue_identity(record: ClusterRecord, server: ServerRecord) -> None:
    """Give `server` its certificate from the cluster's CA in its own directory: a master's
    names its address-derived uuid (and the directory gets the CA's key), a tablet server's
    the uuid in its data dir, or the one it was issued before it first started, or a new one
    it takes when it formats its data dir. A directory that already holds the right identity
    is kept as it is (a server may have renewed its certificate there)."""
    files = IdentityFiles.in_dir(_identity_dir(record, server))
    held = _held_identity(files)
    if server.kind == "master":
        name: str = master_uuid(server.address)
    else:
        data_dir = Path(server.data_dir)
        known = server.uuid
        if not known and not (data_dir / "instance").exists() and held is not None:
            known = held.name if held.role == "tserver" else ""
        name = launcher.tserver_uuid(data_dir, known)
    directory = files.ca_file.parent
    ca_key = ca_key_file(files.ca_file)
    if held != Identity(server.kind, name) or (server.kind == "master" and not ca_key.exists()):
        _pki(record).export(server.kind, name, directory)
    if server.kind != "master":
        ca_key.unlink(missing_ok=True)  # never beside a tablet server's certificate
    os.chmod(directory, 0o700)


def credentials(dir: Path | str) -> Credentials | None:
    """The admin credentials of the cluster in DIR (DIR/credentials), None if it is insecure."""
    return find_credentials(None, Path(dir).resolve())


def http_scheme(record: ClusterRecord, server: ServerRecord) -> str:
    """The scheme of `server`'s status pages: https if they need a client certificate (its
    `http_auth`, for the loopback address `up` binds them to), else http
    (docs/design/security.md#R13)."""
    cls = MasterConfig if server.kind == "master" else TServerConfig
    conf, settings = _settings(record, server)
    try:
        config = load_config(cls, conf, dict(parse_override(s) for s in settings))
    except InvalidArgument:
        return "http"
    auth = getattr(config, "http_auth", "none")
    return "https" if requires_client_certificates("127.0.0.1:0", auth) else "http"


def _check_config(record: ClusterRecord) -> None:
    """Load each kind's config as its servers will: a bad conf file or `--set` is refused here,
    naming the setting (ConfigError, an InvalidArgument), instead of in a server's log."""
    for group, cls in ((record.masters, MasterConfig), (record.tservers, TServerConfig)):
        if group:
            conf, settings = _settings(record, group[0])
            load_config(cls, conf, dict(parse_override(s) for s in settings))


def spawn_server(record: ClusterRecord, server: ServerRecord, *, join: bool = False) -> Launch:
    """Start `server` detached (it outlives this command), in its data dir: its working
    directory holds nothing of another server's, nor the CA (module docstring). `join`: a
    master joining the running group. Its command line is `ClusterSpec.command`'s, the one
    the test clusters start their servers with."""
    spec = record.spec
    if spec.issues_identity(server.kind):
        _issue_identity(record, server)
    ready = record.dir / "run" / f"{server.name}.ready"
    args = spec.command(
        server.kind,
        data_dir=server.data_dir,
        address=server.address,
        master_addresses=record.master_addresses,
        identity=IdentityFiles.in_dir(_identity_dir(record, server)),
        ready=ready,
        join=join,
    )
    data_dir = Path(server.data_dir)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    launched = launcher.spawn(
        server.name, args, log=Path(server.log), ready=ready, cwd=data_dir, detach=True
    )
    return Launch(replace(server, pid=launched.proc.pid), launched)


def _check_alive(launches: Iterable[Launch]) -> None:
    try:
        launcher.check_alive(lc.launched for lc in launches)
    except LaunchError as e:
        raise LocalClusterError(str(e)) from None


def wait_server_ready(launch: Launch, deadline: float, timeout: float) -> None:
    """Wait for the ready file (before the monotonic `deadline`) and fold what it says
    (address, uuid, http) into the launch; LocalClusterError quoting the log if it fails."""
    s = launch.server
    expect = s.address if s.kind == "master" else None
    try:
        info = launcher.wait_ready(launch.launched, deadline, timeout, expect_address=expect)
    except LaunchError as e:
        raise LocalClusterError(str(e)) from None
    launch.server = replace(
        s, address=info["address"], uuid=info["uuid"], http_address=info.get("http_address")
    )


# --- up --------------------------------------------------------------------------------------


def _check_overrides(overrides: Sequence[str]) -> tuple[str, ...]:
    for text in overrides:
        key, _ = parse_override(text)
        if key in MANAGED_KEYS:
            raise InvalidArgument(f"{key}: set by `tessera cluster up` itself, cannot override")
    return tuple(overrides)


def _new_record(spec: ClusterSpec) -> ClusterRecord:
    """The record of a new cluster of `spec` in `spec.base`: its servers' names, master ports
    (picked once, kept for good) and files (module docstring)."""
    dir = spec.base

    def server(kind: str, name: str, address: str) -> ServerRecord:
        data, log = dir / "data" / name, dir / "logs" / f"{name}.log"
        return ServerRecord(name, kind, address, str(data), str(log))

    ports = free_ports(spec.masters)
    return ClusterRecord(
        dir=dir,
        master_conf=str(spec.master_conf.resolve()),
        tserver_conf=str(spec.tserver_conf.resolve()),
        master_overrides=spec.master_overrides,
        tserver_overrides=spec.tserver_overrides,
        masters=tuple(
            server("master", f"master-{i}", f"127.0.0.1:{p}") for i, p in enumerate(ports, 1)
        ),
        tservers=tuple(server("tserver", f"tserver-{i}", "") for i in range(1, spec.tservers + 1)),
    )


def _prepare(
    dir: Path,
    masters: int | None,
    tservers: int | None,
    master_conf: Path | str | None,
    tserver_conf: Path | str | None,
) -> ClusterRecord:
    """The record to start from: the stopped cluster in DIR, or a new one for an empty DIR."""
    if not (dir / CLUSTER_FILE).exists():
        if dir.exists() and (not dir.is_dir() or any(dir.iterdir())):
            raise LocalClusterError(
                f"{dir} is not empty and holds no {CLUSTER_FILE}: expected a new or empty"
                " directory, or one made by `tessera cluster up`"
            )
        spec = ClusterSpec(
            dir,
            masters=3 if masters is None else masters,
            tservers=3 if tservers is None else tservers,
            timing="conf",
            master_conf=Path(master_conf or DEFAULT_MASTER_CONF),
            tserver_conf=Path(tserver_conf or DEFAULT_TSERVER_CONF),
        )
        return _new_record(spec)
    record = load_record(dir)
    running = [f"{s.name} (pid {s.pid})" for s in record.servers if is_running(s)]
    if running:
        raise LocalClusterError(
            f"a cluster is already running in {dir}: {', '.join(running)};"
            f" stop it first with `tessera cluster down --dir {dir}`"
        )
    for asked, have, what in (
        (masters, len(record.masters), "masters"),
        (tservers, len(record.tservers), "tablet servers"),
    ):
        if asked is not None and asked != have:
            raise LocalClusterError(
                f"{dir} holds a cluster of {have} {what}, not {asked}: restart it as it is,"
                " or use a new directory"
            )
    if master_conf is not None:
        record = replace(record, master_conf=str(Path(master_conf).resolve()))
    if tserver_conf is not None:
        record = replace(record, tserver_conf=str(Path(tserver_conf).resolve()))
    return record


def up(
    dir: Path | str,
    masters: int | None = None,
    tservers: int | None = None,
    *,
    master_conf: Path | str | None = None,
    tserver_conf: Path | str | None = None,
    master_overrides: Sequence[str] | None = None,
    tserver_overrides: Sequence[str] | None = None,
    timeout: float = 60.0,
    progress: Progress | None = None,
) -> ClusterRecord:
    """Start the cluster in DIR (3 masters and 3 tablet servers for a new DIR), or restart the
    stopped one recorded there with the same servers, ports and data. Returns once a master
    leader serves and every tablet server is live at it; raises LocalClusterError otherwise,
    having stopped whatever it started.

    Conf files and overrides ("key=value", as `--set`) default to the repository's conf/ and
    none for a new cluster, and to the recorded ones on a restart (given ones replace them).
    On a restart `masters`/`tservers` must be None or the recorded counts.
    """
    dir = Path(dir).resolve()
    say = progress or (lambda _line: None)
    record = _prepare(dir, masters, tservers, master_conf, tserver_conf)
    if master_overrides is not None:
        record = replace(record, master_overrides=_check_overrides(master_overrides))
    if tserver_overrides is not None:
        record = replace(record, tserver_overrides=_check_overrides(tserver_overrides))
    _check_config(record)
    for sub in ("data", "logs", "run"):
        (dir / sub).mkdir(parents=True, exist_ok=True)
    if record.spec.secure:
        # The admin's credentials, where every `--dir DIR` command finds them.
        _pki(record).export("admin", "admin", dir / "credentials")

    launches: list[Launch] = []
    try:
        for server in record.servers:
            launches.append(spawn_server(record, server))
        record = record.with_servers([launch.server for launch in launches])
        save_record(record)  # pids on disk at once: `down` can clean up even if this command dies
        deadline = time.monotonic() + timeout
        for launch in launches:
            wait_server_ready(launch, deadline, timeout)
            s = launch.server
            say(f"starting {s.name} ... ok (pid {s.pid}, {s.address})")
        record = record.with_servers([launch.server for launch in launches])
        save_record(record)
        leader = asyncio.run(_wait_serving(record, launches, deadline, timeout))
        say(f"waiting for a master leader ... ok ({leader})")
        if record.tservers:
            say(f"waiting for {len(record.tservers)} tablet server(s) to register ... ok")
    except BaseException:
        launcher.terminate_all(
            [lc.server.pid for lc in launches if lc.server.pid is not None], grace=5.0
        )
        save_record(record.with_servers([replace(lc.server, pid=None) for lc in launches]))
        raise
    return record


async def _wait_serving(
    record: ClusterRecord, launches: list[Launch], deadline: float, timeout: float
) -> str:
    """Wait for a serving leader at which every tablet server is live; its address."""
    expected = {s.uuid: s.name for s in record.tservers}
    while True:
        _check_alive(launches)
        probe = await probe_masters(
            record.master_addresses, rpc_timeout=1.0, credentials=credentials(record.dir)
        )
        live = {t.uuid for t in probe.tservers if t.live}
        missing = [name for uuid, name in expected.items() if uuid not in live]
        if probe.leader is not None and not missing:
            return probe.leader
        if time.monotonic() > deadline:
            if probe.leader is None:
                tried = "; ".join(f"{m.address}: {m.error or m.role}" for m in probe.masters)
                raise LocalClusterError(f"no master leader serving after {timeout:g}s ({tried})")
            raise LocalClusterError(
                f"tablet server(s) {', '.join(missing)} not registered live at the leader"
                f" {probe.leader} after {timeout:g}s (see their logs in {record.dir / 'logs'})"
            )
        await asyncio.sleep(0.1)


# --- master membership -----------------------------------------------------------------------


def add_master(
    dir: Path | str, *, timeout: float = 60.0, progress: Progress | None = None
) -> ServerRecord:
    """Start one more master for the running cluster in DIR and add it to the group.

    The new master gets the next free name and a free port, starts with `join_existing` and an
    empty data dir, and AddMaster makes it a voter once it has caught up (`master_membership`).
    It is recorded in cluster.json as soon as it runs, so `down` stops it even if the AddMaster
    fails; on failure it is stopped and forgotten again."""
    from service.client.client import TesseraClient

    record = load_record(dir)
    say = progress or (lambda _line: None)
    if not any(is_running(m) for m in record.masters):
        raise LocalClusterError(
            f"no master of the cluster in {record.dir} is running: start it with "
            f"`tessera cluster up --dir {record.dir}`"
        )
    taken = {m.name for m in record.masters}
    name = next(f"master-{i}" for i in range(1, len(taken) + 2) if f"master-{i}" not in taken)
    (port,) = free_ports(1)
    data_dir = record.dir / "data" / name
    if data_dir.exists():
        shutil.rmtree(data_dir)  # left by a master removed earlier: a new master starts empty
    server = ServerRecord(
        name, "master", f"127.0.0.1:{port}", str(data_dir), str(record.dir / "logs" / f"{name}.log")
    )
    grown = replace(record, masters=(*record.masters, server))
    launch = spawn_server(grown, server, join=True)
    save_record(grown.with_servers([launch.server]))
    try:
        wait_server_ready(launch, time.monotonic() + timeout, timeout)
        say(f"starting {name} ... ok (pid {launch.server.pid}, {launch.server.address})")

        async def add() -> None:
            async with TesseraClient(
                record.master_addresses, timeout=timeout, credentials=credentials(record.dir)
            ) as client:
                await client.add_master(launch.server.address)

        asyncio.run(add())
        say(f"adding {name} to the group ... ok (a voter, caught up)")
    except BaseException:
        if launch.server.pid is not None:
            launcher.terminate_all([launch.server.pid], grace=5.0)
        save_record(record)
        raise
    save_record(grown.with_servers([launch.server]))
    return launch.server


def remove_master(
    dir: Path | str,
    master: str,
    *,
    timeout: float = 60.0,
    grace: float = 10.0,
    progress: Progress | None = None,
) -> ServerRecord:
    """Remove a master (its name, address or uuid) of the cluster in DIR from the group, then
    stop its process, delete its data dir (it can never rejoin with that data) and drop it from
    cluster.json."""
    from service.client.client import TesseraClient

    record = load_record(dir)
    say = progress or (lambda _line: None)
    found = [m for m in record.masters if master in (m.name, m.address, m.uuid)]
    if not found:
        names = ", ".join(f"{m.name} ({m.address})" for m in record.masters)
        raise LocalClusterError(f"no master {master!r} in the cluster in {record.dir}: {names}")
    server = found[0]

    async def remove() -> None:
        async with TesseraClient(
            record.master_addresses, timeout=timeout, credentials=credentials(record.dir)
        ) as client:
            await client.remove_master(server.address)

    asyncio.run(remove())
    say(f"removing {server.name} from the group ... ok")
    if is_running(server) and server.pid is not None:
        outcome = "killed" if launcher.terminate_all([server.pid], grace) else "stopped"
        say(f"stopping {server.name} ... {outcome}")
    shutil.rmtree(server.data_dir, ignore_errors=True)
    shutil.rmtree(_identity_dir(record, server), ignore_errors=True)  # it held the CA's key
    save_record(replace(record, masters=tuple(m for m in record.masters if m.name != server.name)))
    return server


# --- status ----------------------------------------------------------------------------------


def status(dir: Path | str, rpc_timeout: float = 2.0) -> ClusterStatus:
    """Every recorded server: is its process running, what do the masters say about it. A dead
    process or an unreachable master is reported in `problems`, not raised."""
    record = load_record(dir)
    running = {s.name: is_running(s) for s in record.servers}
    probe = asyncio.run(
        probe_masters(record.master_addresses, rpc_timeout, credentials(record.dir))
    )
    views = {v.address: v for v in probe.masters}
    registered = {t.uuid: t for t in probe.tservers}
    out: list[ServerStatus] = []
    problems: list[str] = []
    for s in record.servers:
        st = ServerStatus(
            s.name, s.kind, s.address, s.pid, running[s.name], s.uuid, http_address=s.http_address
        )
        if not st.running:
            problems.append(f"{s.name}: not running" + (f" (pid {s.pid} gone)" if s.pid else ""))
        if s.kind == "master":
            v = views[s.address]
            st = replace(st, role=v.role, term=v.term, error=v.error)
            if v.error and st.running:
                problems.append(f"{s.name}: {v.error}")
        elif probe.leader is not None:
            t = registered.get(s.uuid)
            st = replace(st, live=t.live if t else False)
            if st.running and not st.live:
                problems.append(f"{s.name}: not live at the leader {probe.leader}")
        out.append(st)
    if probe.leader is None:
        problems.append(f"no master leader serving (asked {', '.join(record.master_addresses)})")
    return ClusterStatus(str(record.dir), tuple(out), probe.leader, tuple(problems))


# --- down ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stopped:
    name: str
    pid: int | None
    outcome: str
    """"stopped" (SIGTERM), "killed" (SIGKILL after the grace period) or "not running"."""


def down(dir: Path | str, grace: float = 10.0, progress: Progress | None = None) -> list[Stopped]:
    """Stop every recorded server that is still running (tablet servers first), mark them
    stopped in cluster.json. Idempotent: a stopped cluster reports every server "not running"."""
    record = load_record(dir)
    say = progress or (lambda _line: None)
    results: list[Stopped] = []
    for group in (record.tservers, record.masters):
        live = [s for s in group if is_running(s)]
        killed = launcher.terminate_all([s.pid for s in live if s.pid is not None], grace)
        for s in group:
            outcome = "killed" if s.pid in killed else "stopped" if s in live else "not running"
            results.append(Stopped(s.name, s.pid, outcome))
            say(f"stopping {s.name} ... {outcome}")
    save_record(record.with_servers([replace(s, pid=None) for s in record.servers]))
    return results
