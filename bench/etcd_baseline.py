"""etcd baseline: a 3-member etcd 3.4 cluster on loopback, driven by bench.loadgen.

    .venv/bin/python -m bench.etcd_baseline [--clients 64] [--seconds 10]

`ensure_etcd()` finds the `etcd` binary; when it is missing it runs `apt-get update` and
`apt-get install -y etcd-server` (Debian's package, etcd 3.4), echoing what apt does. If that
fails the caller gets `None` and reports etcd as skipped.

`EtcdCluster` starts three members on free 127.0.0.1 ports, data directories under one temporary
directory, with etcd's defaults: every WAL write is fsynced (etcd has no switch to turn that
off in 3.4 short of `--unsafe-no-fsync`, which is not used), `--heartbeat-interval 100` and
`--election-timeout 1000` (etcd's documented defaults, spelled out), snapshot count and backend
quota at their defaults. `stop()` sends SIGTERM, then SIGKILL to whatever is left, and removes
the data directories, so no process or file is left behind.

Secured by default (`secure=True`), as Tessera is in the same run: a CA made for the cluster
with our own PKI (`service.common.pki.ClusterPki`) signs each member's certificate, and the
members speak TLS with client certificates required on both their client and their peer URLs
(`--client-cert-auth`, `--peer-client-cert-auth`, every `--*-file` from that CA). The load
generator connects as a `user` identity of the same CA (`client_credentials`), over TLS too.
`--insecure` measures plain HTTP/2 for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.loadgen import (
    LoadResult,
    LoadSpec,
    etcd_is_leader,
    etcd_url,
    https_context,
    log,
    run_load,
)
from service.common.pki import CertificateAuthority, ClusterPki, IdentityFiles
from service.common.private_files import write_private_file
from service.tools.launcher import StopOnExit, free_ports, terminate_all

HEARTBEAT_MS = 100  # etcd's default --heartbeat-interval
ELECTION_MS = 1000  # etcd's default --election-timeout


def etcd_version(binary: str) -> str:
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return r.stdout.splitlines()[0] if r.stdout else "unknown"


def ensure_etcd(install: bool = True) -> str | None:
    """Path of the etcd binary, installing Debian's etcd-server if needed; None if unavailable."""
    found = shutil.which("etcd")
    if found or not install:
        return found
    if not shutil.which("apt-get"):
        log("etcd: binary not found and apt-get is not available; etcd is skipped")
        return None
    log("etcd: binary not found; installing Debian's etcd-server with apt-get")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "etcd-server"]):
        log(f"etcd: $ {' '.join(cmd)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as e:
            log(f"etcd: could not run {cmd[0]}: {e}; etcd is skipped")
            return None
        for line in r.stdout.decode(errors="replace").splitlines():
            log(f"etcd:   {line}")
        if r.returncode != 0:
            log(f"etcd: `{' '.join(cmd)}` failed with exit code {r.returncode}; etcd is skipped")
            return None
    found = shutil.which("etcd")
    if not found:
        log("etcd: etcd-server installed but no `etcd` on PATH; etcd is skipped")
    return found


LOOPBACK = "127.0.0.1"


def member_certificate(ca: CertificateAuthority, name: str) -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) of the etcd member `name`: our CA's server certificate for it
    (`CertificateAuthority.issue`: its key, subject, usages and DNS names), signed again with
    the loopback address added to its names. etcd dials a peer by its URL and verifies the
    certificate against the URL's host, and checks a peer's client certificate against the
    connection's address; neither can be told to expect the name `tessera` that our servers'
    certificates carry for this purpose."""
    cert_pem, key_pem = ca.issue("master", name)
    issued = x509.load_pem_x509_certificate(cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    builder = x509.CertificateBuilder(
        issuer_name=issued.issuer,
        subject_name=issued.subject,
        public_key=issued.public_key(),
        serial_number=issued.serial_number,
        not_valid_before=issued.not_valid_before_utc,
        not_valid_after=issued.not_valid_after_utc,
    )
    for ext in issued.extensions:
        value = ext.value
        if isinstance(value, x509.SubjectAlternativeName):
            ip = x509.IPAddress(ipaddress.ip_address(LOOPBACK))
            value = x509.SubjectAlternativeName([*value, ip])
        builder = builder.add_extension(value, ext.critical)
    signed = builder.sign(ca_key, hashes.SHA256())
    return signed.public_bytes(serialization.Encoding.PEM), key_pem


class EtcdCluster(StopOnExit):
    def __init__(
        self, binary: str, base: Path | None = None, size: int = 3, *, secure: bool = True
    ) -> None:
        self.binary = binary
        self.base = Path(tempfile.mkdtemp(prefix="etcd-bench-")) if base is None else base
        self.size = size
        ports = free_ports(2 * size)
        self.names = [f"etcd-{i}" for i in range(1, size + 1)]
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pki = ClusterPki(self.base / "pki") if secure else None
        self.client_credentials: IdentityFiles | None = None
        """The load generator's identity (a credentials directory); None when insecure."""
        if self.pki is not None:
            self.client_credentials = self.pki.export("user", "bench", self.base / "client")
        self._https = (
            None if self.client_credentials is None else https_context(self.client_credentials)
        )

    @property
    def scheme(self) -> str:
        return "http" if self.pki is None else "https"

    def _tls_args(self, name: str) -> list[str]:
        """A member's certificate and etcd's flags requiring TLS and client certificates."""
        if self.pki is None:
            return []
        cert, key = member_certificate(self.pki.ca, name)
        cert_file, key_file = self.base / f"{name}.pem", self.base / f"{name}.key"
        write_private_file(cert_file, cert)
        write_private_file(key_file, key)
        ca_file = self.pki.directory / "ca.pem"
        return [
            f"--{side}{flag}"
            for side in ("", "peer-")
            for flag in (
                f"cert-file={cert_file}",
                f"key-file={key_file}",
                f"trusted-ca-file={ca_file}",
                "client-cert-auth",
            )
        ]

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    def start(self, timeout: float = 30.0) -> None:
        scheme = self.scheme
        initial = ",".join(
            f"{n}={scheme}://{LOOPBACK}:{p}"
            for n, p in zip(self.names, self.peer_ports, strict=True)
        )
        for name, cport, pport in zip(self.names, self.client_ports, self.peer_ports, strict=True):
            client_url = f"{scheme}://{LOOPBACK}:{cport}"
            peer_url = f"{scheme}://{LOOPBACK}:{pport}"
            args = [
                self.binary,
                f"--name={name}",
                f"--data-dir={self.base / name}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster={initial}",
                "--initial-cluster-state=new",
                "--initial-cluster-token=tessera-bench",
                f"--heartbeat-interval={HEARTBEAT_MS}",
                f"--election-timeout={ELECTION_MS}",
                "--logger=zap",
                "--log-level=warn",
                *self._tls_args(name),
            ]
            logf = (self.base / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
            logf.close()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name, address in zip(self.names, self.addresses, strict=True):
            while True:
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {self.log_tail(name)}")
                try:
                    url = etcd_url(address, "/health", self._https)
                    with urllib.request.urlopen(url, timeout=1, context=self._https) as r:
                        if json.loads(r.read()).get("health") == "true":
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not healthy after {timeout}s")
                time.sleep(0.1)

    def leader(self) -> str | None:
        for address in self.addresses:
            try:
                if etcd_is_leader(address, self._https):
                    return address
            except OSError:
                continue
        return None

    def log_tail(self, name: str) -> str:
        try:
            return (self.base / f"{name}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        terminate_all(self.procs.values())
        shutil.rmtree(self.base, ignore_errors=True)


def run(
    clients: int = 64,
    seconds: float = 10.0,
    warmup: float = 2.0,
    value_size: int = 16,
    procs: int = 1,
    install: bool = True,
    *,
    secure: bool = True,
) -> LoadResult | None:
    """One measurement of etcd; None when etcd is not available (skipped)."""
    binary = ensure_etcd(install)
    if binary is None:
        return None
    log(
        f"etcd: {etcd_version(binary)} at {binary}; 3 members, fsync on (etcd default), "
        + ("client and peer TLS with client certificates" if secure else "plaintext")
    )
    with EtcdCluster(binary, secure=secure) as cluster:
        creds = cluster.client_credentials
        spec = LoadSpec(
            kind="etcd",
            addresses=tuple(cluster.addresses),
            clients=clients,
            seconds=seconds,
            warmup=warmup,
            value_size=value_size,
            procs=procs,
            label="etcd",
            credentials="" if creds is None else str(creds.ca_file.parent),
        )
        return asyncio.run(run_load(spec, server_pids=cluster.pids))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="etcd 3-member baseline under bench.loadgen")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--insecure", action="store_true", help="plaintext client and peer URLs")
    args = p.parse_args(argv)
    r = run(args.clients, args.seconds, args.warmup, procs=args.procs, secure=not args.insecure)
    if r is None:
        print("etcd: skipped (not installed)")
        return 0
    print(
        f"etcd: {r.rate:.0f} puts/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, "
        f"errors {r.errors}, load generator {r.loadgen_cores:.2f} cores, "
        f"servers {sum(r.server_cores.values()):.2f} cores"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
