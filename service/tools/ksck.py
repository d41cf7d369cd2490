"""ksck's judgement: rate masters, tablet servers, tablets and tables from gathered facts. PURE.

Theory of operation
-------------------
`tessera cluster ksck` (Kudu's `kudu cluster ksck`) answers "is every piece of data available
and fully replicated, and does everyone agree on who holds it?". It works in two steps, and
this module is the second: `ksck_cmd.gather()` asks every master and every tablet server what it
knows (the I/O edge), then `check()` here rates those facts. Keeping the rating a function over
plain frozen dataclasses means every rule below is tested table by table without a cluster
(tests/tools/test_ksck_rating.py), and the same snapshot always gives the same verdict.

The facts: for each master, its answer to ConnectToMaster (role, term, leader, configured
master list) or why it did not answer; for each tablet server the leader master knows, whether
it answered Ping and ListTablets and, per replica it hosts, the replica's state, data state,
role, term, leader and committed/pending config; for each table, the leader master's record of
its tablets (committed config and recorded leader); and with `--checksum`, each running
replica's answer to Checksum (applied index, row count, digest, and the rows outside the
tablet's partition with a few of their keys) or why there was none.

Tablet ratings, in increasing severity (`Health`; a table is rated by its worst tablet, as Kudu
rates tables):

* HEALTHY: every replica of the master's config is RUNNING, exactly one leader in the newest
  term, every replica's committed config equals the master's, everyone names the same leader.
* RECOVERING: something is being repaired but no voter is lost: a replica is COPYING (tablet
  copy), BOOTSTRAPPING or NOT_STARTED, a non-voter (a replacement being added) is not running,
  a config change is pending, or a server still hosts a FAILED replica the config no longer
  names (replaced; the master tombstones it).
* UNDER_REPLICATED: a voter is not running (its server is unreachable, it FAILED, with the
  error its server gives, it is missing from its server) but a majority of voters runs; or
  the config has fewer voters than the table's replication factor.
* ROWS_OUTSIDE_PARTITION (`--checksum` only): a replica holds live rows whose key lies outside
  the tablet's partition, rows a tablet server accepted before it checked writes against the
  partition (docs/design/tablets.md#R2). The table answers differently depending on which tablets
  a query reads, and may hold a key twice; `outside_partition_remedy` says how to get rid of
  them.
* CHECKSUM_MISMATCH (`--checksum` only): replicas at the same applied index have different row
  counts or digests: at least one replica's rows are not what its log says.
* CONSENSUS_MISMATCH: replicas disagree with the master's record of the config, name different
  leaders, two replicas claim leadership in the same term, or the master records a leader the
  replicas did not elect.
* UNAVAILABLE: fewer than a majority of voters run, or no replica leads: nothing can be written.

The two data findings rank below CONSENSUS_MISMATCH and UNAVAILABLE (while those hold, which
replica is right is not even known, or nothing can be written) and above UNDER_REPLICATED (a lost
voter heals by itself; wrong rows stay until someone acts). With `--checksum`, a running replica
that could not be checksummed (it did not catch up to the leader's applied index in time),
and replicas that answered at different indexes because writes went on, are RECOVERING: not
compared, so not known to be healthy.

Every applicable finding is kept as a reason; the tablet's rating is the most severe one. This
differs from Kudu in one way on purpose: Kudu stops at the first rule that matches and rates a
tablet with a tablet copy under way RECOVERING even while a voter is down; here it is
UNDER_REPLICATED (it is, until the copy finishes) and the copy appears among the reasons.

Masters are rated the same way: all reachable, one LEADER in the newest term, every master in
that term following it, and every master configured with the same master list, which must also
be the list ksck was given (a master missing from `--masters` was never checked). Tablet
servers: each must answer, be the server the master registered under that uuid, and be live
at the leader master (heartbeats arriving).

The verdict is healthy only when every master, every tablet server and every tablet is; the
command exits 0 then and 1 otherwise.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ClusterSnapshot",
    "Config",
    "FailedByTablet",
    "Health",
    "KsckReport",
    "MasterReport",
    "MasterTablet",
    "MastersVerdict",
    "ReplicaChecksum",
    "ReplicaReport",
    "ServerHealth",
    "ServerVerdict",
    "TServerReport",
    "TableSnapshot",
    "TableVerdict",
    "TabletChecksums",
    "TabletVerdict",
    "check",
    "check_masters",
    "check_tservers",
    "failed_by_tablet",
    "outside_partition_remedy",
    "rate_table",
    "rate_tablet",
]


class Health(enum.IntEnum):
    """A tablet's (or table's, or the masters') rating; a higher value is worse."""

    HEALTHY = 0
    RECOVERING = 1
    UNDER_REPLICATED = 2
    ROWS_OUTSIDE_PARTITION = 3
    CHECKSUM_MISMATCH = 4
    CONSENSUS_MISMATCH = 5
    UNAVAILABLE = 6


