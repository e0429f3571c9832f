"""Reading the running stack from outside, for the demo and the chaos suite: sending the planned messages,
waiting until everything has drained, and collecting what the report checks."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from azure.cosmos import CosmosClient
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusSender,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusConnectionError

from demo import report
from demo.scenario import Planned, Scenario
from demo.stack import DETECTION_WINDOW_SECONDS, Stack
from simulation.invariants import left_undone

QUIET_POLLS = 3  # polls two seconds apart with no new delivery


def send(client: ServiceBusClient, queue: str, messages: list[Planned], sent_at: dict[str, float], *,
         progress: threading.Event | None = None, per_second: float | None = None, sessions: bool = True) -> None:
    """Send in chunks, recording when each id was first sent; at most ``per_second`` messages a second
    when given (else as fast as the broker takes them). ``progress`` is set once half are sent. Without
    ``sessions`` the messages go without their SessionId (a plain events queue)."""
    size = 50 if per_second is None else max(1, min(50, int(per_second)))
    began = time.time()
    with _opened(client, queue) as sender:
        for start in range(0, len(messages), size):
            if per_second is not None:
                time.sleep(max(0.0, began + start / per_second - time.time()))
            chunk = messages[start:start + size]
            now = time.time()
            for planned in chunk:
                sent_at.setdefault(planned.message_id, now)
            sender.send_messages([ServiceBusMessage(p.body, message_id=p.message_id,
                                                    session_id=p.session_id if sessions else None,
                                                    content_type="application/json") for p in chunk])
            if progress is not None and start >= len(messages) // 2:
                progress.set()


# How often a sender's link is opened again when the broker does not accept it in time: a local broker on a loaded
# 2-core machine (the test command runs three stacks side by side) has taken longer than the SDK's own retries.
OPEN_ATTEMPTS = 4


def _opened(client: ServiceBusClient, queue: str) -> ServiceBusSender:
    """A sender on ``queue``, opened before anything is sent: a link the broker did not accept in time is opened
    again (nothing was sent on it, so nothing is sent twice), up to ``OPEN_ATTEMPTS`` times."""
    attempt = 1
    while True:
        sender = client.get_queue_sender(queue)
        try:
            return sender.__enter__()
        except ServiceBusConnectionError:
            sender.close()
            if attempt == OPEN_ATTEMPTS:
                raise
        attempt += 1
        time.sleep(5)


def peek_count(client: ServiceBusClient, queue: str, sub_queue: Any = None) -> list[Any]:
    with client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
        found: list[Any] = []
        while batch := receiver.peek_messages(max_message_count=250, sequence_number=(
                found[-1].sequence_number + 1 if found else 0)):
            found += batch
        return found


# How long a wait past its deadline goes on while nothing moves (no delivery, no order written): longer than the
# longest a message waits between two deliveries in the chaos run (a 6 s lock, a 2 s wait, a host stopped 10 s),
# and longer than the outbox sweep can be away while an entry waits for it: a sweep held up by a lost answer until
# the function's timeout (120 s), or a timers' lease left by a killed host (60 s, as on Azure) that another host
# looks for again within 60 s; then the next sweep (every 10 s) publishes what is pending.
STALLED_SECONDS = 180.0
# A superset of what ``left_undone`` calls waiting, so that the drain reads only those documents.
UNDONE_QUERY = ("SELECT * FROM c WHERE c.type = 'order-pending' OR (c.type IN ('outbox', 'side-effect', 'parked-event')"
                " AND c.status IN ('pending', 'in_progress', 'parked'))"
                " OR (c.type = 'order' AND c.reservationClaim.status = 'in_progress')")
PAGE = 1000


class Watch:
    """The driver's view of the orders container, through one client for the whole run.

    It never scans the container while the hosts work: the orders written come from the change feed
    (each poll reads what changed since the last), what is still in flight from one targeted query,
    and the documents for the checks from the change feed read once from the beginning (every live
    document, in one pass).
    """

    def __init__(self, stack: Stack) -> None:
        self._client = CosmosClient(stack.cosmos.endpoint, credential=stack.cosmos.key,
                                    enable_endpoint_discovery=False, connection_timeout=10, read_timeout=60)
        self._container = self._client.get_database_client("sales").get_container_client("orders")
        self._orders: set[str] = set()
        self._continuation: str | None = None

    def orders_written(self) -> int:
        """How many order documents exist (a new order's document is never deleted)."""
        options: dict[str, Any] = ({"continuation": self._continuation} if self._continuation
                                   else {"is_start_from_beginning": True})
        for document in self._container.query_items_change_feed(partition_key_range_id="0", max_item_count=PAGE,
                                                                 **options):
            if document.get("type") == "order":
                self._orders.add(document["id"])
        self._continuation = self._container.client_connection.last_response_headers.get("etag")
        return len(self._orders)

    def undone(self) -> list[str]:
        """What the documents say is still waiting to be done (``left_undone``), by one targeted query."""
        found = self._container.query_items(UNDONE_QUERY, enable_cross_partition_query=True, max_item_count=PAGE)
        return [undone for document in found if (undone := left_undone(document)) is not None]

    def documents(self) -> list[dict[str, Any]]:
        """Every live document, from the change feed read from the beginning."""
        feed = self._container.query_items_change_feed(partition_key_range_id="0", is_start_from_beginning=True,
                                                       max_item_count=PAGE)
        return [{k: v for k, v in document.items() if k != "_lsn"} for document in feed]

    def close(self) -> None:
        """Close the client."""
        self._client.close()


def session_messages(stack: Stack) -> int:
    """Messages waiting in an available session of order-events (a session a host holds is not available)."""
    if not stack.events_sessions:
        with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client:
            return len(peek_count(client, stack.events_queue))
    try:
        return _available_session_messages(stack, wait=1)
    except ServiceBusConnectionError:
        # The connection took longer than the wait: a loaded machine's broker is slow to accept. Once more,
        # with time for it; a second failure ends the run as unobserved.
        return _available_session_messages(stack, wait=10)


def _available_session_messages(stack: Stack, *, wait: float) -> int:
    # No retries: a session accept that finds none ends at once (OperationTimeoutError), which means 0.
    with ServiceBusClient.from_connection_string(stack.broker.connection_string, retry_total=0) as client:
        try:
            with client.get_queue_receiver("order-events", session_id=NEXT_AVAILABLE_SESSION,
                                           max_wait_time=wait) as receiver:
                return len(receiver.peek_messages(max_message_count=250))
        except OperationTimeoutError:
            return 0


def left(stack: Stack, client: ServiceBusClient) -> int:
    return len(peek_count(client, "orders")) + session_messages(stack)


_COPY_DUE = re.compile(r" outcome=handed_on .*; retry \d+ due (\S+)$", re.MULTILINE)


def last_copy_due(logs: str) -> float:
    """When the last copy a host handed on for a delayed retry comes due (0 when none was): until then a copy may
    wait in a queue as a scheduled message, which a session-enabled queue shows no one but its session."""
    return max((datetime.fromisoformat(due).timestamp() for due in _COPY_DUE.findall(logs)), default=0.0)


def drained(stack: Stack, watch: Watch, client: ServiceBusClient, deliveries: list[int]) -> bool:
    """Nothing waits in the queues or the store, no copy is still to come due, and no delivery happened for the last
    few seconds."""
    logs = stack.logs()
    deliveries.append(logs.count(" delivery process_"))
    if len(deliveries) < QUIET_POLLS or len(set(deliveries[-QUIET_POLLS:])) != 1 or left(stack, client):
        return False
    return time.time() > last_copy_due(logs) and not watch.undone()


def received(client: ServiceBusClient, queue: str) -> list[Any]:
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        found: list[Any] = []
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=2):
            for message in batch:
                receiver.complete_message(message)
            found += batch
        return found


