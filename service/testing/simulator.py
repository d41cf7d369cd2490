"""Deterministic simulation of a Raft group: the real core, the real WAL, a simulated world.

Theory of operation
-------------------
One seed drives everything through one `random.Random`: cluster size, message delays, drops,
duplicates and reordering, partitions, crashes (with torn WAL tails and fsync failures),
restarts, snapshots, membership changes, leadership transfers and client operations. Time is a
step counter; every live node ticks once per step. Replaying a seed replays the run exactly.

Each node is the production stack minus sockets and threads: `RawNode` over `MemoryStorage`,
made durable by `RaftStore` (WAL + cmeta + snapshot file) on a `SimFileSystem`, whose `crash`
keeps only what was synced (plus a random prefix of the rest: a torn tail). A node follows the
Ready contract as the asyncio shell does: persist, then send, then apply, then advance, but a
leader sends and applies before its own write is durable (`send_before_persist`,
docs/design/consensus.md#R1). A crash may strike in the middle of persisting, after the WAL
write but before its fsync. Most nodes are *pipelined* like
the asyncio shell: a Ready's fsync completes steps later while the node goes on stepping,
ticking and proposing (`SimNode.process`). Messages between nodes travel through the network
the simulator holds (`Simulator.net`, sim_network.py): delays, drops, duplicates, reordering
and partitions, all drawn from the seed's `random.Random` as the simulator calls it.

After every step the simulator checks Raft's safety properties (Figure 3):
  election safety      at most one leader per term, ever;
  log matching         (periodically) two logs with the same entry at an index agree before it;
  leader completeness  a new leader's log holds every entry known committed;
  state-machine safety every node applies the same entry at an index (and reaches the same
                       state after it, snapshots included);
  durability           a node's term never goes back across restarts and it never votes for
                       two candidates in one term (no amnesia).
At the end the network heals, every node restarts, the group must converge with no committed
entry lost, and the clients' history of puts and linearizable gets must be linearizable
(`linearizability.check`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from service.consensus.raft_store import RaftStore, StoreIOError
from service.consensus.wal import WalIOError
from service.raft import (
    ConfigChange,
    ConfigChangeRefused,
    ConfigChangeType,
    Entry,
    EntryType,
    MemoryStorage,
    NodeId,
    ProposalDropped,
    RaftConfig,
    RaftOptions,
    RawNode,
    Ready,
    Role,
    config_after,
)
from service.testing.linearizability import Recorder, check
from service.testing.sim_network import SimNetwork
from service.testing.sim_quiesce import SimQuiescence, check_quiet_liveness, quiesce_for_seed
from service.testing.simdisk import SimFileSystem


@dataclass(frozen=True)
class SimOptions:
    seed: int
    steps: int = 1500
    nodes: int = 0  # 0: chosen by the seed (3 or 5)
    clients: int = 4
    keys: int = 3
    max_delay: int = 3
    drop: float = 0.02
    duplicate: float = 0.02
    crash: float = 0.004
    partition: float = 0.006
    snapshot_every: int = 40
    membership: bool = True
    quiesce: bool | None = None  # None: chosen by the seed (sim_quiesce.quiesce_for_seed)
    verbose: bool = False


@dataclass
class Violation:
    step: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.kind}: {self.detail}"


@dataclass
class SimResult:
    seed: int
    violations: list[Violation]
    ops: int
    committed: int
    leaders: int
    crashes: int
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


# -- the state machine: a KV map --------------------------------------------------------------


def encode_put(key: str, value: bytes) -> bytes:
    return json.dumps({"k": key, "v": value.hex()}).encode()


def decode_put(data: bytes) -> tuple[str, bytes]:
    d = json.loads(data)
    return d["k"], bytes.fromhex(d["v"])


def encode_kv(kv: dict[str, bytes]) -> bytes:
    return json.dumps({k: v.hex() for k, v in sorted(kv.items())}).encode()


def decode_kv(data: bytes) -> dict[str, bytes]:
    return {k: bytes.fromhex(v) for k, v in json.loads(data).items()} if data else {}


def kv_digest(kv: dict[str, bytes]) -> str:
    return hashlib.blake2b(encode_kv(kv), digest_size=8).hexdigest()


# -- a node -----------------------------------------------------------------------------------


@dataclass
class _PendingPut:
    handle: int
    term: int
    client: int
    started: int


@dataclass
class _PendingRead:
    handle: int
    key: str
    client: int
    started: int
    index: int = -1  # the read index, once confirmed


class SimNode:
    def __init__(
        self, sim: Simulator, nid: NodeId, fs: SimFileSystem, bootstrap: RaftConfig | None
    ):
        self.sim = sim
        self.id = nid
        self.fs = fs
        self.store, rec = RaftStore.open(
            fs,
            f"/{nid}",
            nid,
            bootstrap_config=bootstrap,
            segment_bytes=16 << 10,
            preallocate=True,
        )
        self.storage: MemoryStorage = rec.storage
        snap = rec.applied_snapshot
        self.kv: dict[str, bytes] = decode_kv(snap.data) if snap else {}
        self.applied_config = snap.meta.config if snap else rec.bootstrap_config
        self.applied = snap.meta.index if snap else 0
        opts = RaftOptions(
            id=nid,
            election_tick=10,
            heartbeat_tick=2,
            pre_vote=sim.pre_vote,
            check_quorum=True,
            lease_reads=sim.lease_reads,
            max_size_per_msg=4096,
            max_inflight_msgs=8,
            applied=self.applied,
        )
        self.node = RawNode(
            opts, self.storage, random.Random(sim.rng.random()), rec.bootstrap_config
        )
        self.puts: dict[int, _PendingPut] = {}
        self.reads: dict[bytes, _PendingRead] = {}
        self.role = Role.FOLLOWER
        self.pipelined = sim.rng.random() < 0.7
        self.persisting: tuple[Ready, int] | None = None
        """A pipelined node's Ready whose fsync completes at that step (see `process`)."""
        self.quiet = SimQuiescence(sim, self) if sim.quiesce else None
        """Idle groups stop ticking (sim_quiesce.py), on seeds that turn quiescence on."""

    def wake(self) -> None:
        """Work arrives (a client's put or read, a config change): tick again."""
        if self.quiet is not None:
            self.quiet.wake()

    def process(self) -> bool:
        """Handle every Ready. Returns False if the node crashed while persisting.

        On a pipelined node (like the asyncio shell, node.py) a Ready's WAL records are written
        at once and its fsync completes 1-3 steps later: meanwhile the node goes on stepping
        messages, ticking and taking proposals (rawnode.py allows that between `ready()` and
        `advance()`), and the next Ready waits. A crash in that window loses the unsynced
        tail."""
        while True:
            if self.persisting is not None:
                rd, due = self.persisting
                if self.sim.now < due:
                    return True
                self.persisting = None
                if not self._sync(rd) or not self._finish(rd):
                    return False
                continue
            if not self.node.has_ready():
                break
            rd = self.node.ready()
            if not self._start(rd):
                return False
            if self.persisting is None and not self._finish(rd):
                return False
        self._maybe_snapshot()
        return True

    def _start(self, rd: Ready) -> bool:
        """Send a leader's appends early, write the Ready; on a pipelined node leave its fsync
        (if one is due) for later. Returns False if the node crashed."""
        sim = self.sim
        if rd.send_before_persist:
            for m in rd.messages:  # a leader's appends overlap its own fsync
                sim.net.send(m)
            self._apply_ready(rd)  # its committed entries are durable here already
        # 1. persist (possibly crashing half-way: WAL written, not synced)
        if rd.entries and sim.rng.random() < sim.opts.crash / 4:
            self.store.wal.append(rd.entries, rd.hard_state)
            sim.crash(self.id, "mid-persist")
            return False
        if not self.pipelined:
            return self._persist(rd, self.store.persist, may_fail=rd.must_sync)
        if not self._persist(rd, self.store.write, may_fail=False):
            return False
        if rd.must_sync or rd.snapshot is not None:
            self.persisting = (rd, sim.now + sim.rng.randint(1, 3))
        return True

    def _sync(self, rd: Ready) -> bool:
        return self._persist(rd, lambda _: self.store.sync(), may_fail=True)

    def _persist(self, rd: Ready, fn: Callable[[Ready], object], *, may_fail: bool) -> bool:
        sim = self.sim
        if may_fail and sim.rng.random() < sim.opts.crash / 8:
            self.fs.fail_next_sync()
        try:
            fn(rd)
        except (WalIOError, StoreIOError):
            sim.crash(self.id, "fsync failed")
            return False
        return True

    def _finish(self, rd: Ready) -> bool:
        """The Ready is durable: record it, send, apply, advance."""
        sim = self.sim
        RaftStore.apply_to_memory(self.storage, rd)
        if rd.hard_state is not None:
            sim.check_hard_state(self.id, rd.hard_state.term, rd.hard_state.vote)
        if not rd.send_before_persist:
            # 2. send
            for m in rd.messages:
                sim.net.send(m)
            # 3. apply
            self._apply_ready(rd)
        self.node.advance(rd)
        self._serve_reads()
        return True

    def _apply_ready(self, rd: Ready) -> None:
        sim = self.sim
        if rd.soft_state is not None:
            self._soft(rd.soft_state.role, rd.soft_state.term)
        if rd.snapshot is not None:
            self.kv = decode_kv(rd.snapshot.data)
            self.applied_config = rd.snapshot.meta.config
            self.applied = rd.snapshot.meta.index
            sim.check_state(self.id, self.applied, self.kv)
        for e in rd.committed_entries:
            self._apply(e)
        for rs in rd.read_states:
            r = self.reads.get(rs.context)
            if r is not None:
                r.index = rs.index

    def _soft(self, role: Role, term: int) -> None:
        if role is Role.LEADER:
            self.sim.check_new_leader(self.id, term)
        if self.role is Role.LEADER and role is not Role.LEADER:
            for ctx, r in list(self.reads.items()):
                self.sim.recorder.fail(r.handle, self.sim.now)
                self.sim.client_idle(r.client)
                del self.reads[ctx]
        self.role = role

    def _apply(self, e: Entry) -> None:
        sim = self.sim
        sim.check_apply(self.id, e)
        if e.type is EntryType.NORMAL and e.data:
            k, v = decode_put(e.data)
            self.kv[k] = v
        self.applied_config = config_after(self.applied_config, e.type, e.data, e.index)
        self.applied = e.index
        sim.check_state(self.id, e.index, self.kv)
        p = self.puts.pop(e.index, None)
        if p is not None:
            if p.term == e.term:
                sim.recorder.ok(p.handle, None, sim.now)
            else:
                sim.recorder.fail(p.handle, sim.now)  # overwritten: it never took effect
            sim.client_idle(p.client)

    def _serve_reads(self) -> None:
        for ctx, r in list(self.reads.items()):
            if 0 <= r.index <= self.applied:
                self.sim.recorder.ok(r.handle, self.kv.get(r.key), self.sim.now)
                self.sim.client_idle(r.client)
                del self.reads[ctx]

    def _maybe_snapshot(self) -> None:
        first = self.storage.first_index()
        snap_index = self.storage.snapshot().meta.index
        if self.applied - max(snap_index, first - 1) < self.sim.opts.snapshot_every:
            return
        snap = self.storage.create_snapshot(self.applied, self.applied_config, encode_kv(self.kv))
        try:
            self.store.compact(self.storage, snap, keep_entries=self.sim.opts.snapshot_every // 4)
        except (WalIOError, StoreIOError):
            self.sim.crash(self.id, "fsync failed during snapshot")

    def expire_clients(self, timeout: int) -> None:
        """Client timeouts: a put's outcome becomes unknown, a read is abandoned."""
        now = self.sim.now
        for index, p in list(self.puts.items()):
            if now - p.started > timeout:
                self.sim.recorder.unknown(p.handle)
                self.sim.client_idle(p.client)
                del self.puts[index]
        for ctx, r in list(self.reads.items()):
            if now - r.started > timeout:
                self.sim.recorder.fail(r.handle, now)
                self.sim.client_idle(r.client)
                del self.reads[ctx]

    def abandon_clients(self) -> None:
        """The node crashed: its clients' outcomes are unknown (puts) or void (reads)."""
        for p in self.puts.values():
            self.sim.recorder.unknown(p.handle)
            self.sim.client_idle(p.client)
        for r in self.reads.values():
            self.sim.recorder.fail(r.handle, self.sim.now)
            self.sim.client_idle(r.client)
        self.puts.clear()
        self.reads.clear()


# -- the world --------------------------------------------------------------------------------


class Simulator:
    def __init__(self, opts: SimOptions) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)
        n = opts.nodes or self.rng.choice([3, 3, 5])
        self.ids = [NodeId(f"n{i}") for i in range(1, n + 1)]
        self.pre_vote = self.rng.random() < 0.8
        self.lease_reads = self.rng.random() < 0.3
        if opts.quiesce is None:
            self.quiesce = quiesce_for_seed(opts.seed, self.lease_reads)
        else:
            self.quiesce = opts.quiesce
            self.lease_reads = self.lease_reads and not opts.quiesce
        self.quiet_until = 0
        """Clients start nothing before this step (a quiet stretch, so groups can quiesce)."""
        self.now = 0
        self.fss = {nid: SimFileSystem() for nid in self.ids}
        boot = RaftConfig(frozenset(self.ids))
        self.nodes: dict[NodeId, SimNode | None] = {
            nid: SimNode(self, nid, self.fss[nid], boot) for nid in self.ids
        }
        self.down_until: dict[NodeId, int] = {}
        self.net = SimNetwork(
            self.rng,
            lambda: self.now,
            self.nodes,
            max_delay=opts.max_delay,
            drop=opts.drop,
            duplicate=opts.duplicate,
        )
        """Messages and digests in flight, and the partition (sim_network.py)."""
        self.heal_at = -1
        self.recorder = Recorder()
        self.client_busy: dict[int, bool] = {c: False for c in range(opts.clients)}
        self.client_target: dict[int, NodeId] = {
            c: self.rng.choice(self.ids) for c in range(opts.clients)
        }
        self.client_seq = 0
        self.read_seq = 0
        # safety bookkeeping
        self.violations: list[Violation] = []
        self.leader_of_term: dict[int, NodeId] = {}
        self.committed: dict[int, tuple[int, bytes, EntryType]] = {}
        self.state_at: dict[int, str] = {}
        self.max_term: dict[NodeId, int] = {nid: 0 for nid in self.ids}
        self.votes: dict[tuple[NodeId, int], NodeId] = {}
        self.crashes = 0
        self.converging = False
        self.trace: list[str] = []

    # -- logging and violations ---------------------------------------------------------------

    def log(self, text: str) -> None:
        line = f"[{self.now:5d}] {text}"
        self.trace.append(line)
        if self.opts.verbose:
            print(line)

    def violate(self, kind: str, detail: str) -> None:
        v = Violation(self.now, kind, detail)
        self.violations.append(v)
        self.log(f"VIOLATION {v}")

    # -- checks -------------------------------------------------------------------------------

    def check_new_leader(self, nid: NodeId, term: int) -> None:
        prev = self.leader_of_term.setdefault(term, nid)
        if prev != nid:
            self.violate("election safety", f"{prev} and {nid} both leaders of term {term}")
        self.log(f"{nid} leader of term {term}")
        # Leader completeness: every committed entry is in the new leader's log.
        node = self.nodes[nid]
        assert node is not None
        log = node.node.raft.log
        first = log.first_index()
        for index, (t, _, _) in self.committed.items():
            if index < first:
                continue
            if not log.match_term(index, t):
                self.violate(
                    "leader completeness",
                    f"{nid} (term {term}) lacks committed entry {index}@{t}",
                )
                return

    def check_apply(self, nid: NodeId, e: Entry) -> None:
        known = self.committed.get(e.index)
        if known is None:
            self.committed[e.index] = (e.term, e.data, e.type)
        elif known != (e.term, e.data, e.type):
            self.violate(
                "state machine safety",
                f"{nid} applied {e.index}@{e.term} but {e.index}@{known[0]} was applied before",
            )

    def check_state(self, nid: NodeId, index: int, kv: dict[str, bytes]) -> None:
        d = kv_digest(kv)
        prev = self.state_at.setdefault(index, d)
        if prev != d:
            self.violate("state machine safety", f"{nid} state after {index} differs")

    def check_hard_state(self, nid: NodeId, term: int, vote: NodeId) -> None:
        if term < self.max_term[nid]:
            self.violate("durability", f"{nid} term went back {self.max_term[nid]} -> {term}")
        self.max_term[nid] = max(self.max_term[nid], term)
        if vote:
            prev = self.votes.setdefault((nid, term), vote)
            if prev != vote:
                self.violate("durability", f"{nid} voted for {prev} and {vote} in term {term}")

    def check_log_matching(self) -> None:
        live = [n for n in self.nodes.values() if n is not None]
        for i, a in enumerate(live):
            la = a.node.raft.log
            for b in live[i + 1 :]:
                lb = b.node.raft.log
                lo = max(la.first_index(), lb.first_index())
                hi = min(la.last_index(), lb.last_index())
                if lo > hi:
                    continue
                ea = la.slice(lo, hi + 1)
                eb = lb.slice(lo, hi + 1)
                agree = -1
                for k in range(len(ea) - 1, -1, -1):
                    if ea[k].term == eb[k].term:
                        agree = k
                        break
                if agree >= 0 and ea[: agree + 1] != eb[: agree + 1]:
                    self.violate("log matching", f"{a.id} and {b.id} differ below {lo + agree}")

    # -- faults -------------------------------------------------------------------------------

    def crash(self, nid: NodeId, why: str) -> None:
        node = self.nodes[nid]
        if node is None:
            return
        self.crashes += 1
        self.log(f"crash {nid} ({why})")
        node.abandon_clients()
        self.nodes[nid] = None
        self.fss[nid].crash(self.rng)
        self.down_until[nid] = self.now + self.rng.randint(5, 60)

    def restart(self, nid: NodeId) -> None:
        self.log(f"restart {nid}")
        del self.down_until[nid]
        node = SimNode(self, nid, self.fss[nid], None)
        hs = node.storage.hard_state
        if hs.term < self.max_term[nid]:
            self.violate("durability", f"{nid} restarted at term {hs.term} < {self.max_term[nid]}")
        if hs.vote:
            prev = self.votes.get((nid, hs.term))
            if prev is not None and prev != hs.vote:
                self.violate("durability", f"{nid} restarted with vote {hs.vote}, had {prev}")
        self.nodes[nid] = node
        node.process()

    def random_faults(self) -> None:
        rng = self.rng
        for nid, until in list(self.down_until.items()):
            if self.now >= until:
                self.restart(nid)
        live = [n for n in self.ids if self.nodes[n] is not None]
        if rng.random() < self.opts.crash and len(live) > 1:
            self.crash(rng.choice(live), "random")
        if self.heal_at == self.now:
            self.net.heal()
            self.log("heal")
        if not self.net.partitioned and rng.random() < self.opts.partition:
            if rng.random() < 0.5:
                victim = rng.choice(self.ids)
                self.net.isolate(victim, self.ids)
                self.log(f"isolate {victim}")
            else:
                side = set(rng.sample(self.ids, len(self.ids) // 2))
                self.net.split(side, self.ids)
                self.log(f"partition {sorted(side)}")
            if rng.random() < 0.2:  # one-way partitions too
                self.net.one_way()
            self.heal_at = self.now + rng.randint(10, 80)

    def admin(self) -> None:
        """Snapshots are automatic; here: membership changes and leadership transfers."""
        rng = self.rng
        leader = self.leader()
        if leader is None or rng.random() > 0.01:
            return
        node = self.nodes[leader]
        assert node is not None
        node.wake()
        raft = node.node.raft
        cfg = raft.config
        choice = rng.random()
        try:
            if choice < 0.4 and self.opts.membership:
                if cfg.learners:
                    target = sorted(cfg.learners)[0]
                    cc = ConfigChange(ConfigChangeType.PROMOTE, target, raft.committed_config.index)
                elif len(cfg.voters) > 3 or (
                    len(cfg.voters) == 3 and len(self.ids) == 3 and rng.random() < 0.5
                ):
                    target = rng.choice(sorted(cfg.voters - {leader}))
                    cc = ConfigChange(ConfigChangeType.REMOVE, target, raft.committed_config.index)
                else:
                    missing = sorted(set(self.ids) - cfg.members)
                    if not missing:
                        return
                    target = rng.choice(missing)
                    cc = ConfigChange(
                        ConfigChangeType.ADD_LEARNER, target, raft.committed_config.index
                    )
                node.node.propose_config_change(cc)
                self.log(f"{leader} proposes {cc.type.value} {cc.node}")
            elif choice < 0.6:
                targets = sorted(cfg.voters - {leader})
                if targets:
                    t = rng.choice(targets)
                    node.node.transfer_leader(t)
                    self.log(f"{leader} transfers leadership to {t}")
        except (ConfigChangeRefused, ProposalDropped):
            pass
        node.process()

    # -- clients ------------------------------------------------------------------------------

    def leader(self) -> NodeId | None:
        leaders = [
            (n.node.raft.term, nid)
            for nid, n in self.nodes.items()
            if n is not None and n.node.raft.state is Role.LEADER
        ]
        return max(leaders)[1] if leaders else None

    def client_idle(self, client: int) -> None:
        self.client_busy[client] = False

    def clients(self) -> None:
        rng = self.rng
        if self.quiesce:  # quiet stretches, or no group would ever be idle long enough
            if self.now < self.quiet_until:
                return
            if rng.random() < 0.02:
                self.quiet_until = self.now + rng.randint(15, 60)
                return
        for c in range(self.opts.clients):
            if self.client_busy[c] or rng.random() > 0.3:
                continue
            target = self.client_target[c]
            node = self.nodes[target]
            if node is not None:
                node.wake()
            key = f"k{rng.randrange(self.opts.keys)}"
            if rng.random() < 0.5:
                self.client_seq += 1
                value = f"c{c}-{self.client_seq}".encode()
                h = self.recorder.invoke(c, key, "put", value, now=self.now)
                try:
                    if node is None:
                        raise ProposalDropped("down")
                    index, term = node.node.propose(encode_put(key, value))
                except ProposalDropped as e:
                    self.recorder.fail(h, self.now)
                    self.client_target[c] = e.leader if e.leader else rng.choice(self.ids)
                    continue
                node.puts[index] = _PendingPut(h, term, c, self.now)
            else:
                h = self.recorder.invoke(c, key, "get", now=self.now)
                self.read_seq += 1
                ctx = f"r{self.read_seq}".encode()
                try:
                    if node is None:
                        raise ProposalDropped("down")
                    node.node.read_index(ctx)
                except ProposalDropped as e:
                    self.recorder.fail(h, self.now)
                    self.client_target[c] = e.leader if e.leader else rng.choice(self.ids)
                    continue
                node.reads[ctx] = _PendingRead(h, key, c, self.now)
            self.client_busy[c] = True
            node.process()

    # -- the loop -----------------------------------------------------------------------------

    def step(self) -> None:
        self.now += 1
        self.net.report_snapshots()
        self.net.deliver_due()
        self.net.deliver_digests()
        for nid in self.ids:
            n = self.nodes[nid]
            if n is None:
                continue
            if n.quiet is None:
                n.node.tick()
            elif not n.quiet.quiesced:
                n.node.tick()
                if n.node.raft.state is Role.LEADER:
                    n.quiet.after_tick()
            n.process()
        if self.quiesce and self.now % 2 == 0:  # every heartbeat interval (heartbeat_tick)
            for n in self.nodes.values():
                if n is not None and n.quiet is not None:
                    n.quiet.registry.beat()
                    n.process()
        self.random_faults()
        if not self.converging:
            self.admin()
            self.clients()
        for n in self.nodes.values():
            if n is not None:
                n.expire_clients(200)
        if self.now % 50 == 0:
            self.check_log_matching()

    def run(self) -> SimResult:
        for _ in range(self.opts.steps):
            self.step()
            if self.violations:
                break
        if not self.violations:
            self.converge()
        if not self.violations:
            result = check(self.recorder.history(), max_steps=2_000_000)
            if not result.ok:
                self.violate("linearizability", result.explanation)
        return SimResult(
            seed=self.opts.seed,
            violations=self.violations,
            ops=len(self.recorder.history()),
            committed=max(self.committed, default=0),
            leaders=len(self.leader_of_term),
            crashes=self.crashes,
            trace=self.trace,
        )

    def converge(self) -> None:
        """Heal, restart everyone, and require the group to agree on every committed entry."""
        self.net.heal()
        self.net.make_reliable()
        self.converging = True
        self.opts = SimOptions(
            **{**self.opts.__dict__, "drop": 0.0, "duplicate": 0.0, "crash": 0.0, "partition": 0.0}
        )
        for nid in list(self.down_until):
            self.restart(nid)
        if self.quiesce:
            problem = check_quiet_liveness(self, max(self.committed, default=0), encode_put)
            if problem is not None:
                self.violate("liveness (quiescence)", problem)
                return
        for nid in self.ids:  # a final crash-restart of everyone: recovery from disk only
            self.crash(nid, "final restart")
        for nid in list(self.down_until):
            self.restart(nid)
        target = max(self.committed, default=0)
        for _ in range(3000):
            self.step()
            members = self._final_members()
            applied = [self.live(n).applied for n in members]
            leader = self.leader()
            if leader is not None and min(applied) >= target:
                lead_commit = self.live(leader).node.raft.log.committed
                if all(a >= lead_commit for a in applied) and not any(
                    self.live(n).puts or self.live(n).reads for n in self.ids
                ):
                    return
        self.violate(
            "liveness",
            f"group did not converge after healing (committed up to {target}, applied "
            f"{ {n: self.live(n).applied for n in self.ids} })",
        )

    def live(self, nid: NodeId) -> SimNode:
        node = self.nodes[nid]
        assert node is not None, f"{nid} is down"
        return node

    def _final_members(self) -> list[NodeId]:
        leader = self.leader()
        if leader is None:
            return list(self.ids)
        return sorted(self.live(leader).node.raft.config.members)


def run_seed(seed: int, **kw: object) -> SimResult:
    return Simulator(SimOptions(seed=seed, **kw)).run()  # type: ignore[arg-type]
