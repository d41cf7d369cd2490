"""Data-driven scenarios for the master's catalog: DDL, tablet assignment and tablet reports in
heartbeats, each command followed by the trace it must produce.

The files are `tests/master/testdata/*.txt`, in the format of the Raft scenarios (the format,
the runner and the rewrite flag are described in `tests/raft/scenarios.py`, whose runner this
module reuses); `tests/master/test_catalog_scenarios.py` runs each one as a test. Regenerate the
expected outputs after an intended change with

    TESSERA_REWRITE=1 python -m pytest -q tests/master/test_catalog_scenarios.py

and review the diff.

The environment
---------------
One leader master's catalog, in process, made of the service's own parts: a `SysCatalogState`
that every write is applied to at once (the Raft group of the masters is not simulated: each
replicated write is one sys.catalog entry, printed as `sys.catalog #N OPERATION: ...`), a
`CatalogManager` loaded as leader, a `TSManager` on a `ManualClock`, and `handle_heartbeat`
with its `ReportGate`, fed real `TSHeartbeatRequestPB`s. Nothing is random but the catalog's
seeded generator (ids, placement), and nothing runs on its own: the background tasks are the
`run-tasks` command, time is `advance-clock`.

The tablet servers are a rule, not servers: each keeps the replicas it was asked to create,
with the config the master gave; a tablet's group elects its first voter that hosts a replica,
at the next term, once a majority of its voters host one (what Raft would do, without the
timing). A server reports, in each heartbeat, what changed since its last acknowledged report
(every replica when the master asks for a full report).

Table and tablet ids are printed as names (in messages too): a table by its name at creation
(`NAME~2` for the second table created under that name), a tablet as `TABLE.K`, K counting that
table's tablets in the order they were created (those of one entry in partition key order).
Servers are `ts-1`, `ts-2`, ...

Commands
--------
    add-servers N                   N new tablet servers register with a first heartbeat
    create-table NAME [buckets=2] [splits=m,t] [replicas=3]
                                    columns host (STRING, key), ts (INT64, key), value (DOUBLE);
                                    hash buckets on host, range splits on host
    alter-table NAME [add=COL] [drop=COL] [rename=NEW]
                                    add a nullable STRING column, drop one, rename the table
    delete-table NAME
    assign                          one assignment round (the background tasks' step)
    run-tasks [TS...]               carry out the pending tasks and the RPCs reports called for
                                    (on these servers only, if given): CreateTablet,
                                    DeleteTablet, AlterSchema
    heartbeat [TS...] [full=true]   each server heartbeats (default: every server up), with a
                                    tablet report of what changed since its last acknowledged
                                    one (all of its replicas with full=true or when asked)
    stop TS / start TS              a stopped server neither heartbeats nor carries out tasks;
                                    the groups of its replicas elect again (the rule above)
    advance-clock SECONDS
    catalog [NAME]                  the tables (or one) and their tablets as recorded
    tasks                           the pending tasks
    servers                         liveness and replicas of every server, as the master sees
    locations NAME                  GetTableLocations, or the error it answers
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from service.common.clock import ManualClock
from service.common.errors import TesseraError
from service.common.ids import NodeId, TabletId
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import AddColumn, AlterOp, ColumnType, DropColumn, Schema
from service.master.catalog_assignment import (
    AlterReplicas,
    CreateReplicas,
    DeleteReplicas,
    Task,
)
from service.master.catalog_manager import CatalogManager
from service.master.catalog_reads import TableIdentifier
from service.master.catalog_records import (
    ConsensusState,
    RequestId,
    TabletRecord,
    consensus_state_to_pb,
)
from service.master.catalog_settings import CatalogSettings
from service.master.heartbeat import HeartbeatContext, ReportGate, handle_heartbeat
from service.master.report_processing import (
    AlterReplica,
    ChangeReplicaConfig,
    DeleteReplica,
    ReportAction,
    ReportedRole,
    ReportedState,
)
from service.master.sys_catalog import ApplyResult, SysCatalogState
from service.master.ts_manager import TSManager
from service.pb import master_pb2 as pb
from tests.raft.scenarios import Command, ScenarioError, dispatch

_T = TypeVar("_T")

UNRESPONSIVE_S = 10.0
"""Seconds without a heartbeat after which a tablet server is no longer live."""

SCHEMA = Schema.build(
    [("host", ColumnType.STRING), ("ts", ColumnType.INT64), ("value", ColumnType.DOUBLE)],
    ("host", "ts"),
)

_OPTIONS: dict[str, frozenset[str]] = {
    "create-table": frozenset({"buckets", "splits", "replicas"}),
    "alter-table": frozenset({"add", "drop", "rename"}),
    "heartbeat": frozenset({"full"}),
}


@dataclass
class _Replica:
    """One replica as its server sees it."""

    consensus: ConsensusState
    schema_version: int = 0
    tombstoned: bool = False


@dataclass
class _Server:
    uuid: NodeId
    port: int
    up: bool = True
    registered: bool = False
    replicas: dict[TabletId, _Replica] = field(default_factory=dict)
    dirty: set[TabletId] = field(default_factory=set)
    """Replicas changed since the last acknowledged report."""
    removed: set[TabletId] = field(default_factory=set)
    full_report_wanted: bool = True
    sequence: int = 0


class CatalogEnv:
    """The catalog of one leader master and a fleet of rule-driven tablet servers (module
    docstring)."""

    def __init__(self, seed: int = 1) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(start=1000.0)
        self.ts = TSManager(self.clock, UNRESPONSIVE_S)
        self.state = SysCatalogState()
        self.index = 0
        self.cm = CatalogManager(
            self.state,
            self._replicate,
            self.ts,
            self.clock,
            random.Random(seed),
            CatalogSettings(leader_warmup_s=0.0),
        )
        self.cm.load()
        self.gate = ReportGate()
        self.servers: dict[NodeId, _Server] = {}
        self.actions: list[ReportAction] = []
        """RPCs tablet reports called for, not carried out yet."""
        self.table_names: dict[str, str] = {}
        self.tablet_names: dict[str, str] = {}
        self.requests = 0
        self.out: list[str] = []
        self.handlers: dict[str, Callable[[Command], None]] = {
            "add-servers": self._add_servers,
            "create-table": self._create_table,
            "alter-table": self._alter_table,
            "delete-table": self._delete_table,
            "assign": self._assign,
            "run-tasks": self._run_tasks,
            "heartbeat": self._heartbeat,
            "stop": self._stop,
            "start": self._start,
            "advance-clock": self._advance_clock,
            "catalog": self._catalog,
            "tasks": self._tasks,
            "servers": self._servers,
            "locations": self._locations,
        }

    def close(self) -> None:
        self.loop.close()

    # -- the runner's interface ------------------------------------------------------------

    def option_keys(self, command: str) -> Iterable[str]:
        return _OPTIONS.get(command, frozenset())

    def run(self, cmd: Command) -> list[str]:
        self.out = []
        dispatch(self.handlers, cmd)
        if not self.out:
            self.out.append("ok")
        return [self._names_for_ids(line) for line in self.out]

    def _names_for_ids(self, line: str) -> str:
        """`line` with every table and tablet id replaced by its name (in messages)."""
        for ids in (self.tablet_names, self.table_names):
            for raw, name in ids.items():
                if raw in line:
                    line = line.replace(raw, name)
        return line

    # -- sys.catalog -----------------------------------------------------------------------

    async def _replicate(self, data: bytes, timeout: float) -> ApplyResult:
        self.index += 1
        result = self.state.apply(self.index, data)
        self._name_new_rows()
        what = result.operation or "?"
        if result.refusal is not None:
            self.out.append(f"sys.catalog #{self.index} {what}: refused: {result.refusal}")
        else:
            self.out.append(f"sys.catalog #{self.index} {what}: {len(result.written)} rows written")
        return result

    def _name_new_rows(self) -> None:
        for row in self.state.tables():
            rec = row.record
            if rec.table_id not in self.table_names:
                taken = set(self.table_names.values())
                label, k = rec.name, 1
                while label in taken:
                    k += 1
                    label = f"{rec.name}~{k}"
                self.table_names[rec.table_id] = label
        for row in self.state.tables():
            tid = row.record.table_id
            fresh = [
                t.record
                for t in self.state.tablets_of(tid)
                if t.record.tablet_id not in self.tablet_names
            ]
            fresh.sort(key=lambda r: r.partition.partition_key_start)
            k = sum(
                1 for t in self.state.tablets_of(tid) if t.record.tablet_id in self.tablet_names
            )
            for tablet in fresh:
                k += 1
                self.tablet_names[tablet.tablet_id] = f"{self.table_names[tid]}.{k}"

    def _tablet(self, tablet_id: str) -> str:
        return self.tablet_names.get(tablet_id, tablet_id)

    def _table(self, table_id: str) -> str:
        return self.table_names.get(table_id, table_id)

    def _request(self) -> RequestId:
        self.requests += 1
        return RequestId("scenario", self.requests)

    def _call(self, what: Callable[[], Awaitable[_T]]) -> _T | None:
        """Run a catalog call (a coroutine function) on the loop; print a TesseraError."""
        try:
            return self.loop.run_until_complete(what())
        except TesseraError as e:
            self.out.append(f"error: {type(e).__name__}: {e}")
            return None

    # -- DDL -------------------------------------------------------------------------------

    def _create_table(self, cmd: Command) -> None:
        name = cmd.arg(0, "table name")
        buckets = cmd.opt_int("buckets", 2)
        splits = [s for s in cmd.opt("splits", "m,t").split(",") if s]
        partitioning = PartitionSchema(
            hash=(HashBucketSchema(("host",), buckets),) if buckets > 1 else (),
            split_rows=tuple((s,) for s in splits),
        )
        replicas = cmd.opt_int("replicas", 3)
        self._call(
            lambda: self.cm.create_table(
                name, SCHEMA, partitioning, replicas, self._request(), owner="alice"
            )
        )

    def _alter_table(self, cmd: Command) -> None:
        name = cmd.arg(0, "table name")
        ops: list[AlterOp] = []
        if "add" in cmd.options:
            ops.append(AddColumn(cmd.options["add"], ColumnType.STRING))
        if "drop" in cmd.options:
            ops.append(DropColumn(cmd.options["drop"]))
        new_name = cmd.options.get("rename")
        version = self._call(
            lambda: self.cm.alter_table(
                TableIdentifier.by_name(name), ops, self._request(), new_name=new_name
            )
        )
        if version is not None:
            self.out.append(f"schema version {version}")

    def _delete_table(self, cmd: Command) -> None:
        name = cmd.arg(0, "table name")
        self._call(lambda: self.cm.delete_table(TableIdentifier.by_name(name), self._request()))

    # -- assignment and tasks --------------------------------------------------------------

    def _assign(self, cmd: Command) -> None:
        plan = self._call(self.cm.assign_tablets)
        if plan is None:
            return
        for tablet_id in plan.assigned:
            self.out.append(f"assigned {self._tablet(tablet_id)}: {self._peers_of(tablet_id)}")
        for r in plan.replaced:
            self.out.append(f"replaced {self._tablet(r.old)} by {self._tablet(r.new)}")
        for u in plan.unplaced:
            self.out.append(f"unplaced {self._tablet(u.tablet_id)}: {u.reason}")
        for d in plan.deferred:
            self.out.append(
                f"deferred {self._table(d.table_id)} ({d.tablets} tablets): {d.reason}; "
                f"retry in {d.retry_in_s:g} s"
            )
        if plan.empty:
            self.out.append("nothing written" if self.out else "nothing to assign")

    def _peers_of(self, tablet_id: str) -> str:
        row = self.state.tablet(tablet_id)
        if row is None or row.record.consensus is None:
            return "-"
        return ",".join(row.record.consensus.voters)

    def _fmt_task(self, t: Task) -> str:
        name = self._tablet(t.tablet_id)
        if isinstance(t, CreateReplicas):
            return f"CreateTablet {name} on {','.join(t.replicas)} (config {t.config_index})"
        if isinstance(t, DeleteReplicas):
            return f"DeleteTablet {name} on {','.join(t.servers)} ({t.reason})"
        return f"AlterSchema {name} to version {t.schema_version}"

    def _fmt_action(self, a: ReportAction) -> str:
        name = self._tablet(a.tablet_id)
        if isinstance(a, DeleteReplica):
            how = "TOMBSTONED" if a.tombstone else "DELETED"
            return f"DeleteTablet {name} on {a.server} ({how}: {a.reason})"
        if isinstance(a, AlterReplica):
            return f"AlterSchema {name} on {a.server} to version {a.schema_version}"
        return f"ChangeConfig {name}: {a}"

    def _tasks(self, cmd: Command) -> None:
        tasks = sorted(self.cm.pending_tasks(), key=self._fmt_task)
        self.out.extend(self._fmt_task(t) for t in tasks)
        self.out.extend(f"(report) {self._fmt_action(a)}" for a in self.actions)
        if not tasks and not self.actions:
            self.out.append("no tasks")

    def _run_tasks(self, cmd: Command) -> None:
        only = {self._server(s).uuid for s in cmd.args} or set(self.servers)
        for task in sorted(self.cm.pending_tasks(), key=self._fmt_task):
            servers: tuple[NodeId, ...]
            if isinstance(task, CreateReplicas):
                servers = task.replicas
                self.cm.create_started(task.tablet_id)
            elif isinstance(task, DeleteReplicas):
                servers = task.servers
            else:
                leader = self._leader_of(task.tablet_id)
                servers = (leader,) if leader is not None else ()
            done = [s for s in servers if s in only and self._up(s)]
            for s in done:
                self._carry_out(task, self.servers[s])
            missed = [s for s in servers if s not in done]
            if servers and not missed:
                self.cm.task_done(task)
            line = self._fmt_task(task)
            self.out.append(line + (f": not reached {','.join(missed)}" if missed else ""))
        left: list[ReportAction] = []
        for a in self.actions:
            if isinstance(a, ChangeReplicaConfig) or not (a.server in only and self._up(a.server)):
                left.append(a)
                continue
            self._carry_out_action(a, self.servers[a.server])
            self.out.append(f"(report) {self._fmt_action(a)}")
        self.actions = left
        self._elect()
        if not self.out:
            self.out.append("no tasks")

    def _up(self, uuid: NodeId) -> bool:
        s = self.servers.get(uuid)
        return s is not None and s.up

    def _leader_of(self, tablet_id: TabletId) -> NodeId | None:
        for s in self.servers.values():
            r = s.replicas.get(tablet_id)
            if r is not None and not r.tombstoned and r.consensus.leader_uuid is not None:
                return r.consensus.leader_uuid
        return None

    def _carry_out(self, task: Task, server: _Server) -> None:
        tid = task.tablet_id
        if isinstance(task, CreateReplicas):
            row = self.state.tablet(tid)
            if tid in server.replicas or row is None or row.record.consensus is None:
                return
            cs = replace(row.record.consensus, term=0, leader_uuid=None)
            table = self.state.table(task.table_id)
            version = table.record.schema_version if table is not None else 0
            server.replicas[tid] = _Replica(cs, version)
            server.dirty.add(tid)
        elif isinstance(task, DeleteReplicas):
            if server.replicas.pop(tid, None) is not None:
                server.dirty.discard(tid)
                server.removed.add(tid)
        elif isinstance(task, AlterReplicas):
            self._alter_group(tid, task.schema_version)

    def _carry_out_action(self, a: ReportAction, server: _Server) -> None:
        if isinstance(a, DeleteReplica):
            r = server.replicas.get(a.tablet_id)
            if r is None:
                return
            if a.tombstone:
                r.tombstoned = True
                server.dirty.add(a.tablet_id)
            else:
                del server.replicas[a.tablet_id]
                server.dirty.discard(a.tablet_id)
                server.removed.add(a.tablet_id)
        elif isinstance(a, AlterReplica):
            self._alter_group(a.tablet_id, a.schema_version)

    def _alter_group(self, tablet_id: TabletId, version: int) -> None:
        """AlterSchema through the tablet's leader: every live replica of its group applies it."""
        for s in self.servers.values():
            r = s.replicas.get(tablet_id)
            if r is not None and not r.tombstoned and s.up and r.schema_version < version:
                r.schema_version = version
                s.dirty.add(tablet_id)

    def _elect(self) -> None:
        """Each tablet group whose leader is gone and a majority of whose voters are up with a
        replica elects its first such voter at the next term (the module docstring's rule)."""
        groups: dict[TabletId, list[tuple[_Server, _Replica]]] = {}
        for s in self.servers.values():
            for tid, r in s.replicas.items():
                if not r.tombstoned:
                    groups.setdefault(tid, []).append((s, r))
        for tid in sorted(groups, key=self._tablet):
            members = groups[tid]
            cs = max((r.consensus for _, r in members), key=lambda c: (c.config_index, c.term))
            live = [v for v in cs.voters if any(s.uuid == v and s.up for s, _ in members)]
            if len(live) * 2 <= len(cs.voters):
                continue
            if cs.leader_uuid is None or cs.leader_uuid not in live:
                cs = replace(cs, term=cs.term + 1, leader_uuid=live[0])
                self.out.append(f"{self._tablet(tid)}: {live[0]} leads term {cs.term}")
            for s, r in members:  # the live members learn the group's view (a restarted one too)
                if s.up and s.uuid in cs.voters and r.consensus != cs:
                    r.consensus = cs
                    s.dirty.add(tid)

    # -- servers and heartbeats ------------------------------------------------------------

    def _server(self, raw: str) -> _Server:
        s = self.servers.get(NodeId(raw))
        if s is None:
            raise ScenarioError(f"no server {raw!r}")
        return s

    def _add_servers(self, cmd: Command) -> None:
        n = int(cmd.arg(0, "number of servers"))
        for _ in range(n):
            i = len(self.servers) + 1
            s = _Server(NodeId(f"ts-{i}"), 7050 + i)
            self.servers[s.uuid] = s
            self._send_heartbeat(s, full=False)

    def _stop(self, cmd: Command) -> None:
        s = self._server(cmd.arg(0, "server"))
        s.up = False
        self.out.append(f"{s.uuid} stopped")
        self._elect()

    def _start(self, cmd: Command) -> None:
        s = self._server(cmd.arg(0, "server"))
        s.up = True
        s.full_report_wanted = True  # a restarted server sends a full report first
        self.out.append(f"{s.uuid} started")
        self._elect()

    def _advance_clock(self, cmd: Command) -> None:
        seconds = float(cmd.arg(0, "seconds"))
        self.clock.advance(seconds)
        self.out.append(f"clock +{seconds:g} s")

    def _heartbeat(self, cmd: Command) -> None:
        servers = [self._server(a) for a in cmd.args] or [s for s in self.servers.values() if s.up]
        for s in servers:
            if not s.up:
                raise ScenarioError(f"{s.uuid} is stopped")
            self._send_heartbeat(s, full=cmd.opt_bool("full", False))

    def _report_of(self, s: _Server, full: bool) -> pb.TabletReportPB:
        tids = sorted(s.replicas if full else s.dirty, key=self._tablet)
        report = pb.TabletReportPB(is_incremental=not full, sequence_number=s.sequence)
        for tid in tids:
            r = s.replicas[tid]
            if r.tombstoned:
                state, role = ReportedState.TOMBSTONED, ReportedRole.UNKNOWN
            else:
                state = ReportedState.RUNNING
                if r.consensus.leader_uuid == s.uuid:
                    role = ReportedRole.LEADER
                elif s.uuid in r.consensus.voters:
                    role = ReportedRole.FOLLOWER
                else:
                    role = ReportedRole.LEARNER
            entry = report.updated_tablets.add(
                tablet_id=tid, state=state.value, role=role.value, schema_version=r.schema_version
            )
            entry.consensus_state.CopyFrom(consensus_state_to_pb(r.consensus))
        if not full:
            report.removed_tablet_ids.extend(sorted(s.removed))
        return report

    def _send_heartbeat(self, s: _Server, full: bool) -> None:
        full = full or s.full_report_wanted
        request = pb.TSHeartbeatRequestPB(instance=pb.NodeInstancePB(permanent_uuid=s.uuid))
        request.instance.instance_seqno = 1
        if not s.registered:
            request.registration.rpc_addresses.add(host="127.0.0.1", port=s.port)
        s.sequence += 1
        report = self._report_of(s, full)
        if full or report.updated_tablets or report.removed_tablet_ids:
            request.tablet_report.CopyFrom(report)
        ctx = HeartbeatContext(
            master_instance=pb.NodeInstancePB(permanent_uuid="master-1", instance_seqno=1),
            term=1,
            leading=True,
            master_addresses=(),
            ts_manager=self.ts,
            catalog=self.cm,
            submit=self.actions.extend,
            reports=self.gate,
        )
        what = (
            f"full report of {len(report.updated_tablets)}"
            if full
            else f"{len(report.updated_tablets)} changed"
        )
        if report.removed_tablet_ids:
            what += f", {len(report.removed_tablet_ids)} removed"
        if not request.HasField("tablet_report"):
            what = "no report"
        before = len(self.actions)
        self.out.append(f"> {s.uuid} heartbeat ({what})")
        answer = self.loop.run_until_complete(handle_heartbeat(ctx, request))
        s.registered = s.registered or request.HasField("registration")
        acked = request.HasField("tablet_report") and (
            answer.acked_report_sequence_number == s.sequence
        )
        if acked:
            s.dirty.clear()
            s.removed.clear()
            s.full_report_wanted = False
        flags = []
        if request.HasField("registration"):
            flags.append("registered")
        if request.HasField("tablet_report"):
            flags.append("acked" if acked else "not acked")
        if answer.needs_full_tablet_report:
            flags.append("asks for a full report")
            s.full_report_wanted = True
        if answer.needs_reregister:
            flags.append("asks to re-register")
            s.registered = False
        self.out.append(f"  answer: {', '.join(flags) or 'ok'}")
        for a in self.actions[before:]:
            self.out.append(f"  calls for {self._fmt_action(a)}")

    # -- introspection ---------------------------------------------------------------------

    def _catalog(self, cmd: Command) -> None:
        rows = self.state.tables()
        if cmd.args:
            rows = [r for r in rows if self._table(r.record.table_id) in cmd.args]
        for row in sorted(rows, key=lambda r: self._table(r.record.table_id)):
            t = row.record
            label = self._table(t.table_id)
            extra = f" name={t.name}" if t.name != label else ""
            fully = (
                f" fully-applied-version={t.fully_applied_schema.version}"
                if t.fully_applied_schema is not None
                else ""
            )
            self.out.append(
                f"table {label}: {t.state.name} version={t.schema_version}{fully} "
                f"replicas={t.num_replicas}{extra}"
            )
            tablets = sorted(
                self.state.tablets_of(t.table_id), key=lambda r: self._tablet(r.record.tablet_id)
            )
            for trow in tablets:
                self.out.append("  " + self._fmt_tablet(trow.record, t.schema, t.partition_schema))
        if not self.out:
            self.out.append("no tables")

    def _fmt_tablet(self, t: TabletRecord, schema: Schema, ps: PartitionSchema) -> str:
        s = f"{self._tablet(t.tablet_id)} {t.state.name}"
        s += f" [{ps.describe_partition(schema, t.partition)}]"
        cs = t.consensus
        if cs is not None:
            s += f" voters={','.join(cs.voters)} term={cs.term} leader={cs.leader_uuid or '-'}"
        if t.reported_schema_version:
            s += f" reported-version={t.reported_schema_version}"
        if t.replaces:
            s += f" replaces={self._tablet(t.replaces)}"
        if t.replaced_by:
            s += f" replaced-by={self._tablet(t.replaced_by)}"
        return s

    def _servers(self, cmd: Command) -> None:
        for uuid in sorted(self.servers):
            s = self.servers[uuid]
            live = "live" if self.ts.is_live(uuid) else "not live"
            hosted = sorted(
                (self._tablet(t) + ("(tombstoned)" if r.tombstoned else ""))
                for t, r in s.replicas.items()
            )
            self.out.append(
                f"{uuid}: {'up' if s.up else 'stopped'}, {live} at the master; "
                f"replicas: {' '.join(hosted) or '-'}"
            )

    def _locations(self, cmd: Command) -> None:
        name = cmd.arg(0, "table name")
        locs = self._call(lambda: self.cm.get_table_locations(TableIdentifier.by_name(name)))
        if locs is None:
            return
        for t in locs.tablets:
            replicas = " ".join(
                f"{r.ts_uuid}:{r.role.name}" for r in sorted(t.replicas, key=lambda r: r.ts_uuid)
            )
            self.out.append(f"{self._tablet(t.tablet_id)} {t.state.name} {replicas}")
