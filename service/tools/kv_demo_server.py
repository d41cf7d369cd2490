"""The replicated key-value demo server: the smallest state machine on the consensus layer.

    python -m service.tools.kv_demo_server --conf conf/raft-demo.toml [--set key=value ...]
    tessera raft-demo serve --conf conf/raft-demo.toml

One process = one Raft node of the group "kv": a gRPC server with the KvDemo API (Put, Get,
Status, ChangeConfig, TransferLeader) and the consensus transport (Step) on one port. Used by
`make demo`, the benchmarks and the integration tests. With `--ready-file F` it writes
{"address", "pid", "uuid"} to F once it serves, so launchers can bind port 0.

With `--credentials DIR` (ca.pem, cert.pem, key.pem: `pki.IdentityFiles.in_dir`) the node is
secured as a tablet server is: mutual TLS from the cluster CA on its port and on every channel
to its peers, Raft messages accepted only from `tserver` certificates each speaking for itself,
and the KvDemo calls authorized by `POLICY`. The certificate must be a `tserver` one named by
the node's uuid. Without it the node is plaintext and lets anyone call anything, which the
demo's tests and `make raft-demo` rely on; the benchmarks measure both (bench/README.md).

Exit codes: 0 after SIGTERM/SIGINT, 3 when the node stopped on a storage failure, 2 for a
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from service.common.authz import ADMIN, ANYONE, Authorizer, Rule, allow
from service.common.config import DemoNodeConfig, load_config, parse_override
from service.common.errors import InvalidArgument, TesseraError, rpc_errors
from service.common.logging import setup_logging
from service.common.pki import IdentityFiles
from service.common.tls import Credentials, add_port
from service.consensus.fs import RealFileSystem
from service.consensus.node import NodeSettings, RaftNode
from service.consensus.raft_store import RaftStore
from service.consensus.transport import ConsensusServicer, GrpcTransport, Incarnations
from service.pb import kvdemo_pb2, kvdemo_pb2_grpc
from service.raft import ConfigChangeType, NodeId, RaftConfig

log = logging.getLogger(__name__)

GROUP = "kv"
MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1 << 20
_PUT = b"P"


class KvStateMachine:
    """A map of string keys to byte values. Entries: b"P" + u16 key length + key + value."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    @staticmethod
    def encode_put(key: str, value: bytes) -> bytes:
        return KvStateMachine.encode_put_bytes(key.encode(), value)

    @staticmethod
    def encode_put_bytes(key: bytes, value: bytes) -> bytes:
        return b"".join((_PUT, len(key).to_bytes(2, "little"), key, value))

    def apply(self, index: int, data: bytes) -> object:
        if data[:1] == _PUT:
            n = int.from_bytes(data[1:3], "little")
            self.kv[data[3 : 3 + n].decode()] = data[3 + n :]
        return index

    def snapshot(self) -> bytes:
        return json.dumps({k: v.hex() for k, v in self.kv.items()}).encode()

    def restore(self, data: bytes) -> None:
        self.kv = {k: bytes.fromhex(v) for k, v in json.loads(data).items()} if data else {}


STREAM_PUT_TIMEOUT_S = 10.0
"""Deadline of each put on a PutStream (the stream's own deadline covers all of them)."""


def _deadline(context: grpc.aio.ServicerContext, default: float = 10.0) -> float:
    remaining = context.time_remaining()
    return default if remaining is None else max(0.001, remaining - 0.05)


PEER_ROLE = "tserver"
"""The role of a node's certificate: its Raft group is replicated as a tablet's is."""

POLICY: dict[str, Rule] = {
    **dict.fromkeys(["Put", "PutStream", "Get"], allow("user", "admin")),
    "Status": ANYONE,
    **dict.fromkeys(["ChangeConfig", "TransferLeader"], ADMIN),
}
"""Who may call each KvDemo method on a secured node (service/common/authz.py)."""


