"""Schema-version audit: replicas behind their table's schema, tables stuck ALTERING.

    spark-submit spark_jobs/jobs/schema_audit.py --masters HOST:PORT,... [--apply]
    tessera jobs run schema_audit --dir DIR [--apply]

With --apply, the table's current schema is sent again to each stale tablet's leader
(AlterSchema is idempotent there; the leader's log carries it to the lagging replica).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from spark_jobs.jobs.actions import apply_schema
from spark_jobs.jobs.common import JobContext, run_job
from spark_jobs.reconcile import schema_findings

JOB = "schema_audit"


def _run(ctx: JobContext) -> int:
    inv = ctx.inventory()
    print(f"{JOB}: {inv.summary()}")
    findings = schema_findings(inv)
    outcomes = []
    done: dict[str, str] = {}
    for f in findings:
        if ctx.args.apply and f.action == "alter_schema":
            # One AlterSchema per tablet, however many of its replicas are behind.
            if f.tablet_id not in done:
                done[f.tablet_id] = apply_schema(inv, f, ctx.masters, ctx.credentials)
            outcomes.append(done[f.tablet_id])
        else:
            outcomes.append("reported" if f.action == "report" else "dry run")
    return ctx.report(findings, outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(JOB, __doc__ or JOB, argv, _run)


if __name__ == "__main__":
    sys.exit(main())
