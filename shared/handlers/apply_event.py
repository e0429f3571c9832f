"""The lifecycle-event handler: apply each event exactly once for this consumer, in order, or park it.

An event's identity (``source`` + ``id``) is first taken for its content, subject included, by the create
of an ``EventIdentity`` in a partition of its own: the check holds across orders, so the same key with
other content under another subject is dead-lettered PayloadMismatch, and that order is never touched.
The happy path is then one batch, unread (``EventWrites.apply``): the inbox marker, the order patched on
its version and state (and on nothing parked against it), and the event's record. When the patch does
not hold, the order is read and its aggregate decides (``Order.decide``): stale, an invalid
transition, applied with the parked events it releases, or parked until its predecessor comes. When
the order (or pending order) does not decode here (a newer version broke the additive rule;
docs/design.md, "Schema versions"), or is a document type this version does not know, the event is
parked with the reason, uncounted, and its message completed: retrying would meet the same document
again. A parked event that does not decode does not stop the event: the release stops at it.

A release writes what it decides in as many batches as Cosmos DB's limits take; an order already holding
MAX_PARKED_EVENTS parks no more (LimitExceeded), and one in a terminal status takes no event at all
(InvalidTransition), which would otherwise wait parked for good.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import msgspec

from idempotent_consumer.errors import (
    AlreadyExists,
    AlreadySeen,
    LimitExceeded,
    NotFound,
    OrderChanged,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
)
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result, parsed
from idempotent_consumer.ports.store import MAX_RACES, Delete, Document, DocumentStore
from idempotent_consumer.records import EventIdentity, InboxMarker, ParkedEvent
from shared.domain.aggregate import MAX_PARKED_EVENTS
from shared.domain.lifecycle import parse_event
from shared.handlers.writes import EventWrites, Releases, Stored, read_known, waiting
from shared.settings import Settings


async def apply_order_event(
    message: InboundMessage, store: DocumentStore, settings: Settings, clock: Callable[[], float] = time.time,
    releases: type[Releases] = Releases,
) -> Result:
    """Apply one lifecycle event exactly once for this consumer, in order, or park it until it can be;
    ``releases`` writes what a release decides."""
    event = parsed(message, parse_event)
    if isinstance(event, Result):
        return event
    hash_, consumer = event.request_hash(), settings.consumer_name
    content = msgspec.json.decode(message.body or b"{}")  # an object: parse_event decoded it as one
    writes = EventWrites(releases(store, consumer, settings.parked_set_aside_ttl_seconds),
                         InboxMarker.of(event, consumer, hash_, settings.dedup_ttl_seconds), event, content)
    # The identity is taken before the marker is written, as much as a redelivery or a delayed retry later: it
    # outlives the marker by that much, so that no key is ever checked against a marker alone.
    ttl = (settings.dedup_ttl_seconds
           + settings.servicebus_lock_duration_seconds * settings.servicebus_max_delivery_count
           + (settings.retry_total_seconds if settings.delayed_retries else 0))
    identity_record = EventIdentity.of(event, consumer, hash_, ttl)
    taken: Result | Document | None = None
    try:
        taken = await _take_identity(store, identity_record, message)
        if isinstance(taken, Result):
            return taken
        outcome, description = await _apply(writes, message, clock)
    except AlreadySeen as seen:
        if seen.stored_hash is not None and seen.stored_hash != hash_ and isinstance(taken, dict):
            # This delivery took the identity, and the marker says the event was applied with other content (by the
            # release before identities, which wrote none): the identity goes back, so that the content applied
            # keeps its key and its copies stay duplicates.
            with contextlib.suppress(StoreError):
                await store.execute_batch(identity_record.partition, [Delete(identity_record.id, taken["_etag"])])
        if seen.stored_hash == hash_:
            return await _duplicate(writes.releases, event.order_id, hash_, finish=seen.releasing)
        if seen.stored_hash is None:
            return Result(Outcome.UNREADABLE, f"event {event.source} {event.id} (messageId {message.message_id})"
                                              f" already seen by {consumer}: {seen}; no requestHash reads there to"
                                              f" compare with this delivery's {hash_}; resubmit it once every"
                                              " consumer reads that version", hash_)
        return Result(Outcome.PAYLOAD_MISMATCH, f"event {event.source} {event.id} (messageId {message.message_id})"
                                                f" already seen by {consumer} with requestHash {seen.stored_hash};"
                                                f" this delivery has {hash_}", hash_)
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"store unavailable: {exc}", hash_)
    except LimitExceeded as exc:
        return Result(Outcome.LIMIT_EXCEEDED, f"event {event.id} of order {event.order_id}: {exc} ({exc.limit})",
                      hash_)
    return Result(outcome, description, hash_)


def check_event(message: InboundMessage) -> Result | None:
    """What needs no dependency to decide: the final result of a delivery that is no valid event, else None."""
    verdict = parsed(message, parse_event)
    return verdict if isinstance(verdict, Result) else None


async def _take_identity(store: DocumentStore, record: EventIdentity,
                         message: InboundMessage) -> Result | Document | None:
    """Take the event's identity for this content, before anything of it is written: the record as this delivery
    created it, or None when an earlier delivery of this content took it (a redelivery after a crash goes on to
    apply it);
    PAYLOAD_MISMATCH when it was taken for other content, under another subject say, which is then never
    applied; UNREADABLE when what holds it does not read. The create is the check, across every order's
    partition: of two deliveries of one identity with other contents, one creates it and the other finds it."""
    for _ in range(MAX_RACES):
        try:
            return await store.create(record.to_document())
        except AlreadyExists:
            pass
        try:
            stored = await store.read(record.id, record.partition)
        except NotFound:
            continue  # it expired between the two: take it again
        try:
            found = EventIdentity.from_document(stored)
        except UnreadableDocument as exc:
            if exc.request_hash == record.request_hash:
                return None
            return Result(Outcome.UNREADABLE if exc.request_hash is None else Outcome.PAYLOAD_MISMATCH,
                          f"event {record.event_source} {record.event_id} (messageId {message.message_id}): {exc}",
                          record.request_hash)
        if found.request_hash == record.request_hash:
            return None
        return Result(Outcome.PAYLOAD_MISMATCH,
                      f"event {record.event_source} {record.event_id} (messageId {message.message_id}) already seen"
                      f" by {record.consumer} for subject {found.subject} with requestHash {found.request_hash}; this"
                      f" delivery, for subject {record.subject}, has {record.request_hash}", record.request_hash)
    return Result(Outcome.TRANSIENT, f"event {record.event_source} {record.event_id}: its identity record kept"
                                     " vanishing under us; retry", record.request_hash)


async def _duplicate(releases: Releases, order_id: str, hash_: str, *, finish: bool) -> Result:
    """A delivery of an event already applied or parked. When its marker says its release took more batches
    than one, the release is finished first: a failure between them left the rest to this redelivery."""
    if finish:
        try:
            await releases.finish(order_id)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"finishing the release of order {order_id}: {exc}", hash_)
    return Result(Outcome.DUPLICATE, "", hash_)


async def _apply(writes: EventWrites, message: InboundMessage, clock: Callable[[], float]) -> tuple[Outcome, str]:
    event, store = writes.event, writes.store
    try:
        await writes.apply()
        return Outcome.APPLIED, ""
    except OrderChanged:
        pass  # not at the version before it, or something is parked against it: read the order and decide
    for _ in range(MAX_RACES):
        try:
            return await _decide(writes, message, clock, await read_known(store, event.order_id))
        except UnreadableDocument as exc:
            reason = f"{exc}; parked uncounted, for a version that reads it or an operator"
            await writes.park(None, _parked(writes, message, clock, reason))
            return Outcome.PARKED, f"event {event.id} with sequence {event.sequence}: {reason}"
        except OrderChanged:
            continue  # it changed before our write could land
    return Outcome.TRANSIENT, f"order {event.order_id} kept changing under us; retry"


async def _decide(writes: EventWrites, message: InboundMessage, clock: Callable[[], float],
                  stored: Stored) -> tuple[Outcome, str]:
    """What the aggregate decides for the event on the order as read, written."""
    event, order = writes.event, stored.order
    decision = order.decide(event)
    if decision is Outcome.STALE:
        return decision, f"order {event.order_id} is at version {order.version} >= {event.sequence}"
    if decision is Outcome.INVALID_TRANSITION:
        return decision, f"order {event.order_id} {order.refusal(event)}"
    if decision is Outcome.APPLIED:
        parked = await waiting(writes.store, writes.marker.consumer, event.order_id) if order.parked else []
        done = order.apply(event, writes.data).release(parked)
        await writes.apply_and_release(stored, done)
        return decision, done.describe()
    if order.full:
        return Outcome.LIMIT_EXCEEDED, (f"order {event.order_id} holds {order.parked} parked events, the most one"
                                        f" order may ({MAX_PARKED_EVENTS}); event {event.id} with sequence"
                                        f" {event.sequence} is not parked beside them (the app's limit of parked"
                                        " events per order)")
    if (unknown := order.unknown_status) is not None:
        # Counted, as any event parked against a readable order, so that no later event passes it by its patch.
        await writes.park(stored, _parked(writes, message, clock, unknown, counted=True))
        return decision, f"event {event.id} with sequence {event.sequence}: {unknown}"
    await writes.park(stored, _parked(writes, message, clock))
    return decision, (f"order {event.order_id} is at version {order.version}; event {event.id} with sequence"
                      f" {event.sequence} waits for version {order.version + 1}")


def _parked(writes: EventWrites, message: InboundMessage, clock: Callable[[], float],
            reason: str | None = None, *, counted: bool | None = None) -> ParkedEvent:
    return ParkedEvent.of(writes.event, consumer=writes.marker.consumer, message_id=message.message_id,
                          request_hash=writes.marker.request_hash, now=clock(), content=writes.content,
                          reason=reason, counted=counted)
