"""One load generator for every system the Raft benchmarks compare (Tessera, etcd, PySyncObj).

    .venv/bin/python -m bench.loadgen --kind kvdemo --addresses 127.0.0.1:7101,... [--clients 64]

Theory of operation
-------------------
`run_load(spec)` starts `spec.procs` worker processes (`python -m bench.loadgen --worker ...`),
away from the benchmark's own process, so the servers and the generator each get the scheduler's
fair share of the 2 cores and the generator's GIL is its own. The clients are split evenly
across the processes. Each process runs its clients as asyncio tasks on one event loop with
grpc.aio, pipelined over a few channels per server (`channels`, each its own TCP connection via
a local subchannel pool), so 64 concurrent requests are 64 outstanding RPCs, not 64 threads.
Every target's put is one method bound once per channel (`_Channels.unary`), the same code path
for all of them.

A client loops: put a distinct key (`<run>-<proc>-<client>-<seq>`) with a `value_size`-byte
value, await the acknowledgement, repeat. Every process builds its target, finds the leader,
then reports `ready`; the parent answers with one start time for all. Puts run for
`warmup + seconds`; only puts *completed* inside the measurement window [start + warmup,
start + warmup + seconds) count, for throughput and for latency (the time from sending the
put to its acknowledgement). The generator's own CPU (user + system of all its threads, from
getrusage) is measured over the same window and reported in cores, and so is the CPU of any
server process whose pid the caller passes: if the generator is near 1 core per process, it,
and not the servers, is the bottleneck.

Targets (`kind`), each a `put(key, value)` coroutine that returns the acknowledging address:

  kvdemo  the `tessera.kvdemo.KvDemo` API (Put + Status). Tessera's demo server speaks it, and so
          does the PySyncObj adapter (bench/pysyncobj_node.py), so both are driven by the same
          client code. Puts go straight to the leader, found with Status; a NOT_THE_LEADER answer
          (gRPC UNAVAILABLE with trailing metadata `tessera-leader-address`) switches to the
          hinted leader, any other UNAVAILABLE re-discovers it.
  kvdemo-stream  the same API's PutStream: each client keeps one bidirectional stream to the
          leader and writes its next put once the last is answered (the same load: one put in
          flight per client), at a fraction of gRPC's per-call cost (a unary call costs a
          grpc.aio server several hundred microseconds of CPU). A failed put ends the stream
          with the same status and hint; the next put opens a new one.
  etcd    etcd's v3 `etcdserverpb.KV/Put` (bench/protos/etcd_kv.proto). Puts go to the leader too,
          found from each member's `/metrics` (`etcd_server_is_leader 1`), so no member forwards.

Security: with `credentials` (a directory of ca.pem, cert.pem, key.pem, `pki.IdentityFiles`)
every channel is mutual TLS (`service.common.tls.open_channel`, the client code Tessera's own
clients use), the server verified against the cluster CA and the name `tessera` every server
certificate of ours carries (etcd's included, bench/etcd_baseline.py); etcd's `/metrics` is
then read over HTTPS with the same certificate. Without it, plaintext.

Progress: each worker prints one JSON line per half second with its running count; the parent
turns them into a status line on stderr every `progress_s` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import resource
import ssl
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio

from bench.protos import etcd_kv_pb2
from service.common import channel_options
from service.common.pki import IdentityFiles
from service.common.tls import Credentials, open_channel
from service.pb import kvdemo_pb2, kvdemo_pb2_grpc

LEADER_ADDRESS_KEY = "tessera-leader-address"  # service.common.errors.LEADER_ADDRESS_KEY
KVDEMO_PUT = "/tessera.kvdemo.KvDemo/Put"  # service tessera.kvdemo.KvDemo, rpc Put
KVDEMO_PUT_STREAM = "/tessera.kvdemo.KvDemo/PutStream"
ETCD_PUT = "/etcdserverpb.KV/Put"  # service etcdserverpb.KV, rpc Put (bench/protos/etcd_kv.proto)
CHANNEL_OPTIONS = channel_options.load_generator()
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]


class Target(Protocol):
    async def ready(self, timeout: float) -> None:
        """Connect and find the leader."""
        ...

    async def put(self, key: str, value: bytes) -> str:
        """Write one key; returns the address that acknowledged it."""
        ...

    async def aclose(self) -> None: ...


class _Channels:
    """`n` channels (TCP connections) per address, handed out round-robin.

    `unary` binds a method on each channel once and reuses it: every target's put is the same
    one bound call (building a stub or a multicallable per put costs the generator CPU that
    the servers on the same machine then lack). With `creds`, every channel is mutual TLS."""

    def __init__(self, n: int, creds: Credentials | None = None) -> None:
        self.n = max(1, n)
        self.creds = creds
        self._channels: dict[str, list[grpc.aio.Channel]] = {}
        self._methods: dict[tuple[str, str], list[grpc.aio.UnaryUnaryMultiCallable]] = {}
        self._streams: dict[tuple[str, str], list[grpc.aio.StreamStreamMultiCallable]] = {}
        self._rr = itertools.count()

    def _all(self, address: str) -> list[grpc.aio.Channel]:
        chans = self._channels.get(address)
        if chans is None:
            chans = self._channels[address] = [
                open_channel(address, self.creds, options=CHANNEL_OPTIONS) for _ in range(self.n)
            ]
        return chans

    def get(self, address: str) -> grpc.aio.Channel:
        return self._all(address)[next(self._rr) % self.n]

    def unary(
        self,
        address: str,
        method: str,
        serializer: Callable[[Any], bytes],
        deserializer: Callable[[bytes], Any],
    ) -> grpc.aio.UnaryUnaryMultiCallable:
        """`method` bound on the next channel to `address` (round-robin), bound once each."""
        bound = self._methods.get((address, method))
        if bound is None:
            bound = self._methods[(address, method)] = [
                ch.unary_unary(
                    method, request_serializer=serializer, response_deserializer=deserializer
                )
                for ch in self._all(address)
            ]
        return bound[next(self._rr) % self.n]

    def stream(
        self,
        address: str,
        method: str,
        serializer: Callable[[Any], bytes],
        deserializer: Callable[[bytes], Any],
    ) -> grpc.aio.StreamStreamMultiCallable:
        """`method` (bidirectional streaming) bound on the next channel to `address`."""
        bound = self._streams.get((address, method))
        if bound is None:
            bound = self._streams[(address, method)] = [
                ch.stream_stream(
                    method, request_serializer=serializer, response_deserializer=deserializer
                )
                for ch in self._all(address)
            ]
        return bound[next(self._rr) % self.n]

    async def aclose(self) -> None:
        for chans in self._channels.values():
            for ch in chans:
                await ch.close(None)
        self._channels.clear()
        self._methods.clear()
        self._streams.clear()


class LeaderTarget:
    """Shared logic: send to the leader, follow hints, re-discover on failure, give up late."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        channels: int = 4,
        rpc_timeout: float = 10.0,
        give_up_after: float = 30.0,
        credentials: IdentityFiles | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self.credentials = credentials
        """Mutual TLS as this identity when set (module docstring); plaintext otherwise."""
        creds = None if credentials is None else Credentials.from_files(credentials)
        self.channels = _Channels(channels, creds)
        self.rpc_timeout = rpc_timeout
        self.give_up_after = give_up_after
        self.leader: str | None = None
        self._lock = asyncio.Lock()
        self.redirects = 0
        self.rediscoveries = 0

    async def _is_leader(self, address: str) -> bool:
        raise NotImplementedError

    async def _call_put(
        self, address: str, key: str, value: bytes, timeout: float, client: int
    ) -> None:
        """One put to `address` on behalf of client number `client`."""
        raise NotImplementedError

    async def ready(self, timeout: float = 30.0) -> None:
        await self._discover(None, time.monotonic() + timeout)

    async def _discover(self, stale: str | None, deadline: float) -> str:
        """The leader's address. One task polls at a time; the others wait for its answer."""
        async with self._lock:
            if self.leader is not None and self.leader != stale:
                return self.leader
            self.leader = None
            self.rediscoveries += 1
            while True:
                for address in self.addresses:
                    try:
                        if await self._is_leader(address):
                            self.leader = address
                            return address
                    except (TimeoutError, grpc.aio.AioRpcError, OSError):
                        continue
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no leader among {', '.join(self.addresses)}")
                await asyncio.sleep(0.02)

    async def put(self, key: str, value: bytes, client: int = 0) -> str:
        deadline = time.monotonic() + self.give_up_after
        while True:
            address = self.leader or await self._discover(None, deadline)
            try:
                await self._call_put(address, key, value, self.rpc_timeout, client)
                return address
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if time.monotonic() > deadline:
                    raise
                hint = _leader_hint(e)
                if hint and hint != address:
                    self.redirects += 1
                    if hint not in self.addresses:
                        self.addresses.append(hint)
                    if self.leader == address:
                        self.leader = hint
                    continue
                await asyncio.sleep(0.01)
                await self._discover(address, deadline)

    async def aclose(self) -> None:
        await self.channels.aclose()


