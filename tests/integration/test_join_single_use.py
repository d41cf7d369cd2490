"""A join credential enrolls exactly one tablet server (docs/design/security.md#R10), on real
masters: a second enrollment with it is refused and changes nothing, a retry of the same
enrollment (a lost response) is answered again, and both still hold after the leader master
is killed and another takes over."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from service.common.errors import PermissionDenied, from_grpc
from service.common.pki import Identity, identity_of, new_request
from service.common.tls import Credentials, open_sync_channel
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import MasterCluster
from tests.helpers.status_pages import metrics_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def masters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterCluster]:
    with MasterCluster(tmp_path_factory.mktemp("join-once")) as m:
        yield m


def _ask(
    masters: MasterCluster, creds: Credentials, role: str, name: str, csr: bytes
) -> pb.IssueCertificateResponsePB:
    leader = masters.leader()[0]
    with open_sync_channel(leader, creds, role="master") as ch:
        return master_pb2_grpc.MasterServiceStub(ch).IssueCertificate(
            pb.IssueCertificateRequestPB(role=role, name=name, csr_der=csr), timeout=15
        )


def _join_credential(masters: MasterCluster) -> Credentials:
    admin = masters.credentials()
    assert admin is not None
    key, csr = new_request()
    r = _ask(masters, admin, "join", "join-once", csr)
    return Credentials.from_pems(r.ca_certificate_pem, r.certificate_pem, key)


def _refused(masters: MasterCluster, join: Credentials, name: str, csr: bytes) -> Exception:
    with pytest.raises(grpc.RpcError) as e:
        _ask(masters, join, "tserver", name, csr)
    return from_grpc(e.value)


def _key_of(cert_pem: bytes) -> bytes:
    return (
        x509.load_pem_x509_certificate(cert_pem)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _applied(masters: MasterCluster) -> float:
    leader = masters.by_address(masters.leader()[0])
    return metrics_of(leader.http_address)["tessera_raft_applied_index"].value(group="sys.catalog")


def test_a_join_credential_enrolls_one_server_even_across_a_failover(
    masters: MasterCluster,
) -> None:
    join = _join_credential(masters)
    _, csr = new_request()
    first = _ask(masters, join, "tserver", "ts-joined", csr)
    assert identity_of(first.certificate_pem) == Identity("tserver", "ts-joined")
    # The response was lost, say: the same enrollment is answered again, for the same key.
    again = _ask(masters, join, "tserver", "ts-joined", csr)
    assert _key_of(again.certificate_pem) == _key_of(first.certificate_pem)

    # A second enrollment, of another uuid or another key: refused, and nothing is written.
    before = _applied(masters)
    _, other_csr = new_request()
    for name, request in (("ts-second", other_csr), ("ts-second", csr), ("ts-joined", other_csr)):
        err = _refused(masters, join, name, request)
        assert isinstance(err, PermissionDenied), err
        assert "join credential was already used to enroll tablet server 'ts-joined'" in str(err)
    assert _applied(masters) == before

    # The leader dies; its successor holds the replicated record.
    old_leader = masters.by_address(masters.leader()[0])
    masters.kill(old_leader.name)
    survivors = [a for a in masters.addresses if a != old_leader.address]
    new_leader, _ = masters.leader(among=survivors)
    assert new_leader != old_leader.address
    err = _refused(masters, join, "ts-second", other_csr)
    assert isinstance(err, PermissionDenied) and "already used" in str(err), err
    retried = _ask(masters, join, "tserver", "ts-joined", csr)
    assert identity_of(retried.certificate_pem) == Identity("tserver", "ts-joined")
    assert _key_of(retried.certificate_pem) == _key_of(first.certificate_pem)

    # The uuid the refused attempts named was not bound to anything: a new join credential
    # enrolls it.
    fresh = _join_credential(masters)
    second = _ask(masters, fresh, "tserver", "ts-second", other_csr)
    assert identity_of(second.certificate_pem) == Identity("tserver", "ts-second")
