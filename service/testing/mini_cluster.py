"""A mini cluster on loopback: N master processes and M real tablet-server processes.

`MiniCluster` is a `service.testing.cluster.Cluster` made from the keyword arguments its call
sites use (counts, each kind's overrides as a mapping, `secure`), with the tablet-server
spellings they use (`start_tserver`, `kill_tserver`, `wait_tserver`). Everything else (files
under `<base>`, a restarted tablet server keeping its uuid and replicas, `stop()` leaving no
process running) is the Cluster's.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from service.testing.cluster import Cluster
from service.tools.cluster_spec import (
    FAST_RAFT,
    FAST_TSERVER,
    TSERVER_CONF,
    ClusterSpec,
    settings_of,
)
from service.tools.launcher import ServerProcess

__all__ = ["FAST_TSERVER", "TSERVER_CONF", "MiniCluster"]


class MiniCluster(Cluster):
    """Masters plus tablet servers. Use as a context manager."""

    def __init__(
        self,
        base: Path,
        num_masters: int = 3,
        num_tservers: int = 3,
        master_overrides: Mapping[str, str] | None = None,
        tserver_overrides: Mapping[str, str] | None = None,
        secure: bool = True,
    ) -> None:
        """Overrides default to the fast timing (`FAST_RAFT`, `FAST_TSERVER`); given ones
        replace it. `secure`: mutual TLS from a CA made for the cluster in `<base>/pki` (the
        product's default)."""
        super().__init__(
            ClusterSpec(
                base,
                masters=num_masters,
                tservers=num_tservers,
                security="secure" if secure else "insecure",
                timing="conf",
                master_overrides=settings_of(
                    FAST_RAFT if master_overrides is None else master_overrides
                ),
                tserver_overrides=settings_of(
                    FAST_TSERVER if tserver_overrides is None else tserver_overrides
                ),
            )
        )

    @property
    def num_masters(self) -> int:
        return self.spec.masters

    @property
    def num_tservers(self) -> int:
        return self.spec.tservers

    @property
    def master_overrides(self) -> dict[str, str]:
        return self.masters.overrides

    @property
    def tserver_overrides(self) -> dict[str, str]:
        """The tablet servers' settings beyond the managed ones; set it to start the next
        tablet servers with others."""
        return dict(s.split("=", 1) for s in self.spec.tserver_overrides)

    @tserver_overrides.setter
    def tserver_overrides(self, value: Mapping[str, str]) -> None:
        self.spec = replace(self.spec, tserver_overrides=settings_of(value))

    @property
    def secure(self) -> bool:
        return self.spec.secure

    def start_tserver(
        self,
        name: str,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
        credentials_dir: Path | None = None,
    ) -> ServerProcess:
        """Launch tablet server `name` with a certificate of its own from the cluster's CA, or
        with the credentials directory `credentials_dir` (a join credential, say)."""
        return self.start_server(name, wait=wait, env=env, credentials_dir=credentials_dir)

    def wait_tserver(self, name: str, timeout: float = 30.0) -> None:
        self.wait_ready([name], timeout)

    def kill_tserver(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.kill(name, sig)
