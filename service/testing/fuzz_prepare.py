"""What the fuzzing campaign does to a case around sending it: fill in, look up, clean up.

Theory of operation
-------------------
A generated case is a function of (seed, number) alone (fuzz_gen.py), so it cannot know what
only the running cluster knows. Before it is sent:

* `bind` makes its target concrete ("tablet-leader": the tablet server that led the tablet the
  request names when the campaign last looked) and puts that server's uuid where the generator
  left the DEST placeholder; in a heartbeat, the instance seqno the master has registered for
  the server it names where the generator left LIVE_SEQNO (the master reads the report of a
  heartbeat from the registered process only), and each reported tablet's current term and
  config op index (the member server's replica's, GetConsensusState) where it left LIVE_TERM
  or LIVE_INDEX plus an offset, so the member's claims are "the next term", "the same
  config" of the tablet as it is now; in a Raft message, the member's incarnation (from its
  data directory) where it left LIVE_INCARNATION, and the group's term plus an offset where
  it left LIVE_TERM;
* `with_live_handles` opens a scanner (ScanNext, ScanClose) or a tablet copy session
  (FetchData, EndTabletCopySession) on that server and puts its id where the generator left
  the placeholder, so those calls get past the lookup to the code behind it. Copy sessions
  are begun as the member (only a member of the tablet's config may begin one): the member's
  cases continue them, everyone else's must be refused.

The reproducer shows the request after both. After an accepted call, `undo_accepted` removes
what would pile up over a long run: a table created through the master is deleted, a tablet
created on a tablet server alone (an orphan no master knows) is deleted there.
`written_tablet` names the fixture tablet a Write goes to, whose rows a refusal must not
change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from service.common.errors import NotFound
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc
from service.testing.fuzz_cluster import (
    FIXTURE_A,
    MEMBER_UUID,
    PRINCIPALS,
    SCRATCH,
    FuzzCluster,
    Outcome,
)
from service.testing.fuzz_gen import Case, Rpc, message_class
from service.testing.fuzz_values import (
    DEST,
    LIVE_INCARNATION,
    LIVE_INDEX,
    LIVE_SCANNER,
    LIVE_SEQNO,
    LIVE_SESSION,
    LIVE_TERM,
    live_offset,
)

__all__ = ["bind", "named_tablet", "undo_accepted", "with_live_handles", "written_tablet"]


def bind(fc: FuzzCluster, case: Case) -> Case:
    """The case with its target and DEST placeholder made concrete: "tablet-leader" is the
    tablet server leading the tablet the request names, DEST that server's uuid."""
    target = case.target
    if target == "tablet-leader":
        tablet = _tablet_named(case.messages[0]) if case.messages else ""
        target = f"tserver:{fc.leader_of(tablet)}"
    _, uuid = fc.address_of(target)
    messages = []
    for m in case.messages:
        copy = message_class(case.rpc.input)()
        copy.CopyFrom(m)
        _substitute(copy, DEST, uuid)
        messages.append(copy)
    if case.rpc.method in ("TSHeartbeat", "TSHeartbeatStream"):
        _fill_live_numbers(fc, messages)
    elif case.rpc.method in ("Step", "StepStream"):
        _fill_live_raft(fc, messages)
    return replace(case, target=target, messages=tuple(messages))


def _fill_live_raft(fc: FuzzCluster, messages: Sequence[Any]) -> None:
    """Raft messages: LIVE_INCARNATION becomes the member's incarnation, LIVE_TERM + k its
    replica's current term of the group plus k."""
    incarnation = fc.member_incarnation()
    for m in messages:
        _substitute(m, LIVE_INCARNATION, incarnation)
    live = {
        b.group_id
        for m in messages
        for b in m.groups
        if any(live_offset(x.term, LIVE_TERM) is not None for x in b.messages)
    }
    if not live:
        return
    bases = _member_states(fc, live)
    for m in messages:
        for b in m.groups:
            term = bases.get(b.group_id, (0, 0))[0]
            for x in b.messages:
                k = live_offset(x.term, LIVE_TERM)
                if k is not None:
                    x.term = term + k


