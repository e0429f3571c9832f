"""Peak memory of the project's order path over N new orders, in a fresh process, with two stand-in checks.

    python -m bench.memory --messages 30000

Prints one JSON line: the peak RSS in MB (VmHWM of this process; the Cosmos server is a child
of its own; the messages are made one at a time and the fulfilment fake keeps nothing), the median
time per message over the first and the last 1,000 (the local server's batch must not grow with the
container), and the median fulfilment call to the local stand-in.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from bench import throughput
from devservers.cosmos import start_cosmos_server
from devservers.fulfilment import FulfilmentServer
from idempotent_consumer.adapters.cosmos import make_client
from shared.adapters.http import HttpFulfilment
from shared.settings import Settings

FULFILMENT_CALLS = 200


def peak_rss_kb() -> int:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux carries that over from the
    parent through fork and exec, so a child of a big process would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory is measured on Linux only")


def measure(messages: int) -> dict[str, float]:
    """Run the path over ``messages`` new orders; the figures."""
    server = start_cosmos_server()
    try:
        with FulfilmentServer() as fulfilment:
            settings = Settings(cosmos_endpoint=server.endpoint, cosmos_key=server.key, cosmos_database="bench",
                                fulfillment_url=fulfilment.url)
            times, call_times = asyncio.run(_run(settings, messages))
    finally:
        server.stop()
    peak_mb = peak_rss_kb() / 1024
    return {"messages": messages, "peak_rss_mb": round(peak_mb, 1),
            "first_ms": round(statistics.median(times[:1000]), 3),
            "last_ms": round(statistics.median(times[-1000:]), 3),
            "fulfilment_ms": round(statistics.median(call_times), 3)}


async def _run(settings: Settings, messages: int) -> tuple[list[float], list[float]]:
    """Milliseconds per message of the order path, and per call to the fulfilment stand-in."""
    async with make_client(settings) as client:
        database = await client.create_database_if_not_exists("bench")
        container = await database.create_container_if_not_exists("memory", partition_key=throughput.PARTITION)
        handle = throughput.this_project(throughput.NEW, container, settings, throughput.Reserved())
        times: list[float] = []
        for message in throughput.new_orders(messages, seed=7):
            started = time.perf_counter()
            await handle(message)
            times.append((time.perf_counter() - started) * 1000)
    calls = HttpFulfilment(settings.need("fulfillment_url"), connect_timeout=3, read_timeout=10)
    call_times = []
    try:
        for number in range(FULFILMENT_CALLS):
            started = time.perf_counter()
            await calls.reserve(f"memory-{number}", {"orderId": f"memory-{number}", "items": []})
            call_times.append((time.perf_counter() - started) * 1000)
    finally:
        await calls.close()
    return times, call_times


def main() -> None:
    """Print the figures as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10000, help="new orders to process (default 10000)")
    print(json.dumps(measure(parser.parse_args().messages)))


if __name__ == "__main__":
    main()
