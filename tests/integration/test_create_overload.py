"""Creation on slow tablet servers converges without replacements (docs/design/catalog.md#R16).

Real processes: 3 masters, 3 tablet servers whose every CreateTablet takes a second longer
(`TESSERA_FAILPOINT_DELAY=create_tablet:1500`, a slow disk) and that work on 2 at a time with
2 more queued, refusing the rest with RESOURCE_EXHAUSTED. A 12-tablet table puts 12 creations
on each server: about 6 s of work each, against an assignment timeout of 4 s. Measured from
its first call, as before, most tablets would be replaced, each replacement more work for the
same servers. Paced, no tablet is replaced while its replicas answer, the master saw the
servers shed load, and the table is created.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.common import failpoints
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER, MiniCluster
from tests.helpers.status_pages import create_table, metrics_of, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TABLETS = 10
"""GetTableLocations answers 10 tablets unless asked for more (create_table: the default)."""


def test_slow_create_tablets_are_waited_for_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read by the tablet servers when they start (the masters never reach this point).
    monkeypatch.setenv(failpoints.DELAY, "create_tablet:1500")
    masters = {**FAST_RAFT, "assignment_timeout_ms": "4000", "bg_task_interval_ms": "100"}
    tservers = {**FAST_TSERVER, "max_concurrent_creates": "2", "max_queued_creates": "2"}
    with MiniCluster(
        tmp_path / "cluster", master_overrides=masters, tserver_overrides=tservers
    ) as cluster:
        leader, _, locations = create_table(cluster, "slow", buckets=TABLETS, replicas=3)
        assert len(locations.tablet_locations) == TABLETS
        http = next(m.http_address for m in cluster.masters.masters.values() if m.address == leader)
        metrics = metrics_of(http)
        assert metrics["tessera_master_tablets_replaced_total"].total() == 0
        shed = sum(
            metrics_of(ts.http_address)["tessera_tserver_create_tablet_shed_total"].value()
            for ts in cluster.tservers.values()
        )
        assert shed > 0, "the servers were never overloaded: the test proves nothing"
        assert metrics["tessera_master_tserver_rpcs_shed_total"].value() == shed
        # Every replica of every tablet is there, on its server: nothing left to re-create.
        wait_for(
            "every server hosting a replica of every tablet",
            lambda: all(
                metrics_of(ts.http_address)["tessera_tserver_replicas"].value(state="RUNNING")
                == TABLETS
                for ts in cluster.tservers.values()
            ),
        )
