"""Delayed retries through the function entry points, with the default retry settings: a blip absorbed inside the
lock; an outage handed on as a copy (sent before the delivery is completed), which is processed once when it comes
back; on real Cosmos and the fulfilment stand-in, the copy sent through the sender port."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from devservers.faultproxy import FaultProxy
from devservers.fulfilment import FulfilmentServer
from devservers.servicebus import Broker, start_broker
from idempotent_consumer import identity, retries
from idempotent_consumer.adapters.servicebus import ServiceBusSender, make_client
from idempotent_consumer.delivery import Action, Retries, Settlement, run_delivery
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.sender import OutgoingMessage
from idempotent_consumer.retries import Backoff
from idempotent_consumer.testing.memory import RecordingSender
from shared.domain.lifecycle import PAYMENT_CAPTURED
from shared.settings import Settings
from tests.functions.conftest import Deliverer, Harness
from tests.sbctl.queues import config, queue
from tests.support.events import encode_event, event_body
from tests.support.orders import encode, order_body
from tests.support.records import recorded

DOCS = r"/docs/?$"
STANDARD = 256 * 1024
COPY_MARGIN = 2048  # a body this far below 256 KB still fits its copy: the retry properties, and the 1 KB the
# sender keeps for a batch's envelope (1,533 bytes measured with a 128-character MessageId)


@pytest.fixture
def sender(app_on_cosmos: Harness) -> Iterator[RecordingSender]:
    """The app with the default retries (three tries in the lock, then handed on), its copies recorded."""
    recording = RecordingSender()
    app_on_cosmos.reconfigure(sender=recording, delayed_retries=True, retry_in_lock_attempts=3)
    yield recording


def deliver_copy(deliver: Deliverer, copy: OutgoingMessage, sequence_number: int) -> str:
    """Deliver a copy the app handed on, as its queue would once it is due; the settlement's action."""
    [settlement] = deliver(copy.body, message_id=copy.message_id, session_id=copy.session_id,
                           application_properties=dict(copy.application_properties), sequence_number=sequence_number)
    return settlement.action


def of_type(target: Harness, order_id: str, kind: str) -> list[dict]:
    return list(target.container.query_items("SELECT * FROM c WHERE c.type = @t", partition_key=order_id,
                                             parameters=[{"name": "@t", "value": kind}]))


def test_a_blip_is_absorbed_inside_the_lock(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    fulfilment.fail_next(503, count=2)
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    key = identity.effect_key("order-projection", "reserve-stock", order_id)
    assert [c.status for c in fulfilment.calls(key)] == [503, 503, 201]
    assert sender.sent == []


def test_an_outage_hands_the_order_on_and_its_copy_reserves_once_when_it_comes_back(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    fulfilment.fail_next(503, count=3)
    before = datetime.now(UTC)
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=501)
    assert settlement.action == "complete"  # handed on: the copy was sent first
    [(queue, copy)] = sender.sent
    assert queue == "orders" and copy.message_id == identity.retry_message_id(order_id, "501", 1)
    assert copy.scheduled_enqueue_time is not None and copy.scheduled_enqueue_time > before
    assert copy.application_properties[retries.ORIGINAL] == order_id
    assert of_type(app_on_cosmos, order_id, "outbox") == []  # nothing announced while the stock is not reserved
    assert deliver_copy(deliver_order, copy, sequence_number=777) == "complete"
    key = identity.effect_key("order-projection", "reserve-stock", order_id)
    assert [c.status for c in fulfilment.calls(key)] == [503, 503, 503, 201]
    [entry] = of_type(app_on_cosmos, order_id, "outbox")
    assert entry["subject"] == "OrderAccepted"
    assert len(sender.sent) == 1


def test_an_event_meeting_a_cosmos_outage_is_handed_on_in_its_session_and_applied_once_from_its_copy(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer, cosmos_proxy: FaultProxy,
    sender: RecordingSender,
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    body = event_body(order_id, 2, PAYMENT_CAPTURED)
    cosmos_proxy.fail("POST", DOCS, 503, count=None)
    [settlement] = deliver_event(encode_event(body), message_id=body["id"], session_id=order_id, sequence_number=9)
    assert settlement.action == "complete"
    [(queue, copy)] = sender.sent
    assert (queue, copy.session_id) == ("order-events", order_id)
    cosmos_proxy.clear()
    assert deliver_copy(deliver_event, copy, sequence_number=40) == "complete"
    order = app_on_cosmos.container.read_item(order_id, partition_key=order_id)
    assert (order["status"], order["version"]) == ("paid", 2)
    assert len(recorded(of_type(app_on_cosmos, order_id, "order"), "payment")) == 1


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with start_broker(config(queue("orders"))) as running:
        yield running


def transient_delivery(broker: Broker, loop: asyncio.Runner, body: bytes) -> tuple[Settlement, Result]:
    """One delivery of an order of ``body`` that fails transiently, handed on through the real sender."""
    sender = ServiceBusSender(make_client(Settings(servicebus_connection=broker.connection_string)))
    settled: list[tuple[Settlement, Result]] = []

    class Port:
        async def settle(self, settlement: Settlement, result: Result) -> None:
            settled.append((settlement, result))

        async def renew_session_lock(self) -> None:
            return None

    async def handler(message: InboundMessage) -> Result:
        return Result(Outcome.TRANSIENT, "reserve-stock: HTTP 503")

    message = InboundMessage(message_id="ord-" + "7" * 124, body=body, sequence_number=12_345_678,
                             application_properties={"tenant": "eu"})
    retrying = Retries(attempts=1, backoff=Backoff(10, 900, 14400), queue="orders", sender=lambda: sender)
    try:
        loop.run(run_delivery("process_order", lambda: message, handler, Port(), retrying=retrying,
                              record=lambda *_: None))
    finally:
        loop.run(sender.close())
    [outcome] = settled
    return outcome


def test_a_message_too_near_the_size_limit_for_its_copy_is_abandoned_not_completed(
    broker: Broker, loop: asyncio.Runner
) -> None:
    # A copy carries the retry properties besides the message's own, and the sender keeps 1 KB for the envelope:
    # a message that filled Service Bus Standard's 256 KB cannot be handed on. Its delivery abandons, as with
    # DELAYED_RETRIES false, and the message stays in its queue; nothing is completed without its copy.
    fits = transient_delivery(broker, loop, b"x" * (STANDARD - COPY_MARGIN))
    assert (fits[0].action, fits[1].outcome) == (Action.COMPLETE, Outcome.HANDED_ON)
    too_large = transient_delivery(broker, loop, b"x" * (STANDARD - 300))
    assert too_large[0].action is Action.ABANDON
    assert "handing on failed: PublishError" in too_large[1].description
