"""The app's real functions on the local host, against the local broker, Cosmos server and fulfilment stand-in."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from devservers.fulfilment import FulfilmentServer
from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, ROOT, HostProcess, Store, app_settings, eventually, peek, send
from tests.support.events import event_body
from tests.support.orders import order_body

PARKED, SHIPPED = "com.example.orders.PaymentCaptured", "com.example.orders.OrderShipped"

pytestmark = NEEDS_313


def received(broker: Broker, queue: str, seconds: float = 1.0) -> list[Any]:
    """Receive and complete what the queue holds now."""
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_receiver(queue, max_wait_time=seconds) as receiver:
        found = []
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=seconds):
            for message in batch:
                receiver.complete_message(message)
                found.append(message)
        return found


def test_an_order_becomes_one_document_and_its_message_is_completed(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    host = start_host(ROOT, app_settings(broker, store, fulfilment_service))
    order_id = f"ord-{uuid.uuid4()}"
    send(broker, "orders", json.dumps(order_body(order_id)), message_id=order_id)
    eventually(lambda: store.documents(order_id, "order"), what="the order document")
    eventually(lambda: f"process_order messageId={order_id} outcome=Succeeded settlement=complete" in host.output(),
               what="the completed settlement")
    assert len(store.documents(order_id, "order")) == 1
    assert not [m for m in peek(broker, "orders") if m.message_id == order_id]
    # The async function's own log record reaches the host tagged with its invocation, as in Azure.
    assert re.search(rf"worker \[[0-9a-f]{{8}}\] idempotent_consumer: delivery process_order messageId={order_id} ",
                     host.output())


def test_an_invalid_order_is_dead_lettered_with_its_reason(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    start_host(ROOT, app_settings(broker, store, fulfilment_service))
    message_id = f"bad-{uuid.uuid4()}"
    send(broker, "orders", b"{not json", message_id=message_id)
    [dead] = eventually(lambda: [m for m in peek(broker, "orders", dead_letters=True) if m.message_id == message_id],
                        what="the dead letter")
    assert dead.dead_letter_reason == "InvalidMessage"
    assert (dead.dead_letter_error_description or "").startswith("body is not UTF-8 JSON")


@pytest.mark.parametrize(("queue", "sessions"), [("order-events", "true"), ("order-events-plain", "false")])
def test_an_orders_events_are_applied_in_order_with_or_without_sessions(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess],
    queue: str, sessions: str,
) -> None:
    host = start_host(ROOT, app_settings(broker, store, fulfilment_service, ORDER_EVENTS_QUEUE=queue,
                                         ORDER_EVENTS_SESSIONS=sessions))
    order_id = f"ord-{uuid.uuid4()}"
    send(broker, "orders", json.dumps(order_body(order_id)), message_id=order_id)
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender(queue) as sender:
        for sequence, event_type in ((3, SHIPPED), (2, PARKED)):  # 3 first: parked until 2 releases it
            body = event_body(order_id, sequence, event_type)
            sender.send_messages(ServiceBusMessage(json.dumps(body), message_id=body["id"], session_id=order_id))
    final = eventually(lambda: [d for d in store.documents(order_id, "order") if d["version"] == 3],
                       what="the order at version 3")
    assert final[0]["status"] == "shipped" and final[0]["parked"] == 0
    assert store.documents(order_id, "parked-event") == []
    # With sessions a slot lets the order's session go after it; without, the trigger is a plain queue's.
    if sessions == "true":
        eventually(lambda: f"process_order_event session {order_id} released" in host.output(),
                   what="the session let go")
    else:
        assert "process_order_event session " not in host.output()


def sent(store: Store, order_id: str) -> bool:
    """Whether the order's OrderAccepted was sent: its finish wrote the reservation with the outbox entry, and the
    publisher has deleted the entry since."""
    documents = store.documents(order_id)
    return any(d.get("type") == "order" and "reservation" in d for d in documents) \
        and not any(d.get("type") == "outbox" for d in documents)


def live_leases(store: Store) -> list[dict[str, Any]]:
    return [lease for lease in store.leases.read_all_items() if float(lease.get("leaseUntil") or 0) > time.time()]


def feed_free(store: Store) -> None:
    """Wait until no host holds the change feed's lease. An earlier test's host let it go when it stopped;
    one that had to be killed holds it for the 60 s of leaseExpirationInterval, and its lease must not
    be taken for the next host's."""
    eventually(lambda: not live_leases(store), timeout=90, what="the change feed's lease let go")


def feed_started(store: Store) -> None:
    """Wait until the host just started holds the change feed's lease (``feed_free`` came first) and has
    polled once: as in Azure, a feed without a lease starts from its first poll, so a change made before
    it is left to the sweep (which these tests switch off)."""
    eventually(lambda: [lease for lease in live_leases(store) if lease.get("continuation")],
               what="the change feed's lease")


