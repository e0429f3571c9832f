"""The ordered mode as a library consumer opts into it (``Consumer.ordered``), with a machine that is not about
orders: a parcel's tracking events, whose first event creates the parcel, in a container partitioned by
``/parcelId``. On the in-memory store, through the blueprint's own handler."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Collection, Mapping
from typing import Any

import azure.functions as func
import msgspec
import pytest

from idempotent_consumer.errors import InvalidMessage, UnreadableDocument
from idempotent_consumer.functions import Consumer
from idempotent_consumer.identity import request_hash
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered import StoredState
from idempotent_consumer.ordered.writes import Releases
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.ports.store import MAX_ITEM_BYTES, Patch
from idempotent_consumer.records import ParkedEvent
from idempotent_consumer.testing.memory import InMemoryStore

FIELD = "parcelId"


class Tracked(msgspec.Struct, frozen=True, kw_only=True):
    """A parcel's tracking event."""

    id: str
    source: str
    type: str
    subject: str
    sequence: int
    time: str
    where: str = ""

    @property
    def time_text(self) -> str:
        return self.time

    def request_hash(self) -> str:
        return request_hash(msgspec.to_builtins(self))


# type: (status after, allowed from)
KINDS = {"Accepted": ("accepted", ()), "Dispatched": ("in_transit", ("accepted",)),
         "Delivered": ("delivered", ("in_transit",)), "Lost": ("lost", ("accepted", "in_transit"))}


class Parcels:
    """The parcel's machine: accepted -> in_transit -> delivered, or lost; Accepted (sequence 1) creates it."""

    noun = "parcel"
    known = frozenset(status for status, _ in KINDS.values())
    terminal = frozenset({"delivered", "lost"})
    sub_objects = frozenset({"accepted", "dispatched", "delivered", "lost"})
    max_parked = 3
    creates = True

    def parse(self, message: InboundMessage) -> Tracked:
        try:
            event = msgspec.json.decode(message.body or b"", type=Tracked)
        except msgspec.ValidationError as exc:
            raise InvalidMessage(str(exc)) from exc
        if event.type not in KINDS:
            raise InvalidMessage(f"type {event.type} is not a tracking event")
        return event

    def allowed_from(self, event: Tracked) -> Collection[str]:
        return KINDS[event.type][1]

    def status_after(self, event: Tracked) -> str:
        return KINDS[event.type][0]

    def sub_object(self, event: Tracked, written: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
        return event.type.lower(), {"where": event.where, "at": event.time}

    def record(self, event: Tracked, written: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"id": f"scan.{event.id}", FIELD: event.subject, "type": "scan", "sequence": event.sequence}

    def decode(self, parked: ParkedEvent) -> Tracked:
        try:
            return msgspec.convert(parked.event, Tracked)
        except msgspec.ValidationError as exc:
            raise UnreadableDocument(str(exc), doc_id=parked.id, schema_version=None) from exc

    def read(self, document: Mapping[str, Any]) -> StoredState | None:
        if document.get("type") == "parcel":
            return StoredState(document["status"], document["version"], document.get("parked", 0), None)
        if document.get("type") == "parcel-pending":
            return StoredState(None, parked=document.get("parked", 0))
        return None

    def placeholder(self, key: str, parked: int) -> dict[str, Any]:
        return {"id": key, FIELD: key, "type": "parcel-pending", "parked": parked}

    def create(self, event: Tracked, written: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"id": event.subject, FIELD: event.subject, "type": "parcel"}


def consumer_on(store: InMemoryStore) -> tuple[Consumer, str]:
    parcels = Consumer("parcel-tracker", container="parcels", partition_key=f"/{FIELD}", env={})
    parcels.ordered("tracking", Parcels(), sessions=True)
    parcels.runtime(store=store, clock=lambda: 1000.0)
    return parcels, "parcel_tracker_tracking"


def tracked(sequence: int, type_: str, *, parcel: str = "p-1", where: str = "depot") -> InboundMessage:
    body: dict[str, Any] = {"id": f"{parcel}-{sequence}", "source": "carrier", "type": type_, "subject": parcel,
            "sequence": sequence, "time": f"2026-12-06T10:0{sequence}:00Z", "where": where}
    return InboundMessage(message_id=body["id"], body=json.dumps(body).encode(), session_id=parcel)


def deliver(consumer: Consumer, function: str, message: InboundMessage) -> Outcome:
    return asyncio.run(consumer.apply(function, message)).outcome


def documents(store: InMemoryStore, type_: str) -> list[dict[str, Any]]:
    return [d for d in store.documents() if d.get("type") == type_]


def test_the_ordered_queue_is_a_peeklock_trigger_the_library_settles() -> None:
    parcels, function = consumer_on(InMemoryStore(partition_field=FIELD))
    app = func.FunctionApp()
    app.register_functions(parcels)
    found = {f.get_function_name(): [json.loads(b) for b in f.get_raw_bindings()] for f in app.get_functions()}
    [trigger] = found[function]
    assert trigger["queueName"] == "tracking" and trigger["autoCompleteMessages"] is False
    assert trigger["isSessionsEnabled"] is True


def test_events_in_order_create_then_move_the_parcel_each_once() -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    for message in (tracked(1, "Accepted"), tracked(2, "Dispatched"), tracked(3, "Delivered")):
        assert deliver(parcels, function, message) is Outcome.APPLIED
        assert deliver(parcels, function, message) is Outcome.DUPLICATE
    [parcel] = documents(store, "parcel")
    assert (parcel["status"], parcel["version"], parcel[FIELD]) == ("delivered", 3, "p-1")
    assert parcel["delivered"] == {"where": "depot", "at": "2026-12-06T10:03:00Z"}
    assert len(documents(store, "scan")) == 3


class CountingStore(InMemoryStore):
    """The in-memory store, counting point reads."""

    reads = 0

    async def read(self, doc_id: str, partition_key: str) -> dict[str, Any]:
        self.reads += 1
        return await super().read(doc_id, partition_key)


def test_the_next_event_after_the_first_is_applied_unread() -> None:
    store = CountingStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(1, "Accepted")) is Outcome.APPLIED
    assert deliver(parcels, function, tracked(2, "Dispatched")) is Outcome.APPLIED
    assert store.reads == 0  # the created parcel counts nothing parked, so the next one's patch holds


