"""The fault campaign's nemeses: each injects one kind of fault into real processes and heals it.

A nemesis alternates quiet periods and fault windows (Jepsen's `start`/`stop` cycle), records
each window (when it began, when it was healed, what it did) for the plot, and on the way out
heals everything: the network whole, every process resumed and running, disks and clocks sane.

Targets are drawn from the workload's focus (the masters for catalog workloads, the tablet
servers for data workloads) most of the time, and from any process otherwise; "the leader" is
the sys.catalog leader or the leader of the workload's tablet, as the cluster reports it.

* `kill`: SIGKILL, then a restart on the same data and addresses when the window ends.
* `pause`: SIGSTOP, SIGCONT at the end (windows of 3 s or more: several election timeouts).
* `partition`, one of: `majority` (one focus process, plus a random few of the others, cut from
  the rest), `isolated-leader` (the leader alone), `bridge` (two focus processes cut from each
  other, the third and the others reaching both) and `one-way` (every packet the leader sends
  dropped; what it receives still arrives: see `chaos_net` for what that does to TCP).
* `clock`: the wall clock of one process set off by 5 s to 15 min either way, sometimes moved
  again half-way through the window (a jump), then set right.
* `disk`: one process's syncs slowed (0.1-1 s each) or failing (EIO), or its writes failing with
  ENOSPC. After an error window the process is killed and restarted whether or not it stopped by
  itself: the product stops a Raft node on a failed fsync rather than retry it ("fsyncgate"), and
  a tablet replica that failed that way stays FAILED until its server restarts.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

from service.testing.chaos_cluster import ChaosCluster


@dataclass
class Window:
    start: float
    end: float | None
    label: str


LeaderFn = Callable[[], Awaitable[str | None]]


class Nemesis:
    name: ClassVar[str]
    quiet: ClassVar[tuple[float, float]] = (3.0, 6.0)
    fault: ClassVar[tuple[float, float]] = (4.0, 10.0)

    def __init__(
        self, cluster: ChaosCluster, rng: random.Random, focus: str, leader: LeaderFn
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.focus = focus
        self.leader = leader
        self.windows: list[Window] = []

    def group(self, kind: str | None = None) -> list[str]:
        return [n.name for n in self.cluster.nodes if kind is None or n.kind == kind]

    async def target(self, leader_bias: float = 0.5) -> str:
        """A focus process (the leader with probability `leader_bias`) 3 times in 4, else any."""
        if self.rng.random() < 0.75:
            if self.rng.random() < leader_bias:
                lead = await self.leader()
                if lead is not None:
                    return lead
            return self.rng.choice(self.group(self.focus))
        return self.rng.choice(self.group())

    async def inject(self) -> str:
        """Start one fault; a label for the plot."""
        raise NotImplementedError

    async def heal(self) -> None:
        raise NotImplementedError

    async def run(self, until: float, now: Callable[[], float]) -> None:
        try:
            while True:
                await asyncio.sleep(self.rng.uniform(*self.quiet))
                if now() >= until:
                    return
                start = now()
                w = Window(start, None, await self.inject())
                self.windows.append(w)
                await asyncio.sleep(max(0.0, min(self.rng.uniform(*self.fault), until - now())))
                await self.heal()
                w.end = now()
        finally:
            await self.heal_all()
            for w in self.windows:
                if w.end is None:
                    w.end = now()

    async def heal_all(self) -> None:
        """Everything back to normal, whatever this or any nemesis did."""
        c = self.cluster
        await asyncio.to_thread(c.lab.heal)
        for n in c.nodes:
            c.signal(n.name, signal.SIGCONT)
            c.disk_file(n.name).write_text("")
            c.clock_file(n.name).write_text("0\n")
        for n in c.nodes:
            await asyncio.to_thread(c.restart, n.name)


class Kill(Nemesis):
    name = "kill"

    async def inject(self) -> str:
        self.victim = await self.target()
        await asyncio.to_thread(self.cluster.kill, self.victim)
        return f"kill {self.victim}"

    async def heal(self) -> None:
        await asyncio.to_thread(self.cluster.restart, self.victim)


class Pause(Nemesis):
    name = "pause"
    fault = (3.0, 10.0)

    async def inject(self) -> str:
        self.victim = await self.target(0.7)
        self.cluster.signal(self.victim, signal.SIGSTOP)
        return f"pause {self.victim}"

    async def heal(self) -> None:
        self.cluster.signal(self.victim, signal.SIGCONT)


class Partition(Nemesis):
    name = "partition"
    variants = ("majority", "isolated-leader", "bridge", "one-way")

    async def inject(self) -> str:
        lab = self.cluster.lab
        variant = self.rng.choice(self.variants)
        focus = self.group(self.focus)
        others = [n for n in self.group() if n not in focus]
        self.rng.shuffle(focus)
        lead = await self.leader() if variant in ("isolated-leader", "one-way") else None
        if lead is None and variant in ("isolated-leader", "one-way"):
            variant = "majority"
        if variant == "majority":
            minority = [focus[0], *(n for n in others if self.rng.random() < 0.3)]
            lab.partition(minority, [n for n in self.group() if n not in minority])
            return f"partition {'+'.join(minority)} | rest"
        assert lead is not None or variant == "bridge"
        if variant == "isolated-leader":
            lab.partition([lead], [n for n in self.group() if n != lead])  # type: ignore[list-item]
            return f"isolate leader {lead}"
        if variant == "one-way":
            for n in self.group():
                if n != lead:
                    lab.cut(lead, n)  # type: ignore[arg-type]
            return f"one-way {lead} -> all"
        a, b, bridge = focus[0], focus[1], focus[2]
        side_a, side_b = [a], [b]
        for n in others:
            (side_a if self.rng.random() < 0.5 else side_b).append(n)
        lab.partition(side_a, side_b)
        return f"bridge {bridge}: {'+'.join(side_a)} | {'+'.join(side_b)}"

    async def heal(self) -> None:
        await asyncio.to_thread(self.cluster.lab.heal)


class Clock(Nemesis):
    name = "clock"

    def _offset(self) -> int:
        return self.rng.choice((-1, 1)) * int(
            self.rng.choice((5, 30, 120, 600)) * self.rng.uniform(1, 1.5)
        )

    async def inject(self) -> str:
        self.victim = await self.target()
        off = self._offset()
        self.cluster.clock_file(self.victim).write_text(f"{off:+d}\n")
        label = f"clock {self.victim} {off:+d}s"
        if self.rng.random() < 0.4:
            asyncio.get_running_loop().call_later(
                self.rng.uniform(1.5, 3.0), self._jump, self.victim, self._offset()
            )
            label += " then jump"
        return label

    def _jump(self, victim: str, off: int) -> None:
        if self.windows and self.windows[-1].end is None:
            self.cluster.clock_file(victim).write_text(f"{off:+d}\n")

    async def heal(self) -> None:
        self.cluster.clock_file(self.victim).write_text("0\n")


class Disk(Nemesis):
    name = "disk"

    async def inject(self) -> str:
        self.victim = await self.target(0.6)
        self.mode = self.rng.choice(("slow", "slow", "eio", "enospc"))
        spec = f"slow {self.rng.choice((0.1, 0.3, 1.0))}" if self.mode == "slow" else self.mode
        self.cluster.disk_file(self.victim).write_text(spec)
        return f"disk {self.victim} {spec}"

    async def heal(self) -> None:
        self.cluster.disk_file(self.victim).write_text("")
        if self.mode != "slow":
            await asyncio.to_thread(self.cluster.kill, self.victim)
            await asyncio.to_thread(self.cluster.restart, self.victim)


class NoFaults(Nemesis):
    """The control: the same schedule with nothing injected."""

    name = "none"

    async def inject(self) -> str:
        return "nothing"

    async def heal(self) -> None:
        return None


NEMESES: dict[str, type[Nemesis]] = {
    n.name: n for n in (Kill, Pause, Partition, Clock, Disk, NoFaults)
}