def accepted_by_broker(client: ServiceBusClient, queues: tuple[str, ...], session_queue: str | None = None) -> int:
    """Messages the broker accepted, from the sequence number it gives a probe sent to each queue now."""
    total = 0
    for queue in queues:
        probe = f"probe-{time.time_ns()}"
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"{}", message_id=probe, session_id=probe))
        with client.get_queue_receiver(queue, session_id=probe if queue == session_queue else None,
                                       max_wait_time=5) as receiver:
            for message in receiver.receive_messages(max_message_count=1, max_wait_time=5):
                receiver.complete_message(message)
                total += (message.sequence_number or 1) - 1
    return total


def steady_then_drain(stack: Stack, watch: Watch, client: ServiceBusClient, messages: list[Planned],
                      sent_at: dict[str, float], *, per_second: float, deadline: float, label: str) -> bool:
    """Send ``messages`` (orders and their events) at ``per_second`` in all, each queue's share on a thread of
    its own, then wait until everything has drained; False at ``deadline``."""
    orders = [p for p in messages if p.queue == "orders"]
    events = [p for p in messages if p.queue != "orders"]
    threads = [threading.Thread(target=send, args=(client, queue, chunk, sent_at), kwargs={
        "per_second": per_second * len(chunk) / max(1, len(messages)), "sessions": stack.events_sessions})
        for queue, chunk in (("orders", orders), (stack.events_queue, events)) if chunk]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"{label}: the steady phase is sent; waiting for it to drain", flush=True)
    return wait_drained(stack, watch, client, deadline=deadline, label=label)


