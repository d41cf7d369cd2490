"""`tessera cluster up|status|down`: a local cluster of background processes in one directory.

    tessera cluster up --dir DIR [--masters 3] [--tservers 3] [--master-set K=V ...]
                       [--tserver-set K=V ...] [--master-conf F] [--tserver-conf F] [--timeout S]
    tessera cluster status (--dir DIR | --masters HOST:PORT,... [--tservers N])
                           [--format plain|json]
    tessera cluster down --dir DIR [--grace S]

The work is in `service.tools.local_cluster`; this module is argument parsing and printing.
`up` prints progress as each server comes up, then the master addresses and a hint for other
commands (`--masters a,b,c`). `status` exits 1 when anything is down, so scripts and health
checks can use it; with `--masters` it asks a cluster it did not start (no pids to check), as
the compose job runner does. Each handler returns an exit code: 0 success, 1 failure, 2 usage or
configuration error (a bad `--set`), as everywhere in `tessera`.

Wiring into the `tessera` parser: `register(subparsers)` adds the `cluster` group, every action
parser carries its handler, and `run(args)` dispatches to it. `main(argv)` does the same on the
parser of `build_parser()`, for `python -m service.tools.cluster_cmd`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from service.client.credentials import find_credentials
from service.common.errors import InvalidArgument
from service.tools import local_cluster, local_servers
from service.tools.cli_args import exit_code_of_errors, int_at_least
from service.tools.healthcheck import ClusterStatus, ServerStatus, status_of_masters

__all__ = ["build_parser", "format_status", "main", "register", "run"]


def _addresses(text: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected HOST:PORT[,HOST:PORT...]")
    return out


# --- handlers --------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    record = local_cluster.up(
        args.dir,
        args.masters,
        args.tservers,
        master_conf=args.master_conf,
        tserver_conf=args.tserver_conf,
        master_overrides=args.master_set or None,
        tserver_overrides=args.tserver_set or None,
        timeout=args.timeout,
        progress=_say,
    )
    masters = ",".join(record.master_addresses)
    print(
        f"cluster up in {record.dir}: {len(record.masters)} master(s),"
        f" {len(record.tservers)} tablet server(s)"
    )
    for s in record.servers:
        if s.http_address:
            scheme = local_cluster.http_scheme(record, s)
            print(f"{s.name} status pages: {scheme}://{s.http_address}/")
    print(f"masters: {masters}")
    print(f"hint: other tessera commands take --masters {masters}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.dir is not None and args.tservers is not None:
        raise InvalidArgument("--tservers goes with --masters; --dir knows its tablet servers")
    if args.dir is not None:
        st = local_cluster.status(args.dir, rpc_timeout=args.rpc_timeout)
    else:
        st = status_of_masters(
            args.masters,
            rpc_timeout=args.rpc_timeout,
            expect_tservers=args.tservers,
            credentials=find_credentials(args.credentials),
        )
    if args.format == "json":
        print(json.dumps(st.to_json(), indent=2))
    else:
        print(format_status(st))
    return 0 if st.healthy else 1


def cmd_down(args: argparse.Namespace) -> int:
    results = local_cluster.down(args.dir, grace=args.grace, progress=_say)
    stopped = sum(r.outcome != "not running" for r in results)
    print(f"cluster in {Path(args.dir).resolve()} is down ({stopped} process(es) stopped)")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    """start / stop / restart one server of a local cluster (local_servers.py)."""
    if args.action in ("stop", "restart"):
        st = local_servers.stop_server(args.dir, args.name, grace=args.grace)
        _say(f"stopping {st.name} ... {st.outcome}")
    if args.action in ("start", "restart"):
        s = local_servers.start_server(args.dir, args.name, timeout=args.timeout)
        _say(f"{s.name} serving on {s.address} (pid {s.pid})")
    return 0


# --- printing --------------------------------------------------------------------------------


def _state(s: ServerStatus) -> str:
    if s.kind == "tserver" and s.live is not None:
        return "live" if s.live else ("not live" if s.running else "down")
    if s.error is not None and s.running:
        return "unreachable"
    return "up" if s.running else "down"


def format_status(st: ClusterStatus) -> str:
    """A readable table of `st`, one line per server, and a verdict with the problems."""
    header = ("name", "kind", "pid", "state", "address", "role", "term", "uuid")
    rows = [header]
    for s in st.servers:
        rows.append(
            (
                s.name,
                s.kind,
                "-" if s.pid is None else str(s.pid),
                _state(s),
                s.address or "-",
                s.role or "-",
                "-" if s.term is None else str(s.term),
                s.uuid or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for s in st.servers:
        if s.http_address:
            lines.append(f"{s.name} status pages: http://{s.http_address}/")
    masters = [s for s in st.servers if s.kind == "master"]
    tservers = [s for s in st.servers if s.kind == "tserver"]
    live = sum(bool(s.live) for s in tservers)
    where = f" in {st.dir}" if st.dir else ""
    if st.healthy:
        lines.append(
            f"healthy{where}: leader {st.leader}, {len(masters)} master(s),"
            f" {live}/{len(tservers)} tablet server(s) live"
        )
    else:
        lines.append(f"NOT healthy{where}:")
        lines.extend(f"  - {p}" for p in st.problems)
    return "\n".join(lines)


# --- parser ----------------------------------------------------------------------------------


def _add_actions(
    cluster: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    sub = cluster.add_subparsers(dest="action", required=True)

    up = sub.add_parser(
        "up",
        help="start a local cluster in DIR (or restart the stopped one there)",
        description="Start masters and tablet servers as background processes; data, logs and"
        " cluster.json under DIR. On a DIR with a stopped cluster, restart the same servers.",
    )
    up.add_argument("--dir", required=True, type=Path, help="the cluster's directory")
    up.add_argument("--masters", type=int_at_least(0), help="number of masters (new cluster: 3)")
    up.add_argument(
        "--tservers", type=int_at_least(0), help="number of tablet servers (new cluster: 3)"
    )
    up.add_argument("--master-conf", type=Path, help="master config (default: conf/master.toml)")
    up.add_argument("--tserver-conf", type=Path, help="tserver config (conf/tserver.toml)")
    up.add_argument(
        "--master-set", action="append", default=[], metavar="KEY=VALUE", help="master --set"
    )
    up.add_argument(
        "--tserver-set", action="append", default=[], metavar="KEY=VALUE", help="tserver --set"
    )
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    up.set_defaults(handler=cmd_up)

    status = sub.add_parser(
        "status",
        help="processes, master roles and live tablet servers; exit 1 if anything is down",
    )
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", type=Path, help="a cluster started by `tessera cluster up`")
    where.add_argument(
        "--masters", type=_addresses, metavar="HOST:PORT,...", help="any cluster, by its masters"
    )
    status.add_argument(
        "--tservers",
        type=int_at_least(0),
        help="with --masters: how many tablet servers must be live (unregistered ones are"
        " invisible to the masters)",
    )
    status.add_argument(
        "--credentials",
        metavar="DIR",
        help="with --masters: ca.pem, cert.pem, key.pem of a secured cluster "
        "(default: $TESSERA_CREDENTIALS)",
    )
    status.add_argument("--format", choices=["plain", "json"], default="plain")
    status.add_argument("--rpc-timeout", type=float, default=2.0, help=argparse.SUPPRESS)
    status.set_defaults(handler=cmd_status)

    down = sub.add_parser("down", help="stop every process of the cluster in DIR")
    down.add_argument("--dir", required=True, type=Path, help="the cluster's directory")
    down.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    down.set_defaults(handler=cmd_down)

    for action, what in (
        ("start", "start one stopped server of the cluster in DIR and wait until it serves"),
        ("stop", "stop one server of the cluster in DIR (SIGTERM, SIGKILL after --grace)"),
        ("restart", "stop one server of the cluster in DIR, start it, wait until it serves"),
    ):
        p = sub.add_parser(action, help=what)
        p.add_argument("name", help="the server, as `tessera cluster status` names it (ts-2)")
        p.add_argument("--dir", required=True, type=Path, help="the cluster's directory")
        p.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
        p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait to serve")
        p.set_defaults(handler=cmd_server)
    return sub


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add the `cluster` command group to the `tessera` parser; dispatch with `run(args)`.
    Returns the group's subparsers, so other modules can add actions (ksck, rebalance)."""
    cluster = subparsers.add_parser("cluster", help="a local cluster of background processes")
    return _add_actions(cluster)


def run(args: argparse.Namespace) -> int:
    """Run the handler `register` attached to the parsed action; errors become exit codes."""
    return exit_code_of_errors(args.handler)(args)


def build_parser() -> argparse.ArgumentParser:
    """The `cluster` group as a parser of its own (`python -m service.tools.cluster_cmd`)."""
    p = argparse.ArgumentParser(
        prog="tessera cluster", description="A local Tessera cluster of background processes."
    )
    _add_actions(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
