"""Replica rebalancing: Kudu's two-dimensional greedy algorithm, as a PURE function.

Theory of operation
-------------------
Placement spreads a new table's replicas, but servers join, leave and come back, and tables are
created at different times: a server added to a running cluster hosts nothing until something
moves replicas to it. The rebalancer computes those moves; the client executes them one replica
at a time (`service.client.replica_ops`: add the new replica, wait for its promotion, remove the
old one), so this module only decides *which* replica goes *where*.

Two measures of imbalance, both over the live servers (empty ones included, at count 0):

* a table's skew: the largest minus the smallest number of that table's replicas per server;
* the cluster's skew: the same over every table's replicas together.

Balancing each table matters first: a table's scans and writes spread over its tablets, so a
server holding more of *one* table's replicas is that table's bottleneck even when the cluster
totals look even. Then the totals (disk, memory, heartbeat reports). The greedy algorithm of
Kudu's `rebalance_algo.cc` (TwoDimensionalGreedyAlgo) repeats one step:

  1. If every table's skew is at most 1 and the cluster's is at most 1, stop.
  2. Among the tables of largest skew (2 or more), move one replica of such a table from a
     server that holds the most of it to one that holds the fewest, preferring (between those)
     the pair whose *totals* differ most, so the same move also evens the cluster where it can.
  3. When every table is within 1, move a replica of a table with skew 1 from one of its
     most-loaded servers to one of its least-loaded servers, but only if the source's total
     exceeds the destination's by 2 or more: the table stays within 1 and the cluster improves.

Each move of step 2 lowers the sum over tables of the squared per-server counts; each move of
step 3 keeps that sum and lowers the sum of squared totals. So the loop ends, and with nothing
pinned it ends balanced: if the totals of servers h and l differ by 2 or more while every table
is within 1, then (the difference being a sum of per-table differences in {-1, 0, 1}) some
table has one more replica on h than on l, which step 3 can move. Moves are computed one at a
time on the counts the previous moves produced (`apply_moves`), as Kudu's `GetNextMoves` does.

Kudu's algorithm moves counts; here each move names a tablet. The source holds more of the
table than the destination, so at least one of its tablets there has no replica on the
destination (a tablet never gets two replicas on one server). Ties are broken by uuid (then
table id, tablet id), or by an injected `random.Random` (Kudu's PICK_RANDOM), never the global
generator: the same input and seed give the same plan.

Inputs are voter replicas of RUNNING tablets and the live servers. Replicas on servers that are
not live count for nothing (they are neither sources nor balanced) but still occupy their
tablet: a tablet is never moved onto a server that holds it. `pinned` tablets count but never
move (the caller pins tablets that are under-replicated, mid-change or leaderless; moving a
replica of one could cost it its majority). With pins, balance is reached where possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from random import Random

from service.common.errors import InvalidArgument

__all__ = [
    "Distribution",
    "Move",
    "Placement",
    "SkewReport",
    "TableSkew",
    "apply_moves",
    "plan_moves",
    "skew_report",
]


@dataclass(frozen=True, order=True)
class Placement:
    """One voter replica: tablet `tablet_id` of table `table_id` on server `ts_uuid`."""

    table_id: str
    tablet_id: str
    ts_uuid: str


@dataclass(frozen=True)
class Move:
    """Move tablet `tablet_id`'s replica from server `from_ts` to server `to_ts`."""

    tablet_id: str
    table_id: str
    from_ts: str
    to_ts: str


@dataclass(frozen=True)
class Distribution:
    """Where every voter replica is, which servers are live, which tablets may not move.

    Invariants (checked): a tablet belongs to one table; `servers` holds no empty uuid.
    A tablet has at most one replica per server by construction (a set of placements).
    """

    replicas: frozenset[Placement]
    servers: frozenset[str]
    pinned: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        table_of: dict[str, str] = {}
        for p in self.replicas:
            other = table_of.setdefault(p.tablet_id, p.table_id)
            if other != p.table_id:
                raise InvalidArgument(
                    f"tablet {p.tablet_id} is listed under tables {other} and {p.table_id}"
                )
        if "" in self.servers:
            raise InvalidArgument("servers: an empty uuid")

    @classmethod
    def of(
        cls,
        replicas: Iterable[Placement | tuple[str, str, str]],
        servers: Iterable[str],
        pinned: Iterable[str] = (),
    ) -> Distribution:
        """From (table_id, tablet_id, ts_uuid) triples or placements."""
        return cls(
            frozenset(r if isinstance(r, Placement) else Placement(*r) for r in replicas),
            frozenset(servers),
            frozenset(pinned),
        )

    @property
    def table_ids(self) -> list[str]:
        return sorted({p.table_id for p in self.replicas})


@dataclass(frozen=True)
class TableSkew:
    """One table's replicas per live server (zeros included) and their skew."""

    table_id: str
    skew: int
    counts: Mapping[str, int]