def wait_drained(stack: Stack, watch: Watch, client: ServiceBusClient, *, deadline: float, label: str) -> bool:
    """Wait until everything has drained; False once ``deadline`` has passed and no delivery has been made for
    STALLED_SECONDS: the deadline follows the work, so that a slow machine drains slower, not wrongly, and a run
    that stopped draining still ends."""
    deliveries: list[int] = []
    progress = Progress()
    while not _drained_if_seen(stack, watch, client, deliveries, label):
        if progress.stalled(deliveries[-1] if deliveries else 0, deadline) \
                and time.time() > last_copy_due(stack.logs()) + STALLED_SECONDS:
            print(f"{label}: not drained: no delivery for {STALLED_SECONDS:.0f} s past the deadline", file=sys.stderr)
            return False
        time.sleep(2)
    return True


def _drained_if_seen(stack: Stack, watch: Watch, client: ServiceBusClient, deliveries: list[int], label: str) -> bool:
    """``drained``, or False for a poll the local broker did not answer in time: on a loaded 2-core machine it has
    refused a connection past the SDK's retries (and ``session_messages``' second try) while the hosts drained on.
    The wait goes on, bounded as ever by its deadline; the checks after it read the broker again."""
    try:
        return drained(stack, watch, client, deliveries)
    except (ServiceBusConnectionError, OperationTimeoutError) as exc:
        print(f"{label}: the broker did not answer a drain poll ({type(exc).__name__}); polling again", file=sys.stderr)
        return False


class Progress:
    """Whether a wait has stalled: its deadline passed, and what it counts has not moved for STALLED_SECONDS."""

    def __init__(self) -> None:
        self._count: int | None = None
        self._moved = time.time()

    def stalled(self, count: int, deadline: float) -> bool:
        now = time.time()
        if count != self._count:
            self._count, self._moved = count, now
        return now > deadline and now - self._moved > STALLED_SECONDS


