"""Heartbeats across a master failover: 50 simulated tablet servers, 3 real master processes.

The simulated servers are one background thread that registers and heartbeats every 0.4 s to
ALL THREE masters at once (docs/design/failover.md#R1, which ends KUDU-1358).
The unresponsive timeout is shortened to a few seconds so "never marked dead" means something.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from service.common.errors import LEADER_ADDRESS_KEY, NotReady, NotTheLeader, from_grpc
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT, MasterCluster

pytestmark = pytest.mark.integration

T = TypeVar("T")
N_SERVERS = 50
HEARTBEAT_INTERVAL_S = 0.4
UNRESPONSIVE_TIMEOUT_MS = 4000
RPC_TIMEOUT = 5.0
SCHEMA = Schema.build([("k", ColumnType.STRING), ("v", ColumnType.INT64)], ("k",))
PARTITIONING = PartitionSchema(hash=(HashBucketSchema(("k",), 3),), range=RangeSchema(()))


class Masters:
    """Sync stubs by address."""

    def __init__(self, addresses: list[str]) -> None:
        self.channels = {a: grpc.insecure_channel(a) for a in addresses}
        self.stubs = {a: master_pb2_grpc.MasterServiceStub(c) for a, c in self.channels.items()}

    def __getitem__(self, address: str) -> master_pb2_grpc.MasterServiceStub:
        return self.stubs[address]

    def close(self) -> None:
        for c in self.channels.values():
            c.close()


class SimulatedTabletServers:
    """N tablet servers in one thread; each round sends every server's heartbeat to every
    master concurrently (futures), registering wherever the master asks for it."""

    def __init__(self, masters: Masters, n: int) -> None:
        self.masters = masters
        self.uuids = [f"ts-{i:02d}" for i in range(1, n + 1)]
        self.registered: dict[tuple[str, str], bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def beat_once(self) -> None:
        calls = []
        for i, uuid in enumerate(self.uuids):
            for address, stub in self.masters.stubs.items():
                req = pb.TSHeartbeatRequestPB(
                    instance=pb.NodeInstancePB(permanent_uuid=uuid, instance_seqno=1)
                )
                if not self.registered.get((uuid, address)):
                    req.registration.rpc_addresses.add(host="127.0.0.1", port=17050 + i)
                    req.registration.software_version = "sim"
                calls.append((uuid, address, stub.TSHeartbeat.future(req, timeout=1)))
        for uuid, address, call in calls:
            try:
                r = call.result()
            except grpc.RpcError:
                continue  # a killed master
            self.registered[(uuid, address)] = not r.needs_reregister

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            self.beat_once()

    def __enter__(self) -> SimulatedTabletServers:
        self.beat_once()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Sampler:
    """Asks every master for ListTabletServers every 0.25 s in a thread; keeps what the serving
    leader (the only one that answers) said: (address, total, uuids reported dead)."""

    def __init__(self, masters: Masters) -> None:
        self.masters = masters
        self.samples: list[tuple[str, int, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for address, stub in self.masters.stubs.items():
                try:
                    r = stub.ListTabletServers(pb.ListTabletServersRequestPB(), timeout=1)
                except grpc.RpcError:
                    continue
                dead = [s.instance.permanent_uuid for s in r.servers if not s.live]
                self.samples.append((address, len(r.servers), dead))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _wait(what: str, fn: Callable[[], T | None], timeout: float = 20.0, poll: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value is not None:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout}s")


def _list_on_serving_leader(
    masters: Masters, candidates: list[str]
) -> tuple[str, pb.ListTabletServersResponsePB] | None:
    """ListTabletServers on the first candidate that answers it (a loaded leader), or None
    while every candidate answers NotTheLeader / NotReady or is unreachable."""
    for address in candidates:
        try:
            r = masters[address].ListTabletServers(pb.ListTabletServersRequestPB(), timeout=1)
        except grpc.RpcError as e:
            err = from_grpc(e)
            if isinstance(err, (NotTheLeader, NotReady)) or e.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                continue
            raise
        return address, r
    return None


def _create_request(name: str, seq_no: int) -> pb.CreateTableRequestPB:
    return pb.CreateTableRequestPB(
        request_id=pb.RequestIdPB(client_id="heartbeats-test", seq_no=seq_no),
        name=name,
        schema=schema_to_pb(SCHEMA),
        partition_schema=partition_schema_to_pb(PARTITIONING, SCHEMA),
        num_replicas=3,
    )


def _assert_all_live(r: pb.ListTabletServersResponsePB, uuids: list[str]) -> None:
    assert [s.instance.permanent_uuid for s in r.servers] == uuids
    dead = [s.instance.permanent_uuid for s in r.servers if not s.live]
    assert not dead, f"reported dead: {dead}"
    for i, s in enumerate(r.servers):
        assert s.instance.instance_seqno == 1
        assert [(a.host, a.port) for a in s.registration.rpc_addresses] == [
            ("127.0.0.1", 17050 + i)
        ]
        assert s.registration.software_version == "sim"
        assert 0 <= s.millis_since_heartbeat < UNRESPONSIVE_TIMEOUT_MS


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MasterCluster]:
    overrides = {**FAST_RAFT, "unresponsive_timeout_ms": str(UNRESPONSIVE_TIMEOUT_MS)}
    # Insecure: the simulated tablet servers heartbeat under 50 uuids over one channel, which a
    # secured master refuses (a heartbeat must come from its own server's certificate;
    # tests/integration/test_security.py checks that).
    with MasterCluster(tmp_path, 3, overrides=overrides, secure=False) as c:
        yield c


def test_fifty_servers_stay_live_across_leader_failover(cluster: MasterCluster) -> None:
    """KUDU-1358: in Kudu's first multi-master design only the leader received heartbeats, so a
    newly elected leader had a cold tablet-server registry: right after the election
    ListTabletServers showed nobody and CreateTable failed for want of live servers until a
    whole heartbeat interval (plus re-registration) had passed. This test FAILS under that old
    design: here servers heartbeat to every master, the followers' TSManagers are warm, and the
    very first answer of the new leader lists all 50 servers live and accepts a 3-replica
    CreateTable at once. Throughout, no serving leader ever reports a server dead."""
    masters = Masters(cluster.addresses)
    try:
        leader, _ = _wait(
            "a serving leader", lambda: _list_on_serving_leader(masters, cluster.addresses)
        )
        with SimulatedTabletServers(masters, N_SERVERS) as servers:
            assert all(servers.registered.get((u, a)) for u in servers.uuids for a in masters.stubs)

            with Sampler(masters) as sampler:
                # (1) The leader lists all 50, live, with their registrations.
                r = masters[leader].ListTabletServers(
                    pb.ListTabletServersRequestPB(), timeout=RPC_TIMEOUT
                )
                _assert_all_live(r, servers.uuids)

                # Followers answer NOT_THE_LEADER with the leader's address, like other calls.
                follower = next(a for a in cluster.addresses if a != leader)
                with pytest.raises(grpc.RpcError) as info:
                    masters[follower].ListTabletServers(
                        pb.ListTabletServersRequestPB(), timeout=RPC_TIMEOUT
                    )
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert isinstance(from_grpc(info.value), NotTheLeader)
                trailing = dict(info.value.trailing_metadata() or ())  # type: ignore[attr-defined]
                assert trailing.get(LEADER_ADDRESS_KEY) == leader

                time.sleep(1.0)  # a few sampler rounds under the first leader

                # (2) Kill -9 the leader; the new leader's very first answer is warm.
                cluster.kill(cluster.by_address(leader).name)
                survivors = [a for a in cluster.addresses if a != leader]
                new_leader, first = _wait(
                    "a new serving leader",
                    lambda: _list_on_serving_leader(masters, survivors),
                    poll=0.01,
                )
                _assert_all_live(first, servers.uuids)
                created = masters[new_leader].CreateTable(
                    _create_request("after-failover", 1), timeout=RPC_TIMEOUT
                )
                assert len(created.table_id) == 32

                time.sleep(1.5)  # a few sampler rounds under the new leader
                r = masters[new_leader].ListTabletServers(
                    pb.ListTabletServersRequestPB(), timeout=RPC_TIMEOUT
                )
                _assert_all_live(r, servers.uuids)

            # (3) Nobody was ever reported dead, before or after the failover.
            by_leader = {a for a, _, _ in sampler.samples}
            assert by_leader == {leader, new_leader}, sampler.samples
            for address, total, dead in sampler.samples:
                assert total == N_SERVERS, (address, total)
                assert not dead, (address, dead)
    finally:
        masters.close()
    cluster.stop()
    assert all(not m.alive for m in cluster.masters.values())
