"""``python -m bench.feed``: what ``publish_outbox``'s change feed reads and writes per order, from the local host.

Starts the local stack and one host of the app, its Cosmos DB requests through a proxy that counts what the
trigger does: the orders container's change-feed polls (pages with changes, their items, and the polls that
found nothing: 304), and its writes to the lease container. At each rate of ``--rates`` (orders a second) it
sends orders, each followed by its lifecycle events in its session, for ``--seconds``, waits until every
message is settled and a poll has found the feed empty (it read every change), and divides what was counted
by the orders sent. The sweep and the stuck report are off for the run. A rate the host cannot keep up with
is drained behind; its row says the rate the orders were sent at, not settled.

    python -m bench.feed [--rates 1,10,100] [--seconds 10] [--seed 1] [--json PATH]

Figures come from this machine's run; the local host polls the feed as the Functions host does (``feedPollDelay``
5 s), and the lease writes are the local host's, one checkpoint per page it processed.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient

from bench.events import NEVER, Run, _traffic, send_batched
from demo.stack import Stack, settings_file
from devservers.faultproxy import FaultProxy

_ORDERS_DOCS = re.compile(r"/colls/orders/docs/?(?:\?|$)")
_LEASES_DOCS = re.compile(r"/colls/leases/docs(?:/[^/?]+)?/?(?:\?|$)")
# Longer than the host takes to start its trigger, and than a poll delay (5 s) after the last change.
WAIT_SECONDS = 60.0


@dataclass
class Rate:
    """What the feed did for the orders sent at one rate."""

    rate: float
    orders: int
    events: int
    pages: int = 0
    items: int = 0
    empty_polls: int = 0
    lease_writes: int = 0

    def per_order(self) -> dict[str, float]:
        return {"pages": self.pages / self.orders, "items": self.items / self.orders,
                "empty polls": self.empty_polls / self.orders, "lease writes": self.lease_writes / self.orders}


class FeedCounter:
    """Counts the change feed's pages, items and empty polls, and the lease container's writes, while ``rate``."""

    def __init__(self) -> None:
        self.rate: Rate | None = None
        self.polls = 0  # every poll, counted or not: the trigger has started once it polls
        self.last_empty = 0.0  # when a poll last found nothing: the feed had read every change before it
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, headers: Mapping[str, str], status: int, body: bytes) -> None:
        with self._lock:
            rate = self.rate
            if "a-im" in headers and _ORDERS_DOCS.search(path):
                self.polls += 1
                if status == 304:
                    self.last_empty = time.monotonic()
                    if rate is not None:
                        rate.empty_polls += 1
                    return
                if rate is not None:
                    rate.pages += 1
                    rate.items += _count(body)
            elif method in ("POST", "PUT", "PATCH", "DELETE") and _LEASES_DOCS.search(path) \
                    and "x-ms-documentdb-isquery" not in headers and rate is not None:
                rate.lease_writes += 1


def _count(body: bytes) -> int:
    try:
        page = json.loads(body)
    except ValueError:
        return 0
    return len(page.get("Documents") or []) if isinstance(page, dict) else 0


def measure(stack: Stack, rates: list[float], seconds: float, seed: int) -> list[Rate]:
    """Each rate in turn on one host: send, drain, wait for the feed to catch up, count."""
    counter = FeedCounter()
    with FaultProxy(stack.cosmos.endpoint, observe=counter) as proxy:
        url = proxy.url
        values = {**stack.values, "COSMOS_ENDPOINT": url, "CosmosDBConnection":
                  f"AccountEndpoint={url}/;AccountKey={stack.cosmos.key};", "OUTBOX_SWEEP_SCHEDULE": NEVER,
                  "STUCK_REPORT_SCHEDULE": NEVER}
        stack.start_host(settings_file(values))
        run, rng, results = Run(stack), random.Random(seed), []  # noqa: S311 - test traffic, reproducible by seed
        # The trigger starts from "now", its first poll: what is written before it, it never reads.
        _wait(lambda: counter.polls > 0, "the host's change feed did not poll")
        with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client, \
                client.get_queue_sender("orders") as orders, client.get_queue_sender(stack.events_queue) as events:
            for rate in rates:
                traffic = _traffic(rng, max(1, round(rate * seconds)), sessions=stack.events_sessions)
                counted = Rate(rate, len(traffic), sum(len(es) for _, es in traffic))
                with counter._lock:
                    counter.rate = counted
                start = time.monotonic()
                for n, (order, its_events) in enumerate(traffic):
                    time.sleep(max(0.0, start + n / rate - time.monotonic()))
                    orders.send_messages(order)
                    send_batched(events, its_events)
                ids = {str(o.message_id) for o, _ in traffic} | {str(e.message_id) for _, es in traffic for e in es}
                _, capped = run.drain(ids, 600)
                if capped:
                    raise TimeoutError(f"the {len(traffic)} orders at {rate:g}/s were not settled in 600 s")
                drained = time.monotonic()
                _wait(functools.partial(_caught_up, counter, drained), "the change feed did not catch up")
                with counter._lock:
                    counter.rate = None
                results.append(counted)
                print(f"bench.feed: {line(counted)}", flush=True)
        stack.stop_hosts()
    return results


def _caught_up(counter: FeedCounter, since: float) -> bool:
    """Whether a poll found the feed empty after ``since``: it had read every change written before."""
    return counter.last_empty > since


def _wait(done: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} in {seconds:.0f} s")
        time.sleep(0.25)


def line(rate: Rate) -> str:
    per = rate.per_order()
    return (f"{rate.rate:g} orders/s: {rate.orders} orders, {rate.events} events; per order {per['pages']:.2f} feed"
            f" pages, {per['items']:.2f} items, {per['empty polls']:.2f} empty polls, {per['lease writes']:.2f}"
            " lease writes")


def markdown(results: list[Rate]) -> str:
    lines = ["| orders/s | orders | events | feed pages per order | items per order | empty polls per order |"
             " lease writes per order |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for rate in results:
        per = rate.per_order()
        lines.append(f"| {rate.rate:g} | {rate.orders} | {rate.events} | {per['pages']:.2f} | {per['items']:.2f} |"
                     f" {per['empty polls']:.2f} | {per['lease writes']:.2f} |")
    return "\n".join(lines)


def _rates(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("every rate must be above 0")
    return values


def main(argv: list[str] | None = None) -> int:
    """Run each rate and print the table; exit 1 when a rate could not be drained."""
    parser = argparse.ArgumentParser(prog="python -m bench.feed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=_rates, default=[1.0, 10.0, 100.0],
                        help="orders a second, comma-separated (default 1,10,100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each rate sends (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the orders and events (default 1)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds above 0")
    stack = Stack.start()
    try:
        results = measure(stack, args.rates, args.seconds, args.seed)
    except TimeoutError as exc:
        print(f"bench.feed: {exc}; the host's log says why", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    print(markdown(results))
    if args.json:
        figures: list[dict[str, Any]] = [{**asdict(r), "per order": r.per_order()} for r in results]
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
