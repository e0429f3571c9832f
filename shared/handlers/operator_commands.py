"""Operator commands on parked events (``sbctl parked``): list them, release one by hand, drop one.

Release applies an event whose predecessor will never come, then what waits behind it; drop sets
one aside for good. Neither deletes what it cannot account for: a dropped event stays, marked dropped.
"""

from __future__ import annotations

from shared.domain.aggregate import Order, Release
from shared.domain.documents import ParkedEvent, ParkedStatus
from shared.domain.outcomes import Outcome
from shared.errors import NotFound, StoreError
from shared.handlers.writes import MAX_PARKED_READ, Stored, read_order, released_by_hand, set_aside, waiting
from shared.ports.store import DocumentStore


async def find_parked(store: DocumentStore, consumer: str, order_id: str | None) -> list[ParkedEvent]:
    """What this consumer has parked, for one order or all (rejected and dropped ones included)."""
    found = await store.query(ParkedEvent.of_consumer(consumer), partition_key=order_id, limit=MAX_PARKED_READ)
    return sorted((ParkedEvent.from_document(d) for d in found), key=lambda p: (p.order_id, p.sequence))


async def _one_parked(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> ParkedEvent:
    for parked in await find_parked(store, consumer, order_id):
        if parked.event_id == event_id and parked.status is ParkedStatus.PARKED:
            return parked
    raise NotFound(f"no event {event_id} waits parked against order {order_id}")


async def force_release(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> Release:
    """Apply a parked event now, its missing predecessors notwithstanding (an operator's decision),
    then what waits behind it. Raise NotFound, or StoreError when the order's state forbids it."""
    parked = await _one_parked(store, consumer, order_id, event_id)
    stored = await read_order(store, order_id)
    if stored.order.status is None:
        raise StoreError(f"order {order_id} is not placed yet; a parked event can only join a placed order")
    event = parked.cloud_event()
    skipped = stored.order.skip_to(event)
    if skipped.decide(event) is not Outcome.APPLIED:
        raise StoreError(f"order {order_id} is {stored.order.status}; {event.type} may not follow")
    others = [p for p in await waiting(store, consumer, order_id) if p.id != parked.id]
    if earlier := [p.sequence for p in others if p.sequence is None or p.sequence < parked.sequence]:
        raise StoreError(f"versions {earlier} of order {order_id} are parked before it; release those first")
    done = skipped.apply(event).release(others)
    done.applied.insert(0, (parked, event))
    await released_by_hand(store, stored, done)
    return done


async def drop(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> ParkedEvent:
    """Set a parked event aside for good (an operator's decision): kept, marked dropped, no longer counted.
    An event parked uncounted is dropped without reading its order, which may still not decode here."""
    parked = await _one_parked(store, consumer, order_id, event_id)
    stored = await read_order(store, order_id) if parked.counted else Stored(Order(order_id))
    return await set_aside(store, stored, parked, "dropped by an operator")
