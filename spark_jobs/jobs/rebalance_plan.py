"""Rebalancing plan: replica-count skew per table and per tablet server, and a saved plan.

    spark-submit spark_jobs/jobs/rebalance_plan.py --masters HOST:PORT,... [--max-moves N]
    tessera jobs run rebalance_plan --dir DIR                 # plan, print, save: dry run
    tessera jobs run rebalance_plan --dir DIR --apply-plan ID # execute a reviewed plan
    tessera jobs run rebalance_plan --dir DIR --apply         # plan and execute at once

The plan is Kudu's two-dimensional greedy rebalancer (`service.rebalance.rebalancing`, the same
code as `tessera cluster rebalance`): balanced when every table's and the cluster's skew is at
most 1. It is saved in tessera_audit.rebalance_plans under the run id, with its moves and the
skew before and after, for review (Cruise Control's reviewed plan). Executing a plan first
checks each move against the live cluster (the source must still hold a voter of the tablet,
the destination none) and skips moves the cluster no longer matches; moves run by add
non-voter, promote, remove, with compare-and-set, at most `--max-moves-per-server` in flight
per server. Findings: `table_imbalance` per table and `cluster_imbalance`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from service.common.errors import InvalidArgument, NotFound
from service.rebalance.rebalancing import (
    Distribution,
    Move,
    Placement,
    apply_moves,
    plan_moves,
    skew_report,
)
from spark_jobs.audit import AUDIT_TABLES, DATABASE
from spark_jobs.catalog import append, register_tables, retry_on_conflict
from spark_jobs.inventory import Inventory
from spark_jobs.jobs.common import EXIT_ERROR, JobContext, run_job
from spark_jobs.reconcile import Finding

JOB = "rebalance_plan"
PLANS_TABLE = "rebalance_plans"
PLANS = f"{DATABASE}.{PLANS_TABLE}"


def distribution(inv: Inventory) -> tuple[Distribution, dict[str, str]]:
    """The voters of RUNNING tablets of live tables on live servers; pinned tablets (a config
    change under way, no leader, a voter down, a table being altered) with the reason."""
    tables = {t.table_id: t for t in inv.tables if t.state in ("RUNNING", "ALTERING")}
    live = {s.ts_uuid for s in inv.tservers if s.live}
    by_tablet: dict[str, list[Any]] = {}
    for r in inv.replicas:
        by_tablet.setdefault(r.tablet_id, []).append(r)
    placements: list[Placement] = []
    pinned: dict[str, str] = {}
    for t in inv.tablets:
        table = tables.get(t.table_id)
        if table is None or t.state != "RUNNING":
            continue
        members = by_tablet.get(t.tablet_id, [])
        voters = [r.ts_uuid for r in members if r.member_type != "NON_VOTER"]
        placements += [Placement(t.table_id, t.tablet_id, v) for v in voters]
        if table.state == "ALTERING":
            pinned[t.tablet_id] = "its table is being altered"
        elif len(voters) != len(members):
            pinned[t.tablet_id] = "a config change is under way"
        elif not t.leader_uuid:
            pinned[t.tablet_id] = "no known leader"
        elif any(v not in live for v in voters):
            pinned[t.tablet_id] = "a voter is on a server that is not live"
        elif len(voters) != table.num_replicas:
            pinned[t.tablet_id] = f"{len(voters)} voters, replication factor {table.num_replicas}"
    return Distribution.of(placements, live, set(pinned)), pinned


def imbalance_findings(inv: Inventory, dist: Distribution, moves: Sequence[Move]) -> list[Finding]:
    """`table_imbalance` per table and `cluster_imbalance` whose skew is above 1 (action
    "move" when the plan has moves, "report" when every candidate is pinned)."""
    names = {t.table_id: t.name for t in inv.tables}
    rep = skew_report(dist)
    action = "move" if moves else "report"
    out = [
        Finding(
            JOB,
            "table_imbalance",
            t.table_id,
            names.get(t.table_id, ""),
            detail=f"replica-count skew {t.skew} across live servers",
            action=action,
        )
        for t in rep.tables
        if t.skew > 1
    ]
    if rep.cluster_skew > 1:
        out.append(
            Finding(
                JOB, "cluster_imbalance", detail=f"cluster skew {rep.cluster_skew}", action=action
            )
        )
    return out


def _save_plan(ctx: JobContext, inv: Inventory, dist: Distribution, moves: Sequence[Move]) -> None:
    before, after = skew_report(dist), skew_report(apply_moves(dist, moves))
    names = {t.table_id: t.name for t in inv.tables}
    rows = [
        {
            "plan_id": ctx.run_id,
            "created_at": ctx.started,
            "snapshot_id": inv.stamp.snapshot_id,
            "committed_index": inv.stamp.committed_index,
            "move_no": i,
            "tablet_id": m.tablet_id,
            "table_id": m.table_id,
            "table_name": names.get(m.table_id, ""),
            "from_ts": m.from_ts,
            "to_ts": m.to_ts,
            "cluster_skew_before": before.cluster_skew,
            "cluster_skew_after": after.cluster_skew,
            "max_table_skew_before": before.max_table_skew,
            "max_table_skew_after": after.max_table_skew,
        }
        for i, m in enumerate(moves)
    ]
    schema = pa.schema(
        [
            ("plan_id", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
            ("snapshot_id", pa.string()),
            ("committed_index", pa.int64()),
            ("move_no", pa.int64()),
            ("tablet_id", pa.string()),
            ("table_id", pa.string()),
            ("table_name", pa.string()),
            ("from_ts", pa.string()),
            ("to_ts", pa.string()),
            ("cluster_skew_before", pa.int64()),
            ("cluster_skew_after", pa.int64()),
            ("max_table_skew_before", pa.int64()),
            ("max_table_skew_after", pa.int64()),
        ]
    )
    df = ctx.spark.createDataFrame(pa.Table.from_pylist(rows, schema=schema))
    writer = (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", f"{PLANS}.{ctx.run_id}")
        .option("txnVersion", "1")
    )
    retry_on_conflict(lambda: append(ctx.spark, writer, DATABASE, PLANS_TABLE))


def _load_plan(ctx: JobContext, plan_id: str) -> list[Move]:
    register_tables(ctx.spark, DATABASE, AUDIT_TABLES)  # saved by another process, perhaps
    if not ctx.spark.catalog.tableExists(PLANS):
        raise NotFound(f"no saved plans: {PLANS} does not exist yet")
    rows = ctx.spark.table(PLANS).filter(f"plan_id = '{plan_id}'").orderBy("move_no").collect()
    if not rows:
        raise NotFound(f"no plan {plan_id!r} in {PLANS} (a dry run prints its plan id)")
    return [Move(r.tablet_id, r.table_id, r.from_ts, r.to_ts) for r in rows]


def _execute(ctx: JobContext, moves: Sequence[Move]) -> list[str]:
    """Run the moves that still match the cluster; an outcome per move."""
    from service.client.replica_ops import MoveStatus, execute_moves, verify_unchanged
    from service.client.sync import SyncClient

    client = SyncClient.shared(
        tuple(ctx.masters), timeout=ctx.args.timeout, credentials=ctx.credentials
    )
    stale = {s.move: s.reason for s in client.run(verify_unchanged(client.client, list(moves)))}
    todo = [m for m in moves if m not in stale]

    def progress(r: Any) -> None:
        if r.status is not MoveStatus.STARTED:
            print(
                f"    move {r.index + 1}/{len(todo)} {r.move.tablet_id[:12]}: "
                f"{r.status.name.lower()} {r.detail}".rstrip(),
                flush=True,
            )

    results = client.run(
        execute_moves(
            client.client,
            todo,
            max_in_flight_per_server=ctx.args.max_moves_per_server,
            progress=progress,
        )
    )
    done = {
        m: f"{r.status.name.lower()}{': ' + r.detail if r.detail else ''}"
        for m, r in zip(todo, results, strict=True)
    }
    return [done.get(m) or f"skipped: {stale[m]}" for m in moves]


def _extend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-moves",
        type=int,
        default=2000,
        help="plan at most this many moves (default 2000: a reviewed plan is executed in "
        "rounds; run the job again for the next round)",
    )
    p.add_argument(
        "--max-moves-per-server",
        type=int,
        default=1,
        help="moves in flight at once on any one server when executing",
    )
    p.add_argument("--apply-plan", metavar="ID", help="execute the saved plan ID")


def _run(ctx: JobContext) -> int:
    if ctx.args.apply_plan:
        if ctx.args.snapshot:
            raise InvalidArgument("--apply-plan acts on a live cluster: give --masters or --dir")
        moves = _load_plan(ctx, ctx.args.apply_plan)
        print(f"{JOB}: executing plan {ctx.args.apply_plan}: {len(moves)} move(s)")
        outcomes = _execute(ctx, moves)
        for m, o in zip(moves, outcomes, strict=True):
            print(f"    {m.tablet_id[:12]} {m.from_ts} -> {m.to_ts}: {o}")
        failed = sum(o.startswith("failed") for o in outcomes)
        print(
            f"{JOB}: {len(moves) - failed} of {len(moves)} moves done or skipped, {failed} failed"
        )
        return EXIT_ERROR if failed else 0
    inv = ctx.inventory()
    print(f"{JOB}: {inv.summary()}")
    dist, pinned = distribution(inv)
    moves = plan_moves(dist, max_moves=ctx.args.max_moves)
    before, after = skew_report(dist), skew_report(apply_moves(dist, moves))
    print(
        f"{JOB}: cluster skew {before.cluster_skew} -> {after.cluster_skew}, worst table skew "
        f"{before.max_table_skew} -> {after.max_table_skew}, {len(moves)} move(s), "
        f"{len(pinned)} tablet(s) pinned"
    )
    findings = imbalance_findings(inv, dist, moves)
    if moves and not ctx.args.no_record:
        _save_plan(ctx, inv, dist, moves)
        print(
            f"{JOB}: plan saved as {ctx.run_id} in {PLANS}; review it, then "
            f"--apply-plan {ctx.run_id}"
        )
    outcomes = ["planned" if moves else "reported"] * len(findings)
    if ctx.args.apply and moves:
        results = _execute(ctx, moves)
        ok = sum(not r.startswith(("failed", "skipped")) for r in results)
        outcomes = [f"applied: {ok}/{len(moves)} moves done"] * len(findings)
    return ctx.report(findings, outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(JOB, __doc__ or JOB, argv, _run, _extend)


if __name__ == "__main__":
    sys.exit(main())
