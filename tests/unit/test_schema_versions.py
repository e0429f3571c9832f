"""Schema versions: every document the core creates says which version wrote it, and a document a newer
version wrote (schemaVersion 2, with fields this version does not know) is processed normally: the
message is completed, nothing is corrupted, and the newer fields and version are kept. A document that
does not decode here (a newer version broke the additive rule) neither spins its delivery nor
dead-letters a valid message under a false reason: an event is parked with the reason, a copy of an order
is completed, and a delivery no readable field decides is dead-lettered UnreadableDocument."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from idempotent_consumer.delivery import Action, Settlement
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.operator import drop
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import Replace
from idempotent_consumer.records import SCHEMA_VERSION
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
NEWER = {"schemaVersion": 2, "giftWrap": {"paper": "red", "tags": ["birthday"]}, "priority": 3}
run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


class Port:
    """A settlement port that records the settlements made."""

    def __init__(self) -> None:
        self.made: list[Settlement] = []

    async def settle(self, settlement: Settlement, result: Result) -> None:
        self.made.append(settlement)

    async def renew_session_lock(self) -> None:
        return None


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore(default_ttl=-1)


@pytest.fixture
def app(store: InMemoryStore) -> bootstrap.App:
    return bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=RecordingSender())


def settle(app: bootstrap.App, function: str, message: InboundMessage) -> Settlement:
    handler = app.handle_order if function == "process_order" else app.handle_event
    port = Port()
    made = run(app.deliver(function, lambda: message, handler, port, queue="orders"))
    assert port.made == [made]
    return made


def place(app: bootstrap.App, sequence: int = 1) -> Settlement:
    return settle(app, "process_order", inbound(order_body("ord-1"), sequence_number=sequence))


def event(app: bootstrap.App, sequence: int, event_type: str = PAYMENT_CAPTURED) -> Settlement:
    body = event_body("ord-1", sequence, event_type, event_id=f"e-{sequence}")
    return settle(app, "process_order_event",
                  InboundMessage(message_id=body["id"], body=encode_event(body), session_id="ord-1"))


def of_type(store: InMemoryStore, doc_type: str) -> list[dict[str, Any]]:
    return of_kind(store.documents(), doc_type)


def as_newer_version(store: InMemoryStore, *doc_types: str) -> None:
    """Rewrite every document of these kinds as the next version would have written it."""
    for document in (d for t in doc_types for d in of_type(store, t)):
        run(replaced(store, {**document, **NEWER}))


def assert_newer_kept(store: InMemoryStore, *doc_types: str) -> None:
    for doc_type in doc_types:
        documents = of_type(store, doc_type)
        assert documents, f"no {doc_type} document"
        for document in documents:
            assert {k: document.get(k) for k in NEWER} == NEWER, (doc_type, document)


COMPLETE = Settlement(Action.COMPLETE)


def test_every_document_the_core_creates_carries_this_versions_schema_version(app: bootstrap.App,
                                                                              store: InMemoryStore) -> None:
    assert event(app, 2) == COMPLETE  # parked on a pending order
    assert event(app, 4, ORDER_SHIPPED) == COMPLETE  # parked
    assert place(app) == COMPLETE  # takes the pending order's place and releases version 2
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE  # applies and releases nothing (4 is a stale copy)
    kinds = {d["type"] for d in store.documents()}
    assert kinds >= {"order", "outbox", "inbox"} and of_type(store, "side-effect")  # the claim: in the order, or not
    assert {(d["type"], d.get("schemaVersion")) for d in store.documents()} == {(k, SCHEMA_VERSION) for k in kinds}
    assert SCHEMA_VERSION == 1


Path = Callable[[bootstrap.App, InMemoryStore], Settlement]


def _event_in_order(app: bootstrap.App, store: InMemoryStore) -> Settlement:
    place(app)
    as_newer_version(store, "order")
    return event(app, 2)


def _early_event_then_its_predecessor(app: bootstrap.App, store: InMemoryStore) -> Settlement:
    place(app)
    as_newer_version(store, "order")
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE  # parked: the order's count patched
    return event(app, 2)  # applied, and releases version 3


def _order_after_its_events(app: bootstrap.App, store: InMemoryStore) -> Settlement:
    assert event(app, 2) == COMPLETE
    as_newer_version(store, "order-pending")
    return place(app)  # merged into the pending order as read: its fields kept, its body this version's


def _copy_of_an_order(app: bootstrap.App, store: InMemoryStore) -> Settlement:
    place(app)
    as_newer_version(store, "order", "side-effect", "outbox")
    return place(app, sequence=2)


def _redelivery_that_takes_its_claim_over(app: bootstrap.App, store: InMemoryStore) -> Settlement:
    assert place(app) == COMPLETE
    [record] = of_type(store, "side-effect")
    # as if a newer version's delivery had claimed it and crashed after its call: in progress, lease over
    run(replaced(store, {**record, **NEWER, "status": "in_progress", "leaseUntil": 0}))
    settled = place(app)  # takes over (a patch), calls again with the same key, finishes (a patch)
    assert of_type(store, "side-effect")[0]["status"] == "completed"
    return settled


PATHS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "event in order": (_event_in_order, ("order",)),
    "early event, then its predecessor": (_early_event_then_its_predecessor, ("order",)),
    "copy of an order": (_copy_of_an_order, ("order", "side-effect", "outbox")),
    "redelivery taking its claim over": (_redelivery_that_takes_its_claim_over, ("side-effect",)),
}


@pytest.mark.parametrize("path", PATHS)
def test_a_document_of_a_newer_version_is_processed_normally_and_keeps_its_fields_and_version(
    app: bootstrap.App, store: InMemoryStore, path: str
) -> None:
    walk, kinds = PATHS[path]
    assert walk(app, store) == COMPLETE
    assert_newer_kept(store, *kinds)


def test_the_outbox_marks_an_entry_of_a_newer_version_dispatched_and_keeps_its_fields_and_version(
    store: InMemoryStore
) -> None:
    kept = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0,
                    outbox_dispatched_ttl_seconds=604800)
    app = bootstrap.build(kept, store=store, fulfilment=InMemoryFulfilment(), sender=RecordingSender())
    place(app)
    as_newer_version(store, "outbox")
    assert len(run(app.publisher().publish(of_type(store, "outbox"))).dispatched) == 1
    assert of_type(store, "outbox")[0]["status"] == "dispatched"
    assert_newer_kept(store, "outbox")


def test_an_order_taking_the_place_of_a_pending_order_of_a_newer_version_is_this_versions_order(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    assert _order_after_its_events(app, store) == COMPLETE
    order = run(store.read("ord-1", "ord-1"))
    assert (order["type"], order["status"], order["version"], order["parked"]) == ("order", "paid", 2, 0)
    # The newer version's fields are kept; the body is this version's, and schemaVersion says so, so that a
    # migration that trusts it does not pass this order over.
    assert {k: order[k] for k in NEWER if k != "schemaVersion"} == {k: v for k, v in NEWER.items()
                                                                     if k != "schemaVersion"}
    assert order["schemaVersion"] == SCHEMA_VERSION == 1


def test_a_patch_never_sets_schema_version_so_a_newer_body_keeps_its_own(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    as_newer_version(store, "order")
    assert event(app, 2) == COMPLETE and event(app, 3, ORDER_SHIPPED) == COMPLETE  # two patches of this version
    assert run(store.read("ord-1", "ord-1"))["schemaVersion"] == 2


# A newer version that broke the rule: a field this version reads changed its type, or took a value
# this version's model does not allow. Such a document does not decode here.
BROKEN_ORDER = {"schemaVersion": 2, "version": {"major": 2, "minor": 0}}
BROKEN_RECORD = {"schemaVersion": 2, "status": "compensated"}


def rewrite(store: InMemoryStore, doc_type: str, **fields: Any) -> dict[str, Any]:
    [document] = of_type(store, doc_type)
    return run(replaced(store, {**document, **fields}))


def test_an_event_whose_order_does_not_decode_is_parked_with_the_versions_and_completed_not_retried(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    before = rewrite(store, "order", **BROKEN_ORDER)
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE  # used to be an unexpected error: abandoned, again and again
    [parked] = of_type(store, "parked-event")
    assert (parked["status"], parked["counted"], parked["sequence"]) == ("parked", False, 3)
    assert "order ord-1 (schemaVersion 2) does not decode under schema version 1" in parked["reason"]
    assert "at `$.version`" in parked["reason"]
    assert run(store.read("ord-1", "ord-1"))["_etag"] == before["_etag"]  # the order is left as it is
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE  # its redelivery: a duplicate
    assert len(of_type(store, "parked-event")) == 1


def test_an_event_in_order_is_applied_by_its_patch_even_when_its_order_does_not_decode(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    rewrite(store, "order", schemaVersion=2, customerId={"id": "cust-42", "tier": "gold"})
    assert event(app, 2) == COMPLETE  # the happy path reads nothing
    order = run(store.read("ord-1", "ord-1"))
    assert (order["version"], order["status"], order["customerId"]) == (2, "paid", {"id": "cust-42", "tier": "gold"})


def test_an_event_finding_a_document_type_this_version_does_not_know_at_its_orders_id_is_parked(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    run(store.create({"id": "ord-1", "orderId": "ord-1", "type": "order-archived", "schemaVersion": 2}))
    assert event(app, 2) == COMPLETE
    [parked] = of_type(store, "parked-event")
    assert "order-archived ord-1 is of a type this version does not know" in parked["reason"]


# A parked event this version cannot decode: its event of a newer shape, the document itself, or even its sequence.
BROKEN_EVENT = {"schemaVersion": 2, "event": {"shipment": "a newer shape"}}
BROKEN_PARKED = {"schemaVersion": 2, "messageId": {"broker": "sb-2", "id": "m-5"}}
BROKEN_SEQUENCE = {"schemaVersion": 2, "sequence": "three"}


def rewrite_parked(store: InMemoryStore, event_id: str, fields: dict[str, Any]) -> None:
    [document] = [d for d in of_type(store, "parked-event") if d["eventId"] == event_id]
    run(store.execute_batch("ord-1", [Replace({**document, **fields})]))


def parked_events(store: InMemoryStore) -> list[tuple[str, str, bool]]:
    return sorted((d["eventId"], d["status"], d["counted"]) for d in of_type(store, "parked-event"))


def order_state(store: InMemoryStore) -> tuple[int, int]:
    order = run(store.read("ord-1", "ord-1"))
    return order["version"], order["parked"]


def test_an_event_in_turn_applies_though_a_later_parked_event_does_not_decode_and_releases_what_comes_before_it(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 5, ORDER_CANCELLED) == COMPLETE
    rewrite_parked(store, "e-5", BROKEN_PARKED)
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE
    assert event(app, 2) == COMPLETE  # used to be parked uncounted beside it: the order stalled with two stuck
    assert order_state(store) == (3, 1)  # 2 applied and 3 released; 5 waits, counted as it was
    assert parked_events(store) == [("e-5", "parked", True)]


@pytest.mark.parametrize("broken", [BROKEN_EVENT, BROKEN_PARKED], ids=["its event", "the document"])
def test_a_parked_event_in_turn_that_does_not_decode_stays_parked_and_holds_back_what_follows_it(
    app: bootstrap.App, store: InMemoryStore, broken: dict[str, Any]
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE
    assert event(app, 4, ORDER_CANCELLED) == COMPLETE
    rewrite_parked(store, "e-3", broken)
    result = run(app.handle_event(InboundMessage(message_id="e-2", session_id="ord-1", body=encode_event(
        event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2")))))
    assert result.outcome is Outcome.APPLIED
    assert "does not decode under schema version 1" in result.description
    assert order_state(store) == (2, 2)  # 2 applied; 3 and 4 wait, counted
    assert parked_events(store) == [("e-3", "parked", True), ("e-4", "parked", True)]


def test_a_parked_event_whose_sequence_does_not_decode_holds_back_every_parked_event(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE
    assert event(app, 4, ORDER_CANCELLED) == COMPLETE
    rewrite_parked(store, "e-4", BROKEN_SEQUENCE)
    assert event(app, 2) == COMPLETE
    assert order_state(store) == (2, 2)  # where "three" belongs is unknown: nothing is released past it
    assert parked_events(store) == [("e-3", "parked", True), ("e-4", "parked", True)]


def test_an_order_after_its_events_releases_those_before_one_it_cannot_decode(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    assert event(app, 2) == COMPLETE
    assert event(app, 4, ORDER_SHIPPED) == COMPLETE
    rewrite_parked(store, "e-4", BROKEN_PARKED)
    assert place(app) == COMPLETE
    assert order_state(store) == (2, 1)  # takes the pending order's place and releases 2; 4 waits
    assert parked_events(store) == [("e-4", "parked", True)]


def test_an_operators_drop_of_an_event_parked_uncounted_leaves_the_orders_count_alone(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 4, ORDER_SHIPPED) == COMPLETE  # counted: the order's parked is 1
    document = rewrite(store, "order", **BROKEN_ORDER)
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE  # parked uncounted
    run(store.execute_batch("ord-1", [Replace({**document, "schemaVersion": 2, "version": 1})]))  # readable again
    run(drop(store, ORDERS, SETTINGS.consumer_name, "ord-1", "e-3", set_aside_ttl=SET_ASIDE))
    assert run(store.read("ord-1", "ord-1"))["parked"] == 1  # still counts version 4, which still waits


def test_an_operator_drops_an_event_parked_uncounted_while_its_order_still_does_not_decode(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    before = rewrite(store, "order", **BROKEN_ORDER)
    assert event(app, 3, ORDER_SHIPPED) == COMPLETE  # parked uncounted: the order was not read
    # nor does the drop need it
    dropped = run(drop(store, ORDERS, SETTINGS.consumer_name, "ord-1", "e-3", set_aside_ttl=SET_ASIDE))
    assert dropped.status == "dropped"
    assert [d["status"] for d in of_type(store, "parked-event")] == ["dropped"]
    assert run(store.read("ord-1", "ord-1"))["_etag"] == before["_etag"]


def test_a_release_that_leaves_an_event_parked_uncounted_does_not_count_it_so_its_drop_leaves_the_count_right(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    document = rewrite(store, "order", **BROKEN_ORDER)
    assert event(app, 5, ORDER_CANCELLED) == COMPLETE  # parked uncounted
    run(store.execute_batch("ord-1", [Replace({**document, "schemaVersion": 2, "version": 1})]))  # readable again
    assert event(app, 4, ORDER_SHIPPED) == COMPLETE  # parked, counted
    assert event(app, 2) == COMPLETE  # applied; versions 4 and 5 still wait for 3
    order = run(store.read("ord-1", "ord-1"))
    assert (order["version"], order["parked"]) == (2, 1)  # as many as still wait counted: version 4's
    run(drop(store, ORDERS, SETTINGS.consumer_name, "ord-1", "e-5", set_aside_ttl=SET_ASIDE))
    assert run(store.read("ord-1", "ord-1"))["parked"] == 1


def test_a_copy_whose_reservation_record_does_not_decode_is_completed_and_leaves_the_record_alone(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    before = rewrite(store, "side-effect", **BROKEN_RECORD)
    assert settle(app, "process_order", inbound(order_body("ord-1"), sequence_number=2)) == COMPLETE
    [record] = of_type(store, "side-effect")
    assert record["_etag"] == before["_etag"]
    other = inbound(order_body("ord-1", items=[{"sku": "SKU-9", "quantity": 1, "unitPrice": "44.98"}]))
    assert settle(app, "process_order", other) == Settlement(Action.DEADLETTER, "PayloadMismatch")


def test_a_copy_whose_record_does_not_decode_says_why_in_its_outcome(app: bootstrap.App,
                                                                     store: InMemoryStore) -> None:
    place(app)
    rewrite(store, "side-effect", **BROKEN_RECORD)
    result = run(app.handle_order(inbound(order_body("ord-1"), sequence_number=2)))
    assert result.outcome is Outcome.IN_PROGRESS
    assert "(schemaVersion 2) does not decode under schema version 1" in result.description
    assert "left to the version that wrote it" in result.description


UNREADABLE = Settlement(Action.DEADLETTER, "UnreadableDocument")
UNHASHED_RECORD = {**BROKEN_RECORD, "requestHash": None}  # nor does the one field a copy would decide by


def test_a_copy_whose_record_does_not_decode_and_holds_no_hash_is_decided_by_its_order(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    rewrite(store, "side-effect", **UNHASHED_RECORD)
    assert place(app, sequence=2) == COMPLETE  # the order's requestHash is this delivery's: in progress
    other = inbound(order_body("ord-1", items=[{"sku": "SKU-9", "quantity": 1, "unitPrice": "44.98"}]))
    result = run(app.handle_order(other))
    assert result.outcome is Outcome.PAYLOAD_MISMATCH
    assert f"requestHash {run(store.read('ord-1', 'ord-1'))['requestHash']}" in result.description


def test_an_order_meeting_a_pending_order_it_cannot_decode_is_dead_lettered_unreadable_not_a_mismatch(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    assert event(app, 2) == COMPLETE
    rewrite(store, "order-pending", schemaVersion=2, parked={"counted": 1, "uncounted": 0})
    result = run(app.handle_order(inbound(order_body("ord-1"))))
    assert result.outcome is Outcome.UNREADABLE
    assert "order-pending ord-1 (schemaVersion 2) does not decode under schema version 1" in result.description
    assert place(app) == UNREADABLE  # for an operator to resubmit once every consumer reads it
    assert of_type(store, "order") == [] and of_type(store, "side-effect") == []


def test_an_order_whose_record_is_rewritten_unreadably_under_its_call_is_left_to_that_version(
    store: InMemoryStore
) -> None:
    class RewritingFulfilment(InMemoryFulfilment):
        """Answers the call after a newer version rewrote the record, as one whose lease ran out would."""

        async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
            [record] = of_type(store, "side-effect")
            await replaced(store, {**record, **UNHASHED_RECORD})
            return await super().reserve(idempotency_key, request)

    app = bootstrap.build(SETTINGS, store=store, fulfilment=RewritingFulfilment(), sender=RecordingSender())
    result = run(app.handle_order(inbound(order_body("ord-1"))))
    assert result.outcome is Outcome.IN_PROGRESS  # its own new order: never a mismatch
    assert "left to the version that wrote it" in result.description


def test_an_event_whose_marker_does_not_decode_and_holds_no_hash_is_dead_lettered_unreadable_not_a_mismatch(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 2) == COMPLETE
    rewrite(store, "inbox", schemaVersion=2, requestHash={"sha256": "…", "sha3": "…"})
    body = event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2")
    result = run(app.handle_event(InboundMessage(message_id="e-2", body=encode_event(body), session_id="ord-1")))
    assert result.outcome is Outcome.UNREADABLE
    assert "inbox" in result.description and "(schemaVersion 2) does not decode under schema version 1" in (
        result.description)
    assert event(app, 2) == UNREADABLE


def test_an_order_after_events_it_cannot_decode_takes_the_pending_orders_place_and_leaves_them_parked(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    assert event(app, 2) == COMPLETE
    rewrite(store, "parked-event", schemaVersion=2, sequence="two")
    assert place(app) == COMPLETE
    order = run(store.read("ord-1", "ord-1"))
    assert (order["type"], order["version"], order["parked"]) == ("order", 1, 1)
    assert [d["status"] for d in of_type(store, "parked-event")] == ["parked"]
    assert of_type(store, "side-effect")[0]["status"] == "completed"


def test_report_stuck_reports_a_record_it_cannot_decode_by_its_id(store: InMemoryStore) -> None:
    clock = [1_000_000.0]
    app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), clock=lambda: clock[0])
    place(app)
    [record] = of_type(store, "side-effect")
    # In progress since long ago, as the timers find it (by its due), in a shape this version does not read
    run(replaced(store, {**record, "status": "in_progress", "leaseUntil": 0, "due": 0, "attempt": "second"}))
    found = run(app.report_stuck(clock[0]))
    assert found.side_effects == () and found.unreadable == (record["id"],)


def test_an_outbox_entry_that_does_not_decode_is_left_pending_and_named(app: bootstrap.App,
                                                                        store: InMemoryStore) -> None:
    place(app)
    entry = rewrite(store, "outbox", schemaVersion=2, payload="moved to payloadRef")
    report = run(app.publisher().publish([entry]))
    assert report.failed == (entry["id"],) and report.dispatched == ()
    assert of_type(store, "outbox")[0]["status"] == "pending"