class KvDemoServicer(kvdemo_pb2_grpc.KvDemoServicer):
    """Thin: validate, delegate to the node, return."""

    authorizer: Authorizer | None = None
    """Set by `serve` (POLICY): `rpc_errors` asks it before every call."""

    def __init__(self, node: RaftNode, sm: KvStateMachine, address: str) -> None:
        self.node = node
        self.sm = sm
        self.address = address

    @rpc_errors
    async def Put(
        self, request: kvdemo_pb2.PutRequest, context: grpc.aio.ServicerContext
    ) -> kvdemo_pb2.PutResponse:
        return await self._put(request, _deadline(context))

    @rpc_errors
    async def PutStream(
        self,
        request_iterator: AsyncIterator[kvdemo_pb2.PutRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[kvdemo_pb2.PutResponse]:
        """Put, request after request, on one stream; the first error ends it (rpc_errors)."""
        async for request in request_iterator:
            yield await self._put(request, STREAM_PUT_TIMEOUT_S)

    async def _put(self, request: kvdemo_pb2.PutRequest, timeout: float) -> kvdemo_pb2.PutResponse:
        key = _check_key(request.key)
        value = request.value
        if len(value) > MAX_VALUE_BYTES:
            raise InvalidArgument(
                f"value of {len(value)} bytes exceeds the {MAX_VALUE_BYTES}-byte limit"
            )
        data = KvStateMachine.encode_put_bytes(key, value)
        index = await self.node.propose(data, timeout=timeout)
        assert isinstance(index, int)
        return kvdemo_pb2.PutResponse(index=index)

    @rpc_errors
    async def Get(
        self, request: kvdemo_pb2.GetRequest, context: grpc.aio.ServicerContext
    ) -> kvdemo_pb2.GetResponse:
        _check_key(request.key)
        index = await self.node.read(timeout=_deadline(context))
        value = self.sm.kv.get(request.key)
        return kvdemo_pb2.GetResponse(found=value is not None, value=value or b"", index=index)

    @rpc_errors
    async def Status(
        self, request: kvdemo_pb2.StatusRequest, context: grpc.aio.ServicerContext
    ) -> kvdemo_pb2.StatusResponse:
        st = self.node.status()
        lead_addr = (
            self.address if st.lead == self.node.uuid else self.node.transport.address_of(st.lead)
        )
        return kvdemo_pb2.StatusResponse(
            uuid=self.node.uuid,
            role=st.role.value,
            term=st.term,
            leader_uuid=st.lead,
            leader_address=lead_addr or "",
            commit_index=st.commit,
            applied_index=self.node.applied,
            voters=sorted(st.config.voters),
            learners=sorted(st.config.learners),
            config_index=st.committed_config.index,
        )

    @rpc_errors
    async def ChangeConfig(
        self, request: kvdemo_pb2.ChangeConfigRequest, context: grpc.aio.ServicerContext
    ) -> kvdemo_pb2.ChangeConfigResponse:
        try:
            ctype = ConfigChangeType(request.type)
        except ValueError:
            allowed = ", ".join(t.value for t in ConfigChangeType)
            raise InvalidArgument(
                f"unknown change type {request.type!r}; use one of {allowed}"
            ) from None
        if not request.uuid:
            raise InvalidArgument("uuid is required")
        index = await self.node.change_config(
            ctype,
            NodeId(request.uuid),
            address=request.address or None,
            expected_index=request.expected_config_index,
            timeout=_deadline(context),
        )
        return kvdemo_pb2.ChangeConfigResponse(config_index=index)

    @rpc_errors
    async def TransferLeader(
        self, request: kvdemo_pb2.TransferLeaderRequest, context: grpc.aio.ServicerContext
    ) -> kvdemo_pb2.TransferLeaderResponse:
        await self.node.transfer_leadership(NodeId(request.uuid), timeout=_deadline(context, 5))
        return kvdemo_pb2.TransferLeaderResponse()


def _check_key(key: str) -> bytes:
    """The key's UTF-8 bytes, once checked."""
    if not key:
        raise InvalidArgument("key must not be empty")
    k = key.encode()
    if len(k) > MAX_KEY_BYTES:
        raise InvalidArgument(f"key of {len(k)} bytes exceeds {MAX_KEY_BYTES} bytes")
    return k


def load_credentials(directory: Path, uuid: str) -> Credentials:
    """The node's identity from `directory`; InvalidArgument unless it is a `tserver`
    certificate named `uuid` (peers check that a Raft message's sender is its certificate)."""
    creds = Credentials.from_files(IdentityFiles.in_dir(directory))
    if (creds.identity.role, creds.identity.name) != (PEER_ROLE, uuid):
        raise InvalidArgument(
            f"{directory}: the certificate is for {creds.identity}, expected {PEER_ROLE} {uuid!r}"
        )
    return creds


async def serve(
    config: DemoNodeConfig, ready_file: Path | None = None, creds: Credentials | None = None
) -> int:
    """Run the node until SIGTERM/SIGINT; secured when `creds` (module docstring)."""
    fs = RealFileSystem()
    data_dir = str(config.data_dir)
    uuid = NodeId(config.uuid)
    incarnations = Incarnations(fs, data_dir, uuid)
    transport = GrpcTransport(
        uuid,
        incarnations=incarnations,
        max_message_bytes=config.rpc.max_message_bytes,
        credentials=creds,
        peer_role=PEER_ROLE,
    )
    addresses: dict[str, str] = {p.uuid: p.address for p in config.peers}
    bootstrap = RaftConfig(frozenset(NodeId(p.uuid) for p in config.peers))
    store, recovered = RaftStore.open(
        fs,
        os.path.join(data_dir, "raft"),
        uuid,
        bootstrap_config=bootstrap,
        addresses=addresses,
        segment_bytes=config.wal.segment_size_bytes,
        preallocate=config.wal.preallocate,
        fsync=config.wal.fsync,
    )
    sm = KvStateMachine()
    node = RaftNode(
        group_id=GROUP,
        uuid=uuid,
        store=store,
        recovered=recovered,
        state_machine=sm,
        transport=transport,
        settings=NodeSettings.from_raft_settings(config.raft),
    )
    transport.register(
        GROUP,
        node.step,
        node.report_unreachable,
        node.snapshot_sent,
        leader_term=node.leader_term,
        peer_gone=node.peer_gone,
    )
    server = grpc.aio.server(options=config.rpc.server_options())
    port = add_port(server, config.rpc_bind, creds)
    if port == 0:
        raise OSError(f"could not bind {config.rpc_bind}")
    host = config.rpc_bind.rsplit(":", 1)[0]
    address = f"{host}:{port}"
    # Authorizers in both modes, as a master or tablet server has: insecure, they admit
    # everyone, so the two modes differ by exactly what security adds.
    secure = creds is not None
    consensus = ConsensusServicer(
        transport, Authorizer(ConsensusServicer.policy(PEER_ROLE), secure=secure)
    )
    consensus.add_to_server(server)
    kv = KvDemoServicer(node, sm, address)
    kv.authorizer = Authorizer(POLICY, secure=secure)
    kvdemo_pb2_grpc.add_KvDemoServicer_to_server(kv, server)
    await server.start()
    await node.start()
    log.info(
        "node %s serving on %s (data %s, %s)",
        uuid,
        address,
        data_dir,
        "mutual TLS" if secure else "plaintext",
    )
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"address": address, "pid": os.getpid(), "uuid": uuid}))
        tmp.replace(ready_file)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stop_task = asyncio.create_task(stop.wait())
    fatal_task = asyncio.create_task(node.fatal_event.wait())
    await asyncio.wait({stop_task, fatal_task}, return_when=asyncio.FIRST_COMPLETED)
    code = 3 if node.fatal is not None else 0
    log.info("node %s shutting down (%s)", uuid, "fatal" if code else "signal")
    log.info("node %s %s", uuid, node.stats())  # bench/raft_commit.py reports this line
    # Order: stop taking requests, stop the node (fails waiters, closes the WAL), then the
    # transport's senders.
    await server.stop(grace=1.0)
    await node.aclose()
    await transport.aclose()
    for t in (stop_task, fatal_task):
        t.cancel()
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Tessera replicated key-value demo node")
    p.add_argument("--conf", required=True, type=Path, help="node config (toml)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config setting, e.g. --set raft.lease_reads=true",
    )
    p.add_argument("--ready-file", type=Path, help="write {address,pid,uuid} here when serving")
    p.add_argument(
        "--credentials",
        type=Path,
        metavar="DIR",
        help="serve with mutual TLS as the tserver identity in DIR (ca.pem, cert.pem, key.pem)",
    )
    args = p.parse_args(argv)
    try:
        overrides = dict(parse_override(s) for s in args.set)
        config = load_config(DemoNodeConfig, args.conf, overrides)
        creds = (
            None if args.credentials is None else load_credentials(args.credentials, config.uuid)
        )
    except TesseraError as e:
        print(f"tessera: {e.message}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, node=config.uuid)
    return asyncio.run(serve(config, args.ready_file, creds))


if __name__ == "__main__":
    sys.exit(main())
