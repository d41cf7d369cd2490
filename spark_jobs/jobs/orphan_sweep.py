"""Orphan sweep: replicas the catalog does not account for (spark_jobs.reconcile).

    spark-submit spark_jobs/jobs/orphan_sweep.py --masters HOST:PORT,... [--apply]
    tessera jobs run orphan_sweep --dir DIR [--apply]

Replicas with no catalog record are reported and never deleted (docs/design/failover.md#R6);
replicas of deleted tablets are deleted and replicas out of their tablet's config tombstoned,
both with compare-and-set, only with --apply.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from spark_jobs.jobs.actions import apply_delete
from spark_jobs.jobs.common import JobContext, run_job
from spark_jobs.reconcile import orphan_findings

JOB = "orphan_sweep"


def _extend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--assignment-timeout-s",
        type=float,
        default=30.0,
        help="a tablet PREPARING or CREATING longer than this is stuck (the master's setting)",
    )


def _run(ctx: JobContext) -> int:
    inv = ctx.inventory()
    print(f"{JOB}: {inv.summary()}")
    now_us = (
        int(time.time() * 1e6)
        if not ctx.args.snapshot
        else int(inv.stamp.taken_at.timestamp() * 1e6)
    )
    findings = orphan_findings(
        inv, now_us=now_us, assignment_timeout_us=int(ctx.args.assignment_timeout_s * 1e6)
    )
    outcomes = []
    for f in findings:
        if ctx.args.apply and f.action in ("delete", "tombstone"):
            outcomes.append(apply_delete(inv, f, ctx.credentials))
        else:
            outcomes.append("reported" if f.action == "report" else "dry run")
    return ctx.report(findings, outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(JOB, __doc__ or JOB, argv, _run, _extend)


if __name__ == "__main__":
    sys.exit(main())
