"""A master's status pages and its Prometheus metrics (served by `common.http_status`).

Pages (every master, leader or follower; each shows this master's own view):

  /          this master: uuid, role, term, leader, commit and applied index, catalog size;
             the masters of sys.catalog with their roles as this master sees them (and, on the
             leader, how far each has replicated)
  /tables    every table of the catalog: name, id, state, schema version, tablets, replicas
  /tablets   the tablets of every table, or of one (`?table=<table id>`): partition, state,
             and one row per replica (uuid, role, member type, address, its server's liveness)
  /tservers  the tablet servers that registered here: liveness, time since last heartbeat,
             replicas and leaders (from the committed catalog), links to their status pages
  /tasks     the leader's background tasks in flight or waiting for a retry
  /healthz   "ok" while the process serves (`common.http_status`)

Who may read them: every page here names tables, tablets or servers, so off loopback (or with
`http_auth = "tls"`) each needs a client certificate of the cluster CA, any role; only /healthz
stays open (`common.http_status`, docs/design/security.md#R13).

The catalog's maps are kept warm on followers too (master.py), so a follower's /tables is
current up to what it has applied; /tasks is empty except on the leader.

A page claims leadership only once a majority confirmed it: while this master's Raft node
thinks it leads, every page first passes a ReadIndex round (`RaftNode.read`, the barrier the
catalog RPCs use) and then shows state applied at least up to that index, marked "confirmed by
a majority". A leader that was paused past an election (SIGSTOP, a stalled disk) resumes
believing it leads for a few milliseconds; its pages then say "LEADER (unconfirmed)" and that
what they show may be stale, instead of presenting the old catalog as the leader's. Followers
always say that their view is as of their applied index. The `tessera_raft_is_leader` and
`tessera_master_catalog_loaded` metrics are this master's own view by design (a scrape must not
wait on a quorum); alerting on them should require one master, not trust any single one.

Metrics are read at scrape time from the objects that own the state (callback families,
`metrics` module docstring): the Raft node's term, commit and applied index and role, the
catalog's tables and tablets by state, the TSManager's live and dead servers and heartbeat
count. RPC counts and latencies (`RpcMetrics`) and the WAL fsync histogram are pushed by the
code that sees them and are created by `MasterServer`.

What the pages and metrics read of the master is `MasterState`, a protocol the master satisfies
(this module does not import it): read at request or scrape time, because the metrics are
installed before the master starts (its node, catalog and TSManager do not exist yet) and its
background tasks come and go with its terms.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import Protocol

from service.common.errors import InvalidArgument, TesseraError
from service.common.http_status import (
    HttpError,
    Markup,
    Request,
    Response,
    StatusServer,
    esc,
    fmt_age,
    kv_table,
    link,
    table,
)
from service.common.keys import decode_key
from service.common.metrics import MetricsRegistry
from service.common.partition import Partition
from service.common.schema import ColumnSchema
from service.consensus.node import RaftNode
from service.consensus.transport import GrpcTransport
from service.consensus.transport_metrics import install_transport_metrics
from service.master.background_tasks import BackgroundTasks
from service.master.catalog_info import TableInfo, TabletInfo
from service.master.catalog_manager import CatalogManager
from service.master.catalog_records import TableRecord, TableState, TabletState
from service.master.heartbeat import ReportGate
from service.master.heartbeat_pace import HeartbeatPace
from service.master.master_membership import MasterPeer
from service.master.progress_clock import ProgressClock
from service.master.ts_manager import TSManager
from service.raft import Role

__all__ = ["MasterState", "install_master_metrics", "install_master_pages"]


class MasterState(Protocol):
    """What the status pages and metrics read of a master (module docstring), all of it read
    only. None: not started yet, or (the background tasks) not leading a loaded term."""

    @property
    def uuid(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def http_address(self) -> str: ...
    @property
    def node(self) -> RaftNode | None: ...
    @property
    def catalog(self) -> CatalogManager | None: ...
    @property
    def ts_manager(self) -> TSManager | None: ...
    @property
    def background(self) -> BackgroundTasks | None: ...
    @property
    def progress_clock(self) -> ProgressClock | None: ...
    @property
    def report_gate(self) -> ReportGate: ...
    @property
    def heartbeat_pace(self) -> HeartbeatPace: ...
    @property
    def peers(self) -> tuple[MasterPeer, ...]: ...
    @property
    def transport(self) -> GrpcTransport | None: ...
    def address_of(self, uuid: str) -> str | None: ...


GROUP_LABEL = "group"

# How long a page waits for a majority to confirm this master's leadership before it says
# "unconfirmed" (a healthy group answers within one heartbeat round trip).
_CONFIRM_TIMEOUT_S = 1.0


# --- metrics ---------------------------------------------------------------------------------


def install_master_metrics(master: MasterState, registry: MetricsRegistry) -> None:
    """Register the callback families that read `master`'s state at scrape time."""

    def raft(field: str) -> list[tuple[tuple[str], float]]:
        node = master.node
        if node is None:
            return []
        st = node.status()
        values = {
            "term": st.term,
            "commit": st.commit,
            "applied": st.applied,
            "leader": 1 if st.role is Role.LEADER else 0,
            "election_timeout_s": st.election_timeout * node.settings.tick_interval_s,
        }
        return [((node.group_id,), float(values[field]))]

    registry.gauge_callback(
        "tessera_raft_term", "Current Raft term.", lambda: raft("term"), (GROUP_LABEL,)
    )
    registry.gauge_callback(
        "tessera_raft_commit_index",
        "Highest log index known committed.",
        lambda: raft("commit"),
        (GROUP_LABEL,),
    )
    registry.gauge_callback(
        "tessera_raft_applied_index",
        "Highest log index applied to the state machine.",
        lambda: raft("applied"),
        (GROUP_LABEL,),
    )

    registry.gauge_callback(
        "tessera_raft_election_timeout_seconds",
        "The election timeout now, before jitter: the configured one, stretched while the "
        "peers' messages arrive late, up to raft.election_timeout_max_ms; a leader's: its "
        "check-quorum period (that maximum whenever stretching is on).",
        lambda: raft("election_timeout_s"),
        (GROUP_LABEL,),
    )

    install_transport_metrics(registry, lambda: master.transport)

    def backlog(index: int) -> list[tuple[tuple[str], float]]:
        t = master.transport
        if t is None:
            return []
        return [((peer,), float(v[index])) for peer, v in sorted(t.peer_backlog().items())]

    registry.gauge_callback(
        "tessera_raft_peer_queued_messages",
        "Raft messages queued for a peer master and not yet written to its streams.",
        lambda: backlog(0),
        ("peer",),
    )
    registry.gauge_callback(
        "tessera_raft_peer_send_failures",
        "Sends to a peer master that failed in a row (0: the last one went through).",
        lambda: backlog(1),
        ("peer",),
    )
    registry.gauge_callback(
        "tessera_raft_is_leader",
        "1 if this node leads the Raft group in its own view (no majority confirmed it), else 0.",
        lambda: raft("leader"),
        (GROUP_LABEL,),
    )

    def loaded() -> float:
        return 1.0 if master.catalog is not None and master.catalog.loaded else 0.0

    def tables_by_state() -> list[tuple[tuple[str], float]]:
        if master.catalog is None:
            return []
        tally = Tally(t.record.state.name for t in master.catalog.maps.tables_by_id.values())
        return [((s.name,), float(tally[s.name])) for s in TableState]

    def tablets_by_state() -> list[tuple[tuple[str], float]]:
        if master.catalog is None:
            return []
        tally = master.catalog.maps.tablet_states  # kept as rows commit: no walk per scrape
        return [((s.name,), float(tally[s])) for s in TabletState]

    def tservers() -> list[tuple[tuple[str], float]]:
        ts = master.ts_manager
        if ts is None:
            return []
        live = ts.num_live()
        return [(("live",), float(live)), (("dead",), float(len(ts) - live))]

    def heartbeats() -> float:
        return float(master.ts_manager.heartbeats_received) if master.ts_manager else 0.0

    def revivals() -> float:
        return float(master.ts_manager.revivals) if master.ts_manager else 0.0

    def stalled() -> float:
        clock = master.progress_clock
        return clock.stalled_s if clock is not None else 0.0

    def reports_deferred() -> list[tuple[tuple[str], float]]:
        gate = master.report_gate
        return [
            (("shed",), float(gate.shed)),
            (("late",), float(gate.late)),
            (("unconfirmed",), float(gate.unconfirmed)),
        ]

    def report_writes() -> list[tuple[tuple[str], float]]:
        if master.catalog is None:
            return []
        group = master.catalog.report_writes
        return [(("writes",), float(group.writes)), (("entries",), float(group.entries))]

    def full_report_turns() -> list[tuple[tuple[str], float]]:
        turns = master.report_gate.turns
        return [(("given",), float(turns.given)), (("lapsed",), float(turns.lapsed))]

    def locations_lookups() -> list[tuple[tuple[str], float]]:
        if master.catalog is None:
            return []
        cache = master.catalog.locations_cache
        return [(("hit",), float(cache.hits)), (("miss",), float(cache.misses))]

    def locations_entries() -> float:
        return float(len(master.catalog.locations_cache)) if master.catalog is not None else 0.0

    def tasks() -> float:
        return float(master.background.num_tasks()) if master.background is not None else 0.0

    def queue(field: int) -> list[tuple[tuple[str], float]]:
        bg = master.background
        if bg is None:
            return []
        return [((kind,), float(v[field])) for kind, v in sorted(bg.queue_ages().items())]

    def failed_replicas() -> float:
        return float(len(master.catalog.failed_replicas)) if master.catalog is not None else 0.0

    registry.gauge_callback(
        "tessera_master_catalog_loaded",
        "1 if this master is the leader and has loaded the catalog (serves DDL and lookups), "
        "in its own view: not confirmed by a majority (the status pages confirm).",
        loaded,
    )
    registry.gauge_callback(
        "tessera_master_tables", "Tables in the catalog, by state.", tables_by_state, ("state",)
    )
    registry.gauge_callback(
        "tessera_master_tablets",
        "Tablets in the catalog, by state.",
        tablets_by_state,
        ("state",),
    )
    registry.gauge_callback(
        "tessera_master_tservers",
        "Registered tablet servers, live or dead (no heartbeat within unresponsive_timeout_ms).",
        tservers,
        ("state",),
    )
    registry.counter_callback(
        "tessera_master_heartbeats_total",
        "Tablet server heartbeats received by this master.",
        heartbeats,
    )
    registry.counter_callback(
        "tessera_master_tserver_revivals_total",
        "Heartbeats from a tablet server this master held dead at the time (flapping servers, "
        "or a master too slow to read heartbeats; zero in a healthy fleet).",
        revivals,
    )
    registry.counter_callback(
        "tessera_master_loop_stalled_seconds_total",
        "Seconds of this master's event-loop stalls beyond loop_stall_threshold_ms, not "
        "counted against tablet servers' heartbeats (progress_clock).",
        stalled,
    )
    registry.counter_callback(
        "tessera_master_tablet_reports_deferred_total",
        "Tablet reports not acknowledged so that heartbeats stay prompt (heartbeat.ReportGate): "
        "shed (too many report writes running), late (write still running at the budget) or "
        "unconfirmed (a claimed leader or config the other voters do not confirm yet).",
        reports_deferred,
        ("reason",),
    )
    registry.counter_callback(
        "tessera_master_report_writes_total",
        "Catalog writes of tablet reports, and the sys.catalog entries that carried them "
        "(writes proposed together share an entry, group_commit.py).",
        report_writes,
        ("what",),
    )
    registry.counter_callback(
        "tessera_master_full_report_turns_total",
        "Tablet servers asked for their full report in their turn (report_turns.py): given, "
        "or lapsed (the report was not processed within the turn, and the turn went on).",
        full_report_turns,
        ("outcome",),
    )
    registry.gauge_callback(
        "tessera_master_full_reports_due",
        "Registered tablet servers whose full report this master still wants (after its "
        "election or their registration; only a leader processes them).",
        lambda: float(master.ts_manager.full_reports_due()) if master.ts_manager else 0.0,
    )
    registry.gauge_callback(
        "tessera_master_full_report_turns_held",
        "Tablet servers holding a turn to send their full report now (at most full_report_turns).",
        lambda: float(master.report_gate.turns.holding()),
    )
    registry.counter_callback(
        "tessera_master_table_locations_cache_lookups_total",
        "GetTableLocations calls the table locations cache answered (hit) or not (miss: built, "
        "then kept), as Kudu's table_locations_cache_hits and _misses.",
        locations_lookups,
        ("result",),
    )
    registry.gauge_callback(
        "tessera_master_table_locations_cache_entries",
        "GetTableLocations answers the table locations cache holds (at most "
        "table_locations_cache_entries).",
        locations_entries,
    )
    registry.gauge_callback(
        "tessera_master_background_tasks",
        "Leader background tasks in flight or waiting for a retry.",
        tasks,
    )
    registry.gauge_callback(
        "tessera_master_task_queue_length",
        "Background tasks due and waiting for a slot, by kind (taken one kind at a time in turn).",
        lambda: queue(0),
        ("kind",),
    )
    registry.gauge_callback(
        "tessera_master_task_queue_age_seconds",
        "How long the oldest queued background task of each kind has waited.",
        lambda: queue(1),
        ("kind",),
    )

    def replaced() -> list[tuple[tuple[str], float]]:
        if master.catalog is None:
            return []
        counts = master.catalog.assigner.replaced
        return [((r,), float(counts[r])) for r in ("no answer", "some answered", "no leader")]

    def windows(field: str) -> list[tuple[tuple[str], float]]:
        bg = master.background
        if bg is None:
            return []
        return [((s,), float(getattr(w, field))) for s, w in bg.pacer.views()]

    registry.gauge_callback(
        "tessera_master_heartbeat_interval_asked_ms",
        "The heartbeat interval this master asks of tablet servers now (the servers' own unless "
        "its event loop lags or its CPU saturates: heartbeat_pace.py).",
        lambda: float(master.heartbeat_pace.interval),
    )
    registry.counter_callback(
        "tessera_master_heartbeat_pace_stretches_total",
        "Times this master stretched the heartbeat interval it asks for (overloaded).",
        lambda: float(master.heartbeat_pace.stretches),
    )
    registry.counter_callback(
        "tessera_master_tablets_replaced_total",
        "CREATING tablets this master replaced for want of progress, by reason: no replica "
        "answered CreateTablet, some did, or a majority did and no leader was reported.",
        replaced,
        ("reason",),
    )
    registry.counter_callback(
        "tessera_master_replacements_postponed_total",
        "Timed-out CREATING tablets whose replacement waited because max_replacements_in_flight "
        "or max_replacements_per_ts replacements were not yet RUNNING.",
        lambda: float(master.catalog.assigner.postponed) if master.catalog is not None else 0.0,
    )
    registry.counter_callback(
        "tessera_master_tserver_rpcs_shed_total",
        "Admin RPCs tablet servers refused with RESOURCE_EXHAUSTED (busy), this term: retried "
        "later through a halved window, not counted as failures.",
        lambda: float(master.background.rpcs_shed) if master.background is not None else 0.0,
    )
    registry.counter_callback(
        "tessera_master_claims_adopted_by_sweep_total",
        "Tablets whose pending leader or config claim the claim sweep adopted this term, its "
        "voters confirming it when asked, without waiting for a report to come again (claims.py).",
        lambda: float(master.background.claims_adopted) if master.background is not None else 0.0,
    )
    registry.gauge_callback(
        "tessera_master_pending_claims",
        "Leader or config claims of tablet reports waiting for their voters' confirmation.",
        lambda: float(master.catalog.pending_claims()) if master.catalog is not None else 0.0,
    )
    registry.gauge_callback(
        "tessera_master_create_tablet_in_flight",
        "CreateTablet calls in flight to each tablet server.",
        lambda: windows("in_flight"),
        ("server",),
    )
    registry.gauge_callback(
        "tessera_master_create_tablet_window",
        "How many CreateTablet calls each tablet server may have in flight now (grows on prompt "
        "answers, halves on busy refusals, timeouts and slow answers).",
        lambda: windows("window"),
        ("server",),
    )
    registry.gauge_callback(
        "tessera_master_failed_replicas",
        "Tablet replicas their tablet servers report FAILED, as the leader last heard (0 on "
        "followers); each is replaced by re-replication, then tombstoned.",
        failed_replicas,
    )


