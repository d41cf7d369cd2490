"""Master processes on loopback, for tests and demos: `MasterCluster`, N masters forming one
sys.catalog group.

`MasterCluster` is `service.testing.cluster`'s: the masters of a `Cluster` seen as a group
(`cluster.masters`), or, constructed, a cluster of masters only. It is named here, where the
master tests and benchmarks import it from, with `FAST_RAFT`, the masters' test timing
(`service.tools.cluster_spec`). A master's uuid follows from its address
(`service.master.master.master_uuid`), so its port is picked free before launch; its status
page binds `127.0.0.1:0` and its ready file names the address it got (`http_address`).
"""

from __future__ import annotations

from service.testing.cluster import MasterCluster
from service.tools.cluster_spec import FAST_RAFT, MASTER_CONF
from service.tools.launcher import ROOT

__all__ = ["FAST_RAFT", "MASTER_CONF", "ROOT", "MasterCluster"]
