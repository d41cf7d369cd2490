"""`build_session` respects its caller: under spark-submit, `--master` and `--conf` win over
Tessera's small-machine defaults (a job submitted with `--master spark://...` used to run in
local[2]); in a plain Python process $SPARK_MASTER_URL replaces the default master."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
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


# --- tessera spark submit (spark_jobs/submit.py) ------------------------------------------------

USER_SCRIPT = """
import json, sys
from spark_jobs.session import SparkSessionError, build_session, require_delta
masters, creds = sys.argv[1], sys.argv[2]
spark = build_session("user-script")
n = (spark.read.format("tessera").option("masters", masters).option("credentials", creds)
     .option("table", "people").load().count())
try:
    require_delta(spark, "this script's audit step")
    delta = "ok"
except SparkSessionError as e:
    delta = str(e)
print("RESULT " + json.dumps({"count": n, "delta": delta, "master": spark.sparkContext.master}))
spark.stop()
"""


def tessera_submit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`tessera spark submit ARGS` as a user types it, from `tmp_path`, with only the project
    importable (what installing it does) and nothing about Spark in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PATH"] = "/usr/bin:/bin"  # no virtualenv on PATH: the launcher finds its own Spark
    return subprocess.run(
        [str(Path(sys.executable).parent / "tessera"), "spark", "submit", *args],
        capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path,
    )  # fmt: skip


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A cluster with a 40-row table `people`: (masters, credentials directory)."""
    schema = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
    with MiniCluster(tmp_path_factory.mktemp("submit-cluster")) as cluster:
        creds = cluster.credentials_dir()
        assert creds is not None
        creds_obj = cluster.credentials()
        with SyncClient(cluster.master_addresses, timeout=60, credentials=creds_obj) as c:
            ps = PartitionSchema(hash=(HashBucketSchema(("id",), 2),))
            c.call("create_table", "people", schema, ps)
            c.write("people", pa.table({"id": pa.array(range(40), pa.int64()), "v": ["x"] * 40}))
        yield ",".join(cluster.master_addresses), creds


def test_tessera_spark_submit_runs_a_job_quietly_with_delta(
    tmp_path: Path, people: tuple[str, str]
) -> None:
    masters, creds = people
    job = REPO_ROOT / "spark_jobs" / "jobs" / "audit_snapshot.py"
    proc = tessera_submit(
        tmp_path, "--master", "local[1]", str(job), "--masters", masters, "--credentials", creds,
        "--warehouse", str(tmp_path / "wh"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert any(x.startswith("audit_snapshot: snapshot ") for x in proc.stdout.splitlines()), (
        proc.stdout
    )
    # Quiet: Spark's and Ivy's INFO lines do not bury the job's own output.
    noisy = [x for x in (proc.stdout + proc.stderr).splitlines() if " INFO " in x]
    assert not noisy, noisy[:5]
    assert (tmp_path / "wh").is_dir()  # the audit tables were written (Delta was there)


def test_a_script_without_delta_runs_and_a_delta_step_names_the_flags(
    tmp_path: Path, people: tuple[str, str]
) -> None:
    masters, creds = people
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    proc = tessera_submit(
        tmp_path, "--no-delta", "--master", "local[1]", str(script), masters, creds
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    assert got["count"] == 40 and got["master"] == "local[1]"
    assert "--packages io.delta:delta-spark_" in got["delta"], got["delta"]
    assert "tessera spark submit" in got["delta"]
