"""Who may get which certificate from a master, and for how long (cert_issuer.check_request)."""

from __future__ import annotations

import datetime as dt

import pytest

from service.common.errors import InvalidArgument, PermissionDenied
from service.common.pki import Identity
from service.master.cert_issuer import LIMITS, check_request

ADMIN = Identity("admin", "root")
TS = Identity("tserver", "ts-1")
JOIN = Identity("join", "join-1")


def _none(_: str) -> bool:
    return False


@pytest.mark.parametrize(
    ("caller", "role", "name"),
    [
        (ADMIN, "user", "alice"),
        (ADMIN, "admin", "bob"),
        (ADMIN, "join", "join-2"),
        (ADMIN, "tserver", "ts-9"),
        (JOIN, "tserver", "ts-new"),
        (TS, "tserver", "ts-1"),
    ],
)
def test_allowed_requests_get_the_role_default(caller: Identity, role: str, name: str) -> None:
    assert check_request(caller, role, name, 0, _none) == dt.timedelta(seconds=LIMITS[role][0])


@pytest.mark.parametrize(
    ("caller", "role", "name", "why"),
    [
        (ADMIN, "master", "m", "provisioning"),
        (Identity("user", "u"), "user", "u", "may not get a user"),
        (Identity("master", "m"), "user", "u", "may not get a user"),
        (TS, "user", "u", "may not get a user"),
        (TS, "tserver", "ts-2", "only its own"),
        (JOIN, "user", "u", "may not get a user"),
        (JOIN, "join", "j", "may not get a join"),
    ],
)
def test_refused_requests_name_the_reason(caller: Identity, role: str, name: str, why: str) -> None:
    with pytest.raises(PermissionDenied, match=why):
        check_request(caller, role, name, 0, _none)


def test_a_join_credential_enrolls_only_unknown_servers() -> None:
    with pytest.raises(PermissionDenied, match="knows"):
        check_request(JOIN, "tserver", "ts-1", 0, lambda name: name == "ts-1")


def test_validity_is_capped_per_role() -> None:
    assert check_request(ADMIN, "user", "a", 7 * 86_400, _none) == dt.timedelta(days=7)
    with pytest.raises(InvalidArgument, match="at most 604800 s"):
        check_request(ADMIN, "user", "a", 7 * 86_400 + 1, _none)
    with pytest.raises(InvalidArgument, match="at most 86400 s"):
        check_request(ADMIN, "join", "j", 2 * 86_400, _none)
    with pytest.raises(InvalidArgument, match="role: expected"):
        check_request(ADMIN, "root", "a", 0, _none)
