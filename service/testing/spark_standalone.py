"""A Spark standalone cluster on loopback (a master and one worker, from the pip pyspark
package), for tests and demos that must prove the cluster path: `spark-submit --master
spark://...` registering an application and running its tasks in an executor process, not in
local mode.

    with StandaloneSpark(tmp_dir) as spark_cluster:
        subprocess.run([spark_submit, "--master", spark_cluster.url, ...])
        assert spark_cluster.executor_logs()  # tasks ran in the worker's executor

The worker runs executors under `<base>/work/<app-id>/<executor-id>/` and keeps their stderr
there, which is how a test sees what ran where. Ports are free ones on 127.0.0.1; every
process is stopped on exit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from service.tools.launcher import terminate_all

__all__ = ["StandaloneSpark", "spark_bin"]


def spark_bin(name: str) -> str:
    """A Spark launcher script of this environment's pyspark (spark-submit, spark-class)."""
    return str(Path(sys.executable).parent / name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneSpark:
    def __init__(self, base: Path, *, cores: int = 1, memory: str = "1g") -> None:
        self.base = base
        self.cores = cores
        self.memory = memory
        self.port = _free_port()
        self.ui_port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.work_dir = base / "work"
        self._procs: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        """The environment for the cluster's processes and for spark-submit against it."""
        return {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def _start(self, name: str, *args: str) -> None:
        log = (self.base / f"{name}.log").open("ab")
        self._procs.append(
            subprocess.Popen(
                [spark_bin("spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.base,
            )
        )
        log.close()

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def _wait(self, what: str, ok: object, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self._procs):
                raise RuntimeError(f"a Spark process exited while waiting for {what}")
            try:
                if ok(self.state()):  # type: ignore[operator]
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"Spark standalone: {what} not within {timeout:.0f}s")

    def __enter__(self) -> StandaloneSpark:
        self.base.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--webui-port", str(self.ui_port),
            )  # fmt: skip
            self._wait("the master", lambda s: s.get("status") == "ALIVE")
            self._start(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host", "127.0.0.1",
                "--webui-port", str(_free_port()),
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--work-dir", str(self.work_dir),
            )  # fmt: skip
            self._wait("a worker", lambda s: s.get("aliveworkers", 0) >= 1)
        except BaseException:
            self.close()
            raise
        return self

    def executor_logs(self) -> dict[str, str]:
        """stderr of every executor the worker ran, by `<app-id>/<executor-id>`."""
        out = {}
        for err in sorted(self.work_dir.glob("*/*/stderr")):
            out[f"{err.parent.parent.name}/{err.parent.name}"] = err.read_text(errors="replace")
        return out

    def close(self) -> None:
        terminate_all(self._procs)
        self._procs.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
