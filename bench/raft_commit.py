"""Replicated-commit throughput: Tessera against etcd and PySyncObj, measured in one run.

    .venv/bin/python -m bench.raft_commit [--clients 64] [--seconds 10] [--skip-etcd]
                                          [--skip-pysyncobj]          (or: make bench-raft)

Each system runs as 3 real processes on loopback, one system at a time, and the same load
generator (bench/loadgen.py: 64 concurrent clients, distinct keys, 16-byte values, 2 s warm-up,
10 s measured, puts sent to the leader, one put in flight per client) drives each of them:

  tessera    3 KV demo nodes (service.tools.kv_demo_server via DemoCluster), conf/raft-demo.toml
             as shipped: wal.fsync = true (one fdatasync per group commit), secured as the
             product is by default: mutual TLS from a CA made for the run between the nodes and
             to the clients, Raft messages and client calls authorized by certificate. Clients
             put over the demo's PutStream (one stream per client, a put at a time).
  tessera-insecure  the same, measured right after it, plaintext and admitting anyone (what
             `security.mode = "insecure"` gives a master or tablet server): tessera divided by
             this row is the cost of security.
  tessera-unary  the secured cluster again, each put a unary Put call: what the client protocol
             costs (a grpc.aio server spends several hundred microseconds of CPU per unary
             call, a third of that per stream message). `--skip-unary` leaves it out.
  etcd       3 etcd 3.4 members (Debian's etcd-server), defaults: fsync of every WAL write; TLS
             with client certificates on its client and peer URLs, from a CA of our own PKI, so
             tessera/etcd compares secured with secured. Unary KV.Put, its only write API (a Go
             server's per-call cost is far lower).
  pysyncobj  3 PySyncObj 0.3.17 nodes with a gRPC front end, library defaults; its journal is
             never fsynced (it cannot be configured to), so it is not durable on acknowledgement,
             and it has no TLS. Driven over PutStream, as Tessera.

stdout: a table (puts/s, p50/p99 latency, errors, fsync, the load generator's CPU and the
servers' CPU in cores during the measured window), for Tessera each node's group commit over the
whole run (entries per fdatasync, proposals per batch, messages: the line each demo node logs
when it stops) and, last, exactly one line

    raft-commit: tessera X/s, etcd Y/s, pysyncobj Z/s, tessera/etcd R
    security-overhead: raft-commit S

with X (secured), Y, Z integers (0 for a skipped system), R = X / Y with two decimals (0.00
when etcd was skipped) and S = X / the tessera-insecure rate with two decimals (goal >= 0.8).
Progress goes to stderr. The machine may be shared: the load average is printed
with the table, and numbers are indicative, best compared within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import etcd_baseline, pysyncobj_baseline
from bench.loadgen import KvDemoTarget, LoadResult, LoadSpec, log, run_load
from service.common.pki import IdentityFiles
from service.testing.demo_cluster import DemoCluster


@dataclass
class Row:
    system: str
    fsync: str
    result: LoadResult | None  # None: skipped
    note: str = ""
    details: dict[str, str] = field(default_factory=dict)
    """Per server, extra lines for the report (Tessera: its group commit statistics)."""
    tls: str = "on"
    """"on": clients and peers spoke mutual TLS; "off": plaintext."""


async def _find_leader(addresses: list[str], creds: Path | None) -> str:
    files = None if creds is None else IdentityFiles.in_dir(creds)
    target = KvDemoTarget(addresses, credentials=files)
    try:
        await target.ready(30.0)
        assert target.leader is not None
        return target.leader
    finally:
        await target.aclose()


GROUP_COMMIT = "group commit:"  # the line RaftNode.stats() gives and kv_demo_server logs at exit


def group_commit_stats(cluster: DemoCluster, names: dict[str, str]) -> dict[str, str]:
    """Each stopped node's last group-commit line from its log, by display name."""
    out = {}
    for uuid, node in cluster.nodes.items():
        try:
            text = node.log.read_text(errors="replace")
        except OSError:
            continue
        lines = [line for line in text.splitlines() if GROUP_COMMIT in line]
        if lines:
            out[names.get(uuid, uuid)] = lines[-1].split(GROUP_COMMIT, 1)[1].strip()
    return out


def run_tessera(
    clients: int,
    seconds: float,
    warmup: float,
    value_size: int,
    procs: int,
    kind: str = "kvdemo-stream",
    *,
    secure: bool = True,
    label: str = "tessera",
) -> tuple[LoadResult, dict[str, str]]:
    """One measurement of a new 3-node cluster: the load's result and each node's group
    commit statistics. `secure`: mutual TLS and authorization by certificate, the load
    generator a `user` of the cluster's CA; otherwise plaintext, admitting anyone."""
    base = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    cluster = DemoCluster(base, 3, overrides={"wal.fsync": "true"}, secure=secure)
    log(
        f"{label}: 3 KV demo nodes (conf/raft-demo.toml), wal.fsync=true, "
        + ("mutual TLS" if secure else "plaintext")
    )
    names: dict[str, str] = {}
    try:
        creds = cluster.credentials_dir("user", "bench")
        cluster.start()
        leader = asyncio.run(_find_leader(cluster.addresses, creds))
        pids = {}
        for uuid, node in cluster.nodes.items():
            assert node.proc is not None
            name = names[uuid] = f"{uuid} (leader)" if node.address == leader else uuid
            pids[name] = node.proc.pid
        spec = LoadSpec(
            kind=kind,
            addresses=tuple(cluster.addresses),
            clients=clients,
            seconds=seconds,
            warmup=warmup,
            value_size=value_size,
            procs=procs,
            label=label,
            credentials="" if creds is None else str(creds),
        )
        result = asyncio.run(run_load(spec, server_pids=pids))
        cluster.stop()
        return result, group_commit_stats(cluster, names)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def run_secured_and_insecure(
    clients: int, seconds: float, warmup: float, value_size: int, procs: int
) -> list[Row]:
    """Tessera's PutStream commits secured, then the same insecure, one after the other so
    that they share the machine's minute: the rows `tessera` and `tessera-insecure`."""
    common = (clients, seconds, warmup, value_size, procs)
    secured, secured_details = run_tessera(*common)
    insecure, insecure_details = run_tessera(*common, secure=False, label="tessera-insecure")
    return [
        Row("tessera", "on", secured, details=secured_details),
        Row("tessera-insecure", "on", insecure, details=insecure_details, tls="off"),
    ]


