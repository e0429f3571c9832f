"""python -m simulation: run many seeds and print totals, or replay one seed with its trace."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

from simulation.report import RunReport, Totals
from simulation.run import simulate

MAX_FAILURES_SHOWN = 20


def main(argv: list[str] | None = None) -> int:
    """Run the simulator from the command line; exit 1 when any run broke an invariant."""
    parser = argparse.ArgumentParser(prog="python -m simulation", description=__doc__)
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--trace", action="store_true", help="with --seed: print the run step by step")
    parser.add_argument("--seeds", type=int, default=20_000, help="how many seeds to run (default 20000)")
    parser.add_argument("--start", type=int, default=0, help="the first seed of --seeds (default 0)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes to run the seeds in (default: one per core)")
    args = parser.parse_args(argv)
    if args.seed is not None:
        return _replay(args.seed, trace=args.trace)
    return _batch(range(args.start, args.start + args.seeds), max(1, args.jobs))


def _replay(seed: int, *, trace: bool) -> int:
    report = simulate(seed, trace=trace)
    for line in report.trace or ():
        print(line)
    print(report.summary())
    for violation in report.violations:
        print(f"  {violation}")
    if report.violations and not trace:
        print(f"replay: {report.replay()}")
    return 1 if report.violations else 0


def _batch(seeds: range, jobs: int) -> int:
    totals = Totals()
    started = time.perf_counter()
    # Each seed's run is deterministic and alone in its process: the seeds go to ``jobs`` processes, and their
    # reports come back in seed order, so the output is the same with one job or many.
    with multiprocessing.get_context("fork").Pool(jobs) if jobs > 1 else _Serial() as pool:
        reports = pool.imap(simulate, seeds, chunksize=16)
        for report in reports:
            seed = report.seed
            totals.add(report)
        if report.violations and len(totals.failing) <= MAX_FAILURES_SHOWN:
            print(f"seed {seed}: {len(report.violations)} violations; replay: {report.replay()}")
            for violation in report.violations[:5]:
                print(f"  {violation}")
    for line in totals.lines(time.perf_counter() - started):
        print(line)
    if totals.failing:
        print(f"failing seeds: {' '.join(map(str, totals.failing[:100]))}")
    return 1 if totals.failing else 0


class _Serial:
    """The pool's interface, in this process: for one job."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        return None

    def imap(self, function: Callable[[int], RunReport], seeds: Iterable[int],
             chunksize: int = 1) -> Iterator[RunReport]:
        return map(function, seeds)


if __name__ == "__main__":
    sys.exit(main())
