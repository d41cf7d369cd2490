"""`tessera jobs list | run NAME [job arguments]`, `tessera spark connect-server` and `tessera spark
submit [spark-submit arguments] SCRIPT [arguments]` (spark_jobs/submit.py): the Spark
side's commands, which spark_jobs plugs into the `tessera` command through the
`tessera.commands` entry point (pyproject.toml): the tools sit below spark_jobs in the layers
(docs/design/layers.md#R1), so they find these commands without importing them.

`jobs list | run NAME [job arguments]`: the reconciliation jobs, in this process.

`run` hands the rest of the command line to the job's own `main(argv)` (spark_jobs.jobs), which
is also what `spark-submit spark_jobs/jobs/NAME.py ...` runs; here Spark runs in local mode with
the repository's conf/spark-defaults.conf. Exit codes are the job's: 0 clean, 2 found something,
1 error.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["register"]


def _list(args: argparse.Namespace) -> int:
    from spark_jobs import jobs

    for name in jobs.JOBS:
        module = importlib.import_module(f"spark_jobs.jobs.{name}")
        first = (module.__doc__ or "").strip().splitlines()[0]
        print(f"{name:<16} {first}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from spark_jobs import jobs

    if args.job not in jobs.JOBS:
        print(f"tessera: unknown job {args.job!r}; jobs: {', '.join(jobs.JOBS)}")
        return 2
    module = importlib.import_module(f"spark_jobs.jobs.{args.job}")
    code: int = module.main(args.job_args)
    return code


def _connect_server(args: argparse.Namespace) -> int:
    from spark_jobs import connect

    argv = ["--port", str(args.port)]
    if args.warehouse:
        argv += ["--warehouse", args.warehouse]
    if args.metastore:
        argv += ["--metastore", args.metastore]
    return connect.main(argv)


def _submit(args: argparse.Namespace) -> int:
    from spark_jobs import submit

    rest = list(args.submit_args)
    # Our flags count only before the script (whose own arguments are its business).
    script = next((i for i, a in enumerate(rest) if a.endswith((".py", ".jar"))), len(rest))
    delta = "--no-delta" not in rest[:script]
    if not delta:
        rest.remove("--no-delta")
    # spark-submit's own --verbose also turns Spark's logging back on.
    return submit.main(rest, verbose="--verbose" in rest[:script], delta=delta)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = subparsers.add_parser("jobs", help="reconciliation jobs and the Delta audit (Spark)")
    sub = jobs.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="the jobs and what they do")
    ls.set_defaults(handler=_list)
    run = sub.add_parser(
        "run",
        help="run a job (dry run unless --apply)",
        description="Run a job; arguments after NAME go to the job (see NAME --help).",
    )
    run.add_argument("job", metavar="NAME")
    run.add_argument("job_args", nargs=argparse.REMAINDER)
    run.set_defaults(handler=_run)
    spark = subparsers.add_parser("spark", help="Spark Connect server with Delta and the source")
    ssub = spark.add_subparsers(dest="action", required=True)
    connect = ssub.add_parser(
        "connect-server",
        help="run a Spark Connect server (foreground); clients: spark_jobs.connect",
        description="A Spark Connect server with Delta and the tessera source (spark_jobs/"
        "connect.py); clients connect to sc://HOST:PORT.",
    )
    # Declared here, not passed through as a remainder: argparse gives a remainder nothing that
    # starts with '-' when it comes first ("unrecognized arguments: --port").
    connect.add_argument("--port", type=int, default=15002, help="default 15002")
    connect.add_argument("--warehouse", help="the Spark SQL warehouse directory")
    connect.add_argument(
        "--metastore",
        help="a Hive metastore (embedded Derby) in this directory instead of the in-memory catalog",
    )
    connect.set_defaults(handler=_connect_server)
    submit = ssub.add_parser(
        "submit",
        # '+', so that every '-' argument is spark-submit's, passed through unparsed.
        prefix_chars="+",
        add_help=False,
        help="spark-submit with the Delta package, excludes, settings and quiet logs from conf/",
        description="Runs this environment's spark-submit with the Delta package and its "
        "excludes, Delta's SQL settings and conf/log4j2.properties (spark_jobs/submit.py), "
        "then every argument given (--master, --deploy-mode, --conf, the script and its "
        "arguments). --verbose: Spark's logs too; --no-delta: without Delta.",
    )
    submit.add_argument("submit_args", nargs=argparse.REMAINDER)
    submit.set_defaults(handler=_submit)
