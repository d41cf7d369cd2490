"""Where a client finds its credentials for a secured cluster.

A credentials directory holds `ca.pem` (the cluster's CA), `cert.pem` and `key.pem` (the
client's certificate and its owner-only key), as `tessera cluster up` writes to
`<dir>/credentials` and `tessera security issue` writes anywhere. The first of these wins:

1. the directory given explicitly (`--credentials DIR`, the Spark option `credentials`);
2. `<dir>/credentials` of a local cluster named with `--dir`;
3. the directory in the environment variable `TESSERA_CREDENTIALS`;
4. none: the client speaks plaintext, which a secured cluster refuses during the handshake.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.common.errors import InvalidArgument
from service.common.pki import IdentityFiles
from service.common.tls import Credentials

__all__ = ["ENV_VAR", "find_credentials", "load_credentials_dir"]

ENV_VAR = "TESSERA_CREDENTIALS"


def load_credentials_dir(directory: str | Path) -> Credentials:
    """The credentials in `directory`; InvalidArgument naming what is missing or unsafe."""
    d = Path(directory)
    if not d.is_dir():
        raise InvalidArgument(f"credentials: {d} is not a directory (ca.pem, cert.pem, key.pem)")
    return Credentials.from_files(IdentityFiles.in_dir(d))


def find_credentials(
    explicit: str | Path | None = None, cluster_dir: str | Path | None = None
) -> Credentials | None:
    """The credentials to use, by the rules of the module docstring."""
    if explicit:
        return load_credentials_dir(explicit)
    if cluster_dir:
        local = Path(cluster_dir) / "credentials"
        if local.is_dir():
            return load_credentials_dir(local)
    env = os.environ.get(ENV_VAR)
    if env:
        return load_credentials_dir(env)
    return None
