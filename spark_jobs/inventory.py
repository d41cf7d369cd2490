"""The inputs of the reconciliation jobs: the catalog and every tablet server's replicas.

Theory of operation
-------------------
An `Inventory` is one consistent picture of the cluster, as plain rows:

* from the master leader, in one DumpCatalog (the catalog as of one committed index,
  docs/design/catalog.md#R10): `tables`, `tablets` and `replicas` (the members of each tablet's
  committed config, as the catalog records them), plus `tservers` and `masters`;
* from every tablet server, its own listing (ListTablets): `hosted`, one row per replica it has
  on disk, whatever its state. The listings are fetched by Spark, one partition per tablet
  server, so a thousand servers are asked in parallel by the executors; a server that does not
  answer is recorded (`tservers.reachable = false`, `error`) and its replicas are simply
  absent, never a reason to fail the job (HBCK2: report first).

The catalog is dumped *before* the listings. A replica created after the dump (a table being
created, a copy being added) can therefore look unknown or out of its config; the jobs compare
config op indexes and act only with compare-and-set requests, so such a race is at worst a
report, never a wrong deletion (module `reconcile`).

Every row carries the snapshot stamp (snapshot id, time, master term, committed index) so the
same rows can be appended to the Delta audit tables (`audit`) and read back later: any job can
run offline against a saved snapshot (`Inventory.from_audit`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.client.sync import SyncClient
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb

__all__ = [
    "HostedRow",
    "Inventory",
    "MasterRow",
    "ReplicaRow",
    "SnapshotStamp",
    "TServerRow",
    "TableRow",
    "TabletRow",
    "fetch_inventory",
    "list_hosted",
]

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 10.0
"""Deadline of one ListTablets call: a server slower than this is reported unreachable."""


@dataclass(frozen=True)
class SnapshotStamp:
    snapshot_id: str
    taken_at: dt.datetime
    master_term: int
    committed_index: int


@dataclass(frozen=True)
class TableRow:
    table_id: str
    name: str
    state: str  # PREPARING RUNNING ALTERING REMOVED
    schema_version: int
    num_replicas: int
    owner: str
    created_time_us: int
    altered_time_us: int


@dataclass(frozen=True)
class TabletRow:
    tablet_id: str
    table_id: str
    state: str  # PREPARING CREATING RUNNING REPLACED DELETED
    partition_key_start: bytes
    partition_key_end: bytes
    leader_uuid: str
    config_opid_index: int
    reported_schema_version: int
    replaced_by_tablet_id: str
    created_time_us: int


@dataclass(frozen=True)
class ReplicaRow:
    """A member of a tablet's committed config, as the catalog records it."""

    tablet_id: str
    table_id: str
    ts_uuid: str
    member_type: str  # VOTER NON_VOTER
    is_leader: bool
    address: str


@dataclass(frozen=True)
class HostedRow:
    """A replica as its tablet server lists it (ListTablets)."""

    ts_uuid: str
    tablet_id: str
    table_id: str
    table_name: str
    data_state: str  # READY COPYING DELETED TOMBSTONED
    state: str  # RUNNING FAILED TOMBSTONED ...
    role: str
    term: int
    leader_uuid: str
    schema_version: int
    config_opid_index: int
    in_own_config: bool
    row_count: int
    on_disk_bytes: int
    error: str


@dataclass(frozen=True)
class TServerRow:
    ts_uuid: str
    address: str
    live: bool
    millis_since_heartbeat: int
    num_replicas: int
    num_leaders: int
    reachable: bool
    error: str


@dataclass(frozen=True)
class MasterRow:
    uuid: str
    address: str
    role: str
    term: int
    commit_index: int  # this master's (the stamp's committed_index is the leader's catalog's)
    error: str


@dataclass
class Inventory:
    stamp: SnapshotStamp
    tables: list[TableRow] = field(default_factory=list)
    tablets: list[TabletRow] = field(default_factory=list)
    replicas: list[ReplicaRow] = field(default_factory=list)
    hosted: list[HostedRow] = field(default_factory=list)
    tservers: list[TServerRow] = field(default_factory=list)
    masters: list[MasterRow] = field(default_factory=list)

    KINDS = {
        "tables": TableRow,
        "tablets": TabletRow,
        "replicas": ReplicaRow,
        "hosted_replicas": HostedRow,
        "tservers": TServerRow,
        "masters": MasterRow,
    }
    """Audit table name -> row type (the attribute is the name without `_replicas`)."""

    def rows(self, kind: str) -> list[Any]:
        return list(getattr(self, "hosted" if kind == "hosted_replicas" else kind))

    def summary(self) -> str:
        return (
            f"{len(self.tables)} tables, {len(self.tablets)} tablets, "
            f"{len(self.replicas)} catalog replicas, {len(self.hosted)} hosted replicas on "
            f"{sum(t.reachable for t in self.tservers)}/{len(self.tservers)} reachable tablet "
            f"servers (catalog index {self.stamp.committed_index}, term {self.stamp.master_term})"
        )


# --- from the catalog ------------------------------------------------------------------------


def _hp(h: mpb.HostPortPB) -> str:
    return f"{h.host}:{h.port}" if h.host else ""


