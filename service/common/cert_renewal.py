"""A server renews its certificate before it expires, without a restart: tablet servers and
masters alike.

Theory of operation
-------------------
Every `check_interval_s` the server looks at its certificate. With less than a third of its
lifetime left (`due`), it obtains a new certificate of its own identity for a new key (`obtain`:
the server says how, below), which writes key and certificate over the old files (key first),
and switches to them (`switch`):

* its gRPC port serves new handshakes with the new certificate (`tls.ServerCertificates`);
  connections already open keep the session they negotiated;
* its outgoing channels (Raft transport, heartbeats, tablet copies, the master's proxy to
  tablet servers) open their next connections with the new credentials.

How a certificate is obtained differs by role, and only that is injected:

* a tablet server asks the leader master (IssueCertificate; a tablet server may ask only for
  itself, service/master/cert_issuer.py);
* a master signs its own, locally (service/master/master.py says why), with the same CA and
  under the same rules and limits as the leader's IssueCertificate.

A failed attempt is logged and retried at the next check: a third of a lifetime (months for a
server certificate) leaves many. The clock is the wall clock, as the certificate's is.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable

from cryptography import x509

from service.common.errors import TesseraError
from service.common.periodic import Periodic
from service.common.tls import Credentials

__all__ = ["RENEW_FRACTION", "CertRenewer", "due"]

log = logging.getLogger(__name__)

RENEW_FRACTION = 1 / 3
"""Renew when less than this part of the certificate's lifetime is left."""


def due(cert_pem: bytes, now: datetime.datetime) -> bool:
    """Whether a certificate with less than RENEW_FRACTION of its lifetime left at `now`."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return (end - now) < (end - start) * RENEW_FRACTION


class CertRenewer:
    """Checks now, then every `check_interval_s` (module docstring).

    `obtain(current)` returns the new credentials, already written over the server's files;
    `switch(new)` makes the server serve and call with them."""

    def __init__(
        self,
        obtain: Callable[[Credentials], Awaitable[Credentials]],
        current: Callable[[], Credentials],
        switch: Callable[[Credentials], Awaitable[None]],
        *,
        check_interval_s: float,
    ) -> None:
        self._obtain = obtain
        self._current = current
        self._switch = switch
        self.check_interval_s = check_interval_s
        self.renewals = 0
        self._periodic = Periodic(
            "cert-renewal", check_interval_s, self._check, log, first_after_s=0.0
        )

    async def renew_if_due(self) -> bool:
        """One check (module docstring); True if the certificate was renewed."""
        creds = self._current()
        if not due(creds.cert_pem, datetime.datetime.now(datetime.UTC)):
            return False
        new = await self._obtain(creds)
        await self._switch(new)
        self.renewals += 1
        end = x509.load_pem_x509_certificate(new.cert_pem).not_valid_after_utc
        log.info("%s: certificate renewed, valid until %s", creds.identity, end.isoformat())
        return True

    async def _check(self) -> None:
        try:
            await self.renew_if_due()
        except (TesseraError, OSError) as e:  # retried at the next check, months ahead
            log.warning("certificate renewal failed (retried in %gs): %s", self.check_interval_s, e)

    def start(self) -> None:
        """Check now, then every `check_interval_s`."""
        self._periodic.start()

    async def aclose(self) -> None:
        await self._periodic.aclose()
