"""The master: the catalog, its Raft group sys.catalog, the tablet server registry, placement.

Design: docs/design/catalog.md (the catalog and its state-change contract), failover.md
(heartbeats, fencing, the orphan policy), coordinator.md (commit points, roll-forward, replay
before serving), security.md.

Modules
-------
    master              the process: wiring of sys.catalog's RaftNode, the catalog manager, the
                        TSManager, gRPC; leadership (load on election, unload on step-down)
    __main__            `python -m service.master`
    master_service      the Master RPC API: decode, leader check, delegate (thin servicer)
    catalog_manager     DDL and lookups under the state-change contract; one write per operation;
                        the apply listener; holds the assigner and the report handler
    ddl_checks          pure checks of DDL arguments (names, limits)
    catalog_settings    the catalog manager's knobs: MasterConfig's (defaults and rules from there,
                        in seconds) and the limits only it has
    catalog_records     the records of sys.catalog as frozen dataclasses, and their protobuf codec
    sys_catalog         the replicated state machine: deterministic apply, preconditions,
                        invariants, snapshots
    request_table       remembered DDL results: exactly-once across failovers
    catalog_info        the in-memory catalog: copy-on-write infos, the maps, the locks
    catalog_reads       the lookups clients make, as pure functions of the maps
    locations_cache     GetTableLocations answers kept until what they were built from changes
    catalog_assignment  roll-forward: tasks derived from committed state, assignment planning
    assigner            the catalog manager's collaborator for assignment: the CREATING tablets
                        and their timeouts, placement backoffs, when a round is due, and one
                        bounded round under locks
    background_tasks    the leader's loop: assignment rounds, side-effect RPCs with retries,
                        re-replication
    create_pacing       CreateTablet calls paced per tablet server (AIMD window), and which
                        slow tablets to replace
    placement_policy    which servers host a new or replacement replica (PURE)
    rereplication       3-4-3 decisions for under-replicated tablets (PURE)
    (rebalancing moves: service.rebalance, shared with the client and the Spark job)
    replica_changes     AddReplica/RemoveReplica/MoveReplica for operators
    report_processing   what the leader does about one reported replica (PURE)
    claims              what servers said of their replicas, to confirm another's claim
    report_handler      the catalog manager's collaborator for tablet reports: judged, locked,
                        written as ONE write; the replicas reported FAILED
    group_commit        report writes proposed together share one sys.catalog entry
    heartbeat           TSHeartbeat: liveness on every master, reports on the leader, ReportGate
    heartbeat_pace      a busy leader asks tablet servers for a longer heartbeat interval
    report_turns        which servers the leader asks for their full report now (PURE)
    ts_descriptor       what a master knows of one tablet server (wire values, records)
    ts_manager          the tablet server registry, on every master
    progress_clock      liveness time that stands still while the master's loop stalls
    tserver_proxy       the master's client of tablet servers' admin RPCs (fenced, addressed)
    master_membership   AddMaster/RemoveMaster: sys.catalog's membership, one change at a time
    security            the root CA and token signing keys in sys.catalog
    cert_issuer         certificates the leader signs on request
    table_access        per-table authorization and authz tokens
    grants              the grant rows of sys.catalog and their writes
    txn_coordinator     transactions: their records in sys.catalog, the leader's two-phase
                        commit, keep-alives
    status_pages        HTML status pages and /metrics

One CreateTable through the master
----------------------------------
1. `master_service.MasterServicer.CreateTable` decodes the request into dataclasses
   (`common.schema_codec`), raises NotTheLeader on a follower and NotReady on a leader still
   replaying, and calls `CatalogManager.create_table`.
2. `catalog_manager`: a retry whose request id `request_table` remembers is answered at once;
   otherwise `ddl_checks` validates, the name is reserved, and the table (RUNNING) and its
   tablets (PREPARING) are built as ONE `catalog_records.CatalogWrite` with its preconditions
   and request id, proposed through the master's `RaftNode` (`consensus.node`).
3. `sys_catalog.SysCatalogState.apply`, on every master once the entry commits: preconditions,
   invariants, rows written; its listener (`catalog_info.CatalogMaps.on_applied`) commits the
   rows into the maps, tablets before the table, and `catalog_assignment.tasks_for` recomputes
   the tablets' tasks. `create_table` returns the table id.
4. `background_tasks.BackgroundTasks` (leader only) is woken: `CatalogManager.assign_tablets`
   (its `assigner.Assigner`) plans a bounded round (`catalog_assignment.plan_assignments`,
   servers from `placement_policy` and `ts_manager`) and replicates ONE write moving the
   tablets to CREATING with their committed configs.
5. The tasks of CREATING tablets are CreateTablet on every peer: `background_tasks` sends them
   through `tserver_proxy` (destination uuid, master term, deadline) and retries until each
   server has answered.
6. Each tablet server creates its replica (`service.tserver.tablet_manager`) and reports it in
   its next heartbeat; `heartbeat.handle_heartbeat` records liveness (`ts_manager`), passes the
   `ReportGate`, and calls `CatalogManager.process_report` (its `report_handler.ReportHandler`).
7. `report_processing.plan_report` sees the leader of the committed config report the tablet
   and, once other voters confirm that claim (their own reports, or GetConsensusState:
   `claims`; docs/design/catalog.md#R15), writes it RUNNING (one write for the whole report;
   writes of reports processed together share one sys.catalog entry, `group_commit`).
8. When every tablet is RUNNING, `CatalogManager.is_create_table_done` (IsCreateTableDone) says
   so, and the client's `create_table` returns.
"""
