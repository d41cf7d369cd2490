"""The fuzzing campaign's generator: every RPC of every service, as Hypothesis strategies.

Theory of operation
-------------------
`RPCS` is read from the protobuf descriptors (`services_by_name` of master, tserver and
consensus), so an RPC added to a .proto is fuzzed without anyone listing it here. A `Case` is
one call: the RPC, who makes it (an identity role), which server it goes to, and its request
messages (one, or one to three for a client stream).

A request starts one of three ways:

* valid-looking (seven cases in ten): every field that names something gets a name the live
  cluster knows (`Vocabulary`: table and tablet ids, server uuids, column names, encoded
  keys, the user's authz token), enums a defined value, the destination uuid the server's own
  and the caller's uuid the caller's; request ids are fresh, and a few RPCs get a request
  that is valid as a whole (fuzz_templates.py: a Write's Arrow rows of its tablet's schema, a
  CreateTable's schema and partitioning). Half of these then take hostile values in a few
  fields (a sparse hostile message merged over them): valid messages with hostile values;
* hostile from scratch (a quarter): each field set or not, a set scalar a hostile value
  (fuzz_values.py: boundaries, unknown enum numbers, empty, huge and odd strings, random
  bytes) or a name from the vocabulary, repeated fields short or, now and then, thousands of
  copies of one element (bounded by `MAX_MESSAGE_BYTES`), nesting up to `MAX_DEPTH`;
* not protobuf at all (one in twenty).

A quarter of the requests are then mutated as bytes (fuzz_values.Mutation).

Who calls (`IDENTITIES`) is drawn per case, weighted by what the RPC is for
(`identity_weights`): mostly the admin, whose requests reach the handlers; the user, more often
for a Write (its grant is on fixture A); and the `member`, the first tablet server's own
certificate, more often for heartbeats and Raft messages, the requests a member sends. Where
a case goes is drawn too (`_targets`): a user's requests to tablet servers mostly to the
tablet's leader, as its client would; the member's Raft messages mostly to its peers, the
other tablet servers. A member's heartbeats carry claims about the fixture tablets
(fuzz_templates.py: itself LEADER in a huge or the next term, its own config shrunk to itself,
grown by unknown servers, or one step off; some random), with its live instance seqno, so
that they reach report processing; its Raft messages carry its real incarnation, so that they
reach the Raft groups. Writes carry, besides rows of the tablet's schema, misrouted rows
(`misrouted_rows`): valid rows whose keys belong to other tablets of the table
(hostile_arrow.outside_partition, with the partitions the master reported,
`Vocabulary.tablet_partitions`).

Determinism. Case K of a campaign calls `rpc_order(seed)[K % len(RPCS)]` (every RPC gets its
turn, however short the run); everything else is drawn by one Hypothesis run of its own,
seeded with (seed, K), generate phase only, no example database (`draw_case`). So a case is a
function of the seed, its number and the vocabulary's shape, never of the cluster's answers or
of timing: `--seed S --case K` regenerates it, and since vocabulary values are picked by index,
in a new cluster the same case names the same fixture. Hypothesis supplies the value
distributions (boundary-biased integers, odd text), not its search: each case is the second
example of its own run (a run's first is always the simplest one).
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers as _providers

from service.pb import consensus_pb2, master_pb2, tserver_pb2
from service.testing.fuzz_templates import fill_template
from service.testing.fuzz_values import (
    DEST,
    FILES,
    HOSTILE_BYTES,
    HOSTILE_STRINGS,
    HOSTS,
    IDENTITIES,
    INT_RANGES,
    LIVE_SCANNER,
    LIVE_SESSION,
    NUM_OPS,
    ODD_TYPES,
    PORTS,
    ROLES,
    Mutation,
    Vocabulary,
    apply_mutations,
    arrow_value,
    keyish,
    kind,
    weighted,
)
from service.testing.hostile_arrow import POISONS, ipc, outside_partition, plain_rows

__all__ = [
    "IDENTITIES",
    "RPCS",
    "Case",
    "Generator",
    "Rpc",
    "Vocabulary",
    "case_seed",
    "draw_case",
    "identity_weights",
    "message_class",
    "rpc_by_name",
    "rpc_order",
]

MAX_DEPTH = 4
"""Nested messages deeper than this are left empty."""
MAX_MESSAGE_BYTES = 4 << 20
"""A repeated field stops growing past this size: big enough to test the servers' limits on
counts, small enough not to test the fuzzer's memory."""
LARGE_COUNTS = (8, 64, 300, 2_000)
"""Counts of the "deep repetition" of one element."""
_SPREAD = (*range(-130, 130, 7), 2**62, -(2**62))
"""Seeds of rows whose keys fall in every tablet of a fixture (misrouted rows' fallback)."""

