"""What the fuzzing campaign checks after its cases, and how it looks.

Theory of operation
-------------------
Each check is cheap enough to run as often as it is needed, and reads the cluster only through
its public surface (RPCs as admin, /metrics, the status page, the log files):

* Liveness, every case: `Popen.poll()` of every server. A server that exited is a crash.
* The catalog, around every catalog-changing case (`catalog_view`): DumpCatalog (live tables
  and their tablets), ListGrants and ListMasters, normalized to what a request can change:
  tables' names, schemas, partitioning, replication and owners; tablets' partitions and the
  uuids of their committed config; grants; the masters' membership. What only background work
  changes (table and tablet states, terms, leaders, member types, timestamps) is left out, so a
  difference is a request's doing.
* A tablet server's replicas, around every refused tablet-admin case (`tserver_view`):
  ListTablets (which replicas, their data state, schema version and config) and the highest
  master term it has seen (its status page: it decides which fenced requests it obeys).
* A tablet's rows on one replica, around every refused Write to a fixture (`replica_checksum`).
* Replicas agree (`replicas_agree`), every few hundred cases and at the end: the Checksum of
  every replica of every fixture tablet, each asked to reach the highest applied index any
  of them reported first; equal row counts and digests.
* Event-loop stalls (`StallProbe`): every few cases the servers' own
  `tessera_event_loop_stalls_total` (service/common/loop_lag.py: wake-ups later than the Raft
  heartbeat interval, 500 ms in conf/), measured inside each server, so it sees every stall and
  nothing of the fuzzer's own scheduling. After every case a Ping to every server at once: how
  long it takes points at the case to blame, and judges servers that do not count stalls.
* The machine (`MachineWatch`): a control process that only sleeps and notes when it woke
  late. A server stall while it was late too is the machine's (other processes on the CPUs).
* Server logs (`LogWatch`), every case: a new "Traceback" in any server's log means an
  exception escaped somewhere, even when the caller got a proper status.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc
from service.testing.fuzz_cluster import FuzzCluster
from service.tools.launcher import terminate_all

__all__ = [
    "CatalogView",
    "LogWatch",
    "MachineWatch",
    "StallProbe",
    "catalog_view",
    "describe_diff",
    "replica_checksum",
    "replicas_agree",
    "tserver_view",
]

STALL_BOUND_S = 0.5
"""The Raft heartbeat interval in conf/: longer than this and followers may start to doubt a
healthy leader (service/common/loop_lag.py counts wake-ups later than this)."""

CatalogView = dict[str, Any]


def _schema_key(s: Any) -> tuple[object, ...]:
    cols = tuple(
        (
            c.name,
            c.type,
            c.nullable,
            c.default_value if c.HasField("default_value") else None,
            c.precision if c.HasField("precision") else None,
            c.scale if c.HasField("scale") else None,
        )
        for c in s.columns
    )
    return (cols, tuple(s.key_column_names), s.version)


def catalog_view(fc: FuzzCluster) -> CatalogView:
    """The catalog as requests can change it (module docstring), as plain values."""
    stub = fc.stub()
    tables: dict[str, object] = {}
    tablets: dict[str, object] = {}
    for chunk in stub.DumpCatalog(mpb.DumpCatalogRequestPB(), timeout=10):
        for row in chunk.rows:
            if row.HasField("table"):
                t = row.table
                tables[t.table_id] = (
                    t.name,
                    _schema_key(t.schema),
                    t.partition_schema.SerializeToString(deterministic=True),
                    t.num_replicas,
                    t.owner,
                )
            elif row.HasField("tablet"):
                tb = row.tablet
                if tb.state == mpb.TabletRecordPB.REPLACED:
                    continue
                peers = frozenset(
                    p.permanent_uuid for p in tb.consensus_state.committed_config.peers
                )
                tablets[tb.tablet_id] = (
                    tb.table_id,
                    tb.partition.SerializeToString(deterministic=True),
                    peers,
                )
    grants = frozenset(
        (g.table_id, g.user, tuple(g.privileges))
        for g in stub.ListGrants(mpb.ListGrantsRequestPB(), timeout=10).grants
    )
    masters = frozenset(
        m.instance.permanent_uuid
        for m in stub.ListMasters(mpb.ListMastersRequestPB(), timeout=10).masters
    )
    return {"tables": tables, "tablets": tablets, "grants": grants, "masters": masters}


def restrict(view: CatalogView, table_ids: Iterable[str]) -> CatalogView:
    """The part of `view` about the tables `table_ids` (the fixtures)."""
    ids = set(table_ids)
    return {
        "tables": {k: v for k, v in view["tables"].items() if k in ids},
        "tablets": {k: v for k, v in view["tablets"].items() if v[0] in ids},
        "grants": frozenset(g for g in view["grants"] if g[0] in ids),
        "masters": view["masters"],
    }


def describe_diff(before: Mapping[str, Any], after: Mapping[str, Any], limit: int = 6) -> str:
    """What changed between two views, briefly ("tables: + id (...); tablets: ~ id")."""
    parts = []
    for section in sorted(set(before) | set(after)):
        b, a = before.get(section), after.get(section)
        if b == a:
            continue
        if isinstance(b, dict) and isinstance(a, dict):
            added = [k for k in a if k not in b]
            gone = [k for k in b if k not in a]
            changed = [k for k in a if k in b and a[k] != b[k]]
            items = [f"+{k} {_short(a[k])}" for k in added] + [f"-{k}" for k in gone]
            items += [f"~{k} {_short(b[k])} -> {_short(a[k])}" for k in changed]
        elif isinstance(b, frozenset) and isinstance(a, frozenset):
            items = [f"+{_short(x)}" for x in a - b] + [f"-{_short(x)}" for x in b - a]
        else:
            items = [f"{_short(b)} -> {_short(a)}"]
        parts.append(f"{section}: " + "; ".join(items[:limit]))
    return " | ".join(parts)


def _short(v: object) -> str:
    s = repr(v)
    return s if len(s) <= 160 else s[:157] + "..."


_TERM_RE = re.compile(r"Highest master term seen</th><td>(\d+)<")


def tserver_view(fc: FuzzCluster, name: str, tablets: Iterable[str]) -> dict[str, Any]:
    """One tablet server's replicas of `tablets` (absent ones absent) and its fencing term
    (module docstring). Only those: replicas of other tables come and go on their own (a
    table created a moment ago by an accepted request is still being created or deleted)."""
    watched = set(tablets)
    ts = fc.mini.tservers[name]
    stub = tserver_pb2_grpc.TabletServerAdminServiceStub(fc.channel("admin", ts.address))
    r = stub.ListTablets(tpb.ListTabletsRequestPB(dest_uuid=ts.uuid), timeout=10)
    replicas = {
        x.tablet_id: (
            x.table_id,
            x.data_state,
            x.schema_version,
            frozenset(p.permanent_uuid for p in x.consensus_state.committed_config.peers),
        )
        for x in r.replicas
        if x.tablet_id in watched
    }
    page = urllib.request.urlopen(f"http://{ts.http_address}/", timeout=10).read().decode()
    m = _TERM_RE.search(page)
    return {"replicas": replicas, "highest_master_term": int(m.group(1)) if m else None}


def replica_checksum(fc: FuzzCluster, name: str, tablet_id: str) -> tuple[int, bytes] | None:
    """(row count, digest) of one replica now, or None if it cannot say."""
    ts = fc.mini.tservers[name]
    stub = tserver_pb2_grpc.TabletServerServiceStub(fc.channel("admin", ts.address))
    try:
        r = stub.Checksum(tpb.ChecksumRequestPB(dest_uuid=ts.uuid, tablet_id=tablet_id), timeout=10)
    except grpc.RpcError:
        return None
    return r.row_count, r.digest


def replicas_agree(fc: FuzzCluster, tablet_ids: Iterable[str], timeout: float = 30.0) -> list[str]:
    """Disagreements among the replicas of `tablet_ids` (module docstring); [] when they all
    hold the same rows. Followers get `timeout` to catch up."""
    problems = []
    for tablet_id in tablet_ids:
        deadline = time.monotonic() + timeout
        while True:
            sums = _checksums(fc, tablet_id)
            if len({(n, d) for n, d, _ in sums.values()}) == 1 and len(sums) == 3:
                break
            if time.monotonic() > deadline:
                problems.append(
                    f"tablet {tablet_id}: replicas disagree: "
                    + ", ".join(
                        f"{k}: {v[0]} rows, digest {v[1].hex()[:12]}, applied {v[2]}"
                        for k, v in sorted(sums.items())
                    )
                    + f" ({3 - len(sums)} did not answer)"
                )
                break
            time.sleep(0.5)
    return problems


def _checksums(fc: FuzzCluster, tablet_id: str) -> dict[str, tuple[int, bytes, int]]:
    first: dict[str, tuple[int, bytes, int]] = {}
    for name, ts in fc.mini.tservers.items():
        stub = tserver_pb2_grpc.TabletServerServiceStub(fc.channel("admin", ts.address))
        try:
            r = stub.Checksum(
                tpb.ChecksumRequestPB(dest_uuid=ts.uuid, tablet_id=tablet_id), timeout=10
            )
            first[name] = (r.row_count, r.digest, r.applied_index)
        except grpc.RpcError:
            continue
    target = max((v[2] for v in first.values()), default=0)
    out = {}
    for name, ts in fc.mini.tservers.items():
        stub = tserver_pb2_grpc.TabletServerServiceStub(fc.channel("admin", ts.address))
        try:
            r = stub.Checksum(
                tpb.ChecksumRequestPB(
                    dest_uuid=ts.uuid, tablet_id=tablet_id, min_applied_index=target
                ),
                timeout=10,
            )
            out[name] = (r.row_count, r.digest, r.applied_index)
        except grpc.RpcError:
            continue
    return out


@dataclass
class StallProbe:
    """Pings every server after a case; reads the servers' stall counters now and then."""

    fc: FuzzCluster
    bound_s: float = STALL_BOUND_S
    counters: dict[str, float] = field(default_factory=dict)
    counted: bool = False
    """Whether the servers count their own stalls (then a slow Ping is only a hint: it
    includes the fuzzer's own scheduling)."""
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="fuzz-scrape")
    )

    def ping(self) -> dict[str, float]:
        """Seconds each server took to answer a Ping sent to all at once; servers slower
        than the bound are returned (those that did not answer, with the bound's double)."""
        calls: list[tuple[str, float, Any]] = []
        for name, address, path in self._targets():
            call = self.fc.channel("admin", address).unary_unary(
                path, request_serializer=None, response_deserializer=None
            )
            calls.append((name, time.monotonic(), call.future(b"", timeout=2 * self.bound_s)))
        slow = {}
        for name, t0, fut in calls:
            try:
                fut.result()
                took = time.monotonic() - t0
            except grpc.RpcError:
                took = 2 * self.bound_s
            if took > self.bound_s:
                slow[name] = took
        return slow

    def _targets(self) -> Iterable[tuple[str, str, str]]:
        for m in self.fc.mini.masters.masters.values():
            if m.alive:
                yield m.name, m.address, "/tessera.master.MasterService/Ping"
        for ts in self.fc.mini.tservers.values():
            if ts.alive:
                yield ts.name, ts.address, "/tessera.tserver.TabletServerService/Ping"

    def scrape(self) -> dict[str, float]:
        """Stalls each server counted since the last scrape (tessera_event_loop_stalls_total),
        all servers read at once; a server restarted meanwhile starts again from its own
        zero."""
        servers = [
            (name, getattr(proc, "http_address", ""))
            for name, proc in self.fc.processes()
            if getattr(proc, "alive", False) and getattr(proc, "http_address", "")
        ]
        values = self._pool.map(lambda s: _stalls_counted(s[1]), servers)
        new = {}
        for (name, _), value in zip(servers, values, strict=True):
            if value is None:
                continue
            self.counted = True
            before = self.counters.get(name, 0.0)
            self.counters[name] = value
            if value > before:
                new[name] = value - before
        return new

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _stalls_counted(http_address: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5).read()
    except OSError:
        return None
    return _metric(text.decode(), "tessera_event_loop_stalls_total")


