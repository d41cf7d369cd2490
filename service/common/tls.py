"""Mutual TLS on every gRPC connection, and who is calling.

Theory of operation
-------------------
`SecuritySettings` (the `[security]` section of a server's config) names three files: the
cluster CA's certificate, this party's certificate and its key (`service/common/pki.py` says
what a certificate binds). With `mode = "secure"`:

* a server listens with `server_credentials`: TLS, and a client certificate signed by the
  cluster CA is *required* (mutual TLS). A plaintext connection, or one whose certificate
  another CA signed, is refused during the handshake, before any RPC exists;
* every channel a party opens (`open_channel`) presents its own certificate and verifies the
  server's against the CA and against the DNS name of the role it meant to reach
  (`pki.server_name`), so a tablet server's certificate cannot pass for a master's;
* a servicer learns the caller's identity from the connection (`peer_identity`), and the
  servicers' policies (`service/common/authz.py`) decide from it.

`mode = "insecure"` keeps plaintext and answers every `peer_identity` with `INSECURE_PEER`,
which every policy allows: it exists for comparison runs and says so with a warning at start.

Key files must be owner-only: `Credentials.load` refuses a key readable by group or others,
naming it, before the server has opened a port.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from service.common.config import SecuritySettings
from service.common.errors import InvalidArgument, Unauthenticated
from service.common.pki import Identity, IdentityFiles, identity_of, server_name
from service.common.private_files import check_owner_only

__all__ = [
    "INSECURE_PEER",
    "Credentials",
    "SecuritySettings",
    "ServerCertificates",
    "open_channel",
    "peer_certificate",
    "peer_identity",
    "server_credentials",
]

log = logging.getLogger(__name__)

INSECURE_PEER = Identity("insecure", "")
"""The identity of every caller of a server in insecure mode: policies allow it."""


@dataclass(frozen=True)
class Credentials:
    """A party's loaded credentials: the CA, its certificate and key (PEM), its identity."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    identity: Identity

    @classmethod
    def load(cls, settings: SecuritySettings, data_dir: Path) -> Credentials | None:
        """The credentials `settings` name, by default `<data_dir>/credentials/` (None in
        insecure mode); InvalidArgument naming the file when one is missing, unreadable,
        world-readable (the key) or not what it should be."""
        settings.validate()
        if not settings.secure:
            return None
        files = settings.files(data_dir)
        try:
            return cls.from_files(files)
        except InvalidArgument as e:
            raise InvalidArgument(
                f"security: {e.message}. A secured server needs its certificate from the "
                "cluster's CA: `tessera security provision` (README, Security), or set "
                'security.mode = "insecure" for a comparison run'
            ) from None

    @classmethod
    def from_pems(cls, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> Credentials:
        """Credentials from their bytes (carried to a Spark executor inside its task)."""
        return cls(ca_pem, cert_pem, key_pem, identity_of(cert_pem))

    @classmethod
    def from_files(cls, files: IdentityFiles) -> Credentials:
        check_owner_only(files.key_file, "private key")
        ca, cert, key = (_read(p) for p in (files.ca_file, files.cert_file, files.key_file))
        try:
            identity = identity_of(cert)
        except InvalidArgument as e:
            raise InvalidArgument(f"{files.cert_file}: {e.message}") from None
        return cls(ca, cert, key, identity)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise InvalidArgument(f"{path}: cannot read: {e.strerror}") from None


def server_credentials_for(
    settings: SecuritySettings, data_dir: Path, bind: str
) -> Credentials | None:
    """A server's credentials at start (`Credentials.load`), warning loudly when it is about to
    serve insecure."""
    creds = Credentials.load(settings, data_dir)
    if creds is None:
        log.warning(
            "security.mode is 'insecure': plaintext RPCs, and anyone who can reach %s may call "
            "anything (comparison runs only)",
            bind,
        )
    return creds


def server_credentials(creds: Credentials) -> grpc.ServerCredentials:
    """TLS with a required client certificate signed by the cluster CA."""
    return grpc.ssl_server_credentials(
        [(creds.key_pem, creds.cert_pem)], root_certificates=creds.ca_pem, require_client_auth=True
    )


def add_port(
    server: grpc.aio.Server, bind: str, creds: Credentials | ServerCertificates | None
) -> int:
    """Listen on `bind`: TLS with client certificates when `creds`, plaintext otherwise. With a
    `ServerCertificates`, a certificate it is given later serves every new connection."""
    if creds is None:
        return server.add_insecure_port(bind)
    if isinstance(creds, ServerCertificates):
        return server.add_secure_port(bind, creds.grpc_credentials())
    return server.add_secure_port(bind, server_credentials(creds))


class ServerCertificates:
    """A server's certificate that can be replaced while it serves (renewal): gRPC asks
    `_fetch` before each new TLS handshake and gets the new certificate once after `update`;
    connections already open keep the session they negotiated."""

    def __init__(self, creds: Credentials) -> None:
        self.current = creds
        self._pending: Credentials | None = None

    @staticmethod
    def _config(creds: Credentials) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(creds.key_pem, creds.cert_pem)], root_certificates=creds.ca_pem
        )

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._config(self.current), self._fetch, require_client_authentication=True
        )

    def _fetch(self) -> Any:
        pending, self._pending = self._pending, None
        return self._config(pending) if pending is not None else None

    def update(self, creds: Credentials) -> None:
        self.current = creds
        self._pending = creds


