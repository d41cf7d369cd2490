"""Three real master processes and simulated tablet servers: creates left pending by a leader
killed with -9 are finished by the new leader (roll-forward from committed state, full reports
after its election, KUDU-1374), and the deposed leader's term is fenced."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest

from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.testing.master_cluster import MasterCluster
from service.testing.ts_simulator import FleetSimulator, SimulatorThread
from tests.helpers.master_cluster import (
    OVERRIDES,
    PARTITIONING,
    SCHEMA,
    Masters,
    serving_leader,
    wait,
)

pytestmark = pytest.mark.integration


def _done(masters: Masters, leader: str, table_id: str) -> bool | None:
    try:
        r = masters[leader].IsCreateTableDone(
            pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
            timeout=2,
        )
    except grpc.RpcError:
        return None
    return True if r.done else None


def test_pending_creates_finish_under_the_new_leader_after_kill_9(tmp_path: Path) -> None:
    # Insecure: the simulated tablet servers (service/testing/ts_simulator.py) heartbeat under
    # many uuids from one process, which a secured master refuses by design
    # (tests/integration/test_security.py).
    with MasterCluster(tmp_path, 3, overrides=OVERRIDES, secure=False) as cluster:
        masters = Masters(cluster)
        try:
            leader = wait("a leader", lambda: serving_leader(masters, cluster.addresses))
            with SimulatorThread(
                cluster.addresses, ["ts-1", "ts-2", "ts-3"], heartbeat_interval_s=0.1
            ) as sims:

                def live() -> bool | None:
                    r = masters[leader].ListTabletServers(
                        pb.ListTabletServersRequestPB(), timeout=2
                    )
                    return True if sum(s.live for s in r.servers) == 3 else None

                wait("3 live servers", live)
                sims.call(lambda s: setattr(s, "hold_creates", True))
                created = masters[leader].CreateTable(
                    pb.CreateTableRequestPB(
                        request_id=pb.RequestIdPB(client_id="c", seq_no=1),
                        name="t",
                        schema=schema_to_pb(SCHEMA),
                        partition_schema=partition_schema_to_pb(PARTITIONING, SCHEMA),
                        num_replicas=3,
                    ),
                    timeout=10,
                )

                def assigned() -> bool | None:
                    r = masters[leader].IsCreateTableDone(
                        pb.IsCreateTableDoneRequestPB(
                            table=pb.TableIdentifierPB(table_id=created.table_id)
                        ),
                        timeout=2,
                    )
                    assert not r.done
                    return True if r.tablets_total == 4 else None

                wait("tablets assigned", assigned)
                old_term = sims.call(lambda s: s.servers["ts-1"].highest_term)
                cluster.kill(cluster.by_address(leader).name, signal.SIGKILL)
                sims.call(lambda s: setattr(s, "hold_creates", False))
                survivors = [a for a in cluster.addresses if a != leader]
                new_leader = wait("a new leader", lambda: serving_leader(masters, survivors))
                wait(
                    "create done under the new leader",
                    lambda: _done(masters, new_leader, created.table_id),
                    30,
                )

                def fenced(s: FleetSimulator) -> bool:
                    return all(srv.highest_term > old_term for srv in s.servers.values())

                assert sims.call(fenced)
                hosted = sims.call(lambda s: sum(len(x.replicas) for x in s.servers.values()))
                assert hosted == 12
        finally:
            masters.close()
