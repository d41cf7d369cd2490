"""Getting a certificate from the cluster's masters: users' short-lived credentials (`tessera
token create`), tablet servers that join with a join credential, renewals.

The private key is made here and never sent: the master receives a certificate request and
signs its public half with the cluster's CA (service/master/cert_issuer.py decides what each
caller may get). The result is written as a credentials directory (`ca.pem`, `cert.pem`,
`key.pem`, owner-only), what `--credentials DIR`, `credentials=` and the Spark option take.

Masters are tried in turn until the leader answers (followers answer NOT_THE_LEADER), without
ConnectToMaster: a join credential may call nothing but IssueCertificate. A call that timed out
is retried with the same certificate request: its answer may have been lost after the leader
recorded a join credential's use, and the same request is answered again
(docs/design/security.md#R10), where a new one would be refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.common import error_mapping
from service.common.errors import (
    NotTheLeader,
    ServiceUnavailable,
    TesseraError,
    Timeout,
)
from service.common.pki import IdentityFiles, new_request
from service.common.tls import Credentials, open_channel
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc

__all__ = ["Enrolled", "request_certificate"]


@dataclass(frozen=True)
class Enrolled:
    files: IdentityFiles
    expire_time_us: int


async def request_certificate(
    masters: Sequence[str],
    credentials: Credentials,
    role: str,
    name: str,
    out: Path | IdentityFiles,
    *,
    validity_s: int = 0,
    timeout: float = 30.0,
) -> Enrolled:
    """Ask the leader master, as `credentials`, for a certificate binding (role, name); write
    it with a new key into the credentials directory `out` (or the three files it names); the
    key before the certificate."""
    key_pem, csr = new_request()
    request = pb.IssueCertificateRequestPB(role=role, name=name, csr_der=csr, validity_s=validity_s)
    deadline = time.monotonic() + timeout
    last: TesseraError | None = None
    while time.monotonic() < deadline:
        for address in masters:
            remaining = max(0.1, deadline - time.monotonic())
            async with open_channel(
                address, credentials, role="master", interceptors=error_mapping.INTERCEPTORS
            ) as ch:
                try:
                    r = await master_pb2_grpc.MasterServiceStub(ch).IssueCertificate(
                        request, timeout=min(10.0, remaining)
                    )
                except (NotTheLeader, ServiceUnavailable, Timeout) as err:
                    last = err
                    continue
            files = out if isinstance(out, IdentityFiles) else IdentityFiles.in_dir(out)
            files.write(r.ca_certificate_pem, r.certificate_pem, key_pem)
            return Enrolled(files, r.expire_time_us)
        await asyncio.sleep(0.2)
    raise last or ServiceUnavailable(f"no master among {list(masters)} answered in {timeout}s")
