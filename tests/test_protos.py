"""Generated protobuf code is committed; this fails when it drifts from protos/ (run
`make protos`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_matches_protos() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_drift_is_detected(tmp_path: Path) -> None:
    """The check itself can fail: a tampered generated file is reported."""
    sys.path.insert(0, str(ROOT / "protos"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    target = ROOT / "service" / "pb" / "kvdemo_pb2.py"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b"\n# tampered\n")
        assert generate.main(["--check"]) == 1
    finally:
        target.write_bytes(original)
    assert generate.main(["--check"]) == 0
