"""Scan tokens and the fault-tolerant tablet scanner.

Theory of operation
-------------------
A `ScanToken` is everything needed to scan one tablet (or one key range of it), as a plain
value: the masters, the table and its schema version, the tablet, primary-key bounds, the
projection, predicates in their wire form, the replicas known when it was made, and the scan
options. It is what the Spark DataSource ships from the driver to executors (Kudu's scan
tokens): picklable, and `to_bytes()`/`from_bytes()` give a stable JSON form for anything else.

`TabletScanner.batches()` turns a token into Arrow record batches:

1. Order the replicas by the selection policy. `leader`: the leader first (the freshest state,
   Kudu's LEADER_ONLY default), the followers only to fail over. `closest`: replicas on this
   host first, then the leader, then the rest (Kudu's CLOSEST_REPLICA; a Spark executor beside
   a tablet server reads locally).
2. Open a scanner on the first one and page through it (Scan, then ScanNext with call
   sequence numbers, each page an Arrow IPC stream).
3. On a failure a retry can fix (the server is unreachable, the replica stopped running or moved
   away, the scanner expired, a leader-only scan hit a follower) and with `fault_tolerant` on,
   move to the next replica and open a new scan that starts *after the last primary key
   returned* (`start_after_primary_key`) with `min_applied_index` set to the index the first
   scan read, so the new replica has at least that state: no row is returned twice and no row
   the first replica had is missed. A snapshot scan (`snapshot_timestamp`) resumes at the
   same timestamp, so the result is exactly the table as of it, whichever replicas served it
   (docs/design/tablets.md#R4). When every replica has failed, ask the master for fresh
   locations and start over, with backoff, until the scan deadline.

Exactness relies on the tablet server returning rows in primary-key order (it does: the row
store merges in key order) and reporting `last_primary_key` for each page.

Pages. The scanner asks for the next page as soon as a page arrives, before it hands out that
page's rows (Kudu's Java client calls this prefetching), so the server reads and encodes page
k+1, and the page crosses the network, while the consumer uses page k, whenever the consumer
lets the event loop run. A `SyncClient` consumer (a Spark task, the CLI) always does: the loop
runs in its own thread and is idle while the task converts a batch, which is when it was
idle before, waiting for the task's next pull. One page is read ahead, never more: its memory
is one `batch_size_bytes`. A failure of that page is raised only after the rows of the page
before it were handed out and its last key kept, so a fault-tolerant scan resumes exactly
where the consumer is; a consumer that stops early cancels it and the scanner is closed as
before.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from typing import Any, Protocol

import pyarrow as pa

from service.client.channels import ChannelPool
from service.client.master_client import MasterClient
from service.client.meta_cache import MetaCache, location_from_pb
from service.client.retry import Backoff, Deadline
from service.client.scan_reply import ScanReply
from service.common.errors import (
    InvalidArgument,
    InvalidAuthzToken,
    NotFound,
    NotTheLeader,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    WrongDestination,
)
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb

__all__ = ["REPLICA_SELECTIONS", "ScanClient", "ScanToken", "TabletScanner", "TokenReplica"]

log = logging.getLogger(__name__)

REPLICA_SELECTIONS = ("leader", "closest")


@dataclass(frozen=True)
class TokenReplica:
    ts_uuid: str
    address: str
    is_leader: bool


@dataclass(frozen=True)
class ScanToken:
    """One tablet's scan, as a value (module docstring). Bytes fields are raw bytes."""

    masters: tuple[str, ...]
    table_id: str
    table_name: str
    schema_version: int
    tablet_id: str
    replicas: tuple[TokenReplica, ...]
    projection: tuple[str, ...] | None = None
    predicates: tuple[bytes, ...] = ()
    """Serialized ColumnPredicatePB messages (values already in the cell encoding)."""
    lower_key: bytes = b""
    """Inclusive lower bound on the encoded primary key (b"": none)."""
    upper_key: bytes = b""
    """Exclusive upper bound on the encoded primary key (b"": none)."""
    limit: int = 0
    replica_selection: str = "leader"
    fault_tolerant: bool = True
    batch_size_bytes: int = 0
    """Page size asked of the server (0: its default, 2 MB)."""
    rpc_timeout_s: float = 30.0
    """Deadline of one Scan/ScanNext call."""
    scan_timeout_s: float = 120.0
    """How long the scan may keep failing over before it gives up."""
    min_applied_index: int = 0
    """Read-your-writes: the replica must have applied at least this index."""
    partition_key_start: bytes = b""
    partition_key_end: bytes = b""
    authz_token: bytes = field(default=b"", repr=False)
    """For a user: the master-signed token naming the privileges on the table (it expires;
    the scanner fetches a fresh one when a tablet server refuses it). Never printed."""
    snapshot_timestamp: int = 0
    """READ_AT_SNAPSHOT at this hybrid timestamp (docs/design/tablets.md#R4); 0: READ_LATEST."""
    diff_start_timestamp: int = 0
    """A diff scan: the rows changed after this timestamp, as of `snapshot_timestamp`."""
    propagated_timestamp: int = 0
    """The newest hybrid timestamp the client had seen when it made the token."""

    def __post_init__(self) -> None:
        if self.replica_selection not in REPLICA_SELECTIONS:
            raise InvalidArgument(
                f"replica_selection: expected one of {', '.join(REPLICA_SELECTIONS)}, "
                f"got {self.replica_selection!r}"
            )

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = asdict(self)
        for k, v in list(d.items()):
            if isinstance(v, bytes):
                d[k] = {"b64": base64.b64encode(v).decode()}
        d["predicates"] = [base64.b64encode(p).decode() for p in self.predicates]
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ScanToken:
        try:
            d = json.loads(data)
            for k, v in list(d.items()):
                if isinstance(v, dict) and set(v) == {"b64"}:
                    d[k] = base64.b64decode(v["b64"])
            d["predicates"] = tuple(base64.b64decode(p) for p in d["predicates"])
            d["masters"] = tuple(d["masters"])
            d["replicas"] = tuple(TokenReplica(**r) for r in d["replicas"])
            if d["projection"] is not None:
                d["projection"] = tuple(d["projection"])
            return cls(**d)
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgument(f"not a scan token: {e}") from None

    def predicate_pbs(self) -> list[tpb.ColumnPredicatePB]:
        return [tpb.ColumnPredicatePB.FromString(p) for p in self.predicates]


