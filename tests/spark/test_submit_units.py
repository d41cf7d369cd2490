"""`tessera spark submit`'s command line (spark_jobs/submit.py), without starting Spark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from service.tools.cli import build_parser, main
from spark_jobs import submit
from spark_jobs.session import DELTA_SETTINGS, LOG4J2_FILE, read_spark_defaults
from spark_jobs.submit import spark_home, submit_command


def test_the_command_adds_delta_and_quiet_logs_before_the_callers_arguments() -> None:
    cmd, env = submit_command(
        ["--master", "local[1]", "--conf", "a=b", "job.py", "--x"], environ={"PATH": "/usr/bin"}
    )
    d = read_spark_defaults()
    assert cmd[0] == str(spark_home() / "bin" / "spark-submit")
    assert cmd[1:3] == ["--packages", d["spark.jars.packages"]]
    assert f"spark.jars.excludes={d['spark.jars.excludes']}" in cmd
    for key in DELTA_SETTINGS:
        assert f"{key}={d[key]}" in cmd
    option = f"-Dlog4j2.configurationFile={LOG4J2_FILE.as_uri()}"
    assert f"spark.driver.extraJavaOptions={option}" in cmd
    assert f"spark.executor.extraJavaOptions={option}" in cmd
    # The caller's arguments come last, unchanged: a later --conf wins in spark-submit.
    assert cmd[-6:] == ["--master", "local[1]", "--conf", "a=b", "job.py", "--x"]
    assert env["SPARK_HOME"] == str(spark_home())
    assert env["PYSPARK_PYTHON"] == sys.executable
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_verbose_keeps_sparks_logs_and_no_delta_leaves_delta_out() -> None:
    cmd, _ = submit_command(["job.py"], verbose=True, delta=False, environ={})
    assert not any("log4j2" in a or "delta" in a or a == "--packages" for a in cmd)
    # The caller's own SPARK_HOME is kept.
    _, env = submit_command(["job.py"], environ={"SPARK_HOME": "/opt/spark"})
    assert env["SPARK_HOME"] == "/opt/spark"


def test_the_cli_passes_every_argument_through() -> None:
    args = build_parser().parse_args(
        ["spark", "submit", "--no-delta", "--master", "local[1]", "s.py", "--no-delta", "-v"]
    )
    assert args.submit_args == ["--no-delta", "--master", "local[1]", "s.py", "--no-delta", "-v"]


def test_our_flags_count_only_before_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[str, object] = {}

    def fake(args: list[str], *, verbose: bool, delta: bool) -> int:
        got.update(args=args, verbose=verbose, delta=delta)
        return 0

    monkeypatch.setattr(submit, "main", fake)
    assert main(["spark", "submit", "--no-delta", "s.py", "--no-delta", "--verbose"]) == 0
    assert got == {"args": ["s.py", "--no-delta", "--verbose"], "verbose": False, "delta": False}
    assert main(["spark", "submit", "--verbose", "s.py"]) == 0
    assert got == {"args": ["--verbose", "s.py"], "verbose": True, "delta": True}
