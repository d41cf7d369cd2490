"""A tablet server's status pages and its Prometheus metrics (served by `common.http_status`).

Pages:

  /               this server: uuid, addresses, the highest master term seen, its replicas
                  running, hosted and FAILED, and its heartbeat state towards every master
                  (leader or not, term, successes, failures, time since the last success)
  /tablets        every replica hosted here: tablet, table, data state, replica state, Raft
                  role, term and leader, schema version, rows, bytes on disk, error if any
  /tablet-copies  copies this server runs as the destination (running and finished) and the
                  copy sessions it serves as the source
  /scans          open scanners (tablet, rows returned, calls, idle time)
  /healthz        "ok" while the process serves (`common.http_status`)

Who may read them: as on a master, off loopback (or with `http_auth = "tls"`) every page but
/healthz needs a client certificate of the cluster CA, any role (docs/design/security.md#R13).

Metrics are read at scrape time from the objects that own the state (callback families,
`metrics` module docstring): every replica's Raft term, commit and applied index and role
(labelled by `group`, the tablet id, as the master labels sys.catalog's), replicas by state
(`tessera_tserver_replicas{state="FAILED"}` counts the replicas an entry or a file failed),
leaders, heartbeats by master and outcome, scanner bytes and pages, and the Raft transport's
message counts, the same families a master exports (`consensus.transport_metrics`). Rows
written (counted by `TabletSettings.on_rows_written`), RPC counts and latencies (`RpcMetrics`)
and the WAL fsync histogram are pushed by the code that sees them and created by
`TabletServer`.

What the pages and metrics read of the server is `ServerState`, a protocol the tablet server
satisfies: read at request or scrape time, because the metrics are installed before the server
starts (its tablet manager, copies and heartbeater do not exist yet) and the term and HTTP
address change while it runs.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from functools import partial
from typing import Protocol

from service.common.config import TServerConfig
from service.common.http_status import (
    Markup,
    Request,
    Response,
    StatusServer,
    esc,
    fmt_age,
    fmt_bytes,
    kv_table,
    table,
)
from service.common.metrics import MetricsRegistry
from service.consensus.quiesce import Quiescence
from service.consensus.transport_metrics import install_transport_metrics
from service.pb import master_pb2 as mpb
from service.raft import Role
from service.tserver.heartbeater import Heartbeater
from service.tserver.scanners import ScannerManager
from service.tserver.tablet import ReplicaState, TabletReplica
from service.tserver.tablet_copy import CopyClient, CopySource
from service.tserver.tablet_manager import TabletManager

__all__ = ["ServerState", "install_tserver_metrics", "install_tserver_pages"]

GROUP_LABEL = "group"


class ServerState(Protocol):
    """What the status pages and metrics read of a tablet server (module docstring), all of
    it read only. None: not started yet (or, for the heartbeater and quiescence, off)."""

    @property
    def config(self) -> TServerConfig: ...
    @property
    def uuid(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def http_address(self) -> str: ...
    @property
    def start_time_us(self) -> int: ...
    @property
    def highest_master_term(self) -> int: ...
    @property
    def tablets(self) -> TabletManager | None: ...
    @property
    def heartbeater(self) -> Heartbeater | None: ...
    @property
    def quiescence(self) -> Quiescence | None: ...
    @property
    def copies(self) -> CopyClient | None: ...
    @property
    def copy_source(self) -> CopySource | None: ...
    @property
    def scanners(self) -> ScannerManager: ...


# --- metrics ---------------------------------------------------------------------------------


def install_tserver_metrics(server: ServerState, registry: MetricsRegistry) -> None:
    """Register the callback families that read `server`'s state at scrape time."""

    def replicas() -> list[TabletReplica]:
        tm = server.tablets
        return list(tm.replicas.values()) if tm is not None else []

    def raft(field: str) -> list[tuple[tuple[str], float]]:
        out = []
        for r in replicas():
            node = r.node
            if node is None or r.state is not ReplicaState.RUNNING:
                continue
            st = node.status()
            values = {
                "term": st.term,
                "commit": st.commit,
                "applied": st.applied,
                "leader": 1 if st.role is Role.LEADER else 0,
                "quiesced": 1 if node.quiesced else 0,
            }
            out.append(((r.tablet_id,), float(values[field])))
        return out

    for name, field, text in (
        ("tessera_raft_term", "term", "Current Raft term."),
        ("tessera_raft_commit_index", "commit", "Highest log index known committed."),
        (
            "tessera_raft_applied_index",
            "applied",
            "Highest log index applied to the state machine.",
        ),
        ("tessera_raft_is_leader", "leader", "1 if this node leads the Raft group, else 0."),
        (
            "tessera_raft_quiesced",
            "quiesced",
            "1 if the group is idle and stopped ticking and heartbeating (quiesce.py), else 0.",
        ),
    ):
        registry.gauge_callback(
            name, f"{text} One series per tablet replica.", partial(raft, field), (GROUP_LABEL,)
        )

    install_transport_metrics(
        registry, lambda: server.tablets.transport if server.tablets is not None else None
    )
    registry.counter_callback(
        "tessera_raft_quiesce_woken_by_silence_total",
        "Quiesced followers woken because their leader's server sent no digest for an"
        " election timeout (it died or is cut off).",
        lambda: float(server.quiescence.woken_by_silence) if server.quiescence else 0.0,
    )

    def by_state() -> list[tuple[tuple[str], float]]:
        tally = Tally(r.state.name for r in replicas())
        return [((s.name,), float(tally[s.name])) for s in ReplicaState]

    def leaders() -> float:
        return float(sum(r.is_leader() for r in replicas()))

    def rows() -> list[tuple[tuple[str], float]]:
        return [
            ((r.tablet_id,), float(r.store.row_count()))
            for r in replicas()
            if r.store is not None and r.state is ReplicaState.RUNNING
        ]

    def heartbeats() -> list[tuple[tuple[str, str], float]]:
        hb = server.heartbeater
        if hb is None:
            return []
        out: list[tuple[tuple[str, str], float]] = []
        for v in hb.views:
            out.append(((v.address, "ok"), float(v.heartbeats)))
            out.append(((v.address, "failed"), float(v.failures_total)))
        return out

    def copies() -> list[tuple[tuple[str], float]]:
        tally = Tally(c.state for c in server.copies.copies.values()) if server.copies else Tally()
        return [((s,), float(tally[s])) for s in ("RUNNING", "DONE", "FAILED", "CANCELLED")]

    registry.gauge_callback(
        "tessera_tserver_replicas", "Tablet replicas hosted, by state.", by_state, ("state",)
    )
    registry.gauge_callback(
        "tessera_tserver_leaders", "Tablet replicas hosted here that lead their tablet.", leaders
    )
    registry.gauge_callback(
        "tessera_tablet_rows", "Live rows of each running replica.", rows, (GROUP_LABEL,)
    )
    registry.counter_callback(
        "tessera_tserver_heartbeats_total",
        "Heartbeats sent to each master, by outcome (ok, failed).",
        heartbeats,
        ("master", "result"),
    )
    registry.counter_callback(
        "tessera_tserver_create_tablet_shed_total",
        "CreateTablet calls refused with RESOURCE_EXHAUSTED: the server already had"
        " max_concurrent_creates running and max_queued_creates waiting.",
        lambda: float(server.tablets.create_gate.shed) if server.tablets is not None else 0.0,
    )
    registry.gauge_callback(
        "tessera_tserver_create_tablet_in_progress",
        "CreateTablet calls running or waiting for a turn.",
        lambda: float(server.tablets.create_gate.inside) if server.tablets is not None else 0.0,
    )
    registry.counter_callback(
        "tessera_tserver_scan_bytes_total",
        "Arrow IPC bytes of scan pages sent.",
        lambda: float(server.scanners.bytes_sent),
    )
    registry.counter_callback(
        "tessera_tserver_scan_pages_total",
        "Scan pages sent.",
        lambda: float(server.scanners.pages_sent),
    )
    registry.counter_callback(
        "tessera_tablet_scans_total",
        "Scans started on each tablet replica hosted here.",
        lambda: [((t,), float(n)) for t, n in server.scanners.opened_by_tablet.items()],
        (GROUP_LABEL,),
    )
    registry.gauge_callback(
        "tessera_tserver_scanners_open",
        "Scanners open (not yet expired or closed).",
        lambda: float(len(server.scanners.scanners)),
    )
    registry.gauge_callback(
        "tessera_tserver_tablet_copies",
        "Tablet copies this server ran as the destination since it started, by state.",
        copies,
        ("state",),
    )


