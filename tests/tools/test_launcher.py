"""The launcher every cluster launcher shares: command lines, owner-only logs, ready files,
errors that quote the log, stopping with a grace period, and free ports for servers whose
addresses are fixed before they start."""

from __future__ import annotations

import signal
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

from service.tools.launcher import (
    LaunchError,
    ServerNotReady,
    _ephemeral_range,
    free_ports,
    pid_alive,
    security_overrides,
    server_args,
    spawn,
    terminate_all,
    toml_list,
    wait_ready,
)


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, high = _ephemeral_range()
    assert 0 < low <= high
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(10_000 <= p < low for p in ports), (ports, low)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen() -> None:
    low, _ = _ephemeral_range()
    held = []
    try:
        # Hold most of a small window's ports; the rest of the range stays open to free_ports.
        for port in range(10_000, min(10_200, low)):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
            except OSError:
                s.close()
                continue
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        for _ in range(20):
            assert not taken & set(free_ports(10))
    finally:
        for s in held:
            s.close()


# --- the command line, spawning, readiness, stopping (stand-in processes) --------------------


def test_server_args_put_settings_then_extra_arguments_then_the_ready_file(tmp_path: Path) -> None:
    args = server_args("service.master", "m.toml", ["a=1", "b=2"], tmp_path / "r", ["--x", "y"])
    assert args[1:] == [
        "-m", "service.master", "--conf", "m.toml", "--set", "a=1", "--set", "b=2",
        "--x", "y", "--ready-file", str(tmp_path / "r"),
    ]  # fmt: skip
    assert toml_list(["127.0.0.1:1", "127.0.0.1:2"]) == '["127.0.0.1:1", "127.0.0.1:2"]'
    assert security_overrides(None) == ["security.mode=insecure"]


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_server_logs_owner_only_and_its_ready_file_is_read(tmp_path: Path) -> None:
    ready, log = tmp_path / "s.ready", tmp_path / "s.log"
    ready.write_text("stale")  # from an earlier run: removed before the start
    code = (
        "import json, pathlib, sys; print('hello'); sys.stdout.flush();"
        f"tmp = pathlib.Path({str(ready) + '.tmp'!r});"
        "tmp.write_text(json.dumps({'address': 'h:1', 'uuid': 'u'}));"
        f"tmp.replace({str(ready)!r})"  # atomically, as servers do: never an empty ready file
    )
    launched = spawn("s", _python(code), log=log, ready=ready)
    info = wait_ready(launched, time.monotonic() + 30, 30, expect_address="h:1")
    assert info == {"address": "h:1", "uuid": "u"}
    assert launched.proc.wait(timeout=30) == 0
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert text.startswith("--- ") and "hello" in text


def test_a_server_that_exits_or_serves_elsewhere_is_refused_quoting_this_runs_log(
    tmp_path: Path,
) -> None:
    ready, log = tmp_path / "s.ready", tmp_path / "s.log"
    log.write_text("an earlier run's line\n")
    launched = spawn(
        "s", _python("print('bad setting'); raise SystemExit(2)"), log=log, ready=ready
    )
    with pytest.raises(LaunchError) as failed:
        wait_ready(launched, time.monotonic() + 30, 30)
    message = str(failed.value)
    assert "s (pid" in message and "exited with code 2" in message
    assert "bad setting" in message and "an earlier run" not in message

    code = (
        f"import pathlib; tmp = pathlib.Path({str(ready) + '.tmp'!r});"
        f'tmp.write_text(\'{{"address": "h:2"}}\'); tmp.replace({str(ready)!r})'
    )
    launched = spawn("s", _python(code), log=log, ready=ready)
    with pytest.raises(LaunchError, match="serves on h:2, expected h:1"):
        wait_ready(launched, time.monotonic() + 30, 30, expect_address="h:1")


def test_a_server_not_ready_in_time_is_a_timeout_and_terminate_all_kills_what_ignores_sigterm(
    tmp_path: Path,
) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('up', flush=True); time.sleep(60)"
    )
    ready = tmp_path / "s.ready"
    a = spawn("a", _python(stubborn), log=tmp_path / "a.log", ready=ready)
    b = spawn("b", _python("import time; time.sleep(60)"), log=tmp_path / "b.log", ready=ready)
    try:
        with pytest.raises(ServerNotReady) as late:
            wait_ready(a, time.monotonic() + 1, 1)
        assert isinstance(late.value, TimeoutError) and "is not serving after 1s" in str(late.value)
        # a by pid (as a recorded server), b by its Popen: only a needed SIGKILL.
        assert terminate_all([a.proc.pid, b.proc], grace=1.0) == {a.proc.pid}
        assert a.proc.poll() == -signal.SIGKILL and b.proc.poll() == -signal.SIGTERM
        assert not pid_alive(a.proc.pid)
    finally:
        terminate_all([a.proc, b.proc], grace=0.1)
