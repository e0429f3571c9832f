"""``make demo``: the project's main job, on this machine, in one command.

Starts the local stack (broker, Cosmos server, fulfilment stand-in) and three competing local
Functions hosts; sends a realistic scenario (orders, their events partly out of order, producer
retries inside the detection window, late copies after it, reused ids, malformed messages); kills a
host mid-run and takes the fulfilment service down for a moment; waits until everything has drained;
prints a report, writes it as JSON and a PNG chart; checks the invariants (exit 1 if one fails) and
stops what it started.

    python -m demo [--orders 2000] [--seed 1] [--hosts 3] [--results results/demo] [--keep-running]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from azure.cosmos import CosmosClient
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import OperationTimeoutError

from demo import report
from demo.scenario import Planned, Scenario, plan
from demo.stack import DETECTION_WINDOW_SECONDS, ROOT, Stack

DRAIN_TIMEOUT_SECONDS = 900
QUIET_POLLS = 3  # polls two seconds apart with no new delivery


def _send(client: ServiceBusClient, queue: str, messages: list[Planned], sent_at: dict[str, float],
          progress: threading.Event | None = None) -> None:
    with client.get_queue_sender(queue) as sender:
        for start in range(0, len(messages), 50):
            chunk = messages[start:start + 50]
            now = time.time()
            for planned in chunk:
                sent_at.setdefault(planned.message_id, now)
            sender.send_messages([ServiceBusMessage(p.body, message_id=p.message_id, session_id=p.session_id,
                                                    content_type="application/json") for p in chunk])
            if progress is not None and start >= len(messages) // 2:
                progress.set()


def _peek_count(client: ServiceBusClient, queue: str, sub_queue: Any = None) -> list[Any]:
    with client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
        found: list[Any] = []
        while batch := receiver.peek_messages(max_message_count=250, sequence_number=(
                found[-1].sequence_number + 1 if found else 0)):
            found += batch
        return found


def _documents(stack: Stack) -> list[dict[str, Any]]:
    client = CosmosClient(stack.cosmos.endpoint, credential=stack.cosmos.key, enable_endpoint_discovery=False)
    container = client.get_database_client("sales").get_container_client("orders")
    return list(container.query_items("SELECT * FROM c", enable_cross_partition_query=True))


def _orders_written(stack: Stack) -> int:
    return sum(1 for d in _documents(stack) if d.get("type") == "order")


def _session_messages(stack: Stack) -> int:
    """Messages waiting in an available session of order-events (a session a host holds is not available)."""
    with ServiceBusClient.from_connection_string(stack.broker.connection_string, retry_total=0) as client:
        try:
            with client.get_queue_receiver("order-events", session_id=NEXT_AVAILABLE_SESSION,
                                           max_wait_time=1) as receiver:
                return len(receiver.peek_messages(max_message_count=250))
        except OperationTimeoutError:
            return 0


def _left(stack: Stack, client: ServiceBusClient) -> int:
    return len(_peek_count(client, "orders")) + _session_messages(stack)


def _drained(stack: Stack, client: ServiceBusClient, deliveries: list[int]) -> bool:
    """Nothing waits in the queues or the store, and no delivery happened for the last few seconds."""
    deliveries.append(stack.logs().count(" delivery process_"))
    if len(deliveries) < QUIET_POLLS or len(set(deliveries[-QUIET_POLLS:])) != 1 or _left(stack, client):
        return False
    in_flight = {("outbox", "pending"), ("side-effect", "in_progress"), ("parked-event", "parked")}
    return not any((d.get("type"), d.get("status")) in in_flight for d in _documents(stack))


def _received(client: ServiceBusClient, queue: str) -> list[Any]:
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        found: list[Any] = []
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=2):
            for message in batch:
                receiver.complete_message(message)
            found += batch
        return found


def _accepted_by_broker(client: ServiceBusClient, queues: tuple[str, ...]) -> int:
    """Messages the broker accepted, from the sequence number it gives a probe sent to each queue now."""
    total = 0
    for queue in queues:
        probe = f"probe-{time.time_ns()}"
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"{}", message_id=probe, session_id=probe))
        with client.get_queue_receiver(queue, session_id=probe if queue == "order-events" else None,
                                       max_wait_time=5) as receiver:
            for message in receiver.receive_messages(max_message_count=1, max_wait_time=5):
                receiver.complete_message(message)
                total += (message.sequence_number or 1) - 1
    return total


def run(orders: int, seed: int, hosts: int, results: Path, keep_running: bool) -> int:
    """The demo; 0 when every invariant holds."""
    scenario: Scenario = plan(orders, seed)
    print(f"demo: {orders} orders, {len(scenario.everything())} messages, seed {seed}; starting the stack", flush=True)
    stack = Stack.start()
    try:
        for _ in range(hosts):
            stack.start_host()
        print(f"demo: {hosts} hosts listening; sending", flush=True)
        sent_at: dict[str, float] = {}
        started = time.time()
        with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client:
            halfway = threading.Event()
            senders = [threading.Thread(target=_send, args=(client, "orders", scenario.first, sent_at, halfway)),
                       threading.Thread(target=_send, args=(client, "order-events", scenario.events, sent_at))]
            for thread in senders:
                thread.start()
            halfway.wait(120)
            stack.fulfilment.fail_next(503, count=25, reason="a short fulfilment outage")
            print("demo: fulfilment outage (25 calls answer 503); killing one host", flush=True)
            stack.kill_host(stack.hosts[0])
            for thread in senders:
                thread.join()
            # Late copies and reused ids go once their originals are written (so "first" is well defined)
            # and the detection window of the last original has passed (so the broker lets them through).
            window_ends = time.time() + DETECTION_WINDOW_SECONDS + 1
            while _orders_written(stack) < len(scenario.orders) and time.time() < started + DRAIN_TIMEOUT_SECONDS:
                time.sleep(2)
            time.sleep(max(0.0, window_ends - time.time()))
            _send(client, "orders", scenario.late, sent_at)
            print("demo: waiting for the queues and the outbox to drain", flush=True)
            deadline = time.time() + DRAIN_TIMEOUT_SECONDS
            deliveries: list[int] = []
            while not _drained(stack, client, deliveries):
                if time.time() > deadline:
                    print("demo: not drained in time", file=sys.stderr)
                    break
                time.sleep(2)
            elapsed = time.time() - started
            stack.stop_hosts()  # so that the probes below are not taken by a host
            seen = report.Observed(
                documents=_documents(stack),
                dead_letters=[*_peek_count(client, "orders", ServiceBusSubQueue.DEAD_LETTER),
                              *_peek_count(client, "order-events", ServiceBusSubQueue.DEAD_LETTER)],  # no sessions
                accepted=[json.loads(b"".join(m.body)) for m in _received(client, "order-accepted")],
                broker_accepted=_accepted_by_broker(client, ("orders", "order-events")),
                reservations=stack.fulfilment.reservations(), logs=stack.logs(), sent_at=sent_at, elapsed=elapsed,
                queues_left=_left(stack, client),
            )
        result = report.build(scenario, seen)
        print(report.table(result), flush=True)
        report.write(result, results)
        print(f"demo: wrote {results / 'demo.json'} and {results / 'demo.png'}", flush=True)
        if keep_running:
            for _ in range(hosts):
                stack.start_host()
            print(f"demo: the stack keeps running (Service Bus {stack.broker.connection_string}); Ctrl-C stops it",
                  flush=True)
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 1 if result.violations else 0
    finally:
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
    args = parser.parse_args(argv)
    if args.orders < 1 or args.hosts < 2:
        parser.error("--orders must be at least 1 and --hosts at least 2 (one is killed mid-run)")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if args.keep_running else None
    return run(args.orders, args.seed, args.hosts, args.results, args.keep_running)


if __name__ == "__main__":
    sys.exit(main())
