"""Requests that are valid as a whole, for the RPCs whose fields must agree with each other.

Theory of operation
-------------------
`Generator.valid` (fuzz_gen.py) gives every field on its own a plausible value. For most RPCs
that is enough to reach the handler's real work; for some the fields must also agree: a
Write's Arrow rows must have the schema of the table its tablet belongs to, a CreateTable's
partitioning must name its own key columns, a heartbeat's tablet report must describe a
consensus state. `fill_template` completes such requests after `valid` has filled them in;
the generator then merges hostile values over half of them (fuzz_gen module docstring).

Some templates depend on who sends the request: a Write sometimes carries misrouted rows
(keys of other tablets of the table, the user's more often), and the member tablet server's
heartbeats are its own process's (live instance seqno, no registration) with claims about
the fixture tablets in the shapes an attacker holding its certificate would try (`CLAIMS`,
`_claim`): the master must adopt none of them.

Everything here is drawn through Hypothesis from the vocabulary, as the rest of the generator.
"""

from __future__ import annotations

from typing import Any, Protocol

from google.protobuf.message import Message
from hypothesis import strategies as st

from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import column_type_to_pb, partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.fuzz_values import (
    DEST,
    LIVE_INCARNATION,
    LIVE_INDEX,
    LIVE_SEQNO,
    LIVE_TERM,
    Vocabulary,
)

__all__ = ["CLAIMS", "UNKNOWN_SERVERS", "TemplateGenerator", "fill_template"]


class TemplateGenerator(Protocol):
    """What a template uses of the generator (fuzz_gen.Generator): its vocabulary and its
    Write rows. Named here so that this module does not import the generator that calls it."""

    @property
    def vocab(self) -> Vocabulary: ...

    def rows(self, schema: int | None = None) -> st.SearchStrategy[bytes]: ...

    def misrouted_rows(self, tablet: int) -> st.SearchStrategy[bytes]: ...


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
    gen: TemplateGenerator,
    draw: st.DrawFn,
    rpc_name: str,
    msg: Message,
    hints: dict[str, str],
    identity: str = "admin",
) -> None:
    """Make `msg`, already filled by `Generator.valid`, a valid request of the RPC `rpc_name`
    (MasterService/CreateTable) as a whole
    where fields must agree (module docstring), as `identity` would send it."""
    fill = _TEMPLATES.get(rpc_name)
    if fill is not None:
        fill(gen, draw, msg, hints, identity)


def _tablet(gen: TemplateGenerator, draw: st.DrawFn) -> int:
    return int(draw(st.integers(0, len(gen.vocab.tablet_ids) - 1)))


