"""The catalog manager's settings: MasterConfig's knobs for the catalog, plus limits the
master conf does not expose (yet), each with Kudu's value where Kudu has one."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from service.common.config import MasterConfig
from service.common.errors import InvalidArgument

__all__ = ["CatalogSettings"]


@dataclass(frozen=True)
class CatalogSettings:
    """The catalog manager's knobs (MasterConfig's, plus what the master conf lacks so far)."""

    default_num_replicas: int = 3
    max_num_replicas: int = 7
    max_create_tablets_per_ts: int = 60
    """CreateTable refuses more tablets than this times the live tablet servers (Kudu's)."""
    table_locations_ttl_ms: int = 300_000
    table_locations_cache_entries: int = 10_000
    """GetTableLocations answers kept (`locations_cache`); 0 keeps none."""
    leader_warmup_s: float = 15.0
    """After load, "not enough live tablet servers" is NotReady for this long (MasterConfig's
    leader_warmup_ms); 0: no warm-up."""
    assignment_timeout_s: float = 30.0
    """A CREATING tablet not reported within this is replaced (Kudu's
    tablet_creation_timeout_ms)."""
    replicate_timeout_s: float = 10.0
    """Deadline given to `replicate`; past it the outcome is unknown (Timeout)."""
    default_max_returned_locations: int = 10
    """GetTableLocations' limit when the request gives 0 (Kudu's client default)."""
    max_tablet_ids_per_request: int = 1000
    max_write_bytes: int = 16 * 1024 * 1024
    """Largest replicated entry: about 1.2 MB is a 10,000-tablet CreateTable."""
    max_owner_bytes: int = 256
    max_tablets_per_assignment_round: int = 200
    max_creating_tablets: int = 1000
    """Tablets CREATING at once; PREPARING ones wait for room (see MasterConfig)."""
    """Tablets one `assign_tablets` round places or replaces (ONE write); see MasterConfig."""
    assignment_retry_initial_s: float = 1.0
    """First pause before a table's unplaced tablets are tried again; doubles per failure."""
    assignment_retry_max_s: float = 30.0
    """Longest pause between placement attempts of a table's unplaced tablets."""

    @classmethod
    def from_config(cls, config: MasterConfig, **overrides: Any) -> CatalogSettings:
        base = cls(
            default_num_replicas=config.default_num_replicas,
            max_num_replicas=config.max_num_replicas,
            max_create_tablets_per_ts=config.max_create_tablets_per_ts,
            table_locations_ttl_ms=config.table_locations_ttl_ms,
            table_locations_cache_entries=config.table_locations_cache_entries,
            assignment_timeout_s=config.assignment_timeout_ms / 1000.0,
            leader_warmup_s=config.leader_warmup_ms / 1000.0,
            max_tablets_per_assignment_round=config.max_tablets_per_assignment_round,
            max_creating_tablets=config.max_creating_tablets,
            assignment_retry_initial_s=config.assignment_retry_initial_ms / 1000.0,
            assignment_retry_max_s=config.assignment_retry_max_ms / 1000.0,
            max_write_bytes=min(cls.max_write_bytes, config.rpc.max_message_bytes // 2),
        )
        return replace(base, **overrides)

    def validate(self) -> None:
        for name, value in vars(self).items():
            if name in ("table_locations_cache_entries", "leader_warmup_s"):
                if not value >= 0:
                    raise InvalidArgument(f"catalog settings: {name} must be >= 0, got {value}")
            elif not value > 0:
                raise InvalidArgument(f"catalog settings: {name} must be > 0, got {value}")
        for name in ("default_num_replicas", "max_num_replicas"):
            if getattr(self, name) % 2 == 0:
                raise InvalidArgument(f"catalog settings: {name} must be odd")
        if self.default_num_replicas > self.max_num_replicas:
            raise InvalidArgument("catalog settings: default_num_replicas > max_num_replicas")
        if self.assignment_retry_initial_s > self.assignment_retry_max_s:
            raise InvalidArgument(
                "catalog settings: assignment_retry_initial_s must be <= assignment_retry_max_s"
            )
