"""`tessera cluster ksck`: gather what every server knows, rate it (`ksck.check`), print it.

    tessera cluster ksck (--masters HOST:PORT,... | --dir DIR) [--tables T1,T2]
                         [--checksum [--checksum-timeout SECONDS]]
                         [--timeout SECONDS] [--format plain|json]

Exit status: 0 only when every master, tablet server and tablet is healthy; 1 otherwise
(including when the cluster cannot be asked at all); 2 on usage errors. So `ksck` can gate a
deployment step or a health check as is.

Gathering is the I/O edge of `service.tools.ksck` (which holds the rules and their reasons):

1. every master given is asked ConnectToMaster at once (role, term, leader, master list);
2. through the leader (the client library finds it): ListMasters for the masters' uuids,
   ListTabletServers, ListTables and each table's tablet locations (the master's record of each
   tablet's committed config and leader), tables in parallel;
3. every tablet server the leader knows is asked Ping and ListTablets, all servers in
   parallel, one ListTablets per server (every replica it hosts with its state and consensus
   state), each call bounded by `--timeout`, so a dead server costs one timeout, not one per
   tablet. Servers that refuse the connection (a killed process) fail at once.
4. with `--checksum` only (it reads every row of every checked tablet, so it is off by
   default): every running replica of every tablet of the checked tables is asked Checksum,
   with the caller's (admin) credentials. The leader is asked first; its applied index is then
   each follower's `min_applied_index`, so followers finish applying what the leader had
   before they answer, and replicas that still answered at different indexes (writes went on)
   are asked again at the highest one, twice at most. Each ask gets `--checksum-timeout` in
   all, a retryable refusal (a tablet starting) retried with the client's backoff
   (service/client/retry.py). A few tablets are checksummed at a time. The sample keys of rows
   outside a tablet's partition are decoded with the table's schema for the report.

Kudu's ksck (`kudu cluster ksck`) is the model; see ksck.py for where the ratings differ.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace

from service.client import TesseraClient
from service.client.channels import ChannelPool
from service.client.client import TableSummary, TabletServerInfo
from service.client.retry import Backoff, Deadline
from service.common.errors import InvalidArgument, NotFound, TesseraError, WrongDestination
from service.common.keys import decode_key
from service.common.schema import Schema
from service.common.tls import Credentials
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.tools.admin_cmd import (
    add_connection_args,
    credentials_of,
    group_actions,
    masters_of,
    run_command,
)
from service.tools.ksck import (
    ClusterSnapshot,
    Config,
    Health,
    KsckReport,
    MasterReport,
    MasterTablet,
    ReplicaChecksum,
    ReplicaReport,
    ServerHealth,
    TableSnapshot,
    TabletChecksums,
    TServerReport,
    check,
)
from service.tools.output import dumps, format_table
from service.tools.table_syntax import partition_text

__all__ = [
    "add_ksck",
    "build_parser",
    "describe_key",
    "format_report",
    "gather",
    "main",
    "report_json",
]

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_CHECKSUM_TIMEOUT_S = 120.0
"""How long one replica may take to catch up and checksum (`--checksum-timeout`): it reads
the whole tablet."""
CHECKSUM_TABLETS_AT_ONCE = 8
"""Tablets checksummed at the same time: each costs every replica a pass over all its rows."""
CHECKSUM_ROUNDS = 3
"""Asks per replica at most: the leader's index, then up to two rounds at the highest index
seen, for replicas that answered below it while writes went on."""


def _hp(h: mpb.HostPortPB) -> str:
    return f"{h.host}:{h.port}"


def _config(c: mpb.RaftConfigPB) -> Config:
    return Config(
        voters=frozenset(p.permanent_uuid for p in c.peers if p.member_type != mpb.NON_VOTER),
        non_voters=frozenset(p.permanent_uuid for p in c.peers if p.member_type == mpb.NON_VOTER),
        opid_index=c.opid_index,
    )


def _replica(r: tpb.ReplicaStatusPB) -> ReplicaReport:
    cs = r.consensus_state
    has_cs = r.HasField("consensus_state")
    return ReplicaReport(
        tablet_id=r.tablet_id,
        state=mpb.ReplicaStatePB.Name(r.state).removeprefix("REPLICA_"),
        data_state=tpb.TabletDataStatePB.Name(r.data_state).removeprefix("TABLET_DATA_"),
        role=mpb.RaftRolePB.Name(r.role),
        term=r.term,
        leader_uuid=r.leader_uuid,
        committed=_config(cs.committed_config) if has_cs else None,
        pending=_config(cs.pending_config) if has_cs and cs.pending_config.peers else None,
        error=r.error.message if r.HasField("error") else "",
    )


def _why(e: TesseraError) -> str:
    """The error of a failed call, gRPC's connection failures cut to their cause."""
    message = e.message
    if message.startswith("failed to connect to all addresses"):
        return message.rsplit(": ", 1)[-1]  # "... Failed to connect ...: Connection refused"
    return message


