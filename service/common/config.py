"""Configuration: frozen dataclasses loaded from TOML, checked before anything starts.

Theory of operation
-------------------
Each process kind has one top-level config class (`DemoNodeConfig`, `MasterConfig`,
`TServerConfig`); shared concerns are sections (`RaftSettings` as `[raft]`, `WalSettings` as
`[wal]`, `RpcSettings` as `[rpc]`). Every setting is a typed dataclass field with its default, so
the code is the reference and `conf/*.toml` mirror it (a test checks that they do).

Loading (`load_config`, `from_mapping`) is generic over these classes and strict, because a
misspelt setting that is silently ignored is a production incident waiting for its night:

1. dotted `overrides` ("raft.heartbeat_interval_ms": 100) are applied to the parsed TOML;
2. the mapping is walked against the dataclass fields: an unknown key, a missing required key or
   a value of the wrong TOML type is a `ConfigError` naming the setting by its dotted path
   ("peers[1].address"); a nested table becomes a nested dataclass, an array a tuple;
3. `validate()` checks ranges and relations between settings (election timeout against
   heartbeat, tick granularity, Raft batch size against the RPC message limit), again naming the
   setting: "raft.heartbeat_interval_ms: must be > 0, got -5".

Constructing a dataclass directly (tests, simulators) skips step 3 on purpose, so fixtures can
use odd values; call `validate()` to opt in. Relative paths are relative to the working
directory, as command-line flags are.

Supported field types: bool, int, float, str, Path, NewTypes over them, enums (by value),
nested dataclasses, `tuple[X, ...]` and `X | None` (an absent key; TOML has no null).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

from service.common import channel_options
from service.common.errors import InvalidArgument
from service.common.ids import NodeId, validate_node_id
from service.common.pki import IdentityFiles

__all__ = [
    "HTTP_AUTH_MODES",
    "LOG_LEVELS",
    "ConfigError",
    "DemoNodeConfig",
    "MasterConfig",
    "PeerSpec",
    "RaftSettings",
    "RpcSettings",
    "TServerConfig",
    "WalSettings",
    "from_mapping",
    "load_config",
    "parse_override",
    "split_host_port",
    "to_mapping",
]

MiB = 1024 * 1024

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(InvalidArgument):
    """A setting is unknown, missing, of the wrong type or out of range.

    The message starts with the setting's dotted path; `key` holds that path alone.
    """

    code = "INVALID_CONFIG"

    key: str | None

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def _fail(key: str, problem: str) -> NoReturn:
    raise ConfigError(f"{key}: {problem}", key=key)


class _Check:
    """Range checks on one section, naming settings as `<section>.<field>`."""

    def __init__(self, obj: object, section: str) -> None:
        self._obj = obj
        self._section = section

    def key(self, name: str) -> str:
        return f"{self._section}.{name}" if self._section else name

    def that(self, ok: bool, name: str, problem: str) -> None:
        if not ok:
            _fail(self.key(name), problem)

    def positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self._obj, name)
            self.that(value > 0, name, f"must be > 0, got {value!r}")

    def non_negative(self, *names: str) -> None:
        for name in names:
            value = getattr(self._obj, name)
            self.that(value >= 0, name, f"must be >= 0, got {value!r}")

    def at_most(self, name: str, limit: int) -> None:
        value = getattr(self._obj, name)
        self.that(value <= limit, name, f"must be <= {limit}, got {value!r}")

    def log_level(self, name: str) -> None:
        value = getattr(self._obj, name)
        self.that(
            value.upper() in LOG_LEVELS,
            name,
            f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}",
        )

    def address(self, name: str, value: str, *, port_zero_ok: bool) -> None:
        try:
            _, port = split_host_port(value)
        except InvalidArgument as e:
            _fail(self.key(name), e.message)
        self.that(port_zero_ok or port != 0, name, f"needs a fixed port, got {value!r}")

    def http_bind(self, name: str, rpc_bind: str) -> None:
        """An optional listen address ("" = off) that must not take the RPC port."""
        value = getattr(self._obj, name)
        if not value:
            return
        self.address(name, value, port_zero_ok=True)
        port = split_host_port(value)[1]
        self.that(
            port == 0 or value != rpc_bind,
            name,
            f"must differ from {self.key('rpc_bind')} ({rpc_bind!r}), got {value!r}",
        )

    def node_id(self, name: str, value: str) -> None:
        try:
            validate_node_id(value)
        except InvalidArgument as e:
            _fail(self.key(name), e.message)


def split_host_port(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; InvalidArgument naming the value."""
    host, sep, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise InvalidArgument(f"expected host:port with a port in 0-65535, got {address!r}")
    return host, int(port_text)


