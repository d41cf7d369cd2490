"""Catalog audit snapshot: the catalog and every tablet server's listing, appended to Delta.

    spark-submit spark_jobs/jobs/audit_snapshot.py --masters HOST:PORT,... [--snapshot-id ID]
    tessera jobs run audit_snapshot --dir DIR

Writes tessera_audit.{tables,tablets,replicas,hosted_replicas,tservers,masters} (the catalog as
of this snapshot, merged by key) and their *_history twins (every snapshot's rows), then a row
in tessera_audit.snapshots (spark_jobs.audit). Retrying with the same --snapshot-id, or
snapshotting a catalog that has not moved (same master term and committed index), writes
nothing and says so. Unreachable tablet servers are findings (kind unreachable_tserver), not
failures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from service.common.errors import InvalidArgument
from spark_jobs.audit import write_snapshot
from spark_jobs.inventory import fetch_inventory
from spark_jobs.jobs.common import JobContext, run_job
from spark_jobs.reconcile import Finding

JOB = "audit_snapshot"


def _extend(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshot-id", help="id of the snapshot (default: its UTC time)")


def _run(ctx: JobContext) -> int:
    if ctx.args.snapshot:
        raise InvalidArgument("audit_snapshot reads a live cluster: give --masters or --dir")
    inv = fetch_inventory(
        ctx.spark,
        ctx.masters,
        snapshot_id=ctx.args.snapshot_id,
        timeout=ctx.args.timeout,
        credentials_dir=ctx.credentials_dir,
    )
    done = write_snapshot(ctx.spark, inv, ctx.run_by)
    where = f"term {inv.stamp.master_term}, index {inv.stamp.committed_index}"
    if done.status == "exists":
        print(f"{JOB}: snapshot {done.previous} was already written; nothing to do")
    elif done.status == "unchanged":
        print(
            f"{JOB}: the catalog ({where}) is as snapshot {done.previous} saw it; nothing written"
        )
    else:
        print(
            f"{JOB}: snapshot {inv.stamp.snapshot_id} ({where}): "
            + ", ".join(f"{k} {v}" for k, v in done.counts.items())
        )
    findings = [
        Finding(JOB, "unreachable_tserver", ts_uuid=s.ts_uuid, detail=s.error)
        for s in inv.tservers
        if not s.reachable
    ]
    return ctx.report(findings, ["reported"] * len(findings))


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(JOB, __doc__ or JOB, argv, _run, _extend)


if __name__ == "__main__":
    sys.exit(main())
