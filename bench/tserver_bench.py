"""Tablet-server benchmark (`make bench-tserver`): one line per figure, each with its baseline.

Real processes on loopback: one master and three tablet servers (`MiniCluster`), one tablet
replicated three ways (created with the admin RPCs, as the master's CreateTablet task does).

  write  rows/s of batched INSERTs (Arrow IPC, `--batch` rows each, `--writers` concurrent
         clients) into the 3-replica tablet; each acknowledged only once committed on a
         majority and applied on the leader; with the CPU each server spent meanwhile
         (`--write-only` stops after it)
  scan   Arrow bytes/s of a full scan from the leader over gRPC (paged by scanners, read as
         the client reads them: in place, service/client/scan_reply.py), against
         `pyarrow.parquet.read_table` of the same rows from a local Parquet file in the same
         run, alternated, best of nine each; the ratio is scan time / Parquet time (goal:
         within 2x; within 1.3x once rows had versions)
  copy   MB/s of a tablet copy over loopback: a fourth server is added as a non-voter, the
         leader sends it StartTabletCopy, and the copy's own byte count and timing (from
         ListTabletCopies) give the rate
  versions  a second 3-replica tablet of `--mvcc-rows` rows, each upserted 10 times (10
         versions per row); a snapshot timestamp taken after the fifth round; once it is
         `--mvcc-age-s` old (5 minutes), a full scan at it (every row's newest version is newer,
         so every row comes from history) against a full scan of the newest rows, best of
         three each; the history's disk cost per row (the tablet's files against the first
         tablet's, per row) and the leader's RSS growth (anonymous memory, and pages of
         mapped data files, which the kernel may drop). The last line of the run:
         `mvcc: snapshot/latest scan time R, write W rows/s (before B), history H bytes/row`,
         W being the write figure above and B the same figure before versions existed
         (`WRITE_BEFORE`, bench/README.md). Goals: R <= 2, W >= 0.8 B
  idle   CPU of each of the three first tablet servers, from /proc/<pid>/stat over 10 s, once
         they host `--idle-tablets` more 3-replica tablets that take no writes (and quiesce),
         against the same servers measured just before those were created and, the baseline,
         restarted with quiescence off (quiesce_idle_ms = 0) (the issue: an idle tablet
         costs close to nothing; Raft timing as in conf/tserver.toml)

Usage: python -m bench.tserver_bench [--rows 1000000] [--batch 10000] [--writers 4]
       [--idle-tablets 200] [--mvcc-rows 200000] [--mvcc-age-s 300] [--insecure]
       [--write-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq

from service.common.hybrid_time import physical_us
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import (
    ClusterStubs,
    create_request,
    rows,
    scan_all,
    write_request,
)

TABLET = "bench-tablet"
MVCC_TABLET = "bench-mvcc"
WRITE_BEFORE = 186_044
"""rows/s of the write figure before row versions existed (bench/README.md, 2026-11-26)."""


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident MB of `pid`: anonymous (heap, Arrow buffers) and file-backed (mapped data
    files, which the kernel can drop and read again)."""
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                found[line.split(":")[0]] = int(line.split()[1]) / 1024
    return found.get("RssAnon", 0.0), found.get("RssFile", 0.0)