# --- sections --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaftSettings:
    """`[raft]`: timing, flow control and log compaction of every Raft group on the node.

    The pure core counts ticks, not milliseconds: the shell calls `tick()` every
    `tick_interval_ms`, the leader heartbeats every `heartbeat_ticks` ticks and a follower
    campaigns after a randomized timeout in [election_ticks, election_ticks + jitter_ticks).
    """

    heartbeat_interval_ms: int = 500
    """Leader heartbeat period (Kudu's raft_heartbeat_interval_ms)."""
    election_timeout_ms: int = 1500
    """Base follower timeout before an election: 3 missed heartbeats, as Kudu's
    leader_failure_max_missed_heartbeat_periods."""
    election_jitter_ms: int = 500
    """Random extra wait added to the election timeout so followers rarely campaign at once.
    Kudu-like default: up to one heartbeat interval (etcd uses a whole election timeout, which
    makes failover slower)."""
    election_timeout_max_ms: int = 6000
    """Longest the election timeout stretches to while a live group's messages arrive late, on
    a host short of CPU (service/raft/lateness.py), and how long a leader waits to hear from a
    quorum before it steps down (docs/design/consensus.md#R2); at or below election_timeout_ms:
    never stretched, and a leader waits election_timeout_ms."""
    lateness_half_life_ms: int = 180_000
    """How long lateness is remembered: the stretch above halves over this time once messages
    arrive on time again (service/raft/lateness.py says why minutes, not seconds)."""
    tick_interval_ms: int = 100
    """Granularity of Raft time; must divide the periods above."""
    pre_vote: bool = True
    """Run a pre-vote round first so a partitioned node cannot inflate terms (thesis 9.6)."""
    check_quorum: bool = True
    """A leader that has not heard from a quorum for an election timeout steps down."""
    max_inflight_msgs: int = 256
    """Append messages in flight per follower before the leader waits for acks."""
    max_inflight_bytes: int = 16 * MiB
    """Bytes of entries in flight per follower before the leader waits for acks."""
    max_entries_per_msg_bytes: int = 1 * MiB
    """Batch limit for one append message (one larger entry is still sent alone)."""
    snapshot_interval_entries: int = 10000
    """Take a snapshot after this many entries were applied since the last one."""
    snapshot_catchup_entries: int = 5000
    """Entries kept in the log behind a snapshot so slow followers catch up without one."""
    lease_reads: bool = False
    """Serve linearizable reads from a leader lease instead of a ReadIndex round trip; relies
    on bounded clock drift, so it is off by default and needs check_quorum."""

    @property
    def heartbeat_ticks(self) -> int:
        return self.heartbeat_interval_ms // self.tick_interval_ms

    @property
    def election_ticks(self) -> int:
        return self.election_timeout_ms // self.tick_interval_ms

    @property
    def election_jitter_ticks(self) -> int:
        return self.election_jitter_ms // self.tick_interval_ms

    @property
    def max_election_ticks(self) -> int:
        return self.election_timeout_max_ms // self.tick_interval_ms

    @property
    def lateness_half_life_ticks(self) -> int:
        return self.lateness_half_life_ms // self.tick_interval_ms

    def validate(self, section: str = "raft") -> None:
        c = _Check(self, section)
        c.positive(
            "tick_interval_ms",
            "heartbeat_interval_ms",
            "election_timeout_ms",
            "election_jitter_ms",
            "election_timeout_max_ms",
            "lateness_half_life_ms",
            "max_inflight_msgs",
            "max_inflight_bytes",
            "max_entries_per_msg_bytes",
            "snapshot_interval_entries",
        )
        c.non_negative("snapshot_catchup_entries")
        tick = self.tick_interval_ms
        for name in (
            "heartbeat_interval_ms",
            "election_timeout_ms",
            "election_jitter_ms",
            "election_timeout_max_ms",
            "lateness_half_life_ms",
        ):
            value = getattr(self, name)
            c.that(
                value % tick == 0,
                name,
                f"must be a multiple of {c.key('tick_interval_ms')} ({tick}), got {value}",
            )
        c.that(
            self.election_timeout_ms > 2 * self.heartbeat_interval_ms,
            "election_timeout_ms",
            f"must be > 2 * {c.key('heartbeat_interval_ms')} ({2 * self.heartbeat_interval_ms})"
            f" so one lost heartbeat does not start an election, got {self.election_timeout_ms}",
        )
        c.that(
            self.max_entries_per_msg_bytes <= self.max_inflight_bytes,
            "max_entries_per_msg_bytes",
            f"must be <= {c.key('max_inflight_bytes')} ({self.max_inflight_bytes}),"
            f" got {self.max_entries_per_msg_bytes}",
        )
        c.that(
            not self.lease_reads or self.check_quorum,
            "lease_reads",
            f"requires {c.key('check_quorum')} = true (a lease is only safe if a leader that"
            " lost its quorum steps down)",
        )


@dataclass(frozen=True, slots=True)
class WalSettings:
    """`[wal]`: the write-ahead log's segment files (docs/design/consensus.md#R5)."""

    segment_size_mb: int = 8
    """Roll to a new segment file at this size (Kudu's log_segment_size_mb, also 8). Every
    tablet replica preallocates one segment, so this is the disk an idle replica holds: 64 MiB
    made 200 idle tablets x 3 replicas take 38 GiB on one machine."""
    preallocate: bool = True
    """Preallocate each segment so appends within it can use fdatasync
    (docs/design/consensus.md#R5)."""
    fsync: bool = True
    """fdatasync once per group commit. False loses acknowledged writes on power loss: tests
    and benchmarks only."""

    MAX_SEGMENT_SIZE_MB: ClassVar[int] = 4096

    @property
    def segment_size_bytes(self) -> int:
        return self.segment_size_mb * MiB

    def validate(self, section: str = "wal") -> None:
        c = _Check(self, section)
        c.positive("segment_size_mb")
        c.at_most("segment_size_mb", self.MAX_SEGMENT_SIZE_MB)


