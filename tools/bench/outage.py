"""``python -m bench.outage``: what an outage of the fulfilment service costs it, with the breaker and without.

Runs the local stack twice, each on a fresh stack with ``--hosts`` hosts of the app: once as committed
(``BREAKER_OPEN_SECONDS`` 30) and once with the breaker off (0). Each run sends ``--orders`` orders at
``--rate`` a second; ``--after`` seconds in, and not before the service received its first request (so that a
host's slow first invocation does not use the outage up), the fulfilment stand-in is down for ``--outage``
seconds (every reservation answered 503). It counts, on the stand-in's side of the wire:

* **requests received while down**: the reservation calls the service had to refuse;
* **per order sent**, the same over the orders;
* **handed on**, and of them **untried** (the breaker open), from the hosts' log lines, and the
  breakers' openings;
* **recovery**: from the service's return to its last reservation.

Then the ratio of the two runs' requests while down. Both runs wait until every order is reserved
once (the invariant) or ``--drain-seconds`` pass.

    python -m bench.outage [--orders 600] [--rate 10] [--outage 60] [--after 5] [--hosts 1] [--json PATH]

Figures come from this machine's run and are compared only within it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from demo.stack import Stack, settings_file
from sbctl import generate

NEVER = "0 0 0 1 1 *"  # a timer schedule that does not come round during a run
FIRST_REQUEST_SECONDS = 120  # longest wait for the hosts' first request before the outage starts anyway


@dataclass
class Figures:
    """One run: the breaker's setting, and what the service received."""

    breaker_open_seconds: float
    orders: int
    outage_seconds: float
    requests_while_down: int
    requests_in_all: int
    handed_on: int
    handed_on_untried: int
    breakers_opened: int
    recovery_seconds: float | None
    reserved_once: bool

    @property
    def per_order(self) -> float:
        """Requests received while down, per order sent."""
        return round(self.requests_while_down / self.orders, 2) if self.orders else 0.0


def _orders(seed: int, count: int) -> list[ServiceBusMessage]:
    rng = random.Random(seed)  # noqa: S311 - test traffic, reproducible by seed
    bodies = [generate.order(rng) for _ in range(count)]  # none out of stock: each is reserved once
    return [ServiceBusMessage(json.dumps(body), message_id=body["orderId"]) for body in bodies]


def measure(args: argparse.Namespace, breaker_open_seconds: float) -> Figures:
    """One run on a fresh stack."""
    stack = Stack.start()
    try:
        values = {**stack.values, "BREAKER_OPEN_SECONDS": str(breaker_open_seconds),
                  "OUTBOX_SWEEP_SCHEDULE": NEVER, "STUCK_REPORT_SCHEDULE": NEVER}
        path = settings_file(values)
        for _ in range(args.hosts):
            stack.start_host(path)
        orders = _orders(args.seed, args.orders)
        server = stack.fulfilment
        with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client, \
                client.get_queue_sender("orders") as sender:
            began, down_at = time.time(), None
            for index, order in enumerate(orders):
                if down_at is None and time.time() - began >= args.after and server.keys():
                    down_at = time.time()
                    server.outage(args.outage)
                sender.send_messages(order)
                time.sleep(max(0.0, began + (index + 1) / args.rate - time.time()))
            if down_at is None:  # the hosts' first request came after the sending: the outage starts with it
                first_call = time.time() + FIRST_REQUEST_SECONDS
                while not server.keys() and time.time() < first_call:
                    time.sleep(0.05)
                down_at = time.time()
                server.outage(args.outage)
        back_at = down_at + args.outage
        deadline = max(back_at, time.time()) + args.drain_seconds
        while server.reservation_count() < len(orders) and time.time() < deadline:
            time.sleep(1)
        keys = server.keys()
        calls = [call for key in keys for call in server.calls(key)]
        reserved = [call.time for call in calls if 200 <= call.status < 300]
        logs = "".join(host.text() for host in stack.hosts)
        return Figures(
            breaker_open_seconds, len(orders), args.outage,
            requests_while_down=sum(down_at <= call.time < back_at for call in calls), requests_in_all=len(calls),
            handed_on=logs.count(" outcome=handed_on "), handed_on_untried=logs.count("not tried: the "),
            breakers_opened=logs.count("breaker open function="),
            recovery_seconds=round(max(reserved) - back_at, 1) if reserved and max(reserved) > back_at else None,
            reserved_once=server.reservation_count() == len(orders) and len(reserved) == len(orders))
    finally:
        stack.stop()


def table(runs: list[Figures]) -> str:
    """The two runs side by side, and the ratio of the requests received while down."""
    rows: list[tuple[str, Callable[[Figures], str]]] = [
            ("BREAKER_OPEN_SECONDS", lambda f: f"{f.breaker_open_seconds:g}"),
            ("orders sent / fulfilment down, s", lambda f: f"{f.orders} / {f.outage_seconds:g}"),
            ("requests the service received while down", lambda f: str(f.requests_while_down)),
            ("&nbsp;&nbsp;per order sent", lambda f: f"{f.per_order:g}"),
            ("requests in all", lambda f: str(f.requests_in_all)),
            ("handed on (untried, breaker open) / breakers opened",
             lambda f: f"{f.handed_on} ({f.handed_on_untried}) / {f.breakers_opened}"),
            ("the last reservation after the service came back, s", lambda f: str(f.recovery_seconds)),
            ("every order reserved once", lambda f: "yes" if f.reserved_once else "**no**")]
    lines = ["| | " + " | ".join(f"breaker {'on' if f.breaker_open_seconds else 'off'}" for f in runs) + " |",
             "| --- |" + " --- |" * len(runs)]
    lines += [f"| {label} | " + " | ".join(cell(f) for f in runs) + " |" for label, cell in rows]
    on = next((f for f in runs if f.breaker_open_seconds), None)
    off = next((f for f in runs if not f.breaker_open_seconds), None)
    if on is not None and off is not None and on.requests_while_down:
        lines.append(f"\nRequests while down, without the breaker against with it: "
                     f"{off.requests_while_down / on.requests_while_down:.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run with the breaker and without, print the table; 1 when an order was not reserved
    exactly once."""
    parser = argparse.ArgumentParser(prog="python -m bench.outage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=600, help="orders sent (default 600)")
    parser.add_argument("--rate", type=float, default=10.0, help="orders a second (default 10)")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the service is down (default 60)")
    parser.add_argument("--after", type=float, default=5.0,
                        help="seconds into the sending it goes down, once it has received a request (default 5)")
    parser.add_argument("--hosts", type=int, default=1, help="host processes (default 1)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the orders (default 1)")
    parser.add_argument("--drain-seconds", type=float, default=600,
                        help="longest wait, after the service is back, for every order's reservation (default 600)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.orders < 1 or args.hosts < 1 or args.rate <= 0 or args.outage <= 0 or args.after < 0:
        parser.error("--orders and --hosts must be at least 1, --rate and --outage above 0, --after at least 0")
    runs = [measure(args, 30.0), measure(args, 0.0)]
    print(table(runs), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, Any] = {"runs": [{**asdict(f), "per order": f.per_order} for f in runs]}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0 if all(f.reserved_once for f in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
