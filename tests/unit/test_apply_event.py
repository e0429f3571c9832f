"""The order-event handler against the in-memory store: every outcome of issue #3's table."""

from __future__ import annotations

import asyncio

import pytest

from idempotent_consumer import identity
from idempotent_consumer.errors import LimitExceeded
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.operator import drop
from idempotent_consumer.ordered.writes import write_once
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import MAX_BATCH_OPERATIONS, Create, Delete, Replace
from idempotent_consumer.records import InboxMarker
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.aggregate import ORDERS
from shared.domain.documents import OrderDocument
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from shared.domain.orders import parse_order
from shared.handlers.apply_event import apply_order_event
from shared.handlers.place_order import OrderServices
from shared.handlers.place_order import place_order as place
from shared.settings import Settings
from tests.support.events import SOURCE, encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import recorded

SETTINGS = Settings(servicebus_message_ttl_seconds=3600, dlq_resubmit_grace_seconds=0, dedup_ttl_seconds=7200,
                    fulfillment_url="http://fulfilment.invalid")
SET_ASIDE = SETTINGS.parked_set_aside_ttl_seconds
run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


def placed(store: InMemoryStore, order_id: str = "ord-1") -> None:
    message = inbound(order_body(order_id))
    order = parse_order(message)
    run(store.create(OrderDocument.placed(order, message, order.request_hash()).to_document()))


def deliver(store: InMemoryStore, body: dict, *, delivery_count: int | None = 0,
            settings: Settings = SETTINGS) -> Result:
    message = InboundMessage(message_id=body["id"], body=encode_event(body), session_id=body["subject"],
                             delivery_count=delivery_count)
    return run(apply_order_event(message, store, settings))


@pytest.fixture
def store() -> InMemoryStore:
    s = InMemoryStore(default_ttl=-1)
    placed(s)
    return s


def test_event_takes_its_identity_then_applies_in_one_batch_with_marker_business_document_and_patch(
    store: InMemoryStore,
) -> None:
    before = store.requests
    result = deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2"))
    assert result.outcome is Outcome.APPLIED
    assert store.requests - before == 2  # the identity's create, in its own partition; then the order's batch
    order = run(store.read("ord-1", "ord-1"))
    assert (order["status"], order["version"], order["payment"]["paymentId"]) == ("paid", 2, "pay-1")
    kinds = sorted(d["type"] for d in store.documents())
    assert kinds == ["event-identity", "inbox", "order"]  # the payment's sub-object on the order is its record
    [record] = [d for d in store.documents() if d["type"] == "event-identity"]
    assert record["orderId"] == record["id"] and record["subject"] == "ord-1"
    [marker] = [d for d in store.documents() if d["type"] == "inbox"]
    assert marker["ttl"] == SETTINGS.dedup_ttl_seconds
    assert (marker["eventType"], marker["requestHash"]) == (PAYMENT_CAPTURED, result.request_hash)
    payment = order["payment"]
    assert (payment["eventId"], payment["eventSource"], payment["sequence"]) == ("e-2", SOURCE, 2)
    assert payment["eventTime"] == order["updatedAt"]


def test_redelivered_event_is_a_duplicate(store: InMemoryStore) -> None:
    body = event_body("ord-1", 2, event_id="e-2")
    deliver(store, body)
    assert deliver(store, body, delivery_count=1).outcome is Outcome.DUPLICATE
    assert run(store.read("ord-1", "ord-1"))["version"] == 2


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
    [payment] = recorded(store.documents(), "payment")
    assert payment["eventId"] == "e-2"


def of_type(store: InMemoryStore, doc_type: str) -> list[dict]:
    return [d for d in store.documents() if d["type"] == doc_type]


