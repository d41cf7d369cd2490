"""The tablet-server simulator in several processes (`--shards K`): one event loop can heartbeat
for only so many servers over TLS, so the fleet is split across K simulator processes.

    python -m service.testing.ts_simulator --masters ... --uuid ts --count 1000 --shards 4 \\
        --port-file F [--stats-file S] [--pki DIR]

The command starts K children (each `--shard-index i`), server i of the fleet in child i mod K,
and waits for them: F gets {address, addresses, pid, uuids} once every child serves, S the
children's statistics merged each second (counts summed; each p99 the worst child's, an upper
bound of the fleet's), and SIGTERM stops them all.

Between the children (`SocketBus`): a tablet's group is decided by its owner shard (a hash of
the tablet id) and its replicas live on their servers' shards, so they exchange the
simulator's messages (service/testing/ts_simulator.py, "Shards") as JSON lines over Unix
sockets, and owner calls (AlterSchema, ChangeConfig) as a request and its answer; an error
travels as its TesseraError code and comes back as that class. The sockets are in a directory
only the user running the fleet may open (mode 0700, made by `tempfile.mkdtemp`), which is the
bus's whole access control: nothing but the fleet's own processes can connect, and the bus
never listens on the network.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from service.common.errors import NotTheLeader, ServiceUnavailable, TesseraError, error_class

__all__ = ["SocketBus", "merge_stats", "run_fleet", "shard_uuids", "uuids_for"]

CALL_TIMEOUT_S = 10.0


def uuids_for(uuid: str, count: int) -> list[str]:
    """`uuid` alone, or `uuid-0001` ... `uuid-<count>` for a fleet."""
    return [uuid] if count == 1 else [f"{uuid}-{i:04d}" for i in range(1, count + 1)]


def shard_uuids(uuids: list[str], index: int, count: int) -> list[str]:
    """The servers shard `index` of `count` simulates: every count-th, from the index."""
    return uuids[index::count]


def owner_of(tablet_id: str, count: int) -> int:
    return zlib.crc32(tablet_id.encode()) % count


class SocketBus:
    """One shard's links to the others: a Unix socket server for what they send, one
    connection to each other shard for what it sends (opened on first use, FIFO per pair)."""

    def __init__(self, index: int, count: int, directory: Path, uuids: list[str]) -> None:
        self.index = index
        self.count = count
        self.directory = directory
        self._host = {u: i % count for i, u in enumerate(uuids)}
        self.on_message: Any = None
        """fn(msg): a one-way message for this shard (the simulator's `on_message`)."""
        self.on_call: Any = None
        """fn(msg) -> dict: an owner call (the simulator's `on_call`); raises TesseraError."""
        self._queues: dict[int, asyncio.Queue[bytes]] = {}
        self._writers: list[asyncio.Task[None]] = []
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None

    def path(self, index: int) -> Path:
        return self.directory / f"shard-{index}.sock"

    def owner_of(self, tablet_id: str) -> int:
        return owner_of(tablet_id, self.count)

    def host_of(self, uuid: str) -> int | None:
        return self._host.get(uuid)

    async def start(self) -> None:
        mode = stat.S_IMODE(self.directory.stat().st_mode)
        if mode & 0o077:
            raise PermissionError(f"{self.directory} is open to others (mode {mode:o}): 0700")
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path(self.index)))
        os.chmod(self.path(self.index), 0o600)

    async def aclose(self) -> None:
        for task in self._writers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            self._server.close()

    def send(self, shard: int, msg: dict[str, Any]) -> None:
        q = self._queues.get(shard)
        if q is None:
            q = self._queues[shard] = asyncio.Queue()
            self._writers.append(asyncio.create_task(self._write(shard, q)))
        q.put_nowait(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    async def call(self, shard: int, msg: dict[str, Any]) -> dict[str, Any]:
        call_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        self.send(shard, {"k": "call", "id": call_id, "from": self.index, "m": msg})
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                answer = await fut
        except TimeoutError:
            raise ServiceUnavailable(
                f"shard {shard} did not answer in {CALL_TIMEOUT_S} s"
            ) from None
        finally:
            self._pending.pop(call_id, None)
        if "error" in answer:
            code, message, leader = answer["error"]
            if code == NotTheLeader.code:
                raise NotTheLeader(message, leader_uuid=leader or None)
            raise (error_class(code) or ServiceUnavailable)(message)
        return answer

    async def _write(self, shard: int, q: asyncio.Queue[bytes]) -> None:
        """Connect (the other shard may still be starting), then write queued lines in
        batches; a broken connection ends the fleet's usefulness, so it is logged loudly."""
        deadline = time.monotonic() + 30
        while True:
            try:
                _, writer = await asyncio.open_unix_connection(str(self.path(shard)))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        while True:
            lines = [await q.get()]
            while not q.empty():
                lines.append(q.get_nowait())
            writer.write(b"".join(lines))
            await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._read(reader)
        except asyncio.CancelledError:
            # Shutdown cancels this connection's task, and Python 3.11's stream server then
            # asks the task for its exception, which raises for a cancelled task and is
            # logged as an "Exception in callback" with a traceback. The task is the
            # connection's top level: ending it normally is the whole of its shutdown.
            pass
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        reader._limit = 1 << 24  # type: ignore[attr-defined]  # a full view can be long
        while line := await reader.readline():
            msg = json.loads(line)
            kind = msg["k"]
            if kind == "call":
                self.send(msg["from"], {"k": "reply", "id": msg["id"], "r": self._answer(msg["m"])})
            elif kind == "reply":
                fut = self._pending.get(msg["id"])
                if fut is not None and not fut.done():
                    fut.set_result(msg["r"])
            else:
                self.on_message(msg)

    def _answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            return dict(self.on_call(msg))
        except TesseraError as e:
            leader = e.leader_uuid if isinstance(e, NotTheLeader) else None
            return {"error": [e.code, e.message, leader or ""]}


# --- the fleet: K children and their merged statistics ----------------------------------------


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The children's statistics as one fleet's: counts summed, each p99 the worst child's."""
    out: dict[str, Any] = {"shards": len(parts)}
    for key in (
        "heartbeats",
        "failed",
        "replicas",
        "leaders",
        "recent_heartbeats",
        "copies_triggered",
    ):
        out[key] = sum(int(p.get(key, 0)) for p in parts)
    for key in ("p99_s", "recent_p99_s"):
        out[key] = max((float(p.get(key, 0.0)) for p in parts), default=0.0)
    out["rounds"] = min((int(p.get("rounds", 0)) for p in parts), default=0)
    out["recent_s"] = max((float(p.get("recent_s", 0.0)) for p in parts), default=0.0)
    errors: dict[str, int] = {}
    for p in parts:
        for k, v in p.get("errors", {}).items():
            errors[k] = errors.get(k, 0) + int(v)
    out["errors"] = errors
    reported: dict[str, int] = {}
    for p in parts:
        for k, v in p.get("reported", {}).items():
            reported[k] = reported.get(k, 0) + int(v)
    out["reported"] = reported
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def run_fleet(args: argparse.Namespace, argv: list[str]) -> int:
    """The parent of `--shards K`: start the children, publish the port file, merge their
    statistics each second, stop them on SIGTERM/SIGINT (or when one dies: exit 1)."""
    from service.tools.launcher import terminate_all

    directory = Path(tempfile.mkdtemp(prefix="tsim-"))  # mode 0700: the bus's access control
    children: list[subprocess.Popen[bytes]] = []
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for i in range(args.shards):
            cmd = [sys.executable, "-m", "service.testing.ts_simulator", *argv]
            cmd += ["--shard-index", str(i), "--shard-dir", str(directory)]
            cmd += ["--port-file", str(directory / f"shard-{i}.port")]
            if args.stats_file is not None:
                cmd += ["--stats-file", str(directory / f"shard-{i}.stats")]
            children.append(subprocess.Popen(cmd))
        ports = [directory / f"shard-{i}.port" for i in range(args.shards)]
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in ports):
            if stop or any(c.poll() is not None for c in children):
                return 1
            if time.monotonic() > deadline:
                print("ts_simulator: a shard did not start within 60 s", file=sys.stderr)
                return 1
            time.sleep(0.05)
        infos = [json.loads(p.read_text()) for p in ports]
        if args.port_file is not None:
            _write_json(
                Path(args.port_file),
                {
                    "address": infos[0]["address"],
                    "addresses": [i["address"] for i in infos],
                    "pid": os.getpid(),
                    "pids": [i["pid"] for i in infos],
                    "uuids": uuids_for(args.uuid, args.count),
                },
            )
        while not stop:
            time.sleep(1.0)
            if any(c.poll() is not None for c in children):
                print("ts_simulator: a shard exited; stopping the fleet", file=sys.stderr)
                return 1
            if args.stats_file is not None:
                _merge_files(directory, args.shards, Path(args.stats_file))
        terminate_all(children)
        if args.stats_file is not None:
            _merge_files(directory, args.shards, Path(args.stats_file))
        return 0
    finally:
        terminate_all(children)
        shutil.rmtree(directory, ignore_errors=True)


def _merge_files(directory: Path, count: int, out: Path) -> None:
    parts = []
    for i in range(count):
        with contextlib.suppress(OSError, ValueError):
            parts.append(json.loads((directory / f"shard-{i}.stats").read_text()))
    if parts:
        _write_json(out, merge_stats(parts))
