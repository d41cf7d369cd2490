"""spark_jobs/delta_log.py on hand-written logs (no JVM): what it reads, and every case it must
leave to Spark. tests/spark/test_audit_writes.py checks it against tables Spark wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs import delta_log

PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
META = {"metaData": {"id": "x", "partitionColumns": [], "format": {"provider": "parquet"}}}


def _add(path: str, **extra: Any) -> dict[str, Any]:
    return {"add": {"path": path, "size": 1, "dataChange": True, **extra}}


def _commit(table: Path, version: int, *actions: dict[str, Any]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"commitInfo": {"operation": "WRITE"}})] + [json.dumps(a) for a in actions]
    (log / f"{version:020}.json").write_text("\n".join(lines) + "\n")


def test_replays_adds_and_removes_version_by_version(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _commit(t, 0, PROTOCOL, META, _add("a.parquet"), _add("b%20c.parquet"))
    _commit(t, 1, {"remove": {"path": "a.parquet"}}, _add("d.parquet"), {"txn": {"appId": "x"}})
    assert delta_log.latest_version(t) == 1
    assert delta_log.snapshot(t, 0) == delta_log.LocalSnapshot(
        0, (str(t / "a.parquet"), str(t / "b c.parquet"))
    )
    assert delta_log.snapshot(t) == delta_log.LocalSnapshot(
        1, (str(t / "b c.parquet"), str(t / "d.parquet"))
    )
    assert delta_log.snapshot(t, 2) is None  # not written yet


def test_starts_from_the_newest_checkpoint_at_or_before_the_version(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _commit(t, 0, PROTOCOL, META, _add("a.parquet"))
    _commit(t, 1, _add("b.parquet"))
    _commit(t, 2, _add("c.parquet"))
    add = pa.struct([("path", pa.string()), ("size", pa.int64())])
    proto = pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())])
    meta = pa.struct([("id", pa.string()), ("partitionColumns", pa.list_(pa.string()))])
    rows = [
        {"add": None, "protocol": {"minReaderVersion": 1, "minWriterVersion": 2}, "metaData": None},
        {"add": None, "protocol": None, "metaData": {"id": "x", "partitionColumns": []}},
        {"add": {"path": "b.parquet", "size": 1}, "protocol": None, "metaData": None},
    ]
    schema = pa.schema([("add", add), ("protocol", proto), ("metaData", meta)])
    pq.write_table(
        pa.Table.from_pylist(rows, schema), t / "_delta_log" / f"{1:020}.checkpoint.parquet"
    )
    (t / "_delta_log" / f"{0:020}.json").unlink()  # cleaned up: the checkpoint stands for it
    (t / "_delta_log" / f"{1:020}.json").unlink()
    assert delta_log.snapshot(t) == delta_log.LocalSnapshot(
        2, (str(t / "b.parquet"), str(t / "c.parquet"))
    )
    assert delta_log.snapshot(t, 0) is None  # its commit is gone


def test_leaves_every_table_it_does_not_fully_understand_to_spark(tmp_path: Path) -> None:
    cases: dict[str, list[dict[str, Any]]] = {
        "deletion vectors": [
            PROTOCOL,
            META,
            _add("a.parquet", deletionVector={"storageType": "u"}),
        ],
        "reader version 3": [
            {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}},
            META,
            _add("a.parquet"),
        ],
        "partitioned": [
            PROTOCOL,
            {"metaData": {"id": "x", "partitionColumns": ["day"]}},
            _add("day=1/a.parquet"),
        ],
        "an unknown action": [PROTOCOL, META, {"checkpointMetadata": {"version": 0}}],
        "a file elsewhere": [PROTOCOL, META, _add("s3://bucket/a.parquet")],
        "no protocol": [META, _add("a.parquet")],
    }
    for name, actions in cases.items():
        t = tmp_path / name.replace(" ", "-")
        _commit(t, 0, *actions)
        assert delta_log.snapshot(t) is None, name
    gap = tmp_path / "gap"
    _commit(gap, 0, PROTOCOL, META, _add("a.parquet"))
    _commit(gap, 2, _add("b.parquet"))  # version 1 missing
    assert delta_log.latest_version(gap) == 2 and delta_log.snapshot(gap) is None
    assert delta_log.latest_version(tmp_path / "nothing") is None
    assert delta_log.snapshot(tmp_path / "nothing") is None


def test_local_dir_takes_paths_and_file_uris_only() -> None:
    assert delta_log.local_dir("/w/t") == Path("/w/t")
    assert delta_log.local_dir("file:/w/a%20b") == Path("/w/a b")
    assert delta_log.local_dir("file:///w/t") == Path("/w/t")
    assert delta_log.local_dir("hdfs://nn/w/t") is None


def test_a_commit_gives_its_commit_info_and_the_files_it_added(tmp_path: Path) -> None:
    t = tmp_path / "t"
    _commit(t, 0, PROTOCOL, META, _add("a.parquet"))
    info = {"operation": "WRITE", "userMetadata": "m", "operationMetrics": {"numOutputRows": "3"}}
    log = t / "_delta_log"
    lines = [{"commitInfo": info}, {"remove": {"path": "a.parquet"}}, _add("b%20c.parquet")]
    (log / f"{1:020}.json").write_text("\n".join(json.dumps(a) for a in lines) + "\n")
    assert delta_log.commit(t) == delta_log.LocalCommit(1, info, (str(t / "b c.parquet"),))
    assert delta_log.commit(t, 0) == delta_log.LocalCommit(
        0, {"operation": "WRITE"}, (str(t / "a.parquet"),)
    )
    assert delta_log.commit(t, 2) is None  # not written
    _commit(t, 2, _add("p.parquet", partitionValues={"x": "1"}))
    assert delta_log.commit(t, 2) is None  # partitioned: left to Spark
    (log / f"{3:020}.json").write_text("{not json\n")
    assert delta_log.commit(t, 3) is None
    assert delta_log.commit(tmp_path / "none") is None