def test_event_ahead_of_its_predecessor_is_parked_and_its_message_completed(store: InMemoryStore) -> None:
    result = deliver(store, event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3"))
    assert result.outcome is Outcome.PARKED
    assert "waits for version 2" in result.description
    order = run(store.read("ord-1", "ord-1"))
    assert (order["version"], order["parked"]) == (1, 1)
    [parked] = of_type(store, "parked-event")
    assert (parked["sequence"], parked["status"], parked["eventId"]) == (3, "parked", "e-3")
    assert len(of_type(store, "inbox")) == 1 and recorded(store.documents(), "shipment") == []


def test_predecessor_releases_the_parked_successor_in_its_own_batch(store: InMemoryStore) -> None:
    deliver(store, event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3"))
    batches = store.requests
    result = deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2"))
    assert result.outcome is Outcome.APPLIED
    assert "released versions [3]" in result.description
    # its identity; the conditional patch fails (something is parked), then: read the order, what is parked, one batch
    assert store.requests - batches == 5
    order = run(store.read("ord-1", "ord-1"))
    assert (order["version"], order["status"], order["parked"]) == (3, "shipped", 0)
    assert len(recorded(store.documents(), "payment")) == len(recorded(store.documents(), "shipment")) == 1
    assert of_type(store, "parked-event") == []


def test_a_chain_of_parked_events_is_released_in_version_order(store: InMemoryStore) -> None:
    assert deliver(store, event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3")).outcome is Outcome.PARKED
    assert deliver(store, event_body("ord-1", 4, ORDER_CANCELLED, event_id="e-4")).outcome is Outcome.PARKED
    assert run(store.read("ord-1", "ord-1"))["parked"] == 2
    deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2"))
    order = run(store.read("ord-1", "ord-1"))
    # shipped, then a cancellation that the shipped state forbids: rejected, kept with its reason
    assert (order["version"], order["status"], order["parked"]) == (3, "shipped", 0)
    [rejected] = of_type(store, "parked-event")
    assert (rejected["sequence"], rejected["status"]) == (4, "rejected")
    assert "may follow only placed, paid" in rejected["reason"]


def test_a_parked_event_redelivered_is_a_duplicate_and_with_other_content_a_mismatch(store: InMemoryStore) -> None:
    body = event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3")
    deliver(store, body)
    assert deliver(store, body).outcome is Outcome.DUPLICATE
    other = event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3", trackingNumber="OTHER")
    assert deliver(store, other).outcome is Outcome.PAYLOAD_MISMATCH
    assert run(store.read("ord-1", "ord-1"))["parked"] == 1


def test_an_event_before_its_order_waits_on_a_pending_order_that_the_order_replaces() -> None:
    store = InMemoryStore(default_ttl=-1)
    result = deliver(store, event_body("ord-9", 2, PAYMENT_CAPTURED, event_id="e-2"))
    assert result.outcome is Outcome.PARKED
    assert "waits for version 1" in result.description
    pending = run(store.read("ord-9", "ord-9"))
    assert (pending["type"], pending["version"], pending["parked"]) == ("order-pending", 0, 1)
    placed = run(place(inbound(order_body("ord-9")), OrderServices(store, InMemoryFulfilment(), SETTINGS)))
    assert placed.outcome is Outcome.CREATED
    order = run(store.read("ord-9", "ord-9"))
    assert (order["type"], order["version"], order["status"], order["parked"]) == ("order", 2, "paid", 0)
    assert len(recorded(store.documents(), "payment")) == len(of_type(store, "outbox")) == 1
    assert of_type(store, "parked-event") == []


def test_two_parked_events_for_one_version_apply_once_and_the_other_is_removed_as_stale(
    store: InMemoryStore,
) -> None:
    deliver(store, event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3a"))
    deliver(store, event_body("ord-1", 3, ORDER_CANCELLED, event_id="e-3b"))
    result = deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2"))
    assert "released versions [3]" in result.description and "was stale and is removed" in result.description
    order = run(store.read("ord-1", "ord-1"))
    assert (order["version"], order["status"], order["parked"]) == (3, "shipped", 0)
    assert of_type(store, "parked-event") == [] and recorded(store.documents(), "cancellation") == []


@pytest.mark.parametrize(
    ("first", "second"),
    [(ORDER_CANCELLED, ORDER_SHIPPED), (ORDER_CANCELLED, PAYMENT_CAPTURED), (ORDER_SHIPPED, ORDER_CANCELLED),
     (ORDER_SHIPPED, PAYMENT_CAPTURED)],
)
def test_forbidden_transition_is_invalid_transition(store: InMemoryStore, first: str, second: str) -> None:
    assert deliver(store, event_body("ord-1", 2, first)).outcome is Outcome.APPLIED
    result = deliver(store, event_body("ord-1", 3, second))
    assert result.outcome is Outcome.INVALID_TRANSITION
    assert run(store.read("ord-1", "ord-1"))["version"] == 2


def test_capture_then_ship_then_nothing_else(store: InMemoryStore) -> None:
    assert deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED)).outcome is Outcome.APPLIED
    assert deliver(store, event_body("ord-1", 3, ORDER_SHIPPED)).outcome is Outcome.APPLIED
    assert run(store.read("ord-1", "ord-1"))["status"] == "shipped"


def test_invalid_event_names_the_rule(store: InMemoryStore) -> None:
    result = deliver(store, {**event_body("ord-1", 2), "specversion": "2.0"})
    assert result.outcome is Outcome.INVALID
    assert result.description == "Expected `str` matching regex '^1\\\\.0\\\\Z' - at `$.specversion`"


def test_a_write_behind_its_marker_is_refused_over_the_limit_before_sending(store: InMemoryStore) -> None:
    marker = InboxMarker(id=identity.inbox_marker_id("audit", "s", "e"), partition="ord-1", consumer="audit",
                         request_hash="h", ttl=60)
    before = store.requests
    parts = [("audit", Create({"id": f"d-{n}", "orderId": "ord-1"})) for n in range(MAX_BATCH_OPERATIONS)]  # + 1
    with pytest.raises(LimitExceeded) as refused:
        run(write_once(store, marker, list(parts), noun="order"))
    assert store.requests == before and "100 operations" in refused.value.limit


def test_markers_of_two_consumers_do_not_collide() -> None:
    assert identity.inbox_marker_id("a", "s", "e") != identity.inbox_marker_id("b", "s", "e")


def add_foreign(store: InMemoryStore, doc_id: str, **fields: object) -> None:
    current = run(store.read(doc_id, "ord-1"))
    run(store.execute_batch("ord-1", [Replace({**current, **fields}, current["_etag"])]))


def test_parking_and_releasing_keep_the_fields_another_writer_put_on_the_order(store: InMemoryStore) -> None:
    add_foreign(store, "ord-1", enrichment={"segment": "gold"})
    assert deliver(store, event_body("ord-1", 3, ORDER_SHIPPED)).outcome is Outcome.PARKED
    assert run(store.read("ord-1", "ord-1"))["enrichment"] == {"segment": "gold"}
    assert deliver(store, event_body("ord-1", 2)).outcome is Outcome.APPLIED  # releases version 3
    order = run(store.read("ord-1", "ord-1"))
    assert (order["version"], order["enrichment"]) == (3, {"segment": "gold"})


def test_an_order_taking_a_pending_orders_place_keeps_the_pending_orders_other_fields() -> None:
    store = InMemoryStore(default_ttl=-1)
    assert deliver(store, event_body("ord-1", 2)).outcome is Outcome.PARKED
    add_foreign(store, "ord-1", note="from the next version")
    placed_now = run(place(inbound(order_body("ord-1")), OrderServices(store, InMemoryFulfilment(), SETTINGS)))
    assert placed_now.outcome is Outcome.CREATED
    order = run(store.read("ord-1", "ord-1"))
    assert (order["type"], order["version"], order["note"]) == ("order", 2, "from the next version")


def test_an_operators_drop_leaves_a_document_of_another_kind_at_the_orders_id_alone() -> None:
    store = InMemoryStore(default_ttl=-1)
    assert deliver(store, event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-3")).outcome is Outcome.PARKED
    pending = run(store.read("ord-1", "ord-1"))
    run(store.execute_batch("ord-1", [Replace({"id": "ord-1", "orderId": "ord-1", "type": "someone-else", "x": 1},
                                              pending["_etag"])]))
    run(drop(store, ORDERS, SETTINGS.consumer_name, "ord-1", "e-3", set_aside_ttl=SET_ASIDE))
    foreign = run(store.read("ord-1", "ord-1"))
    assert {k: v for k, v in foreign.items() if not k.startswith("_")} == {
        "id": "ord-1", "orderId": "ord-1", "type": "someone-else", "x": 1}


def test_a_parked_event_sent_again_after_its_marker_expired_is_a_duplicate_not_a_retry_loop() -> None:
    store = InMemoryStore(default_ttl=-1)
    placed(store)
    body = event_body("ord-1", 3, ORDER_SHIPPED)
    assert deliver(store, body).outcome is Outcome.PARKED
    [marker] = [d for d in store.documents() if d["type"] == "inbox"]
    run(store.execute_batch("ord-1", [Delete(marker["id"], None)]))  # as its ttl would
    before = store.requests
    assert deliver(store, body).outcome is Outcome.DUPLICATE
    # its identity found and read (the same content), happy path, read the order, park (its copy is there), read
    # that copy
    assert store.requests - before <= 6
    other = {**body, "data": {**body["data"], "carrier": "UPS"}}  # still no marker: the duplicate wrote none
    assert deliver(store, other).outcome is Outcome.PAYLOAD_MISMATCH


def test_a_stale_parked_event_that_no_longer_decodes_is_removed_without_reading_it(store: InMemoryStore) -> None:
    assert deliver(store, event_body("ord-1", 3, ORDER_SHIPPED)).outcome is Outcome.PARKED
    [parked] = [d for d in store.documents() if d["type"] == "parked-event"]
    run(store.execute_batch("ord-1", [Replace({**parked, "sequence": 2, "event": {"not": "an event"}},
                                              parked["_etag"])]))
    assert deliver(store, event_body("ord-1", 2)).outcome is Outcome.APPLIED  # version 2 takes its version
    assert [d for d in store.documents() if d["type"] == "parked-event"] == []


def test_a_copy_with_other_content_of_an_event_the_release_before_applied_gives_the_identity_back() -> None:
    store = InMemoryStore(default_ttl=-1)
    placed(store)
    body = event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-7")
    assert deliver(store, body).outcome is Outcome.APPLIED
    [identity_record] = [d for d in store.documents() if d["type"] == "event-identity"]
    run(store.execute_batch(identity_record["orderId"], [Delete(identity_record["id"], identity_record["_etag"])]))
    # As the release before left it: a marker, no identity. A copy with other content takes the identity first.
    other = {**body, "data": {**body["data"], "amount": "1.00"}}
    assert deliver(store, other).outcome is Outcome.PAYLOAD_MISMATCH
    assert [d for d in store.documents() if d["type"] == "event-identity"] == []  # given back
    assert deliver(store, body).outcome is Outcome.DUPLICATE  # the content applied keeps its key


def test_an_event_identity_outlives_its_marker_by_a_redelivery_and_a_delayed_retry(store: InMemoryStore) -> None:
    assert deliver(store, event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-8")).outcome is Outcome.APPLIED
    by_type = {d["type"]: d for d in store.documents()}
    settings = Settings()
    assert by_type["event-identity"]["ttl"] == by_type["inbox"]["ttl"] + settings.servicebus_lock_duration_seconds \
        * settings.servicebus_max_delivery_count + settings.retry_total_seconds
