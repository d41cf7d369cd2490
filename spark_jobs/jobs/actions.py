"""The fixes the jobs apply with `--apply`: admin RPCs to tablet servers, compare-and-set.

Each function returns an outcome string for the findings table ("deleted", "tombstoned",
"altered to version 4", "skipped: ...", "failed: ...") and never raises for a refusal: one
failed fix must not stop the others (HBCK2 style). Synchronous gRPC from the driver: a job fixes
tens of things, not thousands per second.
"""

from __future__ import annotations

import grpc

from service.common.errors import CasMismatch, TesseraError, from_grpc
from service.common.tls import Credentials, open_sync_channel
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc
from spark_jobs.inventory import Inventory
from spark_jobs.reconcile import Finding

__all__ = ["apply_delete", "apply_schema"]

TIMEOUT_S = 30.0


def _admin(
    address: str, credentials: Credentials | None
) -> tuple[grpc.Channel, tserver_pb2_grpc.TabletServerAdminServiceStub]:
    ch = open_sync_channel(address, credentials, role="tserver")
    return ch, tserver_pb2_grpc.TabletServerAdminServiceStub(ch)


def apply_delete(inv: Inventory, f: Finding, credentials: Credentials | None = None) -> str:
    """DeleteTablet for a replica of a deleted tablet (DELETED) or one out of its config
    (TOMBSTONED), refused by the server if its config changed since it was listed."""
    server = next((s for s in inv.tservers if s.ts_uuid == f.ts_uuid), None)
    if server is None or not server.address:
        return "failed: the tablet server's address is unknown"
    kind = tpb.TABLET_DATA_DELETED if f.action == "delete" else tpb.TABLET_DATA_TOMBSTONED
    ch, stub = _admin(server.address, credentials)
    try:
        stub.DeleteTablet(
            tpb.DeleteTabletRequestPB(
                dest_uuid=f.ts_uuid,
                tablet_id=f.tablet_id,
                delete_type=kind,
                cas_config_opid_index=f.cas_config_opid_index,
                reason=f"tessera {f.job}: {f.kind}",
            ),
            timeout=TIMEOUT_S,
        )
    except grpc.RpcError as e:
        err = from_grpc(e)
        if isinstance(err, CasMismatch):
            return f"skipped: the replica's config changed since it was listed ({err.message})"
        return f"failed: {err.message}"
    finally:
        ch.close()
    return "deleted" if f.action == "delete" else "tombstoned"


def apply_schema(
    inv: Inventory, f: Finding, masters: list[str], credentials: Credentials | None = None
) -> str:
    """Re-send the table's current schema to the tablet's leader (idempotent there)."""
    from service.client.sync import SyncClient
    from service.common.schema_codec import schema_to_pb

    client = SyncClient.shared(tuple(masters), credentials=credentials)
    try:
        info = client.call("open_table", f.table_name, refresh=True)
        (loc,) = [
            t for t in client.call("table_locations", f.table_name) if t.tablet_id == f.tablet_id
        ]
    except (TesseraError, ValueError) as e:
        return f"failed: {e}"
    leader = loc.leader()
    if leader is None:
        return "failed: the tablet has no known leader"
    ch, stub = _admin(leader.address, credentials)
    try:
        r = stub.AlterSchema(
            tpb.AlterSchemaRequestPB(
                dest_uuid=leader.ts_uuid, tablet_id=f.tablet_id, schema=schema_to_pb(info.schema)
            ),
            timeout=TIMEOUT_S,
        )
    except grpc.RpcError as e:
        return f"failed: {from_grpc(e).message}"
    finally:
        ch.close()
    return f"altered: leader at version {r.schema_version}"