def catalog_rows(
    dump_tables: Sequence[mpb.TableRecordPB], dump_tablets: Sequence[mpb.TabletRecordPB]
) -> tuple[list[TableRow], list[TabletRow], list[ReplicaRow]]:
    tables = [
        TableRow(
            table_id=t.table_id,
            name=t.name,
            state=mpb.TableRecordPB.State.Name(t.state),
            schema_version=t.schema_version,
            num_replicas=t.num_replicas,
            owner=t.owner,
            created_time_us=t.created_time_us,
            altered_time_us=t.altered_time_us,
        )
        for t in dump_tables
    ]
    tablets: list[TabletRow] = []
    replicas: list[ReplicaRow] = []
    for t in dump_tablets:
        cs = t.consensus_state
        tablets.append(
            TabletRow(
                tablet_id=t.tablet_id,
                table_id=t.table_id,
                state=mpb.TabletRecordPB.State.Name(t.state),
                partition_key_start=t.partition.partition_key_start,
                partition_key_end=t.partition.partition_key_end,
                leader_uuid=cs.leader_uuid,
                config_opid_index=cs.committed_config.opid_index,
                reported_schema_version=t.reported_schema_version,
                replaced_by_tablet_id=t.replaced_by_tablet_id,
                created_time_us=t.created_time_us,
            )
        )
        for p in cs.committed_config.peers:
            replicas.append(
                ReplicaRow(
                    tablet_id=t.tablet_id,
                    table_id=t.table_id,
                    ts_uuid=p.permanent_uuid,
                    member_type=mpb.MemberTypePB.Name(p.member_type),
                    is_leader=p.permanent_uuid == cs.leader_uuid,
                    address=_hp(p.last_known_addr),
                )
            )
    return tables, tablets, replicas


# --- from the tablet servers -----------------------------------------------------------------


def list_hosted(
    ts_uuid: str,
    address: str,
    timeout: float = LIST_TIMEOUT_S,
    credentials_dir: str | None = None,
) -> tuple[list[HostedRow], str]:
    """One tablet server's replicas, or ([], error) when it cannot be asked. Synchronous gRPC:
    this runs in Spark executors, one call per partition."""
    import grpc

    from service.client.credentials import find_credentials
    from service.common import channel_options
    from service.common.tls import open_sync_channel
    from service.pb import tserver_pb2_grpc

    channel = open_sync_channel(
        address,
        find_credentials(credentials_dir),
        role="tserver",
        options=channel_options.tool(),
    )
    try:
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(channel)
        resp = stub.ListTablets(tpb.ListTabletsRequestPB(dest_uuid=ts_uuid), timeout=timeout)
    except grpc.RpcError as e:
        from service.common.errors import from_grpc

        return [], f"{address}: {from_grpc(e).message}"
    finally:
        channel.close()
    out = []
    for r in resp.replicas:
        own = r.consensus_state.committed_config
        out.append(
            HostedRow(
                ts_uuid=ts_uuid,
                tablet_id=r.tablet_id,
                table_id=r.table_id,
                table_name=r.table_name,
                data_state=tpb.TabletDataStatePB.Name(r.data_state).removeprefix("TABLET_DATA_"),
                state=mpb.ReplicaStatePB.Name(r.state).removeprefix("REPLICA_"),
                role=mpb.RaftRolePB.Name(r.role),
                term=r.term,
                leader_uuid=r.leader_uuid,
                schema_version=r.schema_version,
                config_opid_index=r.config_opid_index,
                in_own_config=any(p.permanent_uuid == ts_uuid for p in own.peers),
                row_count=r.row_count,
                on_disk_bytes=r.on_disk_bytes,
                error=r.error.message if r.HasField("error") else "",
            )
        )
    return out, ""


def _list_partition(
    servers: Iterator[tuple[str, str, str | None]],
) -> Iterator[tuple[str, str, list[HostedRow]]]:
    for uuid, address, credentials_dir in servers:
        rows, error = list_hosted(uuid, address, credentials_dir=credentials_dir)
        yield uuid, error, rows


def fetch_inventory(
    spark: Any,
    masters: Sequence[str],
    *,
    snapshot_id: str | None = None,
    timeout: float = 60.0,
    credentials_dir: str | None = None,
) -> Inventory:
    """The live inventory: the catalog from the master leader, the listings through Spark.
    `credentials_dir` (a path each executor loads, never key bytes in a closure or a plan)."""
    from service.client.credentials import find_credentials

    client = SyncClient.shared(
        tuple(masters), timeout=timeout, credentials=find_credentials(credentials_dir)
    )
    dump = client.call("dump_catalog", include_removed=True)
    ms = client.call("list_masters")
    servers = client.call("list_tablet_servers")
    leader_term = max((m.term for m in ms if m.role == "LEADER"), default=0)
    now = dt.datetime.now(dt.UTC)
    stamp = SnapshotStamp(
        snapshot_id=snapshot_id or now.strftime("%Y%m%dT%H%M%S%fZ"),
        taken_at=now,
        master_term=leader_term,
        committed_index=dump.committed_index,
    )
    tables, tablets, replicas = catalog_rows(dump.tables, dump.tablets)
    inv = Inventory(stamp, tables, tablets, replicas)
    inv.masters = [
        MasterRow(m.uuid, m.address, m.role, m.term, m.committed_index, m.error) for m in ms
    ]
    targets = [(s.uuid, s.address, credentials_dir) for s in servers if s.address]
    listed: dict[str, tuple[str, list[HostedRow]]] = {}
    if targets:
        rdd = spark.sparkContext.parallelize(targets, len(targets))
        for uuid, error, rows in rdd.mapPartitions(_list_partition).collect():
            listed[uuid] = (error, rows)
    for s in servers:
        error, rows = listed.get(s.uuid, ("no rpc address registered", []))
        inv.hosted.extend(rows)
        inv.tservers.append(
            TServerRow(
                ts_uuid=s.uuid,
                address=s.address,
                live=s.live,
                millis_since_heartbeat=s.millis_since_heartbeat,
                num_replicas=s.num_replicas,
                num_leaders=s.num_leaders,
                reachable=not error,
                error=error,
            )
        )
    log.info("inventory: %s", inv.summary())
    return inv
