"""Every path through the entry points keeps the fields this version does not model, on every kind it rewrites.

A newer version (or another writer) may add fields to any document: top level and nested. Each test
puts such fields on the documents a path will rewrite, runs the path through the app that
``bootstrap.build`` makes (or the operator's commands), and finds them all still there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.operator import drop, force_release
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import Patch
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.aggregate import ORDERS
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import of_kind, replaced

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

SETTINGS = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)
SET_ASIDE = SETTINGS.parked_set_aside_ttl_seconds
FOREIGN = {"loyalty": {"tier": "gold", "history": [{"at": "2026-11-01", "points": 10}]}, "channel": "app"}
run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


class Fulfilment(InMemoryFulfilment):
    """The in-memory service, answering the next calls with chosen statuses first (then the reservation rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[int] = []

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        if self.answers:
            self.calls.append(idempotency_key)
            return Reply(self.answers.pop(0))
        return await super().reserve(idempotency_key, request)


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore(default_ttl=-1)


@pytest.fixture
def fulfilment() -> Fulfilment:
    return Fulfilment()


@pytest.fixture
def app(store: InMemoryStore, fulfilment: Fulfilment) -> bootstrap.App:
    return bootstrap.build(SETTINGS, store=store, fulfilment=fulfilment, sender=RecordingSender())


def of_type(store: InMemoryStore, doc_type: str) -> list[dict[str, Any]]:
    return of_kind(store.documents(), doc_type)


def add_foreign(store: InMemoryStore, *doc_types: str) -> None:
    """Put the foreign fields on every document of these kinds, as another writer would (whole, unconditional)."""
    run(adding_foreign(store, *doc_types))


async def adding_foreign(store: InMemoryStore, *doc_types: str) -> None:
    for document in (d for t in doc_types for d in of_type(store, t)):
        await replaced(store, {**document, **FOREIGN})


def assert_kept(store: InMemoryStore, *doc_types: str) -> None:
    for doc_type in doc_types:
        documents = of_type(store, doc_type)
        assert documents, f"no {doc_type} document"
        for document in documents:
            assert {k: document.get(k) for k in FOREIGN} == FOREIGN, (doc_type, document)


def place(app: bootstrap.App, order_id: str = "ord-1", sequence: int = 1) -> Result:
    return run(app.handle_order(inbound(order_body(order_id), sequence_number=sequence)))


def event(app: bootstrap.App, sequence: int, event_type: str = PAYMENT_CAPTURED, order_id: str = "ord-1") -> Result:
    body = event_body(order_id, sequence, event_type, event_id=f"e-{sequence}")
    return run(app.handle_event(InboundMessage(message_id=body["id"], body=encode_event(body), session_id=order_id)))


def test_an_event_applied_by_its_patch_keeps_the_orders_foreign_fields(app: bootstrap.App,
                                                                       store: InMemoryStore) -> None:
    place(app)
    add_foreign(store, "order")
    assert event(app, 2).outcome is Outcome.APPLIED
    assert_kept(store, "order")


def test_parking_an_early_event_and_releasing_it_keep_the_orders_foreign_fields(app: bootstrap.App,
                                                                                store: InMemoryStore) -> None:
    place(app)
    add_foreign(store, "order")
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    assert_kept(store, "order")
    assert event(app, 2).outcome is Outcome.APPLIED  # releases version 3
    assert_kept(store, "order")
    assert run(store.read("ord-1", "ord-1"))["version"] == 3


def test_an_order_taking_a_pending_orders_place_keeps_the_pending_orders_foreign_fields(
    app: bootstrap.App, store: InMemoryStore,
) -> None:
    assert event(app, 2).outcome is Outcome.PARKED
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED  # a patch of the pending order's count
    add_foreign(store, "order-pending")
    assert event(app, 4, ORDER_CANCELLED).outcome is Outcome.PARKED
    assert_kept(store, "order-pending")
    assert place(app).outcome is Outcome.CREATED
    assert_kept(store, "order")
    assert run(store.read("ord-1", "ord-1"))["version"] == 3


def test_a_released_event_that_the_order_forbids_is_rejected_and_keeps_its_foreign_fields(
    app: bootstrap.App, store: InMemoryStore,
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    assert event(app, 4, ORDER_CANCELLED).outcome is Outcome.PARKED
    add_foreign(store, "parked-event")
    event(app, 2)  # releases 3 (shipped), and 4 (a cancellation after shipping) is rejected
    [rejected] = of_type(store, "parked-event")
    assert rejected["status"] == "rejected"
    assert_kept(store, "parked-event")


def test_an_operators_release_keeps_the_orders_foreign_fields(app: bootstrap.App, store: InMemoryStore) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    add_foreign(store, "order")
    run(force_release(store, ORDERS, SETTINGS.consumer_name, "ord-1", "e-3", set_aside_ttl=SET_ASIDE))
    assert_kept(store, "order")
    assert run(store.read("ord-1", "ord-1"))["status"] == "shipped"


def test_an_operators_drop_keeps_the_foreign_fields_of_the_order_and_of_the_parked_event(
    app: bootstrap.App, store: InMemoryStore,
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    add_foreign(store, "order", "parked-event")
    run(drop(store, ORDERS, SETTINGS.consumer_name, "ord-1", "e-3", set_aside_ttl=SET_ASIDE))
    assert_kept(store, "order", "parked-event")
    assert of_type(store, "parked-event")[0]["status"] == "dropped"


def test_a_copy_of_a_placed_order_keeps_every_foreign_field_of_its_order(app: bootstrap.App,
                                                                         store: InMemoryStore) -> None:
    place(app)
    add_foreign(store, "order", "outbox", "side-effect")
    assert place(app, sequence=2).outcome is Outcome.DUPLICATE
    assert_kept(store, "order", "outbox", "side-effect")


@pytest.mark.parametrize(("answers", "outcome", "status"), [
    ([503], Outcome.DUPLICATE, "completed"),  # the redelivery takes the claim over, calls and finishes
    ([503, 503], Outcome.TRANSIENT, "in_progress"),  # taken over, called, the lease released again
    ([503, 422], Outcome.DOWNSTREAM_REJECTED, "in_progress"),  # taken over, called, the call refused: released
], ids=["finish", "release", "refused"])
def test_a_takeover_and_what_follows_it_keep_the_records_foreign_fields(
    app: bootstrap.App, store: InMemoryStore, fulfilment: Fulfilment, answers: list[int], outcome: Outcome,
    status: str,
) -> None:
    fulfilment.answers = list(answers)  # a copy: the parameter serves each claim form
    assert place(app).outcome is Outcome.TRANSIENT  # the first call failed: the lease released
    add_foreign(store, "side-effect")
    assert place(app).outcome is outcome
    [record] = of_type(store, "side-effect")
    assert (record["status"], record["attempt"]) == (status, 2)
    assert_kept(store, "side-effect")


def test_a_finish_after_a_write_under_the_call_keeps_what_that_write_added(
    store: InMemoryStore,
) -> None:
    class AddingDuringTheCall(InMemoryFulfilment):
        async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
            await adding_foreign(store, "side-effect")  # another writer, between the claim and the finish
            return await super().reserve(idempotency_key, request)

    app = bootstrap.build(SETTINGS, store=store, fulfilment=AddingDuringTheCall())
    assert place(app).outcome is Outcome.CREATED
    assert of_type(store, "side-effect")[0]["status"] == "completed"
    assert_kept(store, "side-effect")


def test_marking_an_outbox_entry_dispatched_where_sent_entries_are_kept_keeps_its_foreign_fields(
        store: InMemoryStore, fulfilment: Fulfilment) -> None:
    kept = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0,
                    outbox_dispatched_ttl_seconds=604800)
    app = bootstrap.build(kept, store=store, fulfilment=fulfilment, sender=RecordingSender())
    place(app)
    add_foreign(store, "outbox")
    report = run(app.publisher().publish(of_type(store, "outbox")))
    assert len(report.dispatched) == 1
    [entry] = of_type(store, "outbox")
    assert (entry["status"], entry["ttl"]) == ("dispatched", 604800)
    assert_kept(store, "outbox")


def test_a_sent_outbox_entry_is_deleted_as_it_was_read_or_as_it_stands_while_its_message_is_the_one_sent(
        app: bootstrap.App, store: InMemoryStore) -> None:
    place(app)
    [read] = of_type(store, "outbox")
    add_foreign(store, "outbox")  # another writer sets fields of its own after the publisher read it
    assert len(run(app.publisher().publish([read])).dispatched) == 1  # sent; its delete refused (412), read again:
    assert of_type(store, "outbox") == []  # its message is the one sent, so it is deleted on its new etag
    place(app, "ord-2")
    [read] = of_type(store, "outbox")
    [changed] = run(store.execute_batch("ord-2", [Patch(read["id"], {"payload/channel": "web"})]))
    assert len(run(app.publisher().publish([read])).dispatched) == 1  # sent as it was read; its delete refused:
    assert of_type(store, "outbox")[0]["payload"]["channel"] == "web"  # its message changed, so it stays pending
    assert len(run(app.publisher().publish([changed])).dispatched) == 1  # and goes out as it stands
    assert of_type(store, "outbox") == []
