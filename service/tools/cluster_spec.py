"""What a cluster is, and how one of its masters or tablet servers is started.

A `ClusterSpec` says what every launcher of masters and tablet servers is asked for: how many
of each, the security mode, the timing preset, the conf files and each kind's `--set`
overrides, and the base directory. The test clusters (`service.testing.cluster.Cluster`, and
the `MasterCluster` and `MiniCluster` built on it) and the user's local cluster
(`local_cluster`, behind `tessera cluster up`) are all given one; they differ in where they put
a server's files and what they keep of its process (`launcher`'s module docstring), not in
what a server is started with.

Theory of operation
-------------------
One command line. `ClusterSpec.command` is the only place that says how a master or a tablet
server is started: its conf file, then the settings its launcher owns (`MANAGED_KEYS`: data
dir, bind address, a master's advertised address, every master's address, a status page on a
free loopback port), `join_existing` for a master joining a running group, its identity, and
last the timing preset and the overrides, so a test's `--set` wins over everything (a status
page on a wildcard address, say). `tessera cluster up` refuses overrides of the managed keys
before it makes its spec (`local_cluster`): its record must know where its servers are.

Identity. A secure cluster gives every server a certificate of its own (`security.*` settings
naming its files, `launcher.security_overrides`); an insecure one says `security.mode=insecure`.
Overrides of a kind that set any `security.*` themselves take over that kind's security
entirely (a comparison run, certificates from elsewhere): the launcher then issues nothing.

Timing. `"fast"` (`FAST_RAFT` for masters, `FAST_TSERVER` for tablet servers) elects within
about a second of a kill and heartbeats five times a second, for tests; `"conf"` keeps the conf
files' timing, the product's, for the user's local cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.common.config import parse_override
from service.common.errors import InvalidArgument
from service.common.pki import IdentityFiles
from service.tools import launcher
from service.tools.launcher import CONF_DIR

__all__ = ["FAST_RAFT", "FAST_TSERVER", "KINDS", "MANAGED_KEYS", "MASTER_CONF", "MODULES"]
__all__ += ["TIMING", "TSERVER_CONF", "ClusterSpec", "settings_of"]

MASTER_CONF = CONF_DIR / "master.toml"
TSERVER_CONF = CONF_DIR / "tserver.toml"
KINDS = ("master", "tserver")
MODULES: Mapping[str, str] = {"master": "service.master", "tserver": "service.tserver"}
"""The module each kind runs as (`python -m MODULE`)."""
MANAGED_KEYS = ("data_dir", "rpc_bind", "advertised_address", "master_addresses", "http_bind")
"""Settings the launcher sets itself for every server (module docstring); `tessera cluster up`
refuses an override of one."""

FAST_RAFT: Mapping[str, str] = {
    "raft.tick_interval_ms": "50",
    "raft.heartbeat_interval_ms": "100",
    "raft.election_timeout_ms": "500",
    "raft.election_jitter_ms": "250",
}
"""Raft timing for tests: elections within about a second of a kill. The WAL keeps its real
fsync and preallocation: tests run the durable path the product runs."""

FAST_TSERVER: Mapping[str, str] = {
    **FAST_RAFT,
    "heartbeat_interval_ms": "200",
}
"""Test timing: Raft elections within about a second, heartbeats five times a second."""

TIMING: Mapping[str, Mapping[str, Mapping[str, str]]] = {
    "fast": {"master": FAST_RAFT, "tserver": FAST_TSERVER},
    "conf": {"master": {}, "tserver": {}},
}
"""The timing presets (module docstring), each kind's settings."""

SECURITY_MODES = ("secure", "insecure")


def settings_of(overrides: Mapping[str, str]) -> tuple[str, ...]:
    """`("k=v", ...)`: a mapping of overrides as `--set` values."""
    return tuple(f"{k}={v}" for k, v in overrides.items())


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster of `masters` masters and `tservers` tablet servers under `base`. Overrides
    are `--set` values ("key=value"), later ones of a key winning; a malformed one, a count
    below one master or an unknown mode or preset is refused (InvalidArgument) when the spec
    is made."""

    base: Path
    masters: int = 3
    tservers: int = 3
    security: str = "secure"
    """"secure" (mutual TLS, certificates from a CA made for the cluster) or "insecure"."""
    timing: str = "fast"
    master_overrides: tuple[str, ...] = ()
    tserver_overrides: tuple[str, ...] = ()
    master_conf: Path = field(default=MASTER_CONF)
    tserver_conf: Path = field(default=TSERVER_CONF)

    def __post_init__(self) -> None:
        if self.masters < 1 or self.tservers < 0:
            raise InvalidArgument(
                f"need >= 1 master and >= 0 tablet servers, got {self.masters}/{self.tservers}"
            )
        if self.security not in SECURITY_MODES:
            raise InvalidArgument(f"security {self.security!r}: expected one of {SECURITY_MODES}")
        if self.timing not in TIMING:
            raise InvalidArgument(f"timing {self.timing!r}: expected one of {tuple(TIMING)}")
        for text in (*self.master_overrides, *self.tserver_overrides):
            parse_override(text)  # "key=value", or ConfigError naming it

    @property
    def secure(self) -> bool:
        return self.security == "secure"

    def conf(self, kind: str) -> Path:
        return self.master_conf if kind == "master" else self.tserver_conf

    def overrides(self, kind: str) -> tuple[str, ...]:
        """The overrides `kind` is given (`master_overrides` or `tserver_overrides`)."""
        return self.master_overrides if kind == "master" else self.tserver_overrides

    def issues_identity(self, kind: str) -> bool:
        """Whether the launcher gives servers of `kind` their security settings: unless the
        kind's overrides set any `security.*` themselves (module docstring)."""
        return not any(s.strip().startswith("security.") for s in self.overrides(kind))

    def settings(
        self,
        kind: str,
        *,
        data_dir: Path | str,
        address: str,
        master_addresses: Iterable[str],
        identity: IdentityFiles | None,
        join: bool = False,
    ) -> list[str]:
        """The `--set`s of a server of `kind` (module docstring, in that order). `address` is
        "" for a tablet server's first start (it binds port 0); `identity` is the server's
        certificate files, None for plaintext (`security.mode=insecure`)."""
        if kind not in KINDS:
            raise InvalidArgument(f"kind {kind!r}: expected one of {KINDS}")
        out = [f"data_dir={data_dir}", f"rpc_bind={address or '127.0.0.1:0'}"]
        if kind == "master":
            out.append(f"advertised_address={address}")
        out.append(f"master_addresses={launcher.toml_list(master_addresses)}")
        out.append("http_bind=127.0.0.1:0")
        if join:
            out.append("join_existing=true")
        if self.issues_identity(kind):
            out += launcher.security_overrides(identity)
        out += settings_of(TIMING[self.timing][kind])
        out += self.overrides(kind)
        return out

    def command(
        self,
        kind: str,
        *,
        data_dir: Path | str,
        address: str,
        master_addresses: Iterable[str],
        identity: IdentityFiles | None,
        ready: Path,
        join: bool = False,
    ) -> list[str]:
        """The command line of a server of `kind`: `launcher.server_args` of its module, conf
        file and `settings`."""
        settings = self.settings(
            kind,
            data_dir=data_dir,
            address=address,
            master_addresses=master_addresses,
            identity=identity,
            join=join,
        )
        return launcher.server_args(MODULES[kind], self.conf(kind), settings, ready)
