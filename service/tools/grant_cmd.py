"""`tessera grant` / `tessera revoke`: per-table privileges of users.

    tessera grant TABLE USER PRIVILEGE...  (--masters HOST:PORT,... | --dir DIR) [--credentials DIR]
    tessera revoke TABLE USER PRIVILEGE... (same connection options)
    tessera grant list [--table TABLE] [--user USER] (same connection options) [--format json]

PRIVILEGE is `read` (scan; see the schema and locations), `write` (insert, update, upsert,
delete) or `alter` (AlterTable); several may be given, separated by spaces or commas. A user is
the name in their client certificate (role `user`). Admin certificates hold every privilege
and need no grant. Changes are replicated like DDL, exactly once per command even across a
master failover. A revoked privilege keeps working until the user's current authz token
expires (the master's `authz_token_ttl_ms`, 5 minutes by default).
"""

from __future__ import annotations

import argparse

from service.client.client import Grant
from service.common.errors import InvalidArgument
from service.common.tokens import Privilege
from service.tools.admin_cmd import add_connection_args, client_of, run_command
from service.tools.output import dumps, format_table

__all__ = ["register"]


def _privileges(words: list[str]) -> list[str]:
    out = [w for text in words for w in text.replace(",", " ").split()]
    if not out:
        raise InvalidArgument("name at least one privilege: read, write or alter")
    return [Privilege.parse(w).value for w in out]


def _print(grants: list[Grant], fmt: str) -> None:
    if fmt == "json":
        print(dumps(grants))
        return
    rows = [(g.table_name, g.user, ", ".join(g.privileges) or "-") for g in grants]
    print(format_table(rows, ["table", "user", "privileges"]))


async def _change(args: argparse.Namespace, *, revoke: bool) -> int:
    words = list(args.words)
    if len(words) < 3:
        raise InvalidArgument(
            f"usage: tessera {'revoke' if revoke else 'grant'} TABLE USER PRIVILEGE... "
            "(or: tessera grant list)"
        )
    table, user, privileges = words[0], words[1], _privileges(words[2:])
    async with client_of(args) as c:
        grant = await c.grant(table, user, privileges, revoke=revoke)
    _print([grant], args.format)
    return 0


async def grant_main(args: argparse.Namespace) -> int:
    if args.words and args.words[0] == "list":
        if len(args.words) > 1:
            raise InvalidArgument("grant list: use --table and --user to filter")
        async with client_of(args) as c:
            grants = await c.list_grants(args.table or "", args.user or "")
        _print(grants, args.format)
        return 0
    if args.table or args.user:
        raise InvalidArgument("--table and --user filter `tessera grant list` only")
    return await _change(args, revoke=False)


async def revoke_main(args: argparse.Namespace) -> int:
    return await _change(args, revoke=True)


def _parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, words: str
) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name, help=help, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("words", nargs="*", metavar=words)
    return p


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = _parser(
        sub,
        "grant",
        "give a user privileges on a table (read, write, alter); `grant list` shows them",
        "TABLE USER PRIVILEGE... | list",
    )
    p.add_argument("--table", help="grant list: only this table")
    p.add_argument("--user", help="grant list: only this user")
    add_connection_args(p)
    p.set_defaults(handler=run_command(grant_main))
    p = _parser(
        sub, "revoke", "take privileges on a table away from a user", "TABLE USER PRIVILEGE..."
    )
    add_connection_args(p)
    p.set_defaults(handler=run_command(revoke_main))
