"""What `MasterClient` retries, with errors arriving through the channel pool's mapping
(service/common/error_mapping.py) from a fake master over real gRPC on loopback.

Retried inside the deadline: NOT_THE_LEADER, NOT_READY and other SERVICE_UNAVAILABLE, and an
attempt that ran out of its own time (DEADLINE_EXCEEDED); anything else is the answer, raised
at once (service/client/master_client.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
import pytest

from service.client import master_client
from service.client.master_client import MasterClient
from service.common.errors import (
    InvalidArgument,
    NotReady,
    NotTheLeader,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    rpc_errors,
)
from service.pb import master_pb2 as pb

HANG = "hang"
"""A scripted outcome: answer nothing until the caller's attempt times out."""


class _FakeMaster:
    """Leads term 1; ListTables answers from `script`, one outcome per call, then succeeds."""

    def __init__(self, script: Sequence[TesseraError | str], follower_rounds: int = 0) -> None:
        self.script = list(script)
        self.calls = 0
        self.follower_rounds = follower_rounds
        """ConnectToMaster answers FOLLOWER (no leader known) this many times first."""

    @rpc_errors
    async def ConnectToMaster(self, request: Any, context: Any) -> pb.ConnectToMasterResponsePB:
        if self.follower_rounds > 0:
            self.follower_rounds -= 1
            return pb.ConnectToMasterResponsePB(role=pb.FOLLOWER, term=1)
        return pb.ConnectToMasterResponsePB(role=pb.LEADER, term=1)

    @rpc_errors
    async def ListTables(self, request: Any, context: Any) -> pb.ListTablesResponsePB:
        self.calls += 1
        outcome = self.script.pop(0) if self.script else None
        if outcome == HANG:
            await asyncio.sleep(30)
        if isinstance(outcome, TesseraError):
            raise outcome
        return pb.ListTablesResponsePB()


def _list_tables(fake: _FakeMaster, timeout: float) -> int:
    async def main() -> int:
        methods = {
            "ConnectToMaster": grpc.unary_unary_rpc_method_handler(
                fake.ConnectToMaster,
                pb.ConnectToMasterRequestPB.FromString,
                pb.ConnectToMasterResponsePB.SerializeToString,
            ),
            "ListTables": grpc.unary_unary_rpc_method_handler(
                fake.ListTables,
                pb.ListTablesRequestPB.FromString,
                pb.ListTablesResponsePB.SerializeToString,
            ),
        }
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("tessera.master.MasterService", methods),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        mc = MasterClient([f"127.0.0.1:{port}"])
        try:
            await mc.call("ListTables", pb.ListTablesRequestPB(), timeout)
            return fake.calls
        finally:
            await mc.aclose()
            await server.stop(None)

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def _short_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(master_client, "ATTEMPT_CAP_S", 0.3)


def test_unavailable_and_timed_out_attempts_are_retried() -> None:
    script = [
        NotReady("loading"),
        ServiceUnavailable("shutting down"),
        HANG,
        NotTheLeader("a follower"),
    ]
    assert _list_tables(_FakeMaster(script), timeout=20) == 5


def test_discovery_keeps_asking_at_least_every_half_second_while_no_master_leads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During an election no master leads: discovery backs off, but never longer than
    `DISCOVERY_BACKOFF_CAP_S`, so a client finds the new leader soon after it is elected
    (each pause's ceiling, before its jitter, is recorded, not slept)."""
    ceilings: list[float] = []

    class Recorded(master_client.Backoff):
        async def sleep(self, deadline: Any) -> None:
            ceilings.append(min(self.cap, self.initial * 2**self.attempts))
            self.next_delay()

    monkeypatch.setattr(master_client, "Backoff", Recorded)
    fake = _FakeMaster([], follower_rounds=12)
    assert _list_tables(fake, timeout=20) == 1
    assert len(ceilings) == 12
    assert ceilings[:4] == [0.05, 0.1, 0.2, 0.4]  # still exponential, from a fast first retry
    assert max(ceilings) == master_client.DISCOVERY_BACKOFF_CAP_S == 0.5


def test_other_errors_are_the_answer_at_once() -> None:
    fake = _FakeMaster([InvalidArgument("name_filter: bad")])
    with pytest.raises(InvalidArgument, match="name_filter") as e:
        _list_tables(fake, timeout=20)
    assert fake.calls == 1
    assert e.value.rpc_status is grpc.StatusCode.INVALID_ARGUMENT


def test_the_deadline_ends_the_retries_with_timeout() -> None:
    fake = _FakeMaster([HANG] * 100)
    with pytest.raises(Timeout, match="ListTables: timed out"):
        _list_tables(fake, timeout=1.5)
    assert fake.calls >= 2  # the timed-out attempts were retried until the deadline
