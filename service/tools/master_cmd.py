"""`tessera master add | remove`: change the membership of the masters' Raft group.

    tessera master add HOST:PORT --masters M1,M2,...   add a master already running with
                                                       `join_existing = true` (empty data dir)
    tessera master add --dir DIR                       start one more master for the local
                                                       cluster in DIR and add it
    tessera master remove MASTER (--masters ... | --dir DIR)
                                                       MASTER: uuid, host:port, or with --dir a
                                                       name such as master-2

Both return once the change is committed (an added master is a voter, caught up). Removing the
leader first hands leadership to another master (`service/master/master_membership.py`). With
`--dir`, `remove` also stops the removed master, deletes its data dir (it can never rejoin with
it) and drops it from cluster.json; with `--masters`, stopping it is the operator's job.
Exit codes as for every `tessera` command: 0 done, 1 refused or unreachable, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from service.client.client import TesseraClient
from service.common.errors import InvalidArgument
from service.tools import local_cluster
from service.tools.admin_cmd import add_connection_args, credentials_of, group_actions, masters_of
from service.tools.cli_args import exit_code_of_errors

__all__ = ["register"]

_TIMEOUT_S = 60.0


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _on_leader(args: argparse.Namespace, method: str, master: str) -> None:
    """`TesseraClient.<method>(master)` against the cluster of `--masters`/`--dir`."""

    async def call() -> None:
        async with TesseraClient(
            masters_of(args), timeout=args.timeout, credentials=credentials_of(args)
        ) as client:
            await getattr(client, method)(master)

    asyncio.run(call())


def master_add(args: argparse.Namespace) -> int:
    if args.address is None:
        if args.dir is None:
            raise InvalidArgument(
                "master add: give the new master's HOST:PORT (started with join_existing = "
                "true), or --dir DIR to start one for a local cluster"
            )
        server = local_cluster.add_master(args.dir, timeout=args.timeout, progress=_progress)
        print(f"{server.name} {server.address} {server.uuid}: added, a voter")
        return 0

    _on_leader(args, "add_master", args.address)
    print(f"{args.address}: added, a voter")
    return 0


def master_remove(args: argparse.Namespace) -> int:
    if args.dir is not None:
        server = local_cluster.remove_master(
            args.dir, args.master, timeout=args.timeout, progress=_progress
        )
        print(f"{server.name} {server.address}: removed, stopped, data deleted")
        return 0

    _on_leader(args, "remove_master", args.master)
    print(f"{args.master}: removed (stop that master and wipe its data dir)")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `master add` and `master remove` to the existing `master` group."""
    actions = group_actions(sub, "master", "masters")
    p = actions.add_parser(
        "add",
        help="add a master to the group (with --dir: start one for the local cluster)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("address", nargs="?", metavar="HOST:PORT", help="the new master's address")
    add_connection_args(p, fmt=False, timeout=_TIMEOUT_S)
    p.set_defaults(handler=exit_code_of_errors(master_add))

    p = actions.add_parser(
        "remove",
        help="remove a master from the group (with --dir: also stop it and delete its data)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("master", help="uuid or HOST:PORT (with --dir also a name like master-2)")
    add_connection_args(p, fmt=False, timeout=_TIMEOUT_S)
    p.set_defaults(handler=exit_code_of_errors(master_remove))
