"""``make demo``: the project's main job, on this machine, in one command.

Starts the local stack (broker, Cosmos server, fulfilment stand-in) and three competing local
Functions hosts; sends a realistic scenario (orders, their events partly out of order, producer
retries inside the detection window, late copies after it, reused ids, malformed messages); kills a
host mid-run and takes the fulfilment service down for a minute (the delayed retries carry the orders over it);
waits until everything has drained;
prints a report, writes it as JSON and a PNG chart; checks the invariants (exit 1 if one fails) and
stops what it started.

    python -m demo [--orders 2000] [--seed 1] [--hosts 3] [--results results/demo] [--keep-running]
                   [--events-queue sessions|plain] [--outage 120]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from azure.servicebus import ServiceBusClient

from demo import observe, report
from demo.scenario import Scenario, plan
from demo.stack import ROOT, Stack

DRAIN_TIMEOUT_SECONDS = 900
# The fulfilment service down, half-way through the sending: longer than MaxDeliveryCount deliveries with their
# waits take (10 x 10 s and more), so that only the delayed retries carry the orders over it.
OUTAGE_SECONDS = 120
STEADY_SHARE = 0.5  # of the burst's drain rate: the steady phase runs below capacity


def run(orders: int, seed: int, hosts: int, results: Path, keep_running: bool, *,
        events_sessions: bool = True, outage: float = OUTAGE_SECONDS) -> int:
    """The demo; 0 when every invariant holds."""
    scenario: Scenario = plan(orders, seed, steady_orders=max(10, orders // 10))
    print(f"demo: {orders} orders, {len(scenario.everything())} messages, seed {seed}; starting the stack", flush=True)
    stack = Stack.start(events_sessions=events_sessions)
    watch = observe.Watch(stack)
    try:
        for _ in range(hosts):
            stack.start_host()
        print(f"demo: {hosts} hosts listening; sending", flush=True)
        sent_at: dict[str, float] = {}
        started = time.time()
        with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client:
            halfway = threading.Event()
            senders = observe.start_senders(client, scenario, sent_at, halfway, stack=stack)
            halfway.wait(120)
            down_at = time.time()
            stack.fulfilment.outage(outage)
            print(f"demo: the fulfilment service is down for {outage:g} s; killing one host", flush=True)
            stack.kill_host(stack.hosts[0])
            for thread in senders:
                thread.join()
            observe.late_then_drain(stack, watch, client, scenario, sent_at, deadline=started + DRAIN_TIMEOUT_SECONDS,
                                    label="demo")
            elapsed = time.time() - started
            # Then latency at a steady half of the rate the burst drained at, apart from any backlog.
            steady, rate = scenario.take_steady(), STEADY_SHARE * report.drain_rate(stack.logs())
            print(f"demo: drained in {elapsed:.1f} s; {len(steady)} more messages at a steady {rate:.1f} a second",
                  flush=True)
            observe.steady_then_drain(stack, watch, client, steady, sent_at, per_second=rate,
                                      deadline=time.time() + DRAIN_TIMEOUT_SECONDS, label="demo")
            stack.stop_hosts()  # so that the probes below are not taken by a host
            seen = observe.observed(stack, watch, client, sent_at, elapsed, steady={p.message_id for p in steady},
                                    steady_per_second=rate)
        result = report.build(scenario, seen)
        keys = stack.fulfilment.keys()
        result.add_outage(seen.logs, [call for key in keys for call in stack.fulfilment.calls(key)], down_at,
                          down_at + outage, started + elapsed)
        print(report.table(result), flush=True)
        report.write(result, results)
        (results / "hosts.log").write_text(seen.logs)  # ids, hashes and outcomes: what python -m demo.workbook draws
        print(f"demo: wrote {results / 'demo.json'}, {results / 'demo.png'} and {results / 'hosts.log'}", flush=True)
        if keep_running:
            for _ in range(hosts):
                stack.start_host()
            print(f"demo: the stack keeps running (Service Bus {stack.broker.connection_string}); Ctrl-C stops it",
                  flush=True)
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 1 if result.violations else 0
    finally:
        watch.close()
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=2000, help="orders in the scenario (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the scenario (default 1)")
    parser.add_argument("--hosts", type=int, default=3, help="competing host processes (default 3, at least 2)")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "demo", help="where the JSON and PNG go")
    parser.add_argument("--keep-running", action="store_true", help="leave the stack up afterwards, for sbctl")
    parser.add_argument("--events-queue", choices=("sessions", "plain"), default="sessions",
                        help="the app's events on a session queue (default) or on a plain one (ORDER_EVENTS_SESSIONS"
                             " false)")
    parser.add_argument("--outage", type=float, default=OUTAGE_SECONDS, metavar="SECONDS",
                        help="how long the fulfilment service is down, from half-way through the sending (default 120)")
    args = parser.parse_args(argv)
    if args.outage <= 0:
        parser.error("--outage must be above 0: the report shows the outage and the recovery")
    if args.orders < 1 or args.hosts < 2:
        parser.error("--orders must be at least 1 and --hosts at least 2 (one is killed mid-run)")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if args.keep_running else None
    return run(args.orders, args.seed, args.hosts, args.results, args.keep_running,
               events_sessions=args.events_queue == "sessions", outage=args.outage)


if __name__ == "__main__":
    sys.exit(main())
