"""``python -m bench.events``: the events path through the local Functions host, in one run.

Starts the local stack and ``--hosts`` hosts of the app, with host.json as committed or with the
``extensions.serviceBus`` values of ``--service-bus`` laid over it (as app settings, the way Azure
applies them), then measures:

- **a burst**: ``--burst`` orders sent at once; once all are written, their events, each order's in
  its session and in order, sent at once. The drain rate of each is settlements per second, first to
  last, from the hosts' own log lines.
- **a steady rate**: every 1/rate s an order, then its events, for ``--seconds``. The rate is half the
  burst's capacity (the orders' rate or the events' rate per order, whichever is lower) unless
  ``--rate`` gives it in orders per second. Latency is from the send of an order's last message to the
  hosts' log line of the last write that brought the order to its final version.
- **the session slots**: from each release the host logs, how long a slot sat idle before letting its
  session go, how long it held the session, and how long accepting it took.
- **Cosmos requests and conflicts per event**, over the burst's events: the hosts reach the Cosmos
  server through a proxy that counts each request to the orders container (change-feed polls and
  outbox documents left out) and each it refused: 409, 412, or a transactional batch refused whole
  (207). The sweep and the stuck report are off
  for the run, so the counts are the events' own.

``--events-queue plain`` runs the events without sessions (ORDER_EVENTS_SESSIONS false, the
``order-events-plain`` queue, ``maxConcurrentCalls`` slots); ``--events-queue both`` runs sessions,
then plain, each on a fresh stack, and prints them side by side.

    python -m bench.events [--hosts 1] [--burst 200] [--rate R] [--seconds 30] [--seed 1] [--events-queue both]
                           [--service-bus '{"sessionIdleTimeout": "00:00:00.2", "maxConcurrentSessions": 32}']
                           [--drain-seconds 300] [--json PATH]

Figures come from this machine's run and are compared only within it. A drain that does not end
within ``--drain-seconds`` is reported at the rate it reached (marked capped), not waited out.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender

from bench.wire import finishes_sent_outbox
from demo.stack import Stack, settings_file
from devservers.faultproxy import FaultProxy
from sbctl import generate

SETTING = "AzureFunctionsJobHost__extensions__serviceBus__"
QUEUES = {"sessions": "order-events", "plain": "order-events-plain"}
NEVER = "0 0 0 1 1 *"  # a timer schedule that does not come round during a run
# A create that found its id (409), a write whose etag or filter no longer held (412), and a transactional
# batch refused as a whole (207: one of its operations answered 409 or 412, the rest were not applied).
REFUSED = frozenset({207, 409, 412})
_ORDERS_DOCS = re.compile(r"/colls/orders/docs(?:/(?!outbox\.)[^/?]+)?/?(?:\?|$)")
_SETTLED = re.compile(r"^(\S+ \S+) devservers\.host (process_order|process_order_event) messageId=(\S+)"
                      r" outcome=Succeeded settlement=(?:complete|dead)", re.M)
_WRITTEN = re.compile(r"^(\S+ \S+) devservers\.host worker \[\w+\] idempotent_consumer: delivery \w+"
                      r" messageId=(\S+) outcome=(?:created|applied|parked)\b", re.M)
_RELEASED = re.compile(r"process_order_event session \S+ released after (\d+) messages, ([\d.]+) s idle,"
                       r" ([\d.]+) s held, accepted in ([\d.]+) s")


@dataclass
class Figures:
    """What one run measured."""

    events_queue: str
    settings: dict[str, Any]
    hosts: int
    burst_orders: int
    burst_events: int
    orders_per_second: float
    events_per_second: float
    capped: bool
    steady_orders_per_second: float = 0.0
    steady_orders: int = 0
    steady_unfinished: int = 0  # orders not at their final version by the end of the drain: no latency
    latency_p50_seconds: float = 0.0
    latency_p99_seconds: float = 0.0
    latency_max_seconds: float = 0.0
    sessions: dict[str, float] = field(default_factory=dict)
    requests_per_event: float = 0.0
    conflicts_per_event: float = 0.0

    @property
    def ratio(self) -> float:
        """The events' drain rate against the orders'."""
        return self.events_per_second / self.orders_per_second if self.orders_per_second else 0.0


def _moment(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def send_batched(sender: ServiceBusSender, messages: list[ServiceBusMessage]) -> None:
    """Send ``messages`` in as few batches as the broker takes."""
    batch = sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except ValueError:  # the batch is full
            sender.send_messages(batch)
            batch = sender.create_message_batch()
            batch.add_message(message)
    if len(batch):
        sender.send_messages(batch)


def _traffic(rng: random.Random, orders: int, *, sessions: bool) -> list[tuple[ServiceBusMessage,
                                                                          list[ServiceBusMessage]]]:
    """Orders and their events, each order's events in order (and in its session, with sessions)."""
    traffic = []
    for _ in range(orders):
        body = generate.order(rng)
        events = [ServiceBusMessage(json.dumps(e), message_id=e["id"], session_id=body["orderId"] if sessions else None)
                  for e in generate.order_events(rng, body)]
        traffic.append((ServiceBusMessage(json.dumps(body), message_id=body["orderId"]), events))
    return traffic


