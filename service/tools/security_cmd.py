"""`tessera security`: the cluster's CA and the certificates of its masters, tablet servers,
admins and users.

    tessera security provision --pki DIR [--master [NAME=]HOST:PORT]... [--tserver NAME]...
                               [--admin NAME]... [--user NAME]...
    tessera security issue --pki DIR --role ROLE --name NAME --out DIR

Provisioning writes one directory per party, so that each service is given its own and nothing
else (docs/design/security.md#R14):

    DIR/                 owner-only (0700), as every directory below; every file 0600
      ca/                the CA: ca.pem, ca.key, and a copy of every identity issued. Only
                         `tessera security` reads it; mount it into no server.
      master-1/          a master (for --master master-1:7051): ca.pem, cert.pem, key.pem and
                         the CA's key ca.key (the leader stores the CA in sys.catalog and signs
                         certificates on request: `tessera token create`, renewals, joins)
      tserver-1/         a tablet server (--tserver tserver-1): ca.pem, cert.pem, key.pem
      admin/, alice/     admins (DDL, membership, repairs) and users (reads and writes): the same

A credentials directory (`ca.pem`, `cert.pem`, `key.pem`) is what a server names in its
`[security]` settings and a client passes with `--credentials`. A master's certificate binds
the uuid its address gives it (`master-<host>-<port>`) and goes to `DIR/<host>`, or to
`DIR/NAME` for `--master NAME=HOST:PORT` (masters sharing a host need that); a tablet
server's binds NAME as its uuid (it takes that uuid when it formats its data dir); admins' and
users' bind NAME. Only masters' directories hold `ca.key`: one left in another's (a renamed
party) is removed.

Provisioning is idempotent: an identity that exists in `DIR/ca` is kept, so running it again
(every `docker compose up`) changes nothing. `tessera cluster up` lays out a local cluster the
same way by itself, in `<dir>/pki` (service/tools/local_cluster.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from service.common.errors import InvalidArgument
from service.common.pki import ROLES, ClusterPki, IdentityFiles, ca_key_file
from service.master.master import master_uuid
from service.tools.cli_args import exit_code_of_errors

__all__ = ["CA_DIR", "provision", "register"]

CA_DIR = "ca"
"""The CA's own directory under `--pki`: no party's directory may take this name."""


def _owner_only_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def provision(
    pki: Path,
    *,
    masters: Sequence[str] = (),
    tservers: Sequence[str] = (),
    admins: Sequence[str] = (),
    users: Sequence[str] = (),
) -> list[Path]:
    """Issue (or keep) every identity named, one directory each (module docstring); the
    credentials directories written. Names that would share a directory, or take the CA's, are
    refused before anything is written."""
    wanted: list[tuple[str, str, str]] = []  # (role, identity name, directory name)
    for spec in masters:
        where, eq, address = spec.rpartition("=")
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or (eq and not where):
            raise InvalidArgument(f"--master {spec!r}: expected [NAME=]HOST:PORT")
        wanted.append(("master", master_uuid(address), where or host))
    for role, names in (("tserver", tservers), ("admin", admins), ("user", users)):
        wanted += [(role, name, name) for name in names]
    seen: dict[str, str] = {}
    for role, name, where in wanted:
        if where in (CA_DIR, "", ".", "..") or "/" in where or where.startswith("."):
            raise InvalidArgument(
                f"{role} {name!r}: its directory would be {pki / where}, which is not a plain"
                f" name or is the CA's own ({CA_DIR!r})"
            )
        if where in seen:
            raise InvalidArgument(
                f"{role} {name!r} and {seen[where]} would share the directory {pki / where}"
            )
        seen[where] = f"{role} {name!r}"
    _owner_only_dir(pki)
    ca = ClusterPki(pki / CA_DIR)
    out = []
    for role, name, where in wanted:
        _export(ca, role, name, pki / where)
        out.append(pki / where)
    return out


def _export(ca: ClusterPki, role: str, name: str, target: Path) -> IdentityFiles:
    """Write one party's credentials directory: owner-only, and with the CA's key only if it
    is a master's (docs/design/security.md#R14)."""
    if target.resolve() == ca.directory.resolve():
        raise InvalidArgument(f"{target} is the CA's own directory: write credentials elsewhere")
    _owner_only_dir(target)
    files = ca.export(role, name, target)
    if role != "master":
        ca_key_file(files.ca_file).unlink(missing_ok=True)
    return files


def _cmd_provision(args: argparse.Namespace) -> int:
    dirs = provision(
        args.pki,
        masters=args.master,
        tservers=args.tserver,
        admins=args.admin,
        users=args.user,
    )
    for d in dirs:
        extra = " (with the CA's key: a master)" if ca_key_file(d / "ca.pem").exists() else ""
        print(f"credentials in {d}{extra}")
    print(f"the CA in {args.pki / CA_DIR}: give this directory to no server")
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    ca = ClusterPki(args.pki / CA_DIR)
    _export(ca, args.role, args.name, args.out)
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
    p.add_argument(
        "--master",
        action="append",
        default=[],
        metavar="[NAME=]HOST:PORT",
        help="its directory is NAME, by default HOST",
    )
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
