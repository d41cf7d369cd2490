"""When a certificate is due for renewal (service/common/cert_renewal.py)."""

from __future__ import annotations

import datetime as dt

from service.common.cert_renewal import due
from service.common.pki import CertificateAuthority


def test_a_certificate_is_due_with_less_than_a_third_of_its_life_left() -> None:
    ca = CertificateAuthority.create()
    now = dt.datetime.now(dt.UTC)
    cert, _ = ca.issue("tserver", "ts-1", now=now, validity=dt.timedelta(days=365))
    # Its life is 365 days plus the hour it is backdated.
    assert not due(cert, now)
    assert not due(cert, now + dt.timedelta(days=240))
    assert due(cert, now + dt.timedelta(days=245))
    assert due(cert, now + dt.timedelta(days=400))  # expired: certainly due