_CONTROL = """
import os, sys, time
interval, threshold, path = 0.02, float(sys.argv[1]), sys.argv[2]
parent = os.getppid()
with open(path, "a", buffering=1) as out:
    while os.getppid() == parent:  # a fuzzer killed outright leaves no control behind
        asked = time.monotonic() + interval
        time.sleep(interval)
        now = time.monotonic()
        if now - asked > threshold:
            out.write(f"{asked:.4f} {now:.4f}\\n")
"""


@dataclass
class MachineWatch:
    """A control: a tiny process that only sleeps and wakes, and writes down when it woke
    more than `threshold_s` late. The fuzzer shares its machine with whatever else runs there
    (on a build machine: other test suites, benchmarks); when they take the CPUs, every
    server's event loop runs late together, and no request is to blame. A server stall during
    which the control was late too is the machine's (`busy`), counted apart from findings."""

    path: Path
    threshold_s: float = 0.1
    proc: subprocess.Popen[bytes] | None = None
    intervals: list[tuple[float, float]] = field(default_factory=list)
    offset: int = 0

    def start(self) -> None:
        self.path.write_text("")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CONTROL, str(self.threshold_s), str(self.path)]
        )

    def close(self) -> None:
        if self.proc is not None:
            terminate_all([self.proc], grace=2.0)
            self.proc = None

    def busy(self, t0: float, t1: float, margin: float = 0.1) -> bool:
        """Whether the control was late at any time in [t0, t1] (give or take `margin`)."""
        with self.path.open() as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        for line in text.splitlines():
            a, _, b = line.partition(" ")
            with contextlib.suppress(ValueError):
                self.intervals.append((float(a), float(b)))
        horizon = time.monotonic() - 600
        self.intervals = [i for i in self.intervals if i[1] >= horizon]
        return any(a <= t1 + margin and b >= t0 - margin for a, b in self.intervals)


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass
class LogWatch:
    """New lines with a traceback in the servers' logs since the last look."""

    logs: dict[str, Path]
    offsets: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, path in self.logs.items():
            self.offsets[name] = path.stat().st_size if path.exists() else 0

    def new_tracebacks(self) -> dict[str, str]:
        found = {}
        for name, path in self.logs.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            at = self.offsets.get(name, 0)
            if size <= at:
                self.offsets[name] = min(at, size)
                continue
            with path.open("rb") as f:
                f.seek(at)
                chunk = f.read(size - at)
            self.offsets[name] = size
            text = chunk.decode(errors="replace")
            i = text.find("Traceback")
            if i >= 0:
                start = text.rfind("\n", 0, max(0, i - 1))
                found[name] = text[max(0, start) : i + 3000].strip()
        return found