def test_events_before_their_parcel_are_parked_and_released_by_the_first_in_its_batch() -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(3, "Delivered")) is Outcome.PARKED
    assert deliver(parcels, function, tracked(2, "Dispatched")) is Outcome.PARKED
    [pending] = documents(store, "parcel-pending")
    assert pending["parked"] == 2
    assert deliver(parcels, function, tracked(1, "Accepted")) is Outcome.APPLIED
    [parcel] = documents(store, "parcel")
    assert (parcel["status"], parcel["version"], parcel["parked"]) == ("delivered", 3, 0)
    assert not documents(store, "parcel-pending") and not documents(store, "parked-event")
    assert sorted(d["sequence"] for d in documents(store, "scan")) == [1, 2, 3]


def test_a_placeholders_foreign_fields_are_kept_when_the_parcel_takes_its_place() -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(2, "Dispatched")) is Outcome.PARKED
    [pending] = documents(store, "parcel-pending")
    asyncio.run(store.execute_batch("p-1", [_patch(pending, {"insuredBy": "another writer"})]))
    assert deliver(parcels, function, tracked(1, "Accepted")) is Outcome.APPLIED
    [parcel] = documents(store, "parcel")
    assert parcel["insuredBy"] == "another writer" and parcel["status"] == "in_transit"


def test_other_content_under_an_events_id_is_a_payload_mismatch_and_changes_nothing() -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(1, "Accepted")) is Outcome.APPLIED
    assert deliver(parcels, function, tracked(1, "Accepted", where="elsewhere")) is Outcome.PAYLOAD_MISMATCH
    [parcel] = documents(store, "parcel")
    assert parcel["accepted"]["where"] == "depot"


