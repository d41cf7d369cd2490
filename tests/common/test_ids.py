"""Ids: one NodeId type, uuid generation and validation."""

from __future__ import annotations

import re
import uuid

import pytest

from service.common import ids
from service.common.errors import InvalidArgument
from service.common.ids import TableId, TabletId, new_uuid, validate_node_id, validate_uuid
from service.raft import types as raft_types


def test_node_id_is_the_raft_one() -> None:
    assert ids.NodeId is raft_types.NodeId


def test_new_uuid_is_32_lowercase_hex_and_fresh() -> None:
    made = {new_uuid() for _ in range(1000)}
    assert len(made) == 1000
    for u in made:
        assert re.fullmatch(r"[0-9a-f]{32}", u)
        assert uuid.UUID(hex=u).version == 4
        assert validate_uuid(u) == u


def test_validate_uuid_canonicalizes() -> None:
    u = uuid.uuid4()
    assert validate_uuid(str(u)) == u.hex
    assert validate_uuid(u.hex.upper()) == u.hex
    assert validate_uuid(str(u).upper()) == u.hex


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        "g" * 32,
        "0" * 31,
        "0" * 33,
        "0" * 32 + "\n",
        "0000000-00000-0000-0000-000000000000",  # dashes in the wrong places
        "0" * 32 + "----",
        " " + "0" * 31,
    ],
)
def test_validate_uuid_rejects_naming_the_value(bad: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_uuid(bad)
    assert repr(bad) in info.value.message


def test_validate_node_id() -> None:
    for good in ("n1", "master-2", "ts_3.local", new_uuid(), "a" * 64):
        assert validate_node_id(good) == good
    for bad in ("", "-n1", "has space", "a/b", "a:b", "a" * 65, "n1\n"):
        with pytest.raises(InvalidArgument) as info:
            validate_node_id(bad)
        assert repr(bad) in info.value.message


def test_newtypes_are_strings_at_run_time() -> None:
    assert TableId("t") == "t" and TabletId("x") == "x"