# --- pages -----------------------------------------------------------------------------------


def install_master_pages(master: MasterState, http: StatusServer) -> None:
    """Register the master's pages (module docstring) on `http`."""
    pages = _MasterPages(master, http)
    http.route("/", pages.home, nav="Master")
    http.route("/tables", pages.tables, nav="Tables")
    http.route("/tablets", pages.tablets, nav="Tablets")
    http.route("/tservers", pages.tservers, nav="Tablet servers")
    http.route("/tasks", pages.tasks, nav="Tasks")


def describe_partition(partition: Partition, table: TableRecord) -> str:
    """A tablet's partition for people: its hash buckets and range bounds as key values."""
    ps = table.partition_schema
    parts = [
        f"HASH({', '.join(h.columns)}) {bucket}/{h.num_buckets}"
        for h, bucket in zip(ps.hash, partition.hash_buckets, strict=False)
    ]
    range_cols = ps.range.resolve(table.schema)
    if range_cols:
        cols = [table.schema.column(c) for c in range_cols]
        lo = _key_text(cols, partition.range_lower, "-inf")
        hi = _key_text(cols, partition.range_upper, "+inf")
        parts.append(f"RANGE({', '.join(range_cols)}) [{lo}, {hi})")
    return "; ".join(parts) or "whole table"