def status(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def servers_cpu(pids: list[int], seconds: float) -> list[float]:
    """Cores each process used over the next `seconds`."""
    before, t0 = [cpu_seconds(p) for p in pids], time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - t0
    return [(cpu_seconds(p) - b) / elapsed for p, b in zip(pids, before, strict=True)]


async def run(args: argparse.Namespace, base: Path) -> None:
    # Raft timing as configured for production (conf/tserver.toml), not the tests' fast one:
    # the idle figure counts heartbeats.
    with MiniCluster(
        base, num_masters=1, num_tservers=3, tserver_overrides={}, secure=not args.insecure
    ) as cluster:
        stubs = ClusterStubs(cluster, TABLET)
        try:
            peers = [(ts.uuid, ts.address) for ts in cluster.tservers.values()]
            for uuid, _ in peers:
                await stubs.admin(uuid).CreateTablet(create_request(uuid, TABLET, peers))
            uuids = [u for u, _ in peers]
            leader = await stubs.leader(uuids)
            status(f"tablet leader {leader}; writing {args.rows:,} rows")

            # --- write ----------------------------------------------------------------------
            batches = [
                (lo, min(lo + args.batch, args.rows)) for lo in range(0, args.rows, args.batch)
            ]
            reqs = [write_request(leader, TABLET, rows(lo, hi)) for lo, hi in batches]
            queue: asyncio.Queue[tpb.WriteRequestPB] = asyncio.Queue()
            for r in reqs:
                queue.put_nowait(r)
            done = 0

            async def writer() -> None:
                nonlocal done
                while not queue.empty():
                    req = queue.get_nowait()
                    resp = await stubs.data(leader).Write(req, timeout=60)
                    assert not resp.per_row_errors, resp.per_row_errors[:3]
                    done += resp.rows_applied
                    if done % (args.batch * 10) == 0:
                        status(f"written {done:,}/{args.rows:,}")

            pids = [cluster.tserver_by_uuid(u).proc.pid for u in [leader, *uuids]]  # type: ignore[union-attr]
            pids = list(dict.fromkeys(pids))  # the leader first
            cpu0 = [cpu_seconds(p) for p in pids]
            t0 = time.perf_counter()
            await asyncio.gather(*(writer() for _ in range(args.writers)))
            write_s = time.perf_counter() - t0
            cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
            print(
                f"write: {args.rows / write_s:,.0f} rows/s into a 3-replica tablet "
                f"({args.rows:,} rows, batches of {args.batch:,}, {args.writers} writers, "
                f"{write_s:.2f}s); CPU {cpu[0]:.2f}s on the leader, "
                f"{', '.join(f'{c:.2f}s' for c in cpu[1:])} on the followers"
            )
            if args.write_only:
                return

            # --- scan vs local Parquet ------------------------------------------------------
            status("scanning")
            path = base / "baseline.parquet"
            pq.write_table(rows(0, args.rows), path)
            scan_times, pq_times = [], []
            # Alternated, best of nine each: the machine's speed moves from one minute to the
            # next (Parquet's reader gets one core or two), and alternating gives both sides
            # the same minutes. Both sides take a few rounds to settle (the first scan also
            # sorts the in-memory rows once), so five rounds often gave a cold best.
            for _ in range(9):
                t0 = time.perf_counter()
                got = await scan_all(stubs.scan(leader), leader, TABLET, batch_size_bytes=8 << 20)
                scan_times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                local = pq.read_table(path)
                pq_times.append(time.perf_counter() - t0)
            scan_s, pq_s = min(scan_times), min(pq_times)
            assert got.num_rows == args.rows and local.num_rows == args.rows
            nbytes = got.nbytes
            print(
                f"scan: {nbytes / scan_s / 1e6:,.1f} MB/s of Arrow ({args.rows / scan_s:,.0f} "
                f"rows/s) from the leader; local Parquet {nbytes / pq_s / 1e6:,.1f} MB/s; "
                f"ratio scan/parquet time {scan_s / pq_s:.2f}x (goal <= 2x)"
            )

            mvcc = await versions(args, stubs, peers, leader, cluster, write_s)

            # --- tablet copy ----------------------------------------------------------------
            status("adding a fourth server (tablet copy)")
            ts4 = cluster.add_tserver_slot("ts-4")
            cluster.start_tserver("ts-4")
            host, _, port = ts4.address.rpartition(":")
            for attempt in range(5):
                # The leader may have moved during the long versions figure on a busy
                # machine: ask whoever leads now, as a client would.
                leader = await stubs.leader(uuids)
                req = tpb.ChangeConfigRequestPB(
                    dest_uuid=leader, tablet_id=TABLET, type=tpb.ChangeConfigRequestPB.ADD_PEER
                )
                req.peer.permanent_uuid = ts4.uuid
                req.peer.member_type = mpb.NON_VOTER
                req.peer.promote = True
                req.peer.last_known_addr.host, req.peer.last_known_addr.port = host, int(port)
                try:
                    await stubs.admin(leader).ChangeConfig(req, timeout=10)
                    break
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == 4:
                        raise
            deadline = time.monotonic() + 120
            copy = None
            while time.monotonic() < deadline:
                resp = await stubs.admin(ts4.uuid).ListTabletCopies(
                    tpb.ListTabletCopiesRequestPB(dest_uuid=ts4.uuid)
                )
                copy = next((c for c in resp.copies if c.tablet_id == TABLET), None)
                if copy is not None and copy.state != "RUNNING":
                    break
                await asyncio.sleep(0.02)
            assert copy is not None and copy.state == "DONE", copy
            copy_s = time.time() - copy.started_at_unix_s
            print(
                f"copy: {copy.bytes_total / copy_s / 1e6:,.1f} MB/s over loopback "
                f"({copy.bytes_total / 1e6:,.1f} MB in {copy_s:.2f}s, begin to started replica; "
                f"raw scan of the same rows ran at {nbytes / scan_s / 1e6:,.1f} MB/s)"
            )

            # --- idle tablets --------------------------------------------------------------
            three = [ts for name, ts in cluster.tservers.items() if name != "ts-4"]
            pids = [ts.proc.pid for ts in three if ts.proc is not None]
            status("measuring the tablet servers before the idle tablets")
            # Past flush_idle_ms (10 s) after the last write, and the flush and compaction it
            # starts: otherwise they land in this window and inflate the "before" figure.
            await asyncio.sleep(15.0)
            before = await servers_cpu(pids, 10.0)
            status(f"creating {args.idle_tablets} idle 3-replica tablets")
            idle_peers = [(ts.uuid, ts.address) for ts in three]
            slots = asyncio.Semaphore(8)

            async def create(i: int) -> None:
                async with slots:
                    for uuid, _ in idle_peers:
                        await stubs.admin(uuid).CreateTablet(
                            create_request(uuid, f"idle-{i}", idle_peers), timeout=60
                        )

            await asyncio.gather(*(create(i) for i in range(args.idle_tablets)))
            await asyncio.sleep(5.0)  # elections settle
            after = await servers_cpu(pids, 10.0)

            # The baseline: the same servers and tablets, restarted without quiescence.
            status("restarting the three servers with quiesce_idle_ms = 0 (the baseline)")
            cluster.tserver_overrides = {**cluster.tserver_overrides, "quiesce_idle_ms": "0"}
            names = [name for name in cluster.tservers if name != "ts-4"]
            for name in names:
                cluster.kill_tserver(name, signal.SIGTERM)
            for name in names:
                cluster.start_tserver(name)
            pids = [cluster.tservers[name].proc.pid for name in names]  # type: ignore[union-attr]
            await asyncio.sleep(10.0)  # every tablet opened, elections settled
            awake = await servers_cpu(pids, 10.0)

            def per_replica_ms(cores: list[float]) -> float:  # one replica per server
                extra = sum(cores) / len(cores) - sum(before) / len(before)
                return 1000 * max(0.0, extra) / args.idle_tablets

            def cores(values: list[float]) -> str:
                return ", ".join(f"{c:.3f}" for c in values)

            quiet_ms, awake_ms = per_replica_ms(after), per_replica_ms(awake)
            print(
                f"idle: {args.idle_tablets} idle 3-replica tablets: {cores(after)} cores per "
                f"tablet server (before they were created: {cores(before)}; the same servers "
                f"restarted with quiesce_idle_ms = 0: {cores(awake)}); per idle replica "
                f"{quiet_ms:.3f} ms of CPU per second quiesced, {awake_ms:.3f} without: "
                f"ratio {quiet_ms / awake_ms if awake_ms else float('nan'):.2f}"
            )
            print(mvcc)
        finally:
            await stubs.close()


async def versions(
    args: argparse.Namespace,
    stubs: ClusterStubs,
    peers: list[tuple[str, str]],
    first_leader: str,
    cluster: MiniCluster,
    write_s: float,
) -> str:
    """The versions figure (module docstring); returns the `mvcc:` line."""
    n = args.mvcc_rows
    for uuid, _ in peers:
        await stubs.admin(uuid).CreateTablet(create_request(uuid, MVCC_TABLET, peers))
    mstubs = ClusterStubs(cluster, MVCC_TABLET)
    try:
        leader = await mstubs.leader([u for u, _ in peers])
        pid = cluster.tserver_by_uuid(leader).proc.pid  # type: ignore[union-attr]
        rss0 = rss_mb(pid)
        at = 0
        for version in range(1, 11):
            status(f"versions: round {version}/10 of {n:,} upserts")
            for lo in range(0, n, args.batch):
                t = rows(lo, min(lo + args.batch, n))
                t = t.set_column(2, "score", pa.array([float(version)] * t.num_rows))
                resp = await mstubs.data(leader).Write(
                    write_request(leader, MVCC_TABLET, t, tpb.ROW_OP_UPSERT), timeout=60
                )
                assert not resp.per_row_errors
                if version == 5:
                    at = max(at, resp.commit_timestamp)
        wait = physical_us(at) / 1e6 + args.mvcc_age_s - time.time()
        status(f"versions: waiting {max(0.0, wait):.0f}s until the snapshot is old enough")
        await asyncio.sleep(max(0.0, wait))
        latest, snap = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            got = await scan_all(mstubs.scan(leader), leader, MVCC_TABLET, batch_size_bytes=8 << 20)
            latest.append(time.perf_counter() - t0)
            assert got.num_rows == n and set(got.column("score").to_pylist()) == {10.0}
            t0 = time.perf_counter()
            old = await scan_all(
                mstubs.scan(leader),
                leader,
                MVCC_TABLET,
                batch_size_bytes=8 << 20,
                snapshot_timestamp=at,
            )
            snap.append(time.perf_counter() - t0)
            assert old.num_rows == n and set(old.column("score").to_pylist()) == {5.0}
        listed = await stubs.admin(first_leader).ListTablets(
            tpb.ListTabletsRequestPB(dest_uuid=first_leader)
        )
        sizes = {r.tablet_id: r.on_disk_bytes for r in listed.replicas}
        mlisted = await mstubs.admin(leader).ListTablets(tpb.ListTabletsRequestPB(dest_uuid=leader))
        msize = next(r.on_disk_bytes for r in mlisted.replicas if r.tablet_id == MVCC_TABLET)
        plain = sizes[TABLET] / args.rows
        history = msize / n - plain
        anon, mapped = (now - before for now, before in zip(rss_mb(pid), rss0, strict=True))
        nbytes = got.nbytes
        r = min(snap) / min(latest)
        print(
            f"versions: {n:,} rows x 10 versions; scan of the newest "
            f"{nbytes / min(latest) / 1e6:,.1f} MB/s, at a snapshot {args.mvcc_age_s:.0f}s old "
            f"{nbytes / min(snap) / 1e6:,.1f} MB/s "
            f"(first {snap[0]:.3f}s, best {min(snap):.3f}s against {min(latest):.3f}s); disk "
            f"{msize / n:,.0f} bytes/row against {plain:,.0f} with one version; leader RSS "
            f"{anon + mapped:+,.0f} MB (anonymous {anon:+,.0f}, mapped files {mapped:+,.0f})"
        )
        w = args.rows / write_s
        return (
            f"mvcc: snapshot/latest scan time {r:.2f}, write {w:,.0f} rows/s (before "
            f"{WRITE_BEFORE:,}), history {history:,.0f} bytes/row"
        )
    finally:
        await mstubs.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tserver_bench", description=__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--idle-tablets", type=int, default=200)
    p.add_argument("--mvcc-rows", type=int, default=200_000)
    p.add_argument(
        "--mvcc-age-s", type=float, default=300.0, help="age of the snapshot read (default 300)"
    )
    p.add_argument(
        "--write-only", action="store_true", help="only the write figure (an A/B of the write path)"
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext, no authorization (security.mode = insecure): what TLS costs the scan",
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as d:
        asyncio.run(run(args, Path(d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
