"""Status pages and /metrics of real processes, read over HTTP, for the integration tests.

`fetch` GETs a page; `parse_metrics` parses the Prometheus text format strictly into `Family`s
and `metrics_of` fetches and parses a process's /metrics; `create_table` creates a table through
a MiniCluster's master leader and waits until every tablet has a leader; `wait_for` polls.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import SCHEMA

T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll `fn` until it returns something truthy, and return that; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def fetch(address: str, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET http://address/path."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode("utf-8")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


@dataclass
class Family:
    """One metric family of /metrics: its TYPE and its samples (name, labels, value)."""

    kind: str
    samples: list[tuple[str, dict[str, str], float]]

    def value(self, name: str | None = None, **labels: str) -> float:
        """The one sample named `name` (default: the family) with these labels."""
        found = [
            v
            for n, ls, v in self.samples
            if (name is None or n == name) and all(ls.get(k) == x for k, x in labels.items())
        ]
        assert len(found) == 1, (name, labels, self.samples)
        return found[0]

    def total(self, name: str | None = None, **labels: str) -> float:
        """The sum of the samples named `name` (default: all) with these labels."""
        return sum(
            v
            for n, ls, v in self.samples
            if (name is None or n == name) and all(ls.get(k) == x for k, x in labels.items())
        )


def parse_metrics(text: str) -> dict[str, Family]:
    """The Prometheus text format 0.0.4, strictly: every line is a comment or a sample of the
    family its TYPE line declared (histograms' _bucket/_sum/_count included)."""
    families: dict[str, Family] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert name not in families, f"family {name} declared twice"
            families[name] = Family(kind, [])
            current = name
            continue
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, label_text, value = m.groups()
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        family = families.get(name) or families.get(base)
        assert family is not None and name.startswith(current), f"{name} outside its family"
        labels = {}
        if label_text:
            pairs = _LABEL.findall(label_text)
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == label_text, label_text
            labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in pairs}
        family.samples.append((name, labels, float(value)))
    return families


def metrics_of(address: str) -> dict[str, Family]:
    """GET http://address/metrics, check it is the Prometheus text format, and parse it."""
    status, content_type, body = fetch(address, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return parse_metrics(body)


def _leader(stubs: dict[str, master_pb2_grpc.MasterServiceStub]) -> str | None:
    """The address of a master that leads and answers ListTables, or None."""
    for address, stub in stubs.items():
        try:
            if stub.ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=1).role != pb.LEADER:
                continue
            stub.ListTables(pb.ListTablesRequestPB(), timeout=1)
            return address
        except grpc.RpcError:
            continue
    return None


def create_table(
    cluster: MiniCluster, name: str, buckets: int, replicas: int
) -> tuple[str, str, pb.GetTableLocationsResponsePB]:
    """Create `name` through the master leader and wait until RUNNING: (leader address,
    table id, locations)."""
    channels = [cluster.sync_channel(a) for a in cluster.master_addresses]
    try:
        stubs = {
            a: master_pb2_grpc.MasterServiceStub(c)
            for a, c in zip(cluster.master_addresses, channels, strict=True)
        }
        leader = wait_for("a serving master leader", lambda: _leader(stubs))
        m = stubs[leader]
        partitioning = PartitionSchema(
            hash=(HashBucketSchema(("id",), buckets),), range=RangeSchema(())
        )
        created = m.CreateTable(
            pb.CreateTableRequestPB(
                request_id=pb.RequestIdPB(client_id="status-pages", seq_no=1),
                name=name,
                schema=schema_to_pb(SCHEMA),
                partition_schema=partition_schema_to_pb(partitioning, SCHEMA),
                num_replicas=replicas,
            ),
            timeout=10,
        )
        table = pb.TableIdentifierPB(table_id=created.table_id)
        wait_for(
            "every tablet RUNNING",
            lambda: m.IsCreateTableDone(pb.IsCreateTableDoneRequestPB(table=table), timeout=5).done,
        )

        def located() -> pb.GetTableLocationsResponsePB | None:
            locs = m.GetTableLocations(pb.GetTableLocationsRequestPB(table=table), timeout=5)
            ok = all(
                sum(r.role == pb.LEADER for r in t.replicas) == 1 for t in locs.tablet_locations
            )
            return locs if ok and len(locs.tablet_locations) == buckets else None

        return leader, created.table_id, wait_for("a leader for every tablet", located)
    finally:
        for c in channels:
            c.close()
