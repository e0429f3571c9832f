"""Operator commands on parked events (``sbctl parked`` in the order app): list them, release one by hand, drop one.

Release applies an event whose predecessor will never come, then what waits behind it; drop sets
one aside for good. Neither deletes what it cannot account for: a dropped event stays, marked dropped.
"""

from __future__ import annotations

from typing import Any

from idempotent_consumer.errors import NotFound, StoreError
from idempotent_consumer.ordered.machine import Machine, Release, Step, Subject
from idempotent_consumer.ordered.writes import Releases, Stored, read_subject, set_aside, waiting
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.ports.store import DocumentStore, query_all
from idempotent_consumer.records import ParkedEvent, ParkedStatus


async def find_parked(store: DocumentStore, consumer: str, key: str | None) -> list[ParkedEvent]:
    """Everything this consumer has parked, for one subject or all, read through every page (rejected and
    dropped ones included, until their ttl ends), by subject and sequence."""
    found = [d for d in await query_all(store, ParkedEvent.KIND, partition_key=key)
             if ParkedEvent.of_consumer(consumer, d)]
    return sorted((ParkedEvent.from_document(d) for d in found), key=lambda p: (p.partition, p.sequence))


async def _one_parked(store: DocumentStore, machine: Machine[Any], consumer: str, key: str,
                      event_id: str) -> ParkedEvent:
    for parked in await find_parked(store, consumer, key):
        if parked.event_id == event_id and parked.status is ParkedStatus.PARKED:
            return parked
    raise NotFound(f"no event {event_id} waits parked against {machine.noun} {key}")


async def force_release(store: DocumentStore, machine: Machine[Any], consumer: str, key: str, event_id: str, *,
                        set_aside_ttl: int) -> Release:
    """Apply a parked event now, its missing predecessors notwithstanding (an operator's decision),
    then what waits behind it, in as many batches as they take. Raise NotFound, or StoreError when the
    subject's state forbids it."""
    noun = machine.noun
    parked = await _one_parked(store, machine, consumer, key, event_id)
    stored = await read_subject(store, machine, key)
    if stored.subject.status is None:
        raise StoreError(f"{noun} {key} is not placed yet; a parked event can only join a placed {noun}")
    event = machine.decode(parked)
    skipped = stored.subject.skip_to(event)
    if skipped.decide(event) is not Outcome.APPLIED:
        raise StoreError(f"{noun} {key} is {stored.subject.status}; {event.type} may not follow")
    others = [p for p in await waiting(store, consumer, key) if p.id != parked.id]
    if earlier := [p.sequence for p in others if p.sequence is None or p.sequence < parked.sequence]:
        raise StoreError(f"versions {earlier} of {noun} {key} are parked before it; release those first")
    rest = skipped.apply(event, parked.data).release(others)
    done = Release(skipped, [Step(parked, event=event), *rest.steps], rest.notes)
    await Releases(store, consumer, set_aside_ttl, machine).by_hand(stored, done)
    return done


async def drop(store: DocumentStore, machine: Machine[Any], consumer: str, key: str, event_id: str, *,
               set_aside_ttl: int) -> ParkedEvent:
    """Set a parked event aside for good (an operator's decision): kept, marked dropped until its ttl ends,
    no longer counted. An event parked uncounted is dropped without reading its subject, which may still not
    decode here."""
    parked = await _one_parked(store, machine, consumer, key, event_id)
    stored = await read_subject(store, machine, key) if parked.counted else Stored(Subject(machine, key))
    return await set_aside(Releases(store, consumer, set_aside_ttl, machine), stored, parked, "dropped by an operator")
