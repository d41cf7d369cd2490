"""The Tessera client library: `TesseraClient` (async) and `SyncClient`.

    async with TesseraClient(["127.0.0.1:7051"]) as c:
        await c.create_table("t", schema, partition_schema)
        await c.write("t", arrow_table, "upsert")
        rows = await c.scan("t", predicates=[ColumnPredicate("id", "GE", (10,))])

The client speaks to servers over gRPC only (docs/design/layers.md#R2; the predicates and scan
specifications it shares with the tablet server are in service.common.predicates); it finds the
leader master itself and retries within a deadline (docs/design/failover.md#R7); DDL is
exactly-once (docs/design/catalog.md#R11).

Modules
-------
    client          `TesseraClient`: catalog admin, writes, scans, scan tokens
    sync            `SyncClient`: the blocking facade (Spark executors, the CLI, scripts)
    master_client   the leader master: discovery, leader hints, retries, request ids
    meta_cache      opened tables (`TableHandle`) and tablet locations by partition key
    pruning         which tablets a scan can skip (PURE)
    write_session   rows routed to their tablets' leaders, per-row errors
    transactions    `Transaction`: writes to many tables that commit together or not at all
    scanner         scan tokens and the fault-tolerant tablet scanner
    scan_reply      scan pages read in place, without copying their rows
    page_memory     scan pages received into memory the process reuses (glibc malloc)
    replica_ops     add, remove and move one replica, compare-and-set
    retry           deadlines and retry pacing
    channels        one gRPC channel per server address; failed calls raise TesseraErrors
    credentials     where a client finds its credentials
(Certificates from the masters, for users, joins and renewals: service.common.enrollment.)
"""

from service.client.client import MasterInfo, TableSummary, TabletServerInfo, TesseraClient
from service.client.meta_cache import Replica, TableHandle, TabletLocation
from service.client.scanner import ScanToken, TabletScanner
from service.client.sync import SyncClient
from service.client.transactions import Transaction, TransactionState
from service.client.write_session import RowError, WriteResult, WriteSession
from service.common.predicates import ColumnPredicate

__all__ = [
    "ColumnPredicate",
    "MasterInfo",
    "Replica",
    "RowError",
    "ScanToken",
    "SyncClient",
    "TableHandle",
    "TableSummary",
    "TabletLocation",
    "TabletScanner",
    "TabletServerInfo",
    "TesseraClient",
    "Transaction",
    "TransactionState",
    "WriteResult",
    "WriteSession",
]
