"""A cluster of real master and tablet-server processes on loopback, from a `ClusterSpec`.

`Cluster(spec)` is the one launcher of masters and tablet servers that tests, benchmarks, the
fault campaign and the fuzzer hold: it starts every server of the spec
(`service.tools.cluster_spec`, which also gives `tessera cluster up` its servers), starts,
stops, kills and restarts any of them by name, and gives clients, channels and credentials
that fit its security mode. `MasterCluster` (service.testing.master_cluster) is the masters of
a cluster seen as a group, or a cluster of masters only; `MiniCluster`
(service.testing.mini_cluster) is a Cluster made from the keyword arguments its call sites
use.

Theory of operation
-------------------
Files. Server NAME logs to `<base>/NAME.log`, keeps its data in `<base>/NAME/` and writes its
ready file to `<base>/NAME.ready`; a secure cluster's CA is `<base>/pki` (or another cluster's,
to share it). Masters are `master-1..N`, tablet servers `ts-1..M`.

Addresses. Every master must know every master's address to bootstrap sys.catalog, and a
master's uuid follows from its address (`service.master.master.master_uuid`), so master ports
are picked free before launch (`launcher.free_ports`) and kept across restarts. A tablet
server binds `127.0.0.1:0` the first time and its ready file names the address and uuid it got;
a restart reuses both (its replicas' Raft configurations name them). Status pages bind a free
loopback port on every start.

Identity. In a secure cluster each server gets a certificate of its own from the cluster's CA:
a master's names its uuid, a tablet server's the uuid in its data dir (or a new one it takes
when it formats an empty one); `start_server(..., credentials_dir=D)` starts a tablet server
with credentials made elsewhere instead (a join credential).

Stopping. `stop()` stops tablet servers, then masters (SIGTERM, then SIGKILL after a grace
period): used as a context manager, the cluster never leaves a process running, even when its
start fails half-way (`launcher.StopOnExit`). The process mechanics are `service.tools.launcher`'s.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from service.client.sync import SyncClient
from service.common import channel_options
from service.common.pki import ClusterPki, IdentityFiles
from service.common.tls import Credentials, open_channel, open_sync_channel
from service.master.master import master_uuid
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.tools import launcher
from service.tools.cluster_spec import FAST_RAFT, TIMING, ClusterSpec, settings_of
from service.tools.launcher import ServerProcess, StopOnExit, free_ports

__all__ = ["Cluster", "MasterCluster"]


class Cluster(StopOnExit):
    """The servers of `spec` under `spec.base` (module docstring). Use as a context manager.
    `pki`: the CA to issue from in a secure cluster (another cluster's, to share it);
    default a new one in `<base>/pki`."""

    def __init__(self, spec: ClusterSpec, *, pki: ClusterPki | None = None) -> None:
        self.spec = spec
        self.base = spec.base
        self.base.mkdir(parents=True, exist_ok=True)
        self.pki: ClusterPki | None = None
        if spec.secure:
            self.pki = pki if pki is not None else ClusterPki(self.base / "pki")
        self.servers: dict[str, ServerProcess] = {}
        """Every server, masters first, by name."""
        for i, port in enumerate(free_ports(spec.masters), start=1):
            self._slot("master", f"master-{i}", f"127.0.0.1:{port}")
        for i in range(1, spec.tservers + 1):
            self.add_tserver_slot(f"ts-{i}")
        self.masters = MasterCluster.of(self)

    # --- what it holds ---------------------------------------------------------------------

    def _slot(self, kind: str, name: str, address: str = "") -> ServerProcess:
        if name in self.servers:
            raise ValueError(f"{name}: the cluster has a server of that name")
        server = ServerProcess(
            name,
            kind,
            self.base / name,
            self.base / f"{name}.log",
            self.base / f"{name}.ready",
            address=address,
            uuid=master_uuid(address) if kind == "master" else "",
        )
        self.servers[name] = server
        return server

    def add_master_slot(self, name: str) -> ServerProcess:
        """A master not started yet, on a new free port (for AddMaster: start it with
        `start_server(name, join=True)`)."""
        (port,) = free_ports(1)
        return self._slot("master", name, f"127.0.0.1:{port}")

    def add_tserver_slot(self, name: str) -> ServerProcess:
        """A tablet server not started yet (it binds a free port when it first starts)."""
        return self._slot("tserver", name)

    def group(self, kind: str) -> dict[str, ServerProcess]:
        """The servers of `kind` ("master" or "tserver"), by name."""
        return {n: s for n, s in self.servers.items() if s.kind == kind}

    @property
    def tservers(self) -> dict[str, ServerProcess]:
        return self.group("tserver")

    @property
    def master_addresses(self) -> list[str]:
        return [s.address for s in self.servers.values() if s.kind == "master"]

    def by_address(self, address: str) -> ServerProcess:
        for s in self.servers.values():
            if s.address == address:
                return s
        raise KeyError(address)

    def tserver_by_uuid(self, uuid: str) -> ServerProcess:
        for s in self.servers.values():
            if s.kind == "tserver" and s.uuid == uuid:
                return s
        raise KeyError(uuid)

    def exit_codes(self, kind: str | None = None) -> dict[str, int | None]:
        """Each server's exit code (None while it runs or if never started)."""
        return {
            n: (s.proc.poll() if s.proc else None)
            for n, s in self.servers.items()
            if kind is None or s.kind == kind
        }

    # --- clients -----------------------------------------------------------------------------

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

    def client(self, timeout: float = 60.0, **kwargs: Any) -> SyncClient:
        """A blocking client of this cluster with admin credentials."""
        return SyncClient(
            self.master_addresses, timeout=timeout, credentials=self.credentials(), **kwargs
        )

    def leader(self, among: Sequence[str] | None = None, timeout: float = 30.0) -> tuple[str, int]:
        """(address, term) of the master among `among` (default: all) that answers
        ConnectToMaster as LEADER (which it does only after a majority confirmed it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for address in among if among is not None else self.master_addresses:
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

    # --- processes ---------------------------------------------------------------------------

    def identity(self, server: ServerProcess) -> IdentityFiles | None:
        """The certificate files `server` runs with: its own from the cluster's CA (module
        docstring), None when the cluster is insecure."""
        if self.pki is None:
            return None
        uuid = server.uuid if server.kind == "master" else launcher.tserver_uuid(server.data_dir)
        return self.pki.files(server.kind, uuid)

    def start(self) -> None:
        """Start every server: the masters (until each serves), then the tablet servers (until
        each serves and every one is registered live at the master leader)."""
        masters = list(self.group("master"))
        for name in masters:
            self.start_server(name, wait=False)
        self.wait_ready(masters)
        tservers = list(self.tservers)
        for name in tservers:
            self.start_server(name, wait=False)
        self.wait_ready(tservers)
        if tservers:
            self.wait_registered()

    def start_server(
        self,
        name: str,
        *,
        wait: bool = True,
        join: bool = False,
        env: Mapping[str, str] | None = None,
        credentials_dir: Path | None = None,
    ) -> ServerProcess:
        """Launch server `name`; `wait` until it serves. `join` starts a master as a new member
        of the running group (`join_existing`), `env` adds environment variables
        (failpoints), `credentials_dir` gives a tablet server those credentials instead of its
        own (module docstring)."""
        server = self.servers[name]
        if server.kind == "master":  # its address may have been moved (the fault campaign's)
            server.uuid = master_uuid(server.address)
        if credentials_dir is not None:
            identity: IdentityFiles | None = IdentityFiles.in_dir(credentials_dir)
        else:
            identity = self.identity(server)
        args = self.spec.command(
            server.kind,
            data_dir=server.data_dir,
            address=server.address,
            master_addresses=self.master_addresses,
            identity=identity,
            ready=server.ready,
            join=join,
        )
        server.launched = launcher.spawn(name, args, log=server.log, ready=server.ready, env=env)
        if wait:
            self.wait_ready([name])
        return server

    def wait_ready(self, names: Sequence[str], timeout: float = 30.0) -> None:
        """Wait until each of `names` serves (one deadline for all); a master must serve at
        its own address."""
        deadline = time.monotonic() + timeout
        for name in names:
            s = self.servers[name]
            assert s.launched is not None, f"{name} was never started"
            expect = s.address if s.kind == "master" else None
            s.served(launcher.wait_ready(s.launched, deadline, timeout, expect_address=expect))

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
                        r = stub.ListTabletServers(pb.ListTabletServersRequestPB(), timeout=2)
                    except grpc.RpcError:
                        continue  # not the leader (yet), or not up
                live = {s.instance.permanent_uuid for s in r.servers if s.live}
                if want <= live:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"tablet servers not registered with the master after {timeout}s")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to server `name` (SIGKILL: a crash) and wait for it to exit."""
        launcher.kill(self.servers[name].proc, sig)

    def stop_server(self, name: str, grace: float = 10.0) -> None:
        """Stop server `name`: SIGTERM, then SIGKILL after `grace` seconds."""
        proc = self.servers[name].proc
        launcher.terminate_all([proc] if proc is not None else [], grace)

    def restart(self, name: str, *, env: Mapping[str, str] | None = None) -> ServerProcess:
        """Kill server `name` and start it again on its data, address and identity."""
        self.kill(name)
        return self.start_server(name, env=env)

    def stop(self) -> None:
        """Stop every server: tablet servers first, then masters."""
        for kind in ("tserver", "master"):
            launcher.terminate_all(p for s in self.group(kind).values() if (p := s.proc))


