"""The transactional outbox: written with the order, published from change-feed batches and the sweep."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import OperationTimeoutError

from devservers.faultproxy import fault_proxy
from devservers.servicebus import Broker, start_broker
from idempotent_consumer.adapters.servicebus import ServiceBusSender
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outbox import OutboxPublisher
from idempotent_consumer.ports.sender import OutgoingMessage
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.testing.memory import RecordingSender
from shared.domain import identity
from tests.functions.conftest import Deliverer, Harness
from tests.support.orders import encode, order_body

BROKER_CONFIG = {"UserConfig": {"Namespaces": [{"Name": "outbox", "Queues": [
    {"Name": "order-accepted", "Properties": {"RequiresDuplicateDetection": True,
                                              "DuplicateDetectionHistoryTimeWindow": "PT5M"}},
    {"Name": "order-accepted-sessions", "Properties": {"RequiresDuplicateDetection": True,
                                                       "DuplicateDetectionHistoryTimeWindow": "PT5M",
                                                       "RequiresSession": True}},
], "Topics": []}]}}


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with start_broker(BROKER_CONFIG) as running:
        yield running


class BrokerTap:
    """The real (async) sender to the local broker: ``sent`` is what the app sent, ``delivered`` what reached the
    destination queues past their duplicate detection, read back with the real SDK receiver."""

    def __init__(self, connection_string: str) -> None:
        self.connection_string = connection_string
        self.sessions = False  # also read the session-enabled destination
        self.sender = ServiceBusSender(AsyncServiceBusClient.from_connection_string(connection_string))
        self.sent: list[tuple[str, OutgoingMessage]] = []
        self._received: list[tuple[str, OutgoingMessage]] = []
        _ = self.delivered  # drain what earlier tests left in the shared queues
        self._received.clear()

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        self.sent.extend((destination, m) for m in messages)
        await self.sender.send(destination, messages)

    @property
    def delivered(self) -> list[tuple[str, OutgoingMessage]]:
        # retry_total=0: with no session to lock, the SDK would otherwise retry its timeout for ~20 s
        with ServiceBusClient.from_connection_string(self.connection_string, retry_total=0) as client:
            with client.get_queue_receiver("order-accepted", max_wait_time=1) as receiver:
                self._collect("order-accepted", receiver)
            if not self.sessions:
                return list(self._received)
            with (
                contextlib.suppress(OperationTimeoutError),  # no session has messages
                client.get_queue_receiver(
                    "order-accepted-sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                ) as session,
            ):
                self._collect("order-accepted-sessions", session)
        return list(self._received)

    def _collect(self, destination: str, receiver: Any) -> None:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=1):
            for message in batch:
                receiver.complete_message(message)
                self._received.append((destination, OutgoingMessage(
                    message_id=message.message_id, body=b"".join(message.body),
                    correlation_id=message.correlation_id, session_id=message.session_id, subject=message.subject,
                )))


@pytest.fixture(params=["recording", "broker"])
def sender(request: pytest.FixtureRequest, app_on_cosmos: Harness) -> Iterator[RecordingSender | BrokerTap]:
    """The recording sender behind the sender port, or the real azure-servicebus sender and the local broker."""
    if request.param == "recording":
        recording = RecordingSender()
        app_on_cosmos.reconfigure(sender=recording)
        yield recording
        return
    broker: Broker = request.getfixturevalue("broker")
    tap = BrokerTap(broker.connection_string)
    try:
        app_on_cosmos.reconfigure(sender=tap)
        yield tap
    finally:
        app_on_cosmos.run(tap.sender.close())  # handed in, so the test's to close, on the loop it sent in


def partition(target: Harness, order_id: str, doc_type: str | None = None) -> list[dict]:
    docs = list(target.container.query_items("SELECT * FROM c", partition_key=order_id))
    return [d for d in docs if doc_type is None or d.get("type") == doc_type]


def change_feed(target: Harness, order_id: str) -> func.DocumentList:
    """The partition's documents as the host hands a change-feed batch to the function."""
    return func.DocumentList([func.Document.from_dict(d) for d in partition(target, order_id)])


