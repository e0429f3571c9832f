"""The order-event handler against the in-memory store: every outcome of issue #3's table."""

from __future__ import annotations

import pytest

from shared.adapters.memory import InMemoryStore
from shared.domain.documents import OrderDocument
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from shared.domain.messages import InboundMessage
from shared.domain.orders import parse_order
from shared.domain.outcomes import Outcome, Result
from shared.errors import BatchTooLarge
from shared.handlers.apply_event import apply_order_event
from shared.handlers.inbox import Inbox
from shared.ports.store import MAX_BATCH_OPERATIONS, Create
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body

SETTINGS = Settings(servicebus_message_ttl_seconds=3600, dlq_resubmit_grace_seconds=0, dedup_ttl_seconds=7200)


def placed(store: InMemoryStore, order_id: str = "ord-1") -> None:
    message = inbound(order_body(order_id))
    order = parse_order(message)
    store.create(OrderDocument.placed(order, message, order.request_hash()).to_document())


def deliver(store: InMemoryStore, body: dict, *, delivery_count: int | None = 0,
            settings: Settings = SETTINGS) -> Result:
    message = InboundMessage(message_id=body["id"], body=encode_event(body), session_id=body["subject"],
                             delivery_count=delivery_count)
    return apply_order_event(message, store, settings)


@pytest.fixture
def store() -> InMemoryStore:
    s = InMemoryStore(default_ttl=-1)
    placed(s)
    return s


def test_event_applies_in_one_batch_with_marker_business_document_and_patch(store: InMemoryStore) -> None:
    before = store.requests
    result = deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2"))
    assert result.outcome is Outcome.APPLIED
    assert store.requests - before == 1
    order = store.read("ord-1", "ord-1")
    assert (order["status"], order["version"], order["payment"]["paymentId"]) == ("paid", 2, "pay-1")
    kinds = sorted(d["type"] for d in store.documents())
    assert kinds == ["inbox", "order", "payment"]
    [marker] = [d for d in store.documents() if d["type"] == "inbox"]
    assert marker["ttl"] == SETTINGS.dedup_ttl_seconds
    assert (marker["eventType"], marker["requestHash"]) == (PAYMENT_CAPTURED, result.request_hash)
    [payment] = [d for d in store.documents() if d["type"] == "payment"]
    assert "ttl" not in payment


def test_redelivered_event_is_a_duplicate(store: InMemoryStore) -> None:
    body = event_body("ord-1", 2, event_id="e-2")
    deliver(store, body)
    assert deliver(store, body, delivery_count=1).outcome is Outcome.DUPLICATE
    assert store.read("ord-1", "ord-1")["version"] == 2


def test_same_event_identity_with_other_content_is_a_payload_mismatch(store: InMemoryStore) -> None:
    deliver(store, event_body("ord-1", 2, event_id="e-2"))
    result = deliver(store, event_body("ord-1", 2, event_id="e-2", amount="1.00"))
    assert result.outcome is Outcome.PAYLOAD_MISMATCH
    assert result.request_hash is not None
    assert "e-2" in result.description and result.request_hash in result.description


def test_event_already_reflected_without_a_marker_is_stale(store: InMemoryStore) -> None:
    deliver(store, event_body("ord-1", 2, event_id="e-2"))
    result = deliver(store, event_body("ord-1", 2, event_id="e-2-resent-under-new-id"))
    assert result.outcome is Outcome.STALE
    assert len([d for d in store.documents() if d["type"] == "payment"]) == 1


def test_event_ahead_of_its_predecessor_is_a_gap_naming_the_missing_version(store: InMemoryStore) -> None:
    result = deliver(store, event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3"))
    assert result.outcome is Outcome.GAP
    assert "missing version 2" in result.description
    assert store.read("ord-1", "ord-1")["version"] == 1


def test_event_for_an_order_not_yet_placed_is_a_gap_missing_version_1() -> None:
    store = InMemoryStore(default_ttl=-1)
    result = deliver(store, event_body("ord-9", 2, event_id="e-2"))
    assert result.outcome is Outcome.GAP
    assert "missing version 1" in result.description


def test_gap_at_the_configured_attempt_is_out_of_order(store: InMemoryStore) -> None:
    body = event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3")
    assert deliver(store, body, delivery_count=3).outcome is Outcome.GAP  # attempt 4
    result = deliver(store, body, delivery_count=4)  # attempt 5
    assert result.outcome is Outcome.OUT_OF_ORDER
    assert "missing version 2" in result.description


def test_without_a_delivery_count_gap_attempts_are_counted_in_the_store(store: InMemoryStore) -> None:
    body = event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3")
    outcomes = [deliver(store, body, delivery_count=None).outcome for _ in range(5)]
    assert outcomes == [Outcome.GAP] * 4 + [Outcome.OUT_OF_ORDER]


@pytest.mark.parametrize(
    ("first", "second"),
    [(ORDER_CANCELLED, ORDER_SHIPPED), (ORDER_CANCELLED, PAYMENT_CAPTURED), (ORDER_SHIPPED, ORDER_CANCELLED),
     (ORDER_SHIPPED, PAYMENT_CAPTURED)],
)
def test_forbidden_transition_is_invalid_transition(store: InMemoryStore, first: str, second: str) -> None:
    assert deliver(store, event_body("ord-1", 2, first)).outcome is Outcome.APPLIED
    result = deliver(store, event_body("ord-1", 3, second))
    assert result.outcome is Outcome.INVALID_TRANSITION
    assert store.read("ord-1", "ord-1")["version"] == 2


def test_capture_then_ship_then_nothing_else(store: InMemoryStore) -> None:
    assert deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED)).outcome is Outcome.APPLIED
    assert deliver(store, event_body("ord-1", 3, ORDER_SHIPPED)).outcome is Outcome.APPLIED
    assert store.read("ord-1", "ord-1")["status"] == "shipped"


def test_invalid_event_names_the_rule(store: InMemoryStore) -> None:
    result = deliver(store, {**event_body("ord-1", 2), "specversion": "2.0"})
    assert result.outcome is Outcome.INVALID
    assert result.description == "Expected `str` matching regex '^1\\\\.0\\\\Z' - at `$.specversion`"


def test_inbox_refuses_a_batch_over_the_limit_before_sending(store: InMemoryStore) -> None:
    inbox = Inbox(store, "audit", 60)
    before = store.requests
    ops = [Create({"id": f"d-{n}", "orderId": "ord-1"}) for n in range(MAX_BATCH_OPERATIONS)]  # + marker = 101
    with pytest.raises(BatchTooLarge):
        inbox.apply(partition_key="ord-1", dedup_key=("s", "e"), request_hash="h", operations=ops)
    assert store.requests == before


def test_markers_of_two_consumers_do_not_collide(store: InMemoryStore) -> None:
    assert Inbox(store, "a", 60).marker_id("s", "e") != Inbox(store, "b", 60).marker_id("s", "e")