# --- pages -----------------------------------------------------------------------------------


def install_tserver_pages(server: ServerState, http: StatusServer) -> None:
    """Register the tablet server's pages (module docstring) on `http`."""
    pages = _TServerPages(server, http)
    http.route("/", pages.home, nav="Tablet server")
    http.route("/tablets", pages.tablets, nav="Tablets")
    http.route("/tablet-copies", pages.copies, nav="Tablet copies")
    http.route("/scans", pages.scans, nav="Scans")


def _role_name(role: int) -> str:
    if role not in mpb.RaftRolePB.values():
        return str(role)
    return mpb.RaftRolePB.Name(mpb.RaftRolePB.ValueType(role))


def _span(text: str) -> Markup:
    return Markup(f'<span class="{esc(text)}">{esc(text)}</span>')


class _TServerPages:
    def __init__(self, server: ServerState, http: StatusServer) -> None:
        self.s = server
        self.http = http

    def _label(self) -> None:
        self.http.label = f"tablet server {self.s.uuid} at {self.s.address}"

    # --- / -----------------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        self._label()
        s = self.s
        replicas = list(s.tablets.replicas.values()) if s.tablets is not None else []
        running = sum(r.state is ReplicaState.RUNNING for r in replicas)
        failed = sum(r.state is ReplicaState.FAILED for r in replicas)
        uptime = time.time() - s.start_time_us / 1_000_000
        facts = kv_table(
            [
                ("UUID", s.uuid),
                ("RPC address", s.address),
                ("HTTP address", s.http_address or "-"),
                ("Data directory", s.config.data_dir),
                ("Up for", fmt_age(uptime)),
                ("Highest master term seen", s.highest_master_term),
                ("Replicas (running / hosted)", f"{running} / {len(replicas)}"),
                # Offline, each with its error on /tablets; the master replaces them.
                ("Replicas FAILED", failed),
                ("Leaders", sum(r.is_leader() for r in replicas)),
            ]
        )
        now = time.monotonic()
        rows = []
        for v in s.heartbeater.views if s.heartbeater is not None else []:
            rows.append(
                (
                    v.address,
                    v.master_uuid or "-",
                    _span("LEADER") if v.is_leader else "no",
                    v.term or "-",
                    v.heartbeats,
                    v.failures,
                    v.failures_total,
                    fmt_age(now - v.last_ok) + " ago" if v.last_ok else "never",
                    "yes" if v.needs_register else "no",
                    "yes" if v.needs_full else "no",
                )
            )
        masters = table(
            [
                "Master address",
                "Master uuid",
                "Leader",
                "Term",
                "Heartbeats",
                "Consecutive failures",
                "Failures",
                "Last success",
                "Must register",
                "Full report due",
            ],
            rows,
            empty="no masters configured",
        )
        body = f"{facts}<h2>Masters (heartbeats)</h2>{masters}"
        return self.http.page(f"Tablet server {s.uuid}", body)

    # --- /tablets ----------------------------------------------------------------------------

    async def tablets(self, request: Request) -> Response:
        self._label()
        tm = self.s.tablets
        hosted = (
            [(r, tm.replica_status(r)) for _, r in sorted(tm.replicas.items())]
            if tm is not None
            else []
        )
        rows = []
        for r, st in hosted:
            rows.append(
                (
                    st.tablet_id,
                    st.table_name,
                    st.table_id,
                    r.superblock.data_state.name,
                    _span(r.state.name),
                    _span(_role_name(st.role)) if r.node is not None else "-",
                    st.term if r.node is not None else "-",
                    st.leader_uuid or "-",
                    st.last_applied_index if r.node is not None else "-",
                    st.schema_version,
                    st.row_count if r.store is not None else "-",
                    fmt_bytes(st.on_disk_bytes) if r.store is not None else "-",
                    f"{st.error.code}: {st.error.message}" if st.HasField("error") else "",
                )
            )
        body = table(
            [
                "Tablet id",
                "Table",
                "Table id",
                "Data state",
                "State",
                "Role",
                "Term",
                "Leader",
                "Applied index",
                "Schema version",
                "Rows",
                "On disk",
                "Error",
            ],
            rows,
            empty="no replicas hosted",
        )
        return self.http.page("Tablets", body)

    # --- /tablet-copies ----------------------------------------------------------------------

    async def copies(self, request: Request) -> Response:
        self._label()
        now = time.time()
        statuses = list(self.s.copies.copies.values()) if self.s.copies is not None else []
        statuses.sort(key=lambda c: (c.state != "RUNNING", -c.started_at))
        rows = [
            (
                c.tablet_id,
                c.source_uuid,
                _span(c.state),
                f"{fmt_bytes(c.bytes_copied)} / {fmt_bytes(c.bytes_total)}",
                fmt_age(now - c.started_at) + " ago",
                c.message,
            )
            for c in statuses
        ]
        incoming = table(
            ["Tablet id", "Source", "State", "Copied", "Started", "Message"],
            rows,
            empty="no tablet copies to this server since it started",
        )
        mono = time.monotonic()
        sessions = self.s.copy_source.sessions if self.s.copy_source is not None else {}
        outgoing = table(
            ["Session", "Tablet id", "Requestor", "Bytes", "Idle"],
            [
                (
                    sid,
                    ses.tablet_id,
                    ses.requestor,
                    fmt_bytes(sum(ses.files.values())),
                    fmt_age(mono - ses.last_used),
                )
                for sid, ses in sorted(sessions.items())
            ],
            empty="no copy sessions served now",
        )
        body = (
            f"<h2>Copies to this server</h2>{incoming}"
            f"<h2>Copy sessions served by this server</h2>{outgoing}"
        )
        return self.http.page("Tablet copies", body)

    # --- /scans ------------------------------------------------------------------------------

    async def scans(self, request: Request) -> Response:
        self._label()
        sm = self.s.scanners
        now = time.monotonic()
        # No scanner ids: an id with its next call sequence number is enough to continue
        # someone else's scan, so the page shows what each scan is doing, not its handle.
        rows = [
            (
                sc.tablet_id,
                sc.rows_returned,
                sc.call_seq,
                "yes" if sc.finished else "no",
                fmt_age(now - sc.last_used),
            )
            for sc in sorted(sm.scanners.values(), key=lambda x: x.last_used)
        ]
        summary = kv_table(
            [
                ("Scanners opened", sm.opened),
                ("Expired", sm.expired),
                ("Pages sent", sm.pages_sent),
                ("Bytes sent", fmt_bytes(sm.bytes_sent)),
                ("Idle timeout", fmt_age(sm.ttl_s)),
            ]
        )
        scanners = table(
            ["Tablet", "Rows returned", "Calls", "Finished", "Idle"],
            rows,
            empty="no open scanners",
        )
        return self.http.page("Scans", f"{summary}<h2>Open scanners</h2>{scanners}")
