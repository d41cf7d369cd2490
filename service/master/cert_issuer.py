"""Certificates the master signs on request: users' short-lived credentials, tablet servers
that join with a join credential, and renewals.

Theory of operation
-------------------
The cluster's CA lives in sys.catalog (`security.ensure_security` stores the CA the masters
were provisioned with), so the leader can sign. A caller sends a certificate request (a public
key with proof it holds the private half; `pki.new_request`): the key never travels, and the
identity in the certificate is decided here, never taken from the request. Who may ask for
what:

  | caller   | may get                                   | validity (default, most)   |
  |----------|-------------------------------------------|----------------------------|
  | admin    | a `user` credential                       | 1 day, 7 days              |
  | admin    | an `admin` credential                     | 1 day, 30 days             |
  | admin    | a `join` credential (enrolls one server)  | 1 hour, 1 day              |
  | admin    | a `tserver` certificate                   | 365 days, 365 days         |
  | join     | a `tserver` certificate for a NEW uuid    | 365 days, 365 days         |
  | tserver  | its own `tserver` certificate (renewal)   | 365 days, 365 days         |

A user credential is what other systems call an authn token: short-lived, signed by the
cluster, refused once expired, and useless when tampered with or signed by anyone else (the
TLS handshake checks all three before any RPC exists). It is a certificate rather than a bearer
string because a gRPC Python server either requires a client certificate or requests none:
with client certificates required on every port, a token without one could not connect at all.
A join credential may name only a uuid no master knows (not registered, not in any tablet's
Raft config), so it cannot mint a certificate for a server that exists. Master certificates
come only from provisioning.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509

from service.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from service.common.pki import CertificateAuthority, Identity, request_public_key
from service.master.sys_catalog import SysCatalogState

__all__ = ["LIMITS", "CertIssuer", "Issued", "check_request"]

_HOUR = 3600
_DAY = 86_400

LIMITS: dict[str, tuple[int, int]] = {
    "user": (_DAY, 7 * _DAY),
    "admin": (_DAY, 30 * _DAY),
    "join": (_HOUR, _DAY),
    "tserver": (365 * _DAY, 365 * _DAY),
}
"""Validity in seconds by role: (default, most)."""

_MAY_ASK = {
    "admin": frozenset({"user", "admin", "join", "tserver"}),
    "join": frozenset({"tserver"}),
    "tserver": frozenset({"tserver"}),
}


def check_request(
    caller: Identity,
    role: str,
    name: str,
    validity_s: int,
    known_server: Callable[[str], bool],
) -> datetime.timedelta:
    """The validity to sign for if `caller` may get a certificate binding (role, name)
    (module docstring); PermissionDenied or InvalidArgument naming the problem otherwise."""
    if role == "master":
        raise PermissionDenied("master certificates come from provisioning, never by request")
    if role not in LIMITS:
        raise InvalidArgument(f"role: expected one of {', '.join(LIMITS)}, got {role!r}")
    if role not in _MAY_ASK.get(caller.role, frozenset()):
        raise PermissionDenied(f"{caller} may not get a {role} certificate")
    if caller.role == "tserver" and name != caller.name:
        raise PermissionDenied(f"{caller} may renew only its own certificate, not {name!r}")
    if caller.role == "join" and known_server(name):
        raise PermissionDenied(
            f"{name!r} is a tablet server this cluster knows; a join credential enrolls only a "
            "new one"
        )
    default, most = LIMITS[role]
    if validity_s < 0 or validity_s > most:
        raise InvalidArgument(
            f"validity_s: a {role} certificate lives at most {most} s, got {validity_s}"
        )
    return datetime.timedelta(seconds=validity_s or default)


@dataclass(frozen=True)
class Issued:
    certificate_pem: bytes
    ca_certificate_pem: bytes
    expire_time_us: int


class CertIssuer:
    """Signs with sys.catalog's CA, provided it is the CA this master trusts (the one its
    certificate and every peer's chain to): a catalog whose CA was generated before the
    cluster was provisioned cannot sign certificates anyone would accept."""

    def __init__(self, sys_catalog: SysCatalogState, trusted_ca_pem: bytes) -> None:
        self._sys = sys_catalog
        self._trusted = trusted_ca_pem

    def authority(self) -> CertificateAuthority:
        row = self._sys.cert_authority()
        if row is None:
            raise FailedPrecondition("sys.catalog holds no CA yet (the leader stores it); retry")
        if row.record.certificate_pem.strip() != self._trusted.strip():
            raise FailedPrecondition(
                "sys.catalog's CA is not the CA this cluster's certificates chain to (it was "
                "stored before the cluster was provisioned): this master signs no certificates"
            )
        return CertificateAuthority(row.record.certificate_pem, row.record.private_key_pem)

    def known_server(self, name: str, registered: Callable[[str], bool]) -> bool:
        """Registered with this master, or a member of any tablet's Raft config."""
        if registered(name):
            return True
        for row in self._sys.all_tablets():
            consensus = row.record.consensus
            if consensus is not None and any(p.uuid == name for p in consensus.peers):
                return True
        return False

    def issue(self, role: str, name: str, csr_der: bytes, validity: datetime.timedelta) -> Issued:
        ca = self.authority()
        cert_pem = ca.sign(role, name, request_public_key(csr_der), validity=validity)
        cert = x509.load_pem_x509_certificate(cert_pem)
        expire_us = int(cert.not_valid_after_utc.timestamp() * 1_000_000)
        return Issued(cert_pem, ca.cert_pem, expire_us)
