"""A master elected moments after it restarted knows no tablet servers yet (they back off from
a master that failed, up to ten heartbeat intervals). A CreateTable sent to it at once used to
fail definitely, FAILED_PRECONDITION "need 3 live tablet servers, have 0"; now the new leader
answers NOT_READY during its warm-up, tablet servers re-probe it as soon as they see its higher
term, and the client's retry succeeds within its deadline."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build([("id", ColumnType.INT64)], key="id")


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("cold")) as c:
        yield c


def test_create_table_on_a_just_restarted_leader_succeeds(cluster: MiniCluster) -> None:
    masters = cluster.masters
    leader = masters.by_address(masters.leader()[0]).name
    a, paused = (n for n in masters.masters if n != leader)
    # Restart a follower, then the leader, and pause the third master: one of the two
    # restarted masters, whose registries are empty, must win the election.
    for name in (a, leader):
        masters.kill(name)
        masters.start_master(name)
    masters.wait_ready([a, leader])
    proc = masters.masters[paused].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        restarted = [masters.masters[n].address for n in (a, leader)]
        masters.leader(among=restarted, timeout=60)
        started = time.monotonic()
        with cluster.client(timeout=60) as c:
            c.call(
                "create_table",
                "right_after_election",
                SCHEMA,
                PartitionSchema(range=RangeSchema(("id",))),
                num_replicas=3,
            )
            assert "right_after_election" in {t.name for t in c.call("list_tables")}
        assert time.monotonic() - started < 60
    finally:
        proc.send_signal(signal.SIGCONT)
