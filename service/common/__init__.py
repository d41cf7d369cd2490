"""Building blocks every other package uses (the bottom of the stack above `service.pb`;
docs/design/layers.md#R1).

Modules
-------
    errors          the one error tree, its stable codes and the gRPC mapping in both directions
    error_mapping   channel interceptors raising a failed outgoing call as its TesseraError
    config          frozen-dataclass configuration loaded strictly from `conf/*.toml`
    ids             `NewType` ids (`NodeId`, `TableId`, `TabletId`) and uuid helpers
    clock           the `Clock` protocol, `RealClock` and the deterministic `ManualClock`
    hybrid_time     the hybrid logical clock and its timestamps (rows' commit timestamps)
    logging         one log format for every process, with the node in each line
    schema          table schemas: typed columns, column ids, the key, alter steps (PURE)
    schema_codec    schemas and partitions to and from protobuf (common.proto)
    keys            order-preserving binary encoding of keys (PURE)
    partition       hash x range partitioning and partition keys (PURE)
    rwlock          a first-come-first-served readers-writer lock for asyncio tasks
    periodic        a background task that runs a function every interval
    failpoints      crash points for fault-injection tests
    metrics         a per-server Prometheus registry
    http_status     a minimal HTTP server for status pages and /metrics
    loop_lag        how late the event loop runs
    registration    registering servicers so that undecodable requests are named errors
    server_main     the `main()` shared by the server processes
    pki             the cluster CA and the certificates that carry identities
    tls             mutual TLS on every gRPC connection, and who is calling
    channel_options every gRPC channel and server option, one constructor per purpose, and why
    tokens          signed tokens: format, signing, verification, authz claims
    authz           per-servicer RPC policies, default deny
    cert_renewal    a server renewing its own certificate before it expires, without a restart
    private_files   owner-only files for keys and credentials
    enrollment      certificates from the leader master: users' credentials, joins, renewals
    predicates      scan specifications: predicates, projection, key bounds, limits (the
                    client builds them, the tablet server evaluates them)

Nothing is re-exported here, so importing one module (say `clock`) does not import the rest
(`errors` pulls in grpc).
"""
