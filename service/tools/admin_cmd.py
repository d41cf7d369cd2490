"""`tessera table|tablet|tserver|master ...`: the data and admin commands over the client library.

    tessera table create NAME --columns "id:int64,name:string?,price:decimal(10,2)" --key id
                         [--hash COL[,COL]:BUCKETS[:SEED]]... [--range COL,...]
                         [--split VALUE[,VALUE]]... [--replicas N]
    tessera table list [--filter TEXT]
    tessera table describe NAME
    tessera table alter NAME [--add-column NAME:TYPE[?][=DEFAULT]]... [--drop-column COL]...
                             [--rename-column OLD:NEW]... [--rename NEW]
    tessera table delete NAME --yes
    tessera table scan NAME [--columns a,b] [--where "id >= 10"]... [--limit N] [--as-of TIME]
    tessera tablet locations TABLE
    tessera tserver list
    tessera master list                 (master add | remove: service.tools.master_cmd)

Every command takes `--masters HOST:PORT,...` or `--dir DIR` (a cluster started by `tessera
cluster up`), `--timeout SECONDS` (the deadline of each call to the cluster, default 30), and,
where it prints data, `--format plain|json` (scan's json is JSON lines, one row per line).

Exit codes, as everywhere in `tessera`: 0 success; 1 the cluster refused or could not be reached
(one line on stderr; an unreachable cluster names every master address tried); 2 a usage error:
bad arguments, an unknown type or column, a value that does not parse as its column's type, a
`--where` that does not parse, a request the master refuses as invalid.

Values, columns, split rows and `--where` conditions follow `service.tools.table_syntax`: values
parsed per column type (strings bare or quoted, binary as 0xHEX, timestamps as ISO 8601 in UTC
unless an offset is given), `NAME:TYPE?` for a nullable column, conditions `COL OP VALUE` with
= != < <= > >=, `COL in (V1, V2)`, `COL is [not] null`, `COL startswith V`. All but `!=` are
pushed down to the tablet servers; `!=` (which they do not offer) filters the returned rows.

Wiring: `register(subparsers)` adds the four groups to the `tessera` parser; each action
parser carries `handler(args) -> int`, which runs the command and turns errors into exit codes
itself. `main(argv)` builds a parser of just these groups (`python -m service.tools.admin_cmd`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from service.client import TableHandle, TesseraClient
from service.client.client import AlterStep
from service.client.credentials import find_credentials
from service.common.errors import InvalidArgument
from service.common.hybrid_time import from_micros, from_millis
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import AddColumn, DropColumn, RenameColumn
from service.common.tls import Credentials
from service.tools.cli_args import exit_code_of_errors, run_parsed
from service.tools.output import dumps, format_table
from service.tools.table_syntax import (
    LOCAL_OPS,
    TYPE_NAMES,
    bound_text,
    filter_local,
    key_text,
    parse_column,
    parse_hash,
    parse_value,
    parse_where,
    partition_text,
    schema_of,
    split_list,
)

__all__ = [
    "add_connection_args",
    "build_parser",
    "group_actions",
    "main",
    "masters_of",
    "register",
    "run_command",
]

Handler = Callable[[argparse.Namespace], int]

# --- connection and running ------------------------------------------------------------------


def _addresses(text: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    if not out or any(":" not in a for a in out):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
    return out


def _dir_masters(directory: Path) -> list[str]:
    """The masters of the local cluster in `directory` (its cluster.json)."""
    try:
        from service.tools.local_cluster import master_addresses
    except ImportError:  # the local cluster module is not there: read the record directly
        path = directory / "cluster.json"
        try:
            return [m["address"] for m in json.loads(path.read_text())["masters"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidArgument(f"--dir {directory}: no cluster record at {path}: {e}") from None
    return master_addresses(directory)


def masters_of(args: argparse.Namespace) -> list[str]:
    if getattr(args, "masters", None):
        return list(args.masters)
    return _dir_masters(Path(args.dir))


def credentials_of(args: argparse.Namespace) -> Credentials | None:
    """--credentials DIR, else `<--dir>/credentials`, else $TESSERA_CREDENTIALS
    (service/client/credentials.py)."""
    return find_credentials(getattr(args, "credentials", None), getattr(args, "dir", None))


def add_connection_args(
    p: argparse.ArgumentParser, *, fmt: bool = True, timeout: float = 30.0
) -> None:
    """--masters | --dir (one required), --timeout, and --format when the command prints data."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--masters", type=_addresses, metavar="HOST:PORT,...")
    where.add_argument("--dir", type=Path, help="a cluster started by `tessera cluster up`")
    p.add_argument(
        "--timeout", type=float, default=timeout, help=f"deadline of each call in s ({timeout:g})"
    )
    p.add_argument(
        "--credentials",
        type=Path,
        metavar="DIR",
        help="ca.pem, cert.pem and key.pem of a secured cluster (default: <--dir>/credentials, "
        "else $TESSERA_CREDENTIALS)",
    )
    if fmt:
        p.add_argument("--format", choices=["plain", "json"], default="plain")


