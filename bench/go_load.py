"""The Go load generator (`bench/grpcload`): build it, run it, read its one JSON line.

Why a second load generator: on this 2-core machine a Python grpc.aio client spends about as
much CPU per call as the Python server answering it, so the Python clients and the server
they measure split the machine between them. `grpcload` (Go, pass-through codec) costs a
small fraction of that, as the C++ and Java clients Kudu's own benchmarks use, so what it
measures is closer to the server's own capacity. bench-master prints both.

Go is on the project's machines (not needed by the README's two commands): the first run
builds the binary into `bench/grpcload/bin/` (git-ignored), fetching google.golang.org/grpc
from the Go module proxy; later runs reuse it until main.go or go.sum changes. Without Go,
`build` says why and the benchmark prints the Python-client figures alone.

With `credentials` it speaks mutual TLS as that identity (the files Tessera's own clients
use), so a secured server is measured with the handshake and record encryption a real client
costs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from service.common.pki import IdentityFiles

SRC = Path(__file__).resolve().parent / "grpcload"
BIN = SRC / "bin" / "grpcload"


@dataclass(frozen=True)
class LoadResult:
    calls: int
    errors: int
    seconds: float
    rps: float
    p50_us: int
    p99_us: int


def build() -> tuple[Path | None, str]:
    """The binary, built if missing or older than its sources; (None, why) if it cannot be."""
    go = shutil.which("go")
    if go is None:
        return None, "go is not on PATH"
    newest = max(p.stat().st_mtime for p in (SRC / "main.go", SRC / "go.mod", SRC / "go.sum"))
    if BIN.exists() and BIN.stat().st_mtime >= newest:
        return BIN, "built before"
    r = subprocess.run(
        [go, "build", "-o", str(BIN), "."], cwd=SRC, capture_output=True, text=True, timeout=900
    )
    if r.returncode != 0:
        return None, f"go build failed: {r.stderr.strip()[-500:]}"
    return BIN, "built"


def run(
    binary: Path,
    address: str,
    method: str,
    request: bytes,
    *,
    clients: int = 32,
    conns: int = 4,
    seconds: float = 5.0,
    credentials: IdentityFiles | None = None,
) -> LoadResult:
    """`clients` closed-loop callers of `method` (/package.Service/Method) over `conns`
    connections for `seconds`, after half a second of warm-up; mutual TLS as `credentials`
    (the server verified as any Tessera server), plaintext without."""
    tls = []
    if credentials is not None:
        tls = ["-ca", str(credentials.ca_file), "-cert", str(credentials.cert_file),
               "-key", str(credentials.key_file)]  # fmt: skip
    r = subprocess.run(
        [
            str(binary),
            "-addr", address,
            "-method", method,
            "-request", request.hex(),
            "-clients", str(clients),
            "-conns", str(conns),
            "-seconds", str(seconds),
            *tls,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )  # fmt: skip
    return LoadResult(**json.loads(r.stdout.strip().splitlines()[-1]))