async def _probe_master(pool: ChannelPool, address: str, timeout: float) -> MasterReport:
    try:
        r: mpb.ConnectToMasterResponsePB = await pool.master(address).ConnectToMaster(  # type: ignore[misc]
            mpb.ConnectToMasterRequestPB(), timeout=timeout
        )
    except TesseraError as e:  # the pool maps failed calls (service/common/error_mapping.py)
        return MasterReport(address, reachable=False, error=_why(e))
    return MasterReport(
        address,
        role=mpb.RaftRolePB.Name(r.role),
        term=r.term,
        leader_uuid=r.leader_uuid,
        master_addresses=tuple(_hp(h) for h in r.master_addresses),
    )


async def _probe_tserver(pool: ChannelPool, s: TabletServerInfo, timeout: float) -> TServerReport:
    base = TServerReport(s.uuid, s.address, live=s.live)
    if not s.address:
        return replace(base, reachable=False, error="no RPC address registered")
    try:
        await pool.tserver(s.address).Ping(mpb.PingRequestPB(), timeout=timeout)  # type: ignore[misc]
        resp: tpb.ListTabletsResponsePB = await pool.tserver_admin(s.address).ListTablets(  # type: ignore[misc]
            tpb.ListTabletsRequestPB(dest_uuid=s.uuid), timeout=timeout
        )
    except TesseraError as e:
        wrong = isinstance(e, WrongDestination)
        return replace(base, reachable=wrong, wrong_uuid=wrong, error=_why(e))
    return replace(base, replicas=tuple(_replica(r) for r in resp.replicas))


async def _table(
    client: TesseraClient, t: TableSummary, timeout: float
) -> tuple[TableSnapshot, Schema | None]:
    """The master's record of the table's tablets, and its schema (None when it could not be
    read) for decoding keys."""
    try:
        info = await client.open_table(t.name, refresh=True, timeout=timeout)
        locs = await client.meta.tablets(t.table_id, timeout)
    except TesseraError as e:
        return TableSnapshot(t.table_id, t.name, t.num_replicas, error=e.message), None
    tablets = tuple(
        MasterTablet(
            tablet_id=loc.tablet_id,
            config=Config(
                voters=frozenset(r.ts_uuid for r in loc.replicas if r.is_voter),
                non_voters=frozenset(r.ts_uuid for r in loc.replicas if not r.is_voter),
                opid_index=loc.config_opid_index,
            ),
            leader_uuid=next((r.ts_uuid for r in loc.replicas if r.is_leader), ""),
            partition=partition_text(info.schema, info.partition_schema, loc.partition),
        )
        for loc in locs
    )
    return TableSnapshot(t.table_id, t.name, t.num_replicas, tablets), info.schema


# --- checksums (--checksum) ------------------------------------------------------------------


def describe_key(schema: Schema, key: bytes) -> str:
    """An encoded primary key as people read it, "(id=5, host='a')"; hex if it does not
    decode under `schema` (then it is named so)."""
    cols = schema.key_columns
    try:
        values = decode_key(cols, key)
    except InvalidArgument as e:
        return f"0x{key.hex()} (does not decode: {e.message})"
    return "(" + ", ".join(f"{c.name}={v!r}" for c, v in zip(cols, values, strict=True)) + ")"


