"""The admin commands and ksck against one real cluster: 3 masters and 3 tablet servers.

Commands run through `main(argv)` with their output captured, as a person would type them
(one also through a real `python -m service.tools.admin_cmd` process). The tests share one
`MiniCluster` for the module and run in file order: tables are created, filled, scanned,
altered and deleted; ksck runs healthy, then with a tablet server killed, then after it was
restarted (the last test, so nothing after it depends on the cluster's shape).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.client import TesseraClient
from service.testing.master_cluster import ROOT
from service.testing.mini_cluster import MiniCluster
from service.tools import admin_cmd, ksck_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

COLUMNS = "id:int64,name:string?,score:double?,price:decimal(10,2)?=1.50,day:date?"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("admin-cli")) as c:
        yield c


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(cluster: MiniCluster, capsys: pytest.CaptureFixture[str]) -> Run:
    """`run("table", "list", ...)`: (exit code, stdout, stderr) with --masters added."""

    def go(*argv: str, masters: bool = True, main: Callable[..., int] = admin_cmd.main) -> Any:
        where = ["--masters", ",".join(cluster.master_addresses)]
        extra = [*where, "--credentials", cluster.credentials_dir() or ""] if masters else []
        code = main([*argv, *extra])
        out, err = capsys.readouterr()
        return code, out, err

    return go


def _rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# --- tables ----------------------------------------------------------------------------------


def test_create_list_and_describe(run: Run) -> None:
    code, out, err = run(
        "table", "create", "events", "--columns", COLUMNS, "--key", "id",
        "--hash", "id:3", "--split", "100", "--split", "200", "--replicas", "3",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert "created table events" in out and "9 tablet(s)" in out

    code, out, _ = run("table", "list")
    assert code == 0
    header, rule, row = out.splitlines()
    assert header.split()[:3] == ["name", "id", "state"] and set(rule) <= {"-", " "}
    assert row.split()[0] == "events" and "RUNNING" in row

    code, out, _ = run("table", "list", "--format", "json")
    (table,) = json.loads(out)
    assert table["name"] == "events" and table["num_tablets"] == 9 and table["num_replicas"] == 3

    code, out, _ = run("table", "describe", "events")
    assert code == 0
    assert "9 tablet(s), 3 replica(s) each" in out and "primary key (id)" in out
    assert "hash (id) into 3 buckets, seed 0" in out and "splits at 100, 200" in out
    assert "DECIMAL(10, 2)" in out

    code, out, _ = run("table", "describe", "events", "--format", "json")
    d = json.loads(out)
    assert [(c["id"], c["name"], c["type"], c["nullable"]) for c in d["columns"]] == [
        (0, "id", "INT64", False),
        (1, "name", "STRING", True),
        (2, "score", "DOUBLE", True),
        (3, "price", "DECIMAL(10, 2)", True),
        (4, "day", "DATE", True),
    ]
    assert d["columns"][3]["default"] == "1.50" and d["columns"][0]["key"]
    assert d["partitioning"]["hash"] == [{"columns": ["id"], "buckets": 3, "seed": 0}]
    assert d["partitioning"]["splits"] == ["100", "200"] and d["replicas"] == 3


def test_create_with_a_string_range_and_list_by_dir(
    run: Run, cluster: MiniCluster, tmp_path: Path
) -> None:
    code, out, err = run(
        "table", "create", "by_region", "--columns", "region:string,id:int32,v:binary?",
        "--key", "region,id", "--range", "region", "--split", "'m'", "--split", "t",
    )  # fmt: skip
    assert code == 0, err
    assert "3 tablet(s)" in out
    code, out, _ = run("tablet", "locations", "by_region")
    assert "range [-inf, 'm')" in out and "range ['m', 't')" in out and "range ['t', +inf)" in out

    # --dir: the masters come from the cluster record `tessera cluster up` writes
    from service.tools.local_cluster import ClusterRecord, ServerRecord

    masters = tuple(
        ServerRecord(f"master-{i}", "master", a, str(tmp_path), str(tmp_path / "log"))
        for i, a in enumerate(cluster.master_addresses)
    )
    record = ClusterRecord(tmp_path, "master.toml", "tserver.toml", masters=masters)
    (tmp_path / "cluster.json").write_text(json.dumps(record.to_json()))
    shutil.copytree(cluster.credentials_dir() or "", tmp_path / "credentials")  # as `up` writes
    code, out, _ = run("table", "list", "--dir", str(tmp_path), "--format", "json", masters=False)
    assert code == 0 and {t["name"] for t in json.loads(out)} >= {"events", "by_region"}


def _write_rows(cluster: MiniCluster) -> None:
    ids = list(range(300))
    data = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([None if i % 10 == 0 else f"n{i}" for i in ids], pa.string()),
            "score": pa.array([i / 2 for i in ids], pa.float64()),
        }
    )

    async def write() -> None:
        async with TesseraClient(cluster.master_addresses, credentials=cluster.credentials()) as c:
            result = await c.write("events", data)
            assert result.errors == []

    asyncio.run(write())


def test_scan(run: Run, cluster: MiniCluster) -> None:
    _write_rows(cluster)
    code, out, _ = run("table", "scan", "events", "--where", "id >= 10", "--where", "id<13")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["id", "name", "score", "price", "day"]
    body = sorted(line.split() for line in lines[2:-1])
    assert body == [
        ["10", "NULL", "5.0", "1.50", "NULL"],
        ["11", "n11", "5.5", "1.50", "NULL"],
        ["12", "n12", "6.0", "1.50", "NULL"],
    ]
    assert lines[-1] == "(3 rows)"

    code, out, _ = run(
        "table", "scan", "events", "--columns", "id,name", "--where", "id in (1, 20, 251)",
        "--format", "json",
    )  # fmt: skip
    assert code == 0
    assert sorted(_rows(out), key=lambda r: r["id"]) == [
        {"id": 1, "name": "n1"},
        {"id": 20, "name": None},
        {"id": 251, "name": "n251"},
    ]

    code, out, _ = run(
        "table", "scan", "events", "--columns", "id", "--where", "name startswith 'n2'",
        "--where", "name != 'n21'", "--where", "id < 30", "--format", "json",
    )  # fmt: skip
    assert sorted(r["id"] for r in _rows(out)) == [2, 22, 23, 24, 25, 26, 27, 28, 29]

    code, out, _ = run("table", "scan", "events", "--where", "name is null", "--format", "json")
    assert sorted(r["id"] for r in _rows(out)) == list(range(0, 300, 10))
    code, out, _ = run(
        "table", "scan", "events", "--where", "name is not null", "--limit", "7",
        "--format", "json",
    )  # fmt: skip
    assert len(_rows(out)) == 7 and all(r["name"] for r in _rows(out))
    code, out, _ = run("table", "scan", "events", "--where", "price = 1.5", "--limit", "2")
    assert code == 0 and out.splitlines()[-1] == "(2 rows)"


def test_alter(run: Run) -> None:
    code, out, err = run(
        "table", "alter", "events", "--add-column", "flag:bool=true",
        "--rename-column", "score:points", "--drop-column", "day",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert "schema version 1" in out
    code, out, _ = run("table", "describe", "events", "--format", "json")
    d = json.loads(out)
    assert [(c["id"], c["name"]) for c in d["columns"]] == [
        (0, "id"), (1, "name"), (2, "points"), (3, "price"), (5, "flag"),
    ]  # fmt: skip
    assert d["columns"][4]["default"] == "true" and not d["columns"][4]["nullable"]
    code, out, _ = run("table", "scan", "events", "--where", "id = 3", "--format", "json")
    assert _rows(out) == [{"id": 3, "name": "n3", "points": 1.5, "price": "1.50", "flag": True}]

    code, out, err = run("table", "alter", "by_region", "--rename", "regions")
    assert code == 0, err
    code, out, _ = run("table", "list", "--format", "json")
    assert {t["name"] for t in json.loads(out)} == {"events", "regions"}


# --- tablets, servers, masters ---------------------------------------------------------------


def test_tablet_locations(run: Run) -> None:
    code, out, _ = run("tablet", "locations", "events", "--format", "json")
    assert code == 0
    tablets = json.loads(out)
    assert len(tablets) == 9
    for t in tablets:
        assert [r["role"] for r in t["replicas"]].count("LEADER") == 1
        assert len(t["replicas"]) == 3
    assert {t["partition"] for t in tablets} == {
        f"hash {b} range [{lo}, {hi})"
        for b in range(3)
        for lo, hi in [("-inf", "100"), ("100", "200"), ("200", "+inf")]
    }
    code, out, _ = run("tablet", "locations", "events")
    assert len(out.splitlines()) == 2 + 9 and "LEADER" in out


def test_tserver_and_master_list(run: Run, cluster: MiniCluster) -> None:
    code, out, _ = run("tserver", "list")
    assert code == 0
    assert len(out.splitlines()) == 2 + 3 and out.count(" live ") == 3
    code, out, _ = run("tserver", "list", "--format", "json")
    servers = json.loads(out)
    assert {s["address"] for s in servers} == {ts.address for ts in cluster.tservers.values()}
    assert all(s["live"] for s in servers)
    # Every tablet has one leader, and servers say how many they lead in their heartbeats.
    code, out, _ = run("table", "list", "--format", "json")
    tablets = sum(t["num_tablets"] for t in json.loads(out))

    def leaders() -> int:
        _, out, _ = run("tserver", "list", "--format", "json")
        return sum(s["num_leaders"] for s in json.loads(out))

    deadline = time.monotonic() + 10
    while leaders() != tablets and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leaders() == tablets > 0

    code, out, _ = run("master", "list", "--format", "json")
    masters = json.loads(out)
    assert {m["address"] for m in masters} == set(cluster.master_addresses)
    assert [m["role"] for m in masters].count("LEADER") == 1
    code, out, _ = run("master", "list")
    assert len(out.splitlines()) == 2 + 3 and "LEADER" in out


def test_delete(run: Run) -> None:
    code, _, err = run("table", "delete", "regions")
    assert code == 2 and "without --yes" in err
    code, out, err = run("table", "delete", "regions", "--yes")
    assert code == 0 and "deleted table regions" in out, err
    code, _, err = run("table", "scan", "regions")
    assert code == 1 and "regions" in err and len(err.splitlines()) == 1


# --- errors ----------------------------------------------------------------------------------


CREATE = ["table", "create", "x", "--key", "id", "--columns"]
SCAN_WHERE = ["table", "scan", "events", "--where"]


@pytest.mark.parametrize(
    ("argv", "code", "phrase"),
    [
        ([*CREATE, "id:int65"], 2, "unknown type 'int65'"),
        ([*CREATE, "id:int64?"], 2, "cannot be nullable"),
        ([*CREATE, "id:int64", "--split", "abc"], 2, "'abc' is not a valid INT64 value"),
        ([*SCAN_WHERE, "id ~ 3"], 2, "--where 'id ~ 3': expected"),
        ([*SCAN_WHERE, "nope = 3"], 2, "unknown column 'nope'"),
        ([*SCAN_WHERE, "id >= abc"], 2, "'abc' is not a valid INT64 value"),
        ([*SCAN_WHERE, "id = null"], 2, "id is null"),
        (["table", "describe", "nosuch"], 1, "nosuch"),
        (["tablet", "locations", "nosuch"], 1, "nosuch"),
        (["table", "alter", "events"], 2, "nothing to alter"),
        (["table", "alter", "events", "--add-column", "z:int32"], 2, "without a default"),
    ],
)
def test_bad_inputs(run: Run, argv: list[str], code: int, phrase: str) -> None:
    got, out, err = run(*argv)
    assert got == code, (out, err)
    assert phrase in err, err


def test_usage_errors_exit_2(run: Run) -> None:
    assert run("table", "list", masters=False)[0] == 2  # neither --masters nor --dir
    assert run("table", "frobnicate")[0] == 2


def test_unreachable_masters_are_named(run: Run) -> None:
    start = time.monotonic()
    code, out, err = run(
        "table", "list", "--masters", "127.0.0.1:1,127.0.0.1:2", "--timeout", "1", masters=False
    )
    assert code == 1 and out == ""
    assert "127.0.0.1:1" in err and "127.0.0.1:2" in err and len(err.splitlines()) == 1
    assert time.monotonic() - start < 10


def test_a_real_process(cluster: MiniCluster) -> None:
    argv = ["table", "list", "--masters", ",".join(cluster.master_addresses), "--format", "json"]
    argv += ["--credentials", cluster.credentials_dir() or ""]
    proc = subprocess.run(
        [sys.executable, "-m", "service.tools.admin_cmd", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert [t["name"] for t in json.loads(proc.stdout)] == ["events"]


# --- ksck ------------------------------------------------------------------------------------


def _ksck(run: Run, *extra: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run("ksck", "--timeout", "1", "--format", "json", *extra, main=ksck_cmd.main)
    assert code in (0, 1), err
    return code, json.loads(out)


def _poll(run: Run, until: Callable[[int, dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, report = _ksck(run)
        if until(code, report):
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"ksck did not reach the expected state: {report}")
        time.sleep(0.3)


def test_ksck_healthy(run: Run) -> None:
    report = _poll(run, lambda code, r: code == 0, 20)
    assert report["healthy"] and report["masters"]["health"] == "HEALTHY"
    assert [t["tablets"]["HEALTHY"] for t in report["tables"]] == [9]
    assert [s["health"] for s in report["tablet_servers"]] == ["HEALTHY"] * 3

    code, out, _ = run("cluster", "ksck", main=ksck_cmd.main)
    assert code == 0 and out.splitlines()[-1].startswith("OK: 3 master(s), 3 tablet server(s)")
    code, _, err = run("ksck", "--tables", "nosuch", main=ksck_cmd.main)
    assert code == 1 and "nosuch" in err


def test_ksck_sees_a_dead_tablet_server_and_its_recovery(run: Run, cluster: MiniCluster) -> None:
    victim = "ts-1"
    address = cluster.tservers[victim].address
    cluster.kill_tserver(victim)
    try:
        # Tablets it led need a second to elect a new leader (UNAVAILABLE until then).
        report = _poll(
            run,
            lambda code, r: (
                code == 1
                and bool(r["unhealthy_tablets"])
                and all(t["health"] == "UNDER_REPLICATED" for t in r["unhealthy_tablets"])
            ),
            20,
        )
        dead = [s for s in report["tablet_servers"] if s["address"] == address]
        assert [s["health"] for s in dead] == ["UNAVAILABLE"]
        assert len(report["unhealthy_tablets"]) == 9  # a replica of every tablet was there
        assert all(
            f"replica on {address}: tablet server unreachable" in " ".join(t["reasons"])
            for t in report["unhealthy_tablets"]
        )
        code, out, _ = run("cluster", "ksck", "--timeout", "1", main=ksck_cmd.main)
        assert (
            code == 1
            and "UNDER_REPLICATED" in out
            and out.splitlines()[-1].startswith("NOT HEALTHY")
        )
    finally:
        cluster.start_tserver(victim)
    _poll(run, lambda code, r: code == 0, 30)


def test_load_parquet_and_csv_then_copy(run: Run, tmp_path: Path) -> None:
    from service.tools import cli

    code, _, err = run(
        "table", "create", "loaded", "--columns", "id:int64,name:string?,score:double?",
        "--key", "id", "--hash", "id:2",
    )  # fmt: skip
    assert code == 0, err
    n = 120_000
    pq.write_table(
        pa.table({"id": pa.array(range(n), pa.int64()), "name": [f"n{i}" for i in range(n)]}),
        tmp_path / "rows.parquet",
    )
    code, out, err = run(
        "table", "load", "loaded", str(tmp_path / "rows.parquet"), "--batch-rows", "20000",
        main=cli.main,
    )  # fmt: skip
    assert code == 0, err
    assert f"{n:,} applied, 0 refused" in out and "rows/s" in out
    (tmp_path / "more.csv").write_text("id,score\n1,0.5\n200000,2.5\n")
    code, out, err = run("table", "load", "loaded", str(tmp_path / "more.csv"), main=cli.main)
    assert code == 0 and "2 applied" in out, err
    # Refused before writing, naming the problem: a column the table lacks, a bad value, an
    # insert of existing keys.
    (tmp_path / "bad.csv").write_text("id,colour\n5,red\n")
    code, _, err = run("table", "load", "loaded", str(tmp_path / "bad.csv"), main=cli.main)
    assert code == 2 and "'colour'" in err, err
    (tmp_path / "worse.csv").write_text("id,score\nseven,1\n")
    code, _, err = run("table", "load", "loaded", str(tmp_path / "worse.csv"), main=cli.main)
    assert code == 2 and "id" in err, err
    code, _, err = run(
        "table", "load", "loaded", str(tmp_path / "more.csv"), "--operation", "insert",
        main=cli.main,
    )  # fmt: skip
    assert code == 2 and "already exists" in err, err
    # A load is one transaction: a file with one refused row writes none of its rows.
    (tmp_path / "mixed.csv").write_text("id,score\n300000,1\n300001,1\n1,9\n")
    code, _, err = run(
        "table", "load", "loaded", str(tmp_path / "mixed.csv"), "--operation", "insert",
        main=cli.main,
    )  # fmt: skip
    assert code == 2 and "nothing was written" in err, err
    code, out, _ = run("table", "scan", "loaded", "--where", "id >= 300000", "--format", "json")
    assert _rows(out) == []

    code, out, err = run("table", "copy", "loaded", "loaded_copy", main=cli.main)
    assert code == 2 and "--create" in err
    code, out, err = run("table", "copy", "loaded", "loaded_copy", "--create", main=cli.main)
    assert code == 0 and f"{n + 1:,} applied" in out, (out, err)
    code, out, _ = run(
        "table", "scan", "loaded_copy", "--where", "id in (1, 200000)", "--format", "json"
    )
    assert sorted((r["id"], r["score"]) for r in _rows(out)) == [(1, 0.5), (200000, 2.5)]


def test_where_like(run: Run) -> None:
    code, out, err = run(
        "table", "scan", "loaded", "--columns", "id", "--where", "name like 'n1234%'",
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    assert sorted(r["id"] for r in _rows(out))[:3] == [1234, 12340, 12341]
    code, out, err = run(
        "table", "scan", "loaded", "--columns", "id", "--where", "name like 'n1_0'",
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    assert sorted(r["id"] for r in _rows(out)) == [100, 110, 120, 130, 140, 150, 160, 170, 180,
                                                    190]  # fmt: skip
    code, _, err = run("table", "scan", "loaded", "--where", "id like '1%'")
    assert code == 2 and "like needs a string column" in err
