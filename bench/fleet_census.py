"""The scale benchmark's census: the catalog's tablet locations against what the simulated fleet
actually hosts, replica by replica.

Why. IsCreateTableDone says every tablet reported a leader once, and the fleet's statistics
count replicas and leaders; neither says whether the catalog and the fleet agree now. A
tablet the catalog lists on three servers may be hosted on two (a CreateTablet that never
landed), or have no leader in the fleet (its group lost its majority); a server may host a
replica the catalog has no record of. The census asks every simulated server for its
replicas (GetConsensusState, the admin call a master uses to confirm membership claims) and
every table's locations from the leader, and counts each kind of disagreement. A simulated
server that does not answer (its shard's loop starved on an overloaded host) is asked again a
few times, then counted as unreachable: the census says what it could not check instead of
ending the benchmark with a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from service.pb import master_pb2 as pb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc

__all__ = ["Census", "take_census"]


@dataclass
class Census:
    tablets: int = 0
    """Tablets the catalog lists (every live table's)."""
    replicas: int = 0
    """Replicas the catalog lists."""
    missing: list[tuple[str, str]] = field(default_factory=list)
    """(tablet, server): listed by the catalog, not hosted by that server."""
    leaderless: list[str] = field(default_factory=list)
    """Tablets the catalog lists whose replicas in the fleet name no leader among them."""
    unlisted: list[tuple[str, str]] = field(default_factory=list)
    """(tablet, server): hosted, not listed by the catalog (orphans, or not yet deleted)."""
    creating: list[str] = field(default_factory=list)
    """Tables still being created (no locations yet): not counted, so their hosted replicas
    count as not listed."""
    unreachable: list[str] = field(default_factory=list)
    """Servers that did not answer GetConsensusState within ATTEMPTS tries: their replicas are
    counted as not hosted, so a census with any is not exact."""

    def line(self) -> str:
        def few(items: Iterable[Any]) -> str:
            shown = [str(x) for x in list(items)[:3]]
            return f" (e.g. {', '.join(shown)})" if shown else ""

        return (
            f"census   catalog {self.tablets} tablets, {self.replicas} replicas; fleet: "
            f"{len(self.missing)} listed replicas not hosted{few(self.missing)}, "
            f"{len(self.leaderless)} tablets without a leader{few(self.leaderless)}, "
            f"{len(self.unlisted)} hosted replicas not listed{few(self.unlisted)}"
            + (
                f"; {len(self.unreachable)} servers did not answer{few(self.unreachable)}"
                if self.unreachable
                else ""
            )
            + (
                f"; {len(self.creating)} tables still being created, not counted"
                f"{few(self.creating)}"
                if self.creating
                else ""
            )
        )


ATTEMPTS = 3
"""Tries of one server's GetConsensusState (each with a 30 s deadline) before it is counted as
unreachable."""

GIVE_UP_AFTER = 10
"""Servers counted unreachable after which the others get one try each: a fleet that stopped
answering would otherwise hold the census for ATTEMPTS x 30 s per server."""

RETRIED = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)

CONCURRENT = 16
"""GetConsensusState calls in flight at once (a census of 1,000 servers that time out then
takes minutes, not hours)."""


async def _fleet(
    channel_for: Any, shard_addresses: list[str], uuids: list[str]
) -> tuple[dict[tuple[str, str], int], dict[str, str], list[str]]:
    """(hosted (tablet, server) -> role, tablet -> the leader its leader replica names,
    servers that never answered). Servers are asked CONCURRENT at a time."""
    hosted: dict[tuple[str, str], int] = {}
    leaders: dict[str, str] = {}
    answered: set[str] = set()
    timed_out: set[str] = set()
    slots = asyncio.Semaphore(CONCURRENT)

    async def ask(stub: Any, uuid: str) -> None:
        async with slots:
            r = await _ask(stub, uuid, ATTEMPTS if len(timed_out) < GIVE_UP_AFTER else 1)
        if r is None:
            timed_out.add(uuid)  # by this shard, which may not host it
            return
        if r is _ELSEWHERE:
            return
        answered.add(uuid)
        for entry in r.tablets:
            hosted[(entry.tablet_id, uuid)] = entry.role
            if entry.role == pb.LEADER and entry.consensus_state.leader_uuid == uuid:
                leaders[entry.tablet_id] = uuid

    for address in shard_addresses:
        stub = tserver_pb2_grpc.TabletServerAdminServiceStub(channel_for(address))
        await asyncio.gather(*(ask(stub, uuid) for uuid in uuids))
    return hosted, leaders, sorted(timed_out - answered)


_ELSEWHERE: Any = object()
"""`_ask`'s answer for a server another shard simulates."""


async def _ask(stub: Any, uuid: str, tries: int) -> Any:
    """The server's GetConsensusState answer, `_ELSEWHERE`, or None if it never answered."""
    for attempt in range(tries):
        try:
            return await stub.GetConsensusState(
                tpb.GetConsensusStateRequestPB(dest_uuid=uuid), timeout=30
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION and "no simulated" in (
                e.details() or ""
            ):
                return _ELSEWHERE
            if e.code() not in RETRIED:
                raise
            if attempt < tries - 1:
                await asyncio.sleep(1.0 * (attempt + 1))
    return None


async def take_census(
    master: Any, channel_for: Any, shard_addresses: list[str], uuids: list[str]
) -> Census:
    """`master`: the leader's MasterService stub; `channel_for(address)`: an admin channel to a
    simulator shard's admin port."""
    hosted, leaders, unreachable = await _fleet(channel_for, shard_addresses, uuids)
    out = Census(unreachable=unreachable)
    listed: set[tuple[str, str]] = set()
    tables = await master.ListTables(pb.ListTablesRequestPB(), timeout=60)
    for table in tables.tables:
        start = b""
        while True:
            r = await _locations(master, table.table_id, start)
            if r is None:  # still being created (a create the bench gave up waiting for)
                out.creating.append(table.name)
                break
            for t in r.tablet_locations:
                out.tablets += 1
                for replica in t.replicas:
                    out.replicas += 1
                    listed.add((t.tablet_id, replica.ts_uuid))
                    if (t.tablet_id, replica.ts_uuid) not in hosted:
                        out.missing.append((t.tablet_id, replica.ts_uuid))
                if t.tablet_id not in leaders:
                    out.leaderless.append(t.tablet_id)
            last = r.tablet_locations[-1].partition.partition_key_end if r.tablet_locations else b""
            if not last:
                break
            start = last
    out.unlisted = [k for k in hosted if k not in listed]
    return out


async def _locations(master: Any, table_id: str, start: bytes) -> Any:
    """One page of a table's locations; None while the table is still being created (the
    master answers UNAVAILABLE until every tablet is RUNNING) after ATTEMPTS tries."""
    for attempt in range(ATTEMPTS):
        try:
            return await master.GetTableLocations(
                pb.GetTableLocationsRequestPB(
                    table=pb.TableIdentifierPB(table_id=table_id),
                    partition_key_start=start,
                    max_returned_locations=1000,
                ),
                timeout=60,
            )
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or "not RUNNING" not in (e.details() or ""):
                raise
            if attempt < ATTEMPTS - 1:
                await asyncio.sleep(2.0)
    return None