def test_publish_outbox_delivers_order_accepted_through_the_change_feed(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    feed_free(store)
    host = start_host(ROOT, app_settings(broker, store, fulfilment_service, OUTBOX_DESTINATION="order-accepted-plain",
                                         OUTBOX_SWEEP_SCHEDULE="0 0 0 1 1 *"))
    feed_started(store)
    order_id = f"ord-{uuid.uuid4()}"
    send(broker, "orders", json.dumps(order_body(order_id)), message_id=order_id)
    eventually(lambda: sent(store, order_id), what="the outbox entry sent and deleted")
    bodies = [(m, json.loads(b"".join(m.body))) for m in received(broker, "order-accepted-plain")]
    accepted = [m for m, body in bodies if body["orderId"] == order_id]
    assert len(accepted) == 1 and accepted[0].subject == "OrderAccepted"
    assert "publish_outbox documents=" in host.output()


def test_sweep_outbox_runs_on_its_timer(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    host = start_host(ROOT, app_settings(broker, store, fulfilment_service, OUTBOX_SWEEP_SCHEDULE="*/1 * * * * *"))
    eventually(lambda: host.output().count("sweep_outbox timer outcome=Succeeded") >= 2, what="two sweeps")


def test_two_hosts_of_one_app_and_store_sweep_each_occurrence_once(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    values = app_settings(broker, store, fulfilment_service, OUTBOX_SWEEP_SCHEDULE="*/1 * * * * *")
    hosts = [start_host(ROOT, values) for _ in range(2)]

    def sweeps() -> list[str]:
        pattern = r"sweep_outbox timer outcome=\w+ \d+ ms due=(\S+)"
        return [due for host in hosts for due in re.findall(pattern, host.output())]

    eventually(lambda: len(sweeps()) >= 6, timeout=60, what="six sweeps")
    assert len(sweeps()) == len(set(sweeps())), sorted(sweeps())  # each second swept by one host, not both


def test_two_hosts_with_16_competing_copies_of_one_order_give_one_document_and_one_reservation(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    values = app_settings(broker, store, fulfilment_service, ORDERS_QUEUE="orders-plain",
                          AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls="2")
    hosts = [start_host(ROOT, values) for _ in range(2)]
    order_id = f"ord-{uuid.uuid4()}"
    body = json.dumps(order_body(order_id))
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender("orders-plain") as sender:
        sender.send_messages([ServiceBusMessage(body, message_id=order_id) for _ in range(16)])
    eventually(lambda: sum(h.output().count(f"process_order messageId={order_id} ") for h in hosts) >= 16,
               timeout=60, what="16 deliveries settled")
    eventually(lambda: not peek(broker, "orders-plain"), what="the queue drained")
    assert len(store.documents(order_id, "order")) == 1
    assert all(h.output().count(f"process_order messageId={order_id} ") for h in hosts), "both hosts took copies"
    [record] = store.documents(order_id, "side-effect")
    assert record["status"] == "completed"
    assert fulfilment_service.keys().count(record["idempotencyKey"]) == 1
    assert peek(broker, "orders-plain", dead_letters=True) == []


@pytest.mark.timeout(300)  # two hosts started and stopped, and waits of up to 90 s: past the 120 s default when busy
def test_a_restarted_host_resumes_the_change_feed_where_it_stopped(
    broker: Broker, store: Store, fulfilment_service: FulfilmentServer, start_host: Callable[..., HostProcess]
) -> None:
    values = app_settings(broker, store, fulfilment_service, OUTBOX_DESTINATION="order-accepted-plain",
                          OUTBOX_SWEEP_SCHEDULE="0 0 0 1 1 *")
    feed_free(store)
    first = start_host(ROOT, values)
    feed_started(store)
    before = f"ord-{uuid.uuid4()}"
    send(broker, "orders", json.dumps(order_body(before)), message_id=before)
    eventually(lambda: sent(store, before), what="the first order's OrderAccepted sent")
    eventually(lambda: "publish_outbox documents=" in first.output(), what="the first host's feed batch")
    time.sleep(2)  # the continuation saved (the entry's delete is no change the feed shows)
    assert first.terminate() == 0
    second = start_host(ROOT, values)
    time.sleep(4)  # several polls: nothing new since the first host's continuation
    assert "publish_outbox documents=" not in second.output(), "the second host read old changes again"
    after = f"ord-{uuid.uuid4()}"
    send(broker, "orders", json.dumps(order_body(after)), message_id=after)
    eventually(lambda: sent(store, after), timeout=90, what="the second order's OrderAccepted sent by the second host")
    ids = [json.loads(b"".join(m.body))["orderId"] for m in received(broker, "order-accepted-plain")]
    assert ids.count(before) == 1 and ids.count(after) == 1
