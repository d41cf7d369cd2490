"""Which fuzzed requests the campaign must not send as generated: the destructive valid ones.

Theory of operation
-------------------
The fuzzer calls as an admin so that requests reach the handlers, and an admin may legitimately
destroy things: delete a table, remove a master, delete or move a replica, change a tablet's
Raft config. Sent against the fixtures, such a request would be accepted, correctly, and the
campaign would go on fuzzing a cluster it had wrecked itself. So before a case is sent,
`defang` parses each request (as the server will: the same protobuf library) and, when the
caller's role is one the RPC's policy allows (`allowed`, read from the servicers' own POLICY
tables) and the request names a protected object, rewrites the name:

* a fixture table (DeleteTable, AlterTable) or fixture tablet (Add/Remove/MoveReplica,
  DeleteTablet, AlterSchema, ChangeConfig, StartTabletCopy) becomes the scratch table or its
  tablet, which such requests may break: the campaign recreates it when it finds it broken;
* a member master (RemoveMaster by uuid or by port) becomes one that does not exist;
* the fuzz user's grants on the fixtures (Grant/RevokePrivileges) stay as set up, so user
  requests keep meaning the same thing: another user is named instead;
* a CreateTable of more than `MAX_TABLETS` tablets is cut down to that (large tables are the
  benchmarks' subject; here they would only make every later case slower).

The member tablet server (fuzz_gen.IDENTITIES: the first tablet server's own certificate,
whose policy role is `tserver`, `POLICY_ROLE`) may legitimately do a few destructive things
too, all of them about itself, and those are rewritten the same way:

* a StartTabletCopy from itself of a fixture tablet becomes one of the scratch tablet (as for
  the other identities the policy allows);
* its heartbeat's registration is dropped: re-registering with a new address or a later
  instance seqno is the server's own business (and would lock the real process out of its
  master: its next heartbeat's seqno would be the older one);
* a replica its heartbeat reports FAILED becomes the scratch tablet's: a server is believed
  about its own replica, and a FAILED one is replaced (and tombstoned) at once.

Its heartbeats' CLAIMS about the fixture tablets (a leader, a term, a config) are never
rewritten, nor are its Raft messages: a claim is about other servers, and refusing or ignoring
those is exactly what is being tested.

Identities the policy refuses are never rewritten: their requests name the fixtures, and the
campaign checks they change nothing. Requests that do not parse are sent as they are (the
server cannot parse them either). What is not rewritten, on purpose: AddMaster (the leader
probes the address first; no generated address runs a joining master), LeaderStepDown (a
fixture tablet changes leader, its data does not), fences with any term, heartbeats and Raft
messages of non-member identities: refusing those is exactly what is being tested.

Server bugs the campaign found and that are still open are listed in `KNOWN_ISSUES`. With
`skip_known`, a request that would hit one is changed so that it cannot (`_avoid_known`), so
that a short run stays green while the bug is open and a long one can look for other bugs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from service.common.authz import Rule
from service.consensus.transport import ConsensusServicer
from service.master.master_service import POLICY as MASTER_POLICY
from service.pb.master_pb2 import REPLICA_FAILED
from service.testing.fuzz_gen import Rpc, message_class
from service.tserver.tablet_service import ADMIN_POLICY, COPY_POLICY, DATA_POLICY

__all__ = [
    "DESTRUCTIVE",
    "KNOWN_ISSUES",
    "MAX_TABLETS",
    "POLICY_ROLE",
    "Protected",
    "allowed",
    "defang",
]

MAX_TABLETS = 8
"""Most tablets a fuzzed CreateTable may ask for (module docstring)."""

DESTRUCTIVE = frozenset(
    {
        "MasterService/DeleteTable",
        "MasterService/AlterTable",
        "MasterService/AddReplica",
        "MasterService/RemoveReplica",
        "MasterService/MoveReplica",
        "TabletServerAdminService/DeleteTablet",
        "TabletServerAdminService/AlterSchema",
        "TabletServerAdminService/ChangeConfig",
        "TabletServerAdminService/StartTabletCopy",
    }
)
"""RPCs whose accepted requests may break the scratch table (module docstring)."""

KNOWN_ISSUES: dict[str, str] = {}
"""Server bugs the campaign has found and not yet seen fixed, each with what it is. With
`skip_known` the requests that would hit one are changed so they cannot (`_avoid_known`): a
short run stays green while the bug is open, and a long one can look for others."""
_TABLET_RPCS = frozenset(
    {
        "AddReplica",
        "RemoveReplica",
        "MoveReplica",
        "DeleteTablet",
        "AlterSchema",
        "ChangeConfig",
        "StartTabletCopy",
    }
)
_FENCED = frozenset({"CreateTablet", "DeleteTablet", "AlterSchema", "ChangeConfig"})
_HEARTBEATS = frozenset({"MasterService/TSHeartbeat", "MasterService/TSHeartbeatStream"})
POLICY_ROLE = {"member": "tserver"}
"""The role the servers' policies see for an identity, where it is not its name."""

_POLICIES: dict[str, dict[str, Rule]] = {
    "MasterService": dict(MASTER_POLICY),
    "TabletServerAdminService": dict(ADMIN_POLICY),
    "TabletCopyService": dict(COPY_POLICY),
    "TabletServerService": dict(DATA_POLICY),
}


