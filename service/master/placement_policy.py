"""Replica placement: which tablet servers host a tablet, a replacement replica, the first leader.

Theory of operation
-------------------
For every tablet not yet created the background task chooses the tablet servers that will host its
replicas (Kudu's table assignment). docs/design/catalog.md#R13 fixes the rule: among LIVE tablet
servers, prefer the ones holding the fewest replicas of this table, then the fewest replicas in
total; remaining ties are broken at random.

Ordering, from most to least important, of the candidates for one replica:

1. *Location spread* (only when servers carry a `location`, Kudu's rack awareness): the fewest
   replicas of this tablet already chosen in the candidate's location, so a tablet survives the
   loss of a rack whenever the cluster has enough racks. Servers without a location share one
   anonymous location. When no server has a location this criterion is constant and the order
   is exactly R13's. The price, as in Kudu, is balance: a small location receives a
   replica of nearly every tablet.
2. *Replicas of this table*: spreads one table's tablets (and so its scan and write load) over
   the whole cluster. Ranking on this first is also what stops "herding": a freshly added, empty
   server is not handed a replica of every new tablet, only its fair share of each table.
3. *Replicas in total*: fills emptier servers first.
4. A random choice among the candidates that tie on all of the above, from the injected
   `random.Random`.

Kudu picks with "power of two choices" (two random candidates, keep the less loaded) because on
very large clusters a full scan is costly and deterministic least-loaded choice piles onto one
server when load figures lag. Here the full scan is used instead: it is exact, cheap at the
scale of a master's registry (one pass over the candidates per replica), and it is fed fresh
figures because `place_table` updates the loads as it assigns, so a 1,000-tablet table on an
empty cluster ends with at most one replica of difference between any two servers (every pick
takes a server whose count is minimal, which keeps max - min <= 1).

Purity (docs/design/layers.md#R4; `tests/test_layering.py`): no I/O, no clock, no global
random. Given the same servers, arguments and rng state the result is the same, whatever the
order in which the servers are listed: candidates are visited in uuid order and rng draws happen
only on ties, in that order. Errors are the common tree's: `InvalidArgument` for malformed input
(a bug in the caller or a bad request), `FailedPrecondition` when the cluster cannot satisfy the
request now ("need 3 live tablet servers, have 2 (dead: ts-3)"), which CreateTable passes to
the client as it is.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from random import Random
from types import MappingProxyType

from service.common.errors import FailedPrecondition, InvalidArgument

__all__ = [
    "ServerLoad",
    "TablePlacer",
    "choose_leader",
    "choose_replacement",
    "place_table",
    "place_tablet",
]

_MAX_NAMED = 10  # servers named in an error message before "and N more"


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What placement knows of one tablet server: a value, built by `TSManager.server_loads()`.

    `replicas_by_table` is copied into a read-only mapping, so a caller mutating its dict later
    cannot change a load already handed out; it is left out of the hash (the value stays
    hashable) but not out of equality.
    """

    uuid: str
    """The server's permanent uuid."""
    live: bool
    """Heard from within the unresponsive timeout; dead servers are never chosen."""
    total_replicas: int = 0
    """Replicas of every table hosted by the server, per the catalog's tablet records."""
    replicas_by_table: Mapping[str, int] = field(default_factory=dict, hash=False)
    """Table id -> replicas of that table on the server; absent tables count 0. The counts sum
    to at most `total_replicas`."""
    location: str | None = None
    """Rack or zone label; None when the cluster does not use locations."""

    def __post_init__(self) -> None:
        if not isinstance(self.uuid, str) or not self.uuid:
            raise InvalidArgument(f"server uuid must be a non-empty string, got {self.uuid!r}")
        if self.total_replicas < 0:
            raise InvalidArgument(
                f"server {self.uuid}: total_replicas must be >= 0, got {self.total_replicas}"
            )
        counts = dict(self.replicas_by_table)
        for table_id, n in counts.items():
            if n < 0:
                raise InvalidArgument(
                    f"server {self.uuid}: replicas of table {table_id} must be >= 0, got {n}"
                )
        if sum(counts.values()) > self.total_replicas:
            raise InvalidArgument(
                f"server {self.uuid}: per-table replicas sum to {sum(counts.values())},"
                f" more than total_replicas {self.total_replicas}"
            )
        object.__setattr__(self, "replicas_by_table", MappingProxyType(counts))

    @classmethod
    def unchecked(
        cls,
        uuid: str,
        live: bool,
        total_replicas: int,
        replicas_by_table: Mapping[str, int],
        location: str | None,
    ) -> ServerLoad:
        """A load from counts the caller maintains and knows to be valid (the catalog's own
        replica counts), without `__post_init__`'s checks and copy. Why: every assignment
        round builds one per registered server, twice, and on a 1,000-server fleet creating a
        10,000-tablet table the checks alone were a tenth of the master's CPU.
        `replicas_by_table` must not change while the load is in use: pass a read-only view
        of counts nobody mutates meanwhile."""
        load = object.__new__(cls)
        object.__setattr__(load, "uuid", uuid)
        object.__setattr__(load, "live", live)
        object.__setattr__(load, "total_replicas", total_replicas)
        object.__setattr__(load, "replicas_by_table", replicas_by_table)
        object.__setattr__(load, "location", location)
        return load

    def replicas_of(self, table_id: str) -> int:
        """Replicas of `table_id` on this server (0 if none)."""
        return self.replicas_by_table.get(table_id, 0)


