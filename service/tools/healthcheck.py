"""Asking Tessera servers whether they serve: one server's Ping, or a cluster's masters.

    python -m service.tools.healthcheck --address HOST:PORT --kind master|tserver [--timeout S]

`check` / `main` are the container health check of docker-compose.yml: exit 0 when the server
answers Ping, 1 when it does not (the message names the address and the gRPC status), 2 on bad
arguments. Compose runs it inside each server's container against 127.0.0.1: "healthy" means the
process serves RPCs, which is what `depends_on` with `condition: service_healthy` needs. It
deliberately does not ask for a master leader: the masters must all be up before any can be
elected, so a check that waited for a leader could not pass on the first master alone. Ping is
on MasterService for a master and on TabletServerService for a tablet server; both answer without
a leader or a loaded catalog, so the check is cheap and never blocks on the cluster.

`probe_masters` asks a whole cluster through its masters, all at once: each master's role and
term (ConnectToMaster), and from a leader that serves (ListTables succeeds: it replayed
sys.catalog) its view of the masters (ListMasters) and of the tablet servers
(ListTabletServers). `tessera cluster up` waits on it and `tessera cluster status` reports it.
An unreachable master is a `MasterHealth` with `error` naming its address, never an exception.
`status_of_masters` turns a probe into a `ClusterStatus` report for a cluster known only by its
masters (the compose job runner's `cluster status --masters`); `local_cluster.status` makes the
same report for a local cluster, with its processes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from service.client.credentials import find_credentials
from service.common.tls import Credentials, open_channel, tls_hint
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc

__all__ = [
    "ClusterStatus",
    "MasterHealth",
    "MasterProbe",
    "ServerStatus",
    "TabletServerView",
    "build_parser",
    "check",
    "main",
    "probe_masters",
    "status_of_masters",
]

KINDS = ("master", "tserver")


async def check(
    address: str, kind: str, timeout: float = 3.0, credentials: Credentials | None = None
) -> str | None:
    """None if the `kind` server at `address` answers Ping within `timeout`, else the problem."""
    async with open_channel(address, credentials, role=kind) as channel:
        if kind == "master":
            ping = master_pb2_grpc.MasterServiceStub(channel).Ping
        else:
            ping = tserver_pb2_grpc.TabletServerServiceStub(channel).Ping
        try:
            await ping(pb.PingRequestPB(), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            hint = "" if credentials is not None else tls_hint(e)
            return (
                f"{kind} at {address} does not answer Ping: {e.code().name} {e.details() or ''}"
                + hint
            )
    return None


# --- probing the masters ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MasterHealth:
    """One master as it answers ConnectToMaster (and, if the leader answered, ListMasters)."""

    address: str
    role: str | None = None
    term: int | None = None
    uuid: str = ""
    member_type: str | None = None
    committed_index: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TabletServerView:
    """One tablet server as the leader's ListTabletServers lists it."""

    uuid: str
    address: str
    live: bool
    millis_since_heartbeat: int
    num_replicas: int


@dataclass(frozen=True, slots=True)
class MasterProbe:
    masters: tuple[MasterHealth, ...]
    leader: str | None = None
    """Address of a master that answered LEADER and served ListTables."""
    tservers: tuple[TabletServerView, ...] = ()


def _rpc_error(address: str, e: grpc.aio.AioRpcError, credentials: Credentials | None) -> str:
    return f"unreachable at {address}: {e.code().name} {e.details() or ''}".rstrip() + (
        "" if credentials is not None else tls_hint(e)
    )


_LeaderViews = tuple[pb.ListMastersResponsePB, pb.ListTabletServersResponsePB]


async def _ask(
    address: str, rpc_timeout: float, credentials: Credentials | None
) -> tuple[MasterHealth, _LeaderViews | None]:
    """ConnectToMaster on one master; if it leads, also ListTables, ListMasters and
    ListTabletServers. Returns its view and (a serving leader only) the last two responses."""
    async with open_channel(address, credentials, role="master") as channel:
        stub = master_pb2_grpc.MasterServiceStub(channel)
        try:
            r = await stub.ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=rpc_timeout)
        except grpc.aio.AioRpcError as e:
            return MasterHealth(address, error=_rpc_error(address, e, credentials)), None
        view = MasterHealth(address, pb.RaftRolePB.Name(r.role), r.term)
        if r.role != pb.LEADER:
            return view, None
        try:
            await stub.ListTables(pb.ListTablesRequestPB(), timeout=rpc_timeout)
            masters = await stub.ListMasters(pb.ListMastersRequestPB(), timeout=rpc_timeout)
            ts = await stub.ListTabletServers(pb.ListTabletServersRequestPB(), timeout=rpc_timeout)
        except grpc.aio.AioRpcError as e:
            return replace(
                view, error=f"leader not serving: {_rpc_error(address, e, credentials)}"
            ), None
        return view, (masters, ts)