def _leader_hint(e: grpc.aio.AioRpcError) -> str | None:
    metadata: Any = e.trailing_metadata() or ()
    for k, v in metadata:
        if k == LEADER_ADDRESS_KEY:
            return v if isinstance(v, str) else bytes(v).decode()
    return None


class KvDemoTarget(LeaderTarget):
    """The tessera.kvdemo.KvDemo API: Tessera's demo server and the PySyncObj adapter."""

    async def _is_leader(self, address: str) -> bool:
        stub = kvdemo_pb2_grpc.KvDemoStub(self.channels.get(address))
        st = await stub.Status(kvdemo_pb2.StatusRequest(), timeout=0.5)
        return bool(st.role == "LEADER")

    async def _call_put(
        self, address: str, key: str, value: bytes, timeout: float, client: int
    ) -> None:
        put = self.channels.unary(
            address,
            KVDEMO_PUT,
            kvdemo_pb2.PutRequest.SerializeToString,
            kvdemo_pb2.PutResponse.FromString,
        )
        await put(kvdemo_pb2.PutRequest(key=key, value=value), timeout=timeout)


class KvDemoStreamTarget(KvDemoTarget):
    """The KvDemo API over PutStream: each client keeps one stream to the leader and sends its
    next put once the last was answered, exactly the load of the unary target (one put in
    flight per client), for a fraction of gRPC's per-call cost. A failed put ends its stream
    (the server's status, with the leader hint, reaches `put` as an AioRpcError); the next put
    opens a new one."""

    def __init__(self, addresses: Sequence[str], **kwargs: Any) -> None:
        super().__init__(addresses, **kwargs)
        self._calls: dict[tuple[int, str], grpc.aio.StreamStreamCall] = {}

    async def _call_put(
        self, address: str, key: str, value: bytes, timeout: float, client: int
    ) -> None:
        call = self._calls.get((client, address))
        if call is None:
            open_stream = self.channels.stream(
                address,
                KVDEMO_PUT_STREAM,
                kvdemo_pb2.PutRequest.SerializeToString,
                kvdemo_pb2.PutResponse.FromString,
            )
            call = self._calls[(client, address)] = open_stream()
        try:
            async with asyncio.timeout(timeout):
                await call.write(kvdemo_pb2.PutRequest(key=key, value=value))
                resp = await call.read()
            if resp is grpc.aio.EOF:  # the server ended the stream without a status
                raise ConnectionError(f"PutStream to {address} ended")
        except BaseException:
            self._calls.pop((client, address), None)
            call.cancel()
            raise

    async def aclose(self) -> None:
        for call in self._calls.values():
            call.cancel()
        self._calls.clear()
        await super().aclose()