_IDENTITY_WEIGHTS = ("admin", "admin", "admin", "user", "tserver", "master", "member")
_MORE: dict[str, tuple[str, ...]] = {
    "TabletServerService/Write": ("user", "user", "user"),
    "MasterService/TSHeartbeat": ("member", "member", "member"),
    "MasterService/TSHeartbeatStream": ("member", "member", "member"),
    "ConsensusService/Step": ("member", "member"),
    "ConsensusService/StepStream": ("member", "member"),
}
"""Extra weight for the identity whose requests an RPC is for (the module docstring)."""

_SERVICES = (
    (master_pb2, "MasterService", "master"),
    (tserver_pb2, "TabletServerAdminService", "tserver"),
    (tserver_pb2, "TabletServerService", "tserver"),
    (tserver_pb2, "TabletCopyService", "tserver"),
    (consensus_pb2, "ConsensusService", "any"),
)


@dataclass(frozen=True)
class Rpc:
    """One method of one service, from its descriptor."""

    service: str
    """The service's full name (tessera.master.MasterService)."""
    method: str
    input: Descriptor = field(compare=False, repr=False)
    client_streaming: bool = False
    server_streaming: bool = False
    served_by: str = "master"
    """"master", "tserver", or "any" (the consensus service runs on every server)."""

    @property
    def name(self) -> str:
        """Short name for reports and --rpc: MasterService/CreateTable."""
        return f"{self.service.rsplit('.', 1)[-1]}/{self.method}"

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"


def _all_rpcs() -> tuple[Rpc, ...]:
    out = []
    for module, service, served_by in _SERVICES:
        for m in module.DESCRIPTOR.services_by_name[service].methods:
            out.append(
                Rpc(
                    m.containing_service.full_name,
                    m.name,
                    m.input_type,
                    bool(m.client_streaming),
                    bool(m.server_streaming),
                    served_by,
                )
            )
    return tuple(out)


RPCS = _all_rpcs()
"""Every RPC of every service (module docstring)."""


def rpc_by_name(name: str) -> Rpc:
    """The RPC called `name` (MasterService/CreateTable, or the full path)."""
    for r in RPCS:
        if name in (r.name, r.path, r.path.lstrip("/")):
            return r
    raise KeyError(f"no RPC {name!r}; known: {', '.join(r.name for r in RPCS)}")


def identity_weights(rpc: Rpc) -> tuple[str, ...]:
    """The identities a case of `rpc` is drawn from, repeated by weight (module docstring)."""
    return _IDENTITY_WEIGHTS + _MORE.get(rpc.name, ())


def message_class(desc: Any) -> type[Message]:
    """The generated class of a message descriptor."""
    return message_factory.GetMessageClass(desc)


@dataclass(frozen=True)
class Case:
    """One call (module docstring). `messages` are what the generator built; `encoded()` is
    what goes on the wire (mutations applied, or `raw` as it is)."""

    rpc: Rpc
    identity: str
    target: str
    """"leader" (the master leader), "master:I" or "tserver:I" (by index), or "tablet-leader"
    (the tablet server leading the tablet the request names, found when it is sent)."""
    messages: tuple[Message, ...] = ()
    mutations: tuple[tuple[Mutation, ...], ...] = ()
    raw: tuple[bytes, ...] | None = None

    def encoded(self) -> tuple[bytes, ...]:
        if self.raw is not None:
            return self.raw
        return tuple(
            apply_mutations(m.SerializeToString(deterministic=True), muts)
            for m, muts in zip(self.messages, self.mutations, strict=True)
        )

    @property
    def mutated(self) -> bool:
        return self.raw is not None or any(self.mutations)