async def probe_masters(
    addresses: Sequence[str], rpc_timeout: float = 2.0, credentials: Credentials | None = None
) -> MasterProbe:
    """Ask every master at once; an unreachable master is reported, naming its address."""
    answers = await asyncio.gather(*(_ask(a, rpc_timeout, credentials) for a in addresses))
    views = [v for v, _ in answers]
    lead = next(((v, extra) for v, extra in answers if extra is not None), None)
    if lead is None:
        return MasterProbe(tuple(views))
    leader, (masters_pb, ts_pb) = lead
    by_address: dict[str, pb.ListMastersResponsePB.Entry] = {}
    for e in masters_pb.masters:
        for hp in e.rpc_addresses:
            by_address[f"{hp.host}:{hp.port}"] = e
    views = [
        replace(
            v,
            uuid=by_address[v.address].instance.permanent_uuid,
            member_type=pb.MemberTypePB.Name(by_address[v.address].member_type),
            committed_index=by_address[v.address].committed_index,
        )
        if v.address in by_address
        else v
        for v in views
    ]
    tservers = tuple(
        TabletServerView(
            uuid=e.instance.permanent_uuid,
            address=", ".join(f"{hp.host}:{hp.port}" for hp in e.registration.rpc_addresses),
            live=e.live,
            millis_since_heartbeat=e.millis_since_heartbeat,
            num_replicas=e.num_replicas,
        )
        for e in ts_pb.servers
    )
    return MasterProbe(tuple(views), leader.address, tservers)


# --- status reports ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """One server in a status report (`pid`/`running` come from a local cluster's record;
    for a cluster known only by its masters, `running` means it answers)."""

    name: str
    kind: str
    address: str
    pid: int | None
    running: bool
    """The process is this server (local: the pid-reuse check) or it answers (remote)."""
    uuid: str = ""
    role: str | None = None
    term: int | None = None
    live: bool | None = None
    """Tablet servers: live at the leader (None: no leader to ask, or not registered)."""
    http_address: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """A status report: `problems` empty means healthy (the exit code of `cluster status`)."""

    dir: str | None
    servers: tuple[ServerStatus, ...]
    leader: str | None
    problems: tuple[str, ...] = field(default=())

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "healthy": self.healthy}


def status_of_masters(
    addresses: Sequence[str],
    rpc_timeout: float = 2.0,
    expect_tservers: int | None = None,
    credentials: Credentials | None = None,
) -> ClusterStatus:
    """Status of a cluster known only by its masters' addresses (no pids: a remote cluster,
    e.g. from the compose job runner): the masters, and the tablet servers the leader knows.
    A tablet server that never registered is invisible here; `expect_tservers` makes fewer
    live ones than that a problem."""
    probe = asyncio.run(probe_masters(addresses, rpc_timeout, credentials))
    out: list[ServerStatus] = []
    problems: list[str] = []
    for v in probe.masters:
        out.append(
            ServerStatus(
                v.address,
                "master",
                v.address,
                None,
                v.error is None,
                v.uuid,
                role=v.role,
                term=v.term,
                error=v.error,
            )
        )
        if v.error:
            problems.append(f"master {v.address}: {v.error}")
    for t in probe.tservers:
        out.append(ServerStatus(t.uuid, "tserver", t.address, None, t.live, t.uuid, live=t.live))
        if not t.live:
            problems.append(f"tablet server {t.uuid} at {t.address}: not live")
    live = sum(t.live for t in probe.tservers)
    if probe.leader is not None and expect_tservers is not None and live < expect_tservers:
        problems.append(f"{live} tablet server(s) live at the leader, expected {expect_tservers}")
    if probe.leader is None:
        problems.append(f"no master leader serving (asked {', '.join(addresses)})")
    return ClusterStatus(None, tuple(out), probe.leader, tuple(problems))


# --- the command ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m service.tools.healthcheck",
        description="Exit 0 if a Tessera master or tablet server answers Ping, else 1.",
    )
    p.add_argument("--address", required=True, metavar="HOST:PORT")
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    p.add_argument(
        "--credentials",
        metavar="DIR",
        help="ca.pem, cert.pem, key.pem for a secured cluster (default: $TESSERA_CREDENTIALS)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = asyncio.run(
        check(args.address, args.kind, args.timeout, find_credentials(args.credentials))
    )
    if problem is not None:
        print(f"unhealthy: {problem.rstrip()}", file=sys.stderr)
        return 1
    print(f"ok: {args.kind} at {args.address} answers Ping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