def outside_partition_remedy(table: str) -> str:
    """What to do about a table with rows outside their tablets' partitions (said once per
    table): the commands that rewrite it, named for it.

    Deleting the rows where they lie cannot work: the client sends a DELETE to the tablet that
    owns the key, and the tablet that holds the row refuses every row outside its partition,
    a DELETE too (docs/design/tablets.md#R2). A copy scans every tablet, stray rows included,
    and writes each row through the client, into the tablet that owns its key."""
    t = shlex.quote(table)
    new = shlex.quote(f"{table}_rewritten")
    return "\n".join(
        [
            f"{table}: rows outside their tablet's partition were accepted before tablet "
            "servers checked writes against the partition (docs/design/tablets.md#R2). They "
            "cannot be deleted where they are: a DELETE goes to the tablet that owns the key, "
            "and the tablet that holds the row refuses any row outside its partition, a DELETE "
            "too (OUTSIDE_PARTITION). Rewrite the table instead, with its writers stopped (each "
            "command with your --masters or --dir and --credentials):",
            f"  tessera grant list --table {t}      (note them: grants go with their table)",
            f"  tessera table copy {t} {new} --create --operation insert --no-transactional",
            f"  tessera table delete {t} --yes",
            f"  tessera table alter {new} --rename {t}",
            f"  tessera grant {t} USER PRIVILEGE...  (each grant noted above)",
            "The copy writes each row into the tablet that owns its key, row by row (not as one "
            "transaction, which a refused row would abort whole). A key held twice (in "
            "its own tablet and outside another's) goes in once: its other copy is refused "
            "(ALREADY_EXISTS), and the copy, having written every other row, fails naming the "
            "first five such keys. "
            "Check which version the new table kept (upsert the other if it is the right one) "
            "before deleting the old table.",
        ]
    )


class ServerHealth(enum.Enum):
    HEALTHY = "HEALTHY"
    UNAVAILABLE = "UNAVAILABLE"
    """It did not answer Ping or ListTablets."""
    WRONG_SERVER_UUID = "WRONG_SERVER_UUID"
    """Something answers at the address, but not the server the master registered there."""
    NOT_LIVE = "NOT_LIVE"
    """It answers, but the leader master has not heard its heartbeats lately."""
    GONE = "GONE"
    """Down and not live, but no tablet's config names it any more (its replicas were
    re-replicated elsewhere): reported, not a problem. The master never forgets a server
    (docs/design/failover.md#R2), so without this a cluster that healed itself by 3-4-3 would never
    check clean."""


# --- facts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """A tablet's Raft config: voter and non-voter uuids; `opid_index` None when unknown."""

    voters: frozenset[str]
    non_voters: frozenset[str] = frozenset()
    opid_index: int | None = None

    def same_members(self, other: Config) -> bool:
        return self.voters == other.voters and self.non_voters == other.non_voters

    def describe(self, names: Mapping[str, str] | None = None) -> str:
        def show(uuids: Iterable[str]) -> str:
            return ", ".join(sorted((names or {}).get(u, u) for u in uuids))

        text = f"voters [{show(self.voters)}]"
        if self.non_voters:
            text += f" non-voters [{show(self.non_voters)}]"
        if self.opid_index is not None:
            text += f" at opid index {self.opid_index}"
        return text