# --- the ranking core ---------------------------------------------------------------------


class _Loads:
    """Mutable per-call working copy of the candidates' loads (never escapes this module).

    Invariants: `uuids` is sorted and duplicate-free; `table`, `total` and `location` have
    exactly the keys of `uuids`. Only `place_table` mutates the counts, via `add`.
    """

    __slots__ = ("buckets", "location", "table", "total", "use_locations", "uuids")

    def __init__(self, candidates: Iterable[ServerLoad], table_id: str) -> None:
        ordered = sorted(candidates, key=lambda s: s.uuid)
        self.uuids: list[str] = [s.uuid for s in ordered]
        self.table: dict[str, int] = {s.uuid: s.replicas_of(table_id) for s in ordered}
        self.total: dict[str, int] = {s.uuid: s.total_replicas for s in ordered}
        self.location: dict[str, str | None] = {s.uuid: s.location for s in ordered}
        self.use_locations = any(loc is not None for loc in self.location.values())
        self.buckets = None if self.use_locations else _Buckets(self.uuids, self._key)

    def _key(self, uuid: str) -> tuple[int, int]:
        return (self.table[uuid], self.total[uuid])

    def add(self, uuid: str) -> None:
        old = self._key(uuid)
        self.table[uuid] += 1
        self.total[uuid] += 1
        if self.buckets is not None:
            self.buckets.move(uuid, old, self._key(uuid))

    def pick(
        self, n: int, rng: Random, placed_in: Mapping[str | None, int] | None = None
    ) -> tuple[str, ...]:
        """Choose `n` distinct candidates, best first, per the module docstring's order.

        `placed_in` counts replicas of the tablet already placed per location (replacement).
        The caller guarantees `n <= len(self.uuids)`.
        """
        if not self.use_locations:
            return self._pick_by_load(n, rng)
        per_location: Counter[str | None] = Counter(placed_in or {})
        remaining = list(self.uuids)
        chosen: list[str] = []
        for _ in range(n):
            keys = [
                (per_location[self.location[u]], self.table[u], self.total[u]) for u in remaining
            ]
            best = min(keys)
            tied = [u for u, k in zip(remaining, keys, strict=True) if k == best]
            winner = tied[0] if len(tied) == 1 else rng.choice(tied)
            chosen.append(winner)
            remaining.remove(winner)
            per_location[self.location[winner]] += 1
        return tuple(chosen)

    def _pick_by_load(self, n: int, rng: Random) -> tuple[str, ...]:
        """Without locations one replica never changes another candidate's key, so the greedy
        choice is the `n` smallest keys: take every candidate strictly below the n-th smallest
        key (by key, then uuid), then sample the rest among those equal to it (in uuid order).
        rng is used only on ties."""
        assert self.buckets is not None
        below: list[str] = []
        for key in self.buckets.keys:
            at = self.buckets.members[key]
            need = n - len(below)
            if len(at) >= need:
                return (*below, *(at if need == len(at) else rng.sample(at, need)))
            below.extend(at)
        raise AssertionError("fewer candidates than replicas")  # the callers check first


class _Buckets:
    """The candidates grouped by key, so a pick reads only the few smallest keys instead of
    sorting every candidate (a 10,000-tablet table on 1,000 servers is 30,000 picks: a full
    sort per pick made planning it take seconds of the master's event loop).

    Invariants: `keys` is sorted and duplicate-free and equals the keys of `members`; each
    `members[k]` is a non-empty list of uuids, sorted, of the candidates whose key is k.
    """

    __slots__ = ("keys", "members")

    def __init__(self, uuids: Iterable[str], key: Callable[[str], tuple[int, int]]) -> None:
        self.members: dict[tuple[int, int], list[str]] = {}
        for u in uuids:  # sorted: each bucket comes out sorted
            self.members.setdefault(key(u), []).append(u)
        self.keys: list[tuple[int, int]] = sorted(self.members)

    def move(self, uuid: str, old: tuple[int, int], new: tuple[int, int]) -> None:
        bucket = self.members[old]
        del bucket[bisect.bisect_left(bucket, uuid)]
        if not bucket:
            del self.members[old]
            del self.keys[bisect.bisect_left(self.keys, old)]
        target = self.members.get(new)
        if target is None:
            self.members[new] = [uuid]
            bisect.insort(self.keys, new)
        else:
            bisect.insort(target, uuid)


