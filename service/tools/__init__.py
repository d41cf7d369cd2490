"""The `tessera` command and what it drives: local clusters, DDL and admin commands, ksck.

Tools sit above the client (docs/design/layers.md#R1): they may start master and tablet server
processes and use service.testing's launchers. The mechanics of starting a server process live
here (`launcher`), not in service.testing, so that the user's `tessera cluster` and the test
clusters share them without the tool depending on test support.

Modules
-------
    cli             the `tessera` command: subcommands and their dispatch
    cli_args        typed arguments and the `main` runner every command shares
    output          aligned plain-text tables and JSON for every command
    launcher        starting server processes, shared by every cluster launcher: command
                    line, owner-only log, ready file, SIGTERM-grace-SIGKILL, free ports,
                    the per-process record (`ServerProcess`)
    cluster_spec    `ClusterSpec`: what a cluster is (counts, security, timing, overrides),
                    and the one command line of a master or a tablet server
    local_cluster   a local cluster of real background processes in one directory
    local_servers   one server of a local cluster: start, stop, restart by name
    cluster_cmd     `tessera cluster up|status|down|start|stop|restart`
    healthcheck     whether servers serve: one server's Ping, a cluster's masters
    ksck            ksck's judgement of gathered facts (PURE)
    ksck_cmd        `tessera cluster ksck`: gather, rate, print
    admin_cmd       `tessera table|tablet|tserver|master ...` over the client library
    table_syntax    how tables, values and conditions are written on the command line
    table_io_cmd    `tessera table load|copy`: rows in bulk
    rebalance_cmd   `tessera cluster rebalance`, `tessera replica add|remove|move`
    master_cmd      `tessera master add|remove`: the masters' membership
    security_cmd    `tessera security`: the cluster CA and certificates
    token_cmd       `tessera token create`: short-lived user credentials
    grant_cmd       `tessera grant|revoke`: per-table privileges
    kv_demo_server  the replicated key-value demo server (consensus' smallest state machine)
    kv_demo_client  the KV demo's client
    kv_demo         `make raft-demo`: three demo processes, a leader killed under load
"""
