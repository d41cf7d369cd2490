"""`tessera master add | remove` on a local cluster of real processes.

A one-master cluster grows to three masters with `master add --dir`, loses its first master
with `master remove master-1 --dir`, stays healthy (`cluster status`, `ksck`), and comes back
after `down` and `up` with the membership it ended with: the recorded masters reopen their data
dirs, whose Raft state, not the conf, says who the group is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.common.tls import open_sync_channel
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import FAST_TSERVER
from service.tools import cli, local_cluster
from service.tools.local_cluster import down, load_record, status, up

pytestmark = pytest.mark.integration


def _members(d: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert cli.main(["master", "list", "--dir", str(d), "--format", "json"]) == 0
    return {m["address"]: m["member_type"] for m in json.loads(capsys.readouterr().out)}


def _own_voters(d: Path, address: str) -> set[str]:
    """The voters in the config of the master at `address`, as it sees them."""
    with open_sync_channel(address, local_cluster.credentials(d)) as ch:
        r = master_pb2_grpc.MasterServiceStub(ch).ListMasters(pb.ListMastersRequestPB(), timeout=5)
    return {f"{e.rpc_addresses[0].host}:{e.rpc_addresses[0].port}"
            for e in r.masters if e.member_type == pb.VOTER}  # fmt: skip


def test_add_and_remove_masters_of_a_local_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "c"
    pids: list[int] = []
    try:
        up(
            d,
            1,
            1,
            master_overrides=[f"{k}={v}" for k, v in FAST_RAFT.items()],
            tserver_overrides=[f"{k}={v}" for k, v in FAST_TSERVER.items()],
            timeout=30,
        )
        assert cli.main(["table", "create", "t", "--columns", "id:int64", "--key", "id",
                         "--hash", "id:2", "--replicas", "1", "--dir", str(d)]) == 0  # fmt: skip
        capsys.readouterr()
        for expected in ("master-2", "master-3"):
            assert cli.main(["master", "add", "--dir", str(d)]) == 0
            out, err = capsys.readouterr()
            assert out.startswith(f"{expected} 127.0.0.1:") and "a voter" in out
            assert f"adding {expected} to the group ... ok" in err
        record = load_record(d)
        assert [m.name for m in record.masters] == ["master-1", "master-2", "master-3"]
        assert _members(d, capsys) == {a: "VOTER" for a in record.master_addresses}
        # Each master's own view agrees: the added ones were sent a snapshot carrying the
        # bootstrapped config, so none believes in a smaller quorum.
        for address in record.master_addresses:
            assert _own_voters(d, address) == set(record.master_addresses), address

        assert cli.main(["master", "remove", "master-1", "--dir", str(d)]) == 0
        assert "master-1" in capsys.readouterr().out
        record = load_record(d)
        assert [m.name for m in record.masters] == ["master-2", "master-3"]
        assert not (d / "data" / "master-1").exists()
        assert _members(d, capsys) == {a: "VOTER" for a in record.master_addresses}
        st = status(d)
        assert st.healthy, st.problems
        assert cli.main(["cluster", "ksck", "--dir", str(d)]) == 0, capsys.readouterr()
        capsys.readouterr()

        # Usage errors: no address and no --dir; an unknown master.
        masters = ",".join(record.master_addresses)
        assert cli.main(["master", "add", "--masters", masters]) == 2
        assert "HOST:PORT" in capsys.readouterr().err
        assert cli.main(["master", "remove", "master-9", "--dir", str(d)]) == 1
        assert "no master 'master-9'" in capsys.readouterr().err

        # Restart: the two remaining masters form the group, with the table.
        down(d)
        record = up(d, timeout=30)
        pids = [s.pid for s in record.servers if s.pid is not None]
        assert status(d).healthy
        assert cli.main(["table", "list", "--dir", str(d), "--format", "json"]) == 0
        assert [t["name"] for t in json.loads(capsys.readouterr().out)] == ["t"]
    finally:
        down(d)
    assert pids and all(not Path(f"/proc/{p}").exists() for p in pids)