def _key_text(cols: list[ColumnSchema], key: bytes, unbounded: str) -> str:
    if not key:
        return unbounded
    try:
        values = decode_key(cols, key, allow_prefix=True)
    except InvalidArgument:
        return f"0x{key.hex()}"
    return ", ".join(repr(v) for v in values)


class _MasterPages:
    def __init__(self, master: MasterState, http: StatusServer) -> None:
        self.m = master
        self.http = http

    def _label(self) -> None:
        self.http.label = f"master {self.m.uuid} at {self.m.address}"

    async def _view(self) -> tuple[str, Markup]:
        """This master's role as a page may state it, and a banner saying how current the page
        is (module docstring): LEADER only after a ReadIndex round a majority answered."""
        node = self.m.node
        if node is None:
            return "STARTING", Markup('<p class="view">starting</p>')
        st = node.status()
        if st.role is Role.LEADER:
            try:
                index = await node.read(timeout=_CONFIRM_TIMEOUT_S)
            except (TimeoutError, TesseraError):
                index = None
            st = node.status()
            if index is not None and st.role is Role.LEADER:
                return "LEADER", Markup(
                    f'<p class="view confirmed">Leader of term {st.term}, confirmed by a '
                    f"majority; state applied through index {st.applied} (read index "
                    f"{index}).</p>"
                )
            if st.role is Role.LEADER:
                return "LEADER (unconfirmed)", Markup(
                    f'<p class="view unconfirmed">This master believes it leads term '
                    f"{st.term}, but no majority confirmed it within {_CONFIRM_TIMEOUT_S:g}s: "
                    "another master may have taken over, and what this page shows may be "
                    f"stale (applied through index {st.applied}).</p>"
                )
        lead = f"{st.lead} at {self.m.address_of(st.lead) or '?'}" if st.lead else "none known"
        return st.role.name, Markup(
            f'<p class="view">This master is a {esc(st.role.name)} of term {st.term}: this '
            f"page shows its own view, applied through index {st.applied}, which may lag the "
            f"leader ({esc(lead)}).</p>"
        )

    def _tables(self) -> list[TableInfo]:
        catalog = self.m.catalog
        if catalog is None:
            return []
        return sorted(catalog.maps.tables_by_id.values(), key=lambda t: (t.name, t.table_id))

    def _leaders_by_server(self) -> Tally[str]:
        tally: Tally[str] = Tally()
        if self.m.catalog is None:
            return tally
        for tablet in self.m.catalog.maps.tablets_by_id.values():
            cs = tablet.record.consensus
            if tablet.state is TabletState.RUNNING and cs is not None and cs.leader_uuid:
                tally[cs.leader_uuid] += 1
        return tally

    # --- / -----------------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        self._label()
        m = self.m
        node, catalog, ts = m.node, m.catalog, m.ts_manager
        if node is None or catalog is None or ts is None:
            return self.http.page("Master", "<p>starting</p>")
        own_role, banner = await self._view()
        st = node.status()
        leader = "none known"
        if st.lead:
            leader = f"{st.lead} at {m.address_of(st.lead) or '?'}"
        maps = catalog.maps
        facts = kv_table(
            [
                ("UUID", m.uuid),
                ("RPC address", m.address),
                ("HTTP address", m.http_address or "-"),
                ("Role", Markup(f'<span class="{esc(st.role.name)}">{esc(own_role)}</span>')),
                ("Term", st.term),
                ("Leader", leader),
                ("Commit index", st.commit),
                ("Applied index", st.applied),
                ("Last log index", st.last_index),
                ("Catalog loaded (serving as leader)", "yes" if catalog.loaded else "no"),
                ("Tables", len(maps.tables_by_name)),
                ("Tablets", len(maps.tablets_by_id)),
                ("Tablet servers live / registered", f"{ts.num_live()} / {len(ts)}"),
            ]
        )
        rows = []
        for peer in m.peers:
            if peer.uuid == m.uuid:
                role = own_role
            elif peer.uuid == st.lead:
                role = Role.LEADER.name
            elif peer.uuid in st.config.voters:
                role = Role.FOLLOWER.name
            elif peer.uuid in st.config.learners:
                role = Role.LEARNER.name
            else:
                role = Role.NON_PARTICIPANT.name
            member = "VOTER" if peer.uuid in st.config.voters else "NON_VOTER"
            progress = st.progress.get(peer.uuid)
            match = progress.match if progress is not None else "-"
            rows.append(
                (
                    peer.uuid,
                    peer.address,
                    Markup(f'<span class="{esc(role.split()[0])}">{esc(role)}</span>'),
                    member,
                    match,
                    "this master" if peer.uuid == m.uuid else "",
                )
            )
        masters = table(
            ["UUID", "RPC address", "Role", "Member type", "Match index (leader only)", ""], rows
        )
        body = f"{banner}{facts}<h2>Masters</h2>{masters}"
        return self.http.page(f"Master {m.uuid}", body)

    # --- /tables -----------------------------------------------------------------------------

    async def tables(self, request: Request) -> Response:
        self._label()
        _, banner = await self._view()
        rows = []
        for t in self._tables():
            tablets = list(t.tablets.values())
            running = sum(x.state is TabletState.RUNNING for x in tablets)
            replicas = sum(
                len(x.record.consensus.peers)
                for x in tablets
                if x.record.consensus is not None and not x.state.is_terminal
            )
            rows.append(
                (
                    link(f"/tablets?table={t.table_id}", t.name),
                    t.table_id,
                    t.record.state.name,
                    t.record.schema_version,
                    t.record.num_replicas,
                    len(tablets),
                    running,
                    replicas,
                )
            )
        body = table(
            [
                "Name",
                "Table id",
                "State",
                "Schema version",
                "Replication factor",
                "Tablets",
                "Running tablets",
                "Replicas",
            ],
            rows,
            empty="no tables",
        )
        return self.http.page("Tables", banner + body)

    # --- /tablets ----------------------------------------------------------------------------

    async def tablets(self, request: Request) -> Response:
        self._label()
        _, banner = await self._view()
        wanted = request.arg("table")
        tables = self._tables()
        if wanted:
            tables = [t for t in tables if t.table_id == wanted]
            if not tables:
                raise HttpError(404, f"no table with id {wanted!r}")
        sections = [self._table_tablets(t) for t in tables]
        title = f"Tablets of {tables[0].name}" if wanted else "Tablets"
        return self.http.page(title, banner + ("".join(sections) or "<p>no tables</p>"))

    def _table_tablets(self, info: TableInfo) -> str:
        rows: list[tuple[object, ...]] = []
        tablets = sorted(
            info.tablets.values(), key=lambda t: (t.partition.partition_key_start, t.tablet_id)
        )
        for tablet in tablets:
            rows.extend(self._tablet_rows(info, tablet))
        heading = (
            f"<h2>{esc(info.name)} <small>{esc(info.table_id)}, {esc(info.record.state.name)}"
            f"</small></h2>"
        )
        headers = [
            "Tablet id",
            "Partition",
            "State",
            "Term",
            "Config index",
            "Replica uuid",
            "Role",
            "Member type",
            "Address",
            "Server",
        ]
        return heading + table(headers, rows, empty="no tablets")

    def _tablet_rows(self, info: TableInfo, tablet: TabletInfo) -> Iterable[tuple[object, ...]]:
        record = tablet.record
        cs = record.consensus
        head = (
            tablet.tablet_id,
            describe_partition(record.partition, info.record),
            record.state.name,
            cs.term if cs is not None else "-",
            cs.config_index if cs is not None else "-",
        )
        locations = tablet.locations().replicas
        if not locations:
            yield (*head, "-", "-", "-", "-", "-")
            return
        for r in locations:
            address = self.m.ts_manager.rpc_address(r.ts_uuid) if self.m.ts_manager else None
            if address is None and r.address is not None:
                address = str(r.address)
            yield (
                *head,
                r.ts_uuid,
                Markup(f'<span class="{esc(r.role.name)}">{esc(r.role.name)}</span>'),
                r.member_type.name,
                address or "-",
                self._server_state(r.ts_uuid),
            )

    def _server_state(self, uuid: str) -> Markup:
        ts = self.m.ts_manager
        if ts is None or uuid not in ts:
            return Markup('<span class="unknown">not registered</span>')
        state = "live" if ts.is_live(uuid) else "dead"
        return Markup(f'<span class="{state}">{state}</span>')

    # --- /tservers ---------------------------------------------------------------------------

    async def tservers(self, request: Request) -> Response:
        self._label()
        _, banner = await self._view()
        ts = self.m.ts_manager
        descriptors = ts.descriptors() if ts is not None else ()
        leaders = self._leaders_by_server()
        rows = []
        for d in descriptors:
            http = d.registration.http_address
            rows.append(
                (
                    d.uuid,
                    d.rpc_address,
                    # This master's scheme: a deployment secures its status pages alike.
                    link(f"{self.http.scheme}://{http}/", http) if http else "-",
                    self._server_state(d.uuid),
                    int(d.heartbeat_age_s * 1000),
                    d.total_replicas,
                    leaders.get(d.uuid, 0),
                    d.registration.location or "-",
                    d.registration.software_version or "-",
                )
            )
        body = table(
            [
                "UUID",
                "RPC address",
                "Status pages",
                "Live",
                "ms since heartbeat",
                "Replicas",
                "Leaders",
                "Location",
                "Version",
            ],
            rows,
            empty="no tablet server has registered with this master",
        )
        return self.http.page("Tablet servers", banner + body)

    # --- /tasks ------------------------------------------------------------------------------

    async def tasks(self, request: Request) -> Response:
        self._label()
        _, banner = await self._view()
        bg = self.m.background
        if bg is None:
            node = self.m.node
            lead = node.status().lead if node is not None else ""
            where = f"the leader ({lead})" if lead else "the leader, once one is elected"
            return self.http.page(
                "Background tasks",
                f"<p>Background tasks run on {esc(where)}; this master is not serving as the "
                "leader.</p>",
            )
        names: dict[str, str] = {t.table_id: t.name for t in self._tables()}
        rows = [
            (
                v.kind,
                names.get(v.table_id, v.table_id or "-"),
                v.tablet_id,
                ", ".join(v.targets) or "leader",
                "running" if v.running else "waiting",
                v.attempts,
                fmt_age(v.retry_in_s) if v.retry_in_s is not None else "-",
                ", ".join(v.answered) or "-",
            )
            for v in bg.views()
        ]
        summary = kv_table(
            [
                ("Term", bg.fence.master_term),
                ("Rounds", bg.rounds),
                ("RPCs sent / failed", f"{bg.rpcs_sent} / {bg.rpcs_failed}"),
                ("In flight", bg.in_flight),
                *(
                    (f"Queued {kind}", f"{n} (oldest {fmt_age(age)})")
                    for kind, (n, age) in sorted(bg.queue_ages().items())
                ),
            ]
        )
        headers = [
            "Task",
            "Table",
            "Tablet",
            "Tablet servers",
            "State",
            "Failed attempts",
            "Retry in",
            "Answered",
        ]
        body = f"{banner}{summary}<h2>Tasks</h2>{table(headers, rows, empty='no tasks in flight')}"
        return self.http.page("Background tasks", body)
