"""One tablet server process: wiring of transport, tablet manager, scanners, heartbeater, RPCs.

Identity. The server's permanent uuid is generated when its data directory is first formatted
and kept in `<data_dir>/instance` (Kudu's instance file). A wiped server comes back under a new
uuid, so no Raft peer can mistake it for the replica that had voted (docs/design/consensus.md#R9);
the transport's incarnations catch the remaining case of a copied or restored directory.

Fencing. `highest_master_term` is the highest master term seen in admin requests and heartbeat
answers; an admin request from a lower term comes from a deposed leader and is refused
(`StaleTerm`). It lives in memory: after a restart the first heartbeat answer restores it, and
a deposed master's requests in that first second are still fenced by the tablets' own Raft
compare-and-set (config op ids) where it matters.

Status pages and metrics (`status_pages`, `common.http_status`): when `http_bind` is set, an
HTTP server serves HTML pages of this server's state and `/metrics` from its own
`MetricsRegistry`: RPC counts and latencies (`errors.observe_rpcs`), the WAL fsync histogram of
every replica (`TabletSettings.on_wal_sync`), rows written by leaders
(`TabletSettings.on_rows_written`) and callbacks reading replicas, scanners and heartbeats. The
HTTP address is registered with the masters (their /tservers page links to it).

Wiring. Each helper is handed the parts of this server it uses, and none imports this module:
the servicers their collaborators and the fence (`tablet_service.MasterFence`, this server's
term checks), the status pages a read-only view (`status_pages.ServerState`), tablet copy the
tablet manager (`tablet_copy.ReplicaHost`).

Start order: bind, open the tablet manager (the startup state machine,
docs/design/tablet_copy.md#R2: tablets start replicating), serve RPCs, serve status pages, then
heartbeat (a master that learns of us can reach us at once). Shutdown order, the reverse: heartbeats
stop, the status pages stop, RPCs drain (grace period), scanners go, tablets close (each Raft node
fails its waiters and closes its WAL), the transport closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from service.common import error_mapping
from service.common.authz import Authorizer
from service.common.cert_renewal import CertRenewer
from service.common.config import TServerConfig
from service.common.enrollment import request_certificate
from service.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    StaleTerm,
    TesseraError,
    Timeout,
    observe_rpcs,
)
from service.common.http_status import StatusServer, public_address, status_server
from service.common.loop_lag import LoopLagMonitor
from service.common.metrics import MetricsRegistry, RpcMetrics, wal_sync_histogram
from service.common.private_files import private_dir
from service.common.registration import register
from service.common.server_main import advertised_address
from service.common.tls import (
    Credentials,
    ServerCertificates,
    add_port,
    open_channel,
    server_credentials_for,
)
from service.common.tokens import TokenVerifier
from service.consensus.fs import RealFileSystem
from service.consensus.node import NodeSettings
from service.consensus.quiesce import Quiescence
from service.consensus.transport import ConsensusServicer, GrpcTransport, Incarnations
from service.pb import master_pb2 as mpb
from service.pb import master_pb2_grpc as mpb_grpc
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.raft import NodeId
from service.tserver.heartbeater import SOFTWARE_VERSION, Heartbeater
from service.tserver.scanners import ScannerManager, add_data_servicer
from service.tserver.status_pages import install_tserver_metrics, install_tserver_pages
from service.tserver.tablet import TabletSettings
from service.tserver.tablet_copy import CopyClient, CopySource, CopyTrigger
from service.tserver.tablet_manager import TabletManager
from service.tserver.tablet_service import (
    ADMIN_POLICY,
    COPY_POLICY,
    DATA_POLICY,
    AdminServicer,
    CopyServicer,
    DataServicer,
)

log = logging.getLogger(__name__)

INSTANCE_FILE = "instance"
SERVER_GRACE_S = 1.0
RPC_TIMEOUT_S = 30.0
APPLY_SLICE_S = 0.05
"""The tablets' applies share the event loop in slices of about this long (consensus/turns.py):
a write fanned out to every tablet of this server then lags the loop by about this plus one
apply (a Write's rows are bounded, row_ops.MAX_WRITE_ROWS), well under the Raft heartbeat
interval, instead of by all their applies at once."""


def load_or_create_uuid(data_dir: Path, wanted: str | None = None) -> NodeId:
    """The uuid recorded in `<data_dir>/instance`, created (durably) on first start. The data
    dir (every row of every tablet) is made owner-only (service/common/private_files.py).

    `wanted`: the uuid this server's certificate binds. A new data dir takes it; an existing
    one must already have it (a certificate is one server's identity, not a role)."""
    private_dir(data_dir)
    path = data_dir / INSTANCE_FILE
    if path.exists():
        try:
            recorded = NodeId(json.loads(path.read_text())["uuid"])
        except (ValueError, KeyError) as e:
            raise FailedPrecondition(f"{path}: not a tablet server instance file: {e}") from e
        if wanted is not None and recorded != wanted:
            raise FailedPrecondition(
                f"{data_dir} belongs to tablet server {recorded!r}, but the certificate is "
                f"for {wanted!r}: give this server a certificate for {recorded!r}"
            )
        return recorded
    new = NodeId(wanted or f"ts-{uuidlib.uuid4().hex}")
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"uuid": new, "formatted_at": time.time()}))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return new


