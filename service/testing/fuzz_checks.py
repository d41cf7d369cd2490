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
* A tablet's rows on one replica, around every Write to a fixture (`replica_checksum`): a
  refused one must change neither count nor digest, and no replica may hold a row outside
  its partition (the Checksum's `out_of_partition_rows`, counted by the server in the same
  pass, docs/design/tablets.md#R2).
* The fixtures' replicas, after every case whose RPC could change them (all but the
  read-only ones, `fixture_health`): ListTablets on every tablet server and GetTableLocations
  of both fixtures, judged by pure functions of those views: every fixture tablet has a READY
  replica on all three servers (`lost_replicas`: none was tombstoned, deleted or left out),
  and the master's record of each tablet's config (voters, member types, op index) is the
  committed config of every running replica (`config_mismatches`: no claim the replicas did
  not commit reached the catalog, docs/design/catalog.md#R15). A mismatch gets a moment to
  settle (`SETTLE_S`): a config the replicas did commit reaches the master within a heartbeat.
* Replicas agree (`replicas_agree`), every few hundred cases and at the end: the Checksum of
  every replica of every fixture tablet, each asked to reach the highest applied index any
  of them reported first; equal row counts and digests. At the same times every replica's
  keys are scanned and held against its partition by the fuzzer itself
  (`keys_outside_partition`, with `Partition.contains`: not the server's own count).
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
from typing import Any, NamedTuple

import grpc
import pyarrow as pa

from service.common.keys import decode_key
from service.common.partition import Partition, PartitionSchema
from service.common.schema import Schema
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc
from service.testing.fuzz_cluster import FIXTURES, FuzzCluster
from service.tools.launcher import terminate_all

__all__ = [
    "SETTLE_S",
    "CatalogView",
    "Checksum",
    "FixtureHealth",
    "LogWatch",
    "MachineWatch",
    "ReplicaConfig",
    "StallProbe",
    "catalog_view",
    "config_mismatches",
    "describe_diff",
    "fixture_health",
    "keys_outside_partition",
    "lost_replicas",
    "outside_rows",
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


class Checksum(NamedTuple):
    """One replica's Checksum answer."""

    rows: int
    digest: bytes
    outside: int = 0
    """Live rows outside the tablet's partition (docs/design/tablets.md#R2)."""
    sample_keys: tuple[bytes, ...] = ()
    """Encoded primary keys of a few of them."""

    @property
    def content(self) -> tuple[int, bytes]:
        return self.rows, self.digest


def replica_checksum(fc: FuzzCluster, name: str, tablet_id: str) -> Checksum | None:
    """One replica's rows now, with its count of rows outside its partition, or None if it
    cannot say."""
    ts = fc.mini.tservers[name]
    stub = tserver_pb2_grpc.TabletServerServiceStub(fc.channel("admin", ts.address))
    req = tpb.ChecksumRequestPB(dest_uuid=ts.uuid, tablet_id=tablet_id)
    if "check_partition" in req.DESCRIPTOR.fields_by_name:  # the count is computed on request
        req.check_partition = True
    try:
        r = stub.Checksum(req, timeout=10)
    except grpc.RpcError:
        return None
    return Checksum(
        r.row_count,
        r.digest,
        getattr(r, "out_of_partition_rows", 0),
        tuple(getattr(r, "out_of_partition_sample_keys", ())),
    )


def outside_rows(
    tablet_id: str, name: str, got: Checksum, schema: Schema | None = None, limit: int = 3
) -> str:
    """The problem a Checksum shows ("" if none): rows outside the replica's partition, with
    a few of their keys (decoded under `schema` when given)."""
    if not got.outside:
        return ""
    keys = []
    for k in got.sample_keys[:limit]:
        try:
            keys.append(repr(decode_key(schema.key_columns, k)) if schema else k.hex())
        except Exception:
            keys.append(k.hex())
    return f"tablet {tablet_id} on {name} holds {got.outside} rows outside its partition" + (
        f" (keys {', '.join(keys)})" if keys else ""
    )


# --- the fixtures' replicas and the master's record of them -----------------------------------

SETTLE_S = 2.0
"""How long a config mismatch may last: a change the replicas committed reaches the master
with their next heartbeat (200 ms apart in the fuzz cluster)."""
_DATA_STATES = {int(v): k for k, v in tpb.TabletDataStatePB.items()}
_MEMBER_TYPES = {int(v): k for k, v in mpb.MemberTypePB.items()}

Members = frozenset[tuple[str, int]]
"""A config's peers: (uuid, member type)."""


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica as its tablet server lists it (ListTablets)."""

    data_state: int
    state: int
    members: Members
    """Its committed config's peers."""
    opid_index: int
    """Its committed config's op index."""
    leader: str = ""
    """The leader it knows of ("" none)."""
    term: int = 0


@dataclass(frozen=True)
class FixtureHealth:
    """What `lost_replicas` and `config_mismatches` judge: every tablet server's replicas of
    the fixture tablets (server name -> tablet -> replica; a server that did not answer is
    absent) and the master's record of each fixture tablet's config."""

    tablets: tuple[str, ...]
    servers: tuple[str, ...]
    replicas: Mapping[str, Mapping[str, ReplicaConfig]]
    master: Mapping[str, tuple[Members, int]]


def fixture_health(fc: FuzzCluster) -> FixtureHealth:
    """The views of `FixtureHealth`, read at once (one ListTablets per tablet server, one
    GetTableLocations per fixture, all in flight together). Raises grpc.RpcError if the master
    did not answer; a tablet server that did not answer is left out."""
    tablets = fc.fixture_tablets()
    watched = set(tablets)
    calls = []
    for name, ts in fc.mini.tservers.items():
        if not getattr(ts, "alive", True):
            continue
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(fc.channel("admin", ts.address))
        calls.append(
            (name, stub.ListTablets.future(tpb.ListTabletsRequestPB(dest_uuid=ts.uuid), timeout=10))
        )
    locations = [
        fc.stub().GetTableLocations.future(
            mpb.GetTableLocationsRequestPB(
                table=mpb.TableIdentifierPB(table_id=fc.tables[t].table_id)
            ),
            timeout=10,
        )
        for t in FIXTURES
    ]
    replicas: dict[str, dict[str, ReplicaConfig]] = {}
    for name, fut in calls:
        try:
            r = fut.result()
        except grpc.RpcError:
            continue
        replicas[name] = {
            x.tablet_id: ReplicaConfig(
                x.data_state,
                x.state,
                frozenset(
                    (p.permanent_uuid, p.member_type)
                    for p in x.consensus_state.committed_config.peers
                ),
                x.consensus_state.committed_config.opid_index,
                x.consensus_state.leader_uuid,
                x.consensus_state.current_term,
            )
            for x in r.replicas
            if x.tablet_id in watched
        }
    master: dict[str, tuple[Members, int]] = {}
    for located in locations:
        for t in located.result().tablet_locations:
            members = frozenset((p.ts_uuid, p.member_type) for p in t.replicas)
            master[t.tablet_id] = (members, t.config_opid_index)
    return FixtureHealth(tablets, tuple(fc.mini.tservers), replicas, master)


TERM_BOUND = 1 << 62
"""No group's term reaches this in a real cluster (the consensus codec refuses messages at or
past it)."""


def leaderless(h: FixtureHealth) -> set[str]:
    """Fixture tablets no answering replica knows a leader of, or whose term a replica holds
    past TERM_BOUND (a group that can never elect again): "no leader" problems, by tablet.
    One look may catch an election; the campaign reports a tablet only when two looks,
    `CHECK_EVERY` cases apart, both do."""
    out = set()
    for t in h.tablets:
        seen = [r[t] for r in h.replicas.values() if t in r]
        if not seen:
            continue
        if any(x.term >= TERM_BOUND for x in seen):
            out.add(f"tablet {t}: a replica's term is {max(x.term for x in seen)}, past 2^62")
        elif not any(x.leader for x in seen):
            out.add(f"tablet {t}: no replica knows a leader")
    return out


def lost_replicas(h: FixtureHealth) -> list[str]:
    """Fixture replicas that are gone or not READY on a server that answered: tombstoned,
    deleted, being copied over, or missing (every fixture tablet has a replica on every
    server, and nothing in the campaign may remove one)."""
    problems = []
    for name in h.servers:
        listed = h.replicas.get(name)
        if listed is None:
            continue  # it did not answer (restarting): nothing to judge
        for tablet in h.tablets:
            r = listed.get(tablet)
            if r is None:
                problems.append(f"tablet {tablet} has no replica on {name}")
            elif r.data_state != tpb.TABLET_DATA_READY:
                state = _DATA_STATES.get(r.data_state, str(r.data_state))
                problems.append(f"tablet {tablet}: the replica on {name} is {state}")
    return problems


def config_mismatches(h: FixtureHealth) -> list[str]:
    """Fixture tablets whose config as the master records it is not the committed config of
    each of their running replicas (voters, member types and op index; a replica still
    starting has no say yet), or that the master has no record of."""
    problems = []
    for tablet in h.tablets:
        recorded = h.master.get(tablet)
        if recorded is None:
            problems.append(f"tablet {tablet}: the master has no record of it")
            continue
        for name in h.servers:
            r = h.replicas.get(name, {}).get(tablet)
            if r is None or r.state != mpb.REPLICA_RUNNING:
                continue
            if (r.members, r.opid_index) != recorded:
                problems.append(
                    f"tablet {tablet}: the master records {_fmt_config(*recorded)}, the replica "
                    f"on {name} committed {_fmt_config(r.members, r.opid_index)}"
                )
    return problems


def _fmt_config(members: Members, index: int) -> str:
    peers = ", ".join(
        u if t == mpb.VOTER else f"{u} ({_MEMBER_TYPES.get(t, str(t))})" for u, t in sorted(members)
    )
    return f"[{peers}] at op index {index}"


# --- rows against partitions, by the fuzzer's own reckoning -----------------------------------


def keys_outside_partition(fc: FuzzCluster) -> list[str]:
    """Every replica of every fixture tablet scanned (its key columns) and each key held
    against the tablet's partition as the master reports it, with `Partition.contains` (the
    module docstring); a replica that did not answer is skipped."""
    problems = []
    for table, (schema, ps) in FIXTURES.items():
        t = fc.tables[table]
        for tablet, partition in zip(t.tablets, t.partitions, strict=False):
            for name in fc.mini.tservers:
                try:
                    keys = scan_keys(fc, name, tablet, schema)
                except grpc.RpcError:
                    continue
                problem = rows_outside(tablet, name, keys, schema, ps, partition)
                if problem:
                    problems.append(problem)
    return problems


def rows_outside(
    tablet_id: str,
    name: str,
    keys: pa.Table,
    schema: Schema,
    partition_schema: PartitionSchema,
    partition: Partition,
    limit: int = 3,
) -> str:
    """The problem ("" if none) of a replica whose rows (`keys`: at least the key columns)
    include keys `partition` does not contain."""
    if keys.num_rows == 0:
        return ""
    pkeys = partition_schema.partition_keys_for_arrow(schema, keys)
    bad = [i for i, k in enumerate(pkeys) if not partition.contains(k)]
    if not bad:
        return ""
    cols = list(schema.key)
    shown = [repr(tuple(keys.column(c)[i].as_py() for c in cols)) for i in bad[:limit]]
    return (
        f"tablet {tablet_id} on {name} holds {len(bad)} rows outside its partition "
        f"(keys {', '.join(shown)})"
    )


def scan_keys(fc: FuzzCluster, name: str, tablet_id: str, schema: Schema) -> pa.Table:
    """The key columns of every row of one replica (READ_LATEST on that replica, as admin)."""
    ts = fc.mini.tservers[name]
    stub = tserver_pb2_grpc.TabletServerServiceStub(fc.channel("admin", ts.address))
    cols = list(schema.key)
    r = stub.Scan(
        tpb.ScanRequestPB(
            dest_uuid=ts.uuid,
            new_scan=tpb.NewScanRequestPB(tablet_id=tablet_id, projected_columns=cols),
            batch_size_bytes=1 << 20,
        ),
        timeout=10,
    )
    tables = []
    seq = 0
    while True:
        if r.batch:
            tables.append(pa.ipc.open_stream(r.batch).read_all())
        if not r.has_more_results or not r.scanner_id:
            break
        seq += 1
        r = stub.ScanNext(
            tpb.ScanNextRequestPB(
                dest_uuid=ts.uuid,
                scanner_id=r.scanner_id,
                call_seq_id=seq,
                batch_size_bytes=1 << 20,
            ),
            timeout=10,
        )
    if not tables:
        return schema.to_arrow().empty_table().select(cols)
    return pa.concat_tables(tables).select(cols)


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
