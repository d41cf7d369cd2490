"""The empty gRPC server: bench-master's baseline for RPC throughput.

A grpc.aio server in its own process whose MasterService.Ping does nothing, on the same
library, options and loopback as the master. Driven by the same clients as the master's
GetTableLocations, it measures what one Python process can answer on this machine today, so
bench-master prints the master's rate as a fraction of it (these machines are noisy: the
same code measured 3,288 and 1,700 GetTableLocations/s on different days, and the empty
server moved with it).

With `--credentials DIR` (ca.pem, cert.pem, key.pem) it listens as a secured master does:
TLS, a client certificate from the same CA required. Its Ping has no authorizer: a secured
empty server measures what TLS alone costs a call.

Usage: python -m bench.grpc_baseline --port-file F [--credentials DIR]  (serves until terminated)
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import grpc.aio

from service.common.config import RpcSettings
from service.common.pki import IdentityFiles
from service.common.tls import Credentials, add_port
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc


class EmptyMaster(master_pb2_grpc.MasterServiceServicer):
    async def Ping(self, request: pb.PingRequestPB, context: Any) -> pb.PingResponsePB:
        return pb.PingResponsePB()


async def serve(port_file: Path, creds: Credentials | None) -> None:
    server = grpc.aio.server(options=RpcSettings().server_options())
    master_pb2_grpc.add_MasterServiceServicer_to_server(EmptyMaster(), server)
    port = add_port(server, "127.0.0.1:0", creds)
    await server.start()
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.rename(port_file)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.grpc_baseline")
    p.add_argument("--port-file", type=Path, required=True)
    p.add_argument("--credentials", type=Path, help="serve mutual TLS as the identity in DIR")
    args = p.parse_args(argv)
    creds = None
    if args.credentials is not None:
        creds = Credentials.from_files(IdentityFiles.in_dir(args.credentials))
    asyncio.run(serve(args.port_file, creds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