async def _checksum_replica(
    pool: ChannelPool,
    server: TServerReport,
    tablet_id: str,
    min_index: int,
    schema: Schema | None,
    timeout: float,
) -> ReplicaChecksum:
    """One replica's Checksum once it applied `min_index`; a retryable refusal is retried
    until `timeout` (service/client/retry.py)."""
    deadline = Deadline.after(timeout)
    backoff = Backoff()
    req = tpb.ChecksumRequestPB(
        dest_uuid=server.uuid,
        tablet_id=tablet_id,
        min_applied_index=min_index,
        check_partition=True,
    )
    while True:
        try:
            r: tpb.ChecksumResponsePB = await pool.tserver(server.address).Checksum(  # type: ignore[misc]
                req, timeout=deadline.attempt_timeout()
            )
            break
        except TesseraError as e:
            if not e.retryable or deadline.remaining() <= 0:
                return ReplicaChecksum(server.uuid, error=_why(e))
            try:
                await backoff.sleep(deadline)
            except TesseraError:
                return ReplicaChecksum(server.uuid, error=_why(e))
    keys = tuple(
        describe_key(schema, bytes(k)) if schema is not None else f"0x{bytes(k).hex()}"
        for k in r.out_of_partition_sample_keys
    )
    return ReplicaChecksum(
        server.uuid,
        applied_index=r.applied_index,
        rows=r.row_count,
        digest=bytes(r.digest),
        outside_rows=r.out_of_partition_rows,
        outside_sample_keys=keys,
    )


def _askable(tablet: MasterTablet, servers: dict[str, TServerReport]) -> list[TServerReport]:
    """The servers of the tablet's config that answered and host a running replica of it;
    the others are rated without a checksum (ksck.py)."""
    out = []
    for uuid in sorted(tablet.config.voters | tablet.config.non_voters):
        srv = servers.get(uuid)
        if srv is None or not srv.reachable or srv.wrong_uuid or not srv.address:
            continue
        rep = srv.replica(tablet.tablet_id)
        if rep is not None and rep.state == "RUNNING" and rep.data_state == "READY":
            out.append(srv)
    return out


async def _checksum_tablet(
    pool: ChannelPool,
    tablet: MasterTablet,
    servers: dict[str, TServerReport],
    schema: Schema | None,
    timeout: float,
) -> TabletChecksums:
    """Every running replica's checksum, at one applied index where it can be (module
    docstring, step 4)."""
    askable = _askable(tablet, servers)
    tid = tablet.tablet_id
    claims = [
        (rep.term, s.uuid)
        for s in askable
        if (rep := s.replica(tid)) is not None and rep.role == "LEADER"
    ]
    leader = max(claims)[1] if claims else tablet.leader_uuid
    got: dict[str, ReplicaChecksum] = {}
    target = 0
    first = [s for s in askable if s.uuid == leader]
    if first:
        got[leader] = await _checksum_replica(pool, first[0], tid, 0, schema, timeout)
        target = got[leader].applied_index
    todo = [s for s in askable if s.uuid not in got]
    for _ in range(CHECKSUM_ROUNDS):
        if not todo:
            break
        answers = await asyncio.gather(
            *(_checksum_replica(pool, s, tid, target, schema, timeout) for s in todo)
        )
        got.update((a.uuid, a) for a in answers)
        target = max((a.applied_index for a in got.values() if not a.error), default=0)
        todo = [s for s in askable if not got[s.uuid].error and got[s.uuid].applied_index < target]
    return TabletChecksums(tid, tuple(got[s.uuid] for s in askable))


async def _checksums(
    pool: ChannelPool,
    tables: Sequence[tuple[TableSnapshot, Schema | None]],
    reports: Sequence[TServerReport],
    timeout: float,
) -> list[TableSnapshot]:
    """The tables with their tablets' checksums, `CHECKSUM_TABLETS_AT_ONCE` tablets at a
    time."""
    servers = {s.uuid: s for s in reports}
    gate = asyncio.Semaphore(CHECKSUM_TABLETS_AT_ONCE)

    async def one(t: MasterTablet, schema: Schema | None) -> TabletChecksums:
        async with gate:
            return await _checksum_tablet(pool, t, servers, schema, timeout)

    async def table(snap: TableSnapshot, schema: Schema | None) -> TableSnapshot:
        sums = await asyncio.gather(*(one(t, schema) for t in snap.tablets))
        return replace(snap, checksums=tuple(sums))

    return list(await asyncio.gather(*(table(snap, schema) for snap, schema in tables)))


