"""Identifiers shared across Tessera, as `NewType`s over `str`.

A `NewType` costs nothing at run time and lets mypy catch a tablet id passed where a table id is
expected. All ids are strings on the wire and on disk.

* `NodeId` is the permanent uuid of a node (a master or a tablet server). The pure Raft core
  (`service.raft.types`) uses this one type, so a peer id means the same thing everywhere.
  The amnesia rule (docs/design/consensus.md#R9) rests on it: every RPC names its recipient's uuid,
  and a node that lost its disk takes a new one.
* `TableId` and `TabletId` name catalog objects (docs/design/catalog.md). Like Kudu, freshly made
  ids are uuid4s written as 32 lowercase hex digits (`new_uuid`).

Two validators, because two kinds of string reach us:

* `validate_uuid` is strict: a generated id (table, tablet, node instance) must be a uuid. It
  accepts the 36-character dashed form and upper case too, and returns the canonical form.
* `validate_node_id` is permissive: node ids in configuration, tests and the demo may be readable
  tokens ("n1", "master-2"); a generated uuid is one such token.
"""

from __future__ import annotations

import re
import uuid
from typing import NewType

from service.common.errors import InvalidArgument

__all__ = [
    "NodeId",
    "TableId",
    "TabletId",
    "new_uuid",
    "validate_node_id",
    "validate_uuid",
]

NodeId = NewType("NodeId", str)
"""A node's permanent uuid. Messages name their destination by it (the amnesia rule,
docs/design/consensus.md#R9)."""

TableId = NewType("TableId", str)
"""A table's id: a uuid, fixed at CreateTable and never reused (names may be)."""

TabletId = NewType("TabletId", str)
"""A tablet's id: a uuid; also the id of the tablet's Raft group."""

_UUID_RE = re.compile(r"[0-9a-f]{32}")
_NODE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def new_uuid() -> str:
    """A fresh random uuid as 32 lowercase hex digits (Kudu's format)."""
    return uuid.uuid4().hex


def validate_uuid(s: str) -> str:
    """`s` in canonical form (32 lowercase hex digits), or InvalidArgument naming the value.

    Accepts the dashed form ("8c4b...-...") and upper case, so ids pasted by people work.
    """
    if isinstance(s, str):
        candidate = s.lower()
        if len(s) == 36 and _is_dashed(s):
            candidate = candidate.replace("-", "")
        if _UUID_RE.fullmatch(candidate):
            return candidate
    raise InvalidArgument(f"invalid uuid {s!r}: expected 32 hex digits")


def _is_dashed(s: str) -> bool:
    return [len(part) for part in s.split("-")] == [8, 4, 4, 4, 12]


def validate_node_id(s: str) -> NodeId:
    """`s` as a `NodeId`, or InvalidArgument naming the value.

    A node id is 1 to 64 characters of letters, digits, '.', '_' and '-', starting with a letter
    or digit: wide enough for readable test names, narrow enough to be safe in file names, log
    lines and gRPC metadata.
    """
    if not isinstance(s, str) or not _NODE_ID_RE.fullmatch(s):
        raise InvalidArgument(
            f"invalid node id {s!r}: expected 1-64 letters, digits, '.', '_' or '-'"
        )
    return NodeId(s)
