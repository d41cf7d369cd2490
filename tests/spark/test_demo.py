"""`make demo` runs `python -m spark_jobs.demo`: run it (smaller) as its own process, the way the
README's command does, and check that it ends healthy and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.demo", "--rows", "20000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "demo finished: everything healthy" in out
    assert "read back" in out and "orphan_sweep: exit 0" in out
    assert not keep.exists()
    # Every server it started is gone (the cluster is stopped before it prints the summary).
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "tessera-demo-" not in ps
