"""The master process: wiring of sys.catalog, the catalog manager, the TSManager and gRPC.

Theory of operation
-------------------
One master process is one member of the Raft group "sys.catalog" whose voters are the masters
of `MasterConfig.master_addresses` (just this one when the list is empty). On one gRPC port it
serves the Master API (`master_service.MasterServicer`) and the consensus transport (Step).

Identity. MasterConfig has no uuid field, and the peers of a bootstrapping group must know each
other's uuids before any of them has spoken. So a master's uuid is derived from its advertised
address: ``master-<host>-<port>`` (characters a node id may not hold become '-'), which every
master computes identically for every entry of `master_addresses`. It is written to
``<data_dir>/instance`` on first start; a later start whose derived uuid differs (the master was
moved to another address without wiping its data) is refused, as docs/design/consensus.md#R9 wants
for a node whose identity changed. Moving a master is therefore a RemoveMaster/AddMaster, not a
config edit. (A single master bound to port 0 takes the uuid of the port it got: such a data dir can
only be reopened on that port.) This departs from MasterConfig's note that the uuid is random per
formatted data dir: with no uuid setting and no discovery RPC yet, an address-derived uuid is the
only one peers can know before the group exists. Peer incarnations (`Incarnations`) still catch a
master that lost its disk and came back under the same uuid.

Wiring. Each helper is handed the parts of this master it uses, and none imports this module:
the servicer a `master_service.MasterParts`, membership changes (`MasterMembership`) the Raft
node, the uuid, the transport's addresses and the credentials of the moment, the status pages a
read-only view (`status_pages.MasterState`).

Leadership (replay before serving, docs/design/coordinator.md#R4; full reports after an election,
docs/design/failover.md#R3). `RaftNode.listeners` reports every change of role. On becoming LEADER
in term t a task waits until sys.catalog has applied the leader's own no-op entry (a successful
`RaftNode.read()` proves it: the ReadIndex of a new leader is only answered once an entry of its
term committed, and `read()` waits until that index is applied here), then, if still leader of term
t, calls `CatalogManager.load()` and `TSManager.request_full_reports()`. Until then the
servicer answers NotReady. On any other role the catalog is `unload()`ed at once and a pending load
is cancelled, so a deposed leader never answers from its caches. The catalog's maps and the tasks
they call for stay warm on followers (sys.catalog's listener runs on every replica), so a load
rebuilds and recomputes nothing: the new leader answers at once and heartbeats its followers
within the election timeout whatever the size of the catalog.

The TSManager is fed by heartbeats on every master, leader or follower (docs/design/failover.md#R1).

Security (docs/design/security.md#R2, #R3; `security`). Once the catalog is loaded, the leader
starts one task owned by this MasterServer: it runs `security.ensure_security` (insert the root CA
if absent, generate token signing keys ahead of use, purge expired ones) at once and then every
`SECURITY_CHECK_INTERVAL_S` (`SECURITY_RETRY_S` after a failure, which is logged, never fatal),
for as long as this master is leader of that term. Any change of role cancels it, as it cancels
a pending load. The CA stored is the provisioned one when this master holds its key (`ca.key`
beside `ca.pem`); the leader signs certificates with it (`cert_issuer`) and authz tokens with
the signing keys (`table_access`), and every RPC is mutual TLS (service/common/tls.py).

Certificate renewal (service/common/cert_renewal.py): a secured master checks its own
certificate every `cert_renewal_check_ms` and, with less than a third of its lifetime left,
*signs itself* a new one (`CertIssuer.renew_own`) rather than asking the leader as a tablet
server does. It may: it holds the CA's key already (in its copy of sys.catalog, and usually
`ca.key`), so asking the leader would add no trust, only a dependency, and a circular one: the
leader is elected and reached over the masters' own mutual TLS, so masters provisioned together,
whose certificates end together, could find no leader left to sign once they expire, and a
follower cut off from the leader could not renew. Signed locally, renewal needs no quorum. It is
held to what the leader would do: sys.catalog's CA, checked to be the one this master's
certificate chains to (the provisioned CA while no leader has stored one yet, which is the CA
the first leader stores), and `cert_issuer.check_request`'s rules and limits for a master asking
for its own uuid. The new key and certificate go over the files `[security]` names, the RPC port
serves them to new handshakes (`ServerCertificates`), and the Raft transport and the
tablet-server proxy reconnect with them.

Background tasks (`background_tasks`): once the catalog is loaded the leader also starts one
`BackgroundTasks` for its term (assignment rounds, CreateTablet/DeleteTablet/AlterSchema RPCs
retried until done, re-replication), fenced with this master's uuid and term. Any change of
role cancels it, as it cancels the security task. Tablet reports are processed on the loaded
leader (`heartbeat`); the RPCs they call for go to the background tasks of the term. The
tablet-server proxy (channels) lives as long as the process.

Status pages and metrics (`status_pages`, `common.http_status`): when `http_bind` is set, an
HTTP server serves HTML pages of this master's view and `/metrics` from the server's own
`MetricsRegistry` (RPC counts and latencies through `errors.observe_rpcs`, the WAL fsync
histogram through `Wal.on_sync`, and callbacks reading the node, catalog and TSManager). It
starts last, once everything it reads exists, and stops first.

Shutdown order (`aclose`), each step relying on the next still being up:

  0. certificate renewal stops, then the HTTP status server (its pages read everything below);
     the term's own work (the leadership task, the security task, the background tasks) is
     cancelled, so no assignment round or task RPC starts while calls drain;
  1. the gRPC server stops taking calls (grace period for calls in flight, which may still
     propose through the node; the RPCs their reports call for are dropped, as on a change of
     role); the tablet servers' heartbeat streams end at once (`closing`), so none is still
     open, to be cancelled, when the grace period ends;
  2. the catalog manager is closed (unloaded, detached from sys.catalog) so nothing proposes
     any more, the report writes still running are cancelled, and the progress clock's probe
     stops;
  3. the Raft node stops: fails its waiters, closes the WAL;
  4. the transport's senders to the peers are closed, and the tablet-server proxy's channels
     (all at once).

The whole of it is bounded (`__main__.SHUTDOWN_TIMEOUT_S`, 4 s): a master
under a storm of heartbeats exits within seconds of SIGTERM. What bounds it: large reports are
decoded off the loop, a few at a time (`heartbeat.read_report`), so the calls in flight at the
grace period's end are cancelled promptly rather than each holding the loop for its decoding;
and no step waits on a peer or a tablet server without a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import random
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

import grpc
import grpc.aio

from service.common.authz import Authorizer
from service.common.cert_renewal import CertRenewer
from service.common.clock import Clock, RealClock
from service.common.config import MasterConfig
from service.common.errors import (
    Corruption,
    FailedPrecondition,
    InvalidArgument,
    TesseraError,
    observe_rpcs,
)
from service.common.http_status import StatusServer, public_address, status_server
from service.common.ids import NodeId, TabletId
from service.common.loop_lag import LoopLagMonitor
from service.common.metrics import MetricsRegistry, RpcMetrics, wal_sync_histogram
from service.common.pki import CertificateAuthority, Identity, ca_key_file, new_request
from service.common.private_files import check_owner_only, check_private_tree, private_dir
from service.common.server_main import advertised_address
from service.common.tls import (
    Credentials,
    ServerCertificates,
    add_port,
    server_credentials_for,
)
from service.consensus.fs import RealFileSystem
from service.consensus.node import LeaderChange, NodeSettings, RaftNode
from service.consensus.raft_store import RaftStore
from service.consensus.transport import ConsensusServicer, GrpcTransport, Incarnations
from service.consensus.vouch import Vouches
from service.master.background_tasks import BackgroundSettings, BackgroundTasks
from service.master.catalog_manager import CatalogManager, Replicate
from service.master.catalog_records import CertAuthorityRecord
from service.master.catalog_settings import CatalogSettings
from service.master.cert_issuer import CertIssuer
from service.master.heartbeat import HeartbeatContext, ReportGate
from service.master.heartbeat_pace import HeartbeatPace
from service.master.master_membership import (
    MasterMembership,
    MasterPeer,
    list_masters_asker,
    master_uuid,
)
from service.master.master_service import POLICY as MASTER_POLICY
from service.master.master_service import MasterParts, MasterServicer
from service.master.progress_clock import ProgressClock
from service.master.report_processing import Answers, Claim, Evidence, ReportAction
from service.master.security import ensure_security, load_ca, public_key
from service.master.status_pages import install_master_metrics, install_master_pages
from service.master.sys_catalog import ApplyResult, CatalogChange, Restored, SysCatalogState
from service.master.table_access import TableAccess
from service.master.ts_manager import TSManager
from service.master.tserver_proxy import Fence, TServerProxy
from service.master.txn_coordinator import TxnCoordinator, TxnSettings
from service.pb import master_pb2 as pb
from service.raft import RaftConfig, Role

__all__ = ["GROUP", "MasterPeer", "MasterServer", "master_uuid"]

log = logging.getLogger(__name__)

_CONFIRM_TIMEOUT_S = 0.5
"""How long a voter asked to confirm a membership claim may take (report_processing, step 3):
within the heartbeat's report budget. A voter that cannot answer in time is asked again with
the report's next sending."""
_SWEEP_CONFIRM_TIMEOUT_S = 5.0
"""The same, for the claim sweep of the background tasks (claims.py): off the heartbeat path, so
a voter busy for seconds (a slow host after a failover) can still answer; one sweep runs at a
time, so a slow voter only delays the next sweep."""