def place(deliver: Deliverer, **message: Any) -> str:
    order_id = f"ord-{uuid.uuid4()}"
    deliver(encode(order_body(order_id)), message_id=order_id, **message)
    return order_id


def test_each_order_gets_exactly_one_pending_outbox_document(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    for _ in range(3):
        deliver_order(encode(order_body(order_id)), message_id=order_id, correlation_id="corr-5")
    [outbox] = partition(app_on_cosmos, order_id, "outbox")
    assert (outbox["status"], outbox["destination"], outbox["correlationId"]) == ("pending", "order-accepted", "corr-5")
    assert outbox["messageId"] == identity.outbox_message_id("order-projection", order_id)
    assert "ttl" not in outbox


def test_failed_batch_writes_neither_order_nor_outbox(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    claim = SideEffect(app_on_cosmos.cosmos_store(), "order-projection", "reserve-stock", 60).claim(
        order_id, InboundMessage(message_id=order_id, body=None))
    app_on_cosmos.container.create_item(claim.to_document())  # the batch's third create will conflict
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "abandon"
    assert partition(app_on_cosmos, order_id, "order") == []
    assert partition(app_on_cosmos, order_id, "outbox") == []


def test_publisher_sends_pending_outbox_from_a_change_feed_batch_and_deletes_it(
    app_on_cosmos: Harness, deliver_order: Deliverer, sender: RecordingSender,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order, correlation_id="corr-8")
    app_on_cosmos.run(registered_functions["publish_outbox"](change_feed(app_on_cosmos, order_id)))
    [(destination, message)] = sender.delivered
    assert destination == "order-accepted"
    assert message.message_id == identity.outbox_message_id("order-projection", order_id)
    assert (message.correlation_id, message.session_id, message.subject) == ("corr-8", None, "OrderAccepted")
    assert json.loads(message.body)["orderId"] == order_id
    assert partition(app_on_cosmos, order_id, "outbox") == []  # sent, then deleted: OUTBOX_DISPATCHED_TTL_SECONDS 0


def test_dispatched_and_other_documents_in_the_feed_are_skipped(
    app_on_cosmos: Harness, deliver_order: Deliverer, sender: RecordingSender,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    app_on_cosmos.reconfigure(outbox_dispatched_ttl_seconds=604800)  # sent entries kept, as a release before did
    order_id = place(deliver_order)
    publish = registered_functions["publish_outbox"]
    app_on_cosmos.run(publish(change_feed(app_on_cosmos, order_id)))
    app_on_cosmos.run(publish(change_feed(app_on_cosmos, order_id)))  # the feed delivers the dispatched one again
    assert len(sender.delivered) == 1


def test_session_destination_gets_the_order_as_session_id(
    app_on_cosmos: Harness, deliver_order: Deliverer,
    sender: RecordingSender | BrokerTap, registered_functions: dict[str, Callable[..., Any]],
) -> None:
    app_on_cosmos.reconfigure(outbox_requires_session=True, outbox_destination="order-accepted-sessions")
    if isinstance(sender, BrokerTap):
        sender.sessions = True  # the tap reads the session-enabled queue too
    order_id = place(deliver_order)
    app_on_cosmos.run(registered_functions["publish_outbox"](change_feed(app_on_cosmos, order_id)))
    [(destination, message)] = sender.delivered
    assert (destination, message.session_id) == ("order-accepted-sessions", order_id)


def test_crash_before_the_delete_republishes_the_same_message_id(
    app_on_cosmos: Harness, deliver_order: Deliverer,
    sender: RecordingSender | BrokerTap, registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order)
    feed = change_feed(app_on_cosmos, order_id)
    with fault_proxy(app_on_cosmos.endpoint.url) as proxy:
        app_on_cosmos.reconfigure(cosmos_endpoint=proxy.url)
        proxy.fail("POST", r"/docs/?$", 503, count=None)  # the delete (a batch of one) fails after the send
        app_on_cosmos.run(registered_functions["publish_outbox"](feed))
    assert partition(app_on_cosmos, order_id, "outbox")[0]["status"] == "pending"
    app_on_cosmos.reconfigure(cosmos_endpoint=app_on_cosmos.endpoint.url, outbox_stuck_after_seconds=1)
    time.sleep(1.1)
    app_on_cosmos.run(registered_functions["sweep_outbox"](TimerRequest()))  # the republish, in the detection window
    expected = identity.outbox_message_id("order-projection", order_id)
    assert [m.message_id for _, m in sender.sent].count(expected) == 2  # sent twice under the same MessageId...
    # ...and the destination's duplicate detection lets exactly one through
    assert [m.message_id for _, m in sender.delivered].count(expected) == 1
    assert partition(app_on_cosmos, order_id, "outbox") == []


def test_republishing_one_outbox_document_twice_delivers_one_message(
    app_on_cosmos: Harness, deliver_order: Deliverer, sender: RecordingSender | BrokerTap,
) -> None:
    order_id = place(deliver_order)
    [document] = partition(app_on_cosmos, order_id, "outbox")
    publisher = OutboxPublisher(app_on_cosmos.cosmos_store(), sender, dispatched_ttl_seconds=60)
    app_on_cosmos.run(publisher.publish([document]))
    app_on_cosmos.run(publisher.publish([document]))  # the same pending copy again, as after a crash before the mark
    assert [m.message_id for _, m in sender.sent].count(document["messageId"]) == 2
    assert [m.message_id for _, m in sender.delivered].count(document["messageId"]) == 1


def test_sweep_publishes_only_documents_pending_past_the_threshold(
    app_on_cosmos: Harness, deliver_order: Deliverer,
    sender: RecordingSender, registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order)
    app_on_cosmos.run(registered_functions["sweep_outbox"](TimerRequest()))  # threshold 120 s: too young
    assert all(m.message_id != partition(app_on_cosmos, order_id, "outbox")[0]["messageId"] for _, m in sender.sent)
    outbox = partition(app_on_cosmos, order_id, "outbox")[0]
    assert outbox["due"] == outbox["createdAt"]  # what the sweep's query filters on, with its type
    older = outbox["createdAt"] - 301
    app_on_cosmos.container.replace_item(outbox["id"], {**outbox, "createdAt": older, "due": older})
    app_on_cosmos.run(registered_functions["sweep_outbox"](TimerRequest()))
    assert outbox["messageId"] in [m.message_id for _, m in sender.sent]
    assert partition(app_on_cosmos, order_id, "outbox") == []


def test_the_mark_on_cosmos_keeps_the_fields_this_version_does_not_model(
    app_on_cosmos: Harness, deliver_order: Deliverer, sender: RecordingSender,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    app_on_cosmos.reconfigure(outbox_dispatched_ttl_seconds=604800)  # sent entries kept, marked dispatched
    order_id = place(deliver_order)
    [outbox] = partition(app_on_cosmos, order_id, "outbox")
    foreign = {"schemaVersion": 2, "routing": {"region": "eu", "copies": [1, 2]}}
    app_on_cosmos.container.replace_item(outbox["id"], {**outbox, **foreign})
    app_on_cosmos.run(registered_functions["publish_outbox"](change_feed(app_on_cosmos, order_id)))
    [marked] = partition(app_on_cosmos, order_id, "outbox")
    assert (marked["status"], marked["ttl"]) == ("dispatched", 604800)
    assert {k: marked[k] for k in foreign} == foreign


def test_publish_outbox_sends_a_payload_a_newer_version_wrote_as_stored(
    app_on_cosmos: Harness, deliver_order: Deliverer, sender: RecordingSender,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    # A newer version wrote the outcome with a field this version does not model inside its payload: whichever
    # version's publisher sends it, the destination gets it, under the same MessageId.
    order_id = place(deliver_order)
    [outbox] = partition(app_on_cosmos, order_id, "outbox")
    newer = {**outbox, "schemaVersion": 2, "payload": {**outbox["payload"], "channel": "web", "gift": {"wrap": True}}}
    app_on_cosmos.container.replace_item(outbox["id"], newer)
    app_on_cosmos.run(registered_functions["publish_outbox"](change_feed(app_on_cosmos, order_id)))
    [(_, message)] = sender.delivered
    body = json.loads(message.body)
    assert (body["channel"], body["gift"], body["orderId"]) == ("web", {"wrap": True}, order_id)
    assert message.message_id == identity.outbox_message_id("order-projection", order_id)
