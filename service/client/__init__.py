"""The Tessera client library (issue 5): `TesseraClient` (async) and `SyncClient`.

async with TesseraClient(["127.0.0.1:7051"]) as c:
    await c.create_table("t", schema, partition_schema)
    await c.write("t", arrow_table, "upsert")
    rows = await c.scan("t", predicates=[ColumnPredicate("id", "GE", (10,))])
"""

from service.client.client import MasterInfo, TableSummary, TabletServerInfo, TesseraClient
from service.client.meta_cache import Replica, TableInfo, TabletLocation
from service.client.scanner import ScanToken, TabletScanner
from service.client.write_session import RowError, WriteResult, WriteSession
from service.tserver.predicates import ColumnPredicate

__all__ = [
    "ColumnPredicate",
    "MasterInfo",
    "Replica",
    "RowError",
    "ScanToken",
    "TableInfo",
    "TableSummary",
    "TabletLocation",
    "TabletScanner",
    "TabletServerInfo",
    "TesseraClient",
    "WriteResult",
    "WriteSession",
]
