"""Spark Connect as a way in: a Connect server with Delta and the tessera source, and a client
helper that gives a remote session the source.

    tessera spark connect-server [--port 15002] [--warehouse DIR]   # foreground
    spark = spark_jobs.connect.connect_session("sc://127.0.0.1:15002")
    spark.read.format("tessera").option("masters", ...).option("table", "events").load()

The server is Spark's own (`org.apache.spark.sql.connect.service.SparkConnectServer`, whose jar
the pip pyspark ships) started with spark-submit, with the settings every Tessera session has
(`spark_jobs.session`: Delta's packages, extension and catalog, the warehouse, the table names)
and this interpreter as its Python workers, so the tessera source runs in them. A Python data
source is registered per session, and a Connect client's session is its own: `connect_session`
registers it on the remote session. A Connect client needs the `connect` extra
(`pip install 'tessera[connect]'`: grpcio-status, googleapis-common-protos, zstandard), which
the plain pyspark install lacks (it fails on the first call without it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs.catalog import CATALOG_IMPLEMENTATION, hive_requested
from spark_jobs.session import (
    _BUILTIN_DEFAULTS,
    REPO_ROOT,
    _configure_metastore,
    read_spark_defaults,
)

__all__ = ["CONNECT_SERVER_CLASS", "DEFAULT_PORT", "connect_session", "server_command"]

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
_LAUNCH_ONLY = ("spark.jars.packages", "spark.jars.excludes", "spark.master")


def server_command(
    port: int = DEFAULT_PORT,
    *,
    warehouse_dir: str | None = None,
    metastore_dir: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line (and environment) of a Connect server on 127.0.0.1:`port`
    with Tessera's session settings (module docstring)."""
    settings = {**_BUILTIN_DEFAULTS, **read_spark_defaults(), **(conf or {})}
    if CATALOG_IMPLEMENTATION not in (conf or {}) and hive_requested(conf or {}):
        settings[CATALOG_IMPLEMENTATION] = "hive"  # a metastore named: as build_session does
    settings["spark.connect.grpc.binding.address"] = "127.0.0.1"
    settings["spark.connect.grpc.binding.port"] = str(port)
    if warehouse_dir is not None:
        settings["spark.sql.warehouse.dir"] = str(Path(warehouse_dir).resolve())
    if metastore_dir is not None:
        _configure_metastore(settings, Path(metastore_dir).resolve())
    cmd: list[str] = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--class", CONNECT_SERVER_CLASS,
        "--master", settings.get("spark.master", "local[2]"),
        "--packages", settings["spark.jars.packages"],
    ]  # fmt: skip
    if settings.get("spark.jars.excludes"):
        cmd += ["--conf", f"spark.jars.excludes={settings['spark.jars.excludes']}"]
    for key, value in sorted(settings.items()):
        if key not in _LAUNCH_ONLY:
            cmd += ["--conf", f"{key}={value}"]
    cmd.append("spark-internal")
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    return cmd, env


def connect_session(url: str) -> SparkSession:
    """A Spark Connect session to `url` ("sc://host:port") with the tessera source registered
    on it (and so `format("tessera")` and `CREATE TEMPORARY VIEW ... USING tessera`)."""
    try:
        import grpc_status  # noqa: F401  (the Connect client fails obscurely without it)
    except ImportError as e:
        raise ImportError(
            "a Spark Connect client needs the 'connect' extra: pip install 'tessera[connect]'"
        ) from e
    spark = SparkSession.builder.remote(url).getOrCreate()
    from spark_jobs.audit import AUDIT_TABLES, DATABASE
    from spark_jobs.catalog import register_tables
    from spark_jobs.datasource import register

    register(spark)
    # A server with the default in-memory catalog knows only the tables it wrote itself; the
    # jobs' audit tables are named for it from the warehouse (spark_jobs/catalog.py).
    register_tables(spark, DATABASE, AUDIT_TABLES)
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    """`tessera spark connect-server`: run a Connect server in the foreground."""
    import argparse

    p = argparse.ArgumentParser(prog="tessera spark connect-server", description=__doc__)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--warehouse", help="the Spark SQL warehouse directory")
    p.add_argument(
        "--metastore",
        help="use a Hive metastore (embedded Derby) in this directory instead of the default "
        "in-memory catalog (spark_jobs/catalog.py)",
    )
    args = p.parse_args(argv)
    cmd, env = server_command(args.port, warehouse_dir=args.warehouse, metastore_dir=args.metastore)
    print(f"Spark Connect server on sc://127.0.0.1:{args.port} (Ctrl-C stops it)", flush=True)
    # This process becomes spark-submit (same pid): a supervisor's SIGTERM reaches the server
    # itself, where a child would have been left running when its parent was stopped.
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(main())
