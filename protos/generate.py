"""Generate service/pb/*_pb2.py (+ gRPC stubs and .pyi) from protos/service/pb/*.proto.

Layout: protos/<pkg path>/<name>.proto generates into <pkg path>/<name>_pb2.py, so imports in the
generated code are package-qualified (`from service.pb import x_pb2`).

    python protos/generate.py           regenerate in place
    python protos/generate.py --check   exit 1 if the committed code differs (drift)

The generator versions are pinned in pyproject.toml (grpcio-tools, mypy-protobuf): a different
version produces different bytes, which --check reports as drift.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PKG = "service/pb"


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # imported late: a dev dependency only

    # protoc finds the mypy plugins (protoc-gen-mypy*) on PATH: use this interpreter's bin dir.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    protos = sorted((PROTO_ROOT / OUT_PKG).glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    (out_root / OUT_PKG).mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in (out_root / OUT_PKG).iterdir() if p.suffix in {".py", ".pyi"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code drifted")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        names = {p.name for p in generated}
        target = ROOT / OUT_PKG
        committed = {
            p.name
            for p in target.iterdir()
            if p.suffix in {".py", ".pyi"} and p.name != "__init__.py"
        }
        if args.check:
            differ = {
                n
                for n in names & committed
                if not filecmp.cmp(Path(tmp) / OUT_PKG / n, target / n, shallow=False)
            }
            drift = sorted((names ^ committed) | differ)
            if drift:
                print("generated protobuf code drifted; run `make protos`:", *drift, sep="\n  ")
                return 1
            print(f"protos: {len(names)} generated files match")
            return 0
        for stale in committed - names:
            (target / stale).unlink()
        for p in generated:
            shutil.copyfile(p, target / p.name)
        print(f"protos: wrote {len(generated)} files to {OUT_PKG}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