@cache
def _local_hosts() -> frozenset[str]:
    """Names and addresses of this machine, for `closest` replica selection."""
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return frozenset(names)


def order_replicas(
    replicas: Sequence[TokenReplica], selection: str, local: frozenset[str] | None = None
) -> list[TokenReplica]:
    """Replicas in the order a scan tries them (module docstring, step 1)."""
    if selection == "leader":
        return sorted(replicas, key=lambda r: not r.is_leader)
    hosts = _local_hosts() if local is None else local
    return sorted(
        replicas, key=lambda r: (r.address.rpartition(":")[0] not in hosts, not r.is_leader)
    )


_FAIL_OVER = (ServiceUnavailable, NotFound, Timeout, NotTheLeader, WrongDestination)
"""Errors after which another replica may succeed (with fault tolerance on)."""


class ScanClient(Protocol):
    """What a tablet scanner uses of its client (a `TesseraClient`): the channels to the
    replicas, the master for fresh locations, the location cache for a fresh authorization
    token, and the client's newest hybrid timestamp, which a scan both sends and advances. Named
    here, rather than the client imported, so that this module does not depend on the client
    that imports it."""

    @property
    def meta(self) -> MetaCache: ...

    @property
    def master(self) -> MasterClient: ...

    @property
    def channels(self) -> ChannelPool: ...

    @property
    def latest_timestamp(self) -> int: ...

    def observe_timestamp(self, ts: int) -> None: ...


