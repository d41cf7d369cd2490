"""The cluster path, proven on a real Spark standalone cluster (a master and a worker on
loopback, from the pip pyspark package): `spark-submit --master spark://...` registers the
application with the master and the tessera source's reads and writes run as tasks in the
worker's executor process, with Tessera's credentials and an authz-checked user. The jobs
(orphan sweep, schema audit, audit snapshot) run there too, in the slow suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest

from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from service.testing.spark_standalone import StandaloneSpark, spark_bin
from spark_jobs.session import REPO_ROOT, read_spark_defaults
from tests.spark.conftest import masters

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"
SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")

SCRIPT = """
import json, sys
from spark_jobs.session import build_session
masters, creds = sys.argv[1], sys.argv[2]
spark = build_session("standalone-test")
df = (spark.read.format("tessera").option("masters", masters).option("credentials", creds)
      .option("table", "src").load())
n = df.count()
df.where("id % 2 = 0").write.format("tessera").option("masters", masters) \\
    .option("credentials", creds).option("table", "dst").mode("append").save()
print("RESULT " + json.dumps({"master": spark.sparkContext.master, "count": n,
                              "app": spark.sparkContext.applicationId}))
spark.stop()
"""


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneSpark]:
    with StandaloneSpark(tmp_path_factory.mktemp("standalone")) as s:
        yield s


def _submit(
    standalone: StandaloneSpark, tmp_path: Path, script: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**standalone.env(), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [
            spark_bin("spark-submit"),
            "--master", standalone.url,
            "--packages", read_spark_defaults()["spark.jars.packages"],
            "--conf", "spark.executor.memory=512m",
            "--conf", f"spark.sql.warehouse.dir={tmp_path / 'wh'}",
            str(script),
            *args,
        ],
        capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path,
    )  # fmt: skip


def test_spark_submit_to_a_standalone_cluster_reads_and_writes_in_its_executor(
    standalone: StandaloneSpark, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    ps = PartitionSchema(hash=(HashBucketSchema(("id",), 3),))
    for name in ("src", "dst"):
        client.call("create_table", name, SCHEMA, ps)
    client.write("src", pa.table({"id": pa.array(range(1000), pa.int64()), "v": ["x"] * 1000}))
    # A user with read on src and write on dst, not an admin: tablet servers check the
    # executors' calls against authz tokens.
    client.call("grant", "src", "spark-job", ["read"])
    client.call("grant", "dst", "spark-job", ["write", "read"])
    user = cluster.credentials_dir("user", "spark-job")
    assert user is not None
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = _submit(standalone, tmp_path, script, masters(cluster), user)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    assert got["master"] == standalone.url and got["count"] == 1000
    rows = [r for t in client.scan_tokens("dst") for b in client.scan_batches(t) for r in
            b.column("id").to_pylist()]  # fmt: skip
    assert len(rows) == 500
    # The application registered with the standalone master, and its tasks ran in the worker's
    # executor (the executor's own log, under the worker's work dir, shows them).
    apps = standalone.state()["completedapps"] + standalone.state()["activeapps"]  # type: ignore[operator]
    assert got["app"] in {a["id"] for a in apps}
    logs = {k: v for k, v in standalone.executor_logs().items() if k.startswith(got["app"])}
    assert logs and any("Running task" in v for v in logs.values()), list(logs)


def test_tessera_spark_submit_runs_a_script_on_the_standalone_cluster(
    standalone: StandaloneSpark, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    """The launcher (spark_jobs/submit.py) against a standalone master, from a shell with no
    virtualenv on PATH and nothing about Spark set but the loopback address."""
    ps = PartitionSchema(hash=(HashBucketSchema(("id",), 2),))
    for name in ("src_l", "dst_l"):
        client.call("create_table", name, SCHEMA, ps)
    client.write("src_l", pa.table({"id": pa.array(range(100), pa.int64()), "v": ["x"] * 100}))
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace('"src"', '"src_l"').replace('"dst"', '"dst_l"'))
    creds = cluster.credentials_dir()
    assert creds is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(PYTHONPATH=str(REPO_ROOT), PATH="/usr/bin:/bin", SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "tessera"), "spark", "submit",
         "--master", standalone.url, "--conf", "spark.executor.memory=512m",
         # A later --conf wins: the executors log at INFO again, so their "Running task"
         # lines show where the tasks ran (the driver stays quiet).
         "--conf", "spark.executor.extraJavaOptions=-Dtessera.test=1",
         str(script), masters(cluster), creds],
        capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    assert got["master"] == standalone.url and got["count"] == 100
    logs = {k: v for k, v in standalone.executor_logs().items() if k.startswith(got["app"])}
    assert logs and any("Running task" in v for v in logs.values()), list(logs)
    noisy = [x for x in (proc.stdout + proc.stderr).splitlines() if " INFO " in x]
    assert not noisy, noisy[:5]


@pytest.mark.slow
def test_the_jobs_run_on_a_standalone_cluster(
    standalone: StandaloneSpark, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    creds = cluster.credentials_dir()
    assert creds is not None
    jobs = REPO_ROOT / "spark_jobs" / "jobs"
    for job, ok in (("audit_snapshot", {0}), ("orphan_sweep", {0, 2}), ("schema_audit", {0, 2})):
        proc = _submit(
            standalone,
            tmp_path,
            jobs / f"{job}.py",
            "--masters", masters(cluster),
            "--credentials", creds,
        )  # fmt: skip
        assert proc.returncode in ok, (job, proc.stderr[-4000:])
    assert len({k.split("/")[0] for k in standalone.executor_logs()}) >= 3


RECIPE_MARK = "<!-- spark-submit recipe:"
README_MASTER, README_MASTERS, README_CREDENTIALS = (
    "spark://spark-master:7077",
    "h1:7051,h2:7051",
    "/path/to/credentials",
)


def readme_recipe() -> str:
    """The shell block that follows the recipe's marker comment in README.md."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count(RECIPE_MARK) == 1, "README.md: one spark-submit recipe marker"
    after = readme[readme.index(RECIPE_MARK) :]
    match = re.search(r"-->\s*```sh\n(.*?)```", after, flags=re.S)
    assert match is not None, "README.md: a ```sh block right after the recipe marker"
    return match.group(1)


