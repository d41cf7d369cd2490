"""Tessera tables created from Spark: `create_table(...)`, and `df.write` with `create_if_missing`.

    from spark_jobs.tables import create_table
    create_table("events", df, masters="h1:7051", key="id", hash=["id:4"], replicas=3)
    df.write.format("tessera").option("masters", ...).option("table", "events")
        .option("create_if_missing", "true").option("key", "id").option("hash", "id:4").save()

A Spark schema (a `StructType`, or a DataFrame's) maps to a Tessera schema column for column:
booleans, integers of 8 to 64 bits, floats, doubles, strings, binaries, timestamps (with or
without a time zone: instants), dates and decimals of precision up to 38 (`Schema.from_arrow`).
Key columns come first, in key order, and are NOT NULL; the others keep their order and Spark's
nullability. A type with no Tessera counterpart (arrays, maps, structs, intervals) is refused
naming the column, and so is a partitioning that does not fit the schema, before anything is
created (the master validates the whole request first; CREATE TABLE is exactly once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql.types import StructType

from service.client.meta_cache import TableHandle
from service.client.sync import SyncClient
from service.common.errors import InvalidArgument
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import Schema

__all__ = ["create_table", "partition_schema", "tessera_schema"]


def tessera_schema(schema: StructType | Any, key: str | Sequence[str]) -> Schema:
    """The Tessera schema of a Spark schema (or a DataFrame's), with `key` as its primary key;
    InvalidArgument naming a column whose type has no Tessera counterpart."""
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = schema if isinstance(schema, StructType) else schema.schema
    keys = _names(key, "key")
    if not keys:
        raise InvalidArgument("key: name the primary key column(s)")
    for f in struct.fields:
        try:
            to_arrow_schema(StructType([f]))
        except Exception as e:  # pyspark raises its own error types for types Arrow lacks
            raise InvalidArgument(
                f"column {f.name!r}: Spark type {f.dataType.simpleString()} has no Tessera "
                f"type ({type(e).__name__})"
            ) from None
    try:
        return Schema.from_arrow(to_arrow_schema(struct), keys)
    except InvalidArgument as e:
        raise InvalidArgument(f"the Spark schema: {e}") from None


def partition_schema(
    schema: Schema, hash: Sequence[str] | str = (), range: Sequence[str] | str = ()
) -> PartitionSchema:
    """Hash dimensions as the CLI writes them ("COL[,COL]:BUCKETS[:SEED]", several as a list
    or separated by ';') and range columns ("a,b" or a list). No hash and no range: a range
    over the key, one tablet."""
    from service.tools.table_syntax import parse_hash

    dims = [hash] if isinstance(hash, str) else list(hash)
    parts = [p for d in dims for p in d.split(";") if p.strip()]
    hashes: tuple[HashBucketSchema, ...] = tuple(parse_hash(p) for p in parts)
    cols = _names(range, "range")
    for c in [c for h in hashes for c in h.columns] + list(cols):
        if not schema.has_column(c):
            raise InvalidArgument(f"partitioning: no column {c!r} in the schema")
    return PartitionSchema(hash=hashes, range=RangeSchema(tuple(cols)))


def create_table(
    name: str,
    schema: StructType | Any,
    *,
    masters: str | Sequence[str],
    key: str | Sequence[str],
    hash: Sequence[str] | str = (),
    range: Sequence[str] | str = (),
    replicas: int = 3,
    credentials: str | None = None,
    client: SyncClient | None = None,
) -> TableHandle:
    """Create Tessera table `name` from a Spark schema or DataFrame (module docstring); its
    handle once it is RUNNING. `credentials`: a credentials directory (default: as the
    `tessera` source finds them, $TESSERA_CREDENTIALS)."""
    ts = tessera_schema(schema, key)
    ps = partition_schema(ts, hash, range)
    if client is None:
        from service.client.credentials import find_credentials

        addresses = masters.split(",") if isinstance(masters, str) else list(masters)
        client = SyncClient.shared(
            tuple(a.strip() for a in addresses if a.strip()),
            timeout=60.0,
            credentials=find_credentials(credentials),
        )
    client.call("create_table", name, ts, ps, num_replicas=replicas)
    handle: TableHandle = client.call("open_table", name, refresh=True)
    return handle


def _names(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(i.strip() for i in items if i.strip())
    if len(set(out)) != len(out):
        raise InvalidArgument(f"{what}: a column is named twice")
    return out