def run_command(fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> Handler:
    """A handler running `fn` on a fresh event loop, errors as one stderr line and an exit code
    (`cli_args.exit_code_of_errors`)."""
    return exit_code_of_errors(lambda args: asyncio.run(fn(args)))


def client_of(args: argparse.Namespace) -> TesseraClient:
    """A client of the cluster the connection arguments name (`add_connection_args`)."""
    return TesseraClient(masters_of(args), timeout=args.timeout, credentials=credentials_of(args))


# --- argparse glue -------------------------------------------------------------------------


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse `type=` from a parser raising InvalidArgument (a usage error, exit 2)."""

    def conv(text: str) -> Any:
        try:
            return parse(text)
        except InvalidArgument as e:
            raise argparse.ArgumentTypeError(e.message) from None

    conv.__name__ = parse.__name__
    return conv


# --- table commands --------------------------------------------------------------------------


def _partitioning(info: TableHandle) -> dict[str, Any]:
    schema, ps = info.schema, info.partition_schema
    cols = [schema.column(c) for c in ps.range_columns(schema)]
    return {
        "hash": [
            {"columns": list(h.columns), "buckets": h.num_buckets, "seed": h.seed} for h in ps.hash
        ],
        "range_columns": [c.name for c in cols],
        "splits": [key_text(cols, s) for s in ps.split_rows],
        "range_bounds": [
            [bound_text(cols, lo, "-inf"), bound_text(cols, hi, "+inf")]
            for lo, hi in ps.range_bounds
        ],
    }


async def table_create(args: argparse.Namespace) -> int:
    schema = schema_of(args.columns, [k.strip() for k in args.key.split(",") if k.strip()])
    range_cols = None if args.range is None else tuple(c for c in split_list(args.range) if c)
    for name in range_cols or ():
        if not schema.has_column(name):
            raise InvalidArgument(f"--range: unknown column {name!r}")
    rcols = [schema.column(c) for c in (range_cols if range_cols is not None else schema.key)]
    splits = []
    for s in args.split:
        items = split_list(s)
        if len(items) > len(rcols):
            names = ", ".join(c.name for c in rcols)
            raise InvalidArgument(f"--split {s!r}: more values than range columns ({names})")
        splits.append(tuple(parse_value(c, v) for c, v in zip(rcols, items, strict=False)))
    ps = PartitionSchema(tuple(args.hash), RangeSchema(range_cols), split_rows=tuple(splits))
    n = len(ps.create_partitions(schema))  # validates it here, with a clear message
    async with client_of(args) as c:
        table_id = await c.create_table(args.name, schema, ps, num_replicas=args.replicas)
    print(f"created table {args.name} ({table_id}): {n} tablet(s)")
    return 0


async def table_list(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        tables = await c.list_tables(args.filter)
    if args.format == "json":
        print(dumps(tables))
        return 0
    rows = [
        (t.name, t.table_id, t.state, t.num_tablets, t.num_replicas, t.schema_version)
        for t in tables
    ]
    print(format_table(rows, ["name", "id", "state", "tablets", "replicas", "schema version"]))
    return 0


async def table_describe(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        info = await c.open_table(args.name)
        summary = next((t for t in await c.list_tables(args.name) if t.name == args.name), None)
    s = info.schema
    columns = [
        {
            "id": col.id,
            "name": col.name,
            "type": col.type_name,
            "nullable": col.nullable,
            "key": s.is_key_column(col.name),
            "default": None if col.default is None else key_text([col], [col.default]),
        }
        for col in s.columns
    ]
    out: dict[str, Any] = {
        "name": info.name,
        "id": info.table_id,
        "state": summary.state if summary else "",
        "schema_version": s.version,
        "replicas": info.num_replicas,
        "tablets": summary.num_tablets if summary else None,
        "key": list(s.key),
        "columns": columns,
        "partitioning": _partitioning(info),
    }
    if args.format == "json":
        print(dumps(out))
        return 0
    print(f"table {info.name} ({info.table_id})")
    print(
        f"state {out['state']}, schema version {s.version}, {out['tablets']} tablet(s), "
        f"{info.num_replicas} replica(s) each"
    )
    print(f"primary key ({', '.join(s.key)})")
    print()
    print(format_table(columns, ["id", "name", "type", "nullable", "key", "default"]))
    print()
    part = out["partitioning"]
    for h in part["hash"]:
        print(f"hash ({', '.join(h['columns'])}) into {h['buckets']} buckets, seed {h['seed']}")
    if part["range_columns"]:
        print(f"range ({', '.join(part['range_columns'])})", end="")
        print(f", splits at {', '.join(part['splits'])}" if part["splits"] else ", no splits")
        for lo, hi in part["range_bounds"]:
            print(f"range bound [{lo}, {hi})")
    else:
        print("no range partitioning")
    return 0


async def table_alter(args: argparse.Namespace) -> int:
    steps: list[AlterStep] = list(args.steps or [])
    if not steps and args.rename is None:
        raise InvalidArgument(
            "nothing to alter: give --add-column, --drop-column, --rename-column or --rename"
        )
    async with client_of(args) as c:
        version = await c.alter_table(args.name, steps, new_name=args.rename)
    name = args.rename or args.name
    print(f"altered table {name}: schema version {version}")
    return 0


async def table_delete(args: argparse.Namespace) -> int:
    if not args.yes:
        raise InvalidArgument(f"refusing to delete table {args.name!r} without --yes")
    async with client_of(args) as c:
        table_id = await c.delete_table(args.name)
    print(f"deleted table {args.name} ({table_id})")
    return 0


def parse_as_of(text: str) -> int:
    """`--as-of`: a hybrid timestamp (the last of its millisecond) for an ISO 8601 time, a
    number of milliseconds since the epoch, or "now"; InvalidArgument otherwise."""
    t = text.strip()
    if t.lower() == "now":
        return from_micros(time.time_ns() // 1000)
    if t.isdigit():
        return from_millis(int(t))
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            f"--as-of: {text!r} is not a time (ISO 8601 like 2026-11-29T10:00:00Z, "
            "milliseconds since the epoch, or now)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return from_millis(int(when.timestamp() * 1000))


async def table_scan(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        info = await c.open_table(args.name)
        schema = info.schema
        projection = None if args.columns is None else [x for x in split_list(args.columns) if x]
        for name in projection or ():
            if not schema.has_column(name):
                raise InvalidArgument(f"--columns: unknown column {name!r} of table {args.name!r}")
        preds = [parse_where(schema, w) for w in args.where]
        pushed = [p for p in preds if p.op not in LOCAL_OPS]
        local = [p for p in preds if p.op in LOCAL_OPS]
        # Columns a local filter needs are fetched too, and dropped after filtering.
        fetch = projection
        if projection is not None:
            fetch = projection + [p.column for p in local if p.column not in projection]
        limit = 0 if local else args.limit
        snapshot = parse_as_of(args.as_of) if args.as_of else None
        table = await c.scan(
            args.name, projection=fetch, predicates=pushed, limit=limit, snapshot=snapshot
        )
    for p in local:
        table = filter_local(table, schema, p)
    if projection is not None:
        table = table.select(projection)
    if args.limit:
        table = table.slice(0, args.limit)
    rows = table.to_pylist()
    if args.format == "json":
        for r in rows:
            print(dumps(r, lines=True))
        return 0
    print(format_table(rows, table.column_names, null="NULL"))
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return 0


# --- tablet, tserver, master -----------------------------------------------------------------


def _role(is_leader: bool, is_voter: bool) -> str:
    return "LEADER" if is_leader else ("FOLLOWER" if is_voter else "LEARNER")


async def tablet_locations(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        info = await c.open_table(args.table)
        locs = await c.table_locations(args.table)
    tablets: list[dict[str, Any]] = []
    rows = []
    for t in locs:
        part = partition_text(info.schema, info.partition_schema, t.partition)
        reps = [
            {"uuid": r.ts_uuid, "address": r.address, "role": _role(r.is_leader, r.is_voter)}
            for r in t.replicas
        ]
        tablets.append(
            {
                "tablet_id": t.tablet_id,
                "partition": part,
                "config_opid_index": t.config_opid_index,
                "replicas": reps,
            }
        )
        rows.append((t.tablet_id, part, ", ".join(f"{r['address']} {r['role']}" for r in reps)))
    if args.format == "json":
        print(dumps(tablets))
        return 0
    print(format_table(rows, ["tablet", "partition", "replicas"]))
    return 0


async def tserver_list(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        servers = await c.list_tablet_servers()
    if args.format == "json":
        print(dumps(servers))
        return 0
    rows = [
        (
            s.uuid,
            s.address,
            "live" if s.live else "NOT LIVE",
            s.millis_since_heartbeat,
            s.num_replicas,
            s.num_leaders,
            s.location or None,
        )
        for s in servers
    ]
    cols = ["uuid", "address", "state", "ms since heartbeat", "replicas", "leaders", "location"]
    print(format_table(rows, cols))
    return 0


async def master_list(args: argparse.Namespace) -> int:
    async with client_of(args) as c:
        masters = await c.list_masters()
    if args.format == "json":
        print(dumps(masters))
        return 0
    rows = [
        (
            m.uuid,
            m.address,
            m.role,
            m.member_type,
            m.term or None,
            m.committed_index,
            m.error or None,
        )
        for m in masters
    ]
    cols = ["uuid", "address", "role", "member", "term", "committed index", "error"]
    print(format_table(rows, cols))
    return 0


# --- parser ----------------------------------------------------------------------------------


def _step(kind: str) -> Callable[[str], AlterStep]:
    def parse(text: str) -> AlterStep:
        if kind == "add":
            return parse_column(text)
        if kind == "drop":
            if not text.strip():
                raise InvalidArgument("--drop-column: a column name is required")
            return DropColumn(text.strip())
        old, sep, new = text.partition(":")
        if not sep or not old.strip() or not new.strip():
            raise InvalidArgument(f"--rename-column {text!r}: expected OLD:NEW")
        return RenameColumn(old.strip(), new.strip())

    parse.__name__ = f"{kind} column"
    return _arg(parse)


def _columns_arg(text: str) -> list[AddColumn]:
    return [parse_column(c) for c in split_list(text) if c]


def _add_table(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    table = sub.add_parser("table", help="create, list, describe, alter, delete and scan tables")
    tsub = table.add_subparsers(dest="action", required=True)

    p = tsub.add_parser("create", help="create a table and wait until its tablets run")
    p.add_argument("name")
    p.add_argument(
        "--columns",
        required=True,
        type=_arg(_columns_arg),
        help='"NAME:TYPE[?][=DEFAULT],..." (? nullable); TYPE: ' + " ".join(TYPE_NAMES),
    )
    p.add_argument("--key", required=True, help="primary key columns: COL[,COL...]")
    p.add_argument(
        "--hash",
        action="append",
        default=[],
        type=_arg(parse_hash),
        metavar="COLS:BUCKETS[:SEED]",
        help="a hash dimension (repeatable)",
    )
    p.add_argument("--range", metavar="COL,...", help="range columns (default: the key; '' none)")
    p.add_argument(
        "--split",
        action="append",
        default=[],
        metavar="VALUE[,VALUE]",
        help="one split point on the range columns (a value per range column, comma "
        "separated); repeat the flag for each split: --split 100 --split 200 makes three "
        "range partitions",
    )
    p.add_argument("--replicas", type=int, default=0, help="replication factor (master default)")
    add_connection_args(p, fmt=False)
    p.set_defaults(handler=run_command(table_create))

    p = tsub.add_parser("list", help="live tables")
    p.add_argument("--filter", default="", help="only names containing this")
    add_connection_args(p)
    p.set_defaults(handler=run_command(table_list))

    p = tsub.add_parser("describe", help="schema, partitioning, tablets and replication")
    p.add_argument("name")
    add_connection_args(p)
    p.set_defaults(handler=run_command(table_describe))

    p = tsub.add_parser("alter", help="add, drop and rename columns (one schema version); rename")
    p.add_argument("name")
    p.add_argument(
        "--add-column",
        dest="steps",
        action="append",
        type=_step("add"),
        metavar="NAME:TYPE[?][=DEFAULT]",
        help="add a column (repeatable): `?` makes it nullable; a NOT NULL column needs "
        "`=DEFAULT`, which existing rows get (e.g. note:string?  or  n:int64=0)",
    )
    p.add_argument(
        "--drop-column",
        dest="steps",
        action="append",
        type=_step("drop"),
        metavar="COL",
        help="drop a column (repeatable; not a key column)",
    )
    p.add_argument(
        "--rename-column",
        dest="steps",
        action="append",
        type=_step("rename"),
        metavar="OLD:NEW",
        help="rename a column (repeatable)",
    )
    p.add_argument("--rename", metavar="NEW_NAME", help="rename the table")
    add_connection_args(p, fmt=False)
    p.set_defaults(handler=run_command(table_alter))

    p = tsub.add_parser("delete", help="delete a table (needs --yes)")
    p.add_argument("name")
    p.add_argument("--yes", action="store_true", help="really delete it")
    add_connection_args(p, fmt=False)
    p.set_defaults(handler=run_command(table_delete))

    p = tsub.add_parser("scan", help="print rows (plain table or JSON lines)")
    p.add_argument("name")
    p.add_argument("--columns", metavar="COL,...", help="columns to print (default: all)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="CONDITION",
        help="`col >= 10`, `col != 3`, `col in (1,2)`, `col is [not] null`, "
        "`col startswith 'x'`, `col like 'a%b_'` (repeatable: all must hold)",
    )
    p.add_argument("--limit", type=int, default=0, help="at most N rows (0: all)")
    p.add_argument(
        "--as-of",
        metavar="TIME",
        help="read the table as of TIME (a snapshot, docs/design/tablets.md#R3): ISO 8601 "
        "(2026-11-29T10:00:00Z; no zone: UTC), milliseconds since the epoch, or 'now'; within "
        "tablet_history_max_age (15 minutes by default)",
    )
    add_connection_args(p)
    p.set_defaults(handler=run_command(table_scan))


def group_actions(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The actions of group `name`: its existing subparsers when the parser already has the
    group (cli.py's `master run`, `tserver run`), else a new group."""
    existing = sub.choices.get(name)
    if existing is not None:
        for action in existing._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action
        raise ValueError(f"group {name!r} exists without subcommands")
    return sub.add_parser(name, help=help).add_subparsers(dest="action", required=True)


def _add_others(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = group_actions(sub, "tablet", "tablets and where their replicas are").add_parser(
        "locations", help="each tablet of TABLE: partition, replicas and their roles"
    )
    p.add_argument("table")
    add_connection_args(p)
    p.set_defaults(handler=run_command(tablet_locations))

    p = group_actions(sub, "tserver", "tablet servers").add_parser(
        "list", help="tablet servers the leader master knows, with liveness and load"
    )
    add_connection_args(p)
    p.set_defaults(handler=run_command(tserver_list))

    p = group_actions(sub, "master", "masters").add_parser(
        "list", help="masters with role, term and committed index"
    )
    add_connection_args(p)
    p.set_defaults(handler=run_command(master_list))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `table`, `tablet`, `tserver` and `master` groups; each action sets `handler`.

    `master` and `tserver` already exist in cli.py (their `run` action): call this after they
    are added and `list` joins them; a group that does not exist yet is created."""
    _add_table(sub)
    _add_others(sub)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera", description="Tessera table and admin commands")
    register(p.add_subparsers(dest="command", required=True))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