RUNNING = "RUNNING"
FAILED = "FAILED"
RECOVERING_STATES = frozenset({"BOOTSTRAPPING", "COPYING", "NOT_STARTED"})
"""Replica states on the way to RUNNING (ReplicaStatePB names without the REPLICA_ prefix)."""


@dataclass(frozen=True)
class ReplicaReport:
    """One replica as its tablet server reports it (ListTablets)."""

    tablet_id: str
    state: str = RUNNING
    data_state: str = "READY"
    role: str = "FOLLOWER"
    term: int = 0
    leader_uuid: str = ""
    committed: Config | None = None
    pending: Config | None = None
    error: str = ""


@dataclass(frozen=True)
class TServerReport:
    """One tablet server: the leader master's view (`live`) and what it answered."""

    uuid: str
    address: str
    live: bool = True
    reachable: bool = True
    wrong_uuid: bool = False
    error: str = ""
    replicas: tuple[ReplicaReport, ...] = ()

    def replica(self, tablet_id: str) -> ReplicaReport | None:
        return next((r for r in self.replicas if r.tablet_id == tablet_id), None)


@dataclass(frozen=True)
class MasterTablet:
    """The leader master's record of one tablet: committed config, recorded leader."""

    tablet_id: str
    config: Config
    leader_uuid: str = ""
    partition: str = ""
    """Readable partition, for output only."""


@dataclass(frozen=True)
class ReplicaChecksum:
    """One replica's answer to Checksum (`--checksum`), or why there was none."""

    uuid: str
    applied_index: int = 0
    rows: int = 0
    digest: bytes = b""
    outside_rows: int = 0
    """Live rows whose key lies outside the tablet's partition."""
    outside_sample_keys: tuple[str, ...] = ()
    """The first few of their keys, decoded for people ("(id=5)")."""
    error: str = ""


@dataclass(frozen=True)
class TabletChecksums:
    """Every answer to Checksum about one tablet (`--checksum`)."""

    tablet_id: str
    replicas: tuple[ReplicaChecksum, ...] = ()


@dataclass(frozen=True)
class TableSnapshot:
    table_id: str
    name: str
    num_replicas: int
    tablets: tuple[MasterTablet, ...] = ()
    error: str = ""
    """Why the table's tablets could not be listed (then `tablets` is empty)."""
    checksums: tuple[TabletChecksums, ...] = ()
    """With `--checksum`: the replicas' checksums, per tablet."""


@dataclass(frozen=True)
class MasterReport:
    """One master's answer to ConnectToMaster, or why there was none."""

    address: str
    reachable: bool = True
    error: str = ""
    uuid: str = ""
    role: str = "FOLLOWER"
    term: int = 0
    leader_uuid: str = ""
    master_addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything `gather()` learned; `error` says what could not be asked at all."""

    given_masters: tuple[str, ...]
    masters: tuple[MasterReport, ...]
    tservers: tuple[TServerReport, ...] = ()
    tables: tuple[TableSnapshot, ...] = ()
    error: str = ""
    checksummed: bool = False
    """Whether replicas were asked for checksums (`--checksum`)."""


# --- verdicts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TabletVerdict:
    tablet_id: str
    table_name: str
    health: Health
    reasons: tuple[str, ...] = ()
    partition: str = ""
    leader: str = ""
    """Address (or uuid) of the replica that leads, "" if none."""
    checksums_matched: int = 0
    """With `--checksum`: replicas whose checksum equals a peer's at the same applied index."""
    outside_partition_rows: int = 0
    """With `--checksum`: the most rows outside the partition any replica holds."""


@dataclass(frozen=True)
class TableVerdict:
    table_id: str
    name: str
    num_replicas: int
    health: Health
    tablets: tuple[TabletVerdict, ...] = ()
    error: str = ""

    def count(self, health: Health) -> int:
        return sum(t.health is health for t in self.tablets)


@dataclass(frozen=True)
class MastersVerdict:
    health: Health
    leader_uuid: str = ""
    leader_address: str = ""
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerVerdict:
    uuid: str
    address: str
    health: ServerHealth
    problem: str = ""


