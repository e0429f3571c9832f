"""Operator commands on parked events (``sbctl parked``): list them, release one by hand, drop one.

Release applies an event whose predecessor will never come, then what waits behind it; drop sets
one aside for good. Neither deletes what it cannot account for: a dropped event stays, marked dropped.
"""

from __future__ import annotations

from idempotent_consumer.errors import NotFound, StoreError
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.ports.store import DocumentStore, query_all
from idempotent_consumer.records import ParkedEvent, ParkedStatus
from shared.domain import documents
from shared.domain.aggregate import Order, Release, Step
from shared.handlers.writes import Releases, Stored, read_order, set_aside, waiting
from shared.settings import Settings

SET_ASIDE_TTL = Settings().parked_set_aside_ttl_seconds


async def find_parked(store: DocumentStore, consumer: str, order_id: str | None) -> list[ParkedEvent]:
    """Everything this consumer has parked, for one order or all, read through every page (rejected and
    dropped ones included, until their ttl ends), by order and sequence."""
    found = await query_all(store, ParkedEvent.of_consumer(consumer), partition_key=order_id)
    return sorted((ParkedEvent.from_document(d) for d in found), key=lambda p: (p.partition, p.sequence))


async def _one_parked(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> ParkedEvent:
    for parked in await find_parked(store, consumer, order_id):
        if parked.event_id == event_id and parked.status is ParkedStatus.PARKED:
            return parked
    raise NotFound(f"no event {event_id} waits parked against order {order_id}")


async def force_release(store: DocumentStore, consumer: str, order_id: str, event_id: str, *,
                        set_aside_ttl: int = SET_ASIDE_TTL) -> Release:
    """Apply a parked event now, its missing predecessors notwithstanding (an operator's decision),
    then what waits behind it, in as many batches as they take. Raise NotFound, or StoreError when the
    order's state forbids it."""
    parked = await _one_parked(store, consumer, order_id, event_id)
    stored = await read_order(store, order_id)
    if stored.order.status is None:
        raise StoreError(f"order {order_id} is not placed yet; a parked event can only join a placed order")
    event = documents.cloud_event(parked)
    skipped = stored.order.skip_to(event)
    if skipped.decide(event) is not Outcome.APPLIED:
        raise StoreError(f"order {order_id} is {stored.order.status}; {event.type} may not follow")
    others = [p for p in await waiting(store, consumer, order_id) if p.id != parked.id]
    if earlier := [p.sequence for p in others if p.sequence is None or p.sequence < parked.sequence]:
        raise StoreError(f"versions {earlier} of order {order_id} are parked before it; release those first")
    rest = skipped.apply(event, parked.data).release(others)
    done = Release(skipped, [Step(parked, event=event), *rest.steps], rest.notes)
    await Releases(store, consumer, set_aside_ttl).by_hand(stored, done)
    return done


async def drop(store: DocumentStore, consumer: str, order_id: str, event_id: str, *,
               set_aside_ttl: int = SET_ASIDE_TTL) -> ParkedEvent:
    """Set a parked event aside for good (an operator's decision): kept, marked dropped until its ttl ends,
    no longer counted. An event parked uncounted is dropped without reading its order, which may still not
    decode here."""
    parked = await _one_parked(store, consumer, order_id, event_id)
    stored = await read_order(store, order_id) if parked.counted else Stored(Order(order_id))
    return await set_aside(Releases(store, consumer, set_aside_ttl), stored, parked, "dropped by an operator")