# --- validation ----------------------------------------------------------------------------


def _check_servers(servers: Iterable[ServerLoad]) -> tuple[ServerLoad, ...]:
    out = tuple(servers)
    for s in out:
        if not isinstance(s, ServerLoad):
            raise InvalidArgument(f"expected ServerLoad values, got {type(s).__name__}")
    dups = sorted(u for u, c in Counter(s.uuid for s in out).items() if c > 1)
    if dups:
        raise InvalidArgument(f"duplicate tablet server uuids: {_names(dups)}")
    return out


def _check_table_id(table_id: str) -> None:
    if not isinstance(table_id, str) or not table_id:
        raise InvalidArgument(f"table id must be a non-empty string, got {table_id!r}")


def _check_count(what: str, n: int, minimum: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise InvalidArgument(f"{what} must be an integer >= {minimum}, got {n!r}")


def _uuids(what: str, uuids: Collection[str]) -> tuple[str, ...]:
    """A collection of uuids as a tuple; a bare string (a classic slip) is refused, not split
    into characters."""
    if isinstance(uuids, str):
        raise InvalidArgument(f"{what} must be a collection of uuids, not the string {uuids!r}")
    return tuple(uuids)


def _check_unique(what: str, uuids: Collection[str]) -> None:
    dups = sorted(u for u, c in Counter(uuids).items() if c > 1)
    if dups:
        raise InvalidArgument(f"duplicate uuids in {what}: {_names(dups)}")


def _names(uuids: Sequence[str]) -> str:
    shown = ", ".join(uuids[:_MAX_NAMED])
    more = len(uuids) - _MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def _eligible(
    servers: Sequence[ServerLoad], exclude: Collection[str]
) -> tuple[list[ServerLoad], list[str], list[str]]:
    """(live servers not excluded, dead server uuids, live-but-excluded uuids), sorted."""
    eligible = [s for s in servers if s.live and s.uuid not in exclude]
    dead = sorted(s.uuid for s in servers if not s.live)
    excluded = sorted(s.uuid for s in servers if s.live and s.uuid in exclude)
    return eligible, dead, excluded


def _not_enough(need: int, have: int, dead: Sequence[str], excluded: Sequence[str]) -> str:
    details = []
    if dead:
        details.append(f"dead: {_names(dead)}")
    if excluded:
        details.append(f"excluded: {_names(excluded)}")
    suffix = f" ({'; '.join(details)})" if details else ""
    noun = "server" if need == 1 else "servers"
    return f"need {need} live tablet {noun}, have {have}{suffix}"


# --- the API -------------------------------------------------------------------------------


def place_tablet(
    servers: Iterable[ServerLoad],
    table_id: str,
    num_replicas: int,
    rng: Random,
    exclude: Collection[str] = (),
) -> tuple[str, ...]:
    """The uuids of `num_replicas` distinct live servers to host one new tablet of `table_id`.

    Best candidate first. Servers in `exclude` (say, the replicas of a tablet being replaced
    after its assignment timed out) are never chosen. Raises `InvalidArgument` for
    `num_replicas < 1`, an empty table id or duplicate server uuids, and `FailedPrecondition`
    when fewer than `num_replicas` live, non-excluded servers exist.
    """
    _check_table_id(table_id)
    _check_count("num_replicas", num_replicas, 1)
    checked = _check_servers(servers)
    excluded = frozenset(_uuids("exclude", exclude))
    eligible, dead, live_excluded = _eligible(checked, excluded)
    if len(eligible) < num_replicas:
        raise FailedPrecondition(_not_enough(num_replicas, len(eligible), dead, live_excluded))
    return _Loads(eligible, table_id).pick(num_replicas, rng)


def place_table(
    servers: Iterable[ServerLoad],
    table_id: str,
    num_tablets: int,
    num_replicas: int,
    rng: Random,
) -> list[tuple[str, ...]]:
    """Replica sets for the `num_tablets` tablets of a new table, in tablet order.

    Each placement counts the replicas chosen for the earlier tablets, so the table spreads
    evenly (on an empty cluster no server ends with more than one replica above another).
    All or nothing: the feasibility check happens before any choice, so a `FailedPrecondition`
    never comes halfway through. `num_tablets == 0` gives `[]`.
    """
    _check_count("num_tablets", num_tablets, 0)
    return TablePlacer(servers, table_id, num_replicas).place(num_tablets, rng)


class TablePlacer:
    """`place_table` a few tablets at a time, for a caller that yields between chunks.

    Each `place` counts the replicas chosen by the earlier ones, so placing a table in chunks
    of any sizes gives exactly the choices (and rng draws) of one `place_table` call. The
    feasibility check happens here, at construction: `FailedPrecondition` when fewer than
    `num_replicas` servers are live.
    """

    def __init__(self, servers: Iterable[ServerLoad], table_id: str, num_replicas: int) -> None:
        _check_table_id(table_id)
        _check_count("num_replicas", num_replicas, 1)
        checked = _check_servers(servers)
        eligible, dead, _ = _eligible(checked, frozenset())
        if len(eligible) < num_replicas:
            raise FailedPrecondition(_not_enough(num_replicas, len(eligible), dead, ()))
        self.table_id = table_id
        self.num_replicas = num_replicas
        self._loads = _Loads(eligible, table_id)

    def place(self, num_tablets: int, rng: Random) -> list[tuple[str, ...]]:
        """Replica sets for the next `num_tablets` tablets of the table, in tablet order."""
        _check_count("num_tablets", num_tablets, 0)
        out: list[tuple[str, ...]] = []
        for _ in range(num_tablets):
            chosen = self._loads.pick(self.num_replicas, rng)
            for uuid in chosen:
                self._loads.add(uuid)
            out.append(chosen)
        return out


def choose_replacement(
    servers: Iterable[ServerLoad],
    table_id: str,
    current_replicas: Collection[str],
    rng: Random,
    exclude: Collection[str] = (),
) -> str:
    """The server to receive a new replica of an under-replicated tablet of `table_id`.

    Re-replication is "3-4-3" (docs/design/tablet_copy.md#R7): the catalog adds the chosen server as
    a non-voter (PRE_VOTER), which tablet copy fills and the leader promotes once caught up; only
    then is the dead replica evicted. So the new replica must go "elsewhere": never to a server
    in `current_replicas` (live or dead: a dead member is still in the config), nor to one in
    `exclude` (a server whose copy just failed, say). With locations, the live current
    replicas count towards their locations so the replacement restores the spread.
    Raises `FailedPrecondition` when no such live server exists.
    """
    _check_table_id(table_id)
    current = _uuids("current_replicas", current_replicas)
    _check_unique("current_replicas", current)
    checked = _check_servers(servers)
    barred = frozenset(current) | frozenset(_uuids("exclude", exclude))
    eligible, dead, live_barred = _eligible(checked, barred)
    if not eligible:
        live_excluded = [u for u in live_barred if u not in current]
        details = [f"dead: {_names(dead)}"] if dead else []
        details += [f"excluded: {_names(live_excluded)}"] if live_excluded else []
        raise FailedPrecondition(
            f"no live tablet server outside the current replicas ({_names(sorted(current))})"
            f" can host a new replica of table {table_id}"
            + (f" ({'; '.join(details)})" if details else "")
        )
    by_uuid = {s.uuid: s for s in checked}
    placed_in = Counter(by_uuid[u].location for u in current if u in by_uuid and by_uuid[u].live)
    return _Loads(eligible, table_id).pick(1, rng, placed_in)[0]


def choose_leader(
    replicas: Sequence[str],
    rng: Random,
    leader_counts: Mapping[str, int] | None = None,
) -> str:
    """The replica to start as leader of a new tablet's Raft config (Kudu's assignment).

    Without `leader_counts` a uniformly random replica; with it (uuid -> tablets it leads, as
    the caller tracks while creating a table) the replica leading the fewest, ties at random,
    so leadership and its write load spread as evenly as the replicas. Independent of the order
    of `replicas`. Raises `InvalidArgument` for an empty or duplicated replica list.
    """
    replicas = _uuids("replicas", replicas)
    if not replicas:
        raise InvalidArgument("cannot choose a leader among zero replicas")
    _check_unique("replicas", replicas)
    ordered = sorted(replicas)
    if leader_counts is not None:
        fewest = min(leader_counts.get(u, 0) for u in ordered)
        ordered = [u for u in ordered if leader_counts.get(u, 0) == fewest]
    return ordered[0] if len(ordered) == 1 else rng.choice(ordered)