@dataclass(frozen=True)
class KsckReport:
    masters: MastersVerdict
    master_reports: tuple[MasterReport, ...]
    tservers: tuple[ServerVerdict, ...]
    tables: tuple[TableVerdict, ...]
    error: str = ""
    checksummed: bool = False

    @property
    def healthy(self) -> bool:
        return (
            not self.error
            and self.masters.health is Health.HEALTHY
            and all(s.health in _OK_SERVERS for s in self.tservers)
            and all(t.health is Health.HEALTHY for t in self.tables)
        )

    @property
    def unhealthy_tablets(self) -> list[TabletVerdict]:
        return [x for t in self.tables for x in t.tablets if x.health is not Health.HEALTHY]

    @property
    def outside_partition_tablets(self) -> list[TabletVerdict]:
        """Tablets some replica of which holds rows outside the partition."""
        return [x for t in self.tables for x in t.tablets if x.outside_partition_rows]

    @property
    def remedies(self) -> tuple[str, ...]:
        """What to do about findings that need an operator: once per table they concern."""
        tables = sorted({x.table_name for x in self.outside_partition_tablets})
        return tuple(outside_partition_remedy(t) for t in tables)


# --- rating ----------------------------------------------------------------------------------


@dataclass
class _Findings:
    items: list[tuple[Health, str]] = field(default_factory=list)

    def add(self, health: Health, reason: str) -> None:
        self.items.append((health, reason))

    @property
    def health(self) -> Health:
        return max((h for h, _ in self.items), default=Health.HEALTHY)

    def reasons(self) -> tuple[str, ...]:
        ordered = sorted(enumerate(self.items), key=lambda x: (-x[1][0], x[0]))
        return tuple(f"{h.name}: {r}" for _, (h, r) in ordered)


def _replica_problem(
    uuid: str, tablet_id: str, servers: Mapping[str, TServerReport]
) -> tuple[str, ReplicaReport | None, str]:
    """("running" | "recovering" | "down", the report if any, why it is not running)."""
    srv = servers.get(uuid)
    if srv is None:
        return "down", None, f"replica on {uuid}: not a tablet server the master knows"
    where = srv.address or uuid
    if srv.wrong_uuid:
        return "down", None, f"replica on {where}: the server there is not {uuid}"
    if not srv.reachable:  # why is in the tablet server's own verdict, said once there
        return "down", None, f"replica on {where}: tablet server unreachable"
    rep = srv.replica(tablet_id)
    if rep is None:
        return "down", None, f"replica on {where}: missing from its tablet server"
    if rep.state in RECOVERING_STATES or rep.data_state == "COPYING":
        return "recovering", rep, f"replica on {where} is {rep.state} (data {rep.data_state})"
    if rep.state != RUNNING or rep.data_state != "READY":
        why = f": {rep.error}" if rep.error else ""
        return "down", rep, f"replica on {where} is {rep.state} (data {rep.data_state}){why}"
    return "running", rep, ""


FailedByTablet = Mapping[str, Sequence[tuple[str, ReplicaReport]]]
"""Tablet id -> (server uuid, replica) of each FAILED replica of it the servers host."""


def failed_by_tablet(servers: Mapping[str, TServerReport]) -> FailedByTablet:
    """Every FAILED replica the servers host, by tablet: gathered once per check, so rating a
    tablet does not look through every server for one."""
    out: dict[str, list[tuple[str, ReplicaReport]]] = {}
    for uuid, srv in sorted(servers.items()):
        for rep in srv.replicas:
            if rep.state == FAILED:
                out.setdefault(rep.tablet_id, []).append((uuid, rep))
    return out


