"""`tessera cluster rebalance` and `tessera replica add|remove|move`.

    tessera cluster rebalance (--masters HOST:PORT,... | --dir DIR) [--report-only | --apply]
                              [--max-moves N] [--max-moves-per-server 1] [--move-timeout S]
                              [--timeout S] [--format plain|json]
    tessera replica add TABLET_ID TS_UUID (--masters ... | --dir DIR) [--no-wait]
    tessera replica remove TABLET_ID TS_UUID (--masters ... | --dir DIR) [--force]
    tessera replica move TABLET_ID FROM_TS TO_TS (--masters ... | --dir DIR)

`rebalance` reads the master's catalog (DumpCatalog: every RUNNING tablet's committed voters)
and the live tablet servers, prints each server's replica counts per table and the skews, plans
moves with `service.rebalance.rebalancing` and prints them with the skews they lead to. Without a
flag that is all it does (a dry run); `--report-only` prints only the skews; `--apply` executes
the plan (`service.client.replica_ops.execute_moves`, one progress line per start and outcome),
waits until the master's catalog shows the moves (tablet leaders report them on their next
heartbeat), reads the cluster again and prints the skews it measured.

Tablets are pinned (counted, never moved) when moving a replica could cost them availability
or race with another change: a non-voter in the config (a move or a re-replication under way),
no known leader, a voter on a server that is not live, fewer or more voters than the table's
replication factor, or the table being altered. They are listed with the reason.

The `replica` commands change one tablet's config through its leader with compare-and-set
(`service.client.replica_ops`); `--timeout` is the deadline of the whole operation (default
180 s: a move includes a tablet copy). `remove` refuses to go below the replication factor
unless `--force`.

Exit codes: 0 success (a rebalance whose moves were skipped because the cluster changed under
the plan is still 0: run it again to plan from the new state), 1 a move failed or the cluster
could not be read, 2 usage. Wiring: `register_rebalance(cluster_subparsers)` adds `rebalance` to
the `cluster` group, `register_replica(subparsers)` adds the `replica` group; `main(argv)`
parses `rebalance ...`, `cluster rebalance ...` and `replica ...` (tests, `python -m`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.client import TesseraClient
from service.client.client import TabletServerInfo
from service.client.replica_ops import (
    ConsensusView,
    MoveResult,
    MoveStatus,
    add_replica,
    execute_moves,
    move_replica,
    remove_replica,
)
from service.pb import master_pb2 as mpb
from service.rebalance.rebalancing import (
    Distribution,
    Move,
    Placement,
    SkewReport,
    apply_moves,
    plan_moves,
    skew_report,
)
from service.tools.admin_cmd import (
    add_connection_args,
    credentials_of,
    group_actions,
    masters_of,
    run_command,
)
from service.tools.cli_args import int_at_least, run_parsed
from service.tools.output import dumps, format_table

__all__ = [
    "ClusterView",
    "build_parser",
    "gather",
    "main",
    "register_rebalance",
    "register_replica",
]

CATALOG_POLL_S = 0.5


@dataclass(frozen=True)
class ClusterView:
    """What the planner needs, read from the master: placements, names, servers, pins."""

    distribution: Distribution
    table_names: dict[str, str]
    servers: list[TabletServerInfo]
    pinned: dict[str, str]
    """Tablet id -> why it may not move."""


def _pin_reason(
    tablet: mpb.TabletRecordPB, table: mpb.TableRecordPB, voters: list[str], live: set[str]
) -> str | None:
    cs = tablet.consensus_state
    non_voters = [
        p.permanent_uuid for p in cs.committed_config.peers if p.member_type == mpb.NON_VOTER
    ]
    if table.state == mpb.TableRecordPB.ALTERING:
        return "its table is being altered"
    if non_voters:
        return f"a config change is under way (non-voter {', '.join(sorted(non_voters))})"
    if not cs.leader_uuid:
        return "no known leader"
    down = sorted(v for v in voters if v not in live)
    if down:
        return f"voter(s) on servers that are not live: {', '.join(down)}"
    if len(voters) != table.num_replicas:
        return f"{len(voters)} voters, replication factor {table.num_replicas}"
    return None


async def gather(client: TesseraClient, timeout: float) -> ClusterView:
    """The voters of every RUNNING tablet of every live table, and the live servers."""
    dump = await client.dump_catalog(timeout=timeout)
    servers = await client.list_tablet_servers(timeout=timeout)
    live = {s.uuid for s in servers if s.live}
    usable = (mpb.TableRecordPB.RUNNING, mpb.TableRecordPB.ALTERING)
    tables = {t.table_id: t for t in dump.tables if t.state in usable}
    replicas: list[Placement] = []
    pinned: dict[str, str] = {}
    for tablet in dump.tablets:
        table = tables.get(tablet.table_id)
        if table is None or tablet.state != mpb.TabletRecordPB.RUNNING:
            continue
        voters = [
            p.permanent_uuid
            for p in tablet.consensus_state.committed_config.peers
            if p.member_type != mpb.NON_VOTER
        ]
        replicas += [Placement(tablet.table_id, tablet.tablet_id, v) for v in voters]
        reason = _pin_reason(tablet, table, voters, live)
        if reason is not None:
            pinned[tablet.tablet_id] = reason
    names = {t.table_id: t.name for t in tables.values()}
    dist = Distribution.of(replicas, live, pinned)
    return ClusterView(dist, names, servers, pinned)


# --- printing --------------------------------------------------------------------------------


def _report_json(view: ClusterView, rep: SkewReport) -> dict[str, Any]:
    return {
        "cluster_skew": rep.cluster_skew,
        "max_table_skew": rep.max_table_skew,
        "balanced": rep.balanced,
        "replicas": rep.replicas,
        "offline_replicas": rep.offline_replicas,
        "servers": dict(rep.totals),
        "tables": [
            {
                "table_id": t.table_id,
                "name": view.table_names.get(t.table_id, t.table_id),
                "skew": t.skew,
                "counts": dict(t.counts),
            }
            for t in rep.tables
        ],
    }


def format_report(view: ClusterView, rep: SkewReport, title: str) -> str:
    """Replica counts per server (a column per table, by name), then each table's skew."""
    rep_tables = sorted(
        rep.tables, key=lambda t: (view.table_names.get(t.table_id, ""), t.table_id)
    )
    names = [view.table_names.get(t.table_id, t.table_id) for t in rep_tables]
    address = {s.uuid: s.address for s in view.servers}
    server_rows = [
        [uuid, address.get(uuid, ""), total, *(t.counts[uuid] for t in rep_tables)]
        for uuid, total in rep.totals.items()
    ]
    tablets: dict[str, set[str]] = {}
    for p in view.distribution.replicas:
        tablets.setdefault(p.table_id, set()).add(p.tablet_id)
    table_rows = [
        [name, len(tablets.get(t.table_id, ())), sum(t.counts.values()), t.skew]
        for name, t in zip(names, rep_tables, strict=True)
    ]
    verdict = "balanced" if rep.balanced else "NOT balanced"
    offline = f", {rep.offline_replicas} on servers not live" if rep.offline_replicas else ""
    return "\n".join(
        [
            f"{title}: cluster skew {rep.cluster_skew}, max table skew {rep.max_table_skew}"
            f" ({verdict}; {len(rep.totals)} live server(s), {rep.replicas} replica(s){offline})",
            format_table(server_rows, ["server", "address", "replicas", *names]),
            "",
            format_table(table_rows, ["table", "tablets", "replicas", "skew"]),
        ]
    )


