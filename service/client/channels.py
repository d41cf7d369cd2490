"""One gRPC channel per server address, shared by everything a client does.

A channel multiplexes calls over one HTTP/2 connection and reconnects on its own, so the client
keeps exactly one per address for its lifetime (masters and tablet servers alike) rather than
dialing per call. Its options (reconnect backoff capped at 300 ms, 64 MiB messages) and why are
`channel_options.client` (service/common/channel_options.py).

Every channel carries the error mapping (service/common/error_mapping.py): a call made through
the pool fails with the `TesseraError` the server raised, never a bare `grpc.aio.AioRpcError`.
"""

from __future__ import annotations

import grpc
import grpc.aio

from service.client.scan_reply import ScanStub
from service.common import channel_options
from service.common.error_mapping import INTERCEPTORS
from service.common.tls import Credentials, open_channel
from service.pb import master_pb2_grpc, tserver_pb2_grpc

__all__ = ["MAX_MESSAGE_BYTES", "ChannelPool"]

MAX_MESSAGE_BYTES = channel_options.CLIENT_MAX_MESSAGE_BYTES
"""Largest message either way (service/common/channel_options.py says why)."""

_OPTIONS = channel_options.client()


class ChannelPool:
    """Channels by address and server role, created on first use, closed together by
    `aclose()`. With `credentials`, every channel is mutual TLS and accepts only a server
    certificate of the role asked for (service/common/tls.py). Calls on its channels raise
    `TesseraError`s (module docstring)."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}

    def channel(self, address: str, role: str = "") -> grpc.aio.Channel:
        ch = self._channels.get((address, role))
        if ch is None:
            ch = open_channel(
                address, self.credentials, role=role, options=_OPTIONS, interceptors=INTERCEPTORS
            )
            self._channels[(address, role)] = ch
        return ch

    def master(self, address: str) -> master_pb2_grpc.MasterServiceStub:
        return master_pb2_grpc.MasterServiceStub(self.channel(address, "master"))

    def tserver(self, address: str) -> ScanStub:
        """The data service of the tablet server at `address`; its Scan and ScanNext read
        pages in place (service/client/scan_reply.py)."""
        return ScanStub(self.channel(address, "tserver"))

    def tserver_admin(self, address: str) -> tserver_pb2_grpc.TabletServerAdminServiceStub:
        return tserver_pb2_grpc.TabletServerAdminServiceStub(self.channel(address, "tserver"))

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close(None)
