"""Three real KV demo processes on loopback: failover under load, snapshot catch-up, amnesia.

Every test starts its own cluster on free ports in tmp_path and stops it (SIGTERM, then
SIGKILL) even when it fails, so no process outlives the test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import grpc
import pytest

from service.common.errors import InvalidArgument, NotTheLeader, TesseraError, from_grpc
from service.pb import kvdemo_pb2 as pb
from service.testing.demo_cluster import DemoCluster
from service.tools.kv_demo_client import KvClient

pytestmark = pytest.mark.integration

FAST = {
    "raft.tick_interval_ms": "50",
    "raft.heartbeat_interval_ms": "100",
    "raft.election_timeout_ms": "500",
}


def _uuid_at(cluster: DemoCluster, address: str) -> str:
    return next(u for u, n in cluster.nodes.items() if n.address == address)


async def _wait_caught_up(kv: KvClient, address: str, index: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (await kv.status(address)).applied_index >= index:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{address} did not reach index {index} within {timeout}s")


def test_kill_leader_under_write_load_loses_no_acknowledged_write(tmp_path: Path) -> None:
    with DemoCluster(tmp_path, 3, FAST) as cluster:

        async def scenario() -> None:
            kv = KvClient(cluster.addresses)
            leader_addr = await kv.find_leader(timeout=20)
            leader = _uuid_at(cluster, leader_addr)
            acked: dict[str, bytes] = {}
            acks = [0]
            stop = False

            async def writer(cid: int) -> None:
                client = KvClient(cluster.addresses)
                i = 0
                while not stop:
                    key, value = f"c{cid}-{i % 20}", f"c{cid}-{i}".encode()
                    try:
                        await client.put(key, value, timeout=10)
                        acked[key] = value
                        acks[0] += 1
                        i += 1
                    except TesseraError:
                        pass  # unknown outcome: not acknowledged, retried with a new value
                await client.aclose()

            tasks = [asyncio.create_task(writer(c)) for c in range(16)]
            await asyncio.sleep(1.5)
            cluster.kill(leader, signal.SIGKILL)
            new_addr = await kv.find_leader(timeout=20)
            assert new_addr != leader_addr
            at_new_leader = acks[0]
            await asyncio.sleep(1.5)
            stop = True
            await asyncio.gather(*tasks)
            assert at_new_leader > 0
            assert acks[0] > at_new_leader  # writes resumed on the new leader
            cluster.restart(leader)
            commit = (await kv.status(new_addr)).commit_index
            await _wait_caught_up(kv, cluster.nodes[leader].address, commit)
            for key, value in acked.items():
                assert await kv.get(key) == value, key
            await kv.aclose()

        asyncio.run(scenario())
    assert all(code == 0 for code in cluster.exit_codes().values() if code is not None)


def test_restarted_node_catches_up_by_snapshot_after_peers_compacted(tmp_path: Path) -> None:
    overrides = {
        **FAST,
        "raft.snapshot_interval_entries": "200",
        "raft.snapshot_catchup_entries": "20",
    }
    with DemoCluster(tmp_path, 3, overrides) as cluster:

        async def scenario() -> None:
            kv = KvClient(cluster.addresses)
            leader_addr = await kv.find_leader(timeout=20)
            follower = next(u for u, n in cluster.nodes.items() if n.address != leader_addr)
            await kv.put("before", b"1")
            cluster.kill(follower, signal.SIGKILL)
            down_at = (await kv.status(leader_addr)).commit_index
            clients = [KvClient([leader_addr]) for _ in range(8)]
            await asyncio.gather(
                *[clients[c].put(f"k{c}-{i}", b"v%d" % i) for c in range(8) for i in range(100)]
            )
            commit = (await kv.status(leader_addr)).commit_index
            assert commit - down_at >= 800
            cluster.restart(follower)
            await _wait_caught_up(kv, cluster.nodes[follower].address, commit)
            # It got there by installing a snapshot: its WAL restarts after the leader's
            # compaction point and its snapshot file is newer than when it went down.
            log = cluster.nodes[follower].log.read_text()
            snap_file = cluster.nodes[follower].data_dir / "raft" / "snapshot"
            assert snap_file.exists()
            assert "installing snapshot" in log
            status = await kv.status(cluster.nodes[follower].address)
            assert status.applied_index >= commit
            for c in clients:
                await c.aclose()
            await kv.aclose()

        asyncio.run(scenario())


def test_node_with_wiped_data_dir_and_same_uuid_is_refused(tmp_path: Path) -> None:
    with DemoCluster(tmp_path, 3, FAST) as cluster:

        async def scenario() -> None:
            kv = KvClient(cluster.addresses)
            leader_addr = await kv.find_leader(timeout=20)
            victim = next(u for u, n in cluster.nodes.items() if n.address != leader_addr)
            for i in range(20):
                await kv.put(f"k{i}", b"v")
            cluster.kill(victim, signal.SIGKILL)
            shutil.rmtree(cluster.nodes[victim].data_dir)
            cluster.start_node(victim)  # same uuid, same bootstrap peers, empty disk
            cluster.wait_ready([victim])
            await asyncio.sleep(2.0)
            st = await kv.status(cluster.nodes[victim].address)
            # The peers refuse every message from the new incarnation: it never receives the
            # log, never joins, and cannot vote.
            assert st.applied_index == 0 and st.commit_index == 0
            assert st.role != "LEADER"
            await kv.put("after", b"ok")  # the other two still make progress
            assert await kv.get("after") == b"ok"
            logs = "".join(n.log.read_text() for n in cluster.nodes.values())
            assert "different data directory" in logs
            await kv.aclose()

        asyncio.run(scenario())


def test_bad_requests_get_clear_statuses_and_change_nothing(tmp_path: Path) -> None:
    with DemoCluster(tmp_path, 3, FAST) as cluster:

        async def scenario() -> None:
            kv = KvClient(cluster.addresses)
            leader_addr = await kv.find_leader(timeout=20)
            stub = kv.stub(leader_addr)
            # A new leader commits a no-op of its term before it serves (Raft's Figure 8); on a
            # busy machine that can land after find_leader, so wait for it before the baseline.
            for _ in range(200):
                if (await kv.status(leader_addr)).commit_index >= 1:
                    break
                await asyncio.sleep(0.05)
            before = (await kv.status(leader_addr)).commit_index
            for req, needle in [
                (pb.PutRequest(key="", value=b"x"), "key must not be empty"),
                (pb.PutRequest(key="k" * 2000, value=b"x"), "exceeds"),
                (pb.PutRequest(key="k", value=b"x" * (2 << 20)), "exceeds"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Put(req, timeout=5)
                assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                err = from_grpc(e.value)
                assert isinstance(err, InvalidArgument) and needle in err.message
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ChangeConfig(pb.ChangeConfigRequest(type="EXPLODE", uuid="x"))
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "unknown change type" in (e.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ChangeConfig(
                    pb.ChangeConfigRequest(
                        type="ADD_LEARNER",
                        uuid="n9",
                        address="127.0.0.1:1",
                        expected_config_index=12345,
                    )
                )
            assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "stale config" in (e.value.details() or "")
            # Raw garbage to the consensus port.
            channel = grpc.aio.insecure_channel(leader_addr)
            step = channel.unary_unary("/tessera.consensus.ConsensusService/Step")
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await step(os.urandom(64) + b"\xff\xff\xff", timeout=5)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            await channel.close()
            after = await kv.status(leader_addr)
            assert after.commit_index == before  # nothing was replicated
            assert after.voters and "n9" not in after.learners
            await kv.aclose()

        asyncio.run(scenario())


def test_put_stream_applies_each_put_and_ends_on_the_first_error(tmp_path: Path) -> None:
    """PutStream (the benchmark's client protocol): each put on the stream is a replicated Put
    answered in order with its index; a follower ends the stream at once with NOT_THE_LEADER
    and the leader hint; a bad put ends it with INVALID_ARGUMENT, and what came before stays
    applied while nothing after it is."""
    with DemoCluster(tmp_path, 3, FAST) as cluster:

        async def scenario() -> None:
            kv = KvClient(cluster.addresses)
            leader_addr = await kv.find_leader(timeout=20)
            call = kv.stub(leader_addr).PutStream()
            indexes = []
            for i in range(5):
                await call.write(pb.PutRequest(key=f"s{i}", value=b"v%d" % i))
                indexes.append((await call.read()).index)
            assert indexes == sorted(indexes) and len(set(indexes)) == 5
            await call.write(pb.PutRequest(key="", value=b"x"))  # bad: the stream ends
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call.read()
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "key must not be empty" in (e.value.details() or "")
            for i in range(5):
                assert await kv.get(f"s{i}") == b"v%d" % i
            follower = next(a for a in cluster.addresses if a != leader_addr)
            call = kv.stub(follower).PutStream()
            await call.write(pb.PutRequest(key="f", value=b"x"))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call.read()
            err = from_grpc(e.value)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            assert isinstance(err, NotTheLeader) and err.leader_address == leader_addr
            assert await kv.get("f") is None
            await kv.aclose()

        asyncio.run(scenario())
