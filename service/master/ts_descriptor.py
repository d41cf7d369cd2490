"""What a master knows of one tablet server: the values it is told, and the record it keeps.

docs/design/failover.md#R2: every heartbeat carries the server's *node instance* (its permanent uuid
and an instance sequence number that grows at every start of the process), optionally a
*registration* (sent at startup, or when the master answered "needs re-register"), and optionally a
tablet report. The master keeps, per permanent uuid, a descriptor: the registration, when it last
heard from the server, and whether it still needs a full tablet report from it.

Three kinds of object live here:

* values received on the wire, validated on construction: `NodeInstance`, `TSRegistration`;
* `TSDescriptor`, the frozen snapshot handed to readers (RPC handlers, the catalog manager,
  ksck): it never changes under them and may be kept, logged or compared freely;
* `TSRecord`, the mutable record owned by `TSManager` (and only by it), with its invariants
  written on its fields. Nothing outside `ts_manager.py` holds a `TSRecord`.

A `ReportToken` ties the processing of one full tablet report to the request for it, so that a
report begun before a newer request (a re-election, a restart of the server) cannot satisfy
that newer request when its processing finishes (see `TSRecord.full_report_processed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from service.common.errors import FailedPrecondition, Internal, InvalidArgument
from service.common.ids import NodeId, validate_node_id
from service.master.placement_policy import ServerLoad

__all__ = [
    "NodeInstance",
    "ReportToken",
    "TSDescriptor",
    "TSRecord",
    "TSRegistration",
]


def _check_address(what: str, address: str) -> None:
    """host:port with a port in 1..65535 (an advertised address, so port 0 is wrong)."""
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{what}: expected host:port with a port in 1-65535, got {address!r}")


@dataclass(frozen=True, slots=True)
class NodeInstance:
    """Which process of which server is speaking (Kudu's NodeInstancePB).

    The uuid is permanent (kept in the server's data dir; a wiped server comes back under a new
    one, docs/design/consensus.md#R9); the sequence number grows each time the process starts, so
    the master can tell a restart (higher), a retry (equal) and a stale message from a former
    process (lower).
    """

    permanent_uuid: NodeId
    instance_seqno: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "permanent_uuid", validate_node_id(self.permanent_uuid))
        seqno = self.instance_seqno
        if isinstance(seqno, bool) or not isinstance(seqno, int) or seqno < 0:
            raise InvalidArgument(f"instance_seqno must be an integer >= 0, got {seqno!r}")


@dataclass(frozen=True, slots=True)
class TSRegistration:
    """What a tablet server tells a master about itself when it registers (ServerRegistrationPB).

    Replaced as a whole on every registration: the record never mixes fields of two.
    """

    rpc_addresses: tuple[str, ...]
    """Where the master and clients reach the server, preferred first; at least one."""
    http_addresses: tuple[str, ...] = ()
    """The embedded web UI's addresses, if any (repeated, as ServerRegistrationPB has them)."""
    software_version: str = ""
    """The server's build, for ksck and rolling-upgrade checks."""
    start_time: float = 0.0
    """Wall-clock seconds since the epoch at which the server process started (for humans:
    uptime in ListTabletServers; never used to order events, the instance seqno does that)."""
    location: str | None = None
    """Rack or zone label used by placement to spread replicas; None if not configured."""

    def __post_init__(self) -> None:
        addresses = tuple(self.rpc_addresses)
        if not addresses:
            raise InvalidArgument("registration must name at least one rpc address")
        for address in addresses:
            _check_address("rpc address", address)
        if len(set(addresses)) != len(addresses):
            raise InvalidArgument(f"duplicate rpc addresses in registration: {addresses}")
        object.__setattr__(self, "rpc_addresses", addresses)
        http = tuple(self.http_addresses)
        for address in http:
            _check_address("http address", address)
        object.__setattr__(self, "http_addresses", http)
        if self.location is not None and not self.location:
            raise InvalidArgument("location must be None or a non-empty label")
        if self.start_time < 0:
            raise InvalidArgument(f"start_time must be >= 0, got {self.start_time}")

    @property
    def http_address(self) -> str | None:
        """The preferred web UI address, or None."""
        return self.http_addresses[0] if self.http_addresses else None


@dataclass(frozen=True, slots=True)
class ReportToken:
    """Proof that a full tablet report was requested: handed out with a heartbeat, returned to
    `TSManager.full_report_processed` once that heartbeat's full report has been processed."""

    uuid: NodeId
    instance_seqno: int
    request_seq: int


@dataclass(frozen=True, slots=True)
class TSDescriptor:
    """A reader's snapshot of one tablet server, as of `TSManager.get()`/`descriptors()`.

    Times are on the master's monotonic clock (`Clock.monotonic`): compare them only with each
    other or with the same master's clock. `replicas_by_table` is read-only and left out of the
    hash (it is compared for equality).
    """

    uuid: NodeId
    instance_seqno: int
    registration: TSRegistration
    live: bool
    """Heard from within the unresponsive timeout when the snapshot was taken."""
    last_heartbeat: float
    """Monotonic time of the last heartbeat (a registration counts as one)."""
    heartbeat_age_s: float
    """Seconds since then, when the snapshot was taken."""
    first_registered: float
    """Monotonic time this master first heard of the server (kept across its restarts)."""
    last_registered: float
    """Monotonic time of the latest registration."""
    needs_full_report: bool
    """This master wants a full tablet report from the server (see `TSRecord`)."""
    total_replicas: int
    """Replicas hosted, per the catalog (the sum of `replicas_by_table`)."""
    replicas_by_table: Mapping[str, int] = field(hash=False)
    """Table id -> replicas of that table on the server, per the catalog (read-only)."""
    num_leaders: int = 0
    """Replicas leading their tablet, as the server said in its last heartbeat (a live figure
    from the server, not the catalog: leadership moves without any catalog write)."""

    @property
    def rpc_address(self) -> str:
        """The preferred rpc address."""
        return self.registration.rpc_addresses[0]

    @property
    def location(self) -> str | None:
        return self.registration.location

    def to_server_load(self) -> ServerLoad:
        """This server as placement sees it."""
        return ServerLoad(
            uuid=self.uuid,
            live=self.live,
            total_replicas=self.total_replicas,
            replicas_by_table=self.replicas_by_table,
            location=self.registration.location,
        )


@dataclass(slots=True)
class TSRecord:
    """The mutable record `TSManager` keeps per tablet server. Owned by the manager alone.

    A record exists only once the server has registered: an unregistered uuid has no record and
    its heartbeats are answered "needs re-register" (docs/design/failover.md#R2). Records are never
    removed: a silent server turns dead and stays listed, so ksck and placement can
    name it, and a server that comes back under the same uuid finds its history.
    """

    uuid: NodeId
    """Never changes; equals the manager's key for this record."""
    instance_seqno: int
    """Never decreases. A registration with a lower seqno (a former process's message arriving
    late) is refused; a higher one is a restart."""
    registration: TSRegistration
    """Always the registration sent with `instance_seqno` (both are replaced together)."""
    first_registered: float
    last_registered: float
    """first_registered <= last_registered <= last_heartbeat, all monotonic, none decreases."""
    last_heartbeat: float
    full_report_pending: bool = True
    """True from a registration or a request (`request_full_report`) until a full report
    answering the latest request has been processed. Set at registration because the master
    knows nothing reliable of a newly (re)started server's replicas."""
    request_seq: int = 0
    """Incremented by every request for a full report, registrations included, so a
    `ReportToken` from an older request can never clear a newer one."""
    num_leaders: int = 0
    """From the last heartbeat (`TSHeartbeatRequestPB.num_leaders`)."""

    @classmethod
    def register_new(
        cls, instance: NodeInstance, registration: TSRegistration, now: float
    ) -> TSRecord:
        return cls(
            uuid=instance.permanent_uuid,
            instance_seqno=instance.instance_seqno,
            registration=registration,
            first_registered=now,
            last_registered=now,
            last_heartbeat=now,
            full_report_pending=True,
            request_seq=1,
        )

    def register(self, instance: NodeInstance, registration: TSRegistration, now: float) -> bool:
        """Apply a (re-)registration; returns True if it is a new process (a restart).

        An equal seqno is a retry (our answer was lost, or we asked for it): accepted, and the
        registration replaced, as Kudu does. A registration always re-requests a full report.
        """
        if instance.permanent_uuid != self.uuid:
            raise Internal(f"registration for {instance.permanent_uuid} sent to {self.uuid}")
        if instance.instance_seqno < self.instance_seqno:
            raise FailedPrecondition(
                f"tablet server {self.uuid} cannot register with instance seqno"
                f" {instance.instance_seqno}: seqno {self.instance_seqno} is already registered"
                " (a message from a former process of this server)"
            )
        restarted = instance.instance_seqno > self.instance_seqno
        self.instance_seqno = instance.instance_seqno
        self.registration = registration
        self.last_registered = max(self.last_registered, now)
        self.heartbeat(now)
        self.request_full_report()
        return restarted

    def matches(self, instance: NodeInstance) -> bool:
        """The heartbeat comes from the registered process (Kudu's LookupTS)."""
        return (
            instance.permanent_uuid == self.uuid and instance.instance_seqno == self.instance_seqno
        )

    def heartbeat(self, now: float) -> None:
        self.last_heartbeat = max(self.last_heartbeat, now)

    def request_full_report(self) -> None:
        self.full_report_pending = True
        self.request_seq += 1

    def token(self) -> ReportToken:
        return ReportToken(self.uuid, self.instance_seqno, self.request_seq)

    def full_report_processed(self, token: ReportToken) -> bool:
        """Clear the pending flag if `token` answers the latest request of this process.

        Returns whether it did. A stale token (a request or a restart happened while the report
        was being processed) leaves the flag set, and the next heartbeat asks again.
        """
        if token != self.token():
            return False
        self.full_report_pending = False
        return True

    def heartbeat_age(self, now: float) -> float:
        return max(0.0, now - self.last_heartbeat)

    def is_live(self, now: float, unresponsive_timeout_s: float) -> bool:
        """Heard from less than `unresponsive_timeout_s` ago (Kudu's rule: age < timeout)."""
        return self.heartbeat_age(now) < unresponsive_timeout_s

    def snapshot(
        self, now: float, unresponsive_timeout_s: float, replicas_by_table: Mapping[str, int]
    ) -> TSDescriptor:
        counts = MappingProxyType(dict(replicas_by_table))
        return TSDescriptor(
            uuid=self.uuid,
            instance_seqno=self.instance_seqno,
            registration=self.registration,
            live=self.is_live(now, unresponsive_timeout_s),
            last_heartbeat=self.last_heartbeat,
            heartbeat_age_s=self.heartbeat_age(now),
            first_registered=self.first_registered,
            last_registered=self.last_registered,
            needs_full_report=self.full_report_pending,
            total_replicas=sum(counts.values()),
            replicas_by_table=counts,
            num_leaders=self.num_leaders,
        )
