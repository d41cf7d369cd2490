"""The certificates the secured benchmarks hand out, checked without starting any process."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509

from bench.etcd_baseline import LOOPBACK, member_certificate
from service.common.errors import InvalidArgument
from service.common.pki import ClusterPki, identity_of
from service.tools.kv_demo_server import PEER_ROLE, load_credentials


def test_an_etcd_member_certificate_names_loopback_and_chains_to_our_ca(tmp_path: Path) -> None:
    """etcd verifies peers against the address in their URL: the member's certificate must
    carry 127.0.0.1 besides the names our server certificates carry, and be the CA's."""
    ca = ClusterPki(tmp_path).ca
    cert_pem, _ = member_certificate(ca, "etcd-1")
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address(LOOPBACK) in names.get_values_for_type(x509.IPAddress)
    assert "tessera" in names.get_values_for_type(x509.DNSName)
    assert (identity_of(cert_pem).role, identity_of(cert_pem).name) == ("master", "etcd-1")


def test_a_secured_kv_node_takes_only_its_own_tserver_certificate(tmp_path: Path) -> None:
    pki = ClusterPki(tmp_path / "pki")
    own = pki.export(PEER_ROLE, "node-1", tmp_path / "own")
    assert load_credentials(own.ca_file.parent, "node-1").identity.name == "node-1"
    with pytest.raises(InvalidArgument, match="expected tserver 'node-2'"):
        load_credentials(own.ca_file.parent, "node-2")
    user = pki.export("user", "node-1", tmp_path / "user")
    with pytest.raises(InvalidArgument, match="user 'node-1'"):
        load_credentials(user.ca_file.parent, "node-1")