def _write(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    """Rows of the tablet's schema (fuzz_gen.Generator.rows), or misrouted rows: valid rows
    whose keys other tablets of the table hold, the user's more often (to fixture A, which
    its grant covers) than the others'."""
    v = gen.vocab
    misroutable = [
        i
        for i in range(len(v.tablet_ids))
        if v.partition(i) is not None and (identity != "user" or v.tablet_schemas[i] == 0)
    ]
    if misroutable and draw(st.integers(0, 9)) < (7 if identity == "user" else 2):
        i = draw(st.sampled_from(misroutable))
        rows = draw(gen.misrouted_rows(i))
    else:
        i = _tablet(gen, draw)
        rows = draw(gen.rows(v.tablet_schemas[i]))
    m.tablet_id = v.tablet_ids[i]
    m.rows = rows
    m.default_op = draw(st.sampled_from((1, 2, 2, 3, 4, 5)))
    del m.ops[:]
    m.schema_version = 0
    m.authz_token = gen.vocab.authz_tokens[0]


def _scan(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
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


def _create_table(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    schema, ps = _schema(draw)
    m.name = "fuzz_new_" + draw(
        st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
    )
    m.schema.CopyFrom(schema_to_pb(schema))
    m.partition_schema.CopyFrom(partition_schema_to_pb(ps, schema))
    m.num_replicas = draw(st.sampled_from((0, 1, 3)))


def _create_tablet(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
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


def _alter_table(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
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


def _heartbeat(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    if identity == "member":
        _member_heartbeat(gen, draw, m, hints["caller"])
        return
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


CLAIMS = ("usurp", "alone", "grow", "next-term", "one-step", "their-leader", "random")
"""The shapes of the claims a member's heartbeat makes about a tablet (`_claim`)."""
UNKNOWN_SERVERS = ("ts-fuzz", "ts-unknown-0001")
"""Voters no fixture has: the fuzzer's own tablet server, and one nobody registered."""
_HUGE = (1000, 2**31, 2**40, 2**63 - 1, 2**64 - 1)


def _member_heartbeat(gen: TemplateGenerator, draw: st.DrawFn, m: Any, me: str) -> None:
    """A heartbeat of the member tablet server `me`, as its own process would send it (its
    live instance seqno nine times in ten, no registration), whose report claims things
    about one to three tablets, mostly fixtures (`_claim`)."""
    m.instance.permanent_uuid = me
    m.instance.instance_seqno = (
        LIVE_SEQNO if draw(st.integers(0, 9)) else draw(st.integers(1, 2**62))
    )
    m.ClearField("registration")
    report = m.tablet_report
    report.Clear()
    report.is_incremental = draw(st.integers(0, 4)) > 0
    report.sequence_number = draw(st.integers(1, 2**31))
    for _ in range(draw(st.integers(1, 3))):
        t = report.updated_tablets.add()
        t.tablet_id = gen.vocab.tablet_ids[_tablet(gen, draw)]
        _claim(gen, draw, t, me, draw(st.sampled_from(CLAIMS)))


def _claim(gen: TemplateGenerator, draw: st.DrawFn, t: Any, me: str, shape: str) -> None:
    """Fill the ReportedTabletPB `t` with a claim of `shape` (`CLAIMS`), the dangerous ones
    of docs/design/catalog.md#R15: each, adopted, would move the tablet's membership or
    leader on one server's word (terms and op indexes relative to the tablet's live ones
    are placeholders, fuzz_values.LIVE_TERM and LIVE_INDEX):

    * usurp: itself LEADER of the same voters, in a huge term, at the same or a huge index;
    * alone: itself the sole voter, in the next or a huge term, at the next or a huge index;
    * grow: unknown servers added to the voters;
    * next-term: itself LEADER of the same voters in the next term (an election nobody held);
    * one-step: another voter removed or demoted, at the next index (one Raft step);
    * their-leader: a follower's word that another voter leads in a later term (evidence
      for someone else's claim);
    * random: any role, state, voters, term and index.
    """
    v = gen.vocab
    voters = list(v.tserver_uuids)
    learners: list[str] = []
    huge = st.sampled_from(_HUGE)
    same_term, same_index = st.just(LIVE_TERM), st.just(LIVE_INDEX)
    next_term = st.integers(1, 3).map(lambda k: LIVE_TERM + k)
    next_index = st.integers(1, 2).map(lambda k: LIVE_INDEX + k)
    t.state = mpb.REPLICA_RUNNING
    t.role = mpb.LEADER
    leader = me
    if shape == "usurp":
        term, index = draw(huge), draw(st.one_of(same_index, huge))
    elif shape == "alone":
        voters = [me]
        term, index = draw(st.one_of(next_term, huge)), draw(st.one_of(next_index, huge))
    elif shape == "grow":
        extra = st.sampled_from((*UNKNOWN_SERVERS, *v.master_uuids))
        voters += draw(st.lists(extra, min_size=1, max_size=2, unique=True))
        term = draw(st.one_of(same_term, next_term, huge))
        index = draw(st.one_of(next_index, huge))
    elif shape == "next-term":
        term, index = draw(next_term), LIVE_INDEX
    elif shape == "one-step":
        other = draw(st.sampled_from([u for u in voters if u != me] or [me]))
        voters.remove(other)
        if draw(st.booleans()):
            learners.append(other)
        term, index = draw(st.one_of(same_term, next_term)), draw(next_index)
    elif shape == "their-leader":
        t.role = mpb.FOLLOWER
        leader = draw(st.sampled_from(voters))
        term, index = draw(st.one_of(next_term, huge)), draw(st.one_of(same_index, next_index))
    else:
        t.state = draw(st.sampled_from((mpb.REPLICA_RUNNING, mpb.REPLICA_BOOTSTRAPPING)))
        t.role = draw(st.sampled_from((mpb.LEADER, mpb.FOLLOWER, mpb.LEARNER)))
        pool = (me, *v.tserver_uuids, *UNKNOWN_SERVERS)
        voters = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        leader = draw(st.sampled_from((me, "", *voters)))
        term = draw(st.one_of(same_term, next_term, huge, st.integers(0, 10)))
        index = draw(st.one_of(same_index, next_index, huge, st.integers(0, 50)))
    cs = t.consensus_state
    cs.current_term = term
    cs.leader_uuid = leader
    cs.committed_config.opid_index = index
    for uuid in voters:
        cs.committed_config.peers.add(permanent_uuid=uuid, member_type=mpb.VOTER)
    for uuid in learners:
        cs.committed_config.peers.add(permanent_uuid=uuid, member_type=mpb.NON_VOTER)


def _step(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    """A member's Raft message as its process would frame it (the envelope the receiver checks
    first: its own uuid, the member's uuid and real incarnation), about fixture tablets, with
    the messages `valid` made, their terms often the group's next or a huge one: a member
    speaking out of turn in its own groups. Other identities' are left as `valid` made them."""
    if identity != "member":
        return
    m.dest_uuid = DEST
    m.src_uuid = hints["caller"]
    m.src_instance = LIVE_INCARNATION if draw(st.integers(0, 9)) else m.src_instance
    if draw(st.integers(0, 3)):
        m.dest_instance = ""
    for batch in m.groups:
        batch.group_id = gen.vocab.tablet_ids[_tablet(gen, draw)]
        for msg in batch.messages:
            msg.to = DEST
            setattr(msg, "from", hints["caller"])
            if not msg.type:
                msg.type = draw(st.integers(1, 10))
            k = draw(st.integers(0, 4))
            if k < 3:
                msg.term = LIVE_TERM + k
            elif k == 3:
                msg.term = draw(st.sampled_from(_HUGE))


def _grant(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    m.user = draw(st.sampled_from((*gen.vocab.principals, "someone")))
    del m.privileges[:]
    m.privileges.extend(
        draw(st.lists(st.sampled_from((1, 2, 3)), min_size=1, max_size=3, unique=True))
    )


def _start_copy(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    j = draw(st.integers(0, len(gen.vocab.tserver_uuids) - 1))
    if identity == "member" and draw(st.booleans()):  # a copy from itself, as its policy allows
        j = 0
    m.copy_peer_uuid = gen.vocab.tserver_uuids[j]
    host, port = gen.vocab.tserver_address(j)
    m.copy_peer_addr.host, m.copy_peer_addr.port = host, port
    m.retained_from_index = draw(st.sampled_from((0, 1, 2**63)))


def _change_config(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    m.type = draw(st.sampled_from((1, 2, 3)))
    j = draw(st.integers(0, len(gen.vocab.tserver_uuids) - 1))
    m.peer.permanent_uuid = draw(st.sampled_from((gen.vocab.tserver_uuids[j], hints["caller"])))
    host, port = gen.vocab.tserver_address(j)
    m.peer.last_known_addr.host, m.peer.last_known_addr.port = host, port
    m.fence.master_uuid = hints["caller"]


def _certificate(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    m.role = draw(st.sampled_from(("user", "admin", "join", "tserver")))
    m.name = draw(st.sampled_from((*gen.vocab.principals, *gen.vocab.tserver_uuids, "someone")))
    m.csr_der = gen.vocab.csrs[0]
    m.validity_s = draw(st.sampled_from((0, 60, 86_400, 2**32 - 1)))


def _split(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
    m.target_chunk_rows = draw(st.integers(1, 1000))
    m.target_chunk_bytes = draw(st.sampled_from((0, 0, 1, 1 << 20)))
    m.authz_token = gen.vocab.authz_tokens[0]


def _delete_tablet(
    gen: TemplateGenerator, draw: st.DrawFn, m: Any, hints: dict[str, str], identity: str
) -> None:
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
    "ConsensusService/Step": _step,
    "ConsensusService/StepStream": _step,
}
