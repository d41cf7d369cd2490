"""A tablet server renews its certificate before it expires, without a restart.

Theory of operation
-------------------
Every `check_interval_s` the server looks at its certificate. With less than a third of its
lifetime left (`due`), it makes a new key, asks the leader master to sign a certificate of
its own uuid (IssueCertificate; a tablet server may ask only for itself), writes key and
certificate over the old files (key first), and switches to them:

* its gRPC port serves new handshakes with the new certificate (`ServerCertificates`);
  connections already open keep the session they negotiated;
* the Raft transport, the heartbeater, tablet copies and the copy trigger open their next
  channels with the new credentials (the heartbeater restarts its loops at once, since its
  connections to masters are long-lived).

A failed attempt is logged and retried at the next check: a third of a lifetime (months for a
server certificate) leaves many. The clock is the wall clock, as the certificate's is.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable, Sequence

from cryptography import x509

from service.client.enrollment import request_certificate
from service.common.errors import TesseraError
from service.common.periodic import Periodic
from service.common.pki import IdentityFiles
from service.common.tls import Credentials

__all__ = ["CertRenewer", "due"]

log = logging.getLogger(__name__)

RENEW_FRACTION = 1 / 3
"""Renew when less than this part of the certificate's lifetime is left."""


def due(cert_pem: bytes, now: datetime.datetime) -> bool:
    """Whether a certificate with less than RENEW_FRACTION of its lifetime left at `now`."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return (end - now) < (end - start) * RENEW_FRACTION


class CertRenewer:
    def __init__(
        self,
        masters: Callable[[], Sequence[str]],
        files: IdentityFiles,
        current: Callable[[], Credentials],
        switch: Callable[[Credentials], Awaitable[None]],
        *,
        check_interval_s: float,
    ) -> None:
        self._masters = masters
        self._files = files
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
        enrolled = await request_certificate(
            self._masters(), creds, "tserver", creds.identity.name, self._files, timeout=60.0
        )
        await self._switch(Credentials.from_files(enrolled.files))
        self.renewals += 1
        log.info(
            "%s: certificate renewed, valid until %s us",
            creds.identity,
            enrolled.expire_time_us,
        )
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
