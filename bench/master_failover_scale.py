"""Promotion of a master at scale, on real processes: how long from the leader's death until a
survivor answers GetTableLocations correctly, and whether the masters then stay put.

Three masters with the product's Raft timing (heartbeat 0.5 s, election timeout 1.5 s), one
simulated fleet of --servers tablet servers (service/testing/ts_simulator.py, insecure: one
process heartbeats under many uuids) and --tablets tablets x 3 created as tables of 10,000.
Then, --rounds times: SIGKILL the leader, time until a survivor answers GetTableLocations of
the first table with every tablet's locations ("promotion"), count the elections of the next
--watch seconds (the Raft term on the survivors' /metrics; +1 means the new leader held), count
the new leader's event-loop stalls longer than the Raft heartbeat interval meanwhile
(`tessera_event_loop_stalls_total`) and note its `tessera_event_loop_lag_max_seconds` (the
largest lag of its last 60 s), and restart the killed master.

With --code-root DIR the masters of the measured rounds run the code of another checkout (the
catalog built by this one is reused: the on-disk format is the same), so one catalog serves a
before/after comparison: `--code-root /path/to/old --rounds 2` then this tree's rounds.

Usage: python -m bench.master_failover_scale [--tablets 50000] [--servers 300] [--rounds 2]
       [--watch 20] [--code-root DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

from bench.master_bench import SCHEMA, partitioning, start_sim
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing import master_cluster
from service.testing.master_cluster import MasterCluster
from service.tools.launcher import terminate_all

TABLE_TABLETS = 10_000


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def metric(http_address: str, name: str) -> float | None:
    """One value of the master's /metrics (the first sample of `name`; a name may carry its
    labels, `x{a="b"}`); None if absent or the master does not answer."""
    return metrics(http_address, name)[name]


def metrics(http_address: str, *names: str) -> dict[str, float | None]:
    """Several values from ONE /metrics page. Rendering it walks the catalog, so a poll reads
    the page once for all it needs, not once per value."""
    out: dict[str, float | None] = dict.fromkeys(names)
    try:
        with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return out
    for line in body.splitlines():
        for name in names:
            if out[name] is None and (line.startswith(name + " ") or line.startswith(name + "{")):
                out[name] = float(line.split()[-1])
    return out


def stubs(cluster: MasterCluster) -> dict[str, master_pb2_grpc.MasterServiceStub]:
    return {
        a: master_pb2_grpc.MasterServiceStub(grpc.insecure_channel(a)) for a in cluster.addresses
    }


def leader(cluster: MasterCluster, among: list[str] | None = None) -> str | None:
    for name, m in cluster.masters.items():
        if among is not None and name not in among:
            continue
        if not m.alive:
            continue
        if metric(m.http_address, "tessera_raft_is_leader") == 1.0:
            return name
    return None


LOOKUP = 100
"""Tablets asked for in one GetTableLocations (from the start of the table)."""


def locations_ok(stub: master_pb2_grpc.MasterServiceStub, table_id: str, tablets: int) -> bool:
    """The first LOOKUP tablets of the table, each with its 3 replicas."""
    try:
        r = stub.GetTableLocations(
            pb.GetTableLocationsRequestPB(
                table=pb.TableIdentifierPB(table_id=table_id), max_returned_locations=LOOKUP
            ),
            timeout=2,
        )
    except grpc.RpcError:
        return False
    want = min(LOOKUP, tablets)
    return len(r.tablet_locations) == want and all(len(t.replicas) == 3 for t in r.tablet_locations)


def build(cluster: MasterCluster, tablets: int) -> list[tuple[str, int]]:
    tables = []
    for seq, start in enumerate(range(0, tablets, TABLE_TABLETS), start=1):
        count = min(TABLE_TABLETS, tablets - start)
        while True:
            name = leader(cluster)
            if name is not None:
                break
            time.sleep(0.2)
        stub = stubs(cluster)[cluster.masters[name].address]
        req = pb.CreateTableRequestPB(
            request_id=pb.RequestIdPB(client_id="scale", seq_no=seq),
            name=f"t{seq}",
            schema=schema_to_pb(SCHEMA),
            partition_schema=partition_schema_to_pb(partitioning(count), SCHEMA),
            num_replicas=3,
        )
        table_id = stub.CreateTable(req, timeout=120).table_id
        t0 = time.monotonic()
        while True:
            try:
                r = stub.IsCreateTableDone(
                    pb.IsCreateTableDoneRequestPB(table=pb.TableIdentifierPB(table_id=table_id)),
                    timeout=10,
                )
                if r.done:
                    break
            except grpc.RpcError:
                pass
            time.sleep(1.0)
        progress(f"table {seq}: {count} tablets RUNNING in {time.monotonic() - t0:.0f} s")
        tables.append((table_id, count))
    return tables


def restart_all(cluster: MasterCluster) -> None:
    cluster.stop()
    for name in cluster.masters:
        cluster.start_master(name)
    cluster.wait_ready(list(cluster.masters), timeout=300)


def measure(cluster: MasterCluster, table: tuple[str, int], watch: float, label: str) -> None:
    table_id, tablets = table
    while True:  # a leader that serves, and stable for a few seconds
        name = leader(cluster)
        if name is not None and locations_ok(
            stubs(cluster)[cluster.masters[name].address], table_id, tablets
        ):
            break
        time.sleep(0.5)
    time.sleep(5.0)
    name = leader(cluster)
    assert name is not None
    survivors = [n for n in cluster.masters if n != name]
    term0 = max(
        metric(cluster.masters[n].http_address, "tessera_raft_term") or 0 for n in survivors
    )
    stalls0 = {
        n: metric(cluster.masters[n].http_address, "tessera_event_loop_stalls_total") or 0
        for n in survivors
    }
    all_stubs = stubs(cluster)
    t0 = time.monotonic()
    cluster.kill(name, signal.SIGKILL)
    promoted = None
    new_leader = survivors[0]
    while time.monotonic() - t0 < 120:
        for n in survivors:
            if locations_ok(all_stubs[cluster.masters[n].address], table_id, tablets):
                promoted = time.monotonic() - t0
                new_leader = n
                break
        if promoted is not None:
            break
        time.sleep(0.05)
    after = max(
        metric(cluster.masters[n].http_address, "tessera_raft_term") or 0 for n in survivors
    )
    time.sleep(watch)
    final = max(
        metric(cluster.masters[n].http_address, "tessera_raft_term") or 0 for n in survivors
    )
    http = cluster.masters[new_leader].http_address
    lag = metric(http, "tessera_event_loop_lag_max_seconds") or 0
    stalls = (metric(http, "tessera_event_loop_stalls_total") or 0) - stalls0[new_leader]
    shown = f"{promoted:.2f} s" if promoted is not None else "none within 120 s"
    print(
        f"promotion [{label}] {tablets}-tablet table, leader {name} killed: first correct "
        f"GetTableLocations after {shown}; terms {term0:.0f} -> {after:.0f} at promotion -> "
        f"{final:.0f} after {watch:.0f} s more; new leader {new_leader}: {stalls:.0f} loop "
        f"stalls over the heartbeat interval since the kill, lag max of its last 60 s "
        f"{lag:.2f} s",
        flush=True,
    )
    cluster.start_master(name)
    cluster.wait_ready([name], timeout=300)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.master_failover_scale")
    p.add_argument("--tablets", type=int, default=50_000)
    p.add_argument("--servers", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--watch", type=float, default=20.0)
    p.add_argument("--code-root", type=Path)
    p.add_argument("--keep", type=Path)
    args = p.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="failover-scale-"))
    cluster = MasterCluster(base, 3, overrides={}, secure=False)
    sim = None
    try:
        cluster.start()
        sim, _ = start_sim(list(cluster.addresses), "f", args.servers, base, stagger=True)
        time.sleep(3.0)
        first = build(cluster, args.tablets)[0]
        roots = [("this tree", master_cluster.ROOT)]
        if args.code_root is not None:
            roots.insert(0, (str(args.code_root), args.code_root.resolve()))
        for label, root in roots:
            master_cluster.ROOT = root
            progress(f"restarting the masters on {label}")
            restart_all(cluster)
            for _ in range(args.rounds):
                measure(cluster, first, args.watch, label)
    finally:
        if sim is not None:
            terminate_all([sim])
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
