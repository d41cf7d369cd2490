"""sys.catalog decodes a large entry ahead of its apply (docs/design/consensus.md#R11).

Decoding ahead is an optimisation only: whatever it has done, or not done, when the entry is
applied, the state and the answer must be the apply's alone. Each case applies the same entries
to a state that decoded ahead and to one that did not, and compares their snapshots (the same
bytes on every replica) and results.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from service.common.ids import TabletId
from service.master import sys_catalog
from service.master.catalog_records import (
    CatalogWrite,
    Insert,
    Precondition,
    RecordType,
    RequestId,
    RowKey,
)
from service.master.sys_catalog import DECODE_AHEAD_BYTES, DECODE_SLICE, SysCatalogState
from tests.helpers.sys_catalog import Ids, create_table_write, make_table, make_tablets

SERVERS = ["a" * 32, "b" * 32, "c" * 32, "d" * 32]


def _big_create(ids: Ids, name: str) -> bytes:
    """A CreateTable entry large enough to be decoded ahead (several slices of ops)."""
    table = make_table(ids(), name, buckets=40, splits=20)
    data = create_table_write(table, make_tablets(table, ids, servers=SERVERS)).encode()
    assert len(data) >= DECODE_AHEAD_BYTES and len(table.partition_schema.hash) == 1
    return data


def _plain(entries: list[bytes]) -> tuple[bytes, list[object]]:
    state = SysCatalogState()
    results = [state.apply(i, e) for i, e in enumerate(entries, 1)]
    return state.snapshot(), [(r.ok, r.refusal, r.response) for r in results]


def test_an_entry_decoded_ahead_applies_as_one_decoded_at_apply() -> None:
    ids = Ids(3)
    entries = [_big_create(ids, "t1"), _big_create(ids, "t2")]

    async def main() -> tuple[bytes, list[object], list[int]]:
        state = SysCatalogState()
        ended = [state.decode_ahead(i, e) for i, e in enumerate(entries, 1)]
        assert all(f is not None for f in ended)
        await asyncio.gather(*ended)  # type: ignore[arg-type]
        done = [len(state._ahead[i].decoded) for i in (1, 2)]
        results = [state.apply(i, e) for i, e in enumerate(entries, 1)]
        assert state._ahead == {}
        return state.snapshot(), [(r.ok, r.refusal, r.response) for r in results], done

    snapshot, results, done = asyncio.run(main())
    assert done == [801, 801]  # the table and its 800 tablets, every op
    assert (snapshot, results) == _plain(entries)


def test_the_rows_snapshot_elements_are_built_ahead_not_in_the_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit writes a large entry's rows in one piece on the loop; their snapshot
    elements (each row serialized with its version) are built while decoding ahead instead,
    and give the same snapshot."""
    ids = Ids(5)
    entries = [_big_create(ids, "t1")]

    async def main() -> bytes:
        state = SysCatalogState()
        ended = state.decode_ahead(1, entries[0])
        assert ended is not None
        await ended

        def not_at_commit(*_: object) -> bytes:
            raise AssertionError("a snapshot element built at apply")

        monkeypatch.setattr(sys_catalog, "_snapshot_element", not_at_commit)
        assert state.apply(1, entries[0]).ok
        monkeypatch.undo()
        return state.snapshot()

    assert asyncio.run(main()) == _plain(entries)[0]


def test_a_decoding_not_finished_at_apply_is_completed_there() -> None:
    """On a starved host the commit can come before the decoding ends: apply takes the ops
    decoded so far and decodes the rest itself."""
    ids = Ids(4)
    entries = [_big_create(ids, "t1")]

    async def main() -> tuple[bytes, int]:
        state = SysCatalogState()
        ended = state.decode_ahead(1, entries[0])
        assert ended is not None
        await asyncio.sleep(0)  # the first slice
        await asyncio.sleep(0)
        partial = len(state._ahead[1].decoded)
        result = state.apply(1, entries[0])
        assert result.ok and ended.done() and state._ahead == {}
        return state.snapshot(), partial

    snapshot, partial = asyncio.run(main())
    assert 0 < partial < 801 and partial % DECODE_SLICE == 0
    assert snapshot == _plain(entries)[0]


