"""A fuzzing campaign against a live mini cluster: `make fuzz FUZZ_CASES=N FUZZ_SEED=S`.

Theory of operation
-------------------
One process starts a secured cluster (fuzz_cluster.py: 3 masters, 3 tablet servers, two
fixture tables with rows, a scratch table) and sends it N cases, one at a time. A case is one
call of one RPC (fuzz_gen.py: every method of MasterService, TabletServerAdminService,
TabletServerService, TabletCopyService and ConsensusService, read from the descriptors, each
in turn), made as an admin, a user, a tablet server or a master that are no members, or a
member (the first tablet server, with its own certificate), to the master leader, another
master, a tablet server or the one leading the tablet the request names. Its requests are
valid ones with hostile values in a few fields, hostile ones built field by field, byte-mutated
ones or bytes that are no protobuf, with Arrow payloads for writes (misrouted rows among them:
keys of other tablets of the table) and, in the member's heartbeats, claims about the fixture
tablets that no other server confirms. Hypothesis draws each case from (seed, case number)
alone, so any case can be run again by its number.

Before it is sent, a case that an allowed caller could use to legitimately wreck the cluster
is pointed at the scratch table instead (fuzz_guard.py); everything else goes as generated.
Placeholders only the running campaign can fill (the target's uuid, a scanner or tablet copy
session opened just before) are filled in; the reproducer shows the request as sent.

After each case (fuzz_checks.py):

* crash: a server process exited. It is restarted, and the campaign goes on;
* state change: a refused request (any status but OK) changed the catalog (the scratch
  table's tablets aside: `_settled`), or the target
  tablet server's replicas (the scratch table's aside once an accepted destructive case hit
  it) or fencing term, or the rows of the fixture replica a write was
  refused by; or any request changed the fixtures' part of the catalog; or the replicas of a
  fixture tablet disagree (checked every `CHECK_EVERY` cases and at the end). A tablet server
  found changed is restarted, back to a state its masters agree with;
* outside partition (a state change): after a Write to a fixture tablet, the replica it went
  to holds rows outside its partition (its Checksum's count); every `CHECK_EVERY` cases and
  at the end, any replica of a fixture tablet does, by the fuzzer's own scan of its keys;
* tombstoned (a state change): after any case whose RPC is not read-only (`READ_ONLY`), a
  fixture tablet's replica on some server is gone or not READY;
* no leader (a state change): at two periodic looks in a row (every `CHECK_EVERY` cases), a
  fixture tablet that no replica knows a leader of, or whose term a replica holds past 2^62 (a
  group that can never elect again);
* config mismatch (a state change): after the same cases, the master's record of a fixture
  tablet's config (voters, op index) is not what its running replicas committed, for longer
  than `fuzz_checks.SETTLE_S` (a forged claim adopted). These three are reported once while
  they last (`_standing`): the cluster cannot be put back, and every later case would see
  the same;
* stall: a server counted an event-loop stall longer than the Raft heartbeat interval (its
  `tessera_event_loop_stalls_total`, read every `SCRAPE_EVERY` cases; the case among them
  whose call and the Pings sent to every server after it took longest is the one reported).
  The fuzzer shares its machine with whatever else runs there, so a stall during which a
  control process of its own also woke late is the machine's: counted apart, not a finding.
  Servers without the counter are judged by the Pings alone;
* unexpected status: UNKNOWN, INTERNAL, DATA_LOSS or UNIMPLEMENTED, which the servers send
  only for exceptions nobody handled (service/common/errors.py) or methods they lack;
* traceback: a new Python traceback in a server's log.

A refusal (PERMISSION_DENIED, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE,
DEADLINE_EXCEEDED, ...) is what most cases should get and is no finding; an accepted request
is fine too, and its effects are expected (a table or tablet the fuzzer created is deleted at
once, grants it gave to made-up users are revoked now and then).

Each finding prints what happened and two reproducers: the case's number (`--seed S --case K`
runs that case alone in a new cluster; earlier cases' effects are not replayed) and its exact
request bytes (`--replay HEX --rpc NAME --as ROLE --to TARGET`; names in it are the old
cluster's, except the tablet servers' uuids, which are the same in every run). The full text
goes to a file in `--out`; after `SHOWN` alike findings the rest are only counted.

Server bugs found and still open are listed in fuzz_guard.KNOWN_ISSUES; `--skip-known` keeps
requests away from them, so a short run can stay green and a long one look for other bugs.

The run ends with one line: `fuzz: N cases, C crashes, S state changes, L stalls` (state
changes of every class: refused changes, outside partition, tombstoned, config mismatch),
preceded by the count of every RPC's outcomes and a line with the rest (unexpected statuses,
tracebacks, the machine's stalls, errors of the fuzzer's own, state changes by class); the
exit status is 1 if anything was found.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError

from service.testing.fuzz_checks import (
    SETTLE_S,
    Checksum,
    FixtureHealth,
    LogWatch,
    MachineWatch,
    StallProbe,
    catalog_view,
    config_mismatches,
    describe_diff,
    fixture_health,
    keys_outside_partition,
    leaderless,
    lost_replicas,
    outside_rows,
    replica_checksum,
    replicas_agree,
    restrict,
    tserver_view,
)
from service.testing.fuzz_cluster import (
    FIXTURE_A,
    FIXTURE_B,
    FIXTURES,
    MEMBER_UUID,
    PRINCIPALS,
    SCRATCH,
    FuzzCluster,
    Outcome,
)
from service.testing.fuzz_gen import (
    IDENTITIES,
    Case,
    Generator,
    draw_case,
    message_class,
    rpc_by_name,
)
from service.testing.fuzz_guard import DESTRUCTIVE, Protected, defang
from service.testing.fuzz_prepare import (
    bind,
    named_tablet,
    undo_accepted,
    with_live_handles,
    written_tablet,
)
from service.testing.fuzz_report import Repro, Stats, fmt_slow, outcome_lines

__all__ = ["Campaign", "Stats", "main"]

T = TypeVar("T")

CHECK_EVERY = 500
"""Cases between two comparisons of every fixture replica's checksum."""
MAINTAIN_EVERY = 100
"""Cases between two refreshes of the leader's address, the fixtures' ids and the vocabulary."""
SCRAPE_EVERY = 5
"""Cases between two readings of the servers' own stall counters: a stall is pinned down to
that many cases (all servers are read at once, a few milliseconds)."""
SCRATCH_EVERY = 1000
"""Fewest cases between two re-creations of a broken scratch table (each takes seconds)."""
PROGRESS_S = 10.0
SHOWN = 3
"""Findings of one kind, RPC and text printed in full; the rest are counted."""
UNEXPECTED = frozenset({"UNKNOWN", "INTERNAL", "DATA_LOSS", "UNIMPLEMENTED"})

