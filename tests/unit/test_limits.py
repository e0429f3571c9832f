"""Every write stays inside Cosmos DB's limits, whatever waits: storms of parked copies and out-of-turn events.

The review's cases, each at or past a limit: copies rebuilt with new ids and parked before their order
(a release past 100 operations), a release read from more pages than one, a cancellation that rejects
a storm, an order holding the most parked events one order may. A store that checks the order against
what waits after every batch shows that each batch of a release leaves them agreeing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from idempotent_consumer.delivery import SETTLEMENTS, Action
from idempotent_consumer.errors import TransientStoreError
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.writes import Releases, read_known, waiting
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import (
    MAX_BATCH_OPERATIONS,
    BatchOperation,
    Document,
    Patch,
    check_batch,
    operation_bytes,
)
from idempotent_consumer.records import ParkedStatus
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.aggregate import MAX_PARKED_EVENTS, ORDERS
from shared.domain.aggregate import order as order_state
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import EVENT_KINDS, of_kind
from tests.support.records import recorded as records_of

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

SETTINGS = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)
run = asyncio.run


class AgreeingStore(InMemoryStore):
    """An in-memory store that, after every batch, checks that the order's count, version and state agree with
    what waits for it and what it recorded; and that no batch it is given breaks a limit. It can fail a batch."""

    def __init__(self, *, page_items: int = 100) -> None:
        super().__init__(default_ttl=-1, page_items=page_items)
        self.batches: list[int] = []  # operations per batch
        self.fail_batch: int | None = None  # the number (from 1) of a batch to fail before it is written

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        check_batch(operations)  # the named writes plan inside the limits; the port's own check never refuses
        self.batches.append(len(operations))

        if self.fail_batch == len(self.batches):
            raise TransientStoreError("injected: the batch failed before it was written")
        written = await super().execute_batch(partition_key, operations)
        self.check(partition_key)
        return written

    def check(self, order_id: str) -> None:
        documents = list(self._documents.get(order_id, {}).values())  # read, not copied
        [order] = [d for d in documents if d["type"] in ("order", "order-pending")]
        waiting = [d for d in documents if d["type"] == "parked-event" and d["status"] == "parked"]
        assert order.get("parked", 0) == sum(d.get("counted", True) for d in waiting), "count != what waits"
        if order["type"] == "order":
            recorded = {d["sequence"] for kind in EVENT_KINDS for d in records_of(documents, kind)}
            assert order["version"] == max(recorded | {1}), "version != what was recorded"
            assert not [d for d in waiting if d["sequence"] <= order["version"]] or order["parked"], \
                "a stale event waits while the order says nothing does"


def app_on(store: InMemoryStore) -> bootstrap.App:
    return bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=RecordingSender())


def event(app: bootstrap.App, order_id: str, sequence: int, event_type: str = PAYMENT_CAPTURED,
          event_id: str | None = None) -> Result:
    body = event_body(order_id, sequence, event_type, event_id=event_id)
    return run(app.handle_event(InboundMessage(message_id=body["id"], body=encode_event(body), session_id=order_id)))


def documents(store: InMemoryStore, kind: str, **fields: object) -> list[Document]:
    return [d for d in of_kind(store.documents(), kind) if all(d.get(k) == v for k, v in fields.items())]


def test_ninety_seven_copies_rebuilt_with_new_ids_and_parked_before_their_order_are_released_past_one_batch() -> None:
    # 3 (order, outbox, claim) + 2 (the first copy applied) + 96 stale copies removed = 101 operations.
    store = AgreeingStore()
    app = app_on(store)
    for _ in range(97):
        assert event(app, "ord-1", 2).outcome is Outcome.PARKED
    store.batches.clear()
    result = run(app.handle_order(inbound(order_body("ord-1"))))
    assert result.outcome is Outcome.CREATED
    assert len(store.batches) >= 2 and max(store.batches) <= MAX_BATCH_OPERATIONS
    [order] = documents(store, "order")
    assert (order["version"], order["status"], order["parked"]) == (2, "paid", 0)
    assert len(records_of(store.documents(), "payment")) == 1 and documents(store, "parked-event") == []
    assert len(documents(store, "side-effect", status="completed")) == 1


def test_a_payment_releasing_a_hundred_and_one_parked_shipments_settles_in_one_delivery() -> None:
    store = AgreeingStore()
    app = app_on(store)
    run(app.handle_order(inbound(order_body("ord-1"))))
    for _ in range(101):
        assert event(app, "ord-1", 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    store.batches.clear()
    assert event(app, "ord-1", 2).outcome is Outcome.APPLIED
    assert len(store.batches) >= 2
    [order] = documents(store, "order")
    assert (order["version"], order["status"], order["parked"]) == (3, "shipped", 0)
    assert documents(store, "parked-event") == [] and len(records_of(store.documents(), "shipment")) == 1


def test_a_cancellation_rejects_a_storm_of_parked_shipments_in_batches_and_keeps_them_for_a_while() -> None:
    store = AgreeingStore()
    app = app_on(store)
    run(app.handle_order(inbound(order_body("ord-1"))))
    for _ in range(98):
        event(app, "ord-1", 3, ORDER_SHIPPED)
    store.batches.clear()
    assert event(app, "ord-1", 2, ORDER_CANCELLED).outcome is Outcome.APPLIED
    assert len(store.batches) >= 2
    rejected = documents(store, "parked-event", status=ParkedStatus.REJECTED.value)
    assert len(rejected) == 98 and all(d["ttl"] == SETTINGS.parked_set_aside_ttl_seconds for d in rejected)
    assert "cancelled" in rejected[0]["reason"]
    [order] = documents(store, "order")
    assert (order["version"], order["status"], order["parked"]) == (2, "cancelled", 0)


def test_a_release_read_from_many_pages_finds_the_event_in_turn_behind_a_hundred_out_of_turn_ones() -> None:
    # The review's case: versions 4 to 104 parked out of turn, then 3, then 2. A read of the first page
    # alone misses 3, and the order would say 100 wait while 102 do.
    store = AgreeingStore(page_items=10)
    app = app_on(store)
    run(app.handle_order(inbound(order_body("ord-1"))))
    for sequence in range(4, 105):
        assert event(app, "ord-1", sequence, ORDER_SHIPPED).outcome is Outcome.PARKED
    assert event(app, "ord-1", 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    assert documents(store, "order")[0]["parked"] == 102
    assert event(app, "ord-1", 2).outcome is Outcome.APPLIED
    [order] = documents(store, "order")
    # 3 applies; the order is shipped, from which nothing follows: 4 to 104 can never apply and are rejected.
    assert (order["version"], order["status"], order["parked"]) == (3, "shipped", 0)
    assert len(documents(store, "parked-event", status="rejected")) == 101


def test_an_event_for_a_shipped_order_out_of_its_turn_is_an_invalid_transition_not_parked_for_good() -> None:
    store = AgreeingStore()
    app = app_on(store)
    run(app.handle_order(inbound(order_body("ord-1"))))
    event(app, "ord-1", 2, ORDER_SHIPPED)
    result = event(app, "ord-1", 4, ORDER_CANCELLED)
    assert result.outcome is Outcome.INVALID_TRANSITION and "is shipped" in result.description
    assert documents(store, "parked-event") == []


def test_a_failure_between_the_batches_of_a_release_is_finished_by_the_redelivery() -> None:
    store = AgreeingStore()
    app = app_on(store)
    run(app.handle_order(inbound(order_body("ord-1"))))
    for _ in range(120):
        event(app, "ord-1", 3, ORDER_SHIPPED)
    store.batches.clear()
    store.fail_batch = 3  # the unread try (refused: something waits), the first batch of the release, the next
    assert event(app, "ord-1", 2, event_id="e-2").outcome is Outcome.TRANSIENT
    [marker] = [d for d in documents(store, "inbox") if d["eventId"] == "e-2"]
    assert marker["releasing"] is True
    store.fail_batch = None
    assert event(app, "ord-1", 2, event_id="e-2").outcome is Outcome.DUPLICATE  # the redelivery
    [order] = documents(store, "order")
    assert (order["version"], order["parked"]) == (3, 0) and documents(store, "parked-event") == []


def test_an_order_whose_release_failed_between_batches_finishes_it_on_its_redelivery() -> None:
    store = AgreeingStore()
    app = app_on(store)
    for _ in range(150):
        event(app, "ord-1", 2)
    store.batches.clear()
    store.fail_batch = 3  # the create (refused: a pending order holds the id), the first batch, the next
    message = inbound(order_body("ord-1"), sequence_number=7)
    assert run(app.handle_order(message)).outcome is Outcome.TRANSIENT
    store.fail_batch = None
    assert run(app.handle_order(message)).outcome is Outcome.DUPLICATE  # takes its claim over, finishes both
    [order] = documents(store, "order")
    assert (order["version"], order["parked"]) == (2, 0) and documents(store, "parked-event") == []
    assert len(documents(store, "side-effect", status="completed")) == 1


def test_a_copy_of_a_finished_order_reads_nothing_more_than_its_claim() -> None:
    store = AgreeingStore()
    app = app_on(store)
    run(app.handle_order(inbound(order_body("ord-1"))))
    before = store.requests
    assert run(app.handle_order(inbound(order_body("ord-1"), sequence_number=9))).outcome is Outcome.DUPLICATE
    assert store.requests - before == 2  # the batch refused, the claim read: the floor


def test_an_order_holding_the_most_parked_events_parks_no_more_and_releases_them_all_when_it_comes() -> None:
    store = AgreeingStore()
    app = app_on(store)
    for _ in range(MAX_PARKED_EVENTS):
        assert event(app, "ord-1", 2).outcome is Outcome.PARKED
    past = event(app, "ord-1", 2)
    assert past.outcome is Outcome.LIMIT_EXCEEDED and f"({MAX_PARKED_EVENTS})" in past.description
    assert SETTLEMENTS[past.outcome].action is Action.DEADLETTER
    assert documents(store, "order-pending")[0]["parked"] == MAX_PARKED_EVENTS
    store.batches.clear()
    assert run(app.handle_order(inbound(order_body("ord-1")))).outcome is Outcome.CREATED
    assert len(store.batches) >= MAX_PARKED_EVENTS // MAX_BATCH_OPERATIONS
    [order] = documents(store, "order")
    assert (order["version"], order["parked"]) == (2, 0) and documents(store, "parked-event") == []


def test_a_release_is_split_by_its_bytes_when_they_bind_before_its_operations() -> None:
    store = AgreeingStore()
    app = app_on(store)
    for _ in range(60):
        event(app, "ord-1", 2)  # parked before their order: the order applies one, and 59 are stale
    stored = run(read_known(store, ORDERS, "ord-1"))
    done = order_state("ord-1", "placed", 1, stored.subject.parked).release(run(waiting(store, SETTINGS.consumer_name,
                                                                                 "ord-1")))
    releases = Releases(store, SETTINGS.consumer_name, 60, ORDERS, max_bytes=30_000)  # binds before 100 operations do
    order = stored.document
    assert order is not None
    batches, start = [], 0
    while start < len(done.steps):
        parts, taken = releases.plan(lambda o: Patch("ord-1", dict(o.changes), if_match=order["_etag"]), done, start)
        batches.append(parts)
        start += taken
    assert len(batches) >= 2 and all(len(parts) < MAX_BATCH_OPERATIONS for parts in batches)
    assert all(sum(operation_bytes(op) for _, op in parts) <= 30_000 for parts in batches)
    assert sum(len(parts) - 1 for parts in batches) == len(done.steps)  # a removal a step
