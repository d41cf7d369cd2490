"""Certificates of a Tessera cluster: one root CA, and leaf certificates that bind an identity.

Theory of operation
-------------------
Every party of a secured cluster holds a certificate signed by the cluster's CA (the root CA
that sys.catalog also keeps, `service/master/security.py`). The certificate *is* the identity:

* the subject's organizational unit is the **role**: `master`, `tserver`, `admin`, `user`, or
  `join` (a short-lived join credential, which may only ask a master for a tablet server
  certificate: the bootstrap of a server that comes without one);
* the subject's common name is the **name**: a server's permanent uuid, a person's user name.

The CA that signs them is the one a cluster is provisioned with (`ClusterPki`, `tessera
security provision`); masters also hold its key (`ca.key` beside `ca.pem`) and store it in
sys.catalog, so the leader master can sign certificates for certificate requests
(`sign_request`): users' short-lived credentials, tablet servers that join, renewals.

Servers' certificates also carry the DNS names `tessera` and `<role>.tessera`: callers dial
servers by address but verify the certificate against one of these names (gRPC's
`ssl_target_name_override`), so a client that asks for a master accepts only a certificate of
the master role, whatever address it dialed. Which *particular* server answered is then checked
where it matters, against the uuid the caller expected (consensus peers, the master's proxy).

Keys are EC P-256 (fast to generate and to handshake, small), signatures ECDSA with SHA-256.
Certificates are backdated by `BACKDATE` for clocks that disagree by a little.

Only functions of values here; writing them to disk owner-only is `IdentityFiles.write`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from service.common.errors import InvalidArgument
from service.common.private_files import write_private_file

__all__ = [
    "BACKDATE",
    "ROLES",
    "SERVER_ROLES",
    "CertificateAuthority",
    "ClusterPki",
    "Identity",
    "IdentityFiles",
    "ca_key_file",
    "identity_of",
    "new_request",
    "request_public_key",
    "server_name",
]

ROLES = ("master", "tserver", "admin", "user", "join")
SERVER_ROLES = ("master", "tserver")
BACKDATE = datetime.timedelta(hours=1)
CA_VALIDITY = datetime.timedelta(days=3650)
SERVER_VALIDITY = datetime.timedelta(days=365)
USER_VALIDITY = datetime.timedelta(days=30)
ANY_SERVER_NAME = "tessera"


def server_name(role: str) -> str:
    """The DNS name a caller verifies a server of `role` against ("" role: any server)."""
    return f"{role}.{ANY_SERVER_NAME}" if role else ANY_SERVER_NAME


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is on the other end of a connection: a role (ROLES) and a name (uuid or user)."""

    role: str
    name: str

    def __str__(self) -> str:
        return f"{self.role} {self.name!r}"

    @property
    def principal(self) -> str:
        """ "role:name": what owns a transaction (an admin and a user of one name differ)."""
        return f"{self.role}:{self.name}"


def identity_of(cert_pem: bytes) -> Identity:
    """The identity a certificate binds (its subject's OU and CN); InvalidArgument otherwise."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise InvalidArgument(f"not a PEM certificate: {e}") from None
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(ous) != 1 or len(cns) != 1:
        raise InvalidArgument("certificate subject has no single OU (role) and CN (name)")
    role, name = str(ous[0].value), str(cns[0].value)
    if role not in ROLES or not name:
        raise InvalidArgument(f"certificate binds an unknown role {role!r} or an empty name")
    return Identity(role, name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA that can sign: its certificate and private key (PEM). Never printed."""

    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)

    @classmethod
    def create(
        cls, now: datetime.datetime | None = None, common_name: str = "Tessera cluster CA"
    ) -> CertificateAuthority:
        """A new self-signed root CA on an EC P-256 key, valid CA_VALIDITY from BACKDATE
        before `now`, allowed to sign leaf certificates only (path length 0)."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        start = (now or datetime.datetime.now(datetime.UTC)) - BACKDATE
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue(
        self,
        role: str,
        name: str,
        *,
        now: datetime.datetime | None = None,
        validity: datetime.timedelta | None = None,
    ) -> tuple[bytes, bytes]:
        """A new key and a certificate binding (role, name): (cert PEM, key PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self.sign(role, name, key.public_key(), now=now, validity=validity)
        return cert, _key_pem(key)

    def sign(
        self,
        role: str,
        name: str,
        public_key: ec.EllipticCurvePublicKey,
        *,
        now: datetime.datetime | None = None,
        validity: datetime.timedelta | None = None,
    ) -> bytes:
        """A certificate binding (role, name) to `public_key` (PEM), valid from BACKDATE before
        `now` (clock skew) until `validity` (default by role) after it, never past the CA's own
        expiry."""
        if role not in ROLES:
            raise InvalidArgument(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
        if not name or len(name) > 128 or any(c in name for c in '/,=+<>#;\\"\n'):
            raise InvalidArgument(
                f'name: 1-128 characters without / , = + < > # ; \\ ", got {name!r}'
            )
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        now = now or datetime.datetime.now(datetime.UTC)
        start = now - BACKDATE
        server = role in SERVER_ROLES
        life = validity or (SERVER_VALIDITY if server else USER_VALIDITY)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                        x509.NameAttribute(NameOID.COMMON_NAME, name),
                    ]
                )
            )
            .issuer_name(ca_cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(min(now + life, ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName(ANY_SERVER_NAME), x509.DNSName(server_name(role))]
                ),
                critical=False,
            )
        cert = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
            ca_key, hashes.SHA256()
        )
        return cert.public_bytes(serialization.Encoding.PEM)