@dataclass(frozen=True)
class SkewReport:
    """Per-table and cluster skew of a distribution, over its live servers."""

    cluster_skew: int
    totals: Mapping[str, int]
    tables: tuple[TableSkew, ...]
    replicas: int
    """Replicas on live servers (the ones counted)."""
    offline_replicas: int
    """Replicas on servers that are not live (not counted, never moved)."""

    @property
    def max_table_skew(self) -> int:
        return max((t.skew for t in self.tables), default=0)

    @property
    def balanced(self) -> bool:
        return self.max_table_skew <= 1 and self.cluster_skew <= 1


def _skew(counts: Iterable[int]) -> int:
    values = list(counts)
    return max(values) - min(values) if values else 0


def skew_report(distribution: Distribution) -> SkewReport:
    """Replica counts per live server, per table and in total, and their skews."""
    servers = sorted(distribution.servers)
    totals = dict.fromkeys(servers, 0)
    per_table: dict[str, dict[str, int]] = {
        t: dict.fromkeys(servers, 0) for t in distribution.table_ids
    }
    offline = 0
    for p in distribution.replicas:
        if p.ts_uuid in totals:
            totals[p.ts_uuid] += 1
            per_table[p.table_id][p.ts_uuid] += 1
        else:
            offline += 1
    tables = tuple(
        TableSkew(t, _skew(counts.values()), counts) for t, counts in sorted(per_table.items())
    )
    return SkewReport(
        cluster_skew=_skew(totals.values()),
        totals=totals,
        tables=tables,
        replicas=sum(totals.values()),
        offline_replicas=offline,
    )


def apply_moves(distribution: Distribution, moves: Iterable[Move]) -> Distribution:
    """The distribution after `moves`, in order. InvalidArgument for a move whose source does
    not hold the tablet, whose destination already does or is not live."""
    replicas = set(distribution.replicas)
    holders: dict[str, set[str]] = {}
    for p in replicas:
        holders.setdefault(p.tablet_id, set()).add(p.ts_uuid)
    for m in moves:
        src = Placement(m.table_id, m.tablet_id, m.from_ts)
        if src not in replicas:
            raise InvalidArgument(f"{m}: {m.from_ts} holds no replica of tablet {m.tablet_id}")
        if m.to_ts in holders[m.tablet_id]:
            raise InvalidArgument(f"{m}: {m.to_ts} already holds tablet {m.tablet_id}")
        if m.to_ts not in distribution.servers:
            raise InvalidArgument(f"{m}: {m.to_ts} is not a live server")
        replicas.remove(src)
        replicas.add(Placement(m.table_id, m.tablet_id, m.to_ts))
        holders[m.tablet_id].discard(m.from_ts)
        holders[m.tablet_id].add(m.to_ts)
    return Distribution(frozenset(replicas), distribution.servers, distribution.pinned)


# --- the greedy algorithm --------------------------------------------------------------------


@dataclass
class _State:
    """Counts the algorithm updates move by move (one owner: `plan_moves`).

    Invariants: `totals[s]` = sum over tables of `counts[t][s]` = number of placements on live
    server s; `counts[t][s]` = len(`tablets_on[t, s]`); `holders[tablet]` holds every server
    (live or not) with a replica of the tablet.
    """

    servers: list[str]
    counts: dict[str, dict[str, int]]
    totals: dict[str, int]
    holders: dict[str, set[str]]
    tablets_on: dict[tuple[str, str], set[str]]
    pinned: frozenset[str]
    rank: dict[str, int] = field(default_factory=dict)
    """Tie-break order of servers: uuid order, or a permutation drawn from the injected rng."""
    skews: dict[str, int] = field(default_factory=dict)
    """`skew(t)` of every table, kept up to date by `apply` (a move changes one table's)."""

    @classmethod
    def of(cls, d: Distribution, rng: Random | None) -> _State:
        servers = sorted(d.servers)
        order = list(servers)
        if rng is not None:
            rng.shuffle(order)
        counts = {t: dict.fromkeys(servers, 0) for t in d.table_ids}
        totals = dict.fromkeys(servers, 0)
        holders: dict[str, set[str]] = {}
        tablets_on: dict[tuple[str, str], set[str]] = {}
        for p in d.replicas:
            holders.setdefault(p.tablet_id, set()).add(p.ts_uuid)
            if p.ts_uuid in totals:
                counts[p.table_id][p.ts_uuid] += 1
                totals[p.ts_uuid] += 1
                tablets_on.setdefault((p.table_id, p.ts_uuid), set()).add(p.tablet_id)
        rank = {s: i for i, s in enumerate(order)}
        skews = {t: _skew(c.values()) for t, c in counts.items()}
        return cls(servers, counts, totals, holders, tablets_on, d.pinned, rank, skews)

    def apply(self, m: Move) -> None:
        self.counts[m.table_id][m.from_ts] -= 1
        self.counts[m.table_id][m.to_ts] += 1
        self.totals[m.from_ts] -= 1
        self.totals[m.to_ts] += 1
        self.holders[m.tablet_id].discard(m.from_ts)
        self.holders[m.tablet_id].add(m.to_ts)
        self.tablets_on[m.table_id, m.from_ts].discard(m.tablet_id)
        self.tablets_on.setdefault((m.table_id, m.to_ts), set()).add(m.tablet_id)
        self.skews[m.table_id] = _skew(self.counts[m.table_id].values())

    def skew(self, table_id: str) -> int:
        return self.skews[table_id]

    def cluster_skew(self) -> int:
        return _skew(self.totals.values())


