"""Settings from one place: every runtime settings object that mirrors configuration knobs
takes its defaults from the typed configuration (service/common/config.py).

For each such object, a table names the mirrored fields and the knob each one comes from (in
the object's units). Two checks per object, field by field:

* built with no arguments, each mirrored field equals its knob in a default (empty)
  configuration, so a default changed in config.py cannot silently disagree with a copy;
* built from a configuration whose every mirrored knob differs from its default, each field
  equals that knob, so `from_config` copies every one of them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from service.common.config import MasterConfig, RaftSettings, TServerConfig, WalSettings
from service.common.hybrid_time import HybridClock
from service.consensus.node import NodeSettings
from service.consensus.raft_store import RaftStore
from service.consensus.wal import Wal
from service.master.background_tasks import BackgroundSettings
from service.master.catalog_settings import CatalogSettings
from service.master.heartbeat import ReportGate
from service.master.txn_coordinator import TxnSettings
from service.tserver.tablet import TabletSettings

MiB = 1 << 20
DIR = Path("never-opened")

Mirror = Mapping[str, Callable[[Any], object]]
"""Field of a settings object -> its knob's value in a configuration, in the field's units."""


def mismatches(settings: object, config: object, mirror: Mirror) -> dict[str, tuple[Any, Any]]:
    """The mirrored fields whose value is not their knob's: field -> (value, knob's value)."""
    out = {}
    for name, knob in mirror.items():
        value, expected = getattr(settings, name), knob(config)
        if value != expected:
            out[name] = (value, expected)
    return out


# --- NodeSettings <- [raft] ------------------------------------------------------------------

NODE: Mirror = {
    "tick_interval_s": lambda r: r.tick_interval_ms / 1000,
    "heartbeat_ticks": lambda r: r.heartbeat_interval_ms // r.tick_interval_ms,
    "election_ticks": lambda r: r.election_timeout_ms // r.tick_interval_ms,
    "election_jitter_ticks": lambda r: r.election_jitter_ms // r.tick_interval_ms,
    "max_election_ticks": lambda r: r.election_timeout_max_ms // r.tick_interval_ms,
    "lateness_half_life_ticks": lambda r: r.lateness_half_life_ms // r.tick_interval_ms,
    "pre_vote": lambda r: r.pre_vote,
    "check_quorum": lambda r: r.check_quorum,
    "lease_reads": lambda r: r.lease_reads,
    "max_size_per_msg": lambda r: r.max_entries_per_msg_bytes,
    "max_inflight_msgs": lambda r: r.max_inflight_msgs,
    "max_inflight_bytes": lambda r: r.max_inflight_bytes,
    "snapshot_interval_entries": lambda r: r.snapshot_interval_entries,
    "snapshot_catchup_entries": lambda r: r.snapshot_catchup_entries,
}

ODD_RAFT = RaftSettings(
    heartbeat_interval_ms=200,
    election_timeout_ms=1000,
    election_jitter_ms=300,
    election_timeout_max_ms=2500,
    lateness_half_life_ms=60_000,
    tick_interval_ms=50,
    pre_vote=False,
    check_quorum=False,
    max_inflight_msgs=17,
    max_inflight_bytes=3 * MiB,
    max_entries_per_msg_bytes=MiB // 2,
    snapshot_interval_entries=123,
    snapshot_catchup_entries=45,
    lease_reads=True,
)


def test_node_settings_defaults_are_the_raft_sections() -> None:
    assert mismatches(NodeSettings(), RaftSettings(), NODE) == {}
    assert NodeSettings() == NodeSettings.from_raft_settings(RaftSettings())
    # Every process kind's [raft] section has the same defaults.
    for config in (MasterConfig(data_dir=DIR), TServerConfig(data_dir=DIR)):
        assert NodeSettings.from_raft_settings(config.raft) == NodeSettings()


def test_node_settings_election_jitter_is_the_configured_one() -> None:
    """Not a whole election timeout (what the Raft core does when given none): the default
    node times its elections as a default-configured server does."""
    raft = RaftSettings()
    assert NodeSettings().election_jitter_ticks == raft.election_jitter_ticks
    assert NodeSettings().election_jitter_ticks < NodeSettings().election_ticks


def test_node_settings_from_raft_settings_copies_every_knob() -> None:
    assert mismatches(NodeSettings.from_raft_settings(ODD_RAFT), ODD_RAFT, NODE) == {}
    assert mismatches(NodeSettings(), ODD_RAFT, NODE).keys() == NODE.keys()


# --- TabletSettings <- TServerConfig ---------------------------------------------------------

TABLET: Mirror = {
    "wal_segment_bytes": lambda c: c.wal.segment_size_mb * MiB,
    "wal_preallocate": lambda c: c.wal.preallocate,
    "fsync": lambda c: c.wal.fsync,
    "flush_idle_s": lambda c: c.flush_idle_ms / 1000,
    "history_max_age_s": lambda c: c.tablet_history_max_age_ms / 1000,
    "txn_max_staged_rows": lambda c: c.txn_max_staged_rows,
    "txn_lock_wait_s": lambda c: c.txn_lock_wait_ms / 1000,
}
"""The hybrid clock's bound is checked on its own (the clock is not compared)."""