class MasterCluster(StopOnExit):
    """The masters of a cluster as a group, or (constructed) a cluster of masters only: what
    master tests ask of N masters forming one sys.catalog group. Use as a context manager."""

    cluster: Cluster

    def __init__(
        self,
        base: Path,
        size: int = 3,
        overrides: Mapping[str, str] | None = None,
        *,
        secure: bool = True,
        pki: ClusterPki | None = None,
    ) -> None:
        """`size` masters under `base`; `overrides` (default: the fast timing) are their
        settings, `pki` the CA to issue from (another cluster's, to share it)."""
        spec = ClusterSpec(
            base,
            masters=size,
            tservers=0,
            security="secure" if secure else "insecure",
            timing="conf",
            master_overrides=settings_of(FAST_RAFT if overrides is None else overrides),
        )
        self.cluster = Cluster(spec, pki=pki)
        self.cluster.masters = self

    @classmethod
    def of(cls, cluster: Cluster) -> MasterCluster:
        """The masters of `cluster`, as a group."""
        group = cls.__new__(cls)
        group.cluster = cluster
        return group

    @property
    def base(self) -> Path:
        return self.cluster.base

    @property
    def pki(self) -> ClusterPki | None:
        return self.cluster.pki

    @property
    def masters(self) -> dict[str, ServerProcess]:
        return self.cluster.group("master")

    @property
    def size(self) -> int:
        return len(self.masters)

    @property
    def overrides(self) -> dict[str, str]:
        """The masters' settings beyond the managed ones (the timing preset's, then the
        overrides'); set it to start the next masters with others."""
        spec = self.cluster.spec
        given = dict(s.split("=", 1) for s in spec.master_overrides)
        return {**TIMING[spec.timing]["master"], **given}

    @overrides.setter
    def overrides(self, value: Mapping[str, str]) -> None:
        spec = self.cluster.spec
        self.cluster.spec = replace(
            spec,
            timing="conf",
            master_overrides=settings_of(value),
            tserver_overrides=(
                *settings_of(TIMING[spec.timing]["tserver"]),
                *spec.tserver_overrides,
            ),
        )

    @property
    def addresses(self) -> list[str]:
        return self.cluster.master_addresses

    def credentials(self, role: str = "admin", name: str = "test-admin") -> Credentials | None:
        return self.cluster.credentials(role, name)

    def credentials_dir(self, role: str = "admin", name: str = "test-admin") -> str | None:
        return self.cluster.credentials_dir(role, name)

    def sync_channel(self, address: str) -> grpc.Channel:
        return self.cluster.sync_channel(address)

    def channel(self, address: str) -> grpc.aio.Channel:
        return self.cluster.channel(address)

    def leader(self, among: Sequence[str] | None = None, timeout: float = 30.0) -> tuple[str, int]:
        return self.cluster.leader(among, timeout)

    def security_overrides(self, role: str, name: str) -> list[str]:
        """`--set` arguments giving a server of (role, name) its certificate (none insecure)."""
        return launcher.security_overrides(self.pki.files(role, name) if self.pki else None)

    def by_address(self, address: str) -> ServerProcess:
        server = self.cluster.by_address(address)
        if server.kind != "master":
            raise KeyError(address)
        return server

    def add_master_slot(self, name: str) -> ServerProcess:
        return self.cluster.add_master_slot(name)

    def start(self) -> None:
        names = list(self.masters)
        for name in names:
            self.start_master(name)
        self.wait_ready(names)

    def start_master(
        self, name: str, *, join: bool = False, env: Mapping[str, str] | None = None
    ) -> None:
        """Launch `name` without waiting for it; `join` starts it as a new member of the
        running group (`join_existing`), `env` adds environment variables (failpoints)."""
        self.cluster.start_server(name, wait=False, join=join, env=env)

    def wait_ready(self, names: Sequence[str], timeout: float = 30.0) -> None:
        self.cluster.wait_ready(names, timeout)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.cluster.kill(name, sig)

    def stop(self) -> None:
        launcher.terminate_all(p for s in self.masters.values() if (p := s.proc))

    def exit_codes(self) -> dict[str, int | None]:
        return self.cluster.exit_codes("master")
