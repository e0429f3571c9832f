"""The order's state machine (``ORDERS``), which the library's ordered mode runs the lifecycle events by.

Events move an order through ``lifecycle.KINDS``: placed -> paid -> shipped, cancelled terminal. Each carries
the version the order has after it; the library applies it in turn, parks it before its turn, and releases
what waits in the batch of the event that makes it next (``idempotent_consumer.ordered``). An order not
placed yet (events came first) is held by a pending order, which counts what waits for it and which the
order takes the place of. An event's data is stored as its producer wrote it, the fields this version does
not model included (``EventData.kept``), on the order in the event's sub-object, with the event's identity
(id, source, time, sequence): the sub-object is the event's record, and no other document is written for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered import StoredState, Subject
from idempotent_consumer.records import ParkedEvent
from shared.domain import documents
from shared.domain.documents import OrderDocument, OrderState, PendingOrder
from shared.domain.lifecycle import KINDS, KNOWN_STATUSES, TERMINAL_STATUSES, CloudEvent, parse_event

# The most events one order holds parked and counted. A storm past it (a producer that rebuilds its events'
# ids on every retry while their order is held back) would make a release read and settle more than a
# delivery does inside its lock; the event past it is dead-lettered LimitExceeded instead. A full backlog
# takes 10 query pages and about 11 batches to release (docs/design.md, "Limits").
MAX_PARKED_EVENTS = 1000


class OrderMachine:
    """The order lifecycle as the library's ``Machine``."""

    noun = "order"
    known = KNOWN_STATUSES
    terminal = TERMINAL_STATUSES
    # The order's fields the events' kinds set, one sub-object each.
    sub_objects = frozenset(kind.record_type for kind in KINDS.values())
    max_parked = MAX_PARKED_EVENTS
    creates = False  # OrderPlaced creates the order, in its own intake with the reservation's claim

    def create(self, event: CloudEvent, written: Mapping[str, Any] | None) -> dict[str, Any]:
        raise NotImplementedError("an order is created by OrderPlaced, not by an event")

    def parse(self, message: InboundMessage) -> CloudEvent:
        return parse_event(message)

    def allowed_from(self, event: CloudEvent) -> Collection[str]:
        return event.kind.allowed_from

    def status_after(self, event: CloudEvent) -> str:
        return event.kind.status_after

    def sub_object(self, event: CloudEvent, written: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
        return event.kind.record_type, documents.sub_object(event, written)

    def record(self, event: CloudEvent, written: Mapping[str, Any] | None) -> None:
        return None  # the event's sub-object on its order is its record

    def decode(self, parked: ParkedEvent) -> CloudEvent:
        return documents.cloud_event(parked)

    def read(self, document: Mapping[str, Any]) -> StoredState | None:
        if OrderDocument.is_kind(document):
            placed = OrderState.of(document)
            return StoredState(placed.status, placed.version, placed.parked, placed.request_hash)
        if PendingOrder.is_kind(document):
            return StoredState(None, parked=PendingOrder.from_document(document).parked)
        return None

    def placeholder(self, key: str, parked: int) -> dict[str, Any]:
        return PendingOrder(id=key, partition=key, parked=parked).to_document()


ORDERS = OrderMachine()


def order(order_id: str, status: str | None = None, version: int = 0, parked: int = 0, **state: Any) -> Subject:
    """An order's state, as the ordered mode holds it."""
    return Subject(ORDERS, order_id, status, version, parked, **state)