def _ignore_outcome(fut: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a page read ahead and then abandoned, so that asyncio does
    not log its error as never retrieved."""
    if not fut.cancelled():
        fut.exception()


@dataclass
class TabletScanner:
    """Scans one token's tablet, failing over between replicas (module docstring)."""

    client: ScanClient
    token: ScanToken
    rows_returned: int = 0
    last_key: bytes = b""
    read_index: int = 0
    """Applied index the first successful scan read; later scans wait for it."""
    replicas_tried: list[str] = field(default_factory=list)
    failovers: int = 0
    authz_refreshes: int = 0

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        tok = self.token
        deadline = Deadline.after(tok.scan_timeout_s)
        backoff = Backoff()
        replicas = order_replicas(tok.replicas, tok.replica_selection)
        last_error: TesseraError | None = None
        while True:
            for rep in replicas:
                if tok.limit and self.rows_returned >= tok.limit:
                    return
                self.replicas_tried.append(rep.ts_uuid)
                try:
                    async for b in self._scan_replica(rep):
                        yield b
                    return
                except TesseraError as e:
                    if isinstance(e, InvalidAuthzToken) and self.authz_refreshes < 2:
                        self.authz_refreshes += 1  # expired on the way: fresh token, same replica
                        token = await self.client.meta.refresh_authz_token(
                            tok.table_id, max(0.1, deadline.remaining())
                        )
                        self.token = tok = replace(tok, authz_token=token)
                        replicas = [rep] + [r for r in replicas if r is not rep]
                        break
                    if not tok.fault_tolerant or not isinstance(e, _FAIL_OVER):
                        raise
                    last_error = e
                    self.failovers += 1
                    log.info(
                        "scan of tablet %s on %s failed (%s); failing over after %d rows",
                        tok.tablet_id,
                        rep.ts_uuid,
                        e,
                        self.rows_returned,
                    )
                    if tok.replica_selection == "leader" and isinstance(e, NotTheLeader):
                        hint = e.leader_uuid
                        nxt = next((r for r in tok.replicas if r.ts_uuid == hint), None)
                        if nxt is not None and nxt is not rep:
                            replicas = [nxt] + [r for r in replicas if r is not nxt]
                            break
            else:
                if deadline.expired():
                    raise Timeout(
                        f"scan of tablet {tok.tablet_id} failed on every replica for "
                        f"{tok.scan_timeout_s:.0f}s; last error: {last_error}"
                    )
                await backoff.sleep(deadline)
                replicas = await self._refresh_replicas(deadline)
                continue
            if deadline.expired():
                raise Timeout(f"scan of tablet {tok.tablet_id}: {last_error}")

    async def _refresh_replicas(self, deadline: Deadline) -> list[TokenReplica]:
        """Fresh replicas of the tablet from the master (it may have moved or re-elected)."""
        try:
            r: mpb.GetTabletLocationsResponsePB = await self.client.master.call(
                "GetTabletLocations",
                mpb.GetTabletLocationsRequestPB(tablet_ids=[self.token.tablet_id]),
                max(0.1, deadline.remaining()),
            )
        except TesseraError as e:
            log.info("refreshing locations of %s failed: %s", self.token.tablet_id, e)
            return order_replicas(self.token.replicas, self.token.replica_selection)
        if r.errors:
            err = r.errors[0].error
            raise NotFound(f"tablet {self.token.tablet_id}: {err.message} ({err.code})")
        loc = location_from_pb(r.tablet_locations[0], 0.0)
        reps = tuple(TokenReplica(x.ts_uuid, x.address, x.is_leader) for x in loc.replicas)
        self.token = replace(self.token, replicas=reps)
        return order_replicas(reps, self.token.replica_selection)

    def _new_scan(self) -> tpb.NewScanRequestPB:
        tok = self.token
        ns = tpb.NewScanRequestPB(
            tablet_id=tok.tablet_id,
            projected_columns=list(tok.projection or ()),
            predicates=tok.predicate_pbs(),
            lower_bound_primary_key=tok.lower_key,
            exclusive_upper_bound_primary_key=tok.upper_key,
            start_after_primary_key=self.last_key,
            min_applied_index=max(self.read_index, tok.min_applied_index),
        )
        if tok.snapshot_timestamp:
            ns.read_mode = tpb.READ_AT_SNAPSHOT
            ns.snapshot_timestamp = tok.snapshot_timestamp
            ns.diff_start_timestamp = tok.diff_start_timestamp
            # The snapshot fixes the state read: no applied-index wait on another replica.
            ns.min_applied_index = tok.min_applied_index
        ns.propagated_timestamp = max(tok.propagated_timestamp, self.client.latest_timestamp)
        if tok.limit:
            ns.limit = tok.limit - self.rows_returned
        return ns

    async def _scan_replica(self, rep: TokenReplica) -> AsyncIterator[pa.RecordBatch]:
        tok = self.token
        stub = self.client.channels.tserver(rep.address)
        scanner_id = b""
        seq = 0
        finished = False
        ahead: asyncio.Future[ScanReply] | None = None
        try:
            resp: ScanReply = await stub.Scan(  # type: ignore[misc]
                tpb.ScanRequestPB(
                    dest_uuid=rep.ts_uuid,
                    new_scan=self._new_scan(),
                    batch_size_bytes=tok.batch_size_bytes,
                    authz_token=tok.authz_token,
                ),
                timeout=tok.rpc_timeout_s,
            )
            self.read_index = max(self.read_index, resp.applied_index)
            self.client.observe_timestamp(resp.snapshot_timestamp)
            while True:
                scanner_id = resp.scanner_id
                if resp.has_more_results:
                    # Read one page ahead (module docstring, "Pages"): the server reads and
                    # sends the next page while the consumer uses this one.
                    seq += 1
                    ahead = asyncio.ensure_future(self._next_page(stub, rep, scanner_id, seq, tok))
                for batch in pa.ipc.open_stream(resp.batch):
                    if batch.num_rows:
                        self.rows_returned += batch.num_rows
                        yield batch
                if resp.last_primary_key:
                    self.last_key = resp.last_primary_key
                if ahead is None:
                    finished = True
                    return
                # A failure of the page read ahead surfaces here, after this page's rows and
                # its last key were taken: a resumed scan starts right after them.
                resp, ahead = await ahead, None
        finally:
            if ahead is not None:  # the consumer stopped early, or this page failed
                ahead.cancel()
                ahead.add_done_callback(_ignore_outcome)
            if scanner_id and not finished:
                await self._close_quietly(stub, rep, scanner_id)

    @staticmethod
    async def _next_page(
        stub: Any, rep: TokenReplica, scanner_id: bytes, seq: int, tok: ScanToken
    ) -> ScanReply:
        resp: ScanReply = await stub.ScanNext(
            tpb.ScanNextRequestPB(
                dest_uuid=rep.ts_uuid,
                scanner_id=scanner_id,
                call_seq_id=seq,
                batch_size_bytes=tok.batch_size_bytes,
            ),
            timeout=tok.rpc_timeout_s,
        )
        return resp

    @staticmethod
    async def _close_quietly(stub: Any, rep: TokenReplica, scanner_id: bytes) -> None:
        """Free the server's scanner early (it would expire on its own after its TTL)."""
        try:
            await stub.ScanClose(
                tpb.ScanCloseRequestPB(dest_uuid=rep.ts_uuid, scanner_id=scanner_id), timeout=2
            )
        except TesseraError:
            pass