def _member_states(fc: FuzzCluster, tablets: set[str]) -> dict[str, tuple[int, int]]:
    """(term, config op index) of the member's replicas of `tablets` ({} if it did not say)."""
    with contextlib.suppress(grpc.RpcError):
        member = [ts.uuid for ts in fc.mini.tservers.values()].index(MEMBER_UUID)
        return fc.consensus_states(member, sorted(tablets))
    return {}


def _fill_live_numbers(fc: FuzzCluster, messages: Sequence[Any]) -> None:
    """Replace LIVE_SEQNO, LIVE_TERM + k and LIVE_INDEX + k in heartbeats (module docstring).
    A placeholder the cluster cannot fill (it did not answer) is left: the heartbeat is then
    told to re-register, and its report is not read."""
    seqnos: dict[str, int | None] = {}
    for m in messages:
        if m.instance.instance_seqno == LIVE_SEQNO:
            uuid = m.instance.permanent_uuid
            if uuid not in seqnos:
                with contextlib.suppress(grpc.RpcError):
                    seqnos[uuid] = fc.instance_seqno(uuid)
            if seqnos.get(uuid) is not None:
                m.instance.instance_seqno = seqnos[uuid]
    entries = [t for m in messages for t in m.tablet_report.updated_tablets]
    live = [t for t in entries if _has_live_number(t.consensus_state)]
    if not live:
        return
    bases = _member_states(fc, {t.tablet_id for t in live})
    for t in live:
        term, index = bases.get(t.tablet_id, (0, 0))
        cs = t.consensus_state
        k = live_offset(cs.current_term, LIVE_TERM)
        if k is not None:
            cs.current_term = term + k
        for config in (cs.committed_config, cs.pending_config):
            k = live_offset(config.opid_index, LIVE_INDEX)
            if k is not None:
                config.opid_index = index + k


def _has_live_number(cs: Any) -> bool:
    return (
        live_offset(cs.current_term, LIVE_TERM) is not None
        or live_offset(cs.committed_config.opid_index, LIVE_INDEX) is not None
        or live_offset(cs.pending_config.opid_index, LIVE_INDEX) is not None
    )


def with_live_handles(fc: FuzzCluster, case: Case) -> Case:
    """Replace the live-handle placeholders (fuzz_gen.LIVE_SCANNER, LIVE_SESSION) by a
    scanner or tablet copy session opened just now, so ScanNext and FetchData get past the
    lookup. The replaced message is what the reproducer shows."""
    method = case.rpc.method
    if method not in ("ScanNext", "ScanClose", "FetchData", "EndTabletCopySession"):
        return case
    if not any(
        getattr(m, "scanner_id", None) == LIVE_SCANNER
        or getattr(m, "session_id", None) == LIVE_SESSION
        for m in case.messages
    ):
        return case
    handle = _open_handle(fc, case)
    if handle is None:
        return case
    messages = []
    for m in case.messages:
        copy: Any = message_class(case.rpc.input)()
        copy.CopyFrom(m)
        if getattr(copy, "scanner_id", None) == LIVE_SCANNER:
            copy.scanner_id = handle
        if getattr(copy, "session_id", None) == LIVE_SESSION:
            copy.session_id = handle.decode()
        messages.append(copy)
    return replace(case, messages=tuple(messages))


def _open_handle(fc: FuzzCluster, case: Case) -> bytes | None:
    if not case.target.startswith("tserver:"):
        return None
    address, uuid = fc.address_of(case.target)
    tablet = fc.tables[FIXTURE_A].tablets[0]
    try:
        if case.rpc.method in ("ScanNext", "ScanClose"):
            data = tserver_pb2_grpc.TabletServerServiceStub(fc.channel(case.identity, address))
            r = data.Scan(
                tpb.ScanRequestPB(
                    dest_uuid=uuid,
                    new_scan=tpb.NewScanRequestPB(tablet_id=tablet),
                    batch_size_bytes=64,
                    authz_token=fc.authz_token,
                ),
                timeout=5,
            )
            return r.scanner_id or None
        copy = tserver_pb2_grpc.TabletCopyServiceStub(fc.channel("member", address))
        s = copy.BeginTabletCopySession(
            tpb.BeginTabletCopySessionRequestPB(
                dest_uuid=uuid, tablet_id=tablet, requestor_uuid=PRINCIPALS["member"]
            ),
            timeout=5,
        )
        return s.session_id.encode()
    except Exception:
        return None