GROUP = "sys.catalog"
"""The Raft group id of the masters' replicated catalog."""

INSTANCE_FILE = "instance"
LOAD_RETRY_S = 0.05
"""Pause between attempts to pass the read barrier of a new leader (its no-op not committed)."""
LOAD_READ_TIMEOUT_S = 5.0
SERVER_GRACE_S = 1.0
SECURITY_CHECK_INTERVAL_S = 60.0
"""Pause between the leader's checks of the CA and token signing keys (keys rotate daily and
one is always generated ahead, so a minute late is harmless)."""
SECURITY_RETRY_S = 1.0
"""Pause after a failed check (replication failed, a racing write was refused)."""


def _check_instance(data_dir: Path, uuid: NodeId) -> None:
    """Write `<data_dir>/instance` on first start; refuse a data dir of another identity, or
    one whose sys.catalog files (the CA key, the token signing keys) others could read."""
    private_dir(data_dir)
    check_private_tree(
        data_dir / "raft", "sys.catalog (the cluster's CA key and token signing keys)"
    )
    path = data_dir / INSTANCE_FILE
    if path.exists():
        recorded = path.read_text().strip()
        if recorded != uuid:
            raise FailedPrecondition(
                f"{data_dir} belongs to master {recorded!r}, but this master's address makes it "
                f"{uuid!r}: a master cannot change address in place (remove and re-add it)"
            )
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(uuid + "\n")
    tmp.replace(path)


