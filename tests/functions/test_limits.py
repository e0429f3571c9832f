"""Storms through the function entry points on the local Cosmos server: every delivery settles for good.

A producer with a retry bug rebuilds its events on every retry, each with a new id, while their order
is held back. The release that follows passes one transactional batch (100 operations) and one query
page (100 documents); each case ends in one settlement per delivery, never an abandon, with the order,
its count and what waits agreeing.
"""

from __future__ import annotations

import uuid

from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from tests.functions.conftest import Deliverer, Harness
from tests.functions.test_process_order_event import docs_of, order, send
from tests.support.events import event_body
from tests.support.orders import encode, order_body
from tests.support.records import recorded


def _new_order_id() -> str:
    return f"ord-{uuid.uuid4()}"


def test_an_order_releasing_ninety_seven_copies_of_its_payment_is_written_and_completed(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    order_id = _new_order_id()
    for _ in range(97):  # 3 + 2 + 96 = 101 operations, past one batch
        assert send(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED))[0] == "complete"
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id)
    assert settlement.action == "complete"
    placed = order(app_on_cosmos, order_id)
    assert (placed["status"], placed["version"], placed["parked"]) == ("paid", 2, 0)
    assert docs_of(app_on_cosmos, order_id, "parked-event") == []
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1
    assert [d["status"] for d in docs_of(app_on_cosmos, order_id, "side-effect")] == ["completed"]
    assert [d["status"] for d in docs_of(app_on_cosmos, order_id, "outbox")] == ["pending"]


def test_a_payment_releasing_a_hundred_and_one_parked_shipments_is_applied_and_completed(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    order_id = _new_order_id()
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    for _ in range(101):
        assert send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED))[0] == "complete"
    assert send(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED))[0] == "complete"
    shipped = order(app_on_cosmos, order_id)
    assert (shipped["status"], shipped["version"], shipped["parked"]) == ("shipped", 3, 0)
    assert docs_of(app_on_cosmos, order_id, "parked-event") == []


def test_events_parked_past_one_page_are_all_read_and_the_one_in_turn_is_applied(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    order_id = _new_order_id()
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    for sequence in range(4, 105):  # out of turn: versions 4 to 104
        assert send(deliver_event, event_body(order_id, sequence, ORDER_CANCELLED))[0] == "complete"
    assert send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED))[0] == "complete"
    assert order(app_on_cosmos, order_id)["parked"] == 102
    assert send(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED))[0] == "complete"
    shipped = order(app_on_cosmos, order_id)
    assert (shipped["status"], shipped["version"], shipped["parked"]) == ("shipped", 3, 0)
    waiting = [d for d in docs_of(app_on_cosmos, order_id, "parked-event") if d["status"] == "parked"]
    assert waiting == []  # 4 to 104 can never follow a shipment: rejected, kept for a while, not waiting for good
    assert len(docs_of(app_on_cosmos, order_id, "parked-event")) == 101


def test_a_cancellation_rejects_ninety_eight_parked_shipments_and_is_completed(
    app_on_cosmos: Harness, deliver_order: Deliverer, deliver_event: Deliverer
) -> None:
    order_id = _new_order_id()
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    for _ in range(98):
        send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED))
    assert send(deliver_event, event_body(order_id, 2, ORDER_CANCELLED))[0] == "complete"
    rejected = docs_of(app_on_cosmos, order_id, "parked-event")
    assert len(rejected) == 98 and {d["status"] for d in rejected} == {"rejected"}
    assert all(d["ttl"] > 0 for d in rejected)
    assert (order(app_on_cosmos, order_id)["status"], order(app_on_cosmos, order_id)["parked"]) == ("cancelled", 0)


def test_a_body_past_256_kb_is_dead_lettered_naming_the_limit(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = _new_order_id()
    body = encode(order_body(order_id, padding="x" * 256 * 1024))
    [settlement] = deliver_order(body, message_id=order_id)
    assert (settlement.action, settlement.reason) == ("deadletter", "LimitExceeded")
    assert settlement.description is not None and "262144" in settlement.description