ODD_TSERVER = TServerConfig(
    data_dir=DIR,
    wal=WalSettings(segment_size_mb=3, preallocate=False, fsync=False),
    flush_idle_ms=2500,
    tablet_history_max_age_ms=60_000,
    txn_max_staged_rows=77,
    txn_lock_wait_ms=1500,
    max_clock_error_ms=250,
)


def test_tablet_settings_defaults_are_the_tserver_configs() -> None:
    config = TServerConfig(data_dir=DIR)
    node = NodeSettings.from_raft_settings(config.raft)
    settings = TabletSettings(node=node)
    assert mismatches(settings, config, TABLET) == {}
    assert settings == TabletSettings.from_config(config, node)
    assert settings.clock.max_error_us == config.max_clock_error_ms * 1000
    assert HybridClock().max_error_us == config.max_clock_error_ms * 1000


def test_tablet_settings_from_config_copies_every_knob() -> None:
    node = NodeSettings.from_raft_settings(ODD_TSERVER.raft)
    settings = TabletSettings.from_config(ODD_TSERVER, node)
    assert mismatches(settings, ODD_TSERVER, TABLET) == {}
    assert mismatches(TabletSettings(node=node), ODD_TSERVER, TABLET).keys() == TABLET.keys()
    assert settings.clock.max_error_us == 250_000
    assert settings.node is node


def test_tablet_settings_from_config_takes_the_servers_hooks() -> None:
    def hook(_: float) -> None:
        pass

    clock = HybridClock(1000)
    settings = TabletSettings.from_config(
        ODD_TSERVER, NodeSettings(), on_wal_sync=hook, clock=clock
    )
    assert settings.on_wal_sync is hook and settings.clock is clock


# --- the WAL's own defaults <- [wal] ---------------------------------------------------------


@pytest.mark.parametrize("opener", [Wal.open, RaftStore.open])
def test_wal_opening_defaults_are_the_wal_sections(opener: Callable[..., object]) -> None:
    """Servers pass their configured [wal]; a caller that passes none gets its defaults."""
    wal = WalSettings()
    params = inspect.signature(opener).parameters
    assert params["segment_bytes"].default == wal.segment_size_bytes
    assert params["preallocate"].default == wal.preallocate
    if "fsync" in params:
        assert params["fsync"].default == wal.fsync


# --- master settings <- MasterConfig ---------------------------------------------------------

TXN: Mirror = {
    "keepalive_s": lambda c: c.txn_keepalive_ms / 1000,
    "max_keepalive_s": lambda c: c.txn_max_keepalive_ms / 1000,
    "retention_s": lambda c: c.txn_retention_ms / 1000,
}