class EtcdTarget(LeaderTarget):
    """etcd v3 KV.Put over gRPC; the leader is found from the members' /metrics."""

    def __init__(self, addresses: Sequence[str], **kwargs: Any) -> None:
        super().__init__(addresses, **kwargs)
        self._https = None if self.credentials is None else https_context(self.credentials)

    async def _is_leader(self, address: str) -> bool:
        return await asyncio.to_thread(etcd_is_leader, address, self._https)

    async def _call_put(
        self, address: str, key: str, value: bytes, timeout: float, client: int
    ) -> None:
        # The one method needed, bound directly on the channel (no generated gRPC stub).
        put = self.channels.unary(
            address,
            ETCD_PUT,
            etcd_kv_pb2.PutRequest.SerializeToString,
            etcd_kv_pb2.PutResponse.FromString,
        )
        await put(etcd_kv_pb2.PutRequest(key=key.encode(), value=value), timeout=timeout)


def https_context(files: IdentityFiles) -> ssl.SSLContext:
    """HTTPS to a secured etcd member's client URL: its certificate verified against the CA
    (and its IP address), ours presented for `--client-cert-auth`."""
    context = ssl.create_default_context(cafile=str(files.ca_file))
    context.load_cert_chain(str(files.cert_file), str(files.key_file))
    return context


