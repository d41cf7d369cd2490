"""Every gRPC channel and server option Tessera sets, with the reason for each value.

A gRPC option is a `(name, value)` pair given when a channel or a server is made; an option
left out takes gRPC's default. The defaults that matter here:

* messages are limited to 4 MiB received (sending is unlimited on channels), far below a scan
  page, a write batch, a Raft append or a catalog dump;
* a channel that lost its connection redials after 1 s, then backs off up to 120 s. A call on a
  channel that is waiting to redial fails at once with UNAVAILABLE, so a long backoff turns a
  server that restarted in a second into minutes of failures;
* SO_REUSEPORT is on for servers (see `server`).

Each constructor below is one purpose; callers never spell an option name themselves. Where
two purposes differ, the difference is a parameter of a constructor or a constant here with
its reason, so a reader can tell a choice from an accident.

| constructor      | used by                                                            |
|------------------|--------------------------------------------------------------------|
| `client`         | the client library's channel pool (to masters and tablet servers), |
|                  | and test stubs that stand in for it                                |
| `server_peer`    | a master's channels to tablet servers (`TServerProxy`)             |
| `heartbeat`      | a tablet server's heartbeat channels to the masters                |
| `consensus_peer` | the Raft transport between the members of a group                  |
| `tablet_copy`    | a tablet server fetching a replica's files from another            |
| `tool`           | tools and Spark executors reading whole listings with blocking gRPC |
| `server`         | every `grpc.aio.server` of masters, tablet servers and simulators  |
| `own_connection` | processes that stand in for many (simulated tablet servers, load   |
|                  | generators): one TCP connection per channel                        |
| `load_generator` | the benchmarks' load generator (bench/loadgen.py)                  |
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = [
    "CLIENT_MAX_MESSAGE_BYTES",
    "CLIENT_RECONNECT_MS",
    "CONSENSUS_RECONNECT_MS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "LOAD_GENERATOR_RECONNECT_MS",
    "TOOL_MAX_RECEIVE_BYTES",
    "Options",
    "client",
    "consensus_peer",
    "heartbeat",
    "load_generator",
    "own_connection",
    "server",
    "server_peer",
    "tablet_copy",
    "tool",
]

Options: TypeAlias = list[tuple[str, int]]

MiB = 1 << 20

DEFAULT_MAX_MESSAGE_BYTES = 64 * MiB
"""The servers' message limit both ways unless `[rpc] max_message_bytes` says otherwise
(service/common/config.py, `RpcSettings`)."""

CLIENT_MAX_MESSAGE_BYTES = DEFAULT_MAX_MESSAGE_BYTES
"""The client's limit both ways: a scan page or a write batch can be far above the 2 MB default
pages, and a server configured with the default limit sends nothing larger."""

TOOL_MAX_RECEIVE_BYTES = 256 * MiB
"""What tools and Spark executors accept in one response (a ListTablets of a tablet server with
thousands of replicas, a catalog dump): above the servers' default limit, so a server whose
`max_message_bytes` was raised is still readable by them."""


def _sizes(max_message_bytes: int) -> Options:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def _reconnect(initial_ms: int, max_ms: int) -> Options:
    """Reconnect backoff: first redial after `initial_ms`, never waiting more than `max_ms`."""
    return [
        ("grpc.initial_reconnect_backoff_ms", initial_ms),
        ("grpc.min_reconnect_backoff_ms", min(initial_ms, max_ms)),
        ("grpc.max_reconnect_backoff_ms", max_ms),
    ]


CLIENT_RECONNECT_MS = (50, 300)
"""The client redials after 50 ms and at least every 300 ms: after a server restarts (or a
master failover moves the leader back), the next attempt should find it within the retry budget
of one operation (service/client/retry.py), not after gRPC's two-minute ceiling. A client talks
to a handful of servers, so dialing a dead one three times a second costs nothing."""

CONSENSUS_RECONNECT_MS = (100, 2000)
"""A Raft peer is redialed after 100 ms, then backing off to at most every 2 s. A restart is
found again within a few heartbeats (500 ms, config `raft.heartbeat_interval_ms`) and a peer
down for long rejoins within about one election timeout of coming back, while a server hosting
hundreds of groups does not dial a dead peer several times a second (one channel per peer
server carries every group: service/consensus/transport.py)."""


HEARTBEAT_RECONNECT_MS = (100, 2000)
"""A tablet server redials a master after 100 ms, then backing off to at most every 2 s. With
gRPC's default (up to 120 s), a master restarted after a minute down had heard from only 576
of 1,000 servers 15 s after it came back, and 40 of 1,000 in another run: when it then won an
election its registry was cold (bench/scale_bench.py). A server has a handful of masters."""

LOAD_GENERATOR_RECONNECT_MS = (100, 1000)
"""A benchmark client redials after 100 ms and at least every second: failover is measured
from the client's side, so a node that came back must be found within about a second, and
the same values serve every system a benchmark compares (bench/loadgen.py)."""


def client(max_message_bytes: int = CLIENT_MAX_MESSAGE_BYTES) -> Options:
    """Channels of the client library to masters and tablet servers (service/client/channels.py)."""
    return [*_reconnect(*CLIENT_RECONNECT_MS), *_sizes(max_message_bytes)]


def server_peer(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Options:
    """A server's channels to other servers outside Raft (a master to its tablet servers):
    the server's own message limit, so whatever one server may send the other accepts. The
    reconnect backoff is left at gRPC's: a master may hold channels to thousands of tablet
    servers (`TServerProxy`'s `max_channels`), and redialing every dead one several times a
    second, as a client with a handful of servers can afford, would be a load of its own."""
    return _sizes(max_message_bytes)


def heartbeat() -> Options:
    """A tablet server's channel to one master (service/tserver/heartbeater.py), and the
    simulated servers' (service/testing/ts_simulator.py): `HEARTBEAT_RECONNECT_MS`, gRPC's
    message sizes (heartbeats and their answers are small)."""
    return _reconnect(*HEARTBEAT_RECONNECT_MS)


def consensus_peer(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Options:
    """The Raft transport's channel to a peer server. `max_message_bytes` is the servers'
    `[rpc] max_message_bytes`: an append of `raft.max_entries_per_msg_bytes` must fit in one
    message, which config validation checks (service/common/config.py)."""
    return [*_sizes(max_message_bytes), *_reconnect(*CONSENSUS_RECONNECT_MS)]


def tablet_copy(chunk_bytes: int) -> Options:
    """A tablet copy client's channel to the source server: it receives file chunks of at most
    `chunk_bytes`; twice that plus 1 MiB of headroom covers a chunk with its framing and the
    superblock, and still refuses a source that sends far more than it was asked for."""
    return [("grpc.max_receive_message_length", 2 * chunk_bytes + MiB)]


def tool(max_receive_bytes: int = TOOL_MAX_RECEIVE_BYTES) -> Options:
    """Blocking channels of tools, test harnesses and Spark executors that read whole listings
    in one response (`TOOL_MAX_RECEIVE_BYTES`)."""
    return [("grpc.max_receive_message_length", max_receive_bytes)]


def server(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Options:
    """Options for `grpc.aio.server`: the message limit both ways, and SO_REUSEPORT off.

    gRPC sets SO_REUSEPORT on Linux by default, so a second server binding a port that is in
    use *succeeds* and the kernel splits new connections between the two: a master started on a
    port another process took meanwhile would answer half its clients with "Method not found".
    Off, the bind fails and the server refuses to start."""
    return [*_sizes(max_message_bytes), ("grpc.so_reuseport", 0)]


def load_generator() -> Options:
    """A benchmark load generator's channels: one connection each (`own_connection`) and
    `LOAD_GENERATOR_RECONNECT_MS`. Message sizes stay gRPC's: benchmark requests are small."""
    return own_connection(_reconnect(*LOAD_GENERATOR_RECONNECT_MS))


def own_connection(options: Options | None = None) -> Options:
    """`options` plus a subchannel pool of the channel's own. gRPC shares one connection among
    a process's channels to the same address with the same options; a process that stands in
    for many (simulated tablet servers, a load generator's clients) needs one connection per
    channel, as separate processes would have."""
    return [*(options or []), ("grpc.use_local_subchannel_pool", 1)]
