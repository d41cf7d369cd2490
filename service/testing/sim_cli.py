"""Run the deterministic simulator over many seeds: `make sim SEEDS=N`.

    python -m service.testing.sim_cli --seeds 200            seeds 0..199, all cores
    python -m service.testing.sim_cli --seed 1234 --verbose  replay one seed with its trace

The last line is always `sim: N seeds, V violations`; each failing seed prints the command
that replays it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import time

from service.testing.simulator import SimResult, run_seed


def _run(seed: int) -> SimResult:
    logging.disable(logging.WARNING)  # torn-tail notices are expected here
    r = run_seed(seed)
    if r.ok:
        r.trace = []
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=200, help="number of seeds to run")
    p.add_argument("--first", type=int, default=0, help="first seed")
    p.add_argument("--seed", type=int, help="run one seed (replay)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--verbose", action="store_true", help="print the trace of a replayed seed")
    args = p.parse_args(argv)

    if args.seed is not None:
        logging.disable(logging.WARNING)
        r = run_seed(args.seed, verbose=args.verbose)
        for v in r.violations:
            print(f"seed {r.seed}: {v}")
        print(
            f"seed {r.seed}: {r.ops} ops, {r.committed} committed, {r.leaders} leaders, "
            f"{r.crashes} crashes"
        )
        print(f"sim: 1 seeds, {len(r.violations) and 1} violations")
        return 1 if r.violations else 0

    seeds = range(args.first, args.first + args.seeds)
    bad: list[SimResult] = []
    start = time.monotonic()
    last_print = start
    done = ops = 0
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(_run, seeds, chunksize=4):
            done += 1
            ops += r.ops
            if not r.ok:
                bad.append(r)
                print(f"seed {r.seed}: {r.violations[0]}", flush=True)
                print(
                    f"  replay: python -m service.testing.sim_cli --seed {r.seed} --verbose",
                    flush=True,
                )
            now = time.monotonic()
            if now - last_print >= 10 or done == len(seeds):
                last_print = now
                rate = done / (now - start)
                eta = (len(seeds) - done) / rate if rate else 0
                print(
                    f"  {done}/{len(seeds)} seeds, {len(bad)} failing, {ops} client ops, "
                    f"{rate:.1f} seeds/s, eta {eta:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"sim: {len(seeds)} seeds, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
