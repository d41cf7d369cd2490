"""`tessera security`: the cluster's CA and the certificates of its masters, tablet servers,
admins and users.

    tessera security provision --pki DIR [--master HOST:PORT]... [--tserver NAME]...
                               [--admin NAME]... [--user NAME]...
    tessera security issue --pki DIR --role ROLE --name NAME --out DIR

A cluster's CA lives in `--pki DIR/ca` (created on first use, owner-only). Each identity is a
credentials directory (`ca.pem`, `cert.pem`, `key.pem`) that a server names in its
`[security]` settings and a client passes with `--credentials`:

* a master's certificate binds the uuid its address gives it (`master-<host>-<port>`), written
  to `DIR/<host>` (`master-1` for `master-1:7051`) with the CA's key (`ca.key`): the leader
  stores the CA in sys.catalog and signs certificates on request (`tessera token create`);
* a tablet server's binds NAME as its uuid (it takes that uuid when it formats its data dir),
  written to `DIR/NAME`;
* admins (DDL, membership, repairs) and users (reads and writes) to `DIR/NAME`.

Provisioning is idempotent: an identity that exists is kept, so running it again (every
`docker compose up`) changes nothing. `tessera cluster up` does the same for local clusters by
itself, into `<dir>/pki` and `<dir>/credentials`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from service.common.errors import InvalidArgument
from service.common.pki import ROLES, ClusterPki
from service.master.master import master_uuid
from service.tools.cli_args import exit_code_of_errors

__all__ = ["provision", "register"]


def provision(
    pki: Path,
    *,
    masters: Sequence[str] = (),
    tservers: Sequence[str] = (),
    admins: Sequence[str] = (),
    users: Sequence[str] = (),
) -> list[Path]:
    """Issue (or keep) every identity named; the credentials directories written."""
    ca = ClusterPki(pki / "ca")
    out = []
    for address in masters:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgument(f"--master {address!r}: expected HOST:PORT")
        target = pki / host
        _export(ca, "master", master_uuid(address), target)
        out.append(target)
    for role, names in (("tserver", tservers), ("admin", admins), ("user", users)):
        for name in names:
            target = pki / name
            _export(ca, role, name, target)
            out.append(target)
    return out


def _export(ca: ClusterPki, role: str, name: str, target: Path) -> None:
    ca.export(role, name, target)


def _cmd_provision(args: argparse.Namespace) -> int:
    dirs = provision(
        args.pki,
        masters=args.master,
        tservers=args.tserver,
        admins=args.admin,
        users=args.user,
    )
    for d in dirs:
        print(f"credentials in {d}")
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    ca = ClusterPki(args.pki / "ca")
    ca.export(args.role, args.name, args.out)
    print(f"{args.role} {args.name!r}: credentials in {args.out}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sec = sub.add_parser(
        "security",
        help="the cluster's CA and certificates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ssub = sec.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("provision", help="issue the certificates of a whole cluster")
    p.add_argument("--pki", required=True, type=Path, help="the CA and credentials directory")
    p.add_argument("--master", action="append", default=[], metavar="HOST:PORT")
    p.add_argument("--tserver", action="append", default=[], metavar="NAME", help="its uuid")
    p.add_argument("--admin", action="append", default=[], metavar="NAME")
    p.add_argument("--user", action="append", default=[], metavar="NAME")
    p.set_defaults(handler=exit_code_of_errors(_cmd_provision))
    p = ssub.add_parser("issue", help="issue one identity into a credentials directory")
    p.add_argument("--pki", required=True, type=Path, help="the CA's directory")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--name", required=True, help="a server's uuid or a user name")
    p.add_argument("--out", required=True, type=Path, help="where ca.pem, cert.pem, key.pem go")
    p.set_defaults(handler=exit_code_of_errors(_cmd_issue))