async def gather(
    masters: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    tables: Sequence[str] = (),
    credentials: Credentials | None = None,
    checksum: bool = False,
    checksum_timeout: float = DEFAULT_CHECKSUM_TIMEOUT_S,
) -> ClusterSnapshot:
    """Ask every server (module docstring); with `checksum`, every running replica of the
    chosen tables for its checksum too. NotFound if a table in `tables` does not exist; any
    other failure is recorded in the snapshot for `check` to report."""
    pool = ChannelPool(credentials)
    client = TesseraClient(masters, timeout=timeout, credentials=credentials)
    try:
        probes = await asyncio.gather(*(_probe_master(pool, a, timeout) for a in masters))
        try:
            config = await client.list_masters(timeout=timeout)
            servers = await client.list_tablet_servers(timeout=timeout)
            summaries = await client.list_tables(timeout=timeout)
        except TesseraError as e:
            return ClusterSnapshot(
                tuple(masters), tuple(probes), error=f"cannot ask the leader master: {e.message}"
            )
        uuids = {m.address: m.uuid for m in config}
        probes = [replace(p, uuid=uuids.get(p.address, "")) for p in probes]
        missing = sorted(set(tables) - {t.name for t in summaries})
        if missing:
            raise NotFound(f"no table named {', '.join(map(repr, missing))}")
        chosen = [t for t in summaries if not tables or t.name in tables]
        ts_reports, read = await asyncio.gather(
            asyncio.gather(*(_probe_tserver(pool, s, timeout) for s in servers)),
            asyncio.gather(*(_table(client, t, timeout) for t in chosen)),
        )
        if checksum:
            table_snaps = await _checksums(pool, read, ts_reports, checksum_timeout)
        else:
            table_snaps = [snap for snap, _ in read]
    finally:
        await client.aclose()
        await pool.aclose()
    return ClusterSnapshot(
        tuple(masters),
        tuple(probes),
        tuple(ts_reports),
        tuple(table_snaps),
        checksummed=checksum,
    )


# --- printing --------------------------------------------------------------------------------


def format_report(report: KsckReport) -> str:
    """Masters, tablet servers, tables by rating, unhealthy tablets with reasons, a verdict."""
    out: list[str] = []
    leader = report.masters.leader_address
    out.append("Masters")
    rows = [
        (
            m.address,
            m.uuid or None,
            (m.role if m.reachable else "UNREACHABLE"),
            m.term if m.reachable else None,
            "yes" if m.address == leader else None,
            m.error or None,
        )
        for m in report.master_reports
    ]
    out.append(format_table(rows, ["address", "uuid", "role", "term", "leader", "error"]))
    out.extend(f"  {p}" for p in report.masters.problems)
    out.append("")
    out.append("Tablet servers")
    rows2 = [(s.address, s.uuid, s.health.value, s.problem or None) for s in report.tservers]
    out.append(format_table(rows2, ["address", "uuid", "health", "problem"]))
    out.append("")
    out.append("Tables")
    cols = ["name", "health", "replicas", "tablets"] + [h.name for h in Health]
    rows3 = [
        (t.name, t.health.name, t.num_replicas, len(t.tablets), *(t.count(h) for h in Health))
        for t in report.tables
    ]
    out.append(format_table(rows3, cols))
    out.extend(f"  {t.name}: {t.error}" for t in report.tables if t.error)
    bad = report.unhealthy_tablets
    if bad:
        out.append("")
        out.append("Unhealthy tablets")
        for x in bad:
            out.append(f"{x.health.name}  tablet {x.tablet_id} of {x.table_name} ({x.partition})")
            out.extend(f"    {r}" for r in x.reasons)
    if report.checksummed:
        out.append("")
        out.append(_checksum_line(report))
    for remedy in report.remedies:
        out.append("")
        for line in remedy.splitlines():  # prose wrapped, indented commands as they are
            out.extend([line] if line.startswith(" ") else textwrap.wrap(line, width=100))
    out.append("")
    if report.error:
        out.append(f"ERROR: {report.error}")
    if report.healthy:
        n = sum(len(t.tablets) for t in report.tables)
        sums = ", checksums match" if report.checksummed else ""
        out.append(
            f"OK: {len(report.master_reports)} master(s), {len(report.tservers)} tablet "
            f"server(s), {len(report.tables)} table(s), {n} tablet(s), all healthy{sums}"
        )
    else:
        n_ts = sum(s.health is not ServerHealth.HEALTHY for s in report.tservers)
        n_tab = sum(t.health is not Health.HEALTHY for t in report.tables)
        out.append(
            f"NOT HEALTHY: masters {report.masters.health.name}, {n_ts} tablet server(s) "
            f"unhealthy, {n_tab} table(s) and {len(bad)} tablet(s) not healthy"
        )
    return "\n".join(out)