def _pick_tablet(st: _State, table_id: str, src: str, dst: str, rng: Random | None) -> str | None:
    """A tablet of `table_id` on `src` that may move to `dst` (not pinned, not already there)."""
    movable = sorted(
        t
        for t in st.tablets_on.get((table_id, src), ())
        if t not in st.pinned and dst not in st.holders[t]
    )
    if not movable:
        return None
    return rng.choice(movable) if rng is not None else movable[0]


def _table_move(
    st: _State, table_id: str, balancing_cluster: bool, rng: Random | None
) -> tuple[int, Move] | None:
    """The best move of one of `table_id`'s replicas and its cluster gain, or None.

    Table phase (`balancing_cluster` False): a source with the most replicas of the table (the
    most loaded overall first) and a destination with the fewest (the least loaded first),
    counts differing by 2 or more. Cluster phase: a source with one replica of the table more
    than the destination (the table stays within 1) whose totals differ by 2 or more, the
    widest first. Candidates are tried in that order until a tablet can move; the first pair
    tried is the best by (table difference, total difference), without enumerating all
    server pairs (O(n log n) per table, which matters with a thousand servers).
    """
    counts = st.counts[table_id]
    totals = st.totals
    rank = st.rank
    srcs = sorted(st.servers, key=lambda s: (-counts[s], -totals[s], rank[s]))
    dsts = sorted(st.servers, key=lambda s: (counts[s], totals[s], rank[s]))
    least = min(totals.values(), default=0)
    for src in srcs:
        if not st.tablets_on.get((table_id, src)):
            continue
        if balancing_cluster and totals[src] - least < 2:
            continue  # no destination is 2 below this source
        for dst in dsts:
            table_diff = counts[src] - counts[dst]
            gain = totals[src] - totals[dst]
            if balancing_cluster:
                if table_diff < 1:
                    break  # later destinations hold at least as many replicas
                if table_diff != 1 or gain < 2:
                    continue
            elif table_diff < 2:
                break
            tablet = _pick_tablet(st, table_id, src, dst, rng)
            if tablet is not None:
                return gain, Move(tablet, table_id, src, dst)
        if not balancing_cluster and counts[src] - counts[dsts[0]] < 2:
            break  # no later source can make a difference of 2
    return None


_TABLES_PER_STEP = 8
"""Tables of the largest skew compared per step once one offers a move. Comparing all of them
finds the move that also evens the cluster most, at O(servers log servers) per table; with a
hundred tables at one skew and a thousand servers that made each step cost ~50 ms. The first
few are nearly as good (the cluster phase evens the totals afterwards anyway)."""


def _next_move(st: _State, tables: Sequence[str], rng: Random | None) -> Move | None:
    """One step of the module docstring's loop, or None when done (or stuck on pins)."""
    skews = st.skews
    cluster_skew = st.cluster_skew()
    if max(skews.values(), default=0) <= 1 and cluster_skew <= 1:
        return None
    for level in sorted({s for s in skews.values() if s >= 1}, reverse=True):
        balancing_cluster = level <= 1
        if balancing_cluster and cluster_skew <= 1:
            return None
        best: tuple[int, Move] | None = None
        widest = cluster_skew  # no move can gain more than the spread of the totals
        budget = _TABLES_PER_STEP
        for t in tables:
            if skews[t] != level:
                continue
            cand = _table_move(st, t, balancing_cluster, rng)
            if cand is not None and (best is None or cand[0] > best[0]):
                best = cand
                if best[0] >= widest:
                    break  # the first table with the widest gain wins
            if best is not None:
                budget -= 1
                if budget == 0:
                    break  # good enough: see _TABLES_PER_STEP
        if best is not None:
            return best[1]
    return None


def plan_moves(
    distribution: Distribution,
    *,
    max_moves: int | None = None,
    rng: Random | None = None,
) -> list[Move]:
    """The moves, in order, that balance `distribution` (module docstring); at most
    `max_moves` of them (None: as many as it takes). A balanced input gives no moves.

    `rng` breaks ties (servers, tables, tablets) at random but reproducibly; without it ties
    go by uuid and id order.
    """
    if max_moves is not None and max_moves < 0:
        raise InvalidArgument(f"max_moves: must be >= 0, got {max_moves}")
    st = _State.of(distribution, rng)
    tables = distribution.table_ids
    if rng is not None:
        rng.shuffle(tables)
    # The potential argument of the docstring bounds the loop; this cap only guards a bug.
    cap = len(distribution.replicas) * max(1, len(st.servers)) + 1
    limit = cap if max_moves is None else min(max_moves, cap)
    moves: list[Move] = []
    while len(moves) < limit:
        m = _next_move(st, tables, rng)
        if m is None:
            break
        st.apply(m)
        moves.append(m)
    return moves
