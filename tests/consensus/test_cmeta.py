"""Consensus metadata: durable save/load, corruption detection, crash safety, the merge of
docs/design/tablet_copy.md#R5."""

from __future__ import annotations

import json
import os
import random

import pytest

from service.consensus.cmeta import (
    CmetaCorruption,
    CmetaStore,
    ConsensusMetadata,
    merge_remote,
)
from service.consensus.fs import FileSystem, RealFileSystem
from service.raft.types import NO_NODE, NodeId, RaftConfig
from service.testing.simdisk import SimFileSystem

A, B, C, D = (NodeId(x) for x in ("uuid-a", "uuid-b", "uuid-c", "uuid-d"))
CONFIG_ABC = RaftConfig(frozenset({A, B, C}), index=0)
CONFIG_ABCD = RaftConfig(frozenset({A, B, C}), frozenset({D}), index=42)
ADDRS: dict[str, str] = {A: "10.0.0.1:7051", B: "10.0.0.2:7051", C: "10.0.0.3:7051"}


def meta(term: int, vote: NodeId = NO_NODE, uuid: str = A, **kw: object) -> ConsensusMetadata:
    return ConsensusMetadata(
        term=term,
        vote=vote,
        config=kw.get("config", CONFIG_ABC),  # type: ignore[arg-type]
        addresses=kw.get("addresses", ADDRS),  # type: ignore[arg-type]
        uuid=uuid,
    )


@pytest.fixture(params=["sim", "real"])
def store(request: pytest.FixtureRequest) -> tuple[FileSystem, CmetaStore]:
    if request.param == "sim":
        fs: FileSystem = SimFileSystem()
        d = "/node/consensus-meta"
    else:
        fs = RealFileSystem()
        d = os.path.join(str(request.getfixturevalue("tmp_path")), "consensus-meta")
    fs.makedirs(d)
    return fs, CmetaStore(fs, os.path.join(d, "tablet-1"))


def test_save_and_load(store: tuple[FileSystem, CmetaStore]) -> None:
    _, s = store
    assert s.load() is None
    m = meta(5, B, config=CONFIG_ABCD, addresses={**ADDRS, D: "[::1]:7051"})
    s.save(m)
    assert s.load() == m
    m2 = meta(6, NO_NODE, config=CONFIG_ABCD)
    s.save(m2)
    assert s.load() == m2


def test_addresses_are_a_private_read_only_copy() -> None:
    addrs = dict(ADDRS)
    m = meta(1, addresses=addrs)
    addrs[D] = "elsewhere:1"
    assert D not in m.addresses
    with pytest.raises(TypeError):
        m.addresses[D] = "x"  # type: ignore[index]


def test_invalid_metadata_is_refused() -> None:
    with pytest.raises(ValueError):
        meta(-1)
    with pytest.raises(ValueError):
        meta(1, uuid="")


def test_crc_mismatch_is_detected(store: tuple[FileSystem, CmetaStore]) -> None:
    fs, s = store
    s.save(meta(5, B))
    doc = json.loads(fs.read_bytes(s.path))
    doc["body"]["term"] = 4  # a term rolled back behind the CRC's back
    fs.write_atomic(s.path, json.dumps(doc).encode())
    with pytest.raises(CmetaCorruption, match="CRC") as info:
        s.load()
    assert s.path in str(info.value)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\xff\xfe garbage",
        b"[1, 2]",
        b'{"format_version": 99, "crc32c": 0, "body": {}}',
    ],
)
def test_unreadable_files_are_corruption(
    store: tuple[FileSystem, CmetaStore], content: bytes
) -> None:
    fs, s = store
    fs.write_atomic(s.path, content)
    with pytest.raises(CmetaCorruption) as info:
        s.load()
    assert s.path in str(info.value)


def test_bit_flip_in_the_file_is_detected() -> None:
    fs = SimFileSystem()
    fs.makedirs("/m")
    s = CmetaStore(fs, "/m/cmeta")
    s.save(meta(12345, B))
    data = fs.read_bytes("/m/cmeta")
    offset = data.index(b"12345")
    fs.corrupt("/m/cmeta", offset, b"9")
    with pytest.raises(CmetaCorruption, match="/m/cmeta"):
        s.load()


def test_crash_during_save_leaves_old_or_new_never_a_mix() -> None:
    old, new = meta(3, B), meta(4, C, config=CONFIG_ABCD)
    outcomes = set()
    for seed in range(30):
        rng = random.Random(seed)
        fs = SimFileSystem()
        fs.makedirs("/m")
        s = CmetaStore(fs, "/m/cmeta")
        s.save(old)
        # Fail one of write_atomic's two fsyncs (temporary file, directory), or none.
        step = rng.choice([0, 1, None])
        if step is not None:
            fs.fail_next_sync("/m", skip=step)
            with pytest.raises(OSError):
                s.save(new)
        else:
            s.save(new)
        fs.crash(rng)
        got = s.load()
        assert got == (old if step is not None else new)
        outcomes.add(got.term if got else None)
    assert outcomes == {3, 4}


# --- merge (docs/design/tablet_copy.md#R5) ------------------------------------------------------

REMOTE_ADDRS: dict[str, str] = {**ADDRS, D: "10.0.0.4:7051"}

MERGE_CASES = [
    # (name, local (term, vote), remote (term, vote), expected (term, vote))
    ("remote term higher: adopt it, no vote in it yet", (3, B), (5, C), (5, NO_NODE)),
    ("remote term lower: keep local term and vote", (5, B), (3, C), (5, B)),
    ("same term: keep the local vote", (4, B), (4, C), (4, B)),
    ("same term, no local vote: still no vote", (4, NO_NODE), (4, C), (4, NO_NODE)),
    ("remote term lower, no local vote", (7, NO_NODE), (2, B), (7, NO_NODE)),
    ("remote term higher with a vote of its own", (0, NO_NODE), (9, A), (9, NO_NODE)),
]


@pytest.mark.parametrize(
    ("local_tv", "remote_tv", "expected_tv"),
    [c[1:] for c in MERGE_CASES],
    ids=[c[0] for c in MERGE_CASES],
)
def test_merge_rules(
    local_tv: tuple[int, NodeId], remote_tv: tuple[int, NodeId], expected_tv: tuple[int, NodeId]
) -> None:
    local = meta(*local_tv, uuid=A, config=CONFIG_ABC, addresses=ADDRS)
    remote = meta(*remote_tv, uuid=B, config=CONFIG_ABCD, addresses=REMOTE_ADDRS)
    merged = merge_remote(local, remote)
    assert (merged.term, merged.vote) == expected_tv
    assert merged.term >= local.term  # rule 1: terms never go back
    assert merged.config == CONFIG_ABCD  # rule 3: always the remote's membership
    assert dict(merged.addresses) == REMOTE_ADDRS
    assert merged.uuid == A  # our own identity


def test_merge_without_local_metadata() -> None:
    remote = meta(6, C, uuid=B, config=CONFIG_ABCD, addresses=REMOTE_ADDRS)
    merged = merge_remote(None, remote, uuid=D)
    assert merged == ConsensusMetadata(6, NO_NODE, CONFIG_ABCD, REMOTE_ADDRS, D)
    with pytest.raises(ValueError):
        merge_remote(None, remote)  # whose metadata would it be?
    with pytest.raises(ValueError):
        merge_remote(meta(1, uuid=A), remote, uuid=D)  # a different node's metadata