def test_the_readme_spark_submit_recipe_runs_as_written(
    standalone: StandaloneSpark, cluster: MiniCluster, tmp_path: Path
) -> None:
    """README.md's spark-submit recipe, run with bash from the repository root with only its
    placeholders replaced: it succeeds against the standalone cluster, Ivy adds no jar that
    pyspark already ships (spark.jars.excludes did its work), and the job's tasks ran in the
    worker's executor."""
    recipe = readme_recipe()
    defaults = read_spark_defaults()
    assert f"--packages {defaults['spark.jars.packages']} " in recipe, "README pins other jars"
    for placeholder in (README_MASTER, README_MASTERS, README_CREDENTIALS):
        assert recipe.count(placeholder) == 1, placeholder
    creds = cluster.credentials_dir()
    assert creds is not None
    script = (
        recipe.replace(README_MASTER, standalone.url)
        .replace(README_MASTERS, masters(cluster))
        .replace(README_CREDENTIALS, creds)
    )
    before = set(standalone.executor_logs())
    env = {
        **standalone.env(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "TESSERA_SPARK_HOME": str(tmp_path / "spark-home"),  # the job's warehouse, if it writes
    }
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True, text=True, timeout=400, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode in (0, 2), proc.stderr[-4000:]  # clean, or found something
    assert "orphan_sweep:" in proc.stdout, proc.stdout[-2000:]

    # Ivy's report lists the modules it put on the classpath ("org#artifact;version from ...").
    used = re.findall(r"^\s+(\S+)#(\S+);\S+ from \S+ in \[default\]$", proc.stderr, re.M)
    group, artifact, _ = defaults["spark.jars.packages"].split(":")
    assert (group, artifact) in used, used
    excluded = {tuple(x.split(":")) for x in defaults["spark.jars.excludes"].split(",")}
    assert not excluded & set(used), excluded & set(used)
    shipped = {re.sub(r"-\d.*\.jar$", "", j.name) for j in PYSPARK_JARS.glob("*.jar")}
    assert not {a for _, a in used} & shipped, "Ivy added a jar pyspark already ships"

    # The job's tasks (the inventory's per-server listings) ran in the worker's executor.
    new = {k: v for k, v in standalone.executor_logs().items() if k not in before}
    assert new and any("Running task" in v for v in new.values()), list(new)
