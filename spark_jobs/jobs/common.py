"""What every reconciliation job shares: arguments, the inventory, reporting, exit codes.

Exit codes (documented in the README): 0 the job found nothing, 2 it found something (whether
or not `--apply` fixed it), 1 it could not run (a bad argument, no master leader, a Spark error).
Findings are printed as a table (or JSON lines with `--format json`) and appended to
`tessera_audit.findings` with the run id, the job and the action taken.

The SparkSession is built before any client exists in the process: a JVM launched (forked)
while gRPC threads run in the parent fails to start.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from service.client.credentials import ENV_VAR, find_credentials
from service.common.errors import InvalidArgument, TesseraError
from service.common.tls import Credentials
from spark_jobs.audit import RunBy, read_snapshot, write_findings
from spark_jobs.inventory import Inventory, fetch_inventory
from spark_jobs.reconcile import Finding

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FOUND", "JobContext", "parser", "run_job"]

EXIT_CLEAN, EXIT_ERROR, EXIT_FOUND = 0, 1, 2


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--masters", help="master addresses host:port[,host:port...]")
    src.add_argument("--dir", help="a local cluster's directory (tessera cluster up --dir)")
    src.add_argument(
        "--snapshot", help="run offline against a saved audit snapshot (an id, or 'latest')"
    )
    p.add_argument("--apply", action="store_true", help="act on the findings (default: dry run)")
    p.add_argument("--run-id", help="id of this run in tessera_audit.findings (default: new)")
    p.add_argument("--format", choices=["plain", "json"], default="plain")
    p.add_argument(
        "--no-record", action="store_true", help="do not append findings to tessera_audit"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per cluster call")
    p.add_argument(
        "--warehouse",
        metavar="DIR",
        help="the Spark SQL warehouse (default: $TESSERA_SPARK_HOME/warehouse, see "
        "spark_jobs/session.py; spark-submit's --conf spark.sql.warehouse.dir also wins)",
    )
    p.add_argument(
        "--metastore",
        metavar="DIR",
        help="use a Hive metastore (embedded Derby, one process at a time) in DIR instead of the "
        "default per-session catalog rebuilt from the warehouse (spark_jobs/catalog.py)",
    )
    p.add_argument(
        "--credentials",
        metavar="DIR",
        help="ca.pem, cert.pem, key.pem of a secured cluster (default: <--dir>/credentials, "
        "else $TESSERA_CREDENTIALS)",
    )
    return p


class JobContext:
    """A parsed job run: its Spark session, where its inputs come from, its run id."""

    def __init__(self, job: str, args: argparse.Namespace, spark: Any) -> None:
        self.job = job
        self.args = args
        self.spark = spark
        self.run_id = args.run_id or f"{job}-{uuid.uuid4().hex[:12]}"
        self.started = dt.datetime.now(dt.UTC)
        if args.apply and args.snapshot:
            raise InvalidArgument("--apply acts on a live cluster: give --masters or --dir")

    @property
    def masters(self) -> list[str]:
        if self.args.masters:
            return [a.strip() for a in self.args.masters.split(",") if a.strip()]
        if self.args.dir:
            from service.tools.local_cluster import master_addresses

            return master_addresses(self.args.dir)
        raise InvalidArgument("this needs a live cluster: give --masters or --dir")

    @property
    def credentials_dir(self) -> str | None:
        """The credentials directory (a path: Spark executors load it themselves), by the
        rules of service/client/credentials.py."""
        if getattr(self.args, "credentials", None):
            return str(self.args.credentials)
        if self.args.dir and (Path(self.args.dir) / "credentials").is_dir():
            return str(Path(self.args.dir).resolve() / "credentials")
        return os.environ.get(ENV_VAR) or None

    @property
    def credentials(self) -> Credentials | None:
        return find_credentials(self.credentials_dir)

    @property
    def run_by(self) -> RunBy:
        """Who runs this job, for the audit rows it writes."""
        return RunBy.of(self.credentials)

    def inventory(self) -> Inventory:
        if self.args.snapshot:
            return read_snapshot(self.spark, self.args.snapshot)
        return fetch_inventory(
            self.spark,
            self.masters,
            timeout=self.args.timeout,
            credentials_dir=self.credentials_dir,
        )

    def report(self, findings: Sequence[Finding], outcomes: Sequence[str]) -> int:
        """Print and record the findings; the job's exit code."""
        if self.args.format == "json":
            for f, o in zip(findings, outcomes, strict=True):
                print(json.dumps({"run_id": self.run_id, **asdict(f), "outcome": o}))
        else:
            print(render(self.job, findings, outcomes))
        if not self.args.no_record:
            write_findings(self.spark, self.run_id, self.started, findings, outcomes, self.run_by)
        return EXIT_FOUND if findings else EXIT_CLEAN


def render(job: str, findings: Sequence[Finding], outcomes: Sequence[str]) -> str:
    from service.tools.output import format_table

    if not findings:
        return f"{job}: clean, nothing found"
    rows = [
        {
            "kind": f.kind,
            "table": f.table_name,
            "tablet": f.tablet_id[:12],
            "server": f.ts_uuid[:14],
            "action": f.action,
            "outcome": o,
            "detail": f.detail,
        }
        for f, o in zip(findings, outcomes, strict=True)
    ]
    cols = ["kind", "table", "tablet", "server", "action", "outcome", "detail"]
    return f"{job}: {len(findings)} finding(s)\n" + format_table(rows, cols)


def run_job(
    job: str,
    description: str,
    argv: Sequence[str] | None,
    body: Callable[[JobContext], int],
    extend: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """Parse, build the session, run `body`; map errors to exit codes with one clear line."""
    p = parser(f"tessera jobs run {job}", description)
    if extend is not None:
        extend(p)
    try:
        args = p.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return EXIT_ERROR if e.code else EXIT_CLEAN
    try:
        from spark_jobs.session import build_session

        spark = build_session(
            f"tessera-{job}", warehouse_dir=args.warehouse, metastore_dir=args.metastore
        )
        return body(JobContext(job, args, spark))
    except TesseraError as e:
        print(f"{job}: {e.message}", file=sys.stderr)
        return EXIT_ERROR
    except RuntimeError as e:
        from spark_jobs.session import SparkSessionError

        if not isinstance(e, SparkSessionError):
            raise
        print(f"{job}: {e}", file=sys.stderr)
        return EXIT_ERROR