@dataclass(frozen=True, slots=True)
class RpcSettings:
    """`[rpc]`: gRPC limits shared by servers and channels."""

    max_message_bytes: int = channel_options.DEFAULT_MAX_MESSAGE_BYTES
    """Largest message sent or received (gRPC's own default is 4 MiB)."""

    MAX_MESSAGE_BYTES: ClassVar[int] = 2**31 - 1

    def grpc_options(self) -> list[tuple[str, int]]:
        """Options for this server's channels to other servers (`channel_options.server_peer`)."""
        return channel_options.server_peer(self.max_message_bytes)

    def server_options(self) -> list[tuple[str, int]]:
        """Options for `grpc.aio.server` (`channel_options.server`: the message limit, and
        SO_REUSEPORT off so that a port in use fails the bind)."""
        return channel_options.server(self.max_message_bytes)

    def validate(self, section: str = "rpc") -> None:
        c = _Check(self, section)
        c.positive("max_message_bytes")
        c.at_most("max_message_bytes", self.MAX_MESSAGE_BYTES)


def _validate_sections(raft: RaftSettings, wal: WalSettings, rpc: RpcSettings) -> None:
    raft.validate("raft")
    wal.validate("wal")
    rpc.validate("rpc")
    if raft.max_entries_per_msg_bytes >= rpc.max_message_bytes:
        _fail(
            "raft.max_entries_per_msg_bytes",
            f"must be < rpc.max_message_bytes ({rpc.max_message_bytes}) so an append fits in"
            f" one RPC, got {raft.max_entries_per_msg_bytes}",
        )


SECURE = "secure"
INSECURE = "insecure"

HTTP_AUTH_MODES = ("auto", "tls", "none")
"""Values of `http_auth`: who may read the status pages (docs/design/security.md#R13)."""


def _check_http_auth(c: _Check, http_auth: str, security: SecuritySettings) -> None:
    """`http_auth` is one of HTTP_AUTH_MODES, and "tls" has a certificate to serve with."""
    c.that(
        http_auth in HTTP_AUTH_MODES,
        "http_auth",
        f"expected one of {', '.join(repr(m) for m in HTTP_AUTH_MODES)}, got {http_auth!r}",
    )
    c.that(
        http_auth != "tls" or security.secure,
        "http_auth",
        f"'tls' needs security.mode = {SECURE!r}: the status pages serve TLS with this server's"
        " certificate and admit clients by the cluster CA",
    )


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """`[security]`: mutual TLS from the cluster CA (service/common/tls.py)."""

    mode: str = SECURE
    """"secure" (the default): mutual TLS on every port and channel, callers identified by
    certificate; "insecure": plaintext, anyone may call anything (comparison runs only; warned
    at start)."""
    ca_file: str = ""
    """The cluster CA's certificate (PEM); "" means `<data_dir>/credentials/ca.pem`."""
    cert_file: str = ""
    """This server's certificate (PEM); "" means `<data_dir>/credentials/cert.pem`."""
    key_file: str = ""
    """This server's private key (PEM, owner-only); "" means `<data_dir>/credentials/key.pem`."""

    @property
    def secure(self) -> bool:
        return self.mode == SECURE

    def validate(self, section: str = "security") -> None:
        if self.mode not in (SECURE, INSECURE):
            _fail(f"{section}.mode", f"expected {SECURE!r} or {INSECURE!r}, got {self.mode!r}")

    def files(self, data_dir: Path) -> IdentityFiles:
        """The three files, defaults resolved under `data_dir`."""
        default = IdentityFiles.in_dir(Path(data_dir) / "credentials")
        return IdentityFiles(
            Path(self.ca_file) if self.ca_file else default.ca_file,
            Path(self.cert_file) if self.cert_file else default.cert_file,
            Path(self.key_file) if self.key_file else default.key_file,
        )

    @classmethod
    def from_files(cls, files: IdentityFiles) -> SecuritySettings:
        return cls(SECURE, str(files.ca_file), str(files.cert_file), str(files.key_file))

    def overrides(self, prefix: str = "security") -> list[str]:
        """These settings as `--set` arguments of a server command line."""
        return [
            f"{prefix}.mode={self.mode}",
            f"{prefix}.ca_file={self.ca_file}",
            f"{prefix}.cert_file={self.cert_file}",
            f"{prefix}.key_file={self.key_file}",
        ]


# --- process configs -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """One `[[peers]]` entry: a voter of the initial configuration."""

    uuid: NodeId
    address: str


