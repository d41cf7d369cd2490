"""The tablet server: tablet replicas (each its own Raft group), row storage, scans as Arrow,
admin RPCs, the heartbeater to every master, and tablet copy.

Design: docs/design/tablet_copy.md (data states, startup, tablet copy), failover.md#R1 and #R5
(heartbeats to every master, fencing), consensus.md#R9 (amnesia).

Modules
-------
    tablet_server       the process: wiring of transport, tablet manager, scanners,
                        heartbeater, RPCs; identity (uuid) and the master-term fence
    __main__            `python -m service.tserver`
    tablet_service      thin servicers: admin, data and tablet-copy RPCs
    tablet_manager      every replica hosted here: create, delete, startup state machine,
                        reports
    tablet              one replica: its Raft group, its row store, the state machine between
    superblock          a replica's identity and data state (READY, COPYING, TOMBSTONED, DELETED)
    tablet_copy         tablet copy: the leader's trigger, copy sessions, the destination's copy
    vouch               how a replica asks a member about its group (consensus/vouch.py)
    rowstore            a tablet's rows: memstores over immutable sorted files
    rowstore_memstore   the in-memory half of the row store
    rowstore_files      the row store's files, key index and helpers
    rowstore_merge      merging row store sources in key order; checksums
    row_ops             client writes: validation, and their form in the Raft log
    request_tracker     exactly-once plain writes: the outcome of each named request
    txn_staging         a replica's unresolved transactions: staged rows, prepares, row locks
    scanners            paged scans, named by scanner id, expired when idle
    key_splitting       cutting a tablet's key range into chunks (split tokens)
    heartbeater         one loop per master: registration, full and incremental reports
    status_pages        HTML status pages and /metrics
"""
