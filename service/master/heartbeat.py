"""TSHeartbeat: registration and liveness on every master, tablet reports on the leader.

Theory of operation
-------------------
Tablet servers heartbeat to ALL masters (seed 001's plan, which ends KUDU-1358). One heartbeat
is handled in this order:

  1. decode and validate the whole request (instance, registration, tablet report) into
     dataclasses; a bad field is InvalidArgument naming it, and nothing has changed;
  2. `TSManager.heartbeat`: registration and liveness, on every master alike;
  3. only on the leader whose catalog is loaded, and only for a registered instance: process
     the tablet report, full or incremental (`CatalogManager.process_report`: ONE replicated
     write for the whole report), then hand the RPCs it calls for to the background tasks.
     A failed replication is logged and the report is not acknowledged (the server sends it
     again); it never fails the heartbeat nor crashes the master (KUDU-495). A follower
     ignores the report (its maps follow sys.catalog, never reports);
  4. answer: `needs_full_tablet_report` while the leader still wants one (after this master's
     election, KUDU-1374, or a registration); a full report processed under the token of the
     latest request clears that wish; `acked_report_sequence_number` is the report's sequence
     number once processed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from service.common.errors import InvalidArgument, TesseraError
from service.common.ids import NodeId, TabletId, validate_uuid
from service.master.catalog_manager import CatalogManager
from service.master.catalog_records import ConsensusState, consensus_state_from_pb
from service.master.report_processing import (
    ReplicaState,
    ReportAction,
    ReportedRole,
    ReportedTablet,
)
from service.master.ts_descriptor import NodeInstance, TSRegistration
from service.master.ts_manager import TSManager
from service.pb import master_pb2 as pb

__all__ = ["HeartbeatContext", "decode_report", "handle_heartbeat"]

log = logging.getLogger(__name__)

MAX_REPORTED_TABLETS = 100_000
"""More replicas than this in one report is refused (a runaway or hostile sender)."""


@dataclass(frozen=True)
class HeartbeatContext:
    """What the handler needs of the master, read at the time of the heartbeat."""

    master_instance: pb.NodeInstancePB
    term: int
    leading: bool
    """Leader with its catalog loaded: processes reports and asks for full ones."""
    master_addresses: tuple[pb.HostPortPB, ...]
    ts_manager: TSManager
    catalog: CatalogManager
    submit: Callable[[Iterable[ReportAction]], None]
    """Where the RPCs a report calls for go (the background tasks of this term)."""


def decode_report(report: pb.TabletReportPB) -> list[ReportedTablet]:
    """The report's replicas as values, validated; InvalidArgument naming the field."""
    if len(report.updated_tablets) > MAX_REPORTED_TABLETS:
        raise InvalidArgument(
            f"tablet_report.updated_tablets: {len(report.updated_tablets)} replicas, more than "
            f"{MAX_REPORTED_TABLETS}"
        )
    out = []
    for i, t in enumerate(report.updated_tablets):
        path = f"tablet_report.updated_tablets[{i}]"
        try:
            tablet_id = TabletId(validate_uuid(t.tablet_id))
        except InvalidArgument as e:
            raise InvalidArgument(f"{path}.tablet_id: {e.message}") from None
        try:
            state = ReplicaState(t.state)
        except ValueError:
            raise InvalidArgument(f"{path}.state: unknown replica state {t.state}") from None
        try:
            role = ReportedRole(t.role)
        except ValueError:
            raise InvalidArgument(f"{path}.role: unknown role {t.role}") from None
        consensus: ConsensusState | None = None
        if t.HasField("consensus_state") and t.consensus_state.committed_config.peers:
            consensus = consensus_state_from_pb(t.consensus_state, f"{path}.consensus_state")
        out.append(ReportedTablet(tablet_id, state, role, consensus, t.schema_version))
    return out


def _registration(request: pb.TSHeartbeatRequestPB) -> TSRegistration:
    r = request.registration
    try:
        return TSRegistration(
            rpc_addresses=tuple(f"{h.host}:{h.port}" for h in r.rpc_addresses),
            http_addresses=tuple(f"{h.host}:{h.port}" for h in r.http_addresses),
            software_version=r.software_version,
            start_time=r.start_time_us / 1_000_000,
            location=r.location or None,
        )
    except InvalidArgument as e:
        raise InvalidArgument(f"registration: {e.message}") from None


async def handle_heartbeat(
    ctx: HeartbeatContext, request: pb.TSHeartbeatRequestPB
) -> pb.TSHeartbeatResponsePB:
    """One heartbeat, steps 1-4 of the module docstring."""
    if not request.HasField("instance"):
        raise InvalidArgument("instance: missing")
    try:
        instance = NodeInstance(
            NodeId(request.instance.permanent_uuid), request.instance.instance_seqno
        )
    except InvalidArgument as e:
        raise InvalidArgument(f"instance: {e.message}") from None
    registration = _registration(request) if request.HasField("registration") else None
    has_report = request.HasField("tablet_report")
    reported = decode_report(request.tablet_report) if has_report and ctx.leading else []

    ts = ctx.ts_manager
    outcome = ts.heartbeat(instance, registration, request.num_leaders)
    acked = 0
    if ctx.leading and has_report and not outcome.needs_reregister:
        uuid = instance.permanent_uuid
        full = not request.tablet_report.is_incremental
        try:
            plan = await ctx.catalog.process_report(uuid, reported)
        except TesseraError as e:
            log.warning(
                "tablet report of %s (%d replicas) not processed, not acknowledged: %s",
                uuid,
                len(reported),
                e,
            )
        else:
            acked = request.tablet_report.sequence_number
            if plan.orphans:
                log.info(
                    "tablet server %s hosts %d tablets the catalog has no record of; left "
                    "alone (seed 001 appendix A): %s",
                    uuid,
                    len(plan.orphans),
                    ", ".join(plan.orphans[:5]),
                )
            if plan.actions:
                ctx.submit(plan.actions)
            if full and outcome.report_token is not None:
                ts.full_report_processed(outcome.report_token)
    needs_full = (
        ctx.leading
        and not outcome.needs_reregister
        and ts.needs_full_report(instance.permanent_uuid)
    )
    return pb.TSHeartbeatResponsePB(
        master_instance=ctx.master_instance,
        leader_master=ctx.leading,
        master_term=ctx.term,
        needs_reregister=outcome.needs_reregister,
        needs_full_tablet_report=needs_full or (ctx.leading and outcome.needs_reregister),
        acked_report_sequence_number=acked,
        master_addresses=list(ctx.master_addresses),
    )
