"""A retry chain never acts against the order's current state, through the function entry points (issue 40, part
2): no reservation is made, and no outcome announced, for an order closed (cancelled, shipped) before it."""

from __future__ import annotations

import uuid

from devservers.fulfilment import FulfilmentServer
from idempotent_consumer.testing.memory import RecordingSender
from shared.adapters.reservations import SOLD_OUT_PREFIX
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from tests.functions.conftest import Deliverer, Harness, reservation_calls
from tests.support.events import encode_event, event_body
from tests.support.orders import encode, order_body


def of_type(target: Harness, order_id: str, kind: str) -> list[dict]:
    return list(target.container.query_items("SELECT * FROM c WHERE c.type = @t", partition_key=order_id,
                                             parameters=[{"name": "@t", "value": kind}]))


def send_event(deliver: Deliverer, body: dict) -> str:
    [settlement] = deliver(encode_event(body), message_id=body["id"], session_id=body["subject"])
    return settlement.action


def test_an_order_cancelled_while_its_copy_waits_out_an_outage_is_neither_reserved_nor_announced(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer, fulfilment: FulfilmentServer,
    handing_on: RecordingSender,
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    fulfilment.fail_next(503, count=1)  # the service is down: the order and its claim are written, then handed on
    assert deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=301)[0].action == \
        "complete"
    [(_, copy)] = handing_on.sent
    assert send_event(deliver_event, event_body(order_id, 2, ORDER_CANCELLED)) == "complete"  # v2, applied
    # The service is back; the copy comes due.
    [settlement] = deliver_order(copy.body, message_id=copy.message_id, sequence_number=340,
                                 application_properties=dict(copy.application_properties))
    assert settlement.action == "complete"
    assert reservation_calls(fulfilment, order_id) == [503]  # no reservation for a cancelled order
    assert of_type(app_on_cosmos, order_id, "outbox") == []  # and no OrderAccepted for it
    [record] = of_type(app_on_cosmos, order_id, "side-effect")
    assert (record["status"], record["refusal"], record["announces"]) == ("rejected", "order-cancelled", False)
    # A later copy finds it closed: still no call.
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=350)
    assert settlement.action == "complete" and reservation_calls(fulfilment, order_id) == [503]


def test_an_order_its_released_events_shipped_at_intake_whose_reservation_is_refused_is_never_announced_rejected(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer, fulfilment: FulfilmentServer,
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    assert send_event(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED)) == "complete"  # parked
    assert send_event(deliver_event, event_body(order_id, 3, ORDER_SHIPPED)) == "complete"  # parked
    body = order_body(order_id)
    body["items"][0]["sku"] = SOLD_OUT_PREFIX + body["items"][0]["sku"]  # the service refuses it
    [settlement] = deliver_order(encode(body), message_id=order_id)
    assert settlement.action == "complete"
    order = app_on_cosmos.container.read_item(order_id, partition_key=order_id)
    assert (order["status"], order["version"]) == ("shipped", 3) and "rejection" not in order
    assert reservation_calls(fulfilment, order_id) == [422]  # a shipped order's stock may be reserved: refused
    assert of_type(app_on_cosmos, order_id, "outbox") == []  # and no OrderRejected for a shipped order
    [record] = of_type(app_on_cosmos, order_id, "side-effect")
    assert (record["status"], record["announces"]) == ("rejected", False)
    assert "not announced" in record["reason"]


def test_a_shipped_orders_stock_is_reserved_and_it_is_announced_accepted(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer, fulfilment: FulfilmentServer,
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    assert send_event(deliver_event, event_body(order_id, 2, ORDER_SHIPPED)) == "complete"  # cash on delivery
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    assert reservation_calls(fulfilment, order_id) == [201]
    [entry] = of_type(app_on_cosmos, order_id, "outbox")
    assert entry["subject"] == "OrderAccepted"


def test_an_open_orders_reservation_writes_it_on_the_order_with_its_outcome(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer,
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    order = app_on_cosmos.container.read_item(order_id, partition_key=order_id)
    assert order["reservation"]["reference"] and order["reservation"]["reservedAt"]
    [entry] = of_type(app_on_cosmos, order_id, "outbox")
    assert entry["subject"] == "OrderAccepted"
