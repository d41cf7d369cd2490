"""Per-table grants in sys.catalog: the writes that change them, and their public form.

A grant row (`GrantRecord`, id "<table_id>/<user>") holds the privileges one user has on one
table (`read`, `write`, `alter`; `service/common/tokens.py`). GrantPrivileges adds privileges,
RevokePrivileges removes them, and a grant left with none is deleted rather than stored empty.
Each is ONE replicated write carrying the client's request id, so a retry after a master
failover is answered with the original result instead of being applied twice, like any DDL.

A write expects the grant row at the version read (or absent), so two admins changing one
user's grant cannot lose an update; sys.catalog refuses a grant on a table that is REMOVED by
the time the write applies. DeleteTable deletes the table's grants in its own write
(`grant_deletes`), so a new table that reuses the name starts with none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from service.common.errors import InvalidArgument
from service.common.ids import TableId
from service.common.tokens import Privilege
from service.master.catalog_records import (
    CatalogWrite,
    Delete,
    GrantRecord,
    Precondition,
    RecordType,
    RequestId,
    RowKey,
    RowOp,
    Upsert,
    check_user_name,
    grant_entry_id,
    privileges_from_pb,
    privileges_to_pb,
)
from service.master.sys_catalog import Row
from service.pb import master_pb2 as pb

__all__ = [
    "GRANT_PRIVILEGES",
    "REVOKE_PRIVILEGES",
    "GrantChange",
    "grant_change_write",
    "grant_deletes",
    "grant_pb",
]

GRANT_PRIVILEGES = "GrantPrivileges"
REVOKE_PRIVILEGES = "RevokePrivileges"


@dataclass(frozen=True)
class GrantChange:
    """A checked GrantPrivileges or RevokePrivileges request."""

    user: str
    privileges: frozenset[Privilege]
    revoke: bool

    @property
    def operation(self) -> str:
        return REVOKE_PRIVILEGES if self.revoke else GRANT_PRIVILEGES

    @classmethod
    def from_pb(cls, request: pb.GrantPrivilegesRequestPB, *, revoke: bool) -> GrantChange:
        user = check_user_name(request.user)
        privileges = privileges_from_pb(request.privileges, "privileges")
        if not privileges:
            raise InvalidArgument("privileges: name at least one (read, write, alter)")
        return cls(user, privileges, revoke)


def grant_pb(table_id: str, table_name: str, user: str, held: Iterable[Privilege]) -> pb.GrantPB:
    return pb.GrantPB(
        table_id=table_id, table_name=table_name, user=user, privileges=privileges_to_pb(held)
    )


def _key(table_id: str, user: str) -> RowKey:
    return RowKey(RecordType.GRANT, grant_entry_id(table_id, user))


def grant_change_write(
    table_id: str,
    table_name: str,
    current: Row[GrantRecord] | None,
    change: GrantChange,
    request_id: RequestId,
) -> CatalogWrite:
    """The one write of `change` to the grant `current` (None: the user holds nothing)."""
    held = current.record.privileges if current is not None else frozenset()
    after = held - change.privileges if change.revoke else held | change.privileges
    key = _key(table_id, change.user)
    ops: tuple[RowOp, ...] = ()
    if after:
        ops = (Upsert(GrantRecord(TableId(table_id), change.user, after)),)
    elif current is not None:
        ops = (Delete(key),)
    response = pb.GrantPrivilegesResponsePB(
        grant=grant_pb(table_id, table_name, change.user, after)
    )
    return CatalogWrite(
        ops=ops,
        expected=(Precondition(key, current.version if current is not None else 0),),
        request_id=request_id,
        operation=change.operation,
        response=response.SerializeToString(),
    )


def grant_deletes(
    rows: Iterable[Row[GrantRecord]],
) -> tuple[list[RowOp], list[Precondition]]:
    """Ops and preconditions deleting `rows` (a table's grants, when the table is deleted)."""
    ops: list[RowOp] = []
    expected: list[Precondition] = []
    for row in rows:
        ops.append(Delete(row.key))
        expected.append(Precondition(row.key, row.version))
    return ops, expected
