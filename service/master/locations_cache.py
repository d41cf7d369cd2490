"""The table locations cache: GetTableLocations answers kept until what they were built from
changes (Kudu's master has the same cache, `--table_locations_cache_capacity_mb`).

Why: clients (the Spark DataSource planning a scan, every writer routing rows) ask for the same
table's locations over and over, and between two changes of a table the answer is the same.
Building it (the partition index walk, the replicas' addresses, the response message) was the
master's own share of a GetTableLocations call; the rest is gRPC's. With the cache a repeated
call returns the *same* `TableLocations` object, so the RPC layer can keep the response message
it built for it (`master_service`), and the call costs little more than a Ping.

What an answer depends on, and how a change is seen (an entry is used only if all still hold):

  * the table's `TableInfo` object, compared by identity: the maps a new leader rebuilds are
    new objects (the catalog manager also clears the cache then; the check keeps an entry
    from outliving its maps whatever the caller does). Keys hold the table id, so a name that
    now names another table finds another entry;
  * its tablets' committed rows (state, partition index, consensus state with roles):
    `TableInfo.locations_version`, bumped by `CatalogMaps.on_applied` for every tablet row
    written. The table's own row is not part of the answer: the table is resolved (by id or
    name, deleted ones refused) on every call before the cache is asked;
  * the tablet servers' registered addresses: `TSManager.addresses_version`, bumped whenever a
    server registers for the first time or at another address;
  * the request's key range and limit: the cache key, with the table id.

Errors (NotFound, TabletNotRunning, ...) are never cached: they are raised before `put`.
Leadership is checked by the caller on every call, before the cache is asked.

Bounded: at most `capacity` entries, least recently used dropped first; 0 turns it off. The
catalog manager keeps no answer for partition keys longer than 1 KB together (keys come from
clients), so an entry is a few hundred bytes of key and pointers.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from service.common.ids import TableId
from service.master.catalog_info import TableInfo
from service.master.catalog_reads import TableLocations

__all__ = ["LocationsCache", "LocationsKey"]

LocationsKey = tuple[TableId, bytes, bytes, int]
"""(table id, partition key start, partition key end, limit)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    table: TableInfo
    table_version: int
    addresses_version: int
    answer: TableLocations


class LocationsCache:
    """An LRU map from `LocationsKey` to the answer, each checked against the versions it was
    built at (module docstring). Not thread-safe: the master's event loop is its one user."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._entries: OrderedDict[LocationsKey, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self, key: LocationsKey, table: TableInfo, addresses_version: int
    ) -> TableLocations | None:
        """The answer cached for `key` if built from `table` as it is now and from the
        registry's addresses at `addresses_version`; else None (a stale entry is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        if (
            entry.table is not table
            or entry.table_version != table.locations_version
            or entry.addresses_version != addresses_version
        ):
            del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.answer

    def put(
        self, key: LocationsKey, table: TableInfo, addresses_version: int, answer: TableLocations
    ) -> None:
        """Keep `answer`, built from `table` now and the addresses at `addresses_version`."""
        if self._capacity == 0:
            return
        self._entries[key] = _Entry(table, table.locations_version, addresses_version, answer)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