def _tls(
    creds: Credentials, role: str, options: Sequence[tuple[str, Any]]
) -> tuple[grpc.ChannelCredentials, list[tuple[str, Any]]]:
    """Mutual TLS with `creds`, verifying the server against the DNS name of `role`."""
    tls = grpc.ssl_channel_credentials(
        root_certificates=creds.ca_pem,
        private_key=creds.key_pem,
        certificate_chain=creds.cert_pem,
    )
    return tls, [*options, ("grpc.ssl_target_name_override", server_name(role))]


def open_channel(
    address: str,
    creds: Credentials | None,
    *,
    role: str = "",
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A channel to `address`. With `creds`: mutual TLS, the server's certificate verified
    against the CA and the DNS name of `role` ("" accepts any server role). `options` come from
    service/common/channel_options.py; `interceptors` wrap every call made on the channel."""
    if creds is None:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
    tls, opts = _tls(creds, role, options)
    return grpc.aio.secure_channel(address, tls, opts, interceptors=interceptors)


def open_sync_channel(
    address: str,
    creds: Credentials | None,
    *,
    role: str = "",
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """`open_channel` for the blocking API (Spark executors' helpers, health checks)."""
    if creds is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, *_tls(creds, role, options))


def tls_hint(e: grpc.RpcError) -> str:
    """For a plaintext call that failed to connect: a hint that the server may be secured."""
    code = getattr(e, "code", None)
    if callable(code) and code() is grpc.StatusCode.UNAVAILABLE:
        return (
            " (a secured cluster refuses plaintext connections: give credentials with "
            "--credentials DIR or $TESSERA_CREDENTIALS)"
        )
    return ""


_IDENTITIES: dict[bytes, Identity] = {}
_MAX_CACHED = 10_000


def peer_certificate(context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    """The caller's client certificate (PEM) as the TLS handshake verified it: what a master
    records a join credential's use by (service/master/cert_issuer.py). Unauthenticated
    without one."""
    pems = context.auth_context().get("x509_pem_cert") or []
    if not pems:
        raise Unauthenticated("no client certificate")
    return bytes(next(iter(pems)))


def peer_identity(context: grpc.aio.ServicerContext[Any, Any], secure: bool) -> Identity:
    """The caller's identity from its verified client certificate; INSECURE_PEER when the
    server runs insecure. Unauthenticated if a secure server somehow has no peer certificate
    (the handshake requires one, so this is a guard, not a path)."""
    if not secure:
        return INSECURE_PEER
    pems = context.auth_context().get("x509_pem_cert") or []
    if not pems:
        raise Unauthenticated("no client certificate")
    pem = bytes(next(iter(pems)))
    ident = _IDENTITIES.get(pem)
    if ident is None:
        try:
            ident = identity_of(pem)
        except InvalidArgument as e:
            raise Unauthenticated(f"client certificate: {e.message}") from None
        if len(_IDENTITIES) >= _MAX_CACHED:
            _IDENTITIES.clear()
        _IDENTITIES[pem] = ident
    return ident
