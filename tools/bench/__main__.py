"""``make bench``: what effectively-once costs, against the designs people use instead, in one run.

Runs every strategy of bench/throughput.py on every workload at each concurrency against the local
Cosmos server (or ``COSMOS_TEST_ENDPOINT``, which also reports request units), then the cold start
(bench/cold_start.py) and peak memory (bench/memory.py). Prints the tables and writes bench.md,
bench.json and bench.png to the results folder. Exit 1 when the project's request counts miss their
floor (a new order 2, a copy 2, an applied event 2: its identity, then its batch), or a strategy failed to
process a message.

    python -m bench [--messages 2000] [--concurrency 1,8,32] [--seed 1] [--results results/bench] [--smoke]

``--smoke`` (the test command's): 30 messages at concurrency 1, the request counts only; no timings
are asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from contextlib import ExitStack
from pathlib import Path

from bench import aio, proxy, report, throughput
from bench.wire import CountingTransport
from devservers.cosmos import start_cosmos_server
from devservers.fulfilment import FulfilmentServer
from idempotent_consumer.adapters.cosmos import make_client
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]  # the project root, above tools/
MEMORY_SIZES = (2000, 10000, 30000)
FLOOR = {"new order": 2.0, "copy of an order": 2.0, "applied event": 2.0}


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("every concurrency must be at least 1")
    return values


def run(messages: int, concurrency: list[int], seed: int, results: Path, smoke: bool) -> int:
    """The whole benchmark; 0 when the request floor holds and every message was processed."""
    with ExitStack() as stack:
        endpoint, key = os.environ.get("COSMOS_TEST_ENDPOINT"), os.environ.get("COSMOS_TEST_KEY")
        if not endpoint:
            server = start_cosmos_server()
            stack.callback(server.stop)
            endpoint, key = server.endpoint, server.key
        fulfilment = stack.enter_context(FulfilmentServer())
        settings = Settings(cosmos_endpoint=endpoint, cosmos_key=key, fulfillment_url=fulfilment.url,
                            cosmos_verify_tls=os.environ.get("COSMOS_TEST_VERIFY_TLS", "true") != "false",
                            cosmos_database="bench")
        cells, failures = asyncio.run(_cells(settings, fulfilment.url, messages, concurrency, seed))
        extra = {} if smoke else {
            **report.extras(MEMORY_SIZES), "proxy look-ups": proxy.measure(settings, fulfilment.url, seed),
            "async": aio.measure(settings, sorted({min(concurrency), max(concurrency)}), seed)}
        floor = report.floor(cells)
    print(report.markdown(cells, floor, extra, endpoint=endpoint, smoke=smoke), flush=True)
    report.write(cells, floor, extra, results, endpoint=endpoint, smoke=smoke)
    print(f"bench: wrote {results / 'bench.md'}, bench.json" + ("" if smoke else " and bench.png"), flush=True)
    missed = [f"{what}: {got:g} requests, the floor is {FLOOR[what]:g}" for what, got in floor.items()
              if got != FLOOR[what]]
    for problem in missed + failures:
        print(f"bench: {problem}", file=sys.stderr)
    return 1 if missed or failures else 0


async def _cells(settings: Settings, fulfilment_url: str, messages: int, concurrency: list[int],
                 seed: int) -> tuple[list[throughput.Cell], list[str]]:
    """Every strategy on every workload at each concurrency, through one counting async client."""
    transport = CountingTransport(use_env_settings=settings.http_proxy_from_environment)
    async with make_client(settings, transport=transport) as client:
        await client.create_database_if_not_exists("bench")
        bench = throughput.Bench(client, transport, settings, "bench", fulfilment_url,
                                 request_units="COSMOS_TEST_ENDPOINT" in os.environ)
        cells: list[throughput.Cell] = []
        turn = 0
        for name in throughput.WORKLOADS:
            for level in concurrency:
                work = throughput.workload(name, messages, seed)
                for strategy in throughput.rotated(bench.strategies(name), turn):
                    cells.append(await bench.run_cell(strategy, work, level))
                    print(f"bench: {report.line(cells[-1])}", flush=True)
                turn += 1
        return cells, bench.failures


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="messages per workload and cell (default 2000)")
    parser.add_argument("--concurrency", type=_concurrency, default=[1, 8, 32],
                        help="concurrent handlers, comma-separated (default 1,8,32)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the generated workloads (default 1)")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "bench",
                        help="where bench.md, bench.json and bench.png go (default results/bench)")
    parser.add_argument("--smoke", action="store_true",
                        help="30 messages at concurrency 1; checks the request counts, skips cold start and memory")
    args = parser.parse_args(argv)
    if args.smoke:
        args.messages, args.concurrency = 30, [1]
    if args.messages < 10:
        parser.error("--messages must be at least 10")
    return run(args.messages, args.concurrency, args.seed, args.results, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
