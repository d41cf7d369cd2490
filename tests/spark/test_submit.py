"""`build_session` respects its caller: under spark-submit, `--master` and `--conf` win over
Tessera's small-machine defaults (a job submitted with `--master spark://...` used to run in
local[2]); in a plain Python process $SPARK_MASTER_URL replaces the default master."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.session import REPO_ROOT, launcher_settings, read_spark_defaults

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCRIPT = """
import json
from spark_jobs.session import build_session
spark = build_session("submit-test")
conf = spark.sparkContext.getConf()
print("RESULT " + json.dumps({
    "master": spark.sparkContext.master,
    "shuffle": conf.get("spark.sql.shuffle.partitions"),
    "ui": conf.get("spark.ui.enabled"),
    "extensions": conf.get("spark.sql.extensions"),
}))
spark.stop()
"""


def _submit(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    packages = read_spark_defaults()["spark.jars.packages"]
    full_env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO_ROOT),
        **(env or {}),
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--packages", packages, *args,
         str(script)],
        capture_output=True, text=True, timeout=240, env=full_env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))  # type: ignore[no-any-return]


def test_spark_submit_master_and_conf_win_over_our_defaults(tmp_path: Path) -> None:
    got = _submit(tmp_path, "--master", "local[1]", "--conf", "spark.sql.shuffle.partitions=7")
    assert got["master"] == "local[1]"  # our default is local[2]
    assert got["shuffle"] == "7"  # our default is 4
    assert got["ui"] == "false"  # a default nobody set on the command line still applies
    assert got["extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_spark_master_url_replaces_the_default_master(tmp_path: Path) -> None:
    """In a plain Python process (`tessera jobs run`, docker-compose's job runner), where
    spark-submit chose nothing, $SPARK_MASTER_URL is the master."""
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "SPARK_MASTER_URL": "local[1]", "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT "))["master"] == "local[1]"


def test_outside_spark_submit_the_launcher_set_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without spark-submit's gateway no JVM is asked (none is started for it): {}."""
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert launcher_settings() == {}


def test_warehouse_default_outside_the_source_tree_and_no_shared_metastore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_SPARK_HOME", str(tmp_path / "state"))
    d = read_spark_defaults()
    assert d["spark.sql.warehouse.dir"] == str(tmp_path / "state" / "warehouse")
    # No metastore database to share by default (spark_jobs/catalog.py).
    assert d["spark.sql.catalogImplementation"] == "in-memory"
    assert not any("derby" in v.lower() for v in d.values())
    monkeypatch.delenv("TESSERA_SPARK_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    d = read_spark_defaults()
    assert d["spark.sql.warehouse.dir"] == str(tmp_path / "xdg" / "tessera" / "spark" / "warehouse")
    assert not any(str(REPO_ROOT) in v for k, v in d.items() if "derby" in v or "warehouse" in k)