def observed(stack: Stack, watch: Watch, client: ServiceBusClient, sent_at: dict[str, float],
             elapsed: float, *, steady: set[str] | None = None, steady_per_second: float = 0.0) -> report.Observed:
    """Everything the report reads, once the hosts have stopped (so that the probes are not taken by one)."""
    return report.Observed(
        documents=watch.documents(),
        dead_letters=[*peek_count(client, "orders", ServiceBusSubQueue.DEAD_LETTER),
                      *peek_count(client, stack.events_queue, ServiceBusSubQueue.DEAD_LETTER)],  # no sessions
        accepted=[_accepted(m) for m in received(client, "order-accepted")],
        rejected=[_accepted(m) for m in received(client, "order-rejected")],
        broker_accepted=accepted_by_broker(client, ("orders", stack.events_queue),
                                           session_queue="order-events" if stack.events_sessions else None),
        reservations=stack.fulfilment.reservations(), logs=stack.logs(), sent_at=sent_at, elapsed=elapsed,
        queues_left=left(stack, client), steady=steady or set(), steady_per_second=steady_per_second,
    )


def _accepted(message: Any) -> dict[str, Any]:
    """An OrderAccepted (or OrderRejected) body, with its MessageId and when the broker enqueued it beside it."""
    enqueued = message.enqueued_time_utc.timestamp() if message.enqueued_time_utc else None
    return {**json.loads(b"".join(message.body)), report.ACCEPTED_AS: [str(message.message_id), enqueued]}


def start_senders(client: ServiceBusClient, scenario: Scenario, sent_at: dict[str, float],
                  halfway: threading.Event, per_second: float | None = None, *,
                  stack: Stack | None = None) -> list[threading.Thread]:
    """Send the orders (with their early copies and malformed messages) and the events, on two threads;
    ``halfway`` is set once half the orders are sent. ``per_second``, when given, is the total rate,
    shared so that both finish together. The events go to the ``stack``'s events queue."""
    total = len(scenario.first) + len(scenario.events) or 1
    sessions = stack is None or stack.events_sessions
    events_queue = "order-events" if stack is None else stack.events_queue
    senders = [threading.Thread(target=send, args=(client, queue, messages, sent_at), kwargs={
        "progress": progress, "per_second": per_second and per_second * len(messages) / total,
        "sessions": sessions})
        for queue, messages, progress in (("orders", scenario.first, halfway),
                                          (events_queue, scenario.events, None))]
    for thread in senders:
        thread.start()
    return senders


def late_then_drain(stack: Stack, watch: Watch, client: ServiceBusClient, scenario: Scenario,
                    sent_at: dict[str, float], *,
                    deadline: float, label: str, on_sent: Callable[[], None] | None = None,
                    others_last_sent: Callable[[], float | None] | None = None) -> bool:
    """Send the storms' orders held back, then the late copies and reused ids, then wait until everything has
    drained; False at ``deadline``.

    The late ones go once their originals are written (so "first" is well defined) and the detection
    window of the last original has passed (so the broker lets them through). ``others_last_sent``, when
    given, says when something besides the scenario last sent under an order's own MessageId (an
    operator's resubmission), or None while it may still do so: the late ones wait for its window too,
    or a reused id planned to be dead-lettered would be absorbed by the broker instead. ``on_sent`` runs
    once they are sent, before the wait.
    """
    send(client, "orders", scenario.held, sent_at)  # storms' orders, held back until the rest was sent
    window_ends = time.time() + DETECTION_WINDOW_SECONDS + 1
    progress = Progress()
    while (written := watch.orders_written()) < len(scenario.orders) and not progress.stalled(written, deadline):
        time.sleep(2)
    while time.time() < deadline:
        last = 0.0 if others_last_sent is None else others_last_sent()
        if last is not None and time.time() >= max(window_ends, last + DETECTION_WINDOW_SECONDS + 1):
            break
        time.sleep(1)
    send(client, "orders", scenario.late, sent_at)
    if on_sent is not None:
        on_sent()
    print(f"{label}: waiting for the queues and the outbox to drain", flush=True)
    return wait_drained(stack, watch, client, deadline=deadline, label=label)
