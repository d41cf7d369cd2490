"""The multi-master bugs of Kudu (docs/design/failover.md), each as a scenario on real master
processes that the old design fails (KUDU-1358's is tests/integration/test_master_heartbeats.py).

KUDU-1353: the old leader kept a per-tablet replica map filled only from tablet reports, so a
newly elected leader that got no reports answered locations without replicas, and its alters
and deletes reached no tablet server. Here the simulated tablet servers send no tablet report
at all after the failover: the new leader must still answer every location and drive an alter
and a delete to the servers, from the replicas its committed catalog records name.

KUDU-1374: reports are edge-triggered, so an action the old leader owed a report it had
acknowledged was lost with it. Here a master that had been leader, and holds acknowledged
reports from every server, is elected again: every server must send it a full report (which it
asks for on election), although nothing changed on any server.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.common.schema import ColumnType, Schema
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

SERVERS = ["ts-1", "ts-2", "ts-3"]


class Scenario:
    def __init__(self, cluster: MasterCluster, masters: Masters, sims: SimulatorThread) -> None:
        self.cluster, self.masters, self.sims = cluster, masters, sims

    def create(self, leader: str, name: str) -> str:
        r = self.masters[leader].CreateTable(
            pb.CreateTableRequestPB(
                request_id=pb.RequestIdPB(client_id=f"kudu-{name}", seq_no=1),
                name=name,
                schema=schema_to_pb(SCHEMA),
                partition_schema=partition_schema_to_pb(PARTITIONING, SCHEMA),
                num_replicas=3,
            ),
            timeout=10,
        )

        def done() -> bool | None:
            d = self.masters[leader].IsCreateTableDone(
                pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=r.table_id)),
                timeout=2,
            )
            return True if d.done else None

        wait(f"{name} created", done, 30)
        return str(r.table_id)

    def fail_over(self, leader: str) -> str:
        """Kill -9 `leader`; the address of the new serving leader."""
        self.cluster.kill(self.cluster.by_address(leader).name, signal.SIGKILL)
        survivors = [a for a in self.cluster.addresses if a != leader]
        return wait("a new leader", lambda: serving_leader(self.masters, survivors), 30)


@pytest.fixture(name="s")
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    # Insecure: the simulated tablet servers (service/testing/ts_simulator.py) heartbeat under
    # many uuids from one process, which a secured master refuses by design
    # (tests/integration/test_security.py).
    with MasterCluster(tmp_path, 3, overrides=OVERRIDES, secure=False) as cluster:
        masters = Masters(cluster)
        try:
            leader = wait("a leader", lambda: serving_leader(masters, cluster.addresses))
            with SimulatorThread(cluster.addresses, SERVERS, heartbeat_interval_s=0.1) as sims:

                def live() -> bool | None:
                    r = masters[leader].ListTabletServers(
                        pb.ListTabletServersRequestPB(), timeout=2
                    )
                    return True if sum(s.live for s in r.servers) == 3 else None

                wait("3 live servers", live)
                yield Scenario(cluster, masters, sims)
        finally:
            masters.close()


def _leader(s: Scenario) -> str:
    return wait("a leader", lambda: serving_leader(s.masters, s.cluster.addresses))


def test_kudu_1353_a_new_leader_without_any_report_knows_every_replica(s: Scenario) -> None:
    leader = _leader(s)
    table_id = s.create(leader, "t1353")
    s.sims.call(lambda sim: setattr(sim, "send_reports", False))
    new_leader = s.fail_over(leader)

    # Locations: every tablet with its three replicas, their addresses and the leader.
    r = s.masters[new_leader].GetTableLocations(
        pb.GetTableLocationsRequestPB(table=pb.TableIdentifierPB(table_id=table_id)), timeout=5
    )
    assert len(r.tablet_locations) == 4
    for loc in r.tablet_locations:
        assert {x.ts_uuid for x in loc.replicas} == set(SERVERS)
        assert all(x.rpc_address.port for x in loc.replicas)
        assert [x.role for x in loc.replicas].count(pb.LEADER) == 1

    # An alter reaches every tablet's leader, with no report to say where they are.
    altered = s.masters[new_leader].AlterTable(
        pb.AlterTableRequestPB(
            request_id=pb.RequestIdPB(client_id="kudu-1353", seq_no=2),
            table=pb.TableIdentifierPB(table_id=table_id),
            steps=[
                pb.AlterTableStepPB(
                    add_column=pb.AlterTableStepPB.AddColumn(
                        column=schema_to_pb(
                            Schema.build(
                                [("k", ColumnType.STRING), ("x", ColumnType.INT32)], ("k",)
                            )
                        ).columns[1]
                    )
                )
            ],
        ),
        timeout=10,
    )

    def schema_versions(sim: FleetSimulator) -> set[int]:
        return {g.view.schema_version for g in sim.groups.values() if g.table_id == table_id}

    wait(
        "the alter applied on every tablet",
        lambda: True if s.sims.call(schema_versions) == {altered.schema_version} else None,
        30,
    )

    # A delete reaches every replica.
    s.masters[new_leader].DeleteTable(
        pb.DeleteTableRequestPB(
            request_id=pb.RequestIdPB(client_id="kudu-1353", seq_no=3),
            table=pb.TableIdentifierPB(table_id=table_id),
        ),
        timeout=10,
    )

    def live_replicas(sim: FleetSimulator) -> int:
        return sum(
            1
            for srv in sim.servers.values()
            for r in srv.replicas.values()
            if r.group.table_id == table_id and not r.tombstoned
        )

    wait("every replica deleted", lambda: True if s.sims.call(live_replicas) == 0 else None, 30)


def test_kudu_1374_a_re_elected_leader_asks_every_server_for_a_full_report(s: Scenario) -> None:
    """The servers' links to the first leader hold acknowledged reports; it is paused (SIGSTOP)
    until another master leads, resumed as a follower, and elected again by pausing whoever
    leads instead. Nothing changed on any server, so an edge-triggered report to it would be
    empty: only its request on election (KUDU-1374's fix) brings a full report."""
    first = _leader(s)
    s.create(first, "t1374")
    reports = s.sims.call(lambda sim: dict(sim.full_reports))
    assert all(reports.get((ts, first), 0) >= 1 for ts in SERVERS)
    paused: str | None = first
    # Counted before the election that makes `first` lead again: its servers send their full
    # reports within milliseconds of hearing it lead, possibly before the loop below ends.
    before = reports
    _pause(s, first)
    for _ in range(20):
        others = [a for a in s.cluster.addresses if a != paused]
        leader = wait("a leader", lambda others=others: serving_leader(s.masters, others), 30)
        assert paused is not None
        _resume(s, paused)
        _caught_up(s, paused, leader)
        if leader == first:
            break
        before = s.sims.call(lambda sim: dict(sim.full_reports))
        _pause(s, leader)
        paused = leader
    else:
        pytest.fail("the first leader was never elected again")
    paused = None

    def all_reported() -> bool | None:
        got = s.sims.call(lambda sim: dict(sim.full_reports))
        grew = all(got.get((ts, first), 0) > before.get((ts, first), 0) for ts in SERVERS)
        return True if grew else None

    wait("a full report from every server to the re-elected leader", all_reported, 30)


def _own_entry(s: Scenario, address: str) -> pb.ListMastersResponsePB.Entry:
    """The master's own ListMasters entry (the one it fills with its instance seqno)."""
    r = s.masters[address].ListMasters(pb.ListMastersRequestPB(), timeout=2)
    return next(e for e in r.masters if e.instance.instance_seqno)


def _caught_up(s: Scenario, resumed: str, leader: str) -> None:
    """Wait until a resumed master has heard of `leader`'s term (a master paused while it led
    still says LEADER at first) and applied what the leader had committed. Without the
    second, the next pause could leave it a log shorter than the other follower's, which
    then refuses it every vote: the first leader could never be elected again (seen once in
    CI, 20 rotations in a row)."""
    term = s.masters[leader].ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=2).term
    target = _own_entry(s, leader).committed_index

    def heard() -> bool | None:
        r = s.masters[resumed].ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=2)
        if r.term < term or r.role == pb.LEADER:
            return None
        return True if _own_entry(s, resumed).applied_index >= target else None

    wait(f"{resumed} back as a follower", heard, 30)


def _pause(s: Scenario, address: str) -> None:
    proc = s.cluster.by_address(address).proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)


def _resume(s: Scenario, address: str) -> None:
    proc = s.cluster.by_address(address).proc
    assert proc is not None
    proc.send_signal(signal.SIGCONT)