def rate_tablet(
    tablet: MasterTablet,
    servers: Mapping[str, TServerReport],
    num_replicas: int,
    table_name: str = "",
    failed: FailedByTablet | None = None,
    checksums: Sequence[ReplicaChecksum] | None = None,
) -> TabletVerdict:
    """Rate one tablet from the master's record and its servers' reports (module docstring);
    `failed` is `failed_by_tablet(servers)` (computed here if not given); `checksums`, the
    replicas' answers to Checksum, only with `--checksum` (None: not asked)."""
    f = _Findings()
    names = {u: s.address for u, s in servers.items() if s.address}
    cfg = tablet.config
    voters = cfg.voters
    majority = len(voters) // 2 + 1
    running: dict[str, ReplicaReport] = {}  # voters and non-voters that run, by uuid
    for uuid in sorted(voters | cfg.non_voters):
        kind, rep, why = _replica_problem(uuid, tablet.tablet_id, servers)
        if kind == "running" and rep is not None:
            running[uuid] = rep
        elif kind == "recovering" or uuid not in voters:
            f.add(Health.RECOVERING, why if uuid in voters else f"non-voter {why}")
        else:
            f.add(Health.UNDER_REPLICATED, why)
    if failed is None:
        failed = failed_by_tablet(servers)
    for uuid, rep in failed.get(tablet.tablet_id, ()):
        if uuid in voters | cfg.non_voters:
            continue  # rated above
        why = f": {rep.error}" if rep.error else ""
        f.add(
            Health.RECOVERING,
            f"replica on {names.get(uuid, uuid)} is FAILED outside the config (replaced, "
            f"not yet tombstoned){why}",
        )
    running_voters = [u for u in running if u in voters]
    if len(running_voters) < majority:
        f.add(
            Health.UNAVAILABLE,
            f"{len(running_voters)} of {len(voters)} voters running, a majority needs {majority}",
        )
    if len(voters) < num_replicas:
        f.add(
            Health.UNDER_REPLICATED,
            f"config has {len(voters)} voter(s), the table wants {num_replicas}",
        )

    claims = [(running[u].term, u) for u in running_voters if running[u].role == "LEADER"]
    leader = ""
    if not claims:
        if running_voters:
            f.add(Health.UNAVAILABLE, "no replica is leader")
    else:
        top = max(t for t, _ in claims)
        newest = sorted(u for t, u in claims if t == top)
        leader = newest[0]
        if len(newest) > 1:
            who = ", ".join(names.get(u, u) for u in newest)
            f.add(
                Health.CONSENSUS_MISMATCH, f"{len(newest)} replicas claim to lead term {top}: {who}"
            )
        for t, u in sorted(claims):
            if t < top:
                f.add(
                    Health.CONSENSUS_MISMATCH,
                    f"replica on {names.get(u, u)} still claims to lead term {t} (newest {top})",
                )

    for uuid, rep in sorted(running.items()):
        where = names.get(uuid, uuid)
        if rep.committed is not None and not rep.committed.same_members(cfg):
            f.add(
                Health.CONSENSUS_MISMATCH,
                f"replica on {where} has config {rep.committed.describe(names)}, "
                f"the master has {cfg.describe(names)}",
            )
        if rep.pending is not None:
            f.add(
                Health.RECOVERING,
                f"config change pending on {where}: {rep.pending.describe(names)}",
            )
        if leader and rep.leader_uuid and rep.leader_uuid != leader and rep.role != "LEADER":
            f.add(
                Health.CONSENSUS_MISMATCH,
                f"replica on {where} follows {names.get(rep.leader_uuid, rep.leader_uuid)} "
                f"(term {rep.term}), the leader is {names.get(leader, leader)}",
            )
    if leader and tablet.leader_uuid and tablet.leader_uuid != leader:
        f.add(
            Health.CONSENSUS_MISMATCH,
            f"the master records {names.get(tablet.leader_uuid, tablet.leader_uuid)} as leader, "
            f"the replicas elected {names.get(leader, leader)}",
        )
    matched = outside = 0
    if checksums is not None:
        matched, outside = _rate_checksums(f, checksums, frozenset(running), names)
    return TabletVerdict(
        tablet_id=tablet.tablet_id,
        table_name=table_name,
        health=f.health,
        reasons=f.reasons(),
        partition=tablet.partition,
        leader=names.get(leader, leader),
        checksums_matched=matched,
        outside_partition_rows=outside,
    )