@dataclass(frozen=True, slots=True)
class DemoNodeConfig:
    """One node of the replicated key-value demo (`conf/raft-demo.toml`).

    `peers` is the initial voter set, used only to bootstrap an empty data_dir; afterwards the
    configuration is the one in the log. A node started with no peers waits to be added (it
    joins as a learner, docs/design/consensus.md#R4).
    """

    uuid: NodeId
    """This node's permanent id; a node that lost its data must take a new one
    (docs/design/consensus.md#R9)."""
    data_dir: Path
    """WAL, consensus metadata and snapshots live here."""
    rpc_bind: str = "127.0.0.1:0"
    """host:port to listen on; port 0 picks a free port."""
    peers: tuple[PeerSpec, ...] = ()
    log_level: str = "INFO"
    raft: RaftSettings = field(default_factory=RaftSettings)
    wal: WalSettings = field(default_factory=WalSettings)
    rpc: RpcSettings = field(default_factory=RpcSettings)

    def validate(self) -> None:
        c = _Check(self, "")
        c.node_id("uuid", self.uuid)
        c.address("rpc_bind", self.rpc_bind, port_zero_ok=True)
        c.log_level("log_level")
        uuids: set[str] = set()
        addresses: set[str] = set()
        for i, peer in enumerate(self.peers):
            c.node_id(f"peers[{i}].uuid", peer.uuid)
            c.address(f"peers[{i}].address", peer.address, port_zero_ok=False)
            c.that(peer.uuid not in uuids, f"peers[{i}].uuid", f"duplicate uuid {peer.uuid!r}")
            c.that(
                peer.address not in addresses,
                f"peers[{i}].address",
                f"duplicate address {peer.address!r}",
            )
            uuids.add(peer.uuid)
            addresses.add(peer.address)
        _validate_sections(self.raft, self.wal, self.rpc)


