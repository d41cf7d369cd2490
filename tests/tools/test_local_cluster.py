"""`tessera cluster up|status|down`: real background processes in a directory.

Every test that starts servers calls `down` in a `finally`, and checks that the pids it saw are
gone afterwards: nothing outlives the test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.common.errors import InvalidArgument
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER
from service.tools import cluster_cmd, healthcheck, local_cluster
from service.tools.local_cluster import (
    ClusterRecord,
    LocalClusterError,
    ServerRecord,
    down,
    is_running,
    load_record,
    master_addresses,
    status,
    up,
)

FAST_MASTER_SETS = [f"{k}={v}" for k, v in FAST_RAFT.items()]
FAST_TSERVER_SETS = [f"{k}={v}" for k, v in FAST_TSERVER.items()]


def _up(dir: Path, masters: int | None = None, tservers: int | None = None) -> ClusterRecord:
    return up(
        dir,
        masters,
        tservers,
        master_overrides=FAST_MASTER_SETS,
        tserver_overrides=FAST_TSERVER_SETS,
        timeout=30,
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _pids(record: ClusterRecord) -> list[int]:
    return [s.pid for s in record.servers if s.pid is not None]


@pytest.mark.integration
def test_up_status_down_and_restart_with_the_same_servers(tmp_path: Path) -> None:
    d = tmp_path / "cluster"
    lines: list[str] = []
    seen: list[int] = []
    try:
        first = up(
            d,
            1,
            1,
            master_overrides=FAST_MASTER_SETS,
            tserver_overrides=FAST_TSERVER_SETS,
            timeout=30,
            progress=lines.append,
        )
        seen += _pids(first)
        assert [line.split(" ... ")[0] for line in lines[:2]] == [
            "starting master-1",
            "starting tserver-1",
        ]
        assert master_addresses(d) == first.master_addresses == [first.masters[0].address]
        on_disk = json.loads((d / "cluster.json").read_text())
        assert on_disk["tservers"][0]["uuid"] == first.tservers[0].uuid
        assert on_disk["conf"]["master"].endswith("conf/master.toml")
        assert all(s.http_address for s in first.servers)  # status pages, a free port each

        st = status(d)
        assert st.healthy, st.problems
        assert st.leader == first.masters[0].address
        master, tserver = st.servers
        assert (master.running, master.role) == (True, "LEADER")
        assert (tserver.running, tserver.live, tserver.uuid) == (True, True, first.tservers[0].uuid)

        # The compose health check, against the real servers (and the wrong kind of server),
        # with the credentials `up` wrote; without them the secured servers refuse it.
        ts_address = first.tservers[0].address
        creds = ["--credentials", str(d / "credentials")]
        assert healthcheck.main(["--address", master.address, "--kind", "master", *creds]) == 0
        assert healthcheck.main(["--address", ts_address, "--kind", "tserver", *creds]) == 0
        assert healthcheck.main(["--address", ts_address, "--kind", "master", *creds]) == 1
        assert healthcheck.main(["--address", master.address, "--kind", "master"]) == 1

        with pytest.raises(LocalClusterError, match="already running") as refused:
            _up(d)
        assert str(d) in refused.value.message and "master-1" in refused.value.message

        assert {r.outcome for r in down(d)} == {"stopped"}
        assert all(_gone(pid) for pid in seen)
        assert healthcheck.main(["--address", master.address, "--kind", "master", *creds]) == 1
        assert all(s.pid is None for s in load_record(d).servers)
        after = status(d)  # dead processes are reported, not raised
        assert not after.healthy
        assert not any(s.running for s in after.servers)
        assert {r.outcome for r in down(d)} == {"not running"}  # idempotent

        with pytest.raises(LocalClusterError, match="holds a cluster of 1 masters"):
            _up(d, masters=3)
        second = _up(d)
        seen += _pids(second)
        assert second.masters[0].address == first.masters[0].address
        assert second.tservers[0].uuid == first.tservers[0].uuid
        assert second.tservers[0].address == first.tservers[0].address
        assert status(d).healthy
    finally:
        down(d)
    assert all(_gone(pid) for pid in seen)


@pytest.mark.integration
def test_cli_up_status_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "c")
    sets = [x for s in FAST_MASTER_SETS for x in ("--master-set", s)]
    sets += [x for s in FAST_TSERVER_SETS for x in ("--tserver-set", s)]
    try:
        assert cluster_cmd.main(["up", "--dir", d, "--masters", "1", "--tservers", "1", *sets]) == 0
        out = capsys.readouterr().out
        assert "starting master-1 ... ok" in out and "starting tserver-1 ... ok" in out
        addresses = ",".join(master_addresses(d))
        assert f"--masters {addresses}" in out

        assert cluster_cmd.main(["status", "--dir", d]) == 0
        table = capsys.readouterr().out
        assert "LEADER" in table and "live" in table and "healthy in" in table
        creds = ["--credentials", f"{d}/credentials"]
        assert cluster_cmd.main(["status", "--masters", addresses, "--tservers", "1", *creds]) == 0
        capsys.readouterr()
        # Without credentials the secured masters refuse the connection, and the report says
        # what to do.
        assert cluster_cmd.main(["status", "--masters", addresses, "--tservers", "1"]) == 1
        assert "--credentials" in capsys.readouterr().out
        assert cluster_cmd.main(["status", "--dir", d, "--format", "json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["healthy"] and len(report["servers"]) == 2
    finally:
        assert cluster_cmd.main(["down", "--dir", d]) == 0
    assert "stopping tserver-1 ... stopped" in capsys.readouterr().out
    assert cluster_cmd.main(["status", "--dir", d]) == 1
    assert "NOT healthy" in capsys.readouterr().out


@pytest.mark.integration
def test_three_masters_three_tablet_servers(tmp_path: Path) -> None:
    seen: list[int] = []
    try:
        record = _up(tmp_path, 3, 3)
        seen = _pids(record)
        assert len(set(record.master_addresses)) == 3
        st = status(tmp_path)
        assert st.healthy, st.problems
        roles = sorted(s.role or "" for s in st.servers if s.kind == "master")
        assert roles == ["FOLLOWER", "FOLLOWER", "LEADER"]
        assert [s.live for s in st.servers if s.kind == "tserver"] == [True, True, True]
    finally:
        down(tmp_path)
    assert len(seen) == 6 and all(_gone(pid) for pid in seen)


def test_a_bad_setting_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"raft\.tick_interval_ms: must be > 0"):
        up(tmp_path / "c", 1, 1, master_overrides=["raft.tick_interval_ms=-1"])
    assert not (tmp_path / "c" / "cluster.json").exists()


@pytest.mark.integration
def test_a_failed_start_stops_what_it_started_and_quotes_the_log(tmp_path: Path) -> None:
    def server(kind: str, name: str, address: str) -> ServerRecord:
        data, log = tmp_path / "data" / name, tmp_path / "logs" / f"{name}.log"
        return ServerRecord(name, kind, address, str(data), str(log))

    with socket.socket() as taken:  # the master's recorded port is someone else's now
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        local_cluster.save_record(
            ClusterRecord(
                tmp_path,
                str(local_cluster.DEFAULT_MASTER_CONF),
                str(local_cluster.DEFAULT_TSERVER_CONF),
                masters=(server("master", "master-1", address),),
                tservers=(server("tserver", "tserver-1", ""),),
            )
        )
        with pytest.raises(LocalClusterError) as failed:
            up(tmp_path, master_overrides=FAST_MASTER_SETS, timeout=30)
    message = failed.value.message
    assert "master-1" in message and "exited with code" in message
    assert address in message.split("; the end of", 1)[1]  # the log's end, quoted
    record = load_record(tmp_path)
    assert Path(record.tservers[0].log).read_text().startswith("--- ")  # it was started too
    assert all(s.pid is None for s in record.servers)
    assert not any(is_running(s) for s in record.servers)


# --- the pid-reuse check, with stand-in processes ---------------------------------------------


def _stand_in(*words: str) -> subprocess.Popen[bytes]:
    """A process that sleeps, with `words` in its command line (as a server's would be)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *words])


def _record_with(dir: Path, data_dir: Path, pid: int) -> None:
    dir.mkdir(exist_ok=True)
    server = ServerRecord(
        "master-1", "master", "127.0.0.1:1", str(data_dir), str(dir / "m.log"), pid=pid
    )
    record = ClusterRecord(dir, "m.toml", "t.toml", masters=(server,))
    local_cluster.save_record(record)


@pytest.mark.parametrize(
    "words",
    [
        (),  # an unrelated process took the pid
        ("-m", "service.master", "--set", "data_dir=/somewhere/else"),  # another cluster's
        ("-m", "service.tserver", "--set", "data_dir={data}"),  # not a master
    ],
    ids=["unrelated", "other-data-dir", "other-kind"],
)
def test_down_never_signals_a_process_that_reused_the_pid(
    tmp_path: Path, words: tuple[str, ...]
) -> None:
    data = tmp_path / "data" / "master-1"
    other = _stand_in(*(w.format(data=data) for w in words))
    try:
        _record_with(tmp_path, data, other.pid)
        assert [r.outcome for r in down(tmp_path, grace=1)] == ["not running"]
        time.sleep(0.1)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_down_stops_the_process_that_is_the_server(tmp_path: Path) -> None:
    data = tmp_path / "data" / "master-1"
    mine = _stand_in("-m", "service.master", "--set", f"data_dir={data}")
    try:
        _record_with(tmp_path, data, mine.pid)
        assert is_running(load_record(tmp_path).masters[0])
        assert [r.outcome for r in down(tmp_path, grace=5)] == ["stopped"]
        assert mine.wait(timeout=5) != 0
    finally:
        mine.kill()
        mine.wait()


# --- bad directories and arguments ------------------------------------------------------------


def test_a_directory_without_a_cluster_is_named_with_what_was_expected(tmp_path: Path) -> None:
    for call in (status, down, master_addresses):
        with pytest.raises(LocalClusterError, match=r"expected .*cluster\.json"):
            call(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(LocalClusterError, match=r"not empty and holds no cluster\.json"):
        up(tmp_path, 1, 0)
    (tmp_path / "cluster.json").write_text("{}")
    with pytest.raises(LocalClusterError, match="is not a cluster record"):
        status(tmp_path)


def test_settings_the_cluster_owns_cannot_be_overridden(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="rpc_bind"):
        up(tmp_path / "c", 1, 0, master_overrides=["rpc_bind=127.0.0.1:7051"])


def test_cli_errors_become_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster_cmd.main(["status", "--dir", str(tmp_path)]) == 1
    assert "no cluster in" in capsys.readouterr().err
    assert cluster_cmd.main(["up", "--dir", str(tmp_path), "--master-set", "data_dir=x"]) == 2
    assert "data_dir" in capsys.readouterr().err


@pytest.mark.integration
def test_one_server_stops_starts_and_restarts_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "c"
    try:
        first = _up(d, 1, 2)
        ts2 = next(s for s in first.tservers if s.name == "tserver-2")
        assert cluster_cmd.main(["restart", "tserver-2", "--dir", str(d)]) == 0
        assert "stopping tserver-2 ... stopped" in capsys.readouterr().out
        again = next(s for s in load_record(d).tservers if s.name == "tserver-2")
        assert again.pid != ts2.pid and _gone(ts2.pid or 0)
        assert (again.uuid, again.address) == (ts2.uuid, ts2.address)
        assert cluster_cmd.main(["stop", "tserver-2", "--dir", str(d)]) == 0
        st = status(d)
        assert not st.healthy and not next(s for s in st.servers if s.name == "tserver-2").running
        assert cluster_cmd.main(["start", "tserver-2", "--dir", str(d)]) == 0
        deadline = time.monotonic() + 30
        while not status(d).healthy:
            assert time.monotonic() < deadline, status(d).problems
            time.sleep(0.2)
        assert cluster_cmd.main(["start", "tserver-2", "--dir", str(d)]) == 1  # it runs
        assert "is running" in capsys.readouterr().err
        assert cluster_cmd.main(["stop", "ts-9", "--dir", str(d)]) == 2
        assert "no server 'ts-9'" in capsys.readouterr().err
    finally:
        down(d)
