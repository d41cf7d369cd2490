"""Where a client finds its credentials for a secured cluster.

A credentials directory holds `ca.pem` (the cluster's CA), `cert.pem` and `key.pem` (the
client's certificate and its owner-only key), as `tessera cluster up` writes to
`<dir>/credentials` and `tessera security issue` writes anywhere.

A **credentials token** is the same three PEMs as one line of text,
`tessera-credentials-v1.<base64url>`, which `tessera token create --user NAME --token-file F`
writes (owner-only). It is a bearer credential that expires with its certificate: whoever holds
it can act as NAME until then, exactly like the directory, but it fits where one string is
easier to pass than three files (a secret store, a Spark option). A token is a certificate and
its key rather than a signed blob presented as call credentials because every port requires a
client certificate during the TLS handshake (a gRPC Python server cannot ask for an optional
one), so a caller without one could not connect to present anything.

The first of these wins:

1. the path given explicitly (`--credentials PATH`, the Spark option `credentials`): a
   directory, or a token file;
2. `<dir>/credentials` of a local cluster named with `--dir`;
3. the directory or token file in the environment variable `TESSERA_CREDENTIALS`;
4. none: the client speaks plaintext, which a secured cluster refuses during the handshake.

The Spark source also takes `token` (the text) and `token_file` (`spark_jobs.datasource`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path

from service.common.errors import InvalidArgument
from service.common.pki import IdentityFiles
from service.common.private_files import check_owner_only
from service.common.tls import Credentials

__all__ = [
    "ENV_VAR",
    "TOKEN_PREFIX",
    "credentials_from_token",
    "find_credentials",
    "load_credentials",
    "load_credentials_dir",
    "load_token_file",
    "token_of",
]

ENV_VAR = "TESSERA_CREDENTIALS"
TOKEN_PREFIX = "tessera-credentials-v1."
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----\r?\n.*?-----END \1-----\r?\n?", re.S)


def token_of(creds: Credentials) -> str:
    """The credentials token (module docstring) of `creds`: CA, certificate, key."""
    blob = creds.ca_pem.strip() + b"\n" + creds.cert_pem.strip() + b"\n" + creds.key_pem.strip()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(blob + b"\n").decode().rstrip("=")


def credentials_from_token(token: str) -> Credentials:
    """The credentials a token carries; InvalidArgument saying what is wrong with it (never
    echoing the token, which is a secret)."""
    text = token.strip()
    if not text.startswith(TOKEN_PREFIX):
        raise InvalidArgument(
            f"credentials token: expected text starting with {TOKEN_PREFIX!r} (from `tessera "
            "token create --user NAME --token-file FILE`)"
        )
    body = text[len(TOKEN_PREFIX) :]
    try:
        blob = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise InvalidArgument("credentials token: its body is not base64url") from None
    certs: list[bytes] = []
    keys: list[bytes] = []
    for m in _PEM_BLOCK.finditer(blob):
        kind = m.group(1)
        if kind == b"CERTIFICATE":
            certs.append(m.group(0))
        elif kind.endswith(b"PRIVATE KEY"):
            keys.append(m.group(0))
    if len(certs) != 2 or len(keys) != 1:
        raise InvalidArgument(
            "credentials token: expected the CA certificate, a certificate and a private key; "
            f"found {len(certs)} certificate(s) and {len(keys)} key(s)"
        )
    try:
        return Credentials.from_pems(certs[0], certs[1], keys[0])
    except InvalidArgument as e:
        raise InvalidArgument(f"credentials token: {e.message}") from None


def load_token_file(path: str | Path) -> Credentials:
    """The credentials in a token file, which must be owner-only (it holds a private key)."""
    p = Path(path)
    check_owner_only(p, "credentials token")
    try:
        text = p.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"{p}: cannot read the credentials token: {e}") from None
    try:
        return credentials_from_token(text)
    except InvalidArgument as e:
        raise InvalidArgument(f"{p}: {e.message}") from None


def load_credentials(path: str | Path) -> Credentials:
    """A credentials directory, or a token file."""
    p = Path(path)
    if p.is_file():
        return load_token_file(p)
    return load_credentials_dir(p)


def load_credentials_dir(directory: str | Path) -> Credentials:
    """The credentials in `directory`; InvalidArgument naming what is missing or unsafe."""
    d = Path(directory)
    if not d.is_dir():
        raise InvalidArgument(
            f"credentials: {d} is neither a directory (ca.pem, cert.pem, key.pem) nor a "
            "credentials token file"
        )
    return Credentials.from_files(IdentityFiles.in_dir(d))


def find_credentials(
    explicit: str | Path | None = None, cluster_dir: str | Path | None = None
) -> Credentials | None:
    """The credentials to use, by the rules of the module docstring."""
    if explicit:
        return load_credentials(explicit)
    if cluster_dir:
        local = Path(cluster_dir) / "credentials"
        if local.is_dir():
            return load_credentials_dir(local)
    env = os.environ.get(ENV_VAR)
    if env:
        return load_credentials(env)
    return None