CATALOG_RPCS = frozenset(
    f"MasterService/{m}"
    for m in (
        "CreateTable",
        "AlterTable",
        "DeleteTable",
        "GrantPrivileges",
        "RevokePrivileges",
        "AddMaster",
        "RemoveMaster",
        "AddReplica",
        "RemoveReplica",
        "MoveReplica",
        "TSHeartbeat",
        "TSHeartbeatStream",
    )
)
"""RPCs whose requests could change the catalog: the catalog is compared around them."""
TSERVER_RPCS = frozenset(
    f"TabletServerAdminService/{m}"
    for m in (
        "CreateTablet",
        "DeleteTablet",
        "AlterSchema",
        "ChangeConfig",
        "LeaderStepDown",
        "StartTabletCopy",
        "CancelTabletCopy",
    )
)
"""RPCs whose refused requests must leave the target tablet server's replicas as they were."""
READ_ONLY = frozenset(
    {
        *(
            f"MasterService/{m}"
            for m in (
                "IsCreateTableDone",
                "IsAlterTableDone",
                "ListTables",
                "GetTableSchema",
                "GetTableLocations",
                "GetTabletLocations",
                "ConnectToMaster",
                "Ping",
                "ListMasters",
                "ListTabletServers",
                "DumpCatalog",
                "ListGrants",
            )
        ),
        *(
            f"TabletServerAdminService/{m}"
            for m in ("GetConsensusState", "ListTablets", "ListTabletCopies")
        ),
        *(
            f"TabletServerService/{m}"
            for m in ("Scan", "ScanNext", "ScanClose", "Checksum", "SplitKeyRange", "Ping")
        ),
    }
)
"""RPCs that change no replica and no config: the fixtures' replicas and the master's record
of them are not looked at after these (every other case is followed by `_check_fixtures`)."""
FINDING_KINDS = {
    "crash": "crashes",
    "state change": "state_changes",
    "outside partition": "state_changes",
    "tombstoned": "state_changes",
    "config mismatch": "state_changes",
    "no leader": "state_changes",
    "stall": "stalls",
    "unexpected status": "unexpected",
    "traceback": "tracebacks",
}
"""Each kind of finding, and the count of the final line it adds to."""


