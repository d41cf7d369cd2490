"""`tessera spark submit`: spark-submit with everything a Tessera job needs, and nothing else.

Theory of operation
-------------------
A bare `spark-submit` of a Tessera job needs four things users kept getting wrong: the
virtualenv's Spark (`SPARK_HOME`, or "Could not find valid SPARK_HOME"), the Delta package with
its exclude list (without the excludes Ivy adds 25 jars pyspark already ships), Delta's SQL
extension and catalog, and a log configuration that keeps Spark's INFO chatter out of the job's
findings. This launcher runs this environment's `spark-submit` with

    --packages <conf/spark-defaults.conf's spark.jars.packages>
    --conf spark.jars.excludes=<the same file's list>
    --conf spark.sql.extensions=... --conf spark.sql.catalog.spark_catalog=... (Delta's)
    --conf spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=<conf/log4j2.properties>
    --conf spark.executor.extraJavaOptions=(the same)          (both left out with --verbose)

then every argument it was given, unchanged (`--master`, `--deploy-mode`, `--conf`, the script
and its arguments): spark-submit lets a later `--conf` win, so the caller's choices override
these. `--no-delta` leaves Delta out (a job that only reads or writes Tessera tables starts
faster without Ivy). The environment gets `SPARK_HOME` (pyspark's directory) and
`PYSPARK_PYTHON` (this interpreter) unless they are set, and the virtualenv's `bin` first on
`PATH`.

Clusters with their own Spark use the plain spark-submit line in the README instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyspark

from spark_jobs.session import DELTA_SETTINGS, LOG4J2_FILE, read_spark_defaults

__all__ = ["main", "submit_command"]


def spark_home() -> Path:
    return Path(pyspark.__file__).resolve().parent


def submit_command(
    args: Sequence[str],
    *,
    verbose: bool = False,
    delta: bool = True,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line and environment `tessera spark submit ARGS` runs."""
    defaults = read_spark_defaults()
    cmd = [str(spark_home() / "bin" / "spark-submit")]
    if delta:
        cmd += ["--packages", defaults["spark.jars.packages"]]
        cmd += ["--conf", f"spark.jars.excludes={defaults['spark.jars.excludes']}"]
        for key in DELTA_SETTINGS:
            cmd += ["--conf", f"{key}={defaults[key]}"]
    if not verbose and LOG4J2_FILE.is_file():
        option = f"-Dlog4j2.configurationFile={LOG4J2_FILE.as_uri()}"
        for side in ("driver", "executor"):
            cmd += ["--conf", f"spark.{side}.extraJavaOptions={option}"]
    cmd += list(args)
    env = dict(os.environ if environ is None else environ)
    env.setdefault("SPARK_HOME", str(spark_home()))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")]).rstrip(os.pathsep)
    return cmd, env


def main(args: Sequence[str], *, verbose: bool = False, delta: bool = True) -> int:
    """Run spark-submit (foreground); its exit code."""
    if not any(not a.startswith("-") for a in args):
        print(
            "tessera spark submit: name the script to run (a job: spark_jobs/jobs/NAME.py)",
            file=sys.stderr,
        )
        return 2
    cmd, env = submit_command(args, verbose=verbose, delta=delta)
    return subprocess.call(cmd, env=env)