def _check_addresses(c: _Check, name: str, addresses: tuple[str, ...]) -> None:
    seen: set[str] = set()
    for i, address in enumerate(addresses):
        c.address(f"{name}[{i}]", address, port_zero_ok=False)
        c.that(address not in seen, f"{name}[{i}]", f"duplicate address {address!r}")
        seen.add(address)


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """A master (`conf/master.toml`). Defaults follow Kudu's flags where one exists.

    The master's uuid is not configured: it is derived from its address
    (`master-<host>-<port>`, so every master knows its peers' uuids from master_addresses) and
    recorded in `<data_dir>/instance` when data_dir is first formatted; a later start at another
    address is refused. A master whose disk was wiped comes back with a new incarnation, which its
    peers refuse (service/consensus/transport.py), until it is given a new address.
    """

    data_dir: Path
    """sys.catalog's WAL, consensus metadata and the instance file (the node uuid)."""
    rpc_bind: str = "0.0.0.0:7051"
    advertised_address: str | None = None
    """host:port other nodes use to reach this master; unset: derived from rpc_bind."""
    http_bind: str = "127.0.0.1:8051"
    """host:port of the status pages and /metrics (Kudu's master webserver port); port 0 picks
    a free port; "" serves no HTTP at all. Loopback by default: the pages show the cluster's
    layout to anyone who can reach them, so exposing them is a deliberate setting."""
    http_auth: str = "auto"
    """Who may read the status pages and /metrics: "tls" (HTTPS with this server's certificate;
    every page but /healthz needs a client certificate from the cluster CA, of any role),
    "none" (plain HTTP, anyone who can connect), or "auto" (the default): "tls" when http_bind
    is not a loopback address, "none" on loopback (docs/design/security.md#R13)."""
    master_addresses: tuple[str, ...] = ()
    """Every master's host:port, this one included; empty for a single master. Read when the
    data dir is first formatted (the group's first config); afterwards the group's membership
    is what sys.catalog's Raft log says (AddMaster/RemoveMaster change it)."""
    join_existing: bool = False
    """Start as a new member of a running group (`tessera master add`): with an empty data dir,
    do not bootstrap a group; wait, outside any config, for the leader to add this master as a
    non-voter and send it sys.catalog (a Raft snapshot and the log), then be promoted once caught
    up. master_addresses then lists the running group's masters (this one may be omitted).
    Ignored once the data dir holds state."""
    log_level: str = "INFO"
    unresponsive_timeout_ms: int = 60_000
    """A tablet server that has not heartbeated for this long is considered dead and its
    replicas are re-replicated (Kudu's tserver_unresponsive_timeout_ms)."""
    tserver_heartbeat_interval_ms: int = 1000
    """The tablet servers' own heartbeat interval (their `heartbeat_interval_ms`): what the
    leader stretches when its event loop lags or its CPU saturates, up to a quarter of
    unresponsive_timeout_ms, and shrinks back when it recovers
    (service/master/heartbeat_pace.py)."""
    follower_heartbeat_interval_ms: int = 10_000
    """How often a follower master asks tablet servers to heartbeat it (the leader gets the
    servers' own interval). A follower only records liveness, so fewer heartbeats keep its
    registry just as warm and spare every process their cost: with 1,000 servers and 3
    masters, at 3 s the followers still got most of the heartbeats while the leader was busy,
    and a 10,000-tablet create took 99-107 s on a slow host against 66-81 s at 10 s
    (bench/README.md, scale_bench). Six heartbeats fit in the default unresponsive timeout.
    Capped at a quarter of unresponsive_timeout_ms; 0: the servers' own interval
    (docs/design/failover.md#R1)."""
    default_num_replicas: int = 3
    """Replication factor of a table that does not choose one."""
    max_num_replicas: int = 7
    """Largest replication factor a table may ask for."""
    max_create_tablets_per_ts: int = 60
    """CreateTable refuses more tablets than this times the number of live tablet servers."""
    table_locations_ttl_ms: int = 300_000
    """How long clients may cache tablet locations returned by GetTableLocations."""
    table_locations_cache_entries: int = 10_000
    """GetTableLocations answers the leader keeps, each until the table, one of its tablets or
    a tablet server's address changes (Kudu's table_locations_cache_capacity_mb); 0 turns the
    cache off."""
    bg_task_interval_ms: int = 1000
    """Period of the leader's background tasks: assignment rounds, retries of pending side
    effects (CreateTablet, DeleteTablet, AlterSchema), re-replication
    (docs/design/coordinator.md#R3). A round also runs as soon as a committed change calls for
    work."""
    leader_warmup_ms: int = 15_000
    """For this long after a master becomes leader, "not enough live tablet servers" for a
    CreateTable is NotReady (retryable; clients retry within their deadline), not a definite
    failure: tablet servers that backed off from a restarting master (up to 10 heartbeat
    intervals) are still registering with it. Keep it above 10 x the servers'
    heartbeat_interval_ms. 0: no warm-up."""
    cert_renewal_check_ms: int = 3_600_000
    """How often the master checks its own certificate; with less than a third of its lifetime
    left it signs itself a new one and serves with it without a restart
    (service/common/cert_renewal.py, service/master/master.py)."""
    authz_token_ttl_ms: int = 300_000
    """How long an authz token the master hands a user with a table's locations lives (Kudu's
    default, 5 minutes). Tablet servers check a user's writes and scans against it without
    asking a master, so a revoked grant keeps working for at most this long."""
    txn_keepalive_ms: int = 30_000
    """A transaction whose client sends no KeepTransactionAlive for this long is aborted
    (Kudu's txn_keepalive_interval_ms); clients send one every third of it.
    docs/design/transactions.md#R1."""
    txn_max_keepalive_ms: int = 3_600_000
    """The longest keep-alive period a client may ask for a transaction (a Spark write asks
    for minutes: nothing sends keep-alives while its tasks wait to be scheduled)."""
    txn_retention_ms: int = 86_400_000
    """How long an ended transaction's record is kept (a retried commit is answered from it);
    a streaming query's newest committed batch is kept regardless."""
    assignment_timeout_ms: int = 30_000
    """A tablet not reported RUNNING this long after its replicas were chosen is REPLACED by a
    new tablet for the same partition (Kudu's tablet_creation_timeout_ms)."""
    max_replacements_in_flight: int = 100
    """Replacement tablets (made for a CREATING tablet that timed out) not yet RUNNING, at
    most, cluster-wide; a tablet timing out beyond them waits. A replacement is new work for
    servers that are likely the busy ones (docs/design/catalog.md#R16)."""
    max_replacements_per_ts: int = 20
    """The same, for the tablets of any one tablet server."""
    max_tablets_per_assignment_round: int = 200
    """Tablets one assignment round places (PREPARING -> CREATING) or replaces, in ONE
    replicated write; the rest wait for the next round, which follows at once. Bounds the
    event-loop time of a round (a few tens of ms) so a huge CreateTable cannot starve
    heartbeats. CreateTable itself still writes the table and all its tablets as one entry."""
    max_creating_tablets: int = 1000
    """Tablets CREATING (replicas chosen, not yet reported RUNNING) at once; more PREPARING ones
    wait for room, so the assignment timeout measures a tablet's creation, not the queue of
    CreateTablet calls before it (a 10,000-tablet table is created a thousand at a time)."""
    assignment_retry_initial_ms: int = 1000
    """First pause before the tablets of a table that could not be placed (too few live
    servers) are tried again; doubles on each failure up to assignment_retry_max_ms."""
    assignment_retry_max_ms: int = 30_000
    """Longest pause between placement attempts of a table's unplaced tablets."""
    max_concurrent_tablet_reports: int = 64
    """Tablet reports being written to sys.catalog at once; a report beyond them waits its
    turn (heartbeat.ReportGate). Report writes are latency-bound (each waits for its fsync and
    a majority) and share fsyncs, so more in flight write more per second: at 1,000 servers,
    8 wrote about 12 a second and most reports were shed."""
    max_queued_tablet_reports: int = 256
    """Tablet reports waiting for a turn; one beyond them, or still waiting when
    tablet_report_budget_ms is spent, is not processed now (nor acknowledged) and comes
    again with the server's next heartbeat."""
    full_report_turns: int = 8
    """Tablet servers the leader asks for their full report at once (heartbeat.ReportGate,
    report_turns.py); the others are told to wait and send only their changes meanwhile. It
    reads two large reports at a time, so a few more keep it reading without a fleet's full
    reports arriving all together after an election."""
    tablet_report_budget_ms: int = 1000
    """Longest a heartbeat waits for its report's turn and write; past it the heartbeat is
    answered (the report unacknowledged) and the write goes on. Liveness never waits on the
    catalog."""
    loop_stall_threshold_ms: int = 500
    """A gap longer than this in the master's event loop (between runs of a probe that should
    run five times as often) is a stall of the master, and time beyond it is not counted
    against tablet servers' heartbeats: a busy master never declares healthy servers dead."""
    tserver_rpc_timeout_ms: int = 10_000
    """Deadline of one admin RPC from the master to a tablet server."""
    task_retry_initial_ms: int = 500
    """First pause before a failed tablet-server task is retried; doubles on each failure."""
    task_retry_max_ms: int = 10_000
    """Longest pause between retries of a failed tablet-server task."""
    max_concurrent_tserver_rpcs: int = 128
    """Admin RPCs the leader has in flight to tablet servers at once. A CreateTable waits on
    its CreateTablet calls (3 per tablet) going through this many at a time: on 1,000
    simulated servers a 10,000-tablet table was RUNNING in 54-55 s with 64, 40 s with 128 and
    45 s with 256 (bench/scale_bench.py, one 2-core machine running masters and fleet)."""
    replica_eviction_timeout_ms: int = 300_000
    """A replica whose tablet server has not heartbeated for this long is replaced: a new
    non-voter is added, promoted once caught up, then the dead one removed (3-4-3,
    docs/design/tablet_copy.md#R7; Kudu's follower_unavailable_considered_failed_sec)."""
    raft: RaftSettings = field(default_factory=RaftSettings)
    wal: WalSettings = field(default_factory=WalSettings)
    rpc: RpcSettings = field(default_factory=RpcSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    """`[security]`: mutual TLS from the cluster CA (service/common/tls.py)."""

    def validate(self) -> None:
        c = _Check(self, "")
        c.address("rpc_bind", self.rpc_bind, port_zero_ok=True)
        c.http_bind("http_bind", self.rpc_bind)
        _check_http_auth(c, self.http_auth, self.security)
        if self.advertised_address is not None:
            c.address("advertised_address", self.advertised_address, port_zero_ok=False)
            c.that(
                not self.master_addresses
                or self.join_existing
                or self.advertised_address in self.master_addresses,
                "advertised_address",
                f"{self.advertised_address!r} is not one of master_addresses",
            )
        _check_addresses(c, "master_addresses", self.master_addresses)
        c.that(
            not self.join_existing or bool(self.master_addresses),
            "join_existing",
            "needs master_addresses: the masters of the running group to join",
        )
        c.log_level("log_level")
        c.positive(
            "unresponsive_timeout_ms",
            "tserver_heartbeat_interval_ms",
            "default_num_replicas",
            "max_num_replicas",
            "max_create_tablets_per_ts",
            "table_locations_ttl_ms",
            "bg_task_interval_ms",
            "assignment_timeout_ms",
            "tserver_rpc_timeout_ms",
            "task_retry_initial_ms",
            "task_retry_max_ms",
            "max_concurrent_tserver_rpcs",
            "replica_eviction_timeout_ms",
            "max_tablets_per_assignment_round",
            "max_creating_tablets",
            "max_replacements_in_flight",
            "max_replacements_per_ts",
            "assignment_retry_initial_ms",
            "assignment_retry_max_ms",
            "loop_stall_threshold_ms",
            "max_concurrent_tablet_reports",
            "full_report_turns",
            "tablet_report_budget_ms",
            "authz_token_ttl_ms",
            "cert_renewal_check_ms",
            "txn_keepalive_ms",
            "txn_max_keepalive_ms",
            "txn_retention_ms",
        )
        c.that(
            self.authz_token_ttl_ms <= 86_400_000,
            "authz_token_ttl_ms",
            f"must be <= 1 day (86400000): it bounds how long a revoked grant keeps working, "
            f"got {self.authz_token_ttl_ms}",
        )
        c.non_negative(
            "max_queued_tablet_reports",
            "table_locations_cache_entries",
            "follower_heartbeat_interval_ms",
            "leader_warmup_ms",
        )
        c.that(
            self.assignment_retry_initial_ms <= self.assignment_retry_max_ms,
            "assignment_retry_initial_ms",
            f"must be <= assignment_retry_max_ms ({self.assignment_retry_max_ms}),"
            f" got {self.assignment_retry_initial_ms}",
        )
        c.that(
            self.loop_stall_threshold_ms < self.unresponsive_timeout_ms,
            "loop_stall_threshold_ms",
            f"must be < unresponsive_timeout_ms ({self.unresponsive_timeout_ms}),"
            f" got {self.loop_stall_threshold_ms}",
        )
        c.that(
            self.task_retry_initial_ms <= self.task_retry_max_ms,
            "task_retry_initial_ms",
            f"must be <= task_retry_max_ms ({self.task_retry_max_ms}),"
            f" got {self.task_retry_initial_ms}",
        )
        for name in ("default_num_replicas", "max_num_replicas"):
            value = getattr(self, name)
            c.that(value % 2 == 1, name, f"must be odd (a majority must survive), got {value}")
        c.that(
            self.default_num_replicas <= self.max_num_replicas,
            "default_num_replicas",
            f"must be <= max_num_replicas ({self.max_num_replicas}),"
            f" got {self.default_num_replicas}",
        )
        _validate_sections(self.raft, self.wal, self.rpc)
        self.security.validate()


@dataclass(frozen=True, slots=True)
class TServerConfig:
    """A tablet server (`conf/tserver.toml`). Defaults follow Kudu's flags where one exists.

    Like the master, its uuid lives in data_dir, not here.
    """

    data_dir: Path
    """Tablet WALs, consensus metadata, row data and the instance file (the node uuid)."""
    rpc_bind: str = "0.0.0.0:7050"
    advertised_address: str | None = None
    """host:port masters and clients use to reach this server; unset: derived from rpc_bind."""
    http_bind: str = "127.0.0.1:8050"
    """host:port of the status pages and /metrics (Kudu's tablet server webserver port); port 0
    picks a free port; "" serves no HTTP at all. Loopback by default, as the master's."""
    http_auth: str = "auto"
    """Who may read the status pages and /metrics, as the master's `http_auth`: "auto" (TLS
    with client certificates off loopback, plain on loopback), "tls" or "none"
    (docs/design/security.md#R13)."""
    master_addresses: tuple[str, ...] = ("127.0.0.1:7051",)
    """Every master's host:port; the server heartbeats to all of them
    (docs/design/failover.md#R1)."""
    log_level: str = "INFO"
    heartbeat_interval_ms: int = 1000
    """Period of heartbeats (with tablet reports) to each master."""
    heartbeat_rpc_timeout_ms: int = 15_000
    """Deadline of one heartbeat RPC."""
    heartbeat_max_failures_before_backoff: int = 3
    """Consecutive failed heartbeats to a master before backing off from it."""
    scanner_ttl_ms: int = 60_000
    """An idle scanner is expired after this long."""
    cert_renewal_check_ms: int = 3_600_000
    """How often the server checks its certificate; with less than a third of its lifetime
    left it asks the leader master for a new one (service/common/cert_renewal.py)."""
    num_tablets_to_copy_simultaneously: int = 10
    """Concurrent tablet copies this server runs as the destination
    (docs/design/tablet_copy.md#R4)."""
    max_concurrent_creates: int = 8
    """CreateTablet calls this server works on at once (service/tserver/tablet_manager.py)."""
    max_queued_creates: int = 64
    """CreateTablet calls waiting for one of those turns; one beyond them is refused at once
    with RESOURCE_EXHAUSTED, which the master takes as "later" and answers by sending fewer
    at a time (docs/design/catalog.md#R16), instead of timing out like a dead server."""
    flush_idle_ms: int = 10_000
    """A tablet whose in-memory rows took no write for this long flushes them to a file, then
    compacts files whose key ranges overlap, so a cold tablet is scanned without merging.
    0: never (flushes then happen only by size)."""
    quiesce_idle_ms: int = 1000
    """A tablet's Raft group idle this long stops ticking and heartbeating until it has work
    again (consensus/quiesce.py; CockroachDB's quiesced ranges). 0: never. At least two Raft
    heartbeat intervals, a multiple of raft.tick_interval_ms, and off with raft.lease_reads."""
    txn_max_staged_rows: int = 5_000_000
    """Rows all unresolved transactions may stage on one tablet: they are held in memory (on
    every replica) until their transaction ends, so a write past it is refused with
    RESOURCE_EXHAUSTED; loads that big go outside a transaction."""
    txn_sweep_ms: int = 30_000
    """How often each tablet leader looks for staged transactions nobody will resolve (their
    coordinator has no record of them, or says they aborted) and drops them; a transaction is
    looked up once a leader has seen it unresolved for twice this long."""
    txn_lock_wait_ms: int = 5_000
    """How long a write waits for a row another transaction holds before it fails ABORTED
    naming the row and the transaction (docs/design/transactions.md#R2)."""
    tablet_history_max_age_ms: int = 900_000
    """How long superseded row versions are kept for snapshot reads (Kudu's
    tablet_history_max_age_sec, 15 minutes): compactions drop what only older snapshots could
    read, and a snapshot read older than this is refused naming the horizon
    (docs/design/tablets.md#R5). Longer costs memory and disk for history; keep it above the
    longest read (a Spark job's snapshot) and the time between incremental backups."""
    max_clock_error_ms: int = 500
    """The most any two servers' wall clocks may differ (docs/design/tablets.md#R4): a
    timestamp further ahead of this server's clock than this is refused, and a clock that
    steps back by more stops assigning timestamps until it catches up
    (service/common/hybrid_time.py). NTP keeps clocks within milliseconds; the bound only has
    to hold."""
    raft: RaftSettings = field(default_factory=RaftSettings)
    wal: WalSettings = field(default_factory=WalSettings)
    rpc: RpcSettings = field(default_factory=RpcSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    """`[security]`: mutual TLS from the cluster CA (service/common/tls.py)."""

    def validate(self) -> None:
        c = _Check(self, "")
        c.address("rpc_bind", self.rpc_bind, port_zero_ok=True)
        c.http_bind("http_bind", self.rpc_bind)
        _check_http_auth(c, self.http_auth, self.security)
        if self.advertised_address is not None:
            c.address("advertised_address", self.advertised_address, port_zero_ok=False)
        c.that(bool(self.master_addresses), "master_addresses", "must name at least one master")
        _check_addresses(c, "master_addresses", self.master_addresses)
        c.log_level("log_level")
        c.positive(
            "heartbeat_interval_ms",
            "heartbeat_rpc_timeout_ms",
            "heartbeat_max_failures_before_backoff",
            "scanner_ttl_ms",
            "cert_renewal_check_ms",
            "num_tablets_to_copy_simultaneously",
            "max_concurrent_creates",
            "tablet_history_max_age_ms",
            "max_clock_error_ms",
        )
        c.non_negative("flush_idle_ms", "quiesce_idle_ms", "txn_lock_wait_ms", "max_queued_creates")
        c.positive("txn_sweep_ms", "txn_max_staged_rows")
        if self.quiesce_idle_ms:
            r = self.raft
            c.that(
                self.quiesce_idle_ms >= 2 * r.heartbeat_interval_ms
                and self.quiesce_idle_ms % r.tick_interval_ms == 0,
                "quiesce_idle_ms",
                f"must be 0 or a multiple of raft.tick_interval_ms ({r.tick_interval_ms}) of at"
                f" least two heartbeat intervals ({2 * r.heartbeat_interval_ms}),"
                f" got {self.quiesce_idle_ms}",
            )
            c.that(
                not r.lease_reads,
                "quiesce_idle_ms",
                "must be 0 with raft.lease_reads = true (a quiesced leader cut off from its"
                " group would serve reads from a lease it no longer holds)",
            )
        _validate_sections(self.raft, self.wal, self.rpc)
        self.security.validate()


# --- loading ---------------------------------------------------------------------------------

T = TypeVar("T")

_TOML_TYPE = {
    bool: "boolean",
    int: "integer",
    float: "float",
    str: "string",
    list: "array",
    tuple: "array",
    dict: "table",
}


def _describe(value: object) -> str:
    kind = next((n for t, n in _TOML_TYPE.items() if isinstance(value, t)), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _build(cls: type[T], data: object, prefix: str) -> T:
    if not isinstance(data, Mapping):
        _fail(prefix or "<config>", f"expected a table, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {_join(prefix, close[0])!r}?)" if close else ""
            _fail(_join(prefix, str(key)), f"unknown setting{hint}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _join(prefix, name)
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            _fail(key, "required setting is missing")
    return cls(**kwargs)


def _convert(tp: Any, value: object, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(options) < len(typing.get_args(tp)):
            return None
        if len(options) != 1:
            raise TypeError(f"{key}: unsupported field type {tp!r}")
        return _convert(options[0], value, key)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{key}: unsupported field type {tp!r}")
        if not isinstance(value, list | tuple):
            _fail(key, f"expected an array, got {_describe(value)}")
        return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    supertype = getattr(tp, "__supertype__", None)
    if supertype is not None:  # a NewType
        return tp(_convert(supertype, value, key))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            _fail(key, f"expected one of {allowed}, got {_describe(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        _fail(key, f"expected a boolean, got {_describe(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        _fail(key, f"expected an integer, got {_describe(value)}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        _fail(key, f"expected a float, got {_describe(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        _fail(key, f"expected a string, got {_describe(value)}")
    if tp is Path:
        if isinstance(value, Path):
            return value
        if isinstance(value, str) and value:
            return Path(value)
        _fail(key, f"expected a non-empty path string, got {_describe(value)}")
    raise TypeError(f"{key}: unsupported field type {tp!r}")


def _apply_overrides(data: dict[str, Any], overrides: Mapping[str, object]) -> None:
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if not all(parts):
            _fail(dotted, "malformed setting name")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                _fail(".".join(parts[: i + 1]), "is a setting, not a section")
            node = child
        node[parts[-1]] = value


def from_mapping(
    cls: type[T],
    data: Mapping[str, object],
    overrides: Mapping[str, object] | None = None,
    *,
    validate: bool = True,
) -> T:
    """An instance of the config dataclass `cls` from parsed TOML (nested dicts and lists).

    `overrides` maps dotted setting names to values and wins over `data`. Raises ConfigError
    naming the setting on any unknown key, missing required key, wrong type or (unless
    `validate` is false) out-of-range value.
    """
    raw: dict[str, Any] = copy.deepcopy(dict(data))
    if overrides:
        _apply_overrides(raw, overrides)
    config = _build(cls, raw, "")
    if validate:
        check = getattr(config, "validate", None)
        if callable(check):
            check()
    return config


def load_config(cls: type[T], path: str | Path, overrides: Mapping[str, object] | None = None) -> T:
    """Load, override and validate a config file. Errors name the setting and the file."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e
    try:
        return from_mapping(cls, data, overrides)
    except ConfigError as e:
        raise ConfigError(f"{e.message} (in {path})", key=e.key) from None


def parse_override(text: str) -> tuple[str, object]:
    """("raft.pre_vote", False) from "raft.pre_vote=false", for `--set` style flags.

    The value is read as a TOML value ("100", "true", '["a:1", "b:2"]'); anything that is not
    valid TOML is taken as a bare string, so "rpc_bind=127.0.0.1:7051" needs no quotes.
    """
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{text!r}: expected setting=value", key=key or None)
    try:
        value: object = tomllib.loads(f"v = {value_text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    return key, value


def to_mapping(config: object) -> dict[str, Any]:
    """The TOML-shaped mapping of a config dataclass (the inverse of `from_mapping`).

    Paths become strings, tuples lists, enums their values; None settings are left out.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"expected a config dataclass instance, got {type(config).__name__}")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = _plain(getattr(config, f.name))
        if value is not None:
            out[f.name] = value
    return out


def _plain(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_mapping(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value
