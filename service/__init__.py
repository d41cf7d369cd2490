"""Tessera: a Raft-replicated metadata service for tablet-partitioned data, in the style of Kudu.

The packages, from the bottom of the stack up (each imports only those below it;
docs/design/layers.md#R1, enforced by `make lint`):

    pb          generated protobuf and gRPC code (from protos/; never edited by hand)
    common      errors, config, ids, clocks, schemas, keys, partitioning, PKI, TLS, tokens
    raft        the pure Raft core: no I/O, no clock, deterministic (docs/design/consensus.md)
    consensus   the asyncio shell around the core: RaftNode, WAL, consensus metadata, transport
    master      the catalog and its Raft group sys.catalog; tablet server registry; placement
    tserver     tablet replicas (one Raft group each), row storage, scans, tablet copy
    client      the client library (async `TesseraClient`, blocking `SyncClient`)
    tools       the `tessera` command: local clusters, DDL and admin commands, ksck, jobs
    testing     simulators, harnesses and process launchers for tests, tools and benchmarks
                (imported only by those; docs/design/layers.md#R3)

and beside them `spark_jobs` (the Spark data source and the reconciliation jobs), on top.
Each package's `__init__.py` maps its modules; docs/design/ says what rules they enforce.

One CreateTable, end to end
---------------------------
1. client: `TesseraClient.create_table` (client/client.py) builds the request;
   `MasterClient.ddl` (client/master_client.py) gives it a request id, finds the leader master
   and retries within the deadline (docs/design/catalog.md#R11).
2. master, RPC: `MasterServicer.CreateTable` (master/master_service.py) decodes and validates
   the request, checks that this master leads and has loaded its catalog, and delegates
   (docs/design/layers.md#R6).
3. master, catalog: `CatalogManager.create_table` (master/catalog_manager.py) checks the
   arguments (master/ddl_checks.py), takes the locks, and builds the table RUNNING and its
   tablets PREPARING as ONE `CatalogWrite` (master/catalog_records.py), then proposes it to
   the masters' Raft group (consensus/node.py: WAL, replication to the other masters).
4. master, apply: once committed, `SysCatalogState.apply` (master/sys_catalog.py) checks
   preconditions and invariants and writes the rows on every master; its listener commits them
   into the in-memory maps (master/catalog_info.py) and the client gets its table id
   (docs/design/catalog.md#R1..R7).
5. master, background tasks: the leader's `BackgroundTasks` (master/background_tasks.py) runs an
   assignment round (master/assigner.py, catalog_assignment.py): servers chosen by
   master/placement_policy.py, the tablets moved to CREATING with their configs in one more
   write; then the CreateTablet RPCs committed state calls for go out through
   master/tserver_proxy.py, retried until done (docs/design/coordinator.md#R3).
6. tserver: `AdminServicer.CreateTablet` (tserver/tablet_service.py) checks the
   destination uuid and the master's term; `TabletManager.create_tablet`
   (tserver/tablet_manager.py) writes the replica's directories and superblock and starts it
   (tserver/tablet.py: its Raft group, which elects a leader).
7. tablet report: the tablet manager's change wakes the heartbeater (tserver/heartbeater.py),
   which reports the replica to the leader master; `handle_heartbeat` (master/heartbeat.py)
   hands the report to `CatalogManager.process_report`, and report processing
   (master/report_processing.py) writes the tablet RUNNING once its leader reports it
   (docs/design/catalog.md#R14).
8. RUNNING: when every tablet is RUNNING, IsCreateTableDone says so and the client's
   `create_table` (which waited for it) returns.
"""
