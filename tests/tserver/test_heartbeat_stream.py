"""The tablet server's heartbeat stream to one master (service/tserver/heartbeater.py,
`HeartbeatStream`): heartbeats as messages on one TSHeartbeatStream, a failure of any kind
surfacing at once as an error the heartbeat loop counts, and a new stream on the next try."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from service.common import channel_options
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.tools.launcher import free_ports
from service.tserver.heartbeater import HeartbeatStream


class Master(master_pb2_grpc.MasterServiceServicer):
    """Answers each heartbeat with the term it is told, after `delay_s`."""

    def __init__(self) -> None:
        self.term = 1
        self.delay_s = 0.0
        self.streams = 0

    async def TSHeartbeatStream(
        self, request_iterator: AsyncIterator[pb.TSHeartbeatRequestPB], context: object
    ) -> AsyncIterator[pb.TSHeartbeatResponsePB]:
        self.streams += 1
        async for _ in request_iterator:
            await asyncio.sleep(self.delay_s)
            yield pb.TSHeartbeatResponsePB(master_term=self.term, leader_master=True)


async def serve(master: Master, address: str) -> grpc.aio.Server:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    master_pb2_grpc.add_MasterServiceServicer_to_server(master, server)
    server.add_insecure_port(address)
    await server.start()
    return server


async def connect(
    timeout_s: float,
) -> tuple[Master, str, grpc.aio.Server, grpc.aio.Channel, HeartbeatStream]:
    """A master on a free port and a heartbeat stream to it."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    master = Master()
    server = await serve(master, address)
    channel = grpc.aio.insecure_channel(address)
    stream = HeartbeatStream(master_pb2_grpc.MasterServiceStub(channel), timeout_s=timeout_s)
    return master, address, server, channel, stream


def test_heartbeats_share_one_stream_and_survive_a_master_restart() -> None:
    async def main() -> None:
        master, address, server, channel, stream = await connect(2.0)
        req = pb.TSHeartbeatRequestPB()
        for term in (1, 2, 3):
            master.term = term
            assert (await stream.heartbeat(req)).master_term == term
        assert master.streams == 1  # one stream, three heartbeats
        await server.stop(grace=None)
        with pytest.raises((ConnectionError, grpc.aio.AioRpcError)):
            await asyncio.wait_for(stream.heartbeat(req), 1.0)  # fails at once, no hang
        server = await serve(master, address)  # the master comes back on its address
        for _ in range(50):
            try:
                resp = await stream.heartbeat(req)
                break
            except (ConnectionError, grpc.aio.AioRpcError):
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("no heartbeat got through after the restart")
        assert resp.master_term == 3 and master.streams == 2
        stream.close()
        await channel.close()
        await server.stop(grace=None)

    asyncio.run(main())


def test_an_unanswered_heartbeat_times_out_and_the_next_opens_a_new_stream() -> None:
    async def main() -> None:
        master, _, server, channel, stream = await connect(0.2)
        master.delay_s = 1.0
        with pytest.raises(TimeoutError):
            await stream.heartbeat(pb.TSHeartbeatRequestPB())
        master.delay_s = 0.0
        await stream.heartbeat(pb.TSHeartbeatRequestPB())
        assert master.streams == 2
        stream.close()
        await channel.close()
        await server.stop(grace=None)

    asyncio.run(main())


@pytest.mark.integration  # real reconnect backoff: 12 s of a master down, by the wall clock
def test_a_master_back_after_a_long_outage_is_heartbeated_within_two_seconds() -> None:
    """The heartbeat channel's reconnect backoff is capped (channel_options.heartbeat): with
    gRPC's default the channel to a master down for 12 s would wait several seconds more
    (doubling from 1 s, up to 120 s) after the master came back, and a master that wins an
    election meanwhile has a cold registry."""

    async def main() -> None:
        (port,) = free_ports(1)
        address = f"127.0.0.1:{port}"
        master = Master()
        server = await serve(master, address)
        channel = grpc.aio.insecure_channel(address, options=channel_options.heartbeat())
        stream = HeartbeatStream(master_pb2_grpc.MasterServiceStub(channel), timeout_s=1.0)
        req = pb.TSHeartbeatRequestPB()
        await stream.heartbeat(req)
        await server.stop(grace=None)
        down_until = asyncio.get_running_loop().time() + 12.0
        while asyncio.get_running_loop().time() < down_until:  # the heartbeater keeps trying
            with contextlib.suppress(ConnectionError, grpc.aio.AioRpcError, TimeoutError):
                await stream.heartbeat(req)
            await asyncio.sleep(0.5)
        server = await serve(master, address)
        back = asyncio.get_running_loop().time()
        while True:
            try:
                await stream.heartbeat(req)
                break
            except (ConnectionError, grpc.aio.AioRpcError, TimeoutError):
                await asyncio.sleep(0.1)
        assert asyncio.get_running_loop().time() - back < 2.5
        stream.close()
        await channel.close()
        await server.stop(grace=None)

    asyncio.run(main())
