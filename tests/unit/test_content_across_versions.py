"""Content crosses versions as it was written: a field a newer producer or version writes inside the outbox
payload, an event's data or one of the order's sub-objects survives every path (send, park, release, record);
an older version parks what a newer status puts past it, and never lowers a newer version's parked count."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import Document, Patch, Replace
from idempotent_consumer.records import ParkedEvent
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.aggregate import order as order_state
from shared.domain.documents import EventRecord
from shared.domain.lifecycle import ORDER_SHIPPED, PAYMENT_CAPTURED, parse_event
from shared.settings import Settings
from tests.support.events import SOURCE, encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import recorded

SETTINGS = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)
run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


@pytest.fixture
def store() -> InMemoryStore:
    return InMemoryStore(default_ttl=-1)


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def app(store: InMemoryStore, sender: RecordingSender) -> bootstrap.App:
    return bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender)


def place(app: bootstrap.App) -> Result:
    return run(app.handle_order(inbound(order_body("ord-1"), sequence_number=1)))


def event(app: bootstrap.App, sequence: int, event_type: str = PAYMENT_CAPTURED, **data: Any) -> Result:
    body = event_body("ord-1", sequence, event_type, event_id=f"e-{sequence}", **data)
    return run(app.handle_event(InboundMessage(message_id=body["id"], body=encode_event(body), session_id="ord-1")))


def identity(sequence: int) -> dict[str, Any]:
    """The identity of the event ``event`` sends at ``sequence``, which its order's sub-object carries."""
    return {"eventId": f"e-{sequence}", "eventSource": SOURCE, "eventTime": "2026-11-30T10:00:00.000000Z",
            "sequence": sequence}


def of_type(store: InMemoryStore, kind: str) -> list[Document]:
    return [d for d in store.documents() if d.get("type") == kind]


def order(store: InMemoryStore) -> Document:
    return run(store.read("ord-1", "ord-1"))


def write(store: InMemoryStore, document: Document) -> None:
    """Rewrite a stored document whole, as another version or writer does on the etag it read."""
    run(store.execute_batch(document["orderId"], [Replace(document, document["_etag"])]))


def test_the_outbox_sends_the_payload_as_stored_with_what_a_newer_version_added(
    app: bootstrap.App, store: InMemoryStore, sender: RecordingSender
) -> None:
    place(app)
    [entry] = of_type(store, "outbox")
    write(store, {**entry, "schemaVersion": 2, "payload": {**entry["payload"], "channel": "web",
                                                             "loyalty": {"tier": "gold"}}})
    run(app.publisher().publish(of_type(store, "outbox")))
    [(_, message)] = sender.sent
    body = json.loads(message.body)
    assert (body["channel"], body["loyalty"], body["orderId"]) == ("web", {"tier": "gold"}, "ord-1")


def test_a_field_a_newer_producer_adds_to_an_events_data_is_kept_on_the_record_and_the_order(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 2, channel="web", fraud={"score": 3}).outcome is Outcome.APPLIED
    [record] = recorded(store.documents(), "payment")
    assert (record["channel"], record["fraud"], record["amount"]) == ("web", {"score": 3}, "44.98")
    assert order(store)["payment"] == {"channel": "web", "fraud": {"score": 3}, "paymentId": "pay-1",
                                       "amount": "44.98", "currency": "EUR", **identity(2)}


def test_a_parked_event_keeps_its_content_as_written_and_its_release_stores_it(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED, eta="2026-12-05").outcome is Outcome.PARKED
    [parked] = of_type(store, "parked-event")
    assert parked["event"]["data"]["eta"] == "2026-12-05"
    assert event(app, 2).outcome is Outcome.APPLIED  # releases version 3
    [record] = recorded(store.documents(), "shipment")
    assert record["eta"] == "2026-12-05" and order(store)["shipment"]["eta"] == "2026-12-05"


