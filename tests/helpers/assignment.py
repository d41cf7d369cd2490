"""Bounded assignment rounds over a catalog env (tests/helpers/catalog_env.py).

`bounded_env` places at most `ROUND` tablets per assignment round; `hashed` partitions a table into
n hash buckets only (n tablets); `background` runs the leader's background loop over an env with
a fake tablet-server proxy; `heartbeat_all` keeps every registered server live.
"""

from __future__ import annotations

import random
from typing import Any

from service.common.ids import NodeId
from service.common.partition import HashBucketSchema, PartitionSchema
from service.master.background_tasks import BackgroundSettings, BackgroundTasks
from service.master.catalog_settings import CatalogSettings
from service.master.ts_descriptor import NodeInstance
from service.master.tserver_proxy import Fence
from tests.helpers.catalog_env import Env, make_env

ROUND = 100
"""`bounded_env`'s `max_tablets_per_assignment_round`."""


def hashed(buckets: int) -> PartitionSchema:
    """`buckets` hash buckets on host and no ranges: one tablet per bucket."""
    return PartitionSchema(hash=(HashBucketSchema(("host",), buckets),), split_rows=())


def bounded_env(servers: int, **kw: Any) -> Env:
    """`make_env` placing at most `ROUND` tablets a round; `kw` are more `CatalogSettings`."""
    settings = CatalogSettings(
        max_tablets_per_assignment_round=ROUND, max_create_tablets_per_ts=10_000, **kw
    )
    return make_env(servers=servers, settings=settings)


def heartbeat_all(env: Env) -> None:
    """A heartbeat from every registered server: all live at the env's clock."""
    for u in env.ts.uuids():
        env.ts.heartbeat(NodeInstance(NodeId(u), 1))


def background(env: Env, proxy: Any, max_rpcs: int = 64) -> BackgroundTasks:
    """The leader's background loop over `env`, calling tablet servers through `proxy` (a fake
    with the `TServerProxy` methods a test needs)."""
    return BackgroundTasks(
        env.cm,
        env.ts,
        proxy,
        Fence("master-1", 1),
        env.clock,
        random.Random(1),
        BackgroundSettings(max_concurrent_rpcs=max_rpcs),
    )
