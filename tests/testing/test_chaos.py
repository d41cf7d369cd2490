"""The fault campaign: its pure parts (histories, checkers, DDL model, report) in the default run,
and a short campaign on real processes in the slow suite."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from service.testing import linearizability
from service.testing.chaos_checks import (
    DdlModel,
    History,
    Op,
    catalog_ops,
    check_bank,
    check_rows,
    check_snapshots,
    register_ops,
    views_diverge,
)
from service.testing.chaos_nemesis import Window
from service.testing.chaos_report import RunResult, plot, render_summary, summary_line


def _op(h: History, f: str, type_: str, t0: float, t1: float | None, **kw: object) -> Op:
    op = h.invoke(int(kw.pop("process", 0)), f, kw.pop("key", None), kw.pop("value", None))  # type: ignore[arg-type]
    op.invoke = t0
    if type_ != "invoke":
        h.complete(op, type_, kw.pop("output", None), str(kw.pop("error", "")))
        op.complete = t1
    return op


def test_history_records_completions_and_closes_pending_as_info(tmp_path: Path) -> None:
    h = History()
    a = h.invoke(1, "write", "k", 1)
    h.complete(a, "ok")
    b = h.invoke(2, "write", "k", 2)
    with pytest.raises(ValueError):
        h.complete(a, "fail")
    h.close()
    assert (a.type, b.type) == ("ok", "info")
    assert a.latency is not None and a.latency >= 0 and b.latency is None
    assert h.counts() == {"ok": 1, "info": 1}
    h.write_jsonl(tmp_path / "h.jsonl")
    events = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["invoke", "ok", "invoke", "info"]


def test_register_history_is_checked_per_key_and_stale_reads_fail() -> None:
    h = History()
    _op(h, "write", "ok", 0.0, 1.0, key="a", value=1)
    _op(h, "read", "ok", 2.0, 3.0, key="a", output=1)
    _op(h, "write", "info", 2.0, None, key="b", value=7)  # may or may not have happened
    _op(h, "read", "ok", 4.0, 5.0, key="b", output=None)
    _op(h, "read", "fail", 4.0, 5.0, key="a")
    assert linearizability.check(register_ops(h.ops)).ok
    _op(h, "write", "ok", 6.0, 7.0, key="a", value=2)
    _op(h, "read", "ok", 8.0, 9.0, key="a", output=1)  # after 2 was acknowledged: stale
    r = linearizability.check(register_ops(h.ops))
    assert not r.ok and r.key == "a"


def test_catalog_reads_must_see_acknowledged_creates_and_not_acknowledged_deletes() -> None:
    h = History()
    _op(h, "create", "ok", 0.0, 1.0, value={"lineage": "1", "name": "t1"})
    _op(h, "list", "ok", 2.0, 3.0, output=["t1"])
    _op(h, "delete", "ok", 4.0, 5.0, value={"lineage": "1", "name": "t1"})
    _op(h, "list", "ok", 6.0, 7.0, output=[])
    assert linearizability.check(catalog_ops(h.ops)).ok
    _op(h, "list", "ok", 8.0, 9.0, output=["t1"])  # a deleted table shows again
    assert not linearizability.check(catalog_ops(h.ops)).ok


def test_a_create_refused_as_existing_for_a_fresh_name_is_a_violation() -> None:
    h = History()
    _op(h, "create", "fail", 0.0, 1.0, value={"lineage": "1", "name": "t1"}, error="ALREADY_EXISTS")
    assert not linearizability.check(catalog_ops(h.ops)).ok


def test_rows_checker_finds_lost_duplicate_phantom_and_stale_rows() -> None:
    h = History()
    _op(h, "insert", "ok", 0.0, 1.0, value=[1, 2])
    _op(h, "insert", "info", 0.0, None, value=[3, 4])
    _op(h, "scan", "ok", 2.0, 3.0, output=[1, 2, 3])
    _op(h, "final_scan", "ok", 10.0, 11.0, output=[1, 2, 4])
    v = check_rows(h.ops)
    assert v.ok and v.acknowledged == 2
    _op(h, "scan", "ok", 12.0, 13.0, output=[1, 1, 2, 9])
    _op(h, "final_scan", "ok", 14.0, 15.0, output=[2])
    v = check_rows(h.ops)
    assert (v.lost, v.duplicates, v.phantoms) == ([1], [1], [9])
    assert not v.ok and v.stale == []  # key 1 counts as lost, not also as a stale read
    h2 = History()
    _op(h2, "insert", "ok", 0.0, 1.0, value=[5])
    _op(h2, "scan", "ok", 2.0, 3.0, output=[])
    _op(h2, "final_scan", "ok", 4.0, 5.0, output=[5])
    assert check_rows(h2.ops).stale == [(1, 5)]
    assert not check_rows(History().ops).ok  # no final scan: no verdict


def test_snapshot_checker_accepts_exact_snapshots_and_names_every_kind_of_wrong_one() -> None:
    h = History()
    _op(h, "write", "ok", 0.0, 1.0, value=(1, [1, 2]), output=100)
    _op(h, "write", "ok", 1.5, 2.0, value=(2, [2, 3]), output=200)
    _op(h, "write", "info", 1.0, None, value=(3, [1]))  # may have committed at any time
    _op(h, "snapshot", "ok", 3.0, 4.0, value=150, output={1: 1, 2: 1})
    _op(h, "snapshot", "ok", 3.0, 4.0, value=150, output={1: 1, 2: 1})  # another replica
    _op(h, "snapshot", "ok", 3.0, 4.0, value=250, output={1: 3, 2: 2, 3: 2})
    _op(h, "final_snapshot", "ok", 5.0, 6.0, value=300, output={1: 1, 2: 2, 3: 2})
    v = check_snapshots(h.ops)
    assert (v.reads, v.violations, v.lost) == (4, [], [])

    bad = History()
    bad.ops = list(h.ops)
    _op(bad, "write", "ok", 4.5, 5.0, value=(4, [1]), output=400)  # began after the reads
    _op(bad, "snapshot", "ok", 3.0, 4.0, value=150, output={1: 4, 2: 1})  # 4 from the future
    _op(bad, "snapshot", "ok", 3.0, 4.0, value=250, output={1: 1, 2: 1, 3: 2})  # stale key 2
    _op(bad, "snapshot", "ok", 3.0, 4.0, value=250, output={1: 1, 2: 2})  # key 3 missing
    _op(bad, "snapshot", "ok", 3.0, 4.0, value=260, output={1: 1, 2: 2, 3: 99})  # never written
    _op(bad, "snapshot", "ok", 3.0, 4.0, value=270, output={1: 2, 2: 2, 3: 2})  # 2 not on key 1
    _op(bad, "final_snapshot", "ok", 5.0, 6.0, value=300, output={1: 1, 2: 2})  # 3 lost
    v = check_snapshots(bad.ops)
    text = " | ".join(v.violations)
    assert "two reads at 150 differ" in text and "committed after the snapshot" in text
    assert "newest write at or before it is 2" in text and "key 3 missing" in text
    assert "key 3 = 99, a value never written" in text
    assert "key 1 = 2, a value never written" in text
    assert v.lost == ["key 3: write 2 acknowledged, missing from the final read"]


def test_snapshot_checker_takes_a_writes_commit_timestamp_as_a_bound_not_each_keys_time() -> None:
    """A write over three tablets reports the newest of their commit times: a read at an
    earlier time may already show it on a tablet where it committed earlier (what chaos runs
    showed under kill -9), but not once the read ended before the write began."""
    h = History()
    _op(h, "write", "ok", 0.0, 1.0, value=(1, [0, 6, 11]), output=100)
    _op(h, "write", "ok", 2.0, 3.0, value=(2, [0, 6, 11]), output=300)
    _op(h, "snapshot", "ok", 2.5, 3.5, value=200, output={0: 1, 6: 2, 11: 2})
    _op(h, "final_snapshot", "ok", 4.0, 5.0, value=400, output={0: 2, 6: 2, 11: 2})
    assert check_snapshots(h.ops).violations == []
    late = History()
    late.ops = [op for op in h.ops if op.f == "write" and op.value[0] == 1]
    _op(late, "snapshot", "ok", 1.5, 1.8, value=200, output={0: 1, 6: 2, 11: 1})
    _op(late, "write", "ok", 2.0, 3.0, value=(2, [0, 6, 11]), output=300)
    v = check_snapshots(late.ops)
    assert len(v.violations) == 1 and "key 6 = 2, committed after the snapshot" in v.violations[0]


def test_bank_checker_finds_a_half_applied_transfer() -> None:
    h = History()
    _op(h, "transfer", "ok", 0.0, 1.0, value=(("a", 1), ("b", 2), 5), output=100)
    _op(h, "transfer", "fail", 0.0, 1.0, value=(("a", 1), ("b", 2), 5), error="ABORTED")
    _op(h, "balances", "ok", 1.0, 2.0, value=150, output={"a/1": 95, "b/2": 105})
    _op(h, "final_balances", "ok", 3.0, 4.0, value=300, output={"a/1": 95, "b/2": 105})
    v = check_bank(h.ops, 200)
    assert (v.reads, v.transfers, v.violations) == (2, 1, [])
    _op(h, "balances", "ok", 1.0, 2.0, value=160, output={"a/1": 90, "b/2": 105})
    v = check_bank(h.ops, 200)
    assert len(v.violations) == 1 and "sum to 195, not 200" in v.violations[0]


def test_ddl_model_allows_both_outcomes_of_indeterminate_operations() -> None:
    h = History()
    _op(h, "create", "ok", 0, 1, value={"lineage": "a", "name": "a"})
    _op(h, "rename", "info", 2, None, value={"lineage": "a", "name": "a", "new_name": "ar"})
    _op(h, "create", "ok", 0, 1, value={"lineage": "b", "name": "b"})
    _op(h, "delete", "ok", 2, 3, value={"lineage": "b", "name": "b"})
    _op(h, "create", "fail", 0, 1, value={"lineage": "c", "name": "c"}, error="FAILED_PRECONDITION")
    _op(h, "create", "info", 0, None, value={"lineage": "d", "name": "d"})
    model = DdlModel(h.ops)
    assert model.check(["a"]).ok and model.check(["ar", "d"]).ok
    assert not model.check(["a", "ar"]).ok  # both names of one lineage
    assert not model.check([]).ok  # lineage a must have left one of its names
    assert not model.check(["a", "b"]).ok  # b's delete was acknowledged
    assert not model.check(["a", "c"]).ok  # c's create certainly failed
    assert not model.check(["a", "zz"]).ok  # never created
    assert not model.check(["a", "a"]).ok  # listed twice


def test_views_diverge_names_the_masters_that_disagree() -> None:
    same = {"id1": "t1"}
    assert views_diverge({"m1": same, "m2": dict(same), "m3": None}) == []
    assert views_diverge({"m1": same, "m2": {"id1": "t2"}, "m3": same}) == ["m2"]


def test_report_table_summary_line_and_replay_command() -> None:
    ok = RunResult("register", "kill", 7, 60, ops=10, ok=8, fail=1, info=1, valid=True)
    bad = RunResult("rows", "partition", 7, 60, ops=5, lost=2, valid=False, notes=["lost: [3]"])
    text = render_summary([ok, bad], "python -m service.testing.chaos")
    assert "| register | kill | 60 | 0 | 10 | 8 | 1 | 1 | 0 | valid |" in text
    assert "| rows | partition |" in text and "INVALID" in text
    assert "make chaos CHAOS_SEED=7 NEMESES=partition WORKLOADS=rows CHAOS_SECONDS=60" in text
    assert summary_line([ok, bad]) == (
        "chaos: 2 runs, 0 violations, 2 lost writes, 0 divergent catalogs"
    )
    assert RunResult("ddl", "kill", 1, 1, error="boom").verdict == "ERROR"


def test_plot_writes_a_png_with_fault_windows(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    h = History()
    for i in range(20):
        _op(h, "write", ("ok", "fail", "info")[i % 3], float(i), i + 0.01 * (i + 1), key="a")
    png = plot(
        h.ops,
        [Window(3.0, 8.0, "kill ts-1"), Window(12.0, None, "pause")],
        tmp_path / "p.png",
        "register x kill",
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.skipif(not _can_make_namespaces(), reason="needs root and iproute2 (namespaces)")
def test_a_short_campaign_over_every_nemesis_finds_nothing(tmp_path: Path) -> None:
    from service.testing.chaos import campaign

    nemeses = ["kill", "pause", "partition", "clock", "disk"]
    results = campaign(["register"], nemeses, 150, 11, tmp_path)
    assert [r.nemesis for r in results] == nemeses
    for r in results:
        assert r.verdict == "valid", (r.nemesis, r.error, r.notes)
        assert r.faults >= 1 and r.ok > 0
    assert (
        summary_line(results) == "chaos: 5 runs, 0 violations, 0 lost writes, 0 divergent catalogs"
    )
    assert (tmp_path / "summary.md").exists() and (tmp_path / "register-kill.png").exists()