def etcd_url(address: str, path: str, https: ssl.SSLContext | None) -> str:
    return f"{'https' if https else 'http'}://{address}{path}"


def etcd_is_leader(address: str, https: ssl.SSLContext | None = None, timeout: float = 1.0) -> bool:
    """etcd serves Prometheus metrics on its client URL; `etcd_server_is_leader 1` on the leader."""
    url = etcd_url(address, "/metrics", https)
    with urllib.request.urlopen(url, timeout=timeout, context=https) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("etcd_server_is_leader "):
                return float(line.split()[1]) == 1.0
    return False


TARGETS: dict[str, Callable[..., LeaderTarget]] = {
    "kvdemo": KvDemoTarget,
    "kvdemo-stream": KvDemoStreamTarget,
    "etcd": EtcdTarget,
}


# -- the worker process ---------------------------------------------------------------------------


def _emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _worker_main(args: argparse.Namespace) -> None:
    files = IdentityFiles.in_dir(Path(args.credentials)) if args.credentials else None
    target = TARGETS[args.kind](
        args.addresses.split(","), channels=args.channels, credentials=files
    )
    await target.ready(timeout=30.0)
    _emit({"ready": True})
    line = await asyncio.to_thread(sys.stdin.readline)
    start_at = float(line.split()[1])  # "go <unix time>"
    # One clock from here on: perf_counter, anchored to the shared wall-clock start time.
    t_start = time.perf_counter() + (start_at - time.time())
    w0 = t_start + args.warmup
    w1 = w0 + args.seconds
    value = os.urandom(args.value_size)
    latencies: list[float] = []
    state = {"done": 0, "errors": 0, "window_errors": 0}
    cpu: dict[str, float] = {}
    error_kinds: dict[str, int] = {}

    async def client(i: int) -> None:
        await asyncio.sleep(max(0.0, t_start - time.perf_counter()))
        for n in itertools.count():
            t0 = time.perf_counter()
            if t0 >= w1:
                return
            try:
                await target.put(f"{args.run}-{args.proc}-{i}-{n}", value, i)
            except Exception as e:  # counted and reported; the run goes on
                t1 = time.perf_counter()
                state["errors"] += 1
                kind = type(e).__name__
                if isinstance(e, grpc.aio.AioRpcError):
                    kind = e.code().name
                error_kinds[kind] = error_kinds.get(kind, 0) + 1
                if w0 <= t1 < w1:
                    state["window_errors"] += 1
                await asyncio.sleep(0.05)
                continue
            t1 = time.perf_counter()
            state["done"] += 1
            if w0 <= t1 < w1:
                latencies.append(t1 - t0)

    async def measure_cpu() -> None:
        await asyncio.sleep(max(0.0, w0 - time.perf_counter()))
        cpu["w0"] = _cpu_seconds()
        await asyncio.sleep(max(0.0, w1 - time.perf_counter()))
        cpu["w1"] = _cpu_seconds()

    async def progress() -> None:
        while True:
            await asyncio.sleep(0.5)
            _emit({"progress": state["done"], "errors": state["errors"]})

    tasks = [asyncio.create_task(client(i)) for i in range(args.clients)]
    cpu_task = asyncio.create_task(measure_cpu())
    progress_task = asyncio.create_task(progress())
    await cpu_task
    # Let puts in flight at the end of the window finish (they are not counted), within reason.
    _, pending = await asyncio.wait(tasks, timeout=10.0)
    for t in pending:
        t.cancel()
    progress_task.cancel()
    _emit(
        {
            "result": {
                "puts": len(latencies),
                "errors": state["window_errors"],
                "error_kinds": error_kinds,
                "latencies": [round(x * 1000, 4) for x in latencies],
                "cpu_seconds": cpu["w1"] - cpu["w0"],
                "redirects": target.redirects,
                "rediscoveries": target.rediscoveries,
            }
        }
    )
    with contextlib.suppress(Exception):
        await asyncio.wait_for(target.aclose(), 2.0)


