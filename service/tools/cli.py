"""The `tessera` command.

    tessera raft-demo serve --conf conf/raft-demo.toml [--set key=value ...]
    tessera raft-demo run [--dir DIR] [--clients 64] [--seconds 3]
    tessera raft-demo status --addresses HOST:PORT,... [--format plain|json]
    tessera raft-demo put --addresses HOST:PORT,... KEY VALUE
    tessera raft-demo get --addresses HOST:PORT,... KEY
    tessera master run --conf conf/master.toml [--set key=value ...] [--ready-file F]
    tessera tserver run --conf conf/tserver.toml [--set key=value ...] [--ready-file F]
    tessera sim [--seeds N] [--first S] [--seed X --verbose]
    tessera cluster up|status|down --dir DIR ...       (service.tools.cluster_cmd)
    tessera cluster ksck (--masters A,B|--dir DIR)     (service.tools.ksck_cmd)
    tessera table create|list|describe|alter|delete|scan ...,  tablet locations,
    tessera tserver list,  master list                  (service.tools.admin_cmd)
    tessera master add [HOST:PORT] | remove MASTER (--masters A,B|--dir DIR)
                                                        (service.tools.master_cmd)
    tessera cluster rebalance (--masters A,B|--dir DIR) [--report-only|--apply] [--max-moves N]
    tessera replica add|remove|move TABLET ... (--masters A,B|--dir DIR)
                                                        (service.tools.rebalance_cmd)
    tessera jobs list | run NAME [--masters A,B|--dir DIR|--snapshot ID] [--apply]
                                                        (spark_jobs.cli)
Exit codes: 0 success, 1 failure, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc

from service.common.errors import TesseraError, from_grpc
from service.common.private_files import owner_only_umask

PLUGIN_GROUP = "tessera.commands"
"""Entry points whose `register(subparsers)` adds commands from a layer above the tools: the
Spark jobs (`spark_jobs.cli`), which may use the tools but not the other way round."""


def _register_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        ep.load()(sub)


def _addresses(text: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected HOST:PORT[,HOST:PORT...]")
    return out


async def _status(addresses: list[str], fmt: str) -> int:
    from service.tools.kv_demo_client import KvClient

    kv = KvClient(addresses)
    rows = []
    code = 0
    for a in addresses:
        try:
            st = await kv.status(a)
            rows.append(
                {
                    "address": a,
                    "uuid": st.uuid,
                    "role": st.role,
                    "term": st.term,
                    "leader": st.leader_uuid,
                    "commit": st.commit_index,
                    "applied": st.applied_index,
                    "voters": list(st.voters),
                    "learners": list(st.learners),
                }
            )
        except grpc.aio.AioRpcError as e:
            rows.append({"address": a, "error": from_grpc(e).message})
            code = 1
    await kv.aclose()
    if fmt == "json":
        print(json.dumps(rows, indent=2))
        return code
    print(f"{'address':<22} {'uuid':<10} {'role':<16} {'term':>5} {'commit':>8} {'applied':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['address']:<22} unreachable: {r['error']}")
        else:
            print(
                f"{r['address']:<22} {r['uuid']:<10} {r['role']:<16} {r['term']:>5} "
                f"{r['commit']:>8} {r['applied']:>8}"
            )
    return code


async def _put(addresses: list[str], key: str, value: str) -> int:
    from service.tools.kv_demo_client import KvClient

    kv = KvClient(addresses)
    try:
        index = await kv.put(key, value.encode())
        print(f"ok: {key} written at index {index}")
    finally:
        await kv.aclose()
    return 0


async def _get(addresses: list[str], key: str) -> int:
    from service.tools.kv_demo_client import KvClient

    kv = KvClient(addresses)
    try:
        value = await kv.get(key)
    finally:
        await kv.aclose()
    if value is None:
        print(f"{key}: not found", file=sys.stderr)
        return 1
    print(value.decode(errors="replace"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera", description="Tessera command line")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("raft-demo", help="the replicated key-value demo on the consensus layer")
    dsub = demo.add_subparsers(dest="action", required=True)
    serve = dsub.add_parser("serve", help="run one demo node in the foreground")
    serve.add_argument("--conf", required=True)
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    serve.add_argument("--ready-file")
    run = dsub.add_parser("run", help="3 local nodes, a leader killed under load, a summary")
    run.add_argument("--dir")
    run.add_argument("--clients", type=int, default=64)
    run.add_argument("--seconds", type=float, default=3.0)
    status = dsub.add_parser("status", help="role, term and indexes of each node")
    status.add_argument("--addresses", type=_addresses, required=True)
    status.add_argument("--format", choices=["plain", "json"], default="plain")
    put = dsub.add_parser("put", help="write KEY=VALUE through the leader")
    put.add_argument("--addresses", type=_addresses, required=True)
    put.add_argument("key")
    put.add_argument("value")
    get = dsub.add_parser("get", help="linearizable read of KEY")
    get.add_argument("--addresses", type=_addresses, required=True)
    get.add_argument("key")

    master = sub.add_parser("master", help="the master (sys.catalog, catalog manager)")
    msub = master.add_subparsers(dest="action", required=True)
    mrun = msub.add_parser("run", help="run one master in the foreground")
    mrun.add_argument("--conf", required=True)
    mrun.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    mrun.add_argument("--ready-file")

    tserver = sub.add_parser("tserver", help="a tablet server (tablet replicas, scans)")
    tsub = tserver.add_subparsers(dest="action", required=True)
    trun = tsub.add_parser("run", help="run one tablet server in the foreground")
    trun.add_argument("--conf", required=True)
    trun.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    trun.add_argument("--ready-file")

    from service.tools import (
        admin_cmd,
        cluster_cmd,
        grant_cmd,
        ksck_cmd,
        master_cmd,
        rebalance_cmd,
        security_cmd,
        table_io_cmd,
        token_cmd,
    )

    cluster_sub = cluster_cmd.register(sub)
    ksck_cmd.add_ksck(cluster_sub)
    rebalance_cmd.register_rebalance(cluster_sub)
    admin_cmd.register(sub)  # after `master` and `tserver`: `list` joins those groups
    table_io_cmd.register(sub)  # `load` and `copy` join the `table` group
    master_cmd.register(sub)
    rebalance_cmd.register_replica(sub)
    _register_plugins(sub)
    security_cmd.register(sub)
    grant_cmd.register(sub)
    token_cmd.register(sub)

    sim = sub.add_parser("sim", help="run the deterministic Raft simulator")
    sim.add_argument("--seeds", type=int, default=200)
    sim.add_argument("--first", type=int, default=0)
    sim.add_argument("--seed", type=int)
    sim.add_argument("--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    owner_only_umask()  # local clusters' directories and files it writes: owner-only
    try:
        if args.command == "cluster":
            from service.tools import cluster_cmd

            return cluster_cmd.run(args)
        handler = getattr(args, "handler", None)
        if handler is not None:  # command groups that bring their own handlers
            code: int = handler(args)
            return code
        if args.command == "sim":
            from service.testing import sim_cli

            sargs = ["--seeds", str(args.seeds), "--first", str(args.first)]
            if args.seed is not None:
                sargs = ["--seed", str(args.seed)] + (["--verbose"] if args.verbose else [])
            return sim_cli.main(sargs)
        if args.command == "master":
            from service.master import __main__ as master_main

            fwd = ["--conf", args.conf] + [x for s in args.set for x in ("--set", s)]
            if args.ready_file:
                fwd += ["--ready-file", args.ready_file]
            return master_main.main(fwd)
        if args.command == "tserver":
            from service.tserver import __main__ as tserver_main

            fwd = ["--conf", args.conf] + [x for s in args.set for x in ("--set", s)]
            if args.ready_file:
                fwd += ["--ready-file", args.ready_file]
            return tserver_main.main(fwd)
        if args.action == "serve":
            from service.tools import kv_demo_server

            fwd = ["--conf", args.conf] + [x for s in args.set for x in ("--set", s)]
            if args.ready_file:
                fwd += ["--ready-file", args.ready_file]
            return kv_demo_server.main(fwd)
        if args.action == "run":
            from service.tools import kv_demo

            fwd = ["--clients", str(args.clients), "--seconds", str(args.seconds)]
            if args.dir:
                fwd += ["--dir", args.dir]
            return kv_demo.main(fwd)
        if args.action == "status":
            return asyncio.run(_status(args.addresses, args.format))
        if args.action == "put":
            return asyncio.run(_put(args.addresses, args.key, args.value))
        if args.action == "get":
            return asyncio.run(_get(args.addresses, args.key))
    except TesseraError as e:
        print(f"tessera: {e.message}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