def _checksum_line(report: KsckReport) -> str:
    tablets = [x for t in report.tables for x in t.tablets]
    matched = sum(x.checksums_matched for x in tablets)
    outside = report.outside_partition_tablets
    line = (
        f"Checksums: {len(tablets)} tablet(s), {matched} replica(s) agree with a peer at the "
        "same applied index"
    )
    if outside:
        rows = sum(x.outside_partition_rows for x in outside)
        line += f"; {rows} row(s) outside their tablet's partition in {len(outside)} tablet(s)"
    return line


def report_json(report: KsckReport) -> dict[str, object]:
    return {
        "healthy": report.healthy,
        "error": report.error,
        "masters": {
            "health": report.masters.health.name,
            "leader": report.masters.leader_address,
            "problems": list(report.masters.problems),
            "servers": list(report.master_reports),
        },
        "tablet_servers": list(report.tservers),
        "tables": [
            {
                "name": t.name,
                "id": t.table_id,
                "health": t.health.name,
                "replicas": t.num_replicas,
                "error": t.error,
                "tablets": {h.name: t.count(h) for h in Health},
            }
            for t in report.tables
        ],
        "unhealthy_tablets": report.unhealthy_tablets,
        "checksum": {
            "checked": report.checksummed,
            "replicas_matched": sum(x.checksums_matched for t in report.tables for x in t.tablets),
            "rows_outside_partition": [
                {
                    "table": x.table_name,
                    "tablet_id": x.tablet_id,
                    "partition": x.partition,
                    "rows": x.outside_partition_rows,
                }
                for x in report.outside_partition_tablets
            ],
        },
        "remedies": list(report.remedies),
    }


# --- command ---------------------------------------------------------------------------------


async def ksck(args: argparse.Namespace) -> int:
    tables = [t.strip() for t in (args.tables or "").split(",") if t.strip()]
    snapshot = await gather(
        masters_of(args),
        timeout=args.timeout,
        tables=tables,
        credentials=credentials_of(args),
        checksum=args.checksum,
        checksum_timeout=args.checksum_timeout,
    )
    report = check(snapshot)
    print(dumps(report_json(report)) if args.format == "json" else format_report(report))
    return 0 if report.healthy else 1


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tables", metavar="T1,T2", help="check only these tables (default: all)")
    p.add_argument(
        "--checksum",
        action="store_true",
        help="also compare every replica's checksum and count rows outside each tablet's "
        "partition (reads every row of the checked tables)",
    )
    p.add_argument(
        "--checksum-timeout",
        type=float,
        default=DEFAULT_CHECKSUM_TIMEOUT_S,
        metavar="SECONDS",
        help="how long one replica may take to catch up and checksum "
        f"({DEFAULT_CHECKSUM_TIMEOUT_S:g})",
    )
    add_connection_args(p, timeout=DEFAULT_TIMEOUT_S)
    p.set_defaults(handler=run_command(ksck))


def add_ksck(cluster_subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `ksck` to the `cluster` group's actions (the `_SubParsersAction` of `cluster`).

    Given the top-level subparsers instead, once `cluster_cmd.register` added `cluster` to them,
    it finds the group's actions itself."""
    sub = cluster_subparsers
    if "cluster" in sub.choices:
        sub = group_actions(sub, "cluster", "a local cluster")
    p = sub.add_parser(
        "ksck",
        help="check masters, tablet servers and every tablet; exit 1 unless all healthy",
        description="Rate every tablet HEALTHY, RECOVERING, UNDER_REPLICATED,"
        " ROWS_OUTSIDE_PARTITION, CHECKSUM_MISMATCH (the last two with --checksum),"
        " CONSENSUS_MISMATCH or UNAVAILABLE; exit 0 only when everything is healthy.",
    )
    _add_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    """A parser with `ksck` at the top level and under `cluster` (tests, `python -m`)."""
    p = argparse.ArgumentParser(prog="tessera", description="Tessera cluster check")
    sub = p.add_subparsers(dest="command", required=True)
    _add_arguments(sub.add_parser("ksck", help="check the cluster"))
    cluster = sub.add_parser("cluster", help="cluster commands")
    add_ksck(cluster.add_subparsers(dest="action", required=True))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