def _rate_checksums(
    f: _Findings,
    sums: Sequence[ReplicaChecksum],
    running: frozenset[str],
    names: Mapping[str, str],
) -> tuple[int, int]:
    """Add the findings of the replicas' checksums to `f`; (replicas whose checksum equals a
    peer's at the same index, the most rows outside the partition one replica holds).

    Only replicas at the same applied index can be compared: their rows are the same function
    of the same log prefix, so any difference is a replica gone wrong. A replica that was not
    running is rated by the rules above already; one that was running but gave no checksum, or
    whose index no peer shared (writes went on between the calls), leaves the tablet unverified
    (RECOVERING: run the check again)."""
    answered = sorted((c for c in sums if not c.error), key=lambda c: c.uuid)
    for c in sorted(sums, key=lambda c: c.uuid):
        if c.error and c.uuid in running:
            f.add(
                Health.RECOVERING, f"replica on {names.get(c.uuid, c.uuid)}: no checksum: {c.error}"
            )
    by_index: dict[int, list[ReplicaChecksum]] = {}
    for c in answered:
        by_index.setdefault(c.applied_index, []).append(c)
    matched = 0
    for index, group in sorted(by_index.items()):
        if len(group) < 2:
            continue
        kinds = [(c.rows, c.digest) for c in group]
        matched += sum(kinds.count(k) > 1 for k in kinds)
        if len(set(kinds)) == 1:
            continue
        detail = "; ".join(
            f"{names.get(c.uuid, c.uuid)}: {c.rows} rows, digest {c.digest.hex()[:16]}"
            for c in group
        )
        f.add(Health.CHECKSUM_MISMATCH, f"replicas at applied index {index} disagree: {detail}")
    alone = [c for c in answered if len(by_index[c.applied_index]) == 1]
    if len(answered) > 1 and alone:
        detail = ", ".join(f"{names.get(c.uuid, c.uuid)} at {c.applied_index}" for c in alone)
        f.add(
            Health.RECOVERING,
            "checksum not compared: no other replica answered at the same applied index "
            f"(writes went on during the check): {detail}",
        )
    holders: dict[tuple[int, tuple[str, ...]], list[str]] = {}
    for c in answered:
        if c.outside_rows:
            holders.setdefault((c.outside_rows, c.outside_sample_keys), []).append(c.uuid)
    for (n, keys), uuids in sorted(holders.items()):
        who = ", ".join(names.get(u, u) for u in uuids)
        head = f"replica on {who} holds" if len(uuids) == 1 else f"replicas on {who} each hold"
        sample = ", ".join(keys) + (", ..." if n > len(keys) else "")
        f.add(
            Health.ROWS_OUTSIDE_PARTITION,
            f"{head} {n} live row(s) whose key lies outside the tablet's partition"
            + (f": {sample}" if keys else ""),
        )
    return matched, max((c.outside_rows for c in answered), default=0)


def rate_table(
    table: TableSnapshot,
    servers: Mapping[str, TServerReport],
    failed: FailedByTablet | None = None,
) -> TableVerdict:
    """Rate every tablet; the table takes its worst tablet's rating (UNAVAILABLE on error)."""
    if failed is None:
        failed = failed_by_tablet(servers)
    sums = {c.tablet_id: c.replicas for c in table.checksums}
    tablets = tuple(
        rate_tablet(t, servers, table.num_replicas, table.name, failed, sums.get(t.tablet_id))
        for t in table.tablets
    )
    if table.error:
        health = Health.UNAVAILABLE
    else:
        health = max((t.health for t in tablets), default=Health.HEALTHY)
    return TableVerdict(
        table.table_id, table.name, table.num_replicas, health, tablets, table.error
    )


