"""What the leader master has heard each tablet server say of its replicas, to confirm claims.

A tablet report is a claim (docs/design/catalog.md#R15): the leader adopts a reported
consensus state that differs from the recorded one only when other servers' own words confirm
it (`report_processing.confirmation`). Those words come from two places:

* their own tablet reports. Every replica's server reports it when its term, leader or config
  changes, so the followers of a newly elected leader report that leader within a heartbeat of
  the leader's own report. `ClaimEvidence` keeps, per tablet, the latest consensus state each
  server reported *when it differs from the recorded one* (an answer equal to the record can
  confirm no change of it): in a steady cluster the store is empty, during a burst of creates it
  holds a few entries per new tablet until their leaders' claims are adopted.
* GetConsensusState, asked by the leader at the address each server registered
  (`Master._confirm_claims`): at once for a claim that changes a config (rare, and a follower
  need not report a config it applied), and for a claim of a new leader only once it has
  waited `ASK_AFTER_S` for the followers' reports (asking for every new tablet's leader would
  add RPCs by the thousand during a large create).

A claim that is not yet confirmed is kept as *pending*: the report that carries the missing
word (a follower's, usually) adopts it at once (`plan_report(pending=...)`), so the order in
which a leader's and its followers' reports arrive costs no extra heartbeat.

A pending claim is also swept (`to_sweep`, run by the leader's background tasks): once it has
waited `ASK_AFTER_S`, its voters are asked with GetConsensusState off the heartbeat path, and a
claim they confirm is adopted then, without waiting for any server to report again. Why: asked
from the heartbeat, a claim waits for its claimant's report to come again (and a server whose
reports went unacknowledged waits longer each time, heartbeater.next_report_gap), and the ask
must be answered within the heartbeat's budget, which busy servers miss. In a scale run on a
slow host the sweep adopted under 2% of the claims of large creates (1,344 while the first
70,000-80,000 tablets were created). A sweep asks at most `SWEEP_MAX_CLAIMS` claims, each at
most once per `ASK_AFTER_S`, oldest first, so a burst of creates adds a bounded number of RPCs;
a claim its voters did not confirm after `SWEEP_TRIES` sweeps is dropped until its claimant
reports it again.

All of it is the leader's memory of one term: emptied when a term starts or ends (a new leader
asks every server for a full report, which brings the words back). Bounded: past
`MAX_TABLETS` tablets with evidence, new evidence is not kept (claims then wait for asks).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from service.common.ids import NodeId, TabletId
from service.master.catalog_info import CatalogMaps
from service.master.catalog_records import ConsensusState
from service.master.report_processing import (
    Answers,
    Claim,
    Evidence,
    ReportedState,
    ReportedTablet,
    ReportPlan,
    same_config,
)

__all__ = [
    "ASK_AFTER_S",
    "MAX_TABLETS",
    "SWEEP_MAX_CLAIMS",
    "SWEEP_TRIES",
    "ClaimEvidence",
    "ConfirmClaims",
]

ConfirmClaims = Callable[[Sequence[Claim]], Awaitable[dict[TabletId, Answers]]]
"""Ask the servers of each claimed tablet (the recorded config's and the claim's) for their own
consensus state, at the addresses they registered: their answers, by tablet and server."""

ASK_AFTER_S = 3.0
"""A claim of a new leader (same config) waits this long for its followers' reports before the
leader master asks them with GetConsensusState."""
SWEEP_MAX_CLAIMS = 32
"""Most pending claims one sweep asks about (`to_sweep`): at most a few dozen GetConsensusState
calls a sweep, whatever the backlog."""
SWEEP_TRIES = 3
"""Sweeps that ask about one pending claim before it is dropped (`to_sweep`)."""
MAX_TABLETS = 100_000
"""Most tablets with evidence kept at once (a few entries each): about 30 MB at most."""


def _differs(cs: ConsensusState, recorded: ConsensusState | None) -> bool:
    return (
        recorded is None
        or cs.term != recorded.term
        or cs.leader_uuid != recorded.leader_uuid
        or not same_config(cs, recorded)
    )


def _ahead(cs: ConsensusState, recorded: ConsensusState | None) -> bool:
    return recorded is None or cs.term > recorded.term or cs.config_index > recorded.config_index


class ClaimEvidence:
    """Per tablet: what each server said of its replica (when it differs from the record),
    and the claims waiting for confirmation (module docstring). Owned by the report handler;
    used on the event loop only."""

    def __init__(self) -> None:
        self._said: dict[TabletId, dict[NodeId, Evidence]] = {}
        self._pending: dict[TabletId, tuple[Claim, float]] = {}
        self._swept: dict[TabletId, tuple[Claim, float, int]] = {}
        """Per tablet, the pending claim sweeps asked about, when they last did, and how many
        times (`to_sweep`)."""

    def __len__(self) -> int:
        return sum(len(v) for v in self._said.values())

    @property
    def pending_claims(self) -> int:
        return len(self._pending)

    def clear(self) -> None:
        self._said.clear()
        self._pending.clear()
        self._swept.clear()

    # --- what servers say ----------------------------------------------------------------

    def note_report(
        self, reporter: NodeId, reported: Sequence[ReportedTablet], maps: CatalogMaps
    ) -> None:
        """Keep what `reporter` says of each replica it reported, when that differs from the
        tablet's record; forget its earlier word otherwise (it now agrees, or its replica
        failed or is gone, and says nothing)."""
        for r in reported:
            info = maps.tablets_by_id.get(r.tablet_id)
            if info is None:
                continue
            cs = r.consensus
            speaks = cs is not None and r.state not in (
                ReportedState.FAILED,
                ReportedState.TOMBSTONED,
            )
            if speaks and cs is not None and _differs(cs, info.record.consensus):
                self._keep(r.tablet_id, reporter, Evidence(cs))
            else:
                self._forget(r.tablet_id, reporter)

    def note_answers(self, answers: Mapping[TabletId, Answers]) -> None:
        """Keep servers' answers to GetConsensusState (they may confirm later claims too)."""
        for tablet_id, by_server in answers.items():
            for uuid, evidence in by_server.items():
                self._keep(tablet_id, uuid, evidence)

    def _keep(self, tablet_id: TabletId, uuid: NodeId, evidence: Evidence) -> None:
        said = self._said.get(tablet_id)
        if said is None:
            if len(self._said) >= MAX_TABLETS:
                return
            said = self._said[tablet_id] = {}
        said[uuid] = evidence

    def _forget(self, tablet_id: TabletId, uuid: NodeId) -> None:
        said = self._said.get(tablet_id)
        if said is not None and said.pop(uuid, None) is not None and not said:
            del self._said[tablet_id]

    def answers(self, tablet_ids: Iterable[TabletId]) -> dict[TabletId, Answers]:
        """What is known of these tablets, for `plan_report`."""
        out: dict[TabletId, Answers] = {}
        said = self._said
        for t in tablet_ids:
            got = said.get(t)
            if got:
                out[t] = got
        return out

    # --- claims ---------------------------------------------------------------------------

    def pending(self, tablet_ids: Iterable[TabletId]) -> dict[TabletId, Claim]:
        """The pending claims about these tablets, for `plan_report`."""
        if not self._pending:
            return {}
        out: dict[TabletId, Claim] = {}
        for t in tablet_ids:
            got = self._pending.get(t)
            if got is not None:
                out[t] = got[0]
        return out

    def note_unconfirmed(self, claims: Sequence[Claim], now: float) -> None:
        """Keep each claim as pending (its first sighting's time, if it is the same claim)."""
        for claim in claims:
            old = self._pending.get(claim.tablet_id)
            if old is not None and old[0] == claim:
                continue
            self._pending[claim.tablet_id] = (claim, now)

    def to_sweep(self, now: float, limit: int = SWEEP_MAX_CLAIMS) -> list[Claim]:
        """The pending claims a sweep should ask their voters about now (module docstring):
        those that have waited `ASK_AFTER_S` and were not swept in the last `ASK_AFTER_S`,
        oldest first, at most `limit`; each is marked swept at `now`. A claim already swept
        `SWEEP_TRIES` times is dropped instead: its voters said no three times, and only its
        claimant's next report brings it back. So a false claim (one server's certificate
        used to forge reports) costs the cluster a few asks per report it sends, not asks
        every few seconds for the rest of the term."""
        for tablet_id in [t for t in self._swept if t not in self._pending]:
            del self._swept[tablet_id]
        due = []
        for tablet_id, (claim, seen) in list(self._pending.items()):
            swept = self._swept.get(tablet_id)
            if swept is not None and swept[0] != claim:
                swept = None  # another claim of the tablet: a new start
            if swept is not None and swept[2] >= SWEEP_TRIES:
                del self._pending[tablet_id], self._swept[tablet_id]
            elif now - seen >= ASK_AFTER_S and (swept is None or now - swept[1] >= ASK_AFTER_S):
                due.append((seen, claim, 0 if swept is None else swept[2]))
        due.sort(key=lambda d: d[0])
        out = []
        for _, claim, tries in due[:limit]:
            self._swept[claim.tablet_id] = (claim, now, tries + 1)
            out.append(claim)
        return out

    def to_ask(self, claims: Sequence[Claim], maps: CatalogMaps, now: float) -> list[Claim]:
        """The claims worth a GetConsensusState to their voters now (module docstring)."""
        out = []
        for claim in claims:
            info = maps.tablets_by_id.get(claim.tablet_id)
            recorded = info.record.consensus if info is not None else None
            seen = self._pending.get(claim.tablet_id)
            waited = now - seen[1] if seen is not None and seen[0] == claim else 0.0
            if claim.changes_config(recorded) or waited >= ASK_AFTER_S:
                out.append(claim)
        return out

    def after_commit(self, plan: ReportPlan, maps: CatalogMaps) -> None:
        """A plan's write committed (`maps` has it): adopted claims are done, and the words
        that now agree with an updated record are forgotten."""
        for claim in plan.adopted:
            self._pending.pop(claim.tablet_id, None)
        for tablet_id in plan.updated_tablets:
            info = maps.tablets_by_id.get(tablet_id)
            recorded = info.record.consensus if info is not None else None
            pending = self._pending.get(tablet_id)
            if pending is not None and not _ahead(pending[0].consensus, recorded):
                del self._pending[tablet_id]  # adopted, or overtaken by a newer record
            said = self._said.get(tablet_id)
            if said is None:
                continue
            for uuid in [u for u, e in said.items() if not _differs(e.committed, recorded)]:
                del said[uuid]
            if not said:
                del self._said[tablet_id]
