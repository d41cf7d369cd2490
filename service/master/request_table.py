"""The request-id table of sys.catalog: exactly-once DDL across leader failovers.

A DDL call carries a request id (client id, seq no) kept across its retries. `SysCatalogState`
asks this table, at apply, whether the id already took effect; if it did, the remembered
response is returned and nothing is applied again, so a client that retries on a new leader
gets the original answer, not ALREADY_EXISTS or NOT_FOUND. Being part of the replicated state
(built at apply, written into snapshots), the table is the same on every master.

A result is remembered per (client id, seq no) with the index it took effect at. The table is
bounded, deterministically (the bounds are constructor arguments, written into every snapshot,
and must be equal on every replica; `SysCatalogState.restore` refuses a snapshot made with
other bounds):

* per client, at most `max_results_per_client` results: beyond, the lowest seq no is forgotten;
* a result is forgotten once `request_retention_entries` log entries have been applied after
  it (age measured in log index, never in time); a client whose last result is forgotten is
  forgotten altogether;
* a client's `first_incomplete_seq_no` lets the results below it be forgotten early.

Forgetting a result raises the client's low-water mark: a retry of a forgotten request is
refused as stale (FAILED_PRECONDITION) rather than executed twice. Once a whole client is
forgotten (no request of it for the retention window), a very late retry would run again; the
catalog manager's preconditions (name taken, row versions) still stop most such repeats.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from service.common.errors import Corruption, FailedPrecondition, InvalidArgument
from service.master.catalog_records import RequestId
from service.pb import master_pb2 as pb

__all__ = ["RememberedResult", "RequestTable"]


@dataclass(frozen=True)
class RememberedResult:
    client_id: str
    seq_no: int
    index: int  # the log index at which the request took effect
    operation: str
    response: bytes


@dataclass
class _Client:
    low_water: int = 0  # seq nos below are forgotten
    results: dict[int, RememberedResult] = field(default_factory=dict)


class RequestTable:
    """Remembered request results and their bounds (module docstring)."""

    def __init__(self, retention_entries: int, max_per_client: int) -> None:
        if retention_entries < 1 or max_per_client < 1:
            raise InvalidArgument("request-id bounds must be >= 1")
        self.retention_entries = retention_entries
        self.max_per_client = max_per_client
        self.clients: dict[str, _Client] = {}
        # (index, client, seq) in apply order; entries of results already forgotten by other
        # rules stay until they reach the front (checked against the result's index there).
        self._by_index: deque[tuple[int, str, int]] = deque()

    def lookup(self, req: RequestId, operation: str) -> RememberedResult | None:
        client = self.clients.get(req.client_id)
        if client is None:
            return None
        found = client.results.get(req.seq_no)
        if found is not None:
            if found.operation != operation:
                raise InvalidArgument(
                    f"request id {req} was used for {found.operation or 'another operation'}, "
                    f"not {operation or 'this one'}"
                )
            return found
        if req.seq_no < client.low_water:
            raise FailedPrecondition(
                f"request id {req} is stale: results of client {req.client_id!r} below seq_no "
                f"{client.low_water} are forgotten, so its outcome is unknown"
            )
        return None

    def remember(self, req: RequestId, index: int, operation: str, response: bytes) -> None:
        client = self.clients.setdefault(req.client_id, _Client())
        if req.first_incomplete_seq_no > client.low_water:
            client.low_water = req.first_incomplete_seq_no
            for seq in [s for s in client.results if s < client.low_water]:
                del client.results[seq]
        client.results[req.seq_no] = RememberedResult(
            req.client_id, req.seq_no, index, operation, response
        )
        self._by_index.append((index, req.client_id, req.seq_no))
        while len(client.results) > self.max_per_client:
            lowest = min(client.results)
            del client.results[lowest]
            client.low_water = max(client.low_water, lowest + 1)

    def expire(self, index: int) -> None:
        """Forget results that took effect `retention_entries` or more entries before `index`."""
        cutoff = index - self.retention_entries
        q = self._by_index
        while q and q[0][0] <= cutoff:
            at, client_id, seq = q.popleft()
            client = self.clients.get(client_id)
            if client is None:
                continue
            found = client.results.get(seq)
            if found is None or found.index != at:
                continue
            del client.results[seq]
            client.low_water = max(client.low_water, seq + 1)
            if not client.results:
                del self.clients[client_id]

    def to_pb(self) -> list[pb.ClientRequestsPB]:
        out = []
        for client_id in sorted(self.clients):
            client = self.clients[client_id]
            entry = pb.ClientRequestsPB(client_id=client_id, low_water_seq_no=client.low_water)
            for seq in sorted(client.results):
                r = client.results[seq]
                entry.results.add(
                    seq_no=seq, index=r.index, operation=r.operation, response=r.response
                )
            out.append(entry)
        return out

    def load(self, clients: Iterable[pb.ClientRequestsPB]) -> None:
        self.clients = {}
        ordered: list[tuple[int, str, int]] = []
        for c in clients:
            if not c.client_id or c.client_id in self.clients or not c.results:
                raise Corruption(f"snapshot: bad request-id entry for client {c.client_id!r}")
            client = _Client(low_water=c.low_water_seq_no)
            for r in c.results:
                client.results[r.seq_no] = RememberedResult(
                    c.client_id, r.seq_no, r.index, r.operation, r.response
                )
                ordered.append((r.index, c.client_id, r.seq_no))
            self.clients[c.client_id] = client
        ordered.sort()
        self._by_index = deque(ordered)
