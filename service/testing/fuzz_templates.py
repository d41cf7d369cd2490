"""Requests that are valid as a whole, for the RPCs whose fields must agree with each other.

Theory of operation
-------------------
`Generator.valid` (fuzz_gen.py) gives every field on its own a plausible value. For most RPCs
that is enough to reach the handler's real work; for some the fields must also agree: a
Write's Arrow rows must have the schema of the table its tablet belongs to, a CreateTable's
partitioning must name its own key columns, a heartbeat's tablet report must describe a
consensus state. `fill_template` completes such requests after `valid` has filled them in;
the generator then merges hostile values over half of them (fuzz_gen module docstring).

Everything here is drawn through Hypothesis from the vocabulary, as the rest of the generator.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message
from hypothesis import strategies as st

from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import column_type_to_pb, partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.fuzz_gen import Generator, Rpc

__all__ = ["fill_template"]

_TYPES = (
    ColumnType.BOOL,
    ColumnType.INT8,
    ColumnType.INT32,
    ColumnType.INT64,
    ColumnType.DOUBLE,
    ColumnType.STRING,
    ColumnType.BINARY,
    ColumnType.TIMESTAMP,
    ColumnType.DATE,
)
_KEY_TYPES = (ColumnType.INT32, ColumnType.INT64, ColumnType.STRING, ColumnType.BINARY)


def fill_template(
    gen: Generator, draw: st.DrawFn, rpc: Rpc, msg: Message, hints: dict[str, str]
) -> None:
    """Make `msg`, already filled by `Generator.valid`, a valid request of `rpc` as a whole
    where fields must agree (module docstring)."""
    fill = _TEMPLATES.get(rpc.name)
    if fill is not None:
        fill(gen, draw, msg, hints)


def _tablet(gen: Generator, draw: st.DrawFn) -> int:
    return int(draw(st.integers(0, len(gen.vocab.tablet_ids) - 1)))


def _write(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    i = _tablet(gen, draw)
    m.tablet_id = gen.vocab.tablet_ids[i]
    m.rows = draw(gen.rows(gen.vocab.tablet_schemas[i]))
    m.default_op = draw(st.sampled_from((1, 2, 2, 3, 4, 5)))
    del m.ops[:]
    m.schema_version = 0
    m.authz_token = gen.vocab.authz_tokens[0]


def _scan(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    i = _tablet(gen, draw)
    ns = m.new_scan
    ns.tablet_id = gen.vocab.tablet_ids[i]
    names = gen.vocab.row_schemas[gen.vocab.tablet_schemas[i]].names
    del ns.projected_columns[:]
    ns.projected_columns.extend(draw(st.lists(st.sampled_from(names), max_size=3, unique=True)))
    if draw(st.booleans()):
        del ns.predicates[:]
    ns.read_mode = draw(st.sampled_from((0, 1)))
    ns.limit = draw(st.sampled_from((0, 1, 10)))
    m.batch_size_bytes = draw(st.sampled_from((0, 64, 4096)))
    m.authz_token = gen.vocab.authz_tokens[0]


def _schema(draw: st.DrawFn) -> tuple[Schema, PartitionSchema]:
    key_type = draw(st.sampled_from(_KEY_TYPES))
    cols: list[tuple[str, ColumnType]] = [("k", key_type)]
    for i in range(draw(st.integers(0, 4))):
        cols.append((f"c{i}", draw(st.sampled_from(_TYPES))))
    schema = Schema.build(cols, key="k")
    hashed = draw(st.integers(0, 3))
    ps = PartitionSchema(
        hash=(HashBucketSchema(("k",), hashed),) if hashed >= 2 else (),
        range=RangeSchema(("k",)),
    )
    return schema, ps


def _create_table(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    schema, ps = _schema(draw)
    m.name = "fuzz_new_" + draw(
        st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
    )
    m.schema.CopyFrom(schema_to_pb(schema))
    m.partition_schema.CopyFrom(partition_schema_to_pb(ps, schema))
    m.num_replicas = draw(st.sampled_from((0, 1, 3)))


def _create_tablet(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    schema, ps = _schema(draw)
    m.tablet_id = f"{draw(st.integers(0, 2**128 - 1)):032x}"
    m.schema.CopyFrom(schema_to_pb(schema))
    m.partition_schema.CopyFrom(partition_schema_to_pb(ps, schema))
    m.partition.Clear()
    m.config.Clear()
    for j, uuid in enumerate(gen.vocab.tserver_uuids):
        host, port = gen.vocab.tserver_address(j)
        m.config.peers.add(permanent_uuid=uuid, member_type=mpb.VOTER).last_known_addr.CopyFrom(
            mpb.HostPortPB(host=host, port=port)
        )
    m.fence.master_uuid = hints["caller"]


def _alter_table(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    del m.steps[:]
    for i in range(draw(st.integers(1, 3))):
        step = m.steps.add()
        what = draw(st.integers(0, 2))
        if what == 0:
            col = step.add_column.column
            col.name = f"x{draw(st.integers(0, 99))}_{i}"
            col.type = column_type_to_pb(draw(st.sampled_from(_TYPES)))
            col.nullable = True
        elif what == 1:
            step.drop_column.name = draw(st.sampled_from(gen.vocab.column_names))
        else:
            step.rename_column.old_name = draw(st.sampled_from(gen.vocab.column_names))
            step.rename_column.new_name = f"r{draw(st.integers(0, 99))}"
    if draw(st.integers(0, 4)):
        m.ClearField("new_table_name")
    if draw(st.booleans()):
        m.ClearField("expected_schema_version")


def _heartbeat(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    m.instance.permanent_uuid = hints["caller"]
    m.instance.instance_seqno = draw(st.integers(1, 10))
    host, port = draw(st.sampled_from(gen.vocab.hostports))
    del m.registration.rpc_addresses[:]
    m.registration.rpc_addresses.add(host=host, port=port)
    report = m.tablet_report
    report.Clear()
    report.is_incremental = draw(st.booleans())
    report.sequence_number = draw(st.integers(1, 100))
    for _ in range(draw(st.integers(0, 2))):
        t = report.updated_tablets.add()
        t.tablet_id = gen.vocab.tablet_ids[_tablet(gen, draw)]
        t.state = draw(st.sampled_from((mpb.REPLICA_RUNNING, mpb.REPLICA_FAILED)))
        t.role = draw(st.sampled_from((mpb.LEADER, mpb.FOLLOWER)))
        cs = t.consensus_state
        cs.current_term = draw(st.sampled_from(gen.vocab.terms)) + draw(st.integers(0, 5))
        cs.leader_uuid = hints["caller"]
        cs.committed_config.opid_index = draw(st.integers(0, 50))
        for uuid in draw(
            st.lists(
                st.sampled_from((hints["caller"], *gen.vocab.tserver_uuids)),
                min_size=1,
                max_size=3,
                unique=True,
            )
        ):
            cs.committed_config.peers.add(permanent_uuid=uuid, member_type=mpb.VOTER)


def _grant(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    m.user = draw(st.sampled_from((*gen.vocab.principals, "someone")))
    del m.privileges[:]
    m.privileges.extend(
        draw(st.lists(st.sampled_from((1, 2, 3)), min_size=1, max_size=3, unique=True))
    )


def _start_copy(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    j = draw(st.integers(0, len(gen.vocab.tserver_uuids) - 1))
    m.copy_peer_uuid = gen.vocab.tserver_uuids[j]
    host, port = gen.vocab.tserver_address(j)
    m.copy_peer_addr.host, m.copy_peer_addr.port = host, port
    m.retained_from_index = draw(st.sampled_from((0, 1, 2**63)))


def _change_config(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    m.type = draw(st.sampled_from((1, 2, 3)))
    j = draw(st.integers(0, len(gen.vocab.tserver_uuids) - 1))
    m.peer.permanent_uuid = draw(st.sampled_from((gen.vocab.tserver_uuids[j], hints["caller"])))
    host, port = gen.vocab.tserver_address(j)
    m.peer.last_known_addr.host, m.peer.last_known_addr.port = host, port
    m.fence.master_uuid = hints["caller"]


def _certificate(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    m.role = draw(st.sampled_from(("user", "admin", "join", "tserver")))
    m.name = draw(st.sampled_from((*gen.vocab.principals, *gen.vocab.tserver_uuids, "someone")))
    m.csr_der = gen.vocab.csrs[0]
    m.validity_s = draw(st.sampled_from((0, 60, 86_400, 2**32 - 1)))


def _split(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    m.target_chunk_rows = draw(st.integers(1, 1000))
    m.target_chunk_bytes = draw(st.sampled_from((0, 0, 1, 1 << 20)))
    m.authz_token = gen.vocab.authz_tokens[0]


def _delete_tablet(gen: Generator, draw: st.DrawFn, m: Any, hints: dict[str, str]) -> None:
    m.delete_type = draw(st.sampled_from((tpb.TABLET_DATA_DELETED, tpb.TABLET_DATA_TOMBSTONED)))
    m.fence.master_uuid = hints["caller"]


_TEMPLATES = {
    "TabletServerService/Write": _write,
    "TabletServerService/Scan": _scan,
    "TabletServerService/SplitKeyRange": _split,
    "MasterService/CreateTable": _create_table,
    "MasterService/AlterTable": _alter_table,
    "MasterService/TSHeartbeat": _heartbeat,
    "MasterService/TSHeartbeatStream": _heartbeat,
    "MasterService/GrantPrivileges": _grant,
    "MasterService/RevokePrivileges": _grant,
    "MasterService/IssueCertificate": _certificate,
    "TabletServerAdminService/CreateTablet": _create_tablet,
    "TabletServerAdminService/DeleteTablet": _delete_tablet,
    "TabletServerAdminService/StartTabletCopy": _start_copy,
    "TabletServerAdminService/ChangeConfig": _change_config,
}