BACKGROUND: Mirror = {
    "interval_s": lambda c: c.bg_task_interval_ms / 1000,
    "retry_initial_s": lambda c: c.task_retry_initial_ms / 1000,
    "retry_max_s": lambda c: c.task_retry_max_ms / 1000,
    "max_concurrent_rpcs": lambda c: c.max_concurrent_tserver_rpcs,
    "replica_eviction_s": lambda c: c.replica_eviction_timeout_ms / 1000,
}

REPORT_GATE: Mirror = {
    "max_in_flight": lambda c: c.max_concurrent_tablet_reports,
    "budget_s": lambda c: c.tablet_report_budget_ms / 1000,
    "max_waiting": lambda c: c.max_queued_tablet_reports,
}


def _catalog_mirror() -> Mirror:
    """CatalogSettings names its knobs itself (`_knob` metadata: the knob, and its scale)."""

    def knob(name: str, scale: int) -> Callable[[Any], object]:
        return lambda c: getattr(c, name) / scale if scale != 1 else getattr(c, name)

    return {
        f.name: knob(f.metadata["knob"], f.metadata["scale"])
        for f in dataclasses.fields(CatalogSettings)
        if "knob" in f.metadata
    }


CATALOG = _catalog_mirror()
_CATALOG_KNOBS = [
    f.metadata["knob"] for f in dataclasses.fields(CatalogSettings) if "knob" in f.metadata
]

ODD_MASTER = MasterConfig(
    data_dir=DIR,
    txn_keepalive_ms=4000,
    txn_max_keepalive_ms=9000,
    txn_retention_ms=12_000,
    bg_task_interval_ms=300,
    task_retry_initial_ms=40,
    task_retry_max_ms=900,
    max_concurrent_tserver_rpcs=9,
    replica_eviction_timeout_ms=7000,
    max_concurrent_tablet_reports=5,
    tablet_report_budget_ms=250,
    max_queued_tablet_reports=7,
    **{k: getattr(MasterConfig(data_dir=DIR), k) + 1 for k in _CATALOG_KNOBS},
)

MASTER_SETTINGS: list[
    tuple[str, Callable[[], object], Callable[[MasterConfig], object], Mirror]
] = [
    ("TxnSettings", TxnSettings, TxnSettings.from_config, TXN),
    ("BackgroundSettings", BackgroundSettings, BackgroundSettings.from_config, BACKGROUND),
    ("CatalogSettings", CatalogSettings, CatalogSettings.from_config, CATALOG),
    ("ReportGate", ReportGate, ReportGate.from_config, REPORT_GATE),
]


@pytest.mark.parametrize(
    ("name", "default", "from_config", "mirror"),
    MASTER_SETTINGS,
    ids=[s[0] for s in MASTER_SETTINGS],
)
def test_master_settings_defaults_are_the_master_configs(
    name: str,
    default: Callable[[], object],
    from_config: Callable[[MasterConfig], object],
    mirror: Mirror,
) -> None:
    assert mirror, name
    assert mismatches(default(), MasterConfig(data_dir=DIR), mirror) == {}
    built = from_config(ODD_MASTER)
    assert mismatches(built, ODD_MASTER, mirror) == {}
    assert mismatches(default(), ODD_MASTER, mirror).keys() == mirror.keys()
    if dataclasses.is_dataclass(built):
        assert default() == from_config(MasterConfig(data_dir=DIR))


def test_report_gate_full_report_turns_are_the_master_configs() -> None:
    default = MasterConfig(data_dir=DIR).full_report_turns
    assert ReportGate().turns.max_turns == default
    odd = dataclasses.replace(ODD_MASTER, full_report_turns=default + 3)
    assert ReportGate.from_config(odd).turns.max_turns == default + 3
