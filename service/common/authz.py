"""Who may call what: per-servicer policies, checked on every RPC before its handler runs.

Theory of operation
-------------------
Every servicer class declares `POLICY`, a mapping from RPC method name to a `Rule`. A server in
secure mode gives each servicer an `Authorizer` (`servicer.authorizer = Authorizer(POLICY,
secure=True)`); `rpc_errors` (service/common/errors.py), which wraps every handler, asks it
before the handler runs, with the caller's identity taken from its verified client certificate
(`service/common/tls.py`). A refusal is an ordinary error: PERMISSION_DENIED naming the caller,
the method and who may call it, or UNAUTHENTICATED without a certificate; nothing runs.

Default deny: a method a policy does not name is refused to everyone, so an RPC added without
a rule cannot be called until someone decides who may.

Roles (`service/common/pki.py`): `master`, `tserver` (servers, by their uuid), `admin` (people
and tools that run DDL, membership changes and repairs), `user` (reads and writes data). A rule
is a set of roles, optionally with a check of the request against the identity (a heartbeat's
uuid must be the certificate's).

In insecure mode every caller is `INSECURE_PEER` and every rule allows it: that mode exists
only for comparison runs.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc.aio

from service.common.errors import PermissionDenied
from service.common.pki import Identity
from service.common.tls import INSECURE_PEER, peer_identity

__all__ = ["ADMIN", "ANYONE", "TSERVERS", "Authorizer", "Rule", "allow"]

RequestCheck = Callable[[Any, Identity], str | None]
"""(request, caller) -> None when the request may be made by this caller, else why not."""


@dataclass(frozen=True)
class Rule:
    """Who may call one method: any of `roles`, and then `check` (if any) must pass."""

    roles: frozenset[str]
    check: RequestCheck | None = None

    def describe(self) -> str:
        return " or ".join(sorted(self.roles))


def allow(*roles: str, check: RequestCheck | None = None) -> Rule:
    return Rule(frozenset(roles), check)


ANYONE = allow("master", "tserver", "admin", "user")
"""Any authenticated party (reads of metadata, Ping)."""
ADMIN = allow("admin")
TSERVERS = allow("tserver")


_CALLER: contextvars.ContextVar[tuple[object, Identity] | None] = contextvars.ContextVar(
    "tessera_caller", default=None
)
"""The current call's (context, identity) (`Authorizer.identity`)."""


class Authorizer:
    """Checks calls against one servicer's policy (module docstring)."""

    def __init__(self, policy: Mapping[str, Rule], *, secure: bool) -> None:
        self.policy = dict(policy)
        self.secure = secure

    def identity(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        """The caller of the call `context` belongs to, read once per call: the admission
        check and the handler (twice, for a user's GetTableLocations) ask for it, and each
        read of the peer certificate copies the connection's whole auth context, which cost
        a measurable share of a secured master's lookup rate. gRPC runs each call in its own
        asyncio task, so the memo (a context variable) is the call's alone; it is keyed by
        the context object too, in case a task ever serves more than one call."""
        memo = _CALLER.get()
        if memo is not None and memo[0] is context:
            return memo[1]
        who = peer_identity(context, self.secure)
        _CALLER.set((context, who))
        return who

    def check(
        self,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        who: Identity | None = None,
    ) -> None:
        """Raise PermissionDenied (or Unauthenticated) unless the caller may call `method`
        with `request` (None for a streaming request, checked by the handler itself). `who`:
        the caller's identity when the handler already has it (`identity(context)`, once per
        stream: a heartbeat stream's peer does not change, and reading it is a copy of the
        connection's auth context each time)."""
        if who is None:
            who = self.identity(context)
        if who is INSECURE_PEER:
            return
        rule = self.policy.get(method)
        if rule is None:
            raise PermissionDenied(f"{method}: not callable by anyone (no rule; default deny)")
        if who.role not in rule.roles:
            raise PermissionDenied(
                f"{method}: {who} may not call it; it is for {rule.describe()} certificates"
            )
        if rule.check is not None and request is not None:
            why = rule.check(request, who)
            if why:
                raise PermissionDenied(f"{method}: refused for {who}: {why}")