def _move_rows(view: ClusterView, moves: Sequence[Move]) -> list[list[object]]:
    return [
        [i + 1, view.table_names.get(m.table_id, m.table_id), m.tablet_id, m.from_ts, m.to_ts]
        for i, m in enumerate(moves)
    ]


MOVE_COLUMNS = ["#", "table", "tablet", "from", "to"]


def _progress_printer(total: int, stream: Any) -> Any:
    def show(r: MoveResult) -> None:
        m = r.move
        head = f"[{r.index + 1}/{total}]"
        what = f"tablet {m.tablet_id} from {m.from_ts} to {m.to_ts}"
        if r.status is MoveStatus.STARTED:
            line = f"{head} moving {what}"
        else:
            line = f"{head} {r.status.value} in {r.seconds:.1f}s: {what}: {r.detail}"
        print(line, file=stream, flush=True)

    return show


# --- the rebalance command -------------------------------------------------------------------


async def _catalog_shows(client: TesseraClient, done: Sequence[Move], timeout: float) -> bool:
    """Wait until the master's catalog records every move in `done` (or `timeout` passes)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        dump = await client.dump_catalog(timeout=timeout)
        voters = {
            t.tablet_id: {
                p.permanent_uuid
                for p in t.consensus_state.committed_config.peers
                if p.member_type != mpb.NON_VOTER
            }
            for t in dump.tablets
        }
        if all(
            m.to_ts in voters.get(m.tablet_id, set())
            and m.from_ts not in voters.get(m.tablet_id, set())
            for m in done
        ):
            return True
        if loop.time() >= end:
            return False
        await asyncio.sleep(CATALOG_POLL_S)


async def cmd_rebalance(args: argparse.Namespace) -> int:
    as_json = args.format == "json"
    out: dict[str, Any] = {}
    async with TesseraClient(
        masters_of(args), timeout=args.timeout, credentials=credentials_of(args)
    ) as c:
        view = await gather(c, args.timeout)
        before = skew_report(view.distribution)
        out["before"] = _report_json(view, before)
        out["pinned"] = [{"tablet_id": t, "reason": r} for t, r in sorted(view.pinned.items())]
        if not as_json:
            print(format_report(view, before, "before"))
            for t, r in sorted(view.pinned.items()):
                print(f"pinned: tablet {t}: {r}")
        if args.report_only:
            if as_json:
                print(dumps(out))
            return 0
        moves = plan_moves(view.distribution, max_moves=args.max_moves)
        after = skew_report(apply_moves(view.distribution, moves))
        out["moves"] = moves
        out["planned_after"] = _report_json(view, after)
        if not as_json:
            print()
            if moves:
                print(f"{len(moves)} move(s) planned:")
                print(format_table(_move_rows(view, moves), MOVE_COLUMNS))
            else:
                print("no moves needed" if before.balanced else "no move improves the balance")
            print()
            print(format_report(view, after, "after the planned moves"))
        if not args.apply:
            if as_json:
                print(dumps(out))
            else:
                print("\ndry run: pass --apply to execute the moves")
            return 0
        if not moves:
            if as_json:
                print(dumps(out))
            return 0
        stream = sys.stderr if as_json else sys.stdout
        if not as_json:
            print()
        results = await execute_moves(
            c,
            moves,
            max_in_flight_per_server=args.max_moves_per_server,
            move_timeout=args.move_timeout,
            progress=_progress_printer(len(moves), stream),
        )
        out["results"] = results
        done = [m for m, r in zip(moves, results, strict=True) if r.status is MoveStatus.DONE]
        failed = [r for r in results if r.status is MoveStatus.FAILED]
        skipped = [r for r in results if r.status is MoveStatus.SKIPPED]
        recorded = await _catalog_shows(c, done, args.timeout)
        measured_view = await gather(c, args.timeout)
        measured = skew_report(measured_view.distribution)
        out["after"] = _report_json(measured_view, measured)
        out["catalog_caught_up"] = recorded
    summary = f"{len(done)} move(s) done, {len(skipped)} skipped, {len(failed)} failed"
    if as_json:
        out["summary"] = summary
        print(dumps(out))
    else:
        print()
        print(format_report(measured_view, measured, "after (measured)"))
        print(summary)
        if skipped:
            print("some moves were skipped because the cluster changed: run rebalance again")
        if not recorded:
            print("the master's catalog did not show every move before the deadline")
    return 1 if failed or not recorded else 0


# --- the replica commands --------------------------------------------------------------------


def _print_view(args: argparse.Namespace, verb: str, v: ConsensusView) -> None:
    if args.format == "json":
        print(dumps({"result": verb, "consensus": v}))
    else:
        print(f"{verb}: tablet {v.tablet_id}: {v.describe()}")


async def cmd_replica_add(args: argparse.Namespace) -> int:
    async with TesseraClient(
        masters_of(args), timeout=args.timeout, credentials=credentials_of(args)
    ) as c:
        v = await add_replica(
            c, args.tablet_id, args.ts_uuid, timeout=args.timeout, wait_for_voter=not args.no_wait
        )
    _print_view(args, f"added {args.ts_uuid}", v)
    return 0


async def cmd_replica_remove(args: argparse.Namespace) -> int:
    async with TesseraClient(
        masters_of(args), timeout=args.timeout, credentials=credentials_of(args)
    ) as c:
        v = await remove_replica(
            c,
            args.tablet_id,
            args.ts_uuid,
            timeout=args.timeout,
            allow_under_replication=args.force,
        )
    _print_view(args, f"removed {args.ts_uuid}", v)
    return 0


async def cmd_replica_move(args: argparse.Namespace) -> int:
    async with TesseraClient(
        masters_of(args), timeout=args.timeout, credentials=credentials_of(args)
    ) as c:
        v = await move_replica(c, args.tablet_id, args.from_ts, args.to_ts, timeout=args.timeout)
    _print_view(args, f"moved from {args.from_ts} to {args.to_ts}", v)
    return 0


# --- parsers ---------------------------------------------------------------------------------


def _add_rebalance_args(p: argparse.ArgumentParser) -> None:
    add_connection_args(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--report-only", action="store_true", help="print the skews, plan nothing")
    mode.add_argument("--apply", action="store_true", help="execute the planned moves")
    p.add_argument("--max-moves", type=int_at_least(0), help="plan at most N moves (default: all)")
    p.add_argument(
        "--max-moves-per-server",
        type=int_at_least(1),
        default=1,
        help="moves in flight at once per source or destination server (default 1)",
    )
    p.add_argument(
        "--move-timeout", type=float, default=180.0, help="deadline of each move in s (180)"
    )
    p.set_defaults(handler=run_command(cmd_rebalance))


def register_rebalance(
    cluster_subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Add `rebalance` to the `cluster` group's actions (or find the group when given the
    top-level subparsers after `cluster_cmd.register` added it)."""
    sub = cluster_subparsers
    if "cluster" in sub.choices:
        sub = group_actions(sub, "cluster", "a local cluster")
    p = sub.add_parser(
        "rebalance",
        help="even out replicas per table and per server; a dry run unless --apply",
        description="Plan replica moves that bring every table's and the cluster's skew"
        " (max - min replicas per live tablet server) to at most 1; --apply executes them.",
    )
    _add_rebalance_args(p)