# -- the parent: spawn, synchronize, aggregate ----------------------------------------------------


@dataclass(frozen=True)
class LoadSpec:
    kind: str
    addresses: tuple[str, ...]
    clients: int = 64
    seconds: float = 10.0
    warmup: float = 2.0
    value_size: int = 16
    procs: int = 1
    channels: int = 4
    label: str = ""
    credentials: str = ""
    """A credentials directory (ca.pem, cert.pem, key.pem): mutual TLS; "" for plaintext."""


@dataclass
class LoadResult:
    label: str
    puts: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    loadgen_cores: float
    server_cores: dict[str, float] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)
    redirects: int = 0

    @property
    def rate(self) -> float:
        return self.puts / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "rate": self.rate})


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile: the smallest value with at least p% of the samples <= it."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def proc_cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def run_load(
    spec: LoadSpec,
    *,
    server_pids: Mapping[str, int] | None = None,
    progress_s: float = 2.0,
) -> LoadResult:
    """Drive `spec.addresses` with the spec's load from `spec.procs` worker processes."""
    procs = max(1, min(spec.procs, spec.clients))
    share = [spec.clients // procs + (1 if i < spec.clients % procs else 0) for i in range(procs)]
    run_id = uuid.uuid4().hex[:8]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = []
    for i, n in enumerate(share):
        args = [
            sys.executable,
            "-m",
            "bench.loadgen",
            "--worker",
            f"--kind={spec.kind}",
            f"--addresses={','.join(spec.addresses)}",
            f"--clients={n}",
            f"--seconds={spec.seconds}",
            f"--warmup={spec.warmup}",
            f"--value-size={spec.value_size}",
            f"--channels={spec.channels}",
            f"--credentials={spec.credentials}",
            f"--run={run_id}",
            f"--proc={i}",
        ]
        children.append(
            await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
                cwd=ROOT,
                limit=1 << 26,  # the result line carries every latency sample
            )
        )
    label = spec.label or spec.kind
    try:
        return await _drive(spec, label, children, server_pids or {}, progress_s)
    finally:
        for c in children:
            if c.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    c.kill()
                await c.wait()


async def _readline(child: asyncio.subprocess.Process, timeout: float) -> dict[str, object]:
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), timeout)
    if not line:
        raise RuntimeError(f"load generator process {child.pid} exited ({await child.wait()})")
    obj: dict[str, object] = json.loads(line)
    return obj


