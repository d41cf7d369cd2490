"""The deterministic simulator: seeds pass, replays are exact, and injected bugs are caught
(a checker that cannot fail proves nothing)."""

from __future__ import annotations

import logging
import os

import pytest

from service.raft import raft as raft_mod
from service.raft import reads
from service.raft.types import ReadState, Ready
from service.testing import sim_cli
from service.testing.simulator import run_seed


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.disable(logging.WARNING)  # torn-tail repairs are expected in crash tests
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize(
    "seeds", [20, pytest.param(200, marks=pytest.mark.slow)], ids=["20-seeds", "200-seeds"]
)
def test_seeds_have_no_violations(seeds: int, capsys: pytest.CaptureFixture[str]) -> None:
    """20 seeds in the unit tier (about 4 s); the 200 of the campaign in `make test-slow`."""
    code = sim_cli.main(["--seeds", str(seeds), "--first", "0"])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == f"sim: {seeds} seeds, 0 violations", out[-5:]
    assert code == 0


def test_replaying_a_seed_is_exact() -> None:
    a = run_seed(7)
    b = run_seed(7)
    assert a.trace == b.trace and a.ops == b.ops and a.committed == b.committed
    assert a.ops > 100 and a.crashes > 0 and a.leaders > 1  # the seed exercises faults


def test_simulator_catches_stale_local_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve reads from the leader's commit index without confirming leadership: a deposed
    leader then returns stale data, which the linearizability checker must catch."""

    def local_read(r: raft_mod.Raft, ctx: bytes) -> None:
        # Neither waits for this term's no-op to commit nor runs a heartbeat round.
        r.read_states.append(ReadState(r.log.committed, ctx))

    monkeypatch.setattr(reads, "issue", local_read)
    # The first seed (of 40) whose history the linearizability checker rejects is enough.
    stale = (run_seed(s) for s in range(40))
    caught = next(
        (r for r in stale if any(v.kind == "linearizability" for v in r.violations)), None
    )
    assert caught is not None, "no seed exposed stale reads"


def test_simulator_catches_votes_not_made_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip persisting term and vote: a restarted node forgets its vote (amnesia)."""
    from service.consensus import raft_store

    def persist(self: raft_store.RaftStore, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.save_snapshot(rd.snapshot)
        if rd.entries or rd.hard_state is not None:
            self.wal.append(rd.entries, rd.hard_state)  # cmeta never written
        if rd.entries:
            self.wal.sync()

    monkeypatch.setattr(raft_store.RaftStore, "persist", persist)
    results = [run_seed(s) for s in range(5)]
    assert any(v.kind == "durability" for r in results for v in r.violations)


def test_simulator_catches_commit_without_log_up_to_date_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Grant votes to candidates with stale logs: leader completeness must fail."""
    from service.raft import log as log_mod

    monkeypatch.setattr(log_mod.RaftLog, "is_up_to_date", lambda self, i, t: True)
    results = [run_seed(s) for s in range(10)]
    assert any(v.kind == "leader completeness" for r in results for v in r.violations)


def test_a_seed_replays_alike_under_any_hash_seed() -> None:
    """`sim_cli --seed N` replays in a new process, whose str hashes differ: nothing the run
    draws from may depend on set order (the core once built its progress map from a set)."""
    import subprocess
    import sys

    code = (
        "import hashlib, logging; logging.disable(logging.WARNING);"
        "from service.testing.simulator import run_seed;"
        "print(hashlib.sha256('\\n'.join(run_seed(17).trace).encode()).hexdigest())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(h)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for h in (1, 2)
    }
    assert len(outs) == 1, outs


def test_quiescence_seeds_quiesce_wake_and_fail_over() -> None:
    """Seeds with quiescence (sim_quiesce.py) really quiesce, wake, and pass the liveness
    phases: settled asleep, a new leader after the quiesced one is killed, a write."""
    r = run_seed(17, quiesce=True)
    assert r.ok, r.violations
    text = "\n".join(r.trace)
    for line in (
        "quiesces leading",
        "quiesces following",
        "wakes (leader silent)",
        "settled: after healing",
        "the quiesced leader, died",
        "settled: after a write",
    ):
        assert line in text, line


def test_simulator_catches_followers_that_never_wake_for_a_silent_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Drop the silence rule (quiesce.py): followers of a dead quiesced leader sleep on."""
    from service.consensus import quiesce

    monkeypatch.setattr(quiesce.Quiescence, "check_leaders", lambda self, now: None)
    results = [run_seed(s, quiesce=True) for s in range(10)]
    assert any(v.kind == "liveness (quiescence)" for r in results for v in r.violations)