class MasterServer:
    """One master process (module docstring). `start()` binds and serves; `aclose()` stops.

    After `start()`: `address` is the advertised host:port, `uuid` this master's uuid, `peers`
    the masters of the group's current config (and this one), and `http_address` the
    host:port of the status pages ("" when `http_bind` is empty).
    """

    def __init__(self, config: MasterConfig) -> None:
        self.config = config
        self.address = ""
        self.uuid = NodeId("")
        self.instance_seqno = int(time.time() * 1_000_000)
        self.node: RaftNode | None = None
        self.catalog: CatalogManager | None = None
        self.ts_manager: TSManager | None = None
        self.transport: GrpcTransport | None = None
        self.vouches: Vouches | None = None
        self._server: grpc.aio.Server | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._closed = False
        self.closing = asyncio.Event()
        """Set when `aclose` begins: the tablet servers' heartbeat streams end at once
        (`master_service.MasterServicer.TSHeartbeatStream`)."""
        # Security (module docstring): set by start(), the task runs while leader.
        self._sys_catalog: SysCatalogState | None = None
        self.access: TableAccess | None = None
        self.issuer: CertIssuer | None = None
        """Signs certificates on request (cert_issuer.py); None when insecure."""
        self._provisioned_ca: CertAuthorityRecord | None = None
        self._token_keys: tuple[tuple[tuple[int, int], ...], tuple[pb.TokenVerifyingKeyPB, ...]]
        self._token_keys = ((), ())
        """Per-table authorization and authz tokens (table_access.py); set at start."""
        self._replicate: Replicate | None = None
        self._clock: Clock = RealClock()
        self._security_task: asyncio.Task[None] | None = None
        self.progress_clock: ProgressClock | None = None
        self.report_gate = ReportGate.from_config(config)
        self._probe_task: asyncio.Task[None] | None = None
        self._addresses_pb: tuple[tuple[MasterPeer, ...], tuple[pb.HostPortPB, ...]] | None = None
        self._follower_heartbeat_ms = min(
            config.follower_heartbeat_interval_ms, config.unresponsive_timeout_ms // 4
        )
        """The pace a follower asks of tablet servers: it records liveness only, so a quarter
        of the unresponsive timeout at most keeps its registry warm (docs/design/failover.md#R1)."""
        # Background tasks (module docstring): the proxy lives as long as the process.
        self.proxy: TServerProxy | None = None
        self.txns: TxnCoordinator | None = None
        self.credentials: Credentials | None = None
        """This master's certificate and key (security.mode = "secure"), for every channel."""
        self.certificates: ServerCertificates | None = None
        """What its port serves, replaced on renewal (module docstring)."""
        self.renewer: CertRenewer | None = None
        self.background: BackgroundTasks | None = None
        self._rng = random.Random()
        # Status pages and metrics (module docstring): one registry per server object.
        self.metrics = MetricsRegistry()
        self.loop_lag = LoopLagMonitor(
            self.metrics, stall_s=config.raft.heartbeat_interval_ms / 1000.0
        )
        self.heartbeat_pace = HeartbeatPace(
            config.tserver_heartbeat_interval_ms, config.unresponsive_timeout_ms // 4
        )
        """The heartbeat interval a leader asks of tablet servers, stretched while its loop
        lags or its CPU saturates (heartbeat_pace.py)."""
        self.loop_lag.listeners.append(self.heartbeat_pace.observe)
        self.rpc_metrics = RpcMetrics(self.metrics)
        self.wal_sync = wal_sync_histogram(self.metrics)
        install_master_metrics(self, self.metrics)
        self.http: StatusServer | None = None
        self.http_address = ""

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind, open sys.catalog (WAL recovery), wire the services, start serving."""
        config = self.config
        creds = server_credentials_for(config.security, Path(config.data_dir), config.rpc_bind)
        self.credentials = creds
        self._provisioned_ca = self._load_provisioned_ca(creds)
        server = grpc.aio.server(options=config.rpc.server_options())
        self.certificates = ServerCertificates(creds) if creds is not None else None
        port = add_port(server, config.rpc_bind, self.certificates)
        if port == 0:
            raise OSError(f"could not bind {config.rpc_bind}")
        self._server = server
        self.address = advertised_address(config.rpc_bind, config.advertised_address, port)
        self.uuid = master_uuid(self.address)
        if creds is not None and creds.identity != Identity("master", self.uuid):
            raise InvalidArgument(
                f"{config.security.cert_file}: the certificate binds {creds.identity}, but this "
                f"server is master {self.uuid!r}: give it a certificate of its own"
            )
        addresses = config.master_addresses or (self.address,)
        joining = config.join_existing
        if self.address not in addresses and not joining:
            raise InvalidArgument(
                f"this master's address {self.address!r} is not one of master_addresses "
                f"{list(addresses)}: set advertised_address"
            )
        seeds = tuple(MasterPeer(master_uuid(a), a) for a in addresses)
        # A joining master bootstraps no group (module docstring: membership): its config is
        # empty until the leader's snapshot or log gives it the group's.
        bootstrap = RaftConfig(frozenset() if joining else frozenset(p.uuid for p in seeds))
        data_dir = Path(config.data_dir)
        _check_instance(data_dir, self.uuid)

        fs = RealFileSystem()
        incarnations = Incarnations(fs, str(data_dir), self.uuid)
        transport = GrpcTransport(
            self.uuid,
            incarnations=incarnations,
            max_message_bytes=config.rpc.max_message_bytes,
            credentials=creds,
            peer_role="master",
        )
        self.transport = transport
        store, recovered = RaftStore.open(
            fs,
            os.path.join(str(data_dir), "raft"),
            self.uuid,
            bootstrap_config=bootstrap,
            addresses={**{p.uuid: p.address for p in seeds}, self.uuid: self.address},
            segment_bytes=config.wal.segment_size_bytes,
            preallocate=config.wal.preallocate,
            fsync=config.wal.fsync,
            on_wal_sync=self.wal_sync.observe,
        )
        sys_catalog = SysCatalogState()
        sys_catalog.add_listener(_FreezeGrownCatalog())
        node = RaftNode(
            group_id=GROUP,
            uuid=self.uuid,
            store=store,
            recovered=recovered,
            state_machine=sys_catalog,
            transport=transport,
            settings=NodeSettings.from_raft_settings(config.raft),
        )
        self.node = node
        # Heartbeat ages, creation timeouts and retries are measured on the master's own
        # progress, so a stall of this event loop never makes healthy servers look dead
        # (progress_clock); the probe runs until aclose.
        clock = ProgressClock(RealClock(), config.loop_stall_threshold_ms / 1000.0)
        self.progress_clock = clock
        self._probe_task = asyncio.create_task(clock.run(), name="master-progress-probe")
        self.loop_lag.start()
        self.ts_manager = TSManager.from_config(config, clock)

        async def replicate(data: bytes, timeout: float) -> ApplyResult:
            return cast(ApplyResult, await node.propose(data, timeout=timeout))

        self._sys_catalog, self._replicate, self._clock = sys_catalog, replicate, clock
        self.catalog = CatalogManager(
            sys_catalog,
            replicate,
            self.ts_manager,
            clock,
            self._rng,
            CatalogSettings.from_config(config),
        )
        if creds is not None:
            provisioned = self._provisioned_ca
            self.issuer = CertIssuer(
                sys_catalog,
                creds.ca_pem,
                replicate,
                CertificateAuthority(provisioned.certificate_pem, provisioned.private_key_pem)
                if provisioned is not None
                else None,
            )
        # Token expiry is wall-clock time: tablet servers compare it with their own clocks.
        self.access = TableAccess(
            sys_catalog,
            token_ttl_s=config.authz_token_ttl_ms / 1000.0,
            now_us=lambda: int(time.time() * 1_000_000),
        )
        self.proxy = TServerProxy(
            rpc_timeout_s=config.tserver_rpc_timeout_ms / 1000.0,
            grpc_options=config.rpc.grpc_options(),
            credentials=creds,
        )
        self.txns = TxnCoordinator(
            sys_catalog,
            replicate,
            self._locate_tablet,
            self.proxy,
            now_us=lambda: int(time.time() * 1_000_000),
            monotonic=clock.monotonic,
            settings=TxnSettings.from_config(config),
        )
        node.listeners.append(self._on_leader_change)
        # A master whose config is stale (down while a master joined that leads now) takes
        # the new leader on the word of a master its config names (consensus/vouch.py).
        self.vouches = Vouches(
            self.uuid,
            lambda group: node if group == GROUP else None,
            transport,
            list_masters_asker(lambda: self.credentials),
        )
        transport.on_foreign = self.vouches.on_foreign
        vouches = self.vouches
        transport.register(
            GROUP,
            node.step,
            node.report_unreachable,
            node.snapshot_sent,
            members=lambda: vouches.members(GROUP, node),
            leader_term=node.leader_term,
            peer_gone=node.peer_gone,
        )
        secure = creds is not None
        consensus_servicer = ConsensusServicer(
            transport, Authorizer(ConsensusServicer.policy("master"), secure=secure)
        )
        master_servicer = MasterServicer(self._servicer_parts())
        master_servicer.authorizer = Authorizer(MASTER_POLICY, secure=secure)
        for servicer in (consensus_servicer, master_servicer):
            observe_rpcs(servicer, self.rpc_metrics)
        consensus_servicer.add_to_server(server)
        master_servicer.add_to_server(server)
        await server.start()
        await node.start()
        # A ready stream to every other master before it is needed: the first message between
        # two followers is the vote request when the leader is gone (transport.py: warm peers).
        transport.keep_warm(node.config_members)
        if creds is not None:
            self.renewer = CertRenewer(
                self._sign_own_certificate,
                self._current_credentials,
                self._switch_credentials,
                check_interval_s=config.cert_renewal_check_ms / 1000,
            )
            self.renewer.start()
        if config.http_bind:
            # Off loopback the pages need a client certificate (docs/design/security.md#R13).
            http = status_server(
                config.http_bind,
                config.http_auth,
                self.metrics,
                title="Tessera master",
                credentials=self._current_credentials if creds is not None else None,
            )
            install_master_pages(self, http)
            self.http = http
            await http.start()
            advertised_host = self.address.rpartition(":")[0].strip("[]")
            self.http_address = public_address(config.http_bind, http.port, advertised_host)
        log.info(
            "master %s serving on %s (data %s, masters %s, status pages %s)",
            self.uuid,
            self.address,
            data_dir,
            ", ".join(p.address for p in self.peers) + (" (joining)" if joining else ""),
            f"{self.http.scheme}://{self.http_address}/" if self.http else "off",
        )

    async def aclose(self) -> None:
        """Stop in the order of the module docstring. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.closing.set()
        if self.renewer is not None:
            await self.renewer.aclose()
        if self.http is not None:
            await self.http.aclose()
        if self._load_task is not None:
            self._load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._load_task
        if self._security_task is not None:
            self._security_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._security_task
        if self.background is not None:
            await self.background.aclose()
            self.background = None
        if self._server is not None:
            await self._server.stop(grace=SERVER_GRACE_S)
        if self.catalog is not None:
            self.catalog.close()
        await self.report_gate.aclose()
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._probe_task
        await self.loop_lag.aclose()
        if self.vouches is not None:
            await self.vouches.aclose()
        if self.node is not None:
            await self.node.aclose()
        if self.transport is not None:
            await self.transport.aclose()
        if self.proxy is not None:
            await self.proxy.aclose()

    # --- leadership --------------------------------------------------------------------------

    def _on_leader_change(self, change: LeaderChange) -> None:
        """RaftNode listener (runs in the node's task: never blocks)."""
        if self._closed or self.catalog is None:
            return
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        self._load_task = None
        self._stop_security()
        self._stop_background()
        if change.role is Role.LEADER:
            self._load_task = asyncio.create_task(
                self._become_leader(change.term), name=f"master-load-{change.term}"
            )
            self._load_task.add_done_callback(self._load_ended)
        elif self.catalog.loaded:
            log.info(
                "master %s lost leadership (term %d): catalog unloaded", self.uuid, change.term
            )
            self.catalog.unload()

    def _load_ended(self, task: asyncio.Task[None]) -> None:
        """Retrieve how a load ended: the task is dropped at the next change of role, and an
        error nobody retrieves is logged by asyncio as "Task exception was never retrieved"
        with a traceback (seen when masters flapped under load)."""
        if task.cancelled():
            return
        err = task.exception()
        if isinstance(err, TesseraError):
            log.warning("master %s: the catalog load of a term failed: %s", self.uuid, err)
        elif err is not None:
            log.error("master %s: the catalog load failed", self.uuid, exc_info=err)

    async def _become_leader(self, term: int) -> None:
        """Wait for the no-op of `term` to be applied, then load the catalog (docstring)."""
        node, catalog, ts = self.node, self.catalog, self.ts_manager
        assert node is not None and catalog is not None and ts is not None
        while True:
            st = node.status()
            if st.role is not Role.LEADER or st.term != term:
                return
            try:
                index = await node.read(timeout=LOAD_READ_TIMEOUT_S)
                break
            except TesseraError as e:
                log.debug(
                    "master %s: read barrier of term %d not passed yet: %s", self.uuid, term, e
                )
                await asyncio.sleep(LOAD_RETRY_S)
        st = node.status()
        if st.role is not Role.LEADER or st.term != term:
            return
        # The catalog is long-lived: out of the cyclic collector's sight from now on. A full
        # collection walks every object of the heap on this loop, 0.3 s per 30,000 tablets
        # measured in process (more on a loaded machine), and the new leader's first seconds
        # (300 full reports decoded) allocate enough to trigger one. `gc.freeze` costs nothing;
        # what it keeps alive is the cyclic garbage of this instant (objects freed by their
        # reference counts are freed as before).
        gc.freeze()
        catalog.load()  # rebuilds and recomputes nothing: the maps and tasks are warm
        asked = ts.request_full_reports()
        self.report_gate.turns.clear()
        log.info(
            "master %s is the leader of term %d: catalog ready at index %d, full reports "
            "due from %d tablet servers (asked a few at a time)",
            self.uuid,
            term,
            index,
            asked,
        )
        self._start_security(term)
        self._start_background(term)

    # --- security: CA and token signing keys (module docstring) ------------------------------

    def _start_security(self, term: int) -> None:
        self._stop_security()
        self._security_task = asyncio.create_task(
            self._security_loop(term), name=f"master-security-{term}"
        )

    def _stop_security(self) -> None:
        if self._security_task is not None and not self._security_task.done():
            self._security_task.cancel()
        self._security_task = None

    async def _security_loop(self, term: int) -> None:
        """While leader of `term`: ensure the CA and the signing keys, then wait and repeat."""
        node, sys_catalog, replicate = self.node, self._sys_catalog, self._replicate
        assert node is not None and sys_catalog is not None and replicate is not None
        while True:
            st = node.status()
            if st.role is not Role.LEADER or st.term != term:
                return
            pause = SECURITY_CHECK_INTERVAL_S
            try:
                now_us = int(self._clock.now() * 1_000_000)
                await ensure_security(
                    sys_catalog, replicate, now_us, provisioned=self._provisioned_ca
                )
            except TesseraError as e:
                log.warning("master %s: CA/signing key check failed: %s", self.uuid, e)
                pause = SECURITY_RETRY_S
            except Exception:
                log.exception("master %s: CA/signing key check failed", self.uuid)
                pause = SECURITY_RETRY_S
            await asyncio.sleep(pause)

    # --- background tasks (module docstring) -------------------------------------------------

    def _start_background(self, term: int) -> None:
        self._stop_background()
        assert self.catalog is not None and self.ts_manager is not None
        assert self.proxy is not None
        self.background = BackgroundTasks(
            self.catalog,
            self.ts_manager,
            self.proxy,
            Fence(self.uuid, term),
            self._clock,
            self._rng,
            BackgroundSettings.from_config(self.config),
            confirm_claims=functools.partial(
                self._confirm_claims, timeout_s=_SWEEP_CONFIRM_TIMEOUT_S
            ),
        )
        self.background.start()
        if self.txns is not None:
            self.txns.start(Fence(self.uuid, term))

    def _stop_background(self) -> None:
        if self.background is not None:
            self.background.stop()
        self.background = None
        if self.txns is not None:
            self.txns.stop()

    def _locate_tablet(self, tablet: TabletId) -> tuple[list[tuple[NodeId, str]], bool]:
        """A transaction participant's replicas to call (its reported leader first, then the
        other voters), and whether the tablet is gone (txn_coordinator.py)."""
        catalog, ts = self.catalog, self.ts_manager
        if catalog is None or ts is None or not catalog.loaded:
            return [], False
        info = catalog.maps.tablets_by_id.get(tablet)
        if info is None or info.record.state.is_terminal:
            return [], True
        cs = info.record.consensus
        if cs is None:
            return [], False
        order = [cs.leader_uuid] if cs.leader_uuid else []
        order += [p.uuid for p in cs.peers if p.uuid != cs.leader_uuid]
        out = []
        for uuid in order:
            address = ts.rpc_address(uuid)
            if address is not None:
                out.append((NodeId(uuid), address))
        return out, False

    def submit_actions(self, actions: Iterable[ReportAction]) -> None:
        """Hand report-driven RPCs to this term's background tasks (dropped when not leading)."""
        if self.background is not None:
            self.background.submit(actions)

    # --- views for the servicer --------------------------------------------------------------

    def _servicer_parts(self) -> MasterParts:
        """What the Master API delegates to (`master_service.MasterParts`), once started."""
        node, catalog, ts, proxy = self.node, self.catalog, self.ts_manager, self.proxy
        assert node is not None and catalog is not None and ts is not None
        assert proxy is not None and self.txns is not None and self.access is not None
        return MasterParts(
            uuid=self.uuid,
            instance_seqno=self.instance_seqno,
            node=node,
            catalog=catalog,
            ts_manager=ts,
            proxy=proxy,
            txns=self.txns,
            access=self.access,
            issuer=self.issuer,
            membership=MasterMembership(
                node, self.uuid, self.address_of, credentials=lambda: self.credentials
            ),
            closing=self.closing,
            peers=lambda: self.peers,
            address_of=self.address_of,
            heartbeat_context=self.heartbeat_context,
            background=lambda: self.background,
        )

    def heartbeat_context(self) -> HeartbeatContext:
        """What `heartbeat.handle_heartbeat` needs, as of now."""
        node, catalog, ts = self.node, self.catalog, self.ts_manager
        assert node is not None and catalog is not None and ts is not None
        st = node.status()
        return HeartbeatContext(
            master_instance=pb.NodeInstancePB(
                permanent_uuid=self.uuid, instance_seqno=self.instance_seqno
            ),
            term=st.term,
            leading=st.role is Role.LEADER and catalog.loaded,
            master_addresses=self._master_addresses_pb(),
            ts_manager=ts,
            catalog=catalog,
            submit=self.submit_actions,
            reports=self.report_gate,
            token_keys=self._token_keys_pb(),
            confirm_claims=self._confirm_claims,
            heartbeat_interval_ms=(
                self.heartbeat_pace.asked_ms()
                if st.role is Role.LEADER
                else max(self._follower_heartbeat_ms, self.heartbeat_pace.asked_ms())
            ),
        )

    async def _confirm_claims(
        self, claims: Sequence[Claim], timeout_s: float = _CONFIRM_TIMEOUT_S
    ) -> dict[TabletId, Answers]:
        """Ask the servers of each claimed tablet what they hold (`report_processing`, step
        3; claims.py): the recorded config's voters (who saw what came before) and the claim's
        (who saw it happen), but not the claimant, whose word is its report. One
        GetConsensusState per server, all at once, each at the address that server registered
        itself (never one the claim names, which the claimant wrote)."""
        ts, proxy, catalog = self.ts_manager, self.proxy, self.catalog
        if ts is None or proxy is None or catalog is None:
            return {}
        asks: dict[str, list[TabletId]] = {}
        for claim in claims:
            info = catalog.maps.tablets_by_id.get(claim.tablet_id)
            recorded = info.record.consensus if info is not None else None
            peers = [*claim.consensus.peers, *(recorded.peers if recorded is not None else ())]
            for uuid in dict.fromkeys(p.uuid for p in peers if p.uuid != claim.reporter):
                asks.setdefault(uuid, []).append(claim.tablet_id)

        async def ask(uuid: str, tablets: list[TabletId]) -> dict[str, Evidence]:
            address = ts.rpc_address(uuid)
            if address is None:
                return {}
            try:
                return await proxy.consensus_states(
                    address, uuid, list(tablets), timeout_s=timeout_s
                )
            except TesseraError as e:
                log.info("could not ask %s about %d tablets: %s", uuid, len(tablets), e)
                return {}

        uuids = list(asks)
        results = await asyncio.gather(*(ask(u, asks[u]) for u in uuids))
        out: dict[TabletId, dict[NodeId, Evidence]] = {}
        for server, answers in zip(uuids, results, strict=True):
            for answered, evidence in answers.items():
                out.setdefault(TabletId(answered), {})[NodeId(server)] = evidence
        return dict(out)

    # --- certificate renewal (module docstring) -----------------------------------------------

    def _current_credentials(self) -> Credentials:
        assert self.credentials is not None  # the renewer runs only on a secured master
        return self.credentials

    async def _sign_own_certificate(self, creds: Credentials) -> Credentials:
        """A new key and a certificate of this master's own identity, signed here (module
        docstring), written over the files `[security]` names (the key first)."""
        assert self.issuer is not None
        key_pem, csr = new_request()
        issued = self.issuer.renew_own(creds.identity, csr)
        files = self.config.security.files(Path(self.config.data_dir))
        files.write(issued.ca_certificate_pem, issued.certificate_pem, key_pem)
        return Credentials.from_files(files)

    async def _switch_credentials(self, creds: Credentials) -> None:
        """Serve and call with renewed credentials from now on."""
        self.credentials = creds
        if self.certificates is not None:
            self.certificates.update(creds)
        if self.transport is not None:
            self.transport.credentials = creds
        if self.proxy is not None:
            self.proxy.replace_credentials(creds)

    def _load_provisioned_ca(self, creds: Credentials | None) -> CertAuthorityRecord | None:
        """The CA this master was provisioned with, if its key is here (`ca.key` beside
        `ca.pem`, owner-only): the leader stores it in sys.catalog, after which any leader
        signs certificates with it. None without one (the master then signs nothing until a
        master that has it stored it)."""
        if creds is None:
            return None
        path = ca_key_file(self.config.security.files(Path(self.config.data_dir)).ca_file)
        if not path.exists():
            log.info(
                "master: no CA key at %s; certificates are signed by masters that have it", path
            )
            return None
        check_owner_only(path, "the CA's private key")
        record = CertAuthorityRecord(creds.ca_pem, path.read_bytes())
        try:
            load_ca(record)
        except Corruption as e:
            raise InvalidArgument(f"{path}: {e.message}") from None
        return record

    def _token_keys_pb(self) -> tuple[pb.TokenVerifyingKeyPB, ...]:
        """The signing keys' public halves, rebuilt only when the keys change."""
        sys_catalog = self._sys_catalog
        if sys_catalog is None:
            return ()
        rows = sys_catalog.signing_keys()
        versions = tuple((r.record.key_seq, r.version) for r in rows)
        if versions != self._token_keys[0]:
            keys = (public_key(r.record) for r in rows)
            self._token_keys = (
                versions,
                tuple(
                    pb.TokenVerifyingKeyPB(
                        key_seq=k.key_seq, expire_time_us=k.expire_time_us, public_key=k.public_key
                    )
                    for k in keys
                ),
            )
        return self._token_keys[1]

    @property
    def peers(self) -> tuple[MasterPeer, ...]:
        """The members of sys.catalog's latest config (voters and non-voters), plus this master
        if it is not (or not yet) one, sorted by address. Membership changes with AddMaster and
        RemoveMaster, so this is read from the Raft node, never from `master_addresses`."""
        if self.node is None:
            return ()
        config = self.node.status().config
        uuids = config.voters | config.learners | {self.uuid}
        peers = [MasterPeer(u, self.address_of(u) or "") for u in uuids]
        return tuple(sorted(peers, key=lambda p: (p.address, p.uuid)))

    def _master_addresses_pb(self) -> tuple[pb.HostPortPB, ...]:
        """`peers` as HostPortPBs, rebuilt only when the peers change: every heartbeat (a
        thousand a second) answers with them."""
        peers = self.peers
        cached = self._addresses_pb
        if cached is not None and cached[0] == peers:
            return cached[1]
        out = []
        for p in peers:
            if not p.address:
                continue
            host, _, port = p.address.rpartition(":")
            out.append(pb.HostPortPB(host=host, port=int(port) if port.isdigit() else 0))
        self._addresses_pb = (peers, tuple(out))
        return self._addresses_pb[1]

    def address_of(self, uuid: str) -> str | None:
        """A master's address by uuid (the transport knows every member's: from the bootstrap
        addresses, the config entries that added them, and its peers' messages)."""
        if uuid == self.uuid:
            return self.address
        return self.transport.address_of(uuid) if self.transport is not None else None


class _FreezeGrownCatalog:
    """A sys.catalog listener that moves the heap out of the cyclic collector's sight
    (`gc.freeze`) each time the catalog has written `ROWS` rows since the last time, on every
    master, leader or follower.

    Why. A full collection walks every object of the heap on the event loop: about 0.3 s per
    30,000 tablets in process, two seconds and more at 200,000 on a loaded machine, past the
    election timeout. Catalog objects are long-lived, and the collections their allocations
    trigger (a 10,000-tablet CreateTable applied) were the loop's longest holds while a large
    catalog grew: a leader held its loop 2.1 s and lost its term, followers held theirs long
    enough to miss appends. Growing an in-process catalog to 100,000 tablets on a loaded
    machine: the longest full collection 2.61 s (26.6 s in all) without, 0.50 s (6.6 s) with.
    Frozen objects are still freed by their reference counts (the catalog's records are
    acyclic); only cyclic garbage of the instant stays.
    """

    ROWS = 5_000

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, change: CatalogChange) -> None:
        if isinstance(change, Restored):
            gc.freeze()
            self.rows = 0
            return
        self.rows += len(change.written)
        if self.rows >= self.ROWS:
            gc.freeze()
            self.rows = 0