async def _drive(
    spec: LoadSpec,
    label: str,
    children: list[asyncio.subprocess.Process],
    server_pids: Mapping[str, int],
    progress_s: float,
) -> LoadResult:
    for c in children:
        msg = await _readline(c, 60.0)
        if not msg.get("ready"):
            raise RuntimeError(f"unexpected first message from the load generator: {msg}")
    start_at = time.time() + 0.2
    for c in children:
        assert c.stdin is not None
        c.stdin.write(f"go {start_at}\n".encode())
        await c.stdin.drain()
    t_start = time.perf_counter() + (start_at - time.time())
    w0, w1 = t_start + spec.warmup, t_start + spec.warmup + spec.seconds

    server_cpu: dict[str, tuple[float | None, float | None]] = {}

    async def sample_servers() -> None:
        await asyncio.sleep(max(0.0, w0 - time.perf_counter()))
        before = {name: proc_cpu_seconds(pid) for name, pid in server_pids.items()}
        await asyncio.sleep(max(0.0, w1 - time.perf_counter()))
        for name, pid in server_pids.items():
            server_cpu[name] = (before[name], proc_cpu_seconds(pid))

    counts = [0] * len(children)
    errors = [0] * len(children)
    results: list[dict[str, object]] = []

    async def read(i: int, c: asyncio.subprocess.Process) -> None:
        while True:
            msg = await _readline(c, spec.warmup + spec.seconds + 60.0)
            if "progress" in msg:
                counts[i] = int(str(msg["progress"]))
                errors[i] = int(str(msg["errors"]))
            elif "result" in msg:
                result = msg["result"]
                assert isinstance(result, dict)
                results.append(result)
                return

    async def status() -> None:
        last_n, last_t = 0, time.perf_counter()
        while True:
            await asyncio.sleep(progress_s)
            now = time.perf_counter()
            n = sum(counts)
            phase = "warm-up" if now < w0 else "measuring" if now < w1 else "draining"
            rate = (n - last_n) / max(1e-9, now - last_t)
            log(
                f"  [{label}] {phase:<9} {now - t_start:5.1f}/{spec.warmup + spec.seconds:.0f} s"
                f"  {rate:8.0f} puts/s  total {n}  errors {sum(errors)}"
            )
            last_n, last_t = n, now

    sampler = asyncio.create_task(sample_servers())
    status_task = asyncio.create_task(status())
    try:
        await asyncio.gather(*(read(i, c) for i, c in enumerate(children)))
    finally:
        status_task.cancel()
    await sampler
    for c in children:
        await c.wait()

    lat = sorted(x for r in results for x in _floats(r["latencies"]))
    kinds: dict[str, int] = {}
    for r in results:
        ek = r["error_kinds"]
        assert isinstance(ek, dict)
        for k, v in ek.items():
            kinds[k] = kinds.get(k, 0) + int(v)
    cores = {
        name: (b - a) / spec.seconds
        for name, (a, b) in server_cpu.items()
        if a is not None and b is not None
    }
    return LoadResult(
        label=label,
        puts=len(lat),
        seconds=spec.seconds,
        errors=sum(int(str(r["errors"])) for r in results),
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        mean_ms=sum(lat) / len(lat) if lat else math.nan,
        loadgen_cores=sum(float(str(r["cpu_seconds"])) for r in results) / spec.seconds,
        server_cores=cores,
        error_kinds=kinds,
        redirects=sum(int(str(r["redirects"])) for r in results),
    )


def _floats(obj: object) -> list[float]:
    assert isinstance(obj, list)
    return [float(x) for x in obj]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Raft benchmark load generator")
    p.add_argument("--kind", choices=sorted(TARGETS), required=True)
    p.add_argument("--addresses", required=True, help="comma-separated host:port list")
    p.add_argument("--clients", type=int, default=64, help="concurrent puts in flight")
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--value-size", type=int, default=16)
    p.add_argument("--procs", type=int, default=1, help="load generator processes")
    p.add_argument("--channels", type=int, default=4, help="connections per server per process")
    p.add_argument("--credentials", default="", help="mutual TLS as the identity in this directory")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run", default="", help=argparse.SUPPRESS)
    p.add_argument("--proc", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        asyncio.run(_worker_main(args))
        return 0
    spec = LoadSpec(
        kind=args.kind,
        addresses=tuple(args.addresses.split(",")),
        clients=args.clients,
        seconds=args.seconds,
        warmup=args.warmup,
        value_size=args.value_size,
        procs=args.procs,
        channels=args.channels,
        credentials=args.credentials,
    )
    r = asyncio.run(run_load(spec))
    print(
        f"{r.label}: {r.rate:.0f} puts/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, "
        f"errors {r.errors}, load generator {r.loadgen_cores:.2f} cores"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
