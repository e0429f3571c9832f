"""One key, one meaning, through the function entry points (issue 40, part 1): an event's identity is its
``source`` and ``id`` across every order, as CloudEvents defines it, so the same key with other content under
another subject is a mismatch, never a new event for that order; an order's key is its MessageId = orderId,
which is also its partition, so its identity holds by construction."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from idempotent_consumer import identity
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.records import EventIdentity
from shared.domain.lifecycle import ORDER_SHIPPED, PAYMENT_CAPTURED, parse_event
from tests.functions.conftest import Deliverer, Harness
from tests.support.events import encode_event, event_body
from tests.support.orders import encode, order_body
from tests.support.records import recorded

CONSUMER = "order-projection"


def place(deliver_order: Deliverer) -> str:
    order_id = f"ord-{uuid.uuid4()}"
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    return order_id


def send(deliver: Deliverer, body: dict) -> tuple[str, str | None, str]:
    [settlement] = deliver(encode_event(body), message_id=body["id"], session_id=body["subject"])
    return settlement.action, settlement.reason, settlement.description or ""


def order(target: Harness, order_id: str) -> dict:
    return target.container.read_item(order_id, partition_key=order_id)


def of_type(target: Harness, order_id: str, kind: str) -> list[dict]:
    return list(target.container.query_items("SELECT * FROM c WHERE c.type = @t", partition_key=order_id,
                                             parameters=[{"name": "@t", "value": kind}]))


def for_order(body: dict, order_id: str) -> dict:
    """The same event id and source, sent for another order, its content changed accordingly."""
    return {**body, "subject": order_id, "data": {**body["data"], "amount": "1.00"}}


def test_an_event_id_reused_under_another_subject_is_a_mismatch_naming_both_and_the_other_order_is_untouched(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    first, second = place(deliver_order), place(deliver_order)
    payment = event_body(first, 2, PAYMENT_CAPTURED)
    assert send(deliver_event, payment)[0] == "complete"
    action, reason, description = send(deliver_event, for_order(payment, second))
    assert (action, reason) == ("deadletter", "PayloadMismatch")
    assert f"for subject {first}" in description and f"for subject {second}" in description
    assert (order(app_on_cosmos, second)["status"], order(app_on_cosmos, second)["version"]) == ("placed", 1)
    assert recorded(of_type(app_on_cosmos, second, "order"), "payment") == []
    assert of_type(app_on_cosmos, second, "inbox") == []
    assert order(app_on_cosmos, first)["version"] == 2


def test_a_redelivery_after_a_crash_between_taking_the_identity_and_applying_applies_it(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    order_id = place(deliver_order)
    payment = event_body(order_id, 2, PAYMENT_CAPTURED)
    event = parse_event(InboundMessage(message_id=payment["id"], body=encode_event(payment)))
    # What a delivery that crashed after its first write left: the identity taken, nothing of the event written.
    app_on_cosmos.container.create_item(EventIdentity.of(event, CONSUMER, event.request_hash(), 3600).to_document())
    assert send(deliver_event, payment)[:2] == ("complete", None)
    assert (order(app_on_cosmos, order_id)["status"], order(app_on_cosmos, order_id)["version"]) == ("paid", 2)
    assert send(deliver_event, payment)[0] == "complete"  # and a copy after it is a duplicate
    assert len(recorded(of_type(app_on_cosmos, order_id, "order"), "payment")) == 1


def test_two_deliveries_of_one_key_for_two_orders_at_once_apply_one_and_dead_letter_the_other(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer, loop: asyncio.Runner
) -> None:
    first, second = place(deliver_order), place(deliver_order)
    payment = event_body(first, 2, PAYMENT_CAPTURED)
    other = for_order(payment, second)
    messages = [deliver_event.message(encode_event(b), message_id=b["id"], session_id=b["subject"])
                for b in (payment, other)]
    actions = deliver_event.host.message_actions()

    async def both() -> None:
        await asyncio.gather(*(deliver_event.function(m, actions) for m in messages))

    loop.run(both())
    outcomes = sorted((s.action, s.reason) for m in messages for s in deliver_event.settlements(m))
    assert outcomes == [("complete", None), ("deadletter", "PayloadMismatch")]
    assert sorted(order(app_on_cosmos, o)["version"] for o in (first, second)) == [1, 2]


def test_one_id_from_two_sources_is_two_events(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    # CloudEvents: an id is unique within its source. Past the queue's detection window (which keys on the
    # MessageId alone), a shipment from the warehouse under the id of a payment from the payment system applies.
    order_id = place(deliver_order)
    event_id = f"evt-{uuid.uuid4()}"
    assert send(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED, event_id=event_id, source="/payments"))[0] \
        == "complete"
    assert send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED, event_id=event_id, source="/warehouse"))[:2] \
        == ("complete", None)
    assert (order(app_on_cosmos, order_id)["status"], order(app_on_cosmos, order_id)["version"]) == ("shipped", 3)


def test_an_orders_key_is_its_message_id_and_its_partition_so_its_identity_holds_by_construction(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    # The key is MessageId = orderId, and the order's partition is that id: the create that checks the key is in
    # the one partition every copy of the key writes to, so no copy can land in another.
    order_id = place(deliver_order)
    stored = order(app_on_cosmos, order_id)
    assert stored["id"] == stored["orderId"] == stored["messageId"] == order_id
    other = f"ord-{uuid.uuid4()}"
    [settlement] = deliver_order(encode(order_body(other)), message_id=order_id)  # the key, another order's body
    assert (settlement.action, settlement.reason) == ("deadletter", "InvalidMessage")
    [settlement] = deliver_order(encode(order_body(order_id, customerId="cust-7")), message_id=order_id)
    assert (settlement.action, settlement.reason) == ("deadletter", "PayloadMismatch")


@pytest.mark.parametrize(("source", "event_id"), [("/orders", "e-1"), ("urn:x/ü", "a/b?c#d")])
def test_an_event_identity_record_is_in_a_partition_of_its_own(source: str, event_id: str) -> None:
    doc_id = identity.event_identity_id(CONSUMER, source, event_id)
    assert len(doc_id) <= 128 and doc_id.startswith(f"event.{CONSUMER}.")
