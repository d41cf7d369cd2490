"""Scan pages received into reused memory: malloc's large-block parameters, set once per
process unless the user chose otherwise (service/client/page_memory.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from service.client import page_memory
from service.client.page_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

_IS_GLIBC = sys.platform.startswith("linux") and page_memory._glibc_mallopt() is not None


class _Mallopt:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_both_parameters_are_set_when_nobody_chose_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _Mallopt()
    monkeypatch.setattr(page_memory, "_glibc_mallopt", lambda: fake)
    assert page_memory._apply({}) == "tuned"
    assert fake.calls == [(-3, MMAP_THRESHOLD), (-1, TRIM_THRESHOLD)]


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({"TESSERA_CLIENT_MALLOC": "system"}, "opted out"),
        ({"TESSERA_CLIENT_MALLOC": " System "}, "opted out"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}, "GLIBC_TUNABLES"),
        ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.top_pad=9"}, "GLIBC_TUNABLES"),
    ],
)
def test_the_users_own_choice_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], outcome: str
) -> None:
    fake = _Mallopt()
    monkeypatch.setattr(page_memory, "_glibc_mallopt", lambda: fake)
    assert page_memory._apply(env) == outcome
    assert fake.calls == []


def test_other_tunables_and_other_values_of_the_opt_out_do_not_stop_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _Mallopt()
    monkeypatch.setattr(page_memory, "_glibc_mallopt", lambda: fake)
    env = {"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "TESSERA_CLIENT_MALLOC": ""}
    assert page_memory._apply(env) == "tuned"
    assert len(fake.calls) == 2


def test_a_refused_value_or_another_c_library_changes_nothing_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusing = _Mallopt(answer=0)
    monkeypatch.setattr(page_memory, "_glibc_mallopt", lambda: refusing)
    assert page_memory._apply({}) == "refused"
    assert refusing.calls == [(-3, MMAP_THRESHOLD)]
    monkeypatch.setattr(page_memory, "_glibc_mallopt", lambda: None)
    assert page_memory._apply({}) == "not glibc"


# A fresh process allocates, fills and drops 24 blocks of 8 MiB and a little more, each a
# page larger than the last (as scan pages of varying sizes are), and prints its minor faults.
_CHURN = textwrap.dedent(
    """
    import resource, sys
    from service.client import page_memory
    outcome = page_memory.reuse_large_blocks() if sys.argv[1] == "tuned" else "untouched"
    if sys.argv[1] == "stub":  # what the client does for its first scan of any server
        import asyncio, grpc.aio
        from service.client.scan_reply import ScanStub

        async def stub():
            async with grpc.aio.insecure_channel("127.0.0.1:9") as channel:
                ScanStub(channel)

        asyncio.run(stub())
        outcome = page_memory._outcome  # set by the stub, not asked for here
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(24):
        page = b"x" * ((8 << 20) + i * 4096)
        del page
    print(outcome, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _churn(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode],
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
        timeout=120,
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not _IS_GLIBC, reason="malloc parameters of glibc only")
def test_with_the_parameters_set_large_blocks_reuse_memory_instead_of_faulting_it_in() -> None:
    """Without them each block is mapped afresh and faulted in 4 KiB at a time (2,048 faults
    for each of the 24 blocks); with them the first block's memory serves the others."""
    outcome, tuned = _churn("tuned")
    assert outcome == "tuned"
    _, untouched = _churn("untouched")
    per_block = (8 << 20) // 4096
    assert untouched > 12 * per_block, untouched
    assert tuned < 4 * per_block, (tuned, untouched)


@pytest.mark.skipif(not _IS_GLIBC, reason="malloc parameters of glibc only")
def test_a_process_that_makes_a_scan_stub_receives_pages_into_reused_memory() -> None:
    outcome, faults = _churn("stub")
    assert outcome == "tuned"
    assert faults < 4 * ((8 << 20) // 4096), faults


@pytest.mark.skipif(not _IS_GLIBC, reason="malloc parameters of glibc only")
def test_the_real_mallopt_accepts_both_values() -> None:
    mallopt = page_memory._glibc_mallopt()
    assert mallopt is not None
    assert mallopt(-3, MMAP_THRESHOLD) == 1 and mallopt(-1, TRIM_THRESHOLD) == 1
