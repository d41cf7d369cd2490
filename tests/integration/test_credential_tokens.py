"""Credentials tokens: a user's short-lived credentials as one line of text
(`tessera token create --user NAME --token-file FILE`), taken by `--credentials FILE`, the
client and the Spark options `token` / `token_file`. The token is the user's certificate and
key, so what the cluster accepts and refuses is what it does for the directory form; these
tests check the encoding, the file's protection and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.client.credentials import (
    TOKEN_PREFIX,
    credentials_from_token,
    find_credentials,
    load_credentials_dir,
    load_token_file,
    token_of,
)
from service.client.sync import SyncClient
from service.common.errors import InvalidArgument
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64)], key="id")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("tokens"), num_tservers=1) as c:
        with c.client() as admin:
            admin.call(
                "create_table",
                "tok_t",
                SCHEMA,
                PartitionSchema(range=RangeSchema(("id",))),
                num_replicas=1,
            )
        yield c


def _cli(cluster: MiniCluster, *args: str, creds: str) -> subprocess.CompletedProcess[str]:
    where = ["--masters", ",".join(cluster.master_addresses), "--credentials", creds]
    return subprocess.run(
        [sys.executable, "-m", "service.tools.cli", *args, *where],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_token_round_trips_and_bad_ones_are_refused_without_echoing_them(
    cluster: MiniCluster,
) -> None:
    user_dir = cluster.credentials_dir("user", "tok-unit")
    assert user_dir is not None
    creds = load_credentials_dir(user_dir)
    token = token_of(creds)
    assert token.startswith(TOKEN_PREFIX) and "\n" not in token and "=" not in token
    back = credentials_from_token(token + "\n")
    assert back == creds
    body = token[len(TOKEN_PREFIX) :]
    for bad, why in [
        (body, "expected text starting with"),
        (TOKEN_PREFIX + body[: len(body) // 8 * 4], "expected the CA certificate"),
        (TOKEN_PREFIX + "a", "not base64url"),
        (TOKEN_PREFIX, "found 0 certificate"),
    ]:
        with pytest.raises(InvalidArgument, match=why) as e:
            credentials_from_token(bad)
        assert body[40:80] not in e.value.message


def test_token_create_writes_an_owner_only_token_file_the_cli_and_client_accept(
    cluster: MiniCluster, tmp_path: Path
) -> None:
    admin = str(cluster.credentials_dir())
    token_file = tmp_path / "ann.token"
    r = _cli(
        cluster, "token", "create", "--user", "ann", "--token-file", str(token_file), creds=admin
    )
    assert r.returncode == 0, r.stderr
    assert f"credentials of user 'ann' in {token_file}" in r.stdout
    assert (token_file.stat().st_mode & 0o077) == 0
    creds = load_token_file(token_file)
    assert (creds.identity.role, creds.identity.name) == ("user", "ann")
    assert find_credentials(token_file) == creds  # --credentials PATH takes a token file too

    # A credential, not a privilege: ann sees no table until granted one.
    r = _cli(cluster, "table", "list", "--format", "json", creds=str(token_file))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
    with SyncClient(cluster.master_addresses, timeout=30, credentials=cluster.credentials()) as c:
        c.call("grant", "tok_t", "ann", ["read"])
    r = _cli(cluster, "table", "list", "--format", "json", creds=str(token_file))
    assert r.returncode == 0, r.stderr
    assert [t["name"] for t in json.loads(r.stdout)] == ["tok_t"]

    # A token file others may read is refused, naming it; the key may have leaked.
    os.chmod(token_file, 0o640)
    r = _cli(cluster, "table", "list", creds=str(token_file))
    assert r.returncode != 0 and f"{token_file}" in r.stderr and "chmod 600" in r.stderr


def test_token_create_options_are_checked(cluster: MiniCluster, tmp_path: Path) -> None:
    admin = str(cluster.credentials_dir())
    r = _cli(cluster, "token", "create", "--join", "--token-file", str(tmp_path / "j"), creds=admin)
    assert r.returncode != 0 and "--token-file is for --user" in r.stderr
    assert not (tmp_path / "j").exists()
    r = _cli(cluster, "token", "create", "--user", "x", creds=admin)
    assert r.returncode != 0 and "--out" in r.stderr and "--token-file" in r.stderr
    both = ["--out", str(tmp_path / "d"), "--token-file", str(tmp_path / "f")]
    r = _cli(cluster, "token", "create", "--user", "x", *both, creds=admin)
    assert r.returncode != 0 and "not allowed with" in r.stderr
