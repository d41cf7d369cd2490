"""The consensus layer: the asyncio shell that runs Raft groups on the pure core (service.raft).

Design: docs/design/consensus.md (commit and membership rules, the WAL, consensus metadata,
amnesia) and coordinator.md#R4 and #R5 (replay before serving, ReadIndex and leases).

Modules
-------
    node            `RaftNode`: the one task that owns a RawNode; propose, read, membership
    node_api        what a RaftNode is given and gives: state machine, transport, settings,
                    leader-change events
    node_quiesce    `NodeQuiescence`, a RaftNode's collaborator: what it decides after a tick
                    (promote a caught-up learner, or quiesce), and its quiesced state
    batching        pacing of group commits, and proposal deadlines
    syncer          threads that run fdatasync off the event loop
    ticker          one tick timer per process for all its groups
    turns           applies of all its groups share the event loop in bounded slices
    quiesce         idle groups stop ticking; one digest per peer server stands in
    snapshots       when a node snapshots, at which index, with which membership
    raft_store      a node's durable state: WAL, consensus metadata, latest snapshot
    wal             the write-ahead log: CRC'd records in preallocated segments
    cmeta           consensus metadata: term, vote, membership, own uuid
    fs              the file-system seam (real, or simulated by service.testing.simdisk)
    codec           the core's values to and from consensus.proto
    transport       gRPC transport: per-peer batching, incarnations, destination checks
    transport_metrics  the transport's counters as Prometheus families (masters and tablet servers)
    vouch           a node with a stale config takes a new leader on a member's word

The replicated key-value demo built on this package (its smallest state machine) lives with the
tools: service.tools.kv_demo_server, kv_demo_client and kv_demo (`make raft-demo`).
"""