def test_the_machines_rules_decide_stale_invalid_and_the_parked_limit() -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(1, "Accepted")) is Outcome.APPLIED
    first = tracked(1, "Accepted").body or b""
    again = InboundMessage(message_id="other", body=first.replace(b'"p-1-1"', b'"other"'))
    assert deliver(parcels, function, again) is Outcome.STALE  # another first event: the create found the parcel
    assert deliver(parcels, function, tracked(2, "Lost")) is Outcome.APPLIED
    assert deliver(parcels, function, tracked(3, "Delivered")) is Outcome.INVALID_TRANSITION  # lost is terminal
    for sequence in (5, 6, 7):
        assert deliver(parcels, function, tracked(sequence, "Dispatched", parcel="p-2")) is Outcome.PARKED
    assert deliver(parcels, function, tracked(8, "Dispatched", parcel="p-2")) is Outcome.LIMIT_EXCEEDED


def test_a_message_that_is_no_event_is_refused_before_any_store_call() -> None:
    parcels, function = consumer_on(InMemoryStore(partition_field=FIELD))
    mode = parcels.ordered_queues[function][1]
    result = mode.check(InboundMessage(message_id="m", body=b'{"id": "m"}'))
    assert result is not None and result.outcome is Outcome.INVALID
    # The machine's parse raised its decoder's error, not InvalidMessage: still a clear outcome, naming no value.
    garbage = mode.check(InboundMessage(message_id="m", body=b"{not json"))
    assert garbage is not None and garbage.outcome is Outcome.INVALID and "DecodeError" in garbage.description


@pytest.mark.parametrize("records", [("inbox", "event-identity", "parked-event")])
def test_the_librarys_records_carry_the_containers_partition_field(records: tuple[str, ...]) -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(2, "Dispatched")) is Outcome.PARKED
    for kind in records:
        for document in documents(store, kind):
            assert FIELD in document and "orderId" not in document, document


def _patch(document: dict[str, Any], fields: dict[str, Any]) -> Patch:
    return Patch(document["id"], fields, if_match=document["_etag"])


def test_a_first_event_the_machine_creates_no_parcel_by_is_an_invalid_transition() -> None:
    store = InMemoryStore(partition_field=FIELD)
    parcels, function = consumer_on(store)
    assert deliver(parcels, function, tracked(1, "Delivered")) is Outcome.INVALID_TRANSITION
    assert not documents(store, "parcel")
    assert deliver(parcels, function, tracked(2, "Dispatched", parcel="p-2")) is Outcome.PARKED
    assert deliver(parcels, function, tracked(1, "Lost", parcel="p-2")) is Outcome.INVALID_TRANSITION
    assert documents(store, "parcel-pending")[0]["parked"] == 1  # it waits for the event that creates it


def test_an_event_whose_body_is_not_a_json_object_is_invalid_and_writes_nothing() -> None:
    class Binary(Parcels):  # reads its event from the properties, as CloudEvents' binary mode would
        def parse(self, message: InboundMessage) -> Tracked:
            return msgspec.convert(message.application_properties, Tracked)

    store = InMemoryStore(partition_field=FIELD)
    parcels = Consumer("parcel-tracker", container="parcels", partition_key=f"/{FIELD}", env={})
    parcels.ordered("tracking", Binary())
    parcels.runtime(store=store, clock=lambda: 1000.0)
    event = json.loads(tracked(1, "Accepted").body or b"")
    message = InboundMessage(message_id="m", body=b'["scan", 1]', application_properties=event)
    result = asyncio.run(parcels.apply("parcel_tracker_tracking", message))
    assert result.outcome is Outcome.INVALID and "JSON object" in result.description
    assert not store.documents()


def test_a_machine_with_more_sub_objects_than_one_patch_takes_is_refused_when_registered() -> None:
    class Wide(Parcels):
        sub_objects = frozenset(f"kind{n}" for n in range(7))

    with pytest.raises(ValueError, match="at most 6"):
        Consumer("w", container="c", partition_key=f"/{FIELD}", env={}).ordered("tracking", Wide())


