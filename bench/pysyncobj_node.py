"""One PySyncObj node with the KvDemo Put/Status API, so bench.loadgen drives it like Tessera.

    python -m bench.pysyncobj_node --raft 127.0.0.1:R1 --grpc 127.0.0.1:G1 \
        --peer 127.0.0.1:R2=127.0.0.1:G2 --peer 127.0.0.1:R3=127.0.0.1:G3 \
        --journal DIR/journal.bin [--ready-file F]

PySyncObj replicates a `dict` through a `@replicated` method. Its Raft runs in PySyncObj's own
tick thread (autoTick, the library default); the gRPC server runs on an asyncio loop in the main
thread. A Put calls the replicated method with a `callback`, which PySyncObj invokes in its tick
thread once the entry is committed and applied on this node; the callback resolves an asyncio
future through `call_soon_threadsafe`. Only the leader (`_isLeader()`) accepts puts: any other
node answers UNAVAILABLE with the leader's gRPC address (mapped from `_getLeader()`, a Raft
address) in the `tessera-leader-address` trailing metadata, exactly as Tessera's NOT_THE_LEADER
does, so the same client code follows it.

Durability: PySyncObj 0.3.17's journal (`journalFile`) is an mmap'd file that is appended to in
memory and never msync'd or fsynced on the commit path (`FileJournal.flush()` exists but
SyncObj never calls it; `SyncObjConf` has no option to turn that on). Term and vote go to a
`.meta` file with a plain write + rename. So PySyncObj acknowledges writes that are only in the
page cache: fsync is OFF. Everything else is PySyncObj's defaults (appendEntriesUseBatch=True,
appendEntriesPeriod=0.1 s, raftMinTimeout=0.4 s, raftMaxTimeout=1.4 s).
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
from typing import Any, NoReturn

import grpc
import grpc.aio
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from service.common import channel_options
from service.pb import kvdemo_pb2, kvdemo_pb2_grpc

LEADER_ADDRESS_KEY = "tessera-leader-address"
FSYNC = False  # see the module docstring


class ReplicatedDict(SyncObj):
    def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, partners, conf)
        self.kv: dict[str, bytes] = {}
        self.applied = 0

    @replicated
    def set(self, key: str, value: bytes) -> int:
        self.kv[key] = value
        self.applied += 1
        return self.applied


class PySyncObjKvServicer(kvdemo_pb2_grpc.KvDemoServicer):
    def __init__(self, obj: ReplicatedDict, grpc_of_raft: dict[str, str], uuid: str) -> None:
        self.obj = obj
        self.grpc_of_raft = grpc_of_raft
        self.uuid = uuid

    def _leader_grpc(self) -> str:
        leader = self.obj._getLeader()
        if leader is None:
            return ""
        return self.grpc_of_raft.get(str(leader.address), "")

    async def Put(
        self, request: kvdemo_pb2.PutRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kvdemo_pb2.PutResponse:
        return await self._put(request, context)

    async def PutStream(
        self,
        request_iterator: AsyncIterator[kvdemo_pb2.PutRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[kvdemo_pb2.PutResponse]:
        """The same client protocol Tessera's demo offers (so both are measured alike)."""
        async for request in request_iterator:
            yield await self._put(request, context)

    async def _put(
        self, request: kvdemo_pb2.PutRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kvdemo_pb2.PutResponse:
        if not self.obj._isLeader():
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.uuid} is not the leader",
                trailing_metadata=((LEADER_ADDRESS_KEY, self._leader_grpc()),),
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def resolve(result: object, err: int) -> None:
            if fut.done():
                return
            if err == FAIL_REASON.SUCCESS:
                fut.set_result(int(result))  # type: ignore[call-overload]
            else:
                fut.set_exception(RuntimeError(f"pysyncobj failure reason {err}"))

        def done(result: object, err: int) -> None:  # runs in PySyncObj's tick thread
            loop.call_soon_threadsafe(resolve, result, err)

        self.obj.set(request.key, request.value, callback=done)
        try:
            index = await fut
        except RuntimeError as e:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                str(e),
                trailing_metadata=((LEADER_ADDRESS_KEY, self._leader_grpc()),),
            )
        return kvdemo_pb2.PutResponse(index=index)

    async def _unimplemented(self, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the PySyncObj adapter only does Put")

    async def Get(
        self, request: kvdemo_pb2.GetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kvdemo_pb2.GetResponse:
        await self._unimplemented(context)

    async def ChangeConfig(
        self, request: kvdemo_pb2.ChangeConfigRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kvdemo_pb2.ChangeConfigResponse:
        await self._unimplemented(context)

    async def TransferLeader(
        self,
        request: kvdemo_pb2.TransferLeaderRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> kvdemo_pb2.TransferLeaderResponse:
        await self._unimplemented(context)

    async def Status(
        self, request: kvdemo_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> kvdemo_pb2.StatusResponse:
        # Plain attribute reads: getStatus() iterates dicts the tick thread is changing.
        obj = self.obj
        return kvdemo_pb2.StatusResponse(
            uuid=self.uuid,
            role="LEADER" if obj._isLeader() else "FOLLOWER",
            term=int(obj._getTerm()),
            leader_address=self._leader_grpc(),
            commit_index=int(obj.raftCommitIndex),
            applied_index=int(obj.raftLastApplied),
        )


async def serve(args: argparse.Namespace) -> int:
    grpc_of_raft = {args.raft: args.grpc}
    for peer in args.peer:
        raft, grpc_addr = peer.split("=", 1)
        grpc_of_raft[raft] = grpc_addr
    # --no-batch: send AppendEntries at once per command instead of every appendEntriesPeriod.
    conf = SyncObjConf(journalFile=str(args.journal), appendEntriesUseBatch=not args.no_batch)
    obj = ReplicatedDict(args.raft, [p.split("=", 1)[0] for p in args.peer], conf)
    # SO_REUSEPORT off: one server per port (see RpcSettings.server_options).
    server = grpc.aio.server(options=channel_options.server())
    kvdemo_pb2_grpc.add_KvDemoServicer_to_server(
        PySyncObjKvServicer(obj, grpc_of_raft, args.raft), server
    )
    if server.add_insecure_port(args.grpc) == 0:
        raise OSError(f"could not bind {args.grpc}")
    await server.start()
    if args.ready_file is not None:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"address": args.grpc, "pid": os.getpid(), "fsync": FSYNC}))
        tmp.replace(args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)
    obj.destroy()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="PySyncObj node with the KvDemo Put/Status API")
    p.add_argument("--raft", required=True, help="this node's PySyncObj host:port")
    p.add_argument("--grpc", required=True, help="this node's gRPC host:port")
    p.add_argument("--peer", action="append", default=[], metavar="RAFT=GRPC")
    p.add_argument("--journal", type=Path, required=True, help="PySyncObj journal file")
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--no-batch", action="store_true", help="appendEntriesUseBatch=False")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
