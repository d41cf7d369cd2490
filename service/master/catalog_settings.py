"""The catalog manager's settings: MasterConfig's knobs for the catalog in the manager's units,
plus limits the master conf does not expose, each with Kudu's value where Kudu has one.

One home for every value and rule. A field made by `_knob` mirrors a MasterConfig knob: its
default is MasterConfig's, `from_config` copies the knob, and `validate` checks it with
MasterConfig's own rules (the values handed back in MasterConfig's units), so neither a
default nor a rule is written twice. The other fields are limits only this class has: their
defaults and checks below are their only definition.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from service.common.config import MasterConfig
from service.common.errors import InvalidArgument

__all__ = ["CatalogSettings"]

_MASTER = MasterConfig(data_dir=Path("catalog-settings"))
"""MasterConfig with its defaults: where the mirrored fields' defaults come from, and what
`validate` checks the settings' values in (its data_dir is never opened)."""


def _knob(name: str, *, ms_to_s: bool = False) -> Any:
    """A field mirroring MasterConfig's knob `name`, in seconds if `ms_to_s` (the knob in ms)."""
    scale = 1000 if ms_to_s else 1
    return field(
        default=_scaled(getattr(_MASTER, name), scale), metadata={"knob": name, "scale": scale}
    )


def _scaled(value: Any, scale: int) -> Any:
    """A knob's value in the settings' units (ms / 1000: seconds, as a float)."""
    return value / float(scale) if scale != 1 else value


@dataclass(frozen=True)
class CatalogSettings:
    """The catalog manager's knobs (module docstring): MasterConfig's, then its own limits."""

    default_num_replicas: int = _knob("default_num_replicas")
    max_num_replicas: int = _knob("max_num_replicas")
    max_create_tablets_per_ts: int = _knob("max_create_tablets_per_ts")
    """CreateTable refuses more tablets than this times the live tablet servers (Kudu's)."""
    table_locations_ttl_ms: int = _knob("table_locations_ttl_ms")
    table_locations_cache_entries: int = _knob("table_locations_cache_entries")
    """GetTableLocations answers kept (`locations_cache`); 0 keeps none."""
    leader_warmup_s: float = _knob("leader_warmup_ms", ms_to_s=True)
    """After load, "not enough live tablet servers" is NotReady for this long; 0: no warm-up."""
    assignment_timeout_s: float = _knob("assignment_timeout_ms", ms_to_s=True)
    """A CREATING tablet not reported within this is replaced (Kudu's
    tablet_creation_timeout_ms)."""
    max_replacements_in_flight: int = _knob("max_replacements_in_flight")
    """Replacement tablets not yet RUNNING, at most, cluster-wide (create_pacing)."""
    max_replacements_per_ts: int = _knob("max_replacements_per_ts")
    """The same, for the tablets of one server."""
    max_tablets_per_assignment_round: int = _knob("max_tablets_per_assignment_round")
    """Tablets one `assign_tablets` round places or replaces (ONE write)."""
    max_creating_tablets: int = _knob("max_creating_tablets")
    """Tablets CREATING at once; PREPARING ones wait for room."""
    assignment_retry_initial_s: float = _knob("assignment_retry_initial_ms", ms_to_s=True)
    """First pause before a table's unplaced tablets are tried again; doubles per failure."""
    assignment_retry_max_s: float = _knob("assignment_retry_max_ms", ms_to_s=True)
    """Longest pause between placement attempts of a table's unplaced tablets."""

    # --- limits the master conf does not expose: defined here only ---------------------------

    replicate_timeout_s: float = 10.0
    """Deadline given to `replicate`; past it the outcome is unknown (Timeout)."""
    default_max_returned_locations: int = 10
    """GetTableLocations' limit when the request gives 0 (Kudu's client default)."""
    max_tablet_ids_per_request: int = 1000
    max_write_bytes: int = 16 * 1024 * 1024
    """Largest replicated entry: about 1.2 MB is a 10,000-tablet CreateTable. `from_config`
    lowers it to half of rpc.max_message_bytes, so an entry always fits in a Raft message."""
    max_owner_bytes: int = 256

    @classmethod
    def from_config(cls, config: MasterConfig, **overrides: Any) -> CatalogSettings:
        """The settings of a master started with `config` (validated by its loader), then
        `overrides` by field name (tests and benchmarks)."""
        knobs = {
            f.name: _scaled(getattr(config, f.metadata["knob"]), f.metadata["scale"])
            for f in _knobs()
        }
        base = cls(
            **knobs, max_write_bytes=min(cls.max_write_bytes, config.rpc.max_message_bytes // 2)
        )
        return replace(base, **overrides)

    def validate(self) -> None:
        """InvalidArgument naming the first bad value: a mirrored one by its MasterConfig knob
        (in the knob's units), an own limit by its field.

        The mirrored values go back into MasterConfig's units (a float where a fraction of a
        ms is set: the rules compare, so it is checked as it is) in an otherwise default
        MasterConfig, whose `validate` is the one statement of their rules."""
        as_config = {
            f.metadata["knob"]: getattr(self, f.name) * f.metadata["scale"] for f in _knobs()
        }
        try:
            replace(_MASTER, **as_config).validate()
        except InvalidArgument as e:
            raise InvalidArgument(f"catalog settings (as MasterConfig): {e.message}") from None
        for name in _OWN_LIMITS:
            value = getattr(self, name)
            if not value > 0:
                raise InvalidArgument(f"catalog settings: {name} must be > 0, got {value}")


def _knobs() -> list[Field[Any]]:
    return [f for f in fields(CatalogSettings) if "knob" in f.metadata]


_OWN_LIMITS = tuple(f.name for f in fields(CatalogSettings) if "knob" not in f.metadata)