@dataclass
class Campaign:
    """N cases against one cluster (module docstring)."""

    fc: FuzzCluster
    seed: int
    out_dir: Path
    say: Callable[[str], None] = print
    skip_known: bool = False
    """Keep requests away from the server bugs in fuzz_guard.KNOWN_ISSUES."""
    stats: Stats = field(default_factory=Stats)
    scratch_dirty: bool = False
    last_scratch: int = -SCRATCH_EVERY
    window: list[tuple[float, Repro]] = field(default_factory=list)
    """The cases since the servers' stall counters were last read, each with how long its
    call and the Pings after it took (the slowest is the first suspect of a stall)."""
    seen: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    standing: dict[str, set[str]] = field(default_factory=dict)
    """The problems of each standing kind (outside partition, tombstoned, config mismatch)
    found at the last look: one that lasts is reported once (`_standing`)."""
    leaderless_before: set[str] = field(default_factory=set)
    """Fixture tablets without a known leader at the last periodic look (`leaderless`)."""
    _protected: Protected | None = None

    def __post_init__(self) -> None:
        self.stalls = StallProbe(self.fc)
        self.logs = LogWatch(self.fc.logs())
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.machine = MachineWatch(self.out_dir / "control-lateness.txt")
        self.machine.start()
        self.last_scrape = time.monotonic()

    def close(self) -> None:
        self.machine.close()
        self.stalls.close()

    def prepare(self) -> None:
        """Look at the cluster (leader, fixtures) before cases run one by one (`run_case`)."""
        self.fc.refresh()
        self._protected = self._make_protected()

    # --- the run -----------------------------------------------------------------------------

    def run(self, cases: int, only: int | None = None) -> Stats:
        """Run cases 0..cases-1 (or only case `only`), then the final checks."""
        started = last = time.monotonic()
        self.stalls.scrape()
        numbers = range(cases) if only is None else range(only, only + 1)
        gen = None
        for number in numbers:
            if gen is None or number % MAINTAIN_EVERY == 0:
                try:
                    self._maintain()
                except Exception as e:  # e.g. the scratch table did not come up in time
                    self._harness_error(number, e)  # maintained again at the next block
                gen = Generator(self.fc.vocabulary())
            try:
                self.run_case(number, draw_case(gen, self.seed, number))
            except Exception as e:  # a bug of the fuzzer's own, or a cluster gone quiet
                self._harness_error(number, e)
            if time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                rate = self.stats.cases / (last - started)
                self.say(f"{self.stats.line()} so far ({rate:.1f} cases/s), {self.stats.others()}")
        self._periodic(final=True)
        self._report(time.monotonic() - started)
        return self.stats

    def _harness_error(self, number: int, e: Exception) -> None:
        """Count (and show the first few of) the fuzzer's own failures, then recover: a long
        campaign goes on past a busy machine's timeouts instead of ending with them."""
        self.stats.harness_errors += 1
        if self.stats.harness_errors <= SHOWN:
            trace = "".join(traceback.format_exception(e))
            self.say(f"fuzz: harness error at case {number} (not a finding):\n{trace}")
        self._recover()

    def _recover(self) -> None:
        """After a harness error: a server may have died or the leader moved."""
        with contextlib.suppress(Exception):
            for name, proc in list(self.fc.processes()):
                if not getattr(proc, "alive", True):
                    self.fc.restart(name)
            self.fc.refresh()

    def _maintain(self) -> None:
        """Between blocks: the leader, the fixtures' ids, the scratch table, the grants."""
        self.fc.refresh()
        n = self.stats.cases
        if (self.scratch_dirty or SCRATCH not in self.fc.tables) and (
            n - self.last_scratch >= SCRATCH_EVERY
        ):
            if not self.fc.scratch_healthy():
                self.fc.create_scratch()
                self.fc.refresh()
            self.scratch_dirty, self.last_scratch = False, n
        if n and n % (10 * MAINTAIN_EVERY) == 0:
            self._drop_foreign_grants()
        self._protected = self._make_protected()

    def _make_protected(self) -> Protected:
        a, b = self.fc.tables[FIXTURE_A], self.fc.tables[FIXTURE_B]
        scratch = self.fc.tables.get(SCRATCH)
        masters = list(self.fc.mini.masters.masters.values())
        return Protected(
            table_ids=frozenset((a.table_id, b.table_id)),
            table_names=frozenset((a.name, b.name)),
            tablet_ids=frozenset(self.fc.fixture_tablets()),
            scratch_table_id=scratch.table_id if scratch else "fuzz-no-scratch",
            scratch_table_name=scratch.name if scratch else "fuzz-no-scratch",
            scratch_tablet_id=scratch.tablets[0] if scratch and scratch.tablets else "none",
            master_uuids=frozenset(m.uuid for m in masters),
            master_ports=frozenset(int(m.address.rpartition(":")[2]) for m in masters),
            user=PRINCIPALS["user"],
            master_term=self.fc.leader_term,
            member_uuid=MEMBER_UUID,
        )

    def _drop_foreign_grants(self) -> None:
        """Grants the fuzzer made to made-up users pile up in the catalog: revoke them."""
        for g in self.fc.admin.call("list_grants"):
            if g.user != PRINCIPALS["user"] and g.privileges:
                with contextlib.suppress(Exception):
                    self.fc.admin.call(
                        "grant", g.table_name, g.user, list(g.privileges), revoke=True
                    )

    # --- one case ----------------------------------------------------------------------------

    def run_case(self, number: int, case: Case) -> Outcome:
        fc, rpc = self.fc, case.rpc
        assert self._protected is not None
        case = with_live_handles(fc, bind(fc, case))
        payloads, why = defang(
            rpc, case.identity, case.encoded(), self._protected, skip_known=self.skip_known
        )
        if why:
            self.stats.defanged += 1
        target_ts = case.target.startswith("tserver:")
        ts_name = list(fc.mini.tservers)[int(case.target.partition(":")[2])] if target_ts else ""
        cat_before = self._look(self._catalog) if rpc.name in CATALOG_RPCS else None
        named = named_tablet(rpc, payloads)
        scratch = fc.tables.get(SCRATCH)
        if self.scratch_dirty and scratch is not None and named in scratch.tablets:
            # An accepted destructive case already hit the scratch table: its replicas change
            # in the background (a DeleteTablet the master sends later, say) until the harness
            # re-creates it, as its catalog rows do (`_check_catalog` sets them aside too).
            named = ""
        watched = (*fc.fixture_tablets(), named)
        ts_before = (
            self._look(tserver_view, fc, ts_name, watched) if rpc.name in TSERVER_RPCS else None
        )
        written = written_tablet(fc, rpc.name, payloads, ts_name)
        rows_before = replica_checksum(fc, ts_name, written) if written else None

        started = time.monotonic()
        outcome = fc.send(case, payloads)

        self.stats.cases += 1
        self.stats.outcomes[(rpc.name, outcome.code)] += 1
        if outcome.code == "DEADLINE_EXCEEDED":
            self.stats.timeouts += 1
        repro = Repro(self.seed, number, case, payloads, outcome, why)
        self._check_alive(repro)
        if outcome.code in UNEXPECTED:
            self._finding("unexpected status", repro, f"{outcome.code}: {outcome.details}")
        if cat_before is not None:
            self._check_catalog(repro, cat_before)
        if ts_before is not None and not outcome.ok and fc.mini.tservers[ts_name].alive:
            after = self._look(tserver_view, fc, ts_name, watched)
            if after is not None and after != ts_before:
                self._finding(
                    "state change",
                    repro,
                    f"refused, yet {ts_name} changed: " + describe_diff(ts_before, after),
                )
                fc.restart(ts_name)  # back to a state the masters agree with
        if written:
            self._check_write(repro, written, ts_name, rows_before)
        if rpc.name not in READ_ONLY:
            self._check_fixtures(repro)
        if outcome.ok and rpc.name in DESTRUCTIVE:
            self.scratch_dirty = True
        note = undo_accepted(fc, case, payloads, outcome)
        if note:
            self.say(f"fuzz: note: {note}")
        slow = self.stalls.ping()
        self.window.append((outcome.seconds + max(slow.values(), default=0.0), repro))
        if slow and not self.stalls.counted:  # servers without their own stall counter
            if self.machine.busy(started, time.monotonic()):
                self.stats.machine_stalls += 1
            else:
                self._finding("stall", repro, "slow Ping after the case: " + fmt_slow(slow))
        for name, text in self.logs.new_tracebacks().items():
            self._finding("traceback", repro, f"{name} logged:\n{text}")
        self._periodic()
        return outcome

    def _look(self, fn: Callable[..., T], *args: object) -> T | None:
        """`fn(*args)`, or None (counted as an unchecked case) if the cluster did not answer:
        a check is skipped rather than the campaign stopped."""
        try:
            return fn(*args)
        except (grpc.RpcError, OSError):
            self.stats.unchecked += 1
            return None

    def _check_write(
        self, repro: Repro, tablet: str, ts_name: str, before: Checksum | None
    ) -> None:
        """After a Write to a fixture tablet: a refused one changed nothing, and the replica
        it went to holds no row outside its partition."""
        after = replica_checksum(self.fc, ts_name, tablet)
        if after is None:
            return
        if not repro.outcome.ok and before is not None and after.content != before.content:
            self._finding(
                "state change",
                repro,
                f"refused write changed tablet {tablet} on {ts_name}: "
                f"{before.rows} -> {after.rows} rows",
            )
        fixture = self.fc.fixture_of(tablet)
        schema = FIXTURES[fixture][0] if fixture else None
        problem = outside_rows(tablet, ts_name, after, schema)
        self._standing("outside partition", [problem] if problem else [], repro, keep=True)

    def _check_fixtures(self, repro: Repro) -> None:
        """Every fixture replica is READY on every server, and the master records the configs
        the replicas committed (fuzz_checks.lost_replicas, config_mismatches); a mismatch may
        settle for `SETTLE_S`."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            h = self._look(self._health)
            if h is None:
                return
            lost, mismatched = lost_replicas(h), config_mismatches(h)
            if (not lost and not mismatched) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        self._standing("tombstoned", lost, repro)
        self._standing("config mismatch", mismatched, repro)

    def _health(self) -> FixtureHealth:
        try:
            return fixture_health(self.fc)
        except grpc.RpcError:  # the leader moved: find it and ask again
            self.fc.refresh()
            return fixture_health(self.fc)

    def _standing(
        self, kind: str, problems: list[str], repro: Repro | None, *, keep: bool = False
    ) -> None:
        """Report the problems of `kind` not already standing at the last look, then remember
        these as standing (with `keep`, added to those: a look that saw one replica only)."""
        before = self.standing.get(kind, set())
        for p in problems:
            if p in before:
                continue
            if repro is None:
                self.stats.state_changes += 1
                self.stats.kinds[kind] += 1
                self._say_finding(kind, p, "")
            else:
                self._finding(kind, repro, p)
        self.standing[kind] = (before | set(problems)) if keep else set(problems)

    def _catalog(self) -> dict[str, object]:
        try:
            return catalog_view(self.fc)
        except Exception:  # the leader moved: find it and ask again
            self.fc.refresh()
            return catalog_view(self.fc)

    def _check_catalog(self, repro: Repro, before: dict[str, object]) -> None:
        after = self._look(self._catalog)
        if after is None:
            return
        scratch = self.fc.tables.get(SCRATCH)
        ignore = {scratch.table_id} if scratch else set()
        # Also a scratch table the harness is still creating or deleting (after a failed
        # maintenance, `fc.tables` has none): its tablets come and go in the background.
        ignore |= _named(before, SCRATCH) | _named(after, SCRATCH)
        b, a = _settled(before, ignore), _settled(after, ignore)
        fixtures = {t.table_id for k, t in self.fc.tables.items() if k != SCRATCH}
        fb, fa = restrict(before, fixtures), restrict(after, fixtures)
        fb["grants"] = frozenset(g for g in fb["grants"] if g[1] == PRINCIPALS["user"])
        fa["grants"] = frozenset(g for g in fa["grants"] if g[1] == PRINCIPALS["user"])
        if not repro.outcome.ok and a != b:
            self._finding(
                "state change", repro, "refused, yet the catalog changed: " + describe_diff(b, a)
            )
        elif fa != fb:
            self._finding("state change", repro, "the fixtures changed: " + describe_diff(fb, fa))
        elif a != b:
            self.stats.accepted_changes += 1

    # --- checks ------------------------------------------------------------------------------

    def _check_alive(self, repro: Repro) -> None:
        for name, proc in list(self.fc.processes()):
            if getattr(proc, "alive", True):
                continue
            log = self.fc.logs()[name]
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            self._finding("crash", repro, f"{name} exited; the end of its log:\n{tail}")
            self.fc.restart(name)
            self.logs = LogWatch(self.fc.logs())

    def _periodic(self, final: bool = False) -> None:
        n = self.stats.cases
        if final or n % SCRAPE_EVERY == 0:
            new = self.stalls.scrape()
            since, self.last_scrape = self.last_scrape, time.monotonic()
            if new and self.machine.busy(since, self.last_scrape):
                self.stats.machine_stalls += 1
            elif new and self.window:
                _, suspect = max(self.window, key=lambda w: w[0])
                cases = ", ".join(f"{r.number} {r.case.rpc.name}" for _, r in self.window)
                self._finding(
                    "stall",
                    suspect,
                    f"servers counted event-loop stalls over {self.stalls.bound_s:g} s: "
                    f"{fmt_slow(new)} (stalls), among cases {cases}; this one was the slowest",
                )
            elif new:
                self.stats.stalls += 1
                self._say_finding("stall", f"servers stalled between cases: {fmt_slow(new)}", "")
            self.window.clear()
        if final or (n and n % CHECK_EVERY == 0):
            problems = replicas_agree(self.fc, self.fc.fixture_tablets())
            for p in problems:
                self.stats.state_changes += 1
                self.stats.kinds["state change"] += 1
                self._say_finding("state change", p, "")
            outside = self._look(keys_outside_partition, self.fc)
            if outside is not None:
                self._standing("outside partition", outside, None, keep=True)
            health = self._look(fixture_health, self.fc)
            if health is not None:
                now_leaderless = leaderless(health)
                # Two looks in a row: an election between cases is no finding.
                self._standing("no leader", sorted(now_leaderless & self.leaderless_before), None)
                self.leaderless_before = now_leaderless

    def _finding(self, kind: str, repro: Repro, what: str) -> None:
        """Count a finding; print it and write its reproducer the first `SHOWN` times a
        finding of its kind, RPC and text (numbers aside) turns up."""
        attr = FINDING_KINDS[kind]
        setattr(self.stats, attr, getattr(self.stats, attr) + 1)
        self.stats.kinds[kind] += 1
        signature = (kind, repro.case.rpc.name, re.sub(r"\d+", "N", what)[:80])
        self.seen[signature] += 1
        if self.seen[signature] > SHOWN:
            return
        path = self.out_dir / f"case-{repro.number}-{kind.replace(' ', '-')}.txt"
        path.write_text(repro.text(what, full=True) + "\n")
        more = (
            " (further ones like it are counted, not shown)"
            if self.seen[signature] == SHOWN
            else ""
        )
        self._say_finding(kind, repro.text(what, full=False), f"(full reproducer: {path}){more}")

    def _say_finding(self, kind: str, text: str, where: str) -> None:
        self.say(f"fuzz: FINDING [{kind}] {text} {where}".rstrip())

    def _report(self, took: float) -> None:
        for line in outcome_lines(self.stats):
            self.say(line)
        rate = self.stats.cases / took if took > 0 else 0.0
        self.say(f"fuzz: {took:.0f} s, {rate:.1f} cases/s, seed {self.seed}; {self.stats.others()}")
        self.say(self.stats.line())


def _named(view: dict[str, object], name: str) -> set[str]:
    """The ids of the tables called `name` in `view`."""
    tables = view["tables"]
    assert isinstance(tables, dict)
    return {table_id for table_id, t in tables.items() if t[0] == name}


def _settled(view: dict[str, object], ignore: set[str]) -> dict[str, object]:
    """`view` without the tablets of the tables in `ignore` (scratch tables): their replica
    changes, and on a loaded machine the replacement of tablets that were not created in time,
    are background work an earlier accepted request started. The tables themselves stay in
    the view, so a refused request that creates, renames or deletes one is still seen."""
    tablets = view["tablets"]
    assert isinstance(tablets, dict)
    out = dict(view)
    out["tablets"] = {k: v for k, v in tablets.items() if v[0] not in ignore}
    return out


# --- command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m service.testing.fuzz", description=__doc__)
    p.add_argument("--cases", type=int, default=2000, help="how many cases (default 2000)")
    p.add_argument("--seed", type=int, default=1, help="the campaign's seed (default 1)")
    p.add_argument("--dir", help="keep the cluster's files here (default: a temporary dir)")
    p.add_argument("--out", help="where reproducers go (default: DIR/findings)")
    p.add_argument("--case", type=int, help="run only case K of the seed's campaign")
    p.add_argument("--replay", help="send these request bytes (hex; a comma between messages)")
    p.add_argument("--rpc", help="with --replay: the RPC, e.g. MasterService/CreateTable")
    p.add_argument(
        "--skip-known",
        action="store_true",
        help="keep requests away from known, still open server bugs (fuzz_guard.KNOWN_ISSUES)",
    )
    p.add_argument("--as", dest="identity", default="admin", choices=IDENTITIES)
    p.add_argument("--to", default="leader", help="leader, master:I or tserver:I")
    args = p.parse_args(argv)
    if args.replay is not None and not args.rpc:
        p.error("--replay needs --rpc")
    _stop_on_signals()
    with contextlib.ExitStack() as stack:
        if args.dir:
            base = Path(args.dir)
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tessera-fuzz-")))
        out = Path(args.out) if args.out else base / "findings"
        if not args.dir and not args.out:
            out = Path(tempfile.mkdtemp(prefix="tessera-fuzz-findings-"))
        print(f"fuzz: starting a cluster in {base} (reproducers go to {out})", flush=True)
        fc = stack.enter_context(FuzzCluster(base / "cluster"))
        campaign = Campaign(
            fc, args.seed, out, say=lambda s: print(s, flush=True), skip_known=args.skip_known
        )
        stack.callback(campaign.close)
        if args.replay is not None:
            return _replay(campaign, args)
        try:
            stats = campaign.run(args.cases, only=args.case)
        except KeyboardInterrupt:
            print("fuzz: interrupted", flush=True)
            print(campaign.stats.line(), flush=True)
            return 130
        return 1 if stats.failed else 0


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM end a run the way Ctrl-C does: the servers are stopped and the line
    so far printed. A shell starts background jobs with SIGINT ignored, and Python's default
    for SIGTERM is to die at once, leaving six servers behind."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _replay(campaign: Campaign, args: argparse.Namespace) -> int:
    rpc = rpc_by_name(args.rpc)
    payloads = tuple(bytes.fromhex(h) for h in args.replay.split(","))
    cls = message_class(rpc.input)
    messages = []
    for data in payloads:
        with contextlib.suppress(DecodeError):
            messages.append(cls.FromString(data))
    parsed = tuple(messages) if len(messages) == len(payloads) else ()
    case = Case(rpc, args.identity, args.to, parsed, raw=payloads)
    campaign.prepare()
    outcome = campaign.run_case(-1, case)  # no case number: the bytes are the reproducer
    print(
        f"fuzz: replay {rpc.name} as {args.identity} to {args.to}: {outcome.code} "
        f"{outcome.details!r}; parsed as {[str(m) for m in messages]}",
        flush=True,
    )
    campaign._periodic(final=True)
    print(campaign.stats.line(), flush=True)
    return 1 if campaign.stats.failed else 0


if __name__ == "__main__":
    sys.exit(main())