@dataclass(frozen=True)
class Protected:
    """The objects destructive requests may not touch, and what to name instead."""

    table_ids: frozenset[str]
    table_names: frozenset[str]
    tablet_ids: frozenset[str]
    scratch_table_id: str
    scratch_table_name: str
    scratch_tablet_id: str
    master_uuids: frozenset[str]
    master_ports: frozenset[int]
    user: str
    master_term: int = 0
    """The master leader's term now (`KNOWN_ISSUES`, fence-term)."""
    member_uuid: str = ""
    """The member identity's tablet server (module docstring)."""


def allowed(rpc: Rpc, role: str, served_by: str = "") -> bool:
    """Whether a caller of `role` passes the policy of `rpc` (its checks of the request
    aside). The consensus service admits the role of the server's peers."""
    role = POLICY_ROLE.get(role, role)
    service = rpc.service.rsplit(".", 1)[-1]
    if service == "ConsensusService":
        peer = served_by or "master"
        rule = ConsensusServicer.policy(peer).get(rpc.method)
    else:
        rule = _POLICIES.get(service, {}).get(rpc.method)
    return rule is not None and role in rule.roles


def defang(
    rpc: Rpc, role: str, payloads: Sequence[bytes], p: Protected, *, skip_known: bool = False
) -> tuple[tuple[bytes, ...], str]:
    """`payloads` with protected names rewritten (module docstring), and why ("" if not);
    with `skip_known`, also kept away from the `KNOWN_ISSUES`."""
    may = allowed(rpc, role)
    if not may and not skip_known:
        return tuple(payloads), ""
    out, why = [], []
    for data in payloads:
        msg = message_class(rpc.input)()
        try:
            msg.ParseFromString(data)
        except (DecodeError, ValueError, RuntimeError):
            out.append(data)
            continue
        reason = _rewrite(rpc.name, msg, p, role) if may else ""
        if skip_known:
            reason = "; ".join(r for r in (reason, _avoid_known(rpc.name, msg, p)) if r)
        if reason:
            why.append(reason)
            out.append(msg.SerializeToString(deterministic=True))
        else:
            out.append(data)
    return tuple(out), "; ".join(why)


def _rewrite(name: str, msg: Any, p: Protected, role: str) -> str:
    if name in _HEARTBEATS:
        return _own_business(msg, p) if role == "member" else ""
    method = name.rsplit("/", 1)[-1]
    if method in ("DeleteTable", "AlterTable") and name.startswith("MasterService"):
        return _table(msg.table, p)
    if method in ("GrantPrivileges", "RevokePrivileges"):
        named = msg.table
        if msg.user == p.user and (
            named.table_id in p.table_ids or named.table_name in p.table_names
        ):
            msg.user = "fuzz-other"
            return "the fuzz user's grants stay as set up"
        return ""
    if method == "CreateTable":
        return _few_tablets(msg)
    if method == "RemoveMaster":
        return _no_member(msg, p)
    if method in _TABLET_RPCS and msg.tablet_id in p.tablet_ids:
        msg.tablet_id = p.scratch_tablet_id
        return "a fixture tablet became the scratch tablet"
    return ""


def _avoid_known(name: str, msg: Any, p: Protected) -> str:
    """Change `msg` so it cannot hit a bug of `KNOWN_ISSUES`; what was changed ("" when
    nothing was). Empty while no bug is open: the campaign's first two findings (a refused
    tablet-admin request that still raised the fencing term; a certificate request whose key
    could not be checked answered INTERNAL) are fixed, and their tests now expect nothing."""
    return ""


def _own_business(msg: Any, p: Protected) -> str:
    """A member's heartbeat with what it may legitimately do to itself taken out (module
    docstring): its registration, and the FAILED replicas of fixture tablets."""
    if not p.member_uuid or msg.instance.permanent_uuid != p.member_uuid:
        return ""  # refused by the master: not its own heartbeat
    why = []
    if msg.HasField("registration"):
        msg.ClearField("registration")
        why.append("the member's registration stays its process's")
    failed = [
        t
        for t in msg.tablet_report.updated_tablets
        if t.state == REPLICA_FAILED and t.tablet_id in p.tablet_ids
    ]
    for t in failed:
        t.tablet_id = p.scratch_tablet_id
    if failed:
        why.append("a fixture replica the member reports FAILED became the scratch tablet's")
    return "; ".join(why)


def _table(ident: Any, p: Protected) -> str:
    changed = False
    if ident.table_id in p.table_ids:
        ident.table_id = p.scratch_table_id
        changed = True
    if ident.table_name in p.table_names:
        ident.table_name = p.scratch_table_name
        changed = True
    return "a fixture table became the scratch table" if changed else ""


def _few_tablets(msg: Any) -> str:
    ps = msg.partition_schema
    hashes = [max(1, h.num_buckets) for h in ps.hash_schema]
    ranges = max(1, len(ps.range_bounds)) * (len(ps.split_keys) + 1)
    if math.prod(hashes) * ranges <= MAX_TABLETS:
        return ""
    del ps.hash_schema[2:]
    for h in ps.hash_schema:
        h.num_buckets = min(h.num_buckets, 2)
    del ps.range_bounds[1:]
    del ps.split_keys[1:]
    return f"at most {MAX_TABLETS} tablets"


def _no_member(msg: Any, p: Protected) -> str:
    changed = False
    if msg.uuid in p.master_uuids:
        msg.uuid = "fuzz-absent-master"
        changed = True
    addr = msg.rpc_address
    if addr.port in p.master_ports:
        addr.port = 1
        changed = True
    return "member masters stay members" if changed else ""