class Generator:
    """The strategies over one vocabulary (module docstring)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._scalars: dict[tuple[str, str], st.SearchStrategy[Any]] = {}
        self._count = st.one_of(st.integers(0, 3), st.sampled_from(LARGE_COUNTS))
        self._mutation = st.builds(
            Mutation,
            st.integers(0, NUM_OPS - 1),
            st.integers(0, 1 << 20),
            st.integers(0, 1 << 16),
            st.binary(max_size=8),
        )
        self.mutations = st.lists(self._mutation, min_size=1, max_size=4).map(tuple)

    # --- cases -------------------------------------------------------------------------------

    def case(self, rpc: Rpc) -> st.SearchStrategy[Case]:
        """A call of `rpc`: who, to where, and its request(s) (module docstring)."""
        return st.composite(self._case)(rpc)

    def _case(self, draw: st.DrawFn, rpc: Rpc) -> Case:
        identity = draw(st.sampled_from(identity_weights(rpc)))
        target = draw(st.sampled_from(self._targets(rpc, identity)))
        n = draw(st.integers(1, 3)) if rpc.client_streaming else 1
        mode = draw(st.integers(0, 19))
        if mode == 19:  # not protobuf at all
            raw = tuple(
                draw(st.one_of(st.sampled_from(HOSTILE_BYTES), st.binary())) for _ in range(n)
            )
            return Case(rpc, identity, target, raw=raw)
        hints = {"dest": DEST, "caller": self.vocab.principal(identity)}
        cls = message_class(rpc.input)
        messages = []
        for _ in range(n):
            msg = cls()
            if mode < 14:  # valid-looking, perhaps with hostile values
                self.valid(draw, msg, 0, hints)
                fill_template(self, draw, rpc.name, msg, hints, identity)
                if draw(st.booleans()):
                    hostile = cls()
                    self.hostile(draw, hostile, 0, hints, sparse=True)
                    msg.MergeFrom(hostile)
            else:
                self.hostile(draw, msg, 0, hints)
            messages.append(msg)
        mutate = draw(st.integers(0, 3)) == 0
        mutations = tuple(draw(self.mutations) if mutate else () for _ in messages)
        return Case(rpc, identity, target, tuple(messages), mutations)

    def _targets(self, rpc: Rpc, identity: str) -> tuple[str, ...]:
        masters = tuple(f"master:{i}" for i in range(len(self.vocab.master_uuids)))
        tservers = tuple(f"tserver:{i}" for i in range(len(self.vocab.tserver_uuids)))
        if rpc.served_by == "master":
            return ("leader",) * 6 + masters
        if rpc.served_by == "tserver":
            if identity == "user":  # a user's client goes to the tablet's leader
                return ("tablet-leader",) * 9 + tservers
            return ("tablet-leader",) * 3 + tservers
        if identity == "member":  # its Raft messages go to its peers: the other tablet servers
            return (*tservers[1:], *tservers[1:], "leader", *masters, *tservers)
        return ("leader", *masters, *tservers)

    # --- valid-looking messages --------------------------------------------------------------

    def valid(self, draw: st.DrawFn, msg: Message, depth: int, hints: dict[str, str]) -> None:
        """Fill `msg` with values a server could accept (module docstring); nested messages
        down to depth 2."""
        for f in _fields(msg):
            k = kind(f)
            if draw(st.integers(0, 9)) >= (9 if k or f.name == "request_id" else 6):
                continue
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                if f.message_type.GetOptions().map_entry or depth >= 2:
                    continue
                if f.name == "request_id":
                    self.request_id(draw, getattr(msg, f.name))
                elif f.is_repeated:
                    for _ in range(draw(st.integers(1, 2))):
                        self.valid(draw, getattr(msg, f.name).add(), depth + 1, hints)
                else:
                    sub = getattr(msg, f.name)
                    sub.SetInParent()
                    self.valid(draw, sub, depth + 1, hints)
            elif f.is_repeated:
                values = [
                    self._valid_value(draw, f, k, hints) for _ in range(draw(st.integers(1, 2)))
                ]
                getattr(msg, f.name).extend(values)
            else:
                setattr(msg, f.name, self._valid_value(draw, f, k, hints))

    def _valid_value(self, draw: st.DrawFn, f: Any, k: str, hints: dict[str, str]) -> Any:
        if k in hints:
            return hints[k]
        t = f.type
        if t == FieldDescriptor.TYPE_ENUM:
            return draw(st.sampled_from(tuple(e.number for e in f.enum_type.values)))
        if t == FieldDescriptor.TYPE_BOOL:
            return draw(st.booleans())
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return draw(st.floats(0, 1e6))
        if t in INT_RANGES:
            if k in ("term", "index"):
                return draw(st.sampled_from(self.vocab.terms))
            if k == "port":
                return draw(st.sampled_from(self.vocab.hostports))[1]
            lo, hi, _ = INT_RANGES[t]
            return draw(st.integers(max(lo, 0), min(hi, 1000)))
        if t == FieldDescriptor.TYPE_STRING:
            return draw(self._string_pool(k))
        return draw(self._bytes_pool(k))

    def request_id(self, draw: st.DrawFn, rid: Any) -> None:
        """A fresh request id: a DDL's (refused without one, before anything else) or a plain
        write's (16 bytes of client id; mostly a well-formed one, sometimes a numbering the
        server must refuse)."""
        if rid.DESCRIPTOR.name == "WriteRequestIdPB":
            rid.client_id = draw(st.binary(min_size=16, max_size=16))
            rid.seq_no = draw(st.integers(0, 2**40))
            rid.first_incomplete_seq_no = draw(st.integers(0, rid.seq_no + 1))
            return
        rid.client_id = "fuzz-" + draw(st.sampled_from(self.vocab.principals))
        rid.seq_no = draw(st.integers(1, 2**40))
        rid.attempt_no = draw(st.integers(0, 3))

    # --- hostile messages --------------------------------------------------------------------

    def hostile(
        self,
        draw: st.DrawFn,
        msg: Message,
        depth: int,
        hints: dict[str, str],
        *,
        sparse: bool = False,
    ) -> Message:
        """Fill `msg` field by field with hostile or vocabulary values (module docstring);
        `sparse` sets about one field in ten (to merge over a valid message)."""
        for f in _fields(msg):
            if draw(st.integers(0, 9)) >= (1 if sparse else self._presence(f)):
                continue
            if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
                self._map(draw, msg, f, hints)
            elif f.is_repeated:
                self._repeated(draw, msg, f, depth, hints)
            elif f.type == FieldDescriptor.TYPE_MESSAGE:
                sub = getattr(msg, f.name)
                sub.SetInParent()
                if depth < MAX_DEPTH:
                    self.hostile(draw, sub, depth + 1, hints, sparse=sparse)
            else:
                setattr(msg, f.name, self._value(draw, f, hints))
        return msg

    @staticmethod
    def _presence(f: Any) -> int:
        """How often (in ten) a field is set: the fields that name things (and the messages
        holding them) nearly always, so that most requests get past the first lookup; the
        rest half the time."""
        if kind(f) or f.name == "request_id":
            return 9
        if f.type == FieldDescriptor.TYPE_MESSAGE or f.is_repeated:
            return 7
        return 5

    def _repeated(
        self, draw: st.DrawFn, msg: Message, f: Any, depth: int, hints: dict[str, str]
    ) -> None:
        n = draw(self._count)
        target = getattr(msg, f.name)
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= MAX_DEPTH:
                return
            if n > 3:  # deep repetition: one element, many copies, within the size bound
                one = self.hostile(draw, message_class(f.message_type)(), depth + 1, hints)
                n = min(n, max(1, MAX_MESSAGE_BYTES // max(1, one.ByteSize())))
                for _ in range(n):
                    target.add().CopyFrom(one)
                return
            for _ in range(n):
                self.hostile(draw, target.add(), depth + 1, hints)
            return
        if n > 3:
            one = self._value(draw, f, hints)
            size = len(one) if isinstance(one, str | bytes) else 8
            target.extend([one] * min(n, max(1, MAX_MESSAGE_BYTES // max(1, size))))
            return
        target.extend(self._value(draw, f, hints) for _ in range(n))

    def _map(self, draw: st.DrawFn, msg: Message, f: Any, hints: dict[str, str]) -> None:
        key_f = f.message_type.fields_by_name["key"]
        value_f = f.message_type.fields_by_name["value"]
        target = getattr(msg, f.name)
        for _ in range(draw(st.integers(0, 3))):
            key = self._value(draw, key_f, hints)
            if value_f.type == FieldDescriptor.TYPE_MESSAGE:
                self.hostile(draw, target[key], MAX_DEPTH, hints)
            elif value_f.type == FieldDescriptor.TYPE_STRING:
                host, port = draw(st.sampled_from(self.vocab.hostports))
                target[key] = draw(st.sampled_from((f"{host}:{port}", *HOSTILE_STRINGS[:12])))
            else:
                target[key] = self._value(draw, value_f, hints)

    def _value(self, draw: st.DrawFn, f: Any, hints: dict[str, str]) -> Any:
        """A hint (the coherent value) three times in four when there is one; else a value
        from the vocabulary seven times in ten, a hostile constant or a random value."""
        k = kind(f)
        if k in hints and draw(st.integers(0, 3)) < 3:
            return hints[k]
        return draw(self._scalar(f, k))

    def _scalar(self, f: Any, k: str) -> st.SearchStrategy[Any]:
        key = (f.full_name, k)
        got = self._scalars.get(key)
        if got is None:
            got = self._scalars[key] = self._make_scalar(f, k)
        return got

    def _make_scalar(self, f: Any, k: str) -> st.SearchStrategy[Any]:
        v = self.vocab
        t = f.type
        if t == FieldDescriptor.TYPE_BOOL:
            return st.booleans()
        if t == FieldDescriptor.TYPE_ENUM:
            known = tuple(e.number for e in f.enum_type.values)
            return st.one_of(st.sampled_from(known), st.sampled_from((-1, 99, 2**31 - 1, -(2**31))))
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return st.floats(width=64 if t == FieldDescriptor.TYPE_DOUBLE else 32)
        if t in INT_RANGES:
            lo, hi, edges = INT_RANGES[t]
            if k in ("term", "index"):
                pool = tuple(x for x in v.terms if lo <= x <= hi) or edges
                return weighted(st.sampled_from(pool), st.sampled_from(edges), st.integers(lo, hi))
            if k == "port":
                ports = tuple(p for _, p in v.hostports)
                odd = tuple(p for p in PORTS if lo <= p <= hi)
                return weighted(st.sampled_from(ports), st.sampled_from(odd), st.integers(lo, hi))
            return st.one_of(st.sampled_from(edges), st.integers(lo, hi))
        if t == FieldDescriptor.TYPE_STRING:
            hostile = st.sampled_from(HOSTILE_STRINGS)
            if k:
                return weighted(self._string_pool(k), hostile, st.text())
            return st.one_of(self._string_pool(k), hostile, st.text())
        if k:
            return weighted(self._bytes_pool(k), st.sampled_from(HOSTILE_BYTES), st.binary())
        return st.one_of(self._bytes_pool(k), st.sampled_from(HOSTILE_BYTES), st.binary())

    def _string_pool(self, k: str) -> st.SearchStrategy[str]:
        v = self.vocab
        uuids = (*v.tserver_uuids, *v.master_uuids, *v.principals)
        pools: dict[str, tuple[str, ...]] = {
            "table_name": v.table_names,
            "table_id": v.table_ids,
            "tablet_id": v.tablet_ids,
            "column": v.column_names,
            "principal": v.principals,
            "dest": uuids,
            "caller": uuids,
            "uuid": uuids,
            "host": (*(h for h, _ in v.hostports), *HOSTS),
            "role": ROLES,
            "file": FILES,
            "session": (LIVE_SESSION,),
        }
        names = pools.get(k) or (*v.table_names, *v.column_names, *uuids)
        return st.sampled_from(names)

    def _bytes_pool(self, k: str) -> st.SearchStrategy[bytes]:
        v = self.vocab
        if k == "rows":
            return self.rows()
        if k == "token":
            return st.sampled_from(v.authz_tokens)
        if k == "key":
            return st.one_of(st.sampled_from(v.keys), st.sampled_from(v.keys).map(keyish))
        if k == "csr":
            return st.sampled_from(v.csrs)
        if k == "scanner":
            return st.just(LIVE_SCANNER)
        return st.sampled_from(v.keys)

    # --- Arrow payloads ----------------------------------------------------------------------

    def rows(self, schema: int | None = None) -> st.SearchStrategy[bytes]:
        """A Write's rows: for the table `schema` indexes, or any (module docstring)."""
        built = st.composite(self._built_rows)(schema)
        poison = st.sampled_from(sorted(POISONS)).flatmap(lambda n: self._poison(n, schema))
        plain = st.one_of(built, built, poison)
        return st.one_of(
            plain,
            plain,
            st.tuples(plain, self.mutations).map(lambda p: apply_mutations(p[0], p[1])),
        )

    def misrouted_rows(self, tablet: int) -> st.SearchStrategy[bytes]:
        """Valid rows of the table of `tablet_ids[tablet]` whose keys lie outside that
        tablet's partition (module docstring), now and then with a few rows that lie inside
        (so the batch is split row by row); keys are often those of the fixture's own rows,
        which the other tablets hold. Empty bytes if the partition is not known."""
        return st.composite(self._misrouted)(tablet)

    def _misrouted(self, draw: st.DrawFn, tablet: int) -> bytes:
        v = self.vocab
        partition = v.partition(tablet)
        if partition is None:
            return b""
        s = v.tablet_schemas[tablet]
        schema, ps, arrow = v.table_schemas[s], v.partition_schemas[s], v.row_schemas[s]
        seeds = draw(
            st.lists(
                st.one_of(st.integers(-100, 99), st.integers(-(2**63), 2**63 - 1)),
                min_size=8,
                max_size=40,
                unique=True,
            )
        )
        rows = plain_rows(arrow, seeds)
        outside = outside_partition(rows, schema, ps, partition)
        if outside.num_rows == 0:  # the draw happened to hit this tablet only: spread keys
            outside = outside_partition(plain_rows(arrow, _SPREAD), schema, ps, partition)
        inside = draw(st.sampled_from((0, 0, 0, 1, 3)))
        if inside:
            keys = ps.partition_keys_for_arrow(schema, rows)
            mask = pa.array([partition.contains(k) for k in keys], pa.bool_())
            outside = pa.concat_tables([outside, rows.filter(mask).slice(0, inside)])
        return ipc(outside)

    def _poison(self, name: str, schema: int | None) -> st.SearchStrategy[bytes]:
        schemas = self.vocab.row_schemas if schema is None else (self.vocab.row_schemas[schema],)
        return st.sampled_from(schemas).map(lambda s: POISONS[name](s.names[0], s.names[-1]))

    def _built_rows(self, draw: st.DrawFn, schema: int | None) -> bytes:
        if schema is None:
            arrow = draw(st.sampled_from(self.vocab.row_schemas))
        else:
            arrow = self.vocab.row_schemas[schema]
        n = draw(st.sampled_from((0, 1, 2, 5, 50)))
        fields = list(arrow)
        change = draw(st.integers(0, 7))
        if change == 1 and fields:  # a column (maybe the key) left out
            del fields[draw(st.integers(0, len(fields) - 1))]
        elif change == 2 and fields:  # a column of another type
            i = draw(st.integers(0, len(fields) - 1))
            fields[i] = pa.field(fields[i].name, draw(st.sampled_from(ODD_TYPES)))
        elif change == 3:  # a column no table has
            fields.append(pa.field(draw(st.sampled_from(("zz", "", "k\x00"))), pa.int32()))
        columns = []
        for fld in fields:
            values = [draw(arrow_value(fld.type)) for _ in range(min(n, 5))]
            if n > 5:
                values = (values * (n // max(1, len(values)) + 1))[:n]
            columns.append(values)
        try:
            arrays = [pa.array(v, f.type) for v, f in zip(columns, fields, strict=True)]
            return ipc(pa.Table.from_arrays(arrays, names=[f.name for f in fields]))
        except (pa.ArrowException, ValueError, OverflowError):  # still a case: no rows at all
            return b""


def _fields(msg: Message) -> list[Any]:
    return list(msg.DESCRIPTOR.fields)


def _no_local_constants() -> None:
    """Keep Hypothesis from mixing literals of the project's loaded modules into its draws.

    It does so one draw in twenty, from whatever modules are in `sys.modules` at the time:
    the CLI, a pytest run and a long campaign load different ones (and more as they go), so
    the same (seed, number) would make different cases. There is no setting for it; the
    function that collects them is replaced by one that finds none (checked by
    tests/testing/test_fuzz.py, which regenerates cases in a process of its own)."""
    empty = _providers.Constants()
    if hasattr(_providers, "_get_local_constants"):
        _providers._get_local_constants = lambda: empty


_no_local_constants()


def rpc_order(campaign_seed: int) -> tuple[Rpc, ...]:
    """The campaign's RPCs in the order its cases take them, round after round: every RPC
    gets its share however few the cases, in an order that differs from seed to seed."""
    order = list(RPCS)
    random.Random(campaign_seed).shuffle(order)
    return tuple(order)


def draw_case(gen: Generator, campaign_seed: int, number: int) -> Case:
    """Case `number` of the campaign `campaign_seed` (module docstring): a call of
    `rpc_order(seed)[number % n]`, the rest drawn by one Hypothesis run seeded with (seed,
    number), of which the second example is taken (a run's first is always the simplest)."""
    rpc = rpc_order(campaign_seed)[number % len(RPCS)]
    got: list[Case] = []

    @settings(
        max_examples=2,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @seed(case_seed(campaign_seed, number))
    @given(gen.case(rpc))
    def body(case: Case) -> None:
        got.append(case)

    body()
    return got[-1]


def case_seed(campaign_seed: int, number: int) -> int:
    """The Hypothesis seed of case `number` of a campaign."""
    data = struct.pack(">qq", campaign_seed, number)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