def _fmt(x: float, spec: str) -> str:
    return "-" if math.isnan(x) else format(x, spec)


def table(rows: list[Row]) -> str:
    head = (
        f"{'system':<16} {'puts/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
        f"{'fsync':>5} {'tls':>4} {'loadgen':>8} {'servers':>8} {'busiest':>8}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        r = row.result
        if r is None:
            lines.append(f"{row.system:<16} {'skipped':>8}  {row.note}")
            continue
        busiest = max(r.server_cores.values(), default=math.nan)
        lines.append(
            f"{row.system:<16} {r.rate:8.0f} {_fmt(r.p50_ms, '8.2f')} {_fmt(r.p99_ms, '8.2f')} "
            f"{r.errors:6d} {row.fsync:>5} {row.tls:>4} {r.loadgen_cores:8.2f} "
            f"{sum(r.server_cores.values()):8.2f} {_fmt(busiest, '8.2f')}"
        )
    lines.append(
        "loadgen/servers/busiest: CPU cores used during the measured window by the load "
        "generator, by all 3 server processes, and by the busiest one; tls: mutual TLS between "
        "clients and servers and among the servers"
    )
    for row in rows:
        if row.result is not None and row.result.server_cores:
            per = ", ".join(f"{k} {v:.2f}" for k, v in row.result.server_cores.items())
            lines.append(f"  {row.system}: {per}")
        if row.result is not None and row.result.error_kinds:
            lines.append(f"  {row.system} errors: {row.result.error_kinds}")
        if row.details:
            lines.append(f"  {row.system} group commit over the whole run (from the node logs):")
            lines.extend(f"    {name}: {text}" for name, text in row.details.items())
    return "\n".join(lines)


def _rates(rows: list[Row]) -> dict[str, float]:
    return {row.system: (row.result.rate if row.result else 0.0) for row in rows}


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, 0.0 when the denominator was not measured."""
    return numerator / denominator if denominator else 0.0


def security_overhead(rows: list[Row]) -> float:
    """Secured Tessera's commit rate over the insecure one's (the goal is >= 0.8)."""
    rate = _rates(rows)
    return ratio(rate.get("tessera", 0.0), rate.get("tessera-insecure", 0.0))


def final_line(rows: list[Row]) -> str:
    rate = _rates(rows)
    t, e, p = (round(rate.get(s, 0.0)) for s in ("tessera", "etcd", "pysyncobj"))
    r = ratio(rate.get("tessera", 0.0), rate.get("etcd", 0.0))
    return f"raft-commit: tessera {t}/s, etcd {e}/s, pysyncobj {p}/s, tessera/etcd {r:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Raft commit throughput: Tessera vs etcd vs PySyncObj, same load, same run"
    )
    p.add_argument("--clients", type=int, default=64, help="concurrent puts in flight")
    p.add_argument("--seconds", type=float, default=10.0, help="measured window per system")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured load before the window")
    p.add_argument("--value-size", type=int, default=16)
    p.add_argument("--procs", type=int, default=1, help="load generator processes")
    p.add_argument("--skip-etcd", action="store_true")
    p.add_argument("--skip-pysyncobj", action="store_true")
    p.add_argument("--skip-unary", action="store_true", help="no tessera-unary row")
    args = p.parse_args(argv)
    common = (args.clients, args.seconds, args.warmup, args.value_size, args.procs)
    load = os.getloadavg()
    log(
        f"raft-commit: {args.clients} clients, {args.value_size}-byte values, "
        f"{args.warmup:g} s warm-up + {args.seconds:g} s measured per system, "
        f"{args.procs} load generator process(es); load average {load[0]:.2f}"
    )
    rows = run_secured_and_insecure(*common)
    if not args.skip_unary:
        unary, unary_details = run_tessera(*common, kind="kvdemo", label="tessera-unary")
        rows.append(Row("tessera-unary", "on", unary, details=unary_details))
    if args.skip_etcd:
        rows.append(Row("etcd", "on", None, "(--skip-etcd)"))
    else:
        r = etcd_baseline.run(*common)
        rows.append(Row("etcd", "on", r, "" if r else "(etcd not available)"))
    if args.skip_pysyncobj:
        rows.append(Row("pysyncobj", "off", None, "(--skip-pysyncobj)", tls="off"))
    else:
        r = pysyncobj_baseline.run(*common, kind="kvdemo-stream")
        rows.append(Row("pysyncobj", "off", r, tls="off"))
    print(
        f"{args.clients} clients, {args.value_size}-byte values, {args.seconds:g} s measured, "
        f"3 processes per system on loopback, {os.cpu_count()} CPUs, load average before the "
        f"run {load[0]:.2f}"
    )
    print(table(rows))
    print(final_line(rows))
    print(f"security-overhead: raft-commit {security_overhead(rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