def check_masters(given: Sequence[str], reports: Sequence[MasterReport]) -> MastersVerdict:
    """All reachable, one leader in the newest term followed by all, one agreed master list."""
    f = _Findings()
    up = [r for r in reports if r.reachable]
    down = [r for r in reports if not r.reachable]
    for r in down:
        f.add(Health.UNDER_REPLICATED, f"master {r.address} unreachable: {r.error}")
    if len(up) < len(reports) // 2 + 1:
        f.add(Health.UNAVAILABLE, f"{len(up)} of {len(reports)} masters reachable, no majority")
    claims = [r for r in up if r.role == "LEADER"]
    leader: MasterReport | None = None
    if not claims:
        f.add(Health.UNAVAILABLE, "no master is leader")
    else:
        top = max(r.term for r in claims)
        newest = [r for r in claims if r.term == top]
        leader = newest[0]
        if len(newest) > 1:
            who = ", ".join(r.address for r in newest)
            f.add(
                Health.CONSENSUS_MISMATCH, f"{len(newest)} masters claim to lead term {top}: {who}"
            )
    if leader is not None:
        leader_uuid = leader.uuid or leader.leader_uuid
        for r in up:
            if r is leader:
                continue
            if r.term != leader.term:
                f.add(
                    Health.CONSENSUS_MISMATCH,
                    f"master {r.address} is in term {r.term}, the leader "
                    f"{leader.address} in term {leader.term}",
                )
            elif r.leader_uuid and leader_uuid and r.leader_uuid != leader_uuid:
                f.add(
                    Health.CONSENSUS_MISMATCH,
                    f"master {r.address} follows {r.leader_uuid}, not {leader.address}",
                )
    lists = {r.address: frozenset(r.master_addresses) for r in up if r.master_addresses}
    distinct = set(lists.values())
    if len(distinct) > 1:
        detail = "; ".join(f"{a}: [{', '.join(sorted(s))}]" for a, s in sorted(lists.items()))
        f.add(Health.CONSENSUS_MISMATCH, f"masters disagree on the master list: {detail}")
    elif distinct:
        (configured,) = distinct
        missing = sorted(configured - set(given))
        extra = sorted(set(given) - configured)
        if missing:
            f.add(
                Health.CONSENSUS_MISMATCH,
                f"the masters are configured with {', '.join(missing)}, which ksck was not given "
                "(not checked: pass every master)",
            )
        if extra:
            f.add(
                Health.CONSENSUS_MISMATCH,
                f"{', '.join(extra)} given but not in the masters' own list",
            )
    return MastersVerdict(
        health=f.health,
        leader_uuid=(leader.uuid or leader.leader_uuid) if leader else "",
        leader_address=leader.address if leader else "",
        problems=f.reasons(),
    )


def check_tservers(
    reports: Sequence[TServerReport], members: frozenset[str] | None = None
) -> tuple[ServerVerdict, ...]:
    """Each server's verdict; `members` (every uuid some tablet's committed config names)
    tells a dead server that still hosts replicas from one that hosts none (GONE)."""
    out = []
    for s in sorted(reports, key=lambda s: (s.address, s.uuid)):
        if s.wrong_uuid:
            v = ServerVerdict(s.uuid, s.address, ServerHealth.WRONG_SERVER_UUID, s.error)
        elif not s.reachable and not s.live and members is not None and s.uuid not in members:
            v = ServerVerdict(
                s.uuid, s.address, ServerHealth.GONE, "down; no tablet's config names it"
            )
        elif not s.reachable:
            v = ServerVerdict(s.uuid, s.address, ServerHealth.UNAVAILABLE, s.error)
        elif not s.live:
            v = ServerVerdict(
                s.uuid, s.address, ServerHealth.NOT_LIVE, "no recent heartbeat at the leader master"
            )
        else:
            v = ServerVerdict(s.uuid, s.address, ServerHealth.HEALTHY)
        out.append(v)
    return tuple(out)


_OK_SERVERS = frozenset({ServerHealth.HEALTHY, ServerHealth.GONE})


def _members(snapshot: ClusterSnapshot) -> frozenset[str] | None:
    """Every server named by a committed config, or None when some table could not be read
    (then nobody may be declared GONE)."""
    if any(t.error for t in snapshot.tables):
        return None
    return frozenset(
        u for t in snapshot.tables for x in t.tablets for u in x.config.voters | x.config.non_voters
    )


def check(snapshot: ClusterSnapshot) -> KsckReport:
    """The whole verdict over one snapshot."""
    servers = {s.uuid: s for s in snapshot.tservers}
    failed = failed_by_tablet(servers)
    return KsckReport(
        masters=check_masters(snapshot.given_masters, snapshot.masters),
        master_reports=snapshot.masters,
        tservers=check_tservers(snapshot.tservers, _members(snapshot)),
        tables=tuple(
            rate_table(t, servers, failed) for t in sorted(snapshot.tables, key=lambda t: t.name)
        ),
        error=snapshot.error,
        checksummed=snapshot.checksummed,
    )
