"""Leader failover time of Tessera's Raft under a light write load (Kudu-like timing).

    .venv/bin/python -m bench.raft_failover [--kills 20] [--writers 4]     (or: make bench-raft)

Three KV demo nodes (DemoCluster, fsync on) with raft.heartbeat_interval_ms=500,
raft.election_timeout_ms=1500 and raft.tick_interval_ms=100: a follower starts an election after
3 missed heartbeats (randomized up to 2x, as etcd-io/raft does), after a pre-vote round.
A light, continuous write load runs throughout: `--writers` clients (default 4), each putting a
distinct key and pausing `--pause-ms` (default 20) between puts, with the same leader-following
client as bench/loadgen.py (NOT_THE_LEADER hints, re-discovery with Status every 20 ms).
Secured, as the product runs by default: mutual TLS from a CA made for the run between the
nodes and to the writers (`--insecure`: plaintext). A new leader's first acknowledgement then
includes the TLS handshakes of the writers' reconnection to it.

Each trial:
  1. find the leader (Status) and wait until every node has applied the leader's commit index;
  2. SIGKILL the leader (t0 = just before the signal);
  3. wait for the first put acknowledged by any other node (necessarily a new leader: followers
     never acknowledge puts); failover time = that acknowledgement - t0;
  4. restart the killed node and wait until it has applied what the leader had committed when it
     came back, then the next trial.

stdout: one line per trial and, last, exactly one line

    raft-failover: p50 A s, p99 B s

(two decimals). Percentiles are nearest-rank over the trials: p50 is the ceil(0.5 n)-th smallest
sample and p99 the ceil(0.99 n)-th, which for n <= 100 (20 by default) is the maximum.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import grpc
import grpc.aio

from bench.loadgen import KvDemoTarget, log, percentile
from service.common.pki import IdentityFiles
from service.common.tls import Credentials, open_channel
from service.pb import kvdemo_pb2, kvdemo_pb2_grpc
from service.testing.demo_cluster import DemoCluster

TIMING = {
    "raft.heartbeat_interval_ms": "500",
    "raft.election_timeout_ms": "1500",
    "raft.tick_interval_ms": "100",
}


class Load:
    """A few writers; remembers the first acknowledgement from a node other than `excluded`."""

    def __init__(
        self, addresses: list[str], writers: int, pause_s: float, creds: IdentityFiles | None
    ) -> None:
        self.target = KvDemoTarget(
            addresses, channels=1, rpc_timeout=2.0, give_up_after=60.0, credentials=creds
        )
        self.writers = writers
        self.pause_s = pause_s
        self.excluded: str | None = None
        self.since = 0.0
        self.first_ack: asyncio.Future[tuple[float, str]] | None = None
        self.acks = 0
        self.errors = 0
        self._tasks: list[asyncio.Task[None]] = []

    def watch(self, excluded: str, since: float) -> asyncio.Future[tuple[float, str]]:
        self.excluded, self.since = excluded, since
        self.first_ack = asyncio.get_running_loop().create_future()
        return self.first_ack

    async def _writer(self, i: int) -> None:
        value = os.urandom(16)
        for n in itertools.count():
            try:
                address = await self.target.put(f"failover-{i}-{n}", value)
            except (grpc.aio.AioRpcError, TimeoutError):
                self.errors += 1
                continue
            now = time.perf_counter()
            self.acks += 1
            fut = self.first_ack
            if fut is not None and not fut.done() and address != self.excluded and now > self.since:
                fut.set_result((now, address))
            await asyncio.sleep(self.pause_s)

    async def start(self) -> None:
        await self.target.ready(30.0)
        self._tasks = [asyncio.create_task(self._writer(i)) for i in range(self.writers)]

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.target.aclose()


def client_identity(cluster: DemoCluster) -> IdentityFiles | None:
    """The writers' and probes' identity (a `user`), None when the cluster is insecure."""
    directory = cluster.credentials_dir("user", "bench")
    return None if directory is None else IdentityFiles.in_dir(directory)


async def status(address: str, creds: Credentials | None) -> kvdemo_pb2.StatusResponse | None:
    async with open_channel(address, creds) as ch:
        try:
            st: kvdemo_pb2.StatusResponse = await kvdemo_pb2_grpc.KvDemoStub(ch).Status(
                kvdemo_pb2.StatusRequest(), timeout=0.5
            )
            return st
        except grpc.aio.AioRpcError:
            return None


def _credentials(cluster: DemoCluster) -> Credentials | None:
    files = client_identity(cluster)
    return None if files is None else Credentials.from_files(files)


async def leader_of(cluster: DemoCluster, timeout: float = 30.0) -> tuple[str, int]:
    """(uuid, commit index) of the node that says it is the leader."""
    deadline = time.monotonic() + timeout
    creds = _credentials(cluster)
    while time.monotonic() < deadline:
        for uuid, node in cluster.nodes.items():
            st = await status(node.address, creds)
            if st is not None and st.role == "LEADER":
                return uuid, int(st.commit_index)
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no leader within {timeout}s")


async def wait_caught_up(cluster: DemoCluster, timeout: float = 60.0) -> float:
    """Wait until every node has applied the commit index the leader reported at the start."""
    t0 = time.perf_counter()
    _, commit = await leader_of(cluster)
    deadline = time.monotonic() + timeout
    creds = _credentials(cluster)
    for node in cluster.nodes.values():
        while True:
            st = await status(node.address, creds)
            if st is not None and st.applied_index >= commit and st.leader_uuid:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node.uuid} did not catch up to {commit} in {timeout}s")
            await asyncio.sleep(0.05)
    return time.perf_counter() - t0


async def trials(cluster: DemoCluster, kills: int, writers: int, pause_s: float) -> list[float]:
    load = Load(cluster.addresses, writers, pause_s, client_identity(cluster))
    await load.start()
    samples: list[float] = []
    try:
        await wait_caught_up(cluster)
        for k in range(1, kills + 1):
            uuid, _ = await leader_of(cluster)
            node = cluster.nodes[uuid]
            assert node.proc is not None
            t0 = time.perf_counter()
            first = load.watch(node.address, t0)
            node.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(node.proc.wait)
            t_ack, by = await asyncio.wait_for(first, 60.0)
            failover = t_ack - t0
            samples.append(failover)
            new_leader = next(u for u, n in cluster.nodes.items() if n.address == by)
            t_restart = time.perf_counter()
            await asyncio.to_thread(cluster.restart, uuid)
            caught = await wait_caught_up(cluster)
            print(
                f"trial {k:2d}/{kills}: killed leader {uuid}, first put acknowledged by "
                f"{new_leader} after {failover:.2f} s; {uuid} restarted and caught up in "
                f"{time.perf_counter() - t_restart:.1f} s (catch-up wait {caught:.1f} s)",
                flush=True,
            )
    finally:
        log(f"raft-failover: load {load.acks} puts acknowledged, {load.errors} failed puts")
        await load.aclose()
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Tessera leader failover time under light load")
    p.add_argument("--kills", type=int, default=20, help="trials (leader kills)")
    p.add_argument("--writers", type=int, default=4, help="concurrent writers of the load")
    p.add_argument("--pause-ms", type=float, default=20.0, help="pause between a writer's puts")
    p.add_argument("--insecure", action="store_true", help="plaintext nodes and writers")
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="tessera-failover-"))
    overrides = {**TIMING, "wal.fsync": "true"}
    cluster = DemoCluster(base, 3, overrides=overrides, secure=not args.insecure)
    log(
        "raft-failover: 3 KV demo nodes, heartbeat 500 ms, election timeout 1500 ms "
        f"(randomized up to 2x), tick 100 ms, fsync on, "
        f"{'plaintext' if args.insecure else 'mutual TLS'}; {args.writers} writers, "
        f"{args.pause_ms:g} ms pause; {args.kills} leader kills"
    )
    try:
        cluster.start()
        samples = asyncio.run(trials(cluster, args.kills, args.writers, args.pause_ms / 1000))
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    s = sorted(samples)
    print(
        f"{len(s)} trials: min {s[0]:.2f} s, mean {sum(s) / len(s):.2f} s, max {s[-1]:.2f} s; "
        f"nearest-rank percentiles (p99 of {len(s)} samples = the "
        f"{'maximum' if len(s) <= 100 else 'ceil(0.99 n)-th'})"
    )
    print(f"raft-failover: p50 {percentile(s, 50):.2f} s, p99 {percentile(s, 99):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