def _rate(times: list[float]) -> float:
    times = sorted(times)
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


class RequestCounter:
    """A tap that counts the orders container's requests (and its 409s and 412s) while ``counting``."""

    def __init__(self) -> None:
        self.counting = False
        self.requests = self.conflicts = 0

    def __call__(self, method: str, path: str, headers: Mapping[str, str], body: bytes, status: int | None) -> bool:
        incremental = any(k.lower() == "a-im" for k in headers)  # a change-feed poll
        if self.counting and status is not None and not incremental and _ORDERS_DOCS.search(path) \
                and not finishes_sent_outbox(body):
            self.requests += 1
            self.conflicts += status in REFUSED
        return False


class Run:
    """The stack, its hosts and their logs."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def logs(self) -> str:
        return "".join(host.text() for host in self.stack.hosts)

    def settled(self, ids: set[str]) -> list[float]:
        return [_moment(m[1]) for m in _SETTLED.finditer(self.logs()) if m[3] in ids]

    def drain(self, ids: set[str], seconds: float) -> tuple[list[float], bool]:
        """Settlement moments of ``ids`` once all are settled, or those so far after ``seconds`` (capped)."""
        deadline = time.time() + seconds
        while len(found := self.settled(ids)) < len(ids):
            if time.time() > deadline:
                return found, True
            time.sleep(0.5)
        return found, False


def measure(stack: Stack, args: argparse.Namespace, mode: str) -> Figures:
    """One run of the burst, the steady rate and the session figures, with the events queue in ``mode``."""
    overrides = json.loads(args.service_bus or "{}")
    counter = RequestCounter()
    proxy = FaultProxy(stack.cosmos.endpoint, tap=counter).__enter__()
    try:
        return _measure(stack, args, mode, overrides=overrides, counter=counter, cosmos_url=proxy.url)
    finally:
        stack.stop_hosts()
        proxy.__exit__()


def _measure(stack: Stack, args: argparse.Namespace, mode: str, *, overrides: dict[str, Any], counter: RequestCounter,
             cosmos_url: str) -> Figures:
    values = {**stack.values, **{SETTING + k.replace(".", "__"): str(v) for k, v in overrides.items()},
              "COSMOS_ENDPOINT": cosmos_url, "CosmosDBConnection": f"AccountEndpoint={cosmos_url}/;AccountKey="
              f"{stack.cosmos.key};", "ORDER_EVENTS_QUEUE": QUEUES[mode],
              "ORDER_EVENTS_SESSIONS": str(mode == "sessions").lower(), "OUTBOX_SWEEP_SCHEDULE": NEVER,
              "STUCK_REPORT_SCHEDULE": NEVER}
    path = settings_file(values)
    for _ in range(args.hosts):
        stack.start_host(path)
    run, rng = Run(stack), random.Random(args.seed)  # noqa: S311 - test traffic, reproducible by seed
    burst = _traffic(rng, args.burst, sessions=mode == "sessions")
    with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client, \
            client.get_queue_sender("orders") as orders, client.get_queue_sender(QUEUES[mode]) as events:
        send_batched(orders, [order for order, _ in burst])
        order_times, capped = run.drain({str(o.message_id) for o, _ in burst}, args.drain_seconds)
        if capped:
            raise TimeoutError(f"the burst's {len(burst)} orders were not written in {args.drain_seconds:.0f} s")
        event_ids = {str(e.message_id) for _, es in burst for e in es}
        time.sleep(2)  # the outbox's deletes of the orders' entries, which the count leaves out anyway
        counter.counting = True
        send_batched(events, [e for _, es in burst for e in es])
        event_times, capped = run.drain(event_ids, args.drain_seconds)
        counter.counting = False
        figures = Figures(mode, overrides, args.hosts, len(burst), len(event_ids), _rate(order_times),
                          _rate(event_times), capped, requests_per_event=counter.requests / len(event_ids),
                          conflicts_per_event=counter.conflicts / len(event_ids))
        if capped:  # the rest is still in the queue: a steady rate would measure the backlog
            return figures
        per_order = len(event_ids) / len(burst)
        rate = args.rate or 0.5 * min(figures.orders_per_second, figures.events_per_second / per_order)
        if rate <= 0:
            raise TimeoutError("the burst was too small to measure a rate: give --rate or a larger --burst")
        steady = _traffic(rng, max(1, round(rate * args.seconds)), sessions=mode == "sessions")
        sent: dict[str, float] = {}
        began = time.time()
        for n, (order, order_events) in enumerate(steady):
            time.sleep(max(0.0, began + n / rate - time.time()))
            orders.send_messages(order)
            send_batched(events, order_events)
            sent[str(order.message_id)] = time.time()
    ids = {str(m.message_id): str(o.message_id) for o, es in steady for m in (o, *es)}
    run.drain({i for i, _ in ids.items()}, args.drain_seconds)
    finished: dict[str, float] = {}
    for match in _WRITTEN.finditer(run.logs()):
        if (order_id := ids.get(match[2])) is not None:
            finished[order_id] = max(finished.get(order_id, 0.0), _moment(match[1]))
    latencies = sorted(finished[o] - sent[o] for o in sent if o in finished)
    figures.steady_orders_per_second, figures.steady_orders = rate, len(steady)
    figures.steady_unfinished = len(sent) - len(latencies)
    if latencies:
        figures.latency_p50_seconds = statistics.median(latencies)
        figures.latency_p99_seconds = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        figures.latency_max_seconds = latencies[-1]
    releases = [tuple(float(v) for v in m.groups()) for m in _RELEASED.finditer(run.logs())]
    if releases:
        handled, idle, held, accept = zip(*releases, strict=True)
        figures.sessions = {"released": len(releases), "messages per session": statistics.mean(handled),
                            "idle max s": max(idle), "held mean s": statistics.mean(held),
                            "accept mean s": statistics.mean(accept)}
    return figures


def table(figures: Figures) -> str:
    """The run as a Markdown table."""
    rows = [("events queue", QUEUES[figures.events_queue] + (" (sessions)" if figures.events_queue == "sessions"
                                                             else " (no sessions)")),
            ("settings", json.dumps(figures.settings) if figures.settings else "host.json as committed"),
            ("hosts", str(figures.hosts)),
            ("burst", f"{figures.burst_orders} orders, then {figures.burst_events} events"),
            ("orders drained per second", f"{figures.orders_per_second:.1f}"),
            ("events drained per second", f"{figures.events_per_second:.1f}" + (" (capped)" if figures.capped else "")),
            ("events against orders", f"{figures.ratio:.2f}x"),
            ("Cosmos requests / conflicts per event", f"{figures.requests_per_event:.2f} /"
                                                      f" {figures.conflicts_per_event:.3f}")]
    if figures.steady_orders:
        rows += [("steady rate", f"{figures.steady_orders_per_second:.2f} orders/s with their events"
                                 f" ({figures.steady_orders} orders, {figures.steady_unfinished} unfinished)"),
                 ("latency p50 / p99 / max", f"{figures.latency_p50_seconds:.2f} / {figures.latency_p99_seconds:.2f} /"
                                             f" {figures.latency_max_seconds:.2f} s")]
    rows += [(f"sessions: {k}", f"{v:.2f}" if isinstance(v, float) else str(v)) for k, v in figures.sessions.items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"| {'':{width}} | result |", f"| {'-' * width} | ------ |",
                      *(f"| {k:{width}} | {v} |" for k, v in rows)])


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run once, print the table; exit 1 when the run could not finish."""
    parser = argparse.ArgumentParser(prog="python -m bench.events", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1, help="host processes (default 1)")
    parser.add_argument("--burst", type=int, default=200, help="orders in the burst (default 200)")
    parser.add_argument("--rate", type=float, default=None, help="steady orders per second (default: half the"
                                                                 " burst's capacity)")
    parser.add_argument("--seconds", type=float, default=30, help="length of the steady phase (default 30)")
    parser.add_argument("--service-bus", default=None, help="JSON of host.json extensions.serviceBus values to use")
    parser.add_argument("--seed", type=int, default=1, help="seed of the traffic (default 1)")
    parser.add_argument("--drain-seconds", type=float, default=300, help="longest wait for a drain (default 300)")
    parser.add_argument("--events-queue", choices=("sessions", "plain", "both"), default="sessions",
                        help="the events queue with sessions (default), without, or both side by side")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.hosts < 1 or args.burst < 1 or (args.rate is not None and args.rate <= 0):
        parser.error("--hosts and --burst must be at least 1, and --rate above 0")
    try:
        json.loads(args.service_bus or "{}")
    except ValueError as exc:
        parser.error(f"--service-bus is not JSON: {exc}")
    runs = []
    for mode in ("sessions", "plain") if args.events_queue == "both" else (args.events_queue,):
        stack = Stack.start()
        try:
            runs.append(measure(stack, args, mode))
        except TimeoutError as exc:
            print(f"bench.events: {mode}: {exc}; the hosts' logs say why (a host that did not start, or a crawl)",
                  file=sys.stderr)
            return 1
        finally:
            stack.stop()
        print(table(runs[-1]), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": [{**asdict(f), "ratio": f.ratio} for f in runs]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
