"""`tessera token create`: short-lived credentials signed by the cluster, minted by an admin.

    tessera token create --user NAME [--ttl 1d] (--out DIR | --token-file FILE)
                                                            (--masters A,B | --dir D)
    tessera token create --join [--ttl 1h] --out DIR        (same; --credentials DIR: an admin)

`--user` writes a credentials directory for user NAME (`ca.pem`, `cert.pem`, `key.pem`, all
owner-only) valid for `--ttl` (default 1 day, at most 7 days): give it to a person or a job,
which passes it with `--credentials DIR` or the Spark option `credentials`. It grants only what
`tessera grant` gave NAME, and stops working when it expires. `--token-file FILE` writes the
same credentials as one line of text instead (owner-only; `service/client/credentials.py` says
why it is a certificate and key): `--credentials FILE` takes it, and so do the Spark options
`token_file` (its path) and `token` (its text; no plan or UI shows it).

`--join` writes a join credential (default 1 hour, at most 1 day): put it in a new tablet
server's credentials directory (`<data_dir>/credentials`, or where `[security]` points) and
start the server; it asks the leader master for a certificate of its own uuid, replaces the
join credential with it, and starts. A join credential enrolls only servers no master knows.

The key is generated here and never leaves this machine: the master signs a certificate
request. TTL: seconds, or a number with s, m, h or d.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from pathlib import Path

from service.client.credentials import load_credentials_dir, token_of
from service.common.enrollment import request_certificate
from service.common.errors import InvalidArgument, PermissionDenied
from service.common.private_files import private_dir, write_private_file
from service.tools.admin_cmd import add_connection_args, credentials_of, masters_of, run_command

__all__ = ["parse_ttl", "register"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_ttl(text: str) -> int:
    """Seconds from "90", "30m", "12h", "7d"."""
    t = text.strip().lower()
    unit = _UNITS.get(t[-1:], 0)
    number = t[:-1] if unit else t
    if not number.isdigit() or int(number) <= 0:
        raise InvalidArgument(
            f"--ttl: expected a positive duration like 3600, 30m, 12h or 7d, got {text!r}"
        )
    return int(number) * (unit or 1)


async def token_create(args: argparse.Namespace) -> int:
    creds = credentials_of(args)
    if creds is None:
        raise PermissionDenied("token create: an admin's credentials are needed (--credentials)")
    if args.join:
        role, name = "join", f"join-{secrets.token_hex(8)}"
    else:
        role, name = "user", args.user
    if args.join and args.token_file:
        raise InvalidArgument(
            "--token-file is for --user; a join credential is a directory (--out)"
        )
    if args.out is None and args.token_file is None:
        raise InvalidArgument("token create: say where to write it: --out DIR or --token-file FILE")
    ttl = parse_ttl(args.ttl) if args.ttl else 0
    with tempfile.TemporaryDirectory(prefix="tessera-token-") as scratch:
        out = args.out or private_dir(Path(scratch) / "credentials")
        enrolled = await request_certificate(
            masters_of(args), creds, role, name, out, validity_s=ttl, timeout=args.timeout
        )
        if args.token_file is not None:
            token = token_of(load_credentials_dir(out))
            write_private_file(args.token_file, (token + "\n").encode())
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(enrolled.expire_time_us / 1e6))
    what = "join credential" if args.join else f"credentials of user {name!r}"
    print(f"{what} in {args.out or args.token_file}, valid until {until}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser(
        "token",
        help="short-lived user credentials and tablet server join credentials",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = token.add_subparsers(dest="action", required=True)
    p = tsub.add_parser("create", help="mint a user credential (--user) or a join credential")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", metavar="NAME", help="a user's short-lived credentials")
    who.add_argument("--join", action="store_true", help="a tablet server join credential")
    p.add_argument("--ttl", help="lifetime: 3600, 30m, 12h, 7d (default 1d; --join 1h)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, metavar="DIR", help="write a credentials directory")
    where.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="--user: write the credentials as one token line (owner-only) instead",
    )
    add_connection_args(p, fmt=False)
    p.set_defaults(handler=run_command(token_create))