def test_a_release_past_one_batch_after_the_first_event_patches_only_the_modes_fields() -> None:
    @dataclasses.dataclass(frozen=True)
    class Small(Releases):
        max_operations: int = 6  # the first event's batch takes one released event, the next batch the rest

    class Rich(Parcels):  # its parcels are created with more fields than one patch could set again with the mode's
        def create(self, event: Tracked, written: Mapping[str, Any] | None) -> dict[str, Any]:
            return {**super().create(event, written), "carrier": "acme", "service": "express"}

    store = InMemoryStore(partition_field=FIELD)
    parcels = Consumer("parcel-tracker", container="parcels", partition_key=f"/{FIELD}", env={})
    mode = parcels.ordered("tracking", Rich())
    parcels.ordered_queues["parcel_tracker_tracking"] = "tracking", dataclasses.replace(mode, releases=Small)
    parcels.runtime(store=store, clock=lambda: 1000.0)
    function = "parcel_tracker_tracking"
    for sequence, type_ in ((4, "Lost"), (3, "Delivered"), (2, "Dispatched")):
        assert deliver(parcels, function, tracked(sequence, type_)) is Outcome.PARKED
    assert deliver(parcels, function, tracked(1, "Accepted")) is Outcome.APPLIED
    [parcel] = documents(store, "parcel")
    assert (parcel["status"], parcel["version"], parcel["parked"], parcel["carrier"]) == ("delivered", 3, 0, "acme")
    assert [d["status"] for d in documents(store, "parked-event")] == ["rejected"]  # lost after delivered


@pytest.mark.parametrize("parked_first", [False, True], ids=["a new parcel", "a parcel taking its placeholder's place"])
def test_a_parcel_near_cosmos_dbs_item_limit_is_created_and_one_past_it_is_limit_exceeded(parked_first: bool) -> None:
    class Heavy(Parcels):  # its create writes a manifest as large as the event's "where" says
        def create(self, event: Tracked, written: Mapping[str, Any] | None) -> dict[str, Any]:
            return {**super().create(event, written), "manifest": "m" * int(event.where)}

    near, past = MAX_ITEM_BYTES - 8 * 1024, MAX_ITEM_BYTES + 1  # near: its batch (marker, parcel, scan) fits 2 MB
    for parcel, size in (("p-near", near), ("p-past", past)):
        store = InMemoryStore(partition_field=FIELD)
        parcels = Consumer("parcel-tracker", container="parcels", partition_key=f"/{FIELD}", env={})
        parcels.ordered("tracking", Heavy(), sessions=True)
        parcels.runtime(store=store, clock=lambda: 1000.0)
        function = "parcel_tracker_tracking"
        if parked_first:
            assert deliver(parcels, function, tracked(2, "Dispatched", parcel=parcel)) is Outcome.PARKED
        first = tracked(1, "Accepted", parcel=parcel, where=str(size))
        if size == near:
            assert deliver(parcels, function, first) is Outcome.APPLIED
            [stored] = documents(store, "parcel")
            assert len(stored["manifest"]) == near
            assert stored["status"] == ("in_transit" if parked_first else "accepted")
            assert deliver(parcels, function, tracked(3 if parked_first else 2, "Delivered" if parked_first else
                                                      "Dispatched", parcel=parcel)) is Outcome.APPLIED
            continue
        for _ in range(2):  # a redelivery (an operator's resubmission) meets the same limit: final, never a spin
            result = asyncio.run(parcels.apply(function, first))
            assert result.outcome is Outcome.LIMIT_EXCEEDED, result
            assert "2097152" in result.description and "m" * 20 not in result.description
        assert not documents(store, "parcel") and not documents(store, "scan")
        # Only what the parked event wrote: its marker, and its placeholder, where it still waits for an operator.
        assert len(documents(store, "inbox")) == len(documents(store, "parcel-pending")) == parked_first