def register_replica(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `replica add|remove|move` group to the `tessera` parser."""
    sub = group_actions(subparsers, "replica", "add, remove or move one tablet replica")
    add = sub.add_parser(
        "add", help="add a replica on TS_UUID (a non-voter promoted once caught up)"
    )
    add.add_argument("tablet_id")
    add.add_argument("ts_uuid")
    add_connection_args(add, timeout=180.0)
    add.add_argument("--no-wait", action="store_true", help="do not wait for the promotion")
    add.set_defaults(handler=run_command(cmd_replica_add))

    rm = sub.add_parser("remove", help="remove the replica on TS_UUID (stepping down if it leads)")
    rm.add_argument("tablet_id")
    rm.add_argument("ts_uuid")
    add_connection_args(rm, timeout=180.0)
    rm.add_argument("--force", action="store_true", help="allow going below the replication factor")
    rm.set_defaults(handler=run_command(cmd_replica_remove))

    mv = sub.add_parser("move", help="move a replica: add TO_TS, wait, remove FROM_TS")
    mv.add_argument("tablet_id")
    mv.add_argument("from_ts")
    mv.add_argument("to_ts")
    add_connection_args(mv, timeout=180.0)
    mv.set_defaults(handler=run_command(cmd_replica_move))


def build_parser() -> argparse.ArgumentParser:
    """`rebalance`, `cluster rebalance` and `replica ...` (tests, `python -m`)."""
    p = argparse.ArgumentParser(prog="tessera", description="Tessera rebalancing and replicas")
    sub = p.add_subparsers(dest="command", required=True)
    _add_rebalance_args(sub.add_parser("rebalance", help="rebalance the cluster"))
    cluster = sub.add_parser("cluster", help="cluster commands")
    register_rebalance(cluster.add_subparsers(dest="action", required=True))
    register_replica(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
