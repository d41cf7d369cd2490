"""Per-table authorization on the master: who may see, read, write or alter which table, and
the authz tokens that carry that decision to tablet servers.

Theory of operation
-------------------
The servicers' policies (`service/common/authz.py`) decide by role which RPCs a caller may make
at all. This module adds the per-table decision for callers with the `user` role:

* admins, masters and tablet servers hold every privilege on every table: they are the
  cluster's own parties, and their policies already bound what they may call (a tablet server
  cannot call AlterTable, whatever this module says);
* a user holds exactly what sys.catalog's grant rows give them on that table (`tessera grant`),
  nothing by default. A user without any privilege on a table is told it may not see it, the
  same whether the table exists or not;
* insecure mode (comparison runs) allows everything, as every policy does there.

A user's table reads (schema, locations, Is*Done) need any privilege on the table, AlterTable
needs `alter`; ListTables shows a user only the tables they hold a privilege on.

Authz tokens (`service/common/tokens.py`): GetTableLocations hands a user a token naming them,
the table and the privileges they hold, signed with the current token signing key. Tablet
servers check Write and Scan against it without asking a master. A token is reused while at
least half of its lifetime is left, so a client's repeated lookups cost no signing and tablet
servers' verification memo keeps hitting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.common.errors import PermissionDenied
from service.common.pki import Identity
from service.common.tls import INSECURE_PEER
from service.common.tokens import AuthzClaim, Privilege
from service.master.security import TokenSigningKeys, sign_token
from service.master.sys_catalog import SysCatalogState

__all__ = ["ALL_PRIVILEGES", "TableAccess"]

ALL_PRIVILEGES = frozenset(Privilege)


@dataclass(frozen=True)
class _Issued:
    token: bytes
    reuse_until_us: int


class TableAccess:
    """Per-table decisions for one master (module docstring). `sys_catalog` is this master's
    replica of the catalog; `now_us` the wall clock in microseconds."""

    def __init__(
        self,
        sys_catalog: SysCatalogState,
        *,
        token_ttl_s: float,
        now_us: Callable[[], int],
        policy: TokenSigningKeys | None = None,
    ) -> None:
        self._sys = sys_catalog
        self._ttl_us = int(token_ttl_s * 1_000_000)
        self._now_us = now_us
        self._policy = policy or TokenSigningKeys()
        self._issued: dict[tuple[str, str, frozenset[Privilege]], _Issued] = {}

    @staticmethod
    def is_user(who: Identity) -> bool:
        return who is not INSECURE_PEER and who.role == "user"

    def privileges(self, who: Identity, table_id: str) -> frozenset[Privilege]:
        """What `who` may do to table `table_id`."""
        if not self.is_user(who):
            return ALL_PRIVILEGES
        row = self._sys.grant(table_id, who.name)
        return row.record.privileges if row is not None else frozenset()

    def require(
        self, who: Identity, table_id: str, table_name: str, needed: Privilege | None = None
    ) -> frozenset[Privilege]:
        """The privileges `who` holds on the table; PermissionDenied unless they include
        `needed` (None: any privilege at all, the bar for seeing the table)."""
        held = self.privileges(who, table_id)
        if needed is None and not held:
            raise PermissionDenied(
                f"{who} holds no privilege on table {table_name!r} (an admin grants them: "
                "tessera grant)"
            )
        if needed is not None and needed not in held:
            raise PermissionDenied(
                f"{who} lacks the {needed.value!r} privilege on table {table_name!r}"
            )
        return held

    def authz_token(self, who: Identity, table_id: str, table_name: str) -> bytes:
        """An authz token for a user's access to the table (b"" for other callers, who need
        none); PermissionDenied if they hold nothing on it."""
        if not self.is_user(who):
            return b""
        held = self.require(who, table_id, table_name)
        key = (who.name, table_id, held)
        now = self._now_us()
        issued = self._issued.get(key)
        if issued is not None and now < issued.reuse_until_us:
            return issued.token
        signing = self._policy.current_key([r.record for r in self._sys.signing_keys()], now)
        ttl = min(self._ttl_us, signing.expire_time_us - now)
        token = sign_token(signing, AuthzClaim(who.name, table_id, held).payload(), now, ttl)
        if len(self._issued) >= 10_000:
            self._issued.clear()
        self._issued[key] = _Issued(token, now + ttl // 2)
        return token
