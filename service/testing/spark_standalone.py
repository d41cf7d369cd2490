"""A Spark standalone cluster on loopback (a master and one worker, from the pip pyspark
package), for tests and demos that must prove the cluster path: `spark-submit --master
spark://...` registering an application and running its tasks in an executor process, not in
local mode.

    with StandaloneSpark(tmp_dir) as spark_cluster:
        subprocess.run([spark_submit, "--master", spark_cluster.url, ...])
        assert spark_cluster.executor_logs()  # tasks ran in the worker's executor

The worker runs executors under `<base>/work/<app-id>/<executor-id>/` and keeps their stderr
there, which is how a test sees what ran where. Every process binds port 0 on 127.0.0.1 and
the ports it got are read from its log: choosing a free port first and passing it on races with
any other process on the machine (a CI run beside ours once took the master's UI port, and its
page was read as ours). Every process is stopped on exit.
"""

from __future__ import annotations

import json
import os
import re
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


# What the master logs once it has bound its two ports (Spark's Utils.startServiceOnPort).
_MASTER_PORT = re.compile(rb"Successfully started service 'sparkMaster' on port (\d+)")
_MASTER_UI_PORT = re.compile(rb"Successfully started service 'MasterUI' on port (\d+)")


class StandaloneSpark:
    def __init__(self, base: Path, *, cores: int = 1, memory: str = "1g") -> None:
        self.base = base
        self.cores = cores
        self.memory = memory
        self.port = 0  # known once the master has bound it (__enter__)
        self.ui_port = 0
        self.url = ""
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
        log = (self.base / f"{name}.log").open("wb")  # fresh: _bound_port reads it
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
            body = r.read()
        try:
            return dict(json.loads(body))
        except ValueError:
            raise RuntimeError(
                f"http://127.0.0.1:{self.ui_port}/json/ is not a Spark master's status page: "
                f"{body[:120]!r}"
            ) from None

    def _bound_port(self, name: str, pattern: re.Pattern[bytes], timeout: float = 90.0) -> int:
        """The port a process logged it bound (it was started with port 0)."""
        log = self.base / f"{name}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self._procs):
                raise RuntimeError(f"the Spark {name} exited before binding its ports; see {log}")
            m = pattern.search(log.read_bytes()) if log.exists() else None
            if m:
                return int(m.group(1))
            time.sleep(0.2)
        raise TimeoutError(f"Spark standalone: the {name} bound no port within {timeout:.0f}s")

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
                "--port", "0",
                "--webui-port", "0",
            )  # fmt: skip
            self.port = self._bound_port("master", _MASTER_PORT)
            self.ui_port = self._bound_port("master", _MASTER_UI_PORT)
            self.url = f"spark://127.0.0.1:{self.port}"
            self._wait("the master", lambda s: s.get("status") == "ALIVE")
            self._start(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host", "127.0.0.1",
                "--port", "0",
                "--webui-port", "0",
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