def new_request() -> tuple[bytes, bytes]:
    """A new EC P-256 key and a certificate request for it: (key PEM, request DER). The key
    never leaves the party that made it; a master signs the public half (`sign_request`)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera")]))
        .sign(key, hashes.SHA256())
    )
    return _key_pem(key), csr.public_bytes(serialization.Encoding.DER)


def request_public_key(csr_der: bytes) -> ec.EllipticCurvePublicKey:
    """The public key of a certificate request whose signature proves its owner holds the
    private half; InvalidArgument otherwise. Its subject is ignored: the signer decides the
    identity."""
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError as e:
        raise InvalidArgument(f"csr_der: not a DER certificate request: {e}") from None
    try:
        # Both parse the request's key: a point off its curve (ValueError) or an unknown
        # curve or algorithm (UnsupportedAlgorithm) is the requester's mistake, not ours.
        public = csr.public_key()
        valid = csr.is_signature_valid
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise InvalidArgument(f"csr_der: the request's key cannot be used: {e}") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        raise InvalidArgument("csr_der: the key must be EC P-256")
    if not valid:
        raise InvalidArgument("csr_der: the request's signature does not verify")
    return public


@dataclass(frozen=True)
class IdentityFiles:
    """Where one party's credentials live: the CA certificate, its certificate and its key."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_dir(cls, directory: Path) -> IdentityFiles:
        """A credentials directory: `ca.pem`, `cert.pem`, `key.pem` (what `tessera cluster up`
        writes to `<dir>/credentials`, and `--credentials DIR` reads)."""
        return cls(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")

    def write(self, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> IdentityFiles:
        """Write the three files, owner-only (created so: never readable by others even for an
        instant), each replaced atomically, the key before its certificate."""
        for path, data in (
            (self.ca_file, ca_pem),
            (self.key_file, key_pem),
            (self.cert_file, cert_pem),
        ):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private_file(path, data)
        return self


class ClusterPki:
    """A cluster's CA kept in a directory, issuing identity files into it: the bootstrap of
    local clusters, test clusters and `tessera security` (README, Security).

    `directory/ca.pem` and `directory/ca.key` (0600) are created on first use; each identity
    is `directory/<role>-<name>.pem` and `.key`. The directory is owner-only.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        cert, key = directory / "ca.pem", directory / "ca.key"
        if cert.exists() and key.exists():
            self.ca = CertificateAuthority(cert.read_bytes(), key.read_bytes())
        else:
            self.ca = CertificateAuthority.create()
            write_private_file(key, self.ca.key_pem)
            write_private_file(cert, self.ca.cert_pem)

    def files(self, role: str, name: str) -> IdentityFiles:
        """The identity files of (role, name), issued now if they do not exist yet."""
        files = IdentityFiles(
            self.directory / "ca.pem",
            self.directory / f"{role}-{name}.pem",
            self.directory / f"{role}-{name}.key",
        )
        if not (files.cert_file.exists() and files.key_file.exists()):
            cert, key = self.ca.issue(role, name)
            write_private_file(files.key_file, key)
            write_private_file(files.cert_file, cert)
        return files

    def export(self, role: str, name: str, directory: Path) -> IdentityFiles:
        """Copy the identity of (role, name) into a credentials directory (`in_dir`); a
        master's also gets the CA's key (`ca.key`: masters sign certificates)."""
        src = self.files(role, name)
        out = IdentityFiles.in_dir(directory)
        written = out.write(
            src.ca_file.read_bytes(), src.cert_file.read_bytes(), src.key_file.read_bytes()
        )
        if role == "master":
            write_private_file(ca_key_file(out.ca_file), self.ca.key_pem)
        return written


def ca_key_file(ca_file: Path) -> Path:
    """Where a master finds the CA's key: `ca.key` beside the CA certificate."""
    return ca_file.with_name("ca.key")
