"""The Raft transport's counters as Prometheus families, the same on masters and tablet servers.

A server's `GrpcTransport` (transport.py) counts what happened to the messages it carried.
These families read those counts at scrape time, so an operator can tell apart the ways a
message does not arrive:

  tessera_raft_messages_total{outcome}
      sent, received; dropped (a peer's queue was full, or a send failed: Raft sends again);
      deposed (a leader's message still queued after its node stopped leading that term,
      dropped unsent rather than delivered late).
  tessera_raft_foreign_batches_total
      batches refused because their sender is not a member of the group they name.
  tessera_raft_peer_gone_total
      sends or streams to a peer cut with UNAVAILABLE (its process exited, or nothing listens
      at its address). Followers of that peer then stop stretching their election timeout.

The transport is looked up at every scrape (`transport()`), because a server creates it only
once its listening port is bound; before that the labelled family has no samples and the
others read 0.
"""

from __future__ import annotations

from collections.abc import Callable

from service.common.metrics import MetricsRegistry
from service.consensus.transport import GrpcTransport


def install_transport_metrics(
    registry: MetricsRegistry, transport: Callable[[], GrpcTransport | None]
) -> None:
    """Register the transport's families (module docstring) on `registry`."""

    def messages() -> list[tuple[tuple[str], float]]:
        t = transport()
        if t is None:
            return []
        return [
            (("sent",), float(t.sent)),
            (("received",), float(t.received)),
            (("dropped",), float(t.dropped)),
            (("deposed",), float(t.deposed_dropped)),
        ]

    def count(field: str) -> float:
        t = transport()
        return 0.0 if t is None else float(getattr(t, field))

    registry.counter_callback(
        "tessera_raft_messages_total",
        "Raft messages this server's transport sent and received; dropped because a peer's "
        "queue was full or a send failed (Raft sends them again); deposed: a leader's "
        "messages dropped unsent because its node no longer led their term.",
        messages,
        ("outcome",),
    )
    registry.counter_callback(
        "tessera_raft_foreign_batches_total",
        "Raft message batches refused because their sender is not a member of the group.",
        lambda: count("foreign_batches"),
    )
    registry.counter_callback(
        "tessera_raft_peer_gone_total",
        "Sends to a peer cut with UNAVAILABLE (its process exited or nothing listens at its "
        "address); followers of that peer stop stretching their election timeout.",
        lambda: count("gone_reports"),
    )
