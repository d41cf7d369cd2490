"""The replicated-log demo (`make demo` until the master lands).

Three KV demo nodes run as real processes on loopback. 64 clients write under load; the leader
is killed with SIGKILL; writes continue on the newly elected leader; the killed node restarts
and catches up; every acknowledged write is then read back with a linearizable read, and the
nodes are stopped cleanly. Prints a short summary table.

    python -m service.tools.kv_demo [--dir DIR] [--clients 64] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from service.common.errors import TesseraError
from service.testing.demo_cluster import DemoCluster
from service.tools.kv_demo_client import KvClient


@dataclass
class Load:
    acked: dict[str, bytes] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)  # ack times
    served_by: list[str] = field(default_factory=list)  # the address that acknowledged
    errors: int = 0
    stop: bool = False


async def writer(client: KvClient, cid: int, load: Load) -> None:
    i = 0
    while not load.stop:
        key = f"c{cid}-k{i % 50}"
        value = f"c{cid}-v{i}".encode()
        try:
            await client.put(key, value, timeout=10)
        except TesseraError:
            load.errors += 1
            continue
        load.acked[key] = value
        load.times.append(time.monotonic())
        load.served_by.append(client.last_address or "")
        i += 1


def rate(times: list[float], start: float, end: float) -> float:
    return sum(1 for t in times if start <= t < end) / max(end - start, 1e-9)


def status_line(text: str) -> None:
    print(f"  .. {text}", flush=True)


async def run(base: Path, clients: int, seconds: float) -> int:
    print(f"Tessera replicated-log demo: 3 nodes on loopback, data in {base}")
    cluster = DemoCluster(base, 3)
    cluster.start()
    try:
        kv = KvClient(cluster.addresses)
        leader_addr = await kv.find_leader(timeout=20)
        leader = next(u for u, n in cluster.nodes.items() if n.address == leader_addr)
        status_line(f"leader elected: {leader} at {leader_addr}")
        load = Load()
        conns = [KvClient(cluster.addresses) for _ in range(4)]
        for c in conns:
            c.leader = leader_addr
        tasks = [asyncio.create_task(writer(conns[i % 4], i, load)) for i in range(clients)]
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        status_line(f"{len(load.times)} writes acknowledged; killing the leader {leader} (SIGKILL)")
        t_kill = time.monotonic()
        cluster.kill(leader, signal.SIGKILL)
        # Acks already in flight from the old leader may still arrive: wait for one served by
        # another node.
        first_new: float | None = None
        while first_new is None:
            await asyncio.sleep(0.005)
            first_new = next(
                (
                    t
                    for t, a in zip(load.times, load.served_by, strict=True)
                    if t > t_kill and a != leader_addr
                ),
                None,
            )
            if time.monotonic() - t_kill > 30:
                raise RuntimeError("no write succeeded within 30 s of the leader kill")
        failover = first_new - t_kill
        new_leader_addr = await kv.find_leader(timeout=20)
        new_leader = next(u for u, n in cluster.nodes.items() if n.address == new_leader_addr)
        status_line(f"new leader {new_leader}: writes resumed {failover:.2f} s after the kill")
        await asyncio.sleep(seconds)
        status_line(f"restarting {leader}")
        cluster.restart(leader)
        await asyncio.sleep(seconds / 2)
        load.stop = True
        await asyncio.gather(*tasks)
        t_end = time.monotonic()
        # Catch-up: the restarted node reaches the leader's commit index.
        lead_commit = (await kv.status(new_leader_addr)).commit_index
        deadline = time.monotonic() + 30
        while True:
            try:
                st = await kv.status(cluster.nodes[leader].address)
                if st.applied_index >= lead_commit:
                    break
            except grpc.aio.AioRpcError:
                pass  # still starting (the channel reconnects with backoff)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{leader} did not catch up within 30 s")
            await asyncio.sleep(0.05)
        status_line(f"{leader} caught up to index {lead_commit}")
        # Every acknowledged write is there (the last acked value per key, read linearizably).
        lost = 0
        for key, value in load.acked.items():
            if await kv.get(key) != value:
                lost += 1
        statuses = {u: await kv.status(n.address) for u, n in cluster.nodes.items()}
        for c in [kv, *conns]:
            await c.aclose()
    finally:
        cluster.stop()
    codes = cluster.exit_codes()

    print()
    print(f"  {'node':<8} {'role':<10} {'term':>5} {'commit':>8} {'applied':>8}  exit")
    for u, st in statuses.items():
        print(
            f"  {u:<8} {st.role:<10} {st.term:>5} {st.commit_index:>8} {st.applied_index:>8}"
            f"  {codes[u]}"
        )
    print()
    total = len(load.times)
    print(f"  writes acknowledged      {total} ({len(load.acked)} keys), {load.errors} retried")
    print(
        f"  throughput before kill   {rate(load.times, t0, t_kill):.0f} writes/s "
        f"({clients} clients)"
    )
    print(f"  throughput after kill    {rate(load.times, t_kill + failover, t_end):.0f} writes/s")
    print(f"  failover (kill -> write) {failover:.2f} s")
    print(f"  acknowledged writes lost {lost}")
    print(f"  clean shutdown           {'yes' if all(c == 0 for c in codes.values()) else codes}")
    ok = lost == 0 and all(c == 0 for c in codes.values())
    print(f"\ndemo: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Tessera replicated-log demo")
    p.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.dir is not None:
        return asyncio.run(run(args.dir, args.clients, args.seconds))
    with tempfile.TemporaryDirectory(prefix="tessera-demo-") as tmp:
        return asyncio.run(run(Path(tmp), args.clients, args.seconds))


if __name__ == "__main__":
    sys.exit(main())