def test_an_overwritten_entry_is_not_applied_from_its_old_decoding() -> None:
    """A new leader may overwrite an appended entry at the same index: the bytes applied are
    the new ones, and a decoding of the old ones is not used for them."""
    ids = Ids(5)
    first, second = _big_create(ids, "old"), _big_create(ids, "new")

    async def main() -> tuple[bytes, object]:
        state = SysCatalogState()
        old = state.decode_ahead(1, first)
        assert old is not None
        await old
        result = state.apply(1, second)  # the entry at index 1 turned out to be `second`
        assert result.ok
        return state.snapshot(), state.table_by_name("new")

    snapshot, table = asyncio.run(main())
    assert table is not None
    assert snapshot == _plain([second])[0]


def test_an_entry_decoded_ahead_is_refused_as_at_apply() -> None:
    """A bad record in a large entry: the decoding stops there, and apply refuses the entry
    with the refusal it gives without decoding ahead (naming the op), changing nothing."""
    ids = Ids(6)
    table = make_table(ids(), "bad", buckets=40, splits=20)
    tablets = make_tablets(table, ids, servers=SERVERS)
    tablets[500] = dataclasses.replace(tablets[500], tablet_id=TabletId("not-a-uuid"))
    data = create_table_write(table, tablets).encode()
    assert len(data) >= DECODE_AHEAD_BYTES

    async def main() -> tuple[object, bytes, int]:
        state = SysCatalogState()
        ended = state.decode_ahead(1, data)
        assert ended is not None
        await ended
        decoded = len(state._ahead[1].decoded)
        result = state.apply(1, data)
        return result.refusal, state.snapshot(), decoded

    refusal, snapshot, decoded = asyncio.run(main())
    assert decoded == 501  # the table and tablets 0..499: it stopped at the bad one
    plain_snapshot, plain_results = _plain([data])
    assert refusal is not None and "not-a-uuid" in refusal.message
    assert (snapshot, [(False, refusal, b"")]) == (plain_snapshot, plain_results)


def test_small_entries_and_applied_indexes_are_not_decoded_ahead() -> None:
    ids = Ids(7)
    table = make_table(ids(), "small")
    small = create_table_write(table, make_tablets(table, ids)).encode()
    big = _big_create(ids, "big")

    async def main() -> None:
        state = SysCatalogState()
        assert state.decode_ahead(1, small) is None
        assert state.apply(1, small).ok
        assert state.decode_ahead(1, big) is None  # index 1 is applied already
        assert state.decode_ahead(2, b"\xff garbage") is None  # apply refuses it
        assert state._ahead == {}
        ended = state.decode_ahead(3, big)
        assert ended is not None
        assert not state.apply(2, b"\xff garbage").ok
        assert state.apply(3, big).ok and ended.done() and state._ahead == {}

    asyncio.run(main())


def test_decodings_of_entries_never_applied_are_dropped() -> None:
    """Entries appended but truncated away (never applied at their index) leave nothing
    behind once a later entry applies, and their waiters are released."""
    ids = Ids(8)
    big = _big_create(ids, "big")
    small = [CatalogWrite(ops=(Insert(make_table(ids(), f"x{i}")),)).encode() for i in range(3)]

    async def main() -> None:
        state = SysCatalogState()
        ended = state.decode_ahead(2, big)
        assert ended is not None
        assert state.apply(1, small[0]).ok
        assert 2 in state._ahead
        assert state.apply(2, small[1]).ok  # index 2 became a small entry
        assert state._ahead == {} and ended.done()
        late = state.decode_ahead(5, big)
        assert late is not None
        assert state.apply(3, small[2]).ok and 5 in state._ahead
        state.restore(state.snapshot())  # decodings are of bytes: kept across a restore
        assert 5 in state._ahead

    asyncio.run(main())


def test_a_write_encoded_in_parts_is_the_same_bytes() -> None:
    """The leader encodes a large write in slices (`CatalogWrite.encode_parts`); joined, they
    must be the one-piece encoding, every field included, whatever the slice."""
    ids = Ids(9)
    table = make_table(ids(), "parts", buckets=4, splits=3)
    write = dataclasses.replace(
        create_table_write(
            table, make_tablets(table, ids, servers=SERVERS), RequestId("c" * 32, 7, 5, 2)
        ),
        expected=(Precondition(RowKey(RecordType.TABLE, table.table_id), 3),),
    )
    one = write.encode()
    for n in (1, 5, 12, 13, 1000, 0):
        parts = list(write.encode_parts(n))
        assert b"".join(parts) == one, n
        assert len(parts) == -(-len(write.ops) // max(1, n)) + 1
    empty = CatalogWrite(operation="Nothing")
    assert b"".join(empty.encode_parts(10)) == empty.encode()
