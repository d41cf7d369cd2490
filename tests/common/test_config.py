"""Config loading: shipped files, strictness (unknown keys, types), validation, overrides."""

from __future__ import annotations

import asyncio
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import grpc
import pytest

from service.common.config import (
    ConfigError,
    DemoNodeConfig,
    MasterConfig,
    PeerSpec,
    RaftSettings,
    RpcSettings,
    TServerConfig,
    WalSettings,
    from_mapping,
    load_config,
    parse_override,
    split_host_port,
    to_mapping,
)
from service.common.errors import InvalidArgument
from service.common.ids import NodeId

CONF = Path(__file__).resolve().parents[2] / "conf"

SHIPPED: list[tuple[str, type[Any]]] = [
    ("raft-demo.toml", DemoNodeConfig),
    ("master.toml", MasterConfig),
    ("tserver.toml", TServerConfig),
]

# Settings a shipped file sets to an example rather than the default (documented in the file).
EXAMPLE_VALUES = {"raft-demo.toml": {"rpc_bind", "peers"}}

DEMO: dict[str, Any] = {"uuid": "n1", "data_dir": "/tmp/n1"}


def _error(cls: type[Any], data: dict[str, Any], **overrides: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        from_mapping(cls, data, overrides)
    return info.value


# --- the shipped files -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "cls"), SHIPPED, ids=[n for n, _ in SHIPPED])
def test_shipped_conf_loads_and_validates(name: str, cls: type[Any]) -> None:
    config = load_config(cls, CONF / name)
    config.validate()
    assert config.raft == RaftSettings()
    assert config.wal == WalSettings()
    assert config.rpc == RpcSettings()


@pytest.mark.parametrize(("name", "cls"), SHIPPED, ids=[n for n, _ in SHIPPED])
def test_shipped_conf_lists_every_setting_with_its_default(name: str, cls: type[Any]) -> None:
    with (CONF / name).open("rb") as f:
        raw = tomllib.load(f)
    config = from_mapping(cls, raw)
    for fld in dataclasses.fields(cls):
        if fld.default is None:
            # TOML has no null: an unset optional is shown commented out.
            assert f"# {fld.name} = " in (CONF / name).read_text(), fld.name
            continue
        assert fld.name in raw, f"{name} lacks {fld.name}"
        if fld.default is not dataclasses.MISSING and fld.name not in EXAMPLE_VALUES.get(name, ()):
            assert getattr(config, fld.name) == fld.default, fld.name
    for section in ("raft", "wal", "rpc"):
        section_fields = {f.name for f in dataclasses.fields(getattr(config, section))}
        assert set(raw[section]) == section_fields, section


def test_demo_conf_describes_a_three_node_group() -> None:
    config = load_config(DemoNodeConfig, CONF / "raft-demo.toml")
    assert [p.uuid for p in config.peers] == ["demo-1", "demo-2", "demo-3"]
    assert config.uuid in {p.uuid for p in config.peers}
    assert config.rpc_bind in {p.address for p in config.peers}


# --- strictness ------------------------------------------------------------------------------


def test_bad_value_names_the_setting() -> None:
    err = _error(DemoNodeConfig, {**DEMO, "raft": {"heartbeat_interval_ms": -5}})
    assert str(err).startswith("raft.heartbeat_interval_ms: must be > 0, got -5")
    assert err.key == "raft.heartbeat_interval_ms"
    assert isinstance(err, InvalidArgument)


def test_bad_value_in_file_names_setting_and_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('uuid = "n1"\ndata_dir = "/tmp/x"\n[wal]\nsegment_size_mb = 0\n')
    with pytest.raises(ConfigError, match=r"^wal\.segment_size_mb: must be > 0, got 0") as info:
        load_config(DemoNodeConfig, path)
    assert str(path) in str(info.value)


def test_unknown_key_names_the_key() -> None:
    err = _error(DemoNodeConfig, {**DEMO, "raft": {"heartbeat_intervl_ms": 100}})
    assert err.key == "raft.heartbeat_intervl_ms"
    assert "unknown setting" in str(err)
    assert "raft.heartbeat_interval_ms" in str(err)  # the suggestion
    err = _error(MasterConfig, {"data_dir": "/d", "colour": "blue"})
    assert str(err) == "colour: unknown setting"
    err = _error(DemoNodeConfig, {**DEMO, "peers": [{"uuid": "a", "adress": "h:1"}]})
    assert err.key == "peers[0].adress"


def test_unknown_section_names_the_section() -> None:
    err = _error(TServerConfig, {"data_dir": "/d", "raftt": {}})
    assert err.key == "raftt"


def test_wrong_type_names_the_key() -> None:
    err = _error(DemoNodeConfig, {**DEMO, "uuid": 5})
    assert err.key == "uuid" and "expected a string" in str(err)
    err = _error(DemoNodeConfig, {**DEMO, "raft": {"tick_interval_ms": "100"}})
    assert err.key == "raft.tick_interval_ms" and "expected an integer" in str(err)
    err = _error(DemoNodeConfig, {**DEMO, "raft": {"pre_vote": 1}})
    assert err.key == "raft.pre_vote" and "expected a boolean" in str(err)
    err = _error(DemoNodeConfig, {**DEMO, "raft": {"tick_interval_ms": True}})
    assert err.key == "raft.tick_interval_ms"
    err = _error(DemoNodeConfig, {**DEMO, "raft": 3})
    assert err.key == "raft" and "expected a table" in str(err)
    err = _error(TServerConfig, {"data_dir": "/d", "master_addresses": "h:1"})
    assert err.key == "master_addresses" and "expected an array" in str(err)
    err = _error(DemoNodeConfig, {**DEMO, "data_dir": ""})
    assert err.key == "data_dir"


def test_missing_required_setting_names_it() -> None:
    err = _error(DemoNodeConfig, {"data_dir": "/tmp/x"})
    assert err.key == "uuid" and "required" in str(err)
    err = _error(DemoNodeConfig, {**DEMO, "peers": [{"uuid": "a"}]})
    assert err.key == "peers[0].address"


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("uuid = \n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(DemoNodeConfig, path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(DemoNodeConfig, tmp_path / "absent.toml")


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raft", "key"),
    [
        ({"election_timeout_ms": 1000}, "raft.election_timeout_ms"),  # not > 2 * 500
        ({"tick_interval_ms": 300}, "raft.heartbeat_interval_ms"),  # 500 % 300
        ({"election_timeout_ms": 1550}, "raft.election_timeout_ms"),  # 1550 % 100
        ({"tick_interval_ms": 0}, "raft.tick_interval_ms"),
        ({"max_inflight_msgs": 0}, "raft.max_inflight_msgs"),
        ({"snapshot_catchup_entries": -1}, "raft.snapshot_catchup_entries"),
        ({"max_entries_per_msg_bytes": 32 << 20}, "raft.max_entries_per_msg_bytes"),
        ({"lease_reads": True, "check_quorum": False}, "raft.lease_reads"),
        ({"lateness_half_life_ms": 0}, "raft.lateness_half_life_ms"),
        ({"lateness_half_life_ms": 1050}, "raft.lateness_half_life_ms"),  # 1050 % 100
    ],
)
def test_raft_validation(raft: dict[str, Any], key: str) -> None:
    err = _error(DemoNodeConfig, {**DEMO, "raft": raft})
    assert err.key == key, str(err)


def test_raft_ticks() -> None:
    raft = RaftSettings()
    assert (raft.heartbeat_ticks, raft.election_ticks) == (5, 15)
    assert raft.lateness_half_life_ticks == 1800
    fast = RaftSettings(heartbeat_interval_ms=50, election_timeout_ms=300, tick_interval_ms=10)
    fast.validate()
    assert (fast.heartbeat_ticks, fast.election_ticks) == (5, 30)


def test_raft_batch_must_fit_in_one_rpc() -> None:
    err = _error(
        DemoNodeConfig,
        {**DEMO, "rpc": {"max_message_bytes": 1 << 20}},
    )
    assert err.key == "raft.max_entries_per_msg_bytes"
    assert "rpc.max_message_bytes" in str(err)


def test_rpc_grpc_options() -> None:
    assert dict(RpcSettings(max_message_bytes=1234).grpc_options()) == {
        "grpc.max_send_message_length": 1234,
        "grpc.max_receive_message_length": 1234,
    }


def test_demo_peer_validation() -> None:
    peers = [{"uuid": "a", "address": "h:1"}, {"uuid": "a", "address": "h:2"}]
    assert _error(DemoNodeConfig, {**DEMO, "peers": peers}).key == "peers[1].uuid"
    peers = [{"uuid": "a", "address": "h:1"}, {"uuid": "b", "address": "h:1"}]
    assert _error(DemoNodeConfig, {**DEMO, "peers": peers}).key == "peers[1].address"
    peers = [{"uuid": "a", "address": "h:0"}]
    assert _error(DemoNodeConfig, {**DEMO, "peers": peers}).key == "peers[0].address"
    peers = [{"uuid": "a b", "address": "h:1"}]
    assert _error(DemoNodeConfig, {**DEMO, "peers": peers}).key == "peers[0].uuid"
    assert _error(DemoNodeConfig, {**DEMO, "rpc_bind": "nohost"}).key == "rpc_bind"
    assert _error(DemoNodeConfig, {**DEMO, "log_level": "LOUD"}).key == "log_level"


def test_master_validation() -> None:
    base: dict[str, Any] = {"data_dir": "/d"}
    assert _error(MasterConfig, {**base, "default_num_replicas": 2}).key == "default_num_replicas"
    err = _error(MasterConfig, {**base, "default_num_replicas": 9})
    assert err.key == "default_num_replicas" and "max_num_replicas" in str(err)
    three = ["m1:7051", "m2:7051", "m3:7051"]
    err = _error(MasterConfig, {**base, "master_addresses": three, "advertised_address": "m4:1"})
    assert err.key == "advertised_address"
    err = _error(MasterConfig, {**base, "master_addresses": ["m1:7051", "m1:7051"]})
    assert err.key == "master_addresses[1]"
    ok = from_mapping(
        MasterConfig, {**base, "master_addresses": three, "advertised_address": "m2:7051"}
    )
    assert ok.master_addresses == tuple(three)


def test_master_assignment_round_and_stall_settings_are_validated() -> None:
    base: dict[str, Any] = {"data_dir": "/d"}
    for name in (
        "max_tablets_per_assignment_round",
        "max_creating_tablets",
        "assignment_retry_initial_ms",
        "assignment_retry_max_ms",
        "loop_stall_threshold_ms",
        "max_concurrent_tablet_reports",
        "tablet_report_budget_ms",
    ):
        err = _error(MasterConfig, {**base, name: 0})
        assert err.key == name and "must be > 0" in str(err)
    err = _error(
        MasterConfig, {**base, "assignment_retry_initial_ms": 5000, "assignment_retry_max_ms": 10}
    )
    assert err.key == "assignment_retry_initial_ms" and "assignment_retry_max_ms" in str(err)
    err = _error(MasterConfig, {**base, "loop_stall_threshold_ms": 60_000})
    assert err.key == "loop_stall_threshold_ms" and "unresponsive_timeout_ms" in str(err)
    # 0 turns the warm-up off; below that is refused here, not first by the catalog manager.
    err = _error(MasterConfig, {**base, "leader_warmup_ms": -1})
    assert err.key == "leader_warmup_ms" and "must be >= 0" in str(err)


def test_tserver_validation() -> None:
    err = _error(TServerConfig, {"data_dir": "/d", "master_addresses": []})
    assert err.key == "master_addresses"
    err = _error(TServerConfig, {"data_dir": "/d", "heartbeat_interval_ms": 0})
    assert err.key == "heartbeat_interval_ms"


def test_tserver_quiescence_needs_two_heartbeats_whole_ticks_and_no_lease_reads() -> None:
    base: dict[str, Any] = {"data_dir": "/d"}
    err = _error(TServerConfig, {**base, "quiesce_idle_ms": 900})  # heartbeat 500 ms
    assert err.key == "quiesce_idle_ms" and "at least two heartbeat intervals (1000)" in str(err)
    err = _error(TServerConfig, {**base, "quiesce_idle_ms": 1050})  # tick 100 ms
    assert err.key == "quiesce_idle_ms" and "tick_interval_ms (100)" in str(err)
    err = _error(TServerConfig, {**base, "raft": {"lease_reads": True}})
    assert err.key == "quiesce_idle_ms" and "lease_reads" in str(err)
    config = from_mapping(
        TServerConfig, {**base, "quiesce_idle_ms": 0, "raft": {"lease_reads": True}}
    )
    config.validate()  # off: lease reads are fine


def test_direct_construction_skips_validation_until_asked() -> None:
    odd = RaftSettings(heartbeat_interval_ms=-5)
    with pytest.raises(ConfigError, match=r"^raft\.heartbeat_interval_ms: must be > 0, got -5$"):
        odd.validate()
    loose = from_mapping(
        DemoNodeConfig, {**DEMO, "raft": {"election_timeout_ms": 700}}, validate=False
    )
    assert loose.raft.election_timeout_ms == 700


# --- overrides -------------------------------------------------------------------------------


def test_overrides_win_over_the_file() -> None:
    config = load_config(
        DemoNodeConfig,
        CONF / "raft-demo.toml",
        {
            "uuid": "demo-2",
            "rpc_bind": "127.0.0.1:7102",
            "data_dir": "/tmp/tessera-demo/demo-2",
            "raft.heartbeat_interval_ms": 100,
            "raft.election_timeout_ms": 1000,
            "wal.fsync": False,
        },
    )
    assert config.uuid == "demo-2"
    assert config.data_dir == Path("/tmp/tessera-demo/demo-2")
    assert config.raft.heartbeat_interval_ms == 100
    assert config.raft.election_timeout_ms == 1000
    assert config.raft.tick_interval_ms == 100  # untouched
    assert config.wal.fsync is False
    assert len(config.peers) == 3


def test_overrides_are_checked_like_the_file() -> None:
    err = _error(DemoNodeConfig, DEMO, **{"raft.heartbeat_interval_ms": -5})
    assert err.key == "raft.heartbeat_interval_ms"
    with pytest.raises(ConfigError) as info:
        load_config(DemoNodeConfig, CONF / "raft-demo.toml", {"raft.heartbeat_interval": 5})
    assert info.value.key == "raft.heartbeat_interval"
    with pytest.raises(ConfigError) as info:
        from_mapping(DemoNodeConfig, DEMO, {"uuid.x": 1})
    assert info.value.key == "uuid"


def test_overrides_can_replace_arrays_and_paths() -> None:
    config = from_mapping(
        DemoNodeConfig,
        DEMO,
        {"data_dir": Path("/tmp/other"), "peers": [{"uuid": "x", "address": "h:9"}]},
    )
    assert config.data_dir == Path("/tmp/other")
    assert config.peers == (PeerSpec(uuid=NodeId("x"), address="h:9"),)


def test_parse_override() -> None:
    assert parse_override("raft.pre_vote=false") == ("raft.pre_vote", False)
    assert parse_override("raft.tick_interval_ms = 50") == ("raft.tick_interval_ms", 50)
    assert parse_override("rpc_bind=127.0.0.1:7051") == ("rpc_bind", "127.0.0.1:7051")
    assert parse_override('master_addresses=["a:1", "b:2"]') == ("master_addresses", ["a:1", "b:2"])
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")


def test_to_mapping_round_trips() -> None:
    for name, cls in SHIPPED:
        config = load_config(cls, CONF / name)
        assert from_mapping(cls, to_mapping(config)) == config


def test_split_host_port() -> None:
    assert split_host_port("127.0.0.1:7051") == ("127.0.0.1", 7051)
    assert split_host_port("[::1]:0") == ("::1", 0)
    for bad in ("host", ":1", "h:", "h:x", "h:70000"):
        with pytest.raises(InvalidArgument, match="host:port"):
            split_host_port(bad)


def test_servers_built_from_rpc_settings_do_not_share_a_port() -> None:
    """gRPC turns SO_REUSEPORT on by default, which lets a second server bind a port in use and
    take half its connections; `server_options` turns it off, so the second bind fails."""

    def bind(server: grpc.aio.Server, address: str) -> int:
        try:
            return server.add_insecure_port(address)
        except RuntimeError:  # newer grpcio raises instead of returning 0
            return 0

    async def main() -> None:
        options = RpcSettings().server_options()
        first = grpc.aio.server(options=options)
        port = bind(first, "127.0.0.1:0")
        assert port > 0
        await first.start()
        try:
            assert bind(grpc.aio.server(options=options), f"127.0.0.1:{port}") == 0
        finally:
            await first.stop(None)

    asyncio.run(main())