def test_a_parked_event_a_newer_version_wrote_is_released_with_its_content(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    [parked] = of_type(store, "parked-event")
    newer = {**parked["event"], "data": {**parked["event"]["data"], "eta": "2026-12-06", "dock": {"door": 4}}}
    write(store, {**parked, "schemaVersion": 2, "event": newer})
    assert event(app, 2).outcome is Outcome.APPLIED
    [record] = recorded(store.documents(), "shipment")
    assert (record["eta"], record["dock"]) == ("2026-12-06", {"door": 4})
    assert order(store)["shipment"]["dock"] == {"door": 4}


def test_an_event_in_turn_merges_into_a_sub_object_another_writer_put_there(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    # Another writer (a fraud service) put its own fields into the payment before the payment came.
    run(store.execute_batch("ord-1", [Patch("ord-1", {"payment": {"riskCheck": "passed"}})]))
    assert event(app, 2).outcome is Outcome.APPLIED  # its unread patch refused: read, merged, written on the etag
    assert order(store)["payment"] == {"riskCheck": "passed", "paymentId": "pay-1", "amount": "44.98",
                                       "currency": "EUR", **identity(2)}


def test_a_release_merges_into_a_sub_object_another_writer_put_there(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    run(store.execute_batch("ord-1", [Patch("ord-1", {"shipment": {"insured": True}})]))
    assert event(app, 2).outcome is Outcome.APPLIED  # releases version 3 into the shipment as read
    assert order(store)["shipment"] == {"insured": True, "shipmentId": "shp-1", "carrier": "DHL",
                                        "trackingNumber": "JD0001", **identity(3)}


def test_an_order_in_a_status_this_version_does_not_know_parks_its_events_counted_and_rejects_none(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    write(store, {**order(store), "status": "on_hold", "version": 1, "schemaVersion": 2})
    result = event(app, 2)  # in turn, but this version cannot say whether on_hold takes a payment
    assert result.outcome is Outcome.PARKED and "on_hold, a status this version does not know" in result.description
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    parked = sorted(of_type(store, "parked-event"), key=lambda d: d["sequence"])
    assert [(p["sequence"], p["status"], p["counted"]) for p in parked] == [(2, "parked", True), (3, "parked", True)]
    assert "does not know" in parked[0]["reason"]
    assert (order(store)["parked"], order(store)["status"]) == (2, "on_hold")


def test_a_release_on_an_order_in_a_status_this_version_does_not_know_keeps_every_event_parked(
    store: InMemoryStore
) -> None:
    # Where this version releases on its own (a redelivery finishing a release, an operator's release), an order in
    # a newer status decides nothing: the events stay parked, none is rejected for good, the count is unchanged.
    events = [ParkedEvent.of(parse_event(InboundMessage(body["id"], encode_event(body), session_id="ord-1")),
                             consumer="c", message_id=body["id"], request_hash="h", now=0.0)
              for body in (event_body("ord-1", 2), event_body("ord-1", 3, ORDER_SHIPPED))]
    done = order_state("ord-1", "on_hold", 1, parked=2).release(events)
    assert done.steps == [] and done.subject.parked == 2
    assert "on_hold, a status this version does not know" in done.describe()


def test_a_release_lowers_the_parked_count_by_what_it_releases_and_keeps_what_a_newer_version_counts(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    place(app)
    assert event(app, 3, ORDER_SHIPPED).outcome is Outcome.PARKED
    # A newer version parked a kind of document this one does not know, and counted it on the order.
    write(store, {**order(store), "parked": order(store)["parked"] + 1})
    run(store.create({"id": "hold-1", "orderId": "ord-1", "type": "parked-return", "schemaVersion": 2}))
    assert event(app, 2).outcome is Outcome.APPLIED  # releases version 3, the one this version counted
    assert (order(store)["version"], order(store)["parked"]) == (3, 1)


def test_a_newer_producers_field_named_as_the_events_identity_goes_inside_data_not_over_it(
    app: bootstrap.App, store: InMemoryStore
) -> None:
    # The order's sub-object is the event's record: a producer's eventId or sequence would overwrite the
    # identity it carries. Such fields are kept inside the sub-object's data object instead; the rest beside it.
    place(app)
    clashing = {"eventId": "other", "eventSource": "elsewhere"}
    assert event(app, 2, ttl=0, _ts=5, channel="web", **clashing).outcome is Outcome.APPLIED
    [record] = recorded(store.documents(), "payment")
    assert (record["channel"], record["ttl"], record["_ts"]) == ("web", 0, 5)
    assert (record["eventId"], record["eventSource"], record["sequence"]) == ("e-2", SOURCE, 2)
    assert record["data"] == clashing


def test_a_record_an_earlier_release_wrote_keeps_a_newer_producers_clashing_fields_inside_data() -> None:
    # The records an earlier release wrote beside the sub-object are documents: a producer's ttl would make one
    # expire, its _ts or eventId overwrite the store's or the record's.
    body = event_body("ord-1", 2, PAYMENT_CAPTURED, event_id="e-2", ttl=0, _ts=5, eventId="other", channel="web")
    cloud = parse_event(InboundMessage(message_id="e-2", body=encode_event(body), session_id="ord-1"))
    record = EventRecord.document(cloud, body["data"])
    assert record["channel"] == "web" and record["eventId"] == "e-2" and "ttl" not in record
    assert record["data"] == {"ttl": 0, "_ts": 5, "eventId": "other"}