def _host_port(address: str) -> mpb.HostPortPB:
    host, _, port = address.rpartition(":")
    return mpb.HostPortPB(host=host, port=int(port))


class TabletServer:
    """One tablet server (module docstring). `start()` binds and serves; `aclose()` stops."""

    def __init__(self, config: TServerConfig) -> None:
        self.config = config
        self.uuid = NodeId("")
        self.address = ""
        self.highest_master_term = 0
        self.rpc_timeout_s = RPC_TIMEOUT_S
        self.instance = mpb.NodeInstancePB(instance_seqno=time.time_ns() // 1000)
        self.start_time_us = time.time_ns() // 1000
        self.transport: GrpcTransport | None = None
        self.quiescence: Quiescence | None = None
        self.tablets: TabletManager = None  # type: ignore[assignment]  # set by start()
        self.scanners = ScannerManager(config.scanner_ttl_ms / 1000)
        self.tokens = TokenVerifier()
        """Verifies users' authz tokens with the signing keys the leader master sends."""
        self.heartbeater: Heartbeater | None = None
        self._txn_sweeper: asyncio.Task[None] | None = None
        self.certificates: ServerCertificates | None = None
        self.renewer: CertRenewer | None = None
        self.copies: CopyClient = None  # type: ignore[assignment]  # set by start()
        self.copy_source: CopySource = None  # type: ignore[assignment]
        self.copy_trigger: CopyTrigger | None = None
        self._server: grpc.aio.Server | None = None
        self._closed = False
        # Status pages and metrics (module docstring): one registry per server object.
        self.metrics = MetricsRegistry()
        self.loop_lag = LoopLagMonitor(
            self.metrics, stall_s=config.raft.heartbeat_interval_ms / 1000.0
        )
        self.rpc_metrics = RpcMetrics(self.metrics)
        self.wal_sync = wal_sync_histogram(self.metrics)
        self.rows_written = self.metrics.counter(
            "tessera_tserver_rows_written_total",
            "Rows applied by Write RPCs on replicas leading their tablet here.",
        )
        install_tserver_metrics(self, self.metrics)
        self.http: StatusServer | None = None
        self.credentials: Credentials | None = None
        self.http_address = ""

    async def _enroll(self, join: Credentials, data_dir: Path) -> Credentials:
        """Trade a join credential for a certificate of this server's own uuid (a new data dir
        gets a new uuid first): the leader master signs a request for a key made here, and the
        certificate and key replace the join credential in the files `[security]` names.
        A join credential enrolls one server (docs/design/security.md#R10): lost answers are
        retried with the same request and answered again, but a server that dies before it
        wrote its certificate makes a new key when restarted and needs a new join credential."""
        uuid = load_or_create_uuid(data_dir, None)
        files = self.config.security.files(data_dir)
        enrolled = await request_certificate(
            self.config.master_addresses, join, "tserver", uuid, files, timeout=60.0
        )
        log.info(
            "tablet server %s: enrolled with a join credential; certificate in %s",
            uuid,
            enrolled.files.cert_file,
        )
        return Credentials.from_files(enrolled.files)

    async def start(self) -> None:
        config = self.config
        data_dir = Path(config.data_dir)
        creds = server_credentials_for(config.security, data_dir, config.rpc_bind)
        if creds is not None and creds.identity.role == "join":
            creds = await self._enroll(creds, data_dir)
        self.credentials = creds
        if creds is not None and creds.identity.role != "tserver":
            raise InvalidArgument(
                f"{config.security.cert_file}: the certificate binds {creds.identity}, not a "
                "tablet server"
            )
        self.uuid = load_or_create_uuid(data_dir, creds.identity.name if creds else None)
        self.instance.permanent_uuid = self.uuid
        server = grpc.aio.server(options=config.rpc.server_options())
        self.certificates = ServerCertificates(creds) if creds is not None else None
        port = add_port(server, config.rpc_bind, self.certificates)
        if port == 0:
            raise OSError(f"could not bind {config.rpc_bind}")
        self._server = server
        self.address = advertised_address(config.rpc_bind, config.advertised_address, port)
        incarnations = Incarnations(RealFileSystem(), str(data_dir), self.uuid)
        transport = GrpcTransport(
            self.uuid,
            incarnations=incarnations,
            max_message_bytes=config.rpc.max_message_bytes,
            drop_unknown_groups=True,
            credentials=creds,
            peer_role="tserver",
        )
        transport.set_address(self.uuid, self.address)
        self.transport = transport
        node_settings = dataclasses.replace(
            NodeSettings.from_raft_settings(config.raft), apply_slice_s=APPLY_SLICE_S
        )
        if config.quiesce_idle_ms:
            raft = config.raft
            node_settings = dataclasses.replace(
                node_settings, quiesce_ticks=config.quiesce_idle_ms // raft.tick_interval_ms
            )
            self.quiescence = transport.quiescence = Quiescence(
                transport,
                interval_s=raft.heartbeat_interval_ms / 1000,
                election_timeout_s=raft.election_timeout_ms / 1000,
            )
            await self.quiescence.start()
        settings = TabletSettings.from_config(
            config,
            node_settings,
            on_wal_sync=self.wal_sync.observe,
            on_rows_written=self.rows_written.inc,
            ask_leader=self._ask_leader_safe_time,
            register_txn=self._register_txn,
        )
        self.tablets = TabletManager(
            data_dir,
            self.uuid,
            transport,
            settings,
            max_concurrent_creates=config.max_concurrent_creates,
            max_queued_creates=config.max_queued_creates,
        )
        await self.tablets.open()
        self.copies = CopyClient(
            self.tablets, config.num_tablets_to_copy_simultaneously, credentials=creds
        )
        self.copy_source = CopySource(self.tablets, config.rpc.max_message_bytes)
        secure = creds is not None
        consensus = ConsensusServicer(
            transport, Authorizer(ConsensusServicer.policy("tserver"), secure=secure)
        )
        timeout = self.rpc_timeout_s
        admin = AdminServicer(
            self.uuid, self.tablets, self.copies, fence=self, rpc_timeout_s=timeout
        )
        data = DataServicer(
            self.uuid, self.tablets, self.scanners, self.tokens, rpc_timeout_s=timeout
        )
        copy = CopyServicer(self.uuid, self.tablets, self.copy_source, rpc_timeout_s=timeout)
        admin.authorizer = Authorizer(ADMIN_POLICY, secure=secure)
        data.authorizer = Authorizer(DATA_POLICY, secure=secure)
        copy.authorizer = Authorizer(COPY_POLICY, secure=secure)
        for servicer in (consensus, admin, data, copy):
            observe_rpcs(servicer, self.rpc_metrics)
        consensus.add_to_server(server)
        register(tpb_grpc.add_TabletServerAdminServiceServicer_to_server, admin, server)
        add_data_servicer(data, server)  # Scan pages go out pre-serialized (scanners.py)
        register(tpb_grpc.add_TabletCopyServiceServicer_to_server, copy, server)
        await server.start()
        await self.scanners.start()
        self.copy_trigger = CopyTrigger(
            lambda: list(self.tablets.replicas.values()),
            self.uuid,
            lambda: self.address,
            credentials=creds,
            answering=transport.answering,
        )
        await self.copy_trigger.start()
        if config.http_bind:
            # Off loopback the pages need a client certificate (docs/design/security.md#R13).
            http = status_server(
                config.http_bind,
                config.http_auth,
                self.metrics,
                title="Tessera tablet server",
                credentials=self._current_credentials if creds is not None else None,
            )
            install_tserver_pages(self, http)
            self.http = http
            await http.start()
            advertised_host = self.address.rpartition(":")[0].strip("[]")
            self.http_address = public_address(config.http_bind, http.port, advertised_host)
        self.heartbeater = Heartbeater(
            tuple(config.master_addresses),
            self.instance,
            self._registration,
            self.tablets,
            interval_s=config.heartbeat_interval_ms / 1000,
            rpc_timeout_s=config.heartbeat_rpc_timeout_ms / 1000,
            max_failures_before_backoff=config.heartbeat_max_failures_before_backoff,
            on_master_term=self._saw_master_term,
            highest_term=lambda: self.highest_master_term,
            credentials=creds,
            on_token_keys=self.tokens.update,
        )
        await self.heartbeater.start()
        self._txn_sweeper = asyncio.create_task(self._sweep_txns(), name="txn-sweep")
        self.loop_lag.start()
        if creds is not None:
            self.renewer = CertRenewer(
                self._obtain_certificate,
                self._current_credentials,
                self._switch_credentials,
                check_interval_s=config.cert_renewal_check_ms / 1000,
            )
            self.renewer.start()
        log.info(
            "tablet server %s serving on %s (data %s, masters %s, status pages %s)",
            self.uuid,
            self.address,
            data_dir,
            ", ".join(config.master_addresses),
            f"{self.http.scheme}://{self.http_address}/" if self.http else "off",
        )

    def _master_addresses(self) -> list[str]:
        return (
            self.heartbeater.masters() if self.heartbeater else list(self.config.master_addresses)
        )

    async def _ask_leader_safe_time(
        self, leader: str, tablet_id: str, ts: int, timeout: float
    ) -> None:
        """Ask `leader` (this tablet's leader, a peer) to move the tablet's safe time to `ts`
        (AdvanceSafeTime, docs/design/tablets.md#R4): a follower's snapshot read of a quiet
        tablet waits for the timestamp entry that follows. Rare (a write moves the safe time
        too), so one short-lived channel per call."""
        address = self.transport.address_of(leader) if self.transport is not None else None
        if not address:
            return
        async with open_channel(address, self.credentials, role="tserver") as ch:
            await error_mapping.mapped(
                tpb_grpc.TabletServerServiceStub(ch).AdvanceSafeTime(
                    tpb.AdvanceSafeTimeRequestPB(
                        dest_uuid=leader, tablet_id=tablet_id, timestamp=ts
                    ),
                    timeout=timeout,
                )
            )

    async def _sweep_txns(self) -> None:
        """Every `txn_sweep_ms`, each leader replica drops the staged state of transactions
        nobody will resolve (`TabletReplica.sweep_txns`)."""
        period = self.config.txn_sweep_ms / 1000
        while True:
            await asyncio.sleep(period)
            tablets = self.tablets
            if tablets is None:
                continue
            for replica in list(tablets.replicas.values()):
                if not replica.txns.txns or not replica.is_leader():
                    continue
                try:
                    await replica.sweep_txns(self._txn_state, 2 * period, 10.0)
                except TesseraError as e:
                    log.info("tablet %s: transaction sweep: %s", replica.tablet_id, e)

    async def _txn_state(self, txn_id: int, timeout: float) -> str:
        """A transaction's state at the coordinator, by name (NOT_FOUND: no record)."""
        try:
            resp = await self._call_master(
                "GetTransactionState", mpb.GetTransactionStateRequestPB(txn_id=txn_id), timeout
            )
        except NotFound:
            return "NOT_FOUND"
        return str(mpb.TxnStatePB.Name(resp.state)).removeprefix("TXN_")

    async def _register_txn(self, txn_id: int, tablet_id: str, writer: str, timeout: float) -> int:
        """Have the coordinator (the leader master) register `tablet_id` as a participant of
        transaction `txn_id` for `writer` (docs/design/transactions.md#R2): the master checks
        that the writer owns the open transaction and that this server hosts the tablet. The
        known leader is asked first, then every master; once per transaction and tablet, so
        one short-lived channel per call. Returns the transaction's start timestamp."""
        req = mpb.RegisterParticipantsRequestPB(
            txn_id=txn_id, tablet_ids=[tablet_id], on_behalf_of=writer
        )
        resp = await self._call_master("RegisterParticipants", req, timeout)
        return int(resp.start_timestamp)

    async def _call_master(self, method: str, req: Message, timeout: float) -> Any:
        """`MasterService.<method>(req)` on the leader master: the known leader first, then
        every master, until `timeout`. Rare calls (transactions), so short-lived channels."""
        leader = self.heartbeater.leader_address() if self.heartbeater is not None else None
        addresses = list(dict.fromkeys([a for a in [leader] if a] + self._master_addresses()))
        deadline = time.monotonic() + timeout
        last: Exception = FailedPrecondition("no master to register the transaction with")
        while time.monotonic() < deadline:
            for address in addresses:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    async with open_channel(address, self.credentials, role="master") as ch:
                        stub = mpb_grpc.MasterServiceStub(ch)
                        return await error_mapping.mapped(
                            getattr(stub, method)(req, timeout=remaining)
                        )
                except TesseraError as e:
                    if not (e.retryable or isinstance(e, Timeout)):
                        raise
                    last = e
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        raise last

    async def _obtain_certificate(self, creds: Credentials) -> Credentials:
        """A renewal (service/common/cert_renewal.py): the leader master signs a certificate
        of this server's own uuid for a new key, written over the files `[security]` names."""
        files = self.config.security.files(Path(self.config.data_dir))
        enrolled = await request_certificate(
            self._master_addresses(), creds, "tserver", creds.identity.name, files, timeout=60.0
        )
        return Credentials.from_files(enrolled.files)

    def _current_credentials(self) -> Credentials:
        assert self.credentials is not None  # the renewer runs only on a secured server
        return self.credentials

    async def _switch_credentials(self, creds: Credentials) -> None:
        """Serve and call with renewed credentials from now on (service/common/cert_renewal.py)."""
        self.credentials = creds
        if self.certificates is not None:
            self.certificates.update(creds)
        if self.transport is not None:
            self.transport.credentials = creds
        if self.copies is not None:
            self.copies.credentials = creds
        if self.copy_trigger is not None:
            self.copy_trigger.credentials = creds
        if self.heartbeater is not None:
            await self.heartbeater.replace_credentials(creds)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.renewer is not None:
            await self.renewer.aclose()
        if self._txn_sweeper is not None:
            self._txn_sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._txn_sweeper
        if self.heartbeater is not None:
            await self.heartbeater.aclose()
        if self.http is not None:
            await self.http.aclose()
        if self._server is not None:
            await self._server.stop(grace=SERVER_GRACE_S)
        await self.scanners.aclose()
        if self.copy_trigger is not None:
            await self.copy_trigger.aclose()
        if self.copies is not None:
            await self.copies.aclose()
        if self.tablets is not None:
            await self.tablets.aclose()
        if self.quiescence is not None:
            await self.quiescence.aclose()
        if self.transport is not None:
            await self.transport.aclose()
        await self.loop_lag.aclose()

    def _registration(self) -> mpb.ServerRegistrationPB:
        return mpb.ServerRegistrationPB(
            rpc_addresses=[_host_port(self.address)],
            http_addresses=[_host_port(self.http_address)] if self.http_address else [],
            software_version=SOFTWARE_VERSION,
            start_time_us=self.start_time_us,
        )

    def _saw_master_term(self, term: int) -> None:
        if term > self.highest_master_term:
            self.highest_master_term = term

    def note_fence(self, fence: tpb.MasterFencePB | None) -> None:
        """A fenced request succeeded: its master term is the highest seen if it is higher.
        Recorded only then, so a request refused for any reason (a bad schema, an unknown
        tablet) cannot raise the bar and lock the real leader out as 'deposed'."""
        if fence is not None and fence.master_term > self.highest_master_term:
            self._saw_master_term(fence.master_term)
            if self.heartbeater is not None:
                self.heartbeater.saw_newer_term()  # perhaps still reporting to a dead leader

    def is_cluster_master(self, uuid: str) -> bool:
        """`uuid` is one of the masters this server heartbeats to (`Heartbeater.master_uuids`).
        A master certificate alone does not make its holder one of this cluster's masters:
        a certificate of any other uuid could otherwise send fenced calls with a term of its
        choosing, and a term above the real leader's, once a call succeeded, locks that leader
        out as deposed (docs/design/security.md#R6)."""
        if self.heartbeater is None:
            return True  # not started: no admin call reaches a server before it serves
        return uuid in self.heartbeater.master_uuids()

    def check_fence(self, fence: tpb.MasterFencePB | None) -> None:
        """Refuse a request from a master term lower than the highest seen (module doc)."""
        if fence is None:
            return
        if fence.master_term < self.highest_master_term:
            raise StaleTerm(
                f"request from master {fence.master_uuid or '?'} in term {fence.master_term}; "
                f"this server has seen term {self.highest_master_term}: a deposed leader"
            )

    def fatal_event(self) -> asyncio.Event:
        """Never set today: a tablet's storage failure fails that tablet, not the server."""
        return asyncio.Event()