def undo_accepted(fc: FuzzCluster, case: Case, payloads: Sequence[bytes], outcome: Outcome) -> str:
    """Undo what an accepted request made that would pile up (module docstring); a note if
    it could not be undone, else ""."""
    if not outcome.ok:
        return ""
    name = case.rpc.name
    if name == "MasterService/CreateTable":
        table_id = mpb.CreateTableResponsePB.FromString(outcome.response).table_id
        try:
            fc.delete_table(table_id)
        except NotFound:
            pass  # a retried request id: the master answered with a table deleted since
        except Exception as e:
            return f"could not delete table {table_id} the fuzzer made: {e}"
    elif name == "TabletServerAdminService/CreateTablet":
        msg = tpb.CreateTabletRequestPB()
        with contextlib.suppress(DecodeError):
            msg.ParseFromString(payloads[0])
        scratch = fc.tables.get(SCRATCH)
        known = {*fc.fixture_tablets(), *(scratch.tablets if scratch else ())}
        if msg.tablet_id and msg.tablet_id not in known:
            address, uuid = fc.address_of(case.target)
            stub = tserver_pb2_grpc.TabletServerAdminServiceStub(fc.channel("admin", address))
            try:
                stub.DeleteTablet(
                    tpb.DeleteTabletRequestPB(
                        dest_uuid=uuid,
                        tablet_id=msg.tablet_id,
                        delete_type=tpb.TABLET_DATA_DELETED,
                        reason="fuzz: a tablet the fuzzer made",
                    ),
                    timeout=10,
                )
            except Exception as e:
                return f"could not delete tablet {msg.tablet_id} the fuzzer made: {e}"
    return ""


def written_tablet(fc: FuzzCluster, rpc: str, payloads: Sequence[bytes], ts_name: str) -> str:
    """The fixture tablet a Write names, if it parses and goes to a tablet server."""
    if rpc != "TabletServerService/Write" or not ts_name:
        return ""
    msg = tpb.WriteRequestPB()
    try:
        msg.ParseFromString(payloads[0])
    except DecodeError:
        return ""
    return msg.tablet_id if msg.tablet_id in fc.fixture_tablets() else ""


def named_tablet(rpc: Rpc, payloads: Sequence[bytes]) -> str:
    """The tablet the first request names, if it parses ("" if not)."""
    msg = message_class(rpc.input)()
    try:
        msg.ParseFromString(payloads[0] if payloads else b"")
    except (DecodeError, ValueError, RuntimeError):
        return ""
    return _tablet_named(msg)


def _tablet_named(msg: Any) -> str:
    """The tablet a request is about: its tablet_id, or its new scan's."""
    tablet = getattr(msg, "tablet_id", "")
    if not tablet and msg.DESCRIPTOR.fields_by_name.get("new_scan") is not None:
        tablet = msg.new_scan.tablet_id
    return tablet if isinstance(tablet, str) else ""


def _substitute(msg: Any, old: str, new: str) -> None:
    """Replace the string `old` by `new` wherever `msg` holds it (nested messages too)."""
    for f, value in msg.ListFields():
        if f.type == f.TYPE_STRING:
            if f.is_repeated:
                for i, v in enumerate(value):
                    if v == old:
                        value[i] = new
            elif value == old:
                setattr(msg, f.name, new)
        elif f.type == f.TYPE_MESSAGE:
            if f.message_type.GetOptions().map_entry:
                continue
            for sub in value if f.is_repeated else (value,):
                _substitute(sub, old, new)
