"""Ordered processing's handler: apply each event exactly once for this consumer, in order, or park it.

An event's identity (``source`` + ``id``) is first taken for its content, subject included, by the create
of an ``EventIdentity`` in a partition of its own: the check holds across subjects, so the same key with
other content under another subject is dead-lettered PayloadMismatch, and that subject is never touched.
The happy path is then one batch, unread (``EventWrites.apply``): the inbox marker, the subject patched on
its version and state (and on nothing parked against it), and the event's record if the machine keeps one
apart from the event's sub-object (the order app keeps none). When the patch does
not hold, the subject is read and the machine decides (``Subject.decide``): stale, an invalid
transition, applied with the parked events it releases, or parked until its predecessor comes. When
the subject (or its placeholder) does not decode here (a newer version broke the additive rule;
docs/design.md, "Schema versions"), or is a document type this version does not know, the event is
parked with the reason, uncounted, and its message completed: retrying would meet the same document
again. A parked event that does not decode does not stop the event: the release stops at it.

A release writes what it decides in as many batches as Cosmos DB's limits take; a subject already holding
the machine's ``max_parked`` events parks no more (LimitExceeded), and one in a terminal status takes no
event at all (InvalidTransition), which would otherwise wait parked for good.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from idempotent_consumer.errors import (
    AlreadyExists,
    AlreadySeen,
    InvalidMessage,
    LimitExceeded,
    NotFound,
    OrderChanged,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
)
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.machine import MAX_SUB_OBJECTS, Machine
from idempotent_consumer.ordered.writes import EventWrites, Releases, Stored, read_known, waiting
from idempotent_consumer.outcomes import Outcome, Result, parsed
from idempotent_consumer.ports.store import MAX_RACES, Delete, Document, DocumentStore
from idempotent_consumer.records import EventIdentity, InboxMarker, ParkedEvent


@dataclass(frozen=True)
class Ordered:
    """One consumer's ordered processing of one machine's events.

    ``dedup_ttl`` is the inbox marker's ttl; ``identity_ttl`` the event identity's, which must outlive the
    marker by as much as a redelivery or a delayed retry may come later (the consumer's lock duration times its
    MaxDeliveryCount, and the delayed retries' total), so that no key is ever checked against a marker alone.
    ``set_aside_ttl`` keeps a rejected or dropped parked event for operators. ``releases`` writes what a release
    decides (a test may hand in one that fails between batches).
    """

    machine: Machine[Any]
    consumer: str
    dedup_ttl: int
    identity_ttl: int
    set_aside_ttl: int
    releases: type[Releases] = Releases
    clock: Callable[[], float] = field(default=time.time)

    def __post_init__(self) -> None:
        if len(self.machine.sub_objects) > MAX_SUB_OBJECTS:
            raise ValueError(f"machine {type(self.machine).__name__} has {len(self.machine.sub_objects)} sub-objects;"
                             f" the ordered mode takes at most {MAX_SUB_OBJECTS}, so that one patch of a release"
                             " stays inside Cosmos DB's 10 operations")

    def check(self, message: InboundMessage) -> Result | None:
        """What needs no dependency to decide: the final result of a delivery that is no valid event, else None."""
        return check(self.machine, message)

    async def apply(self, message: InboundMessage, store: DocumentStore) -> Result:
        """Apply one event exactly once for this consumer, in order, or park it until it can be."""
        event = parsed(message, functools.partial(_read, self.machine))
        if isinstance(event, Result):
            return event
        hash_, consumer, noun = event.request_hash(), self.consumer, self.machine.noun
        try:
            content = msgspec.json.decode(message.body or b"{}")
        except msgspec.DecodeError:
            content = None
        if not isinstance(content, dict):  # its parked copy keeps it as its producer wrote it: a JSON object
            return Result(Outcome.INVALID, "the ordered mode takes an event whose body is a JSON object (structured"
                                           " mode)", hash_)
        writes = EventWrites(self.releases(store, consumer, self.set_aside_ttl, self.machine),
                             InboxMarker.of(event, consumer, hash_, self.dedup_ttl), event, content)
        identity_record = EventIdentity.of(event, consumer, hash_, self.identity_ttl)
        taken: Result | Document | None = None
        try:
            taken = await _take_identity(store, identity_record, message)
            if isinstance(taken, Result):
                return taken
            outcome, description = await _apply(writes, message, self.clock)
        except AlreadySeen as seen:
            if seen.stored_hash is not None and seen.stored_hash != hash_ and isinstance(taken, dict):
                # This delivery took the identity, and the marker says the event was applied with other content (by
                # the release before identities, which wrote none): the identity goes back, so that the content
                # applied keeps its key and its copies stay duplicates.
                with contextlib.suppress(StoreError):
                    await store.execute_batch(identity_record.partition, [Delete(identity_record.id, taken["_etag"])])
            if seen.stored_hash == hash_:
                return await _duplicate(writes.releases, event.subject, hash_, finish=seen.releasing)
            if seen.stored_hash is None:
                return Result(Outcome.UNREADABLE, f"event {event.source} {event.id} (messageId {message.message_id})"
                                                  f" already seen by {consumer}: {seen}; no requestHash reads there"
                                                  f" to compare with this delivery's {hash_}; resubmit it once every"
                                                  " consumer reads that version", hash_)
            return Result(Outcome.PAYLOAD_MISMATCH, f"event {event.source} {event.id} (messageId"
                                                    f" {message.message_id}) already seen by {consumer} with"
                                                    f" requestHash {seen.stored_hash}; this delivery has {hash_}",
                          hash_)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"store unavailable: {exc}", hash_)
        except LimitExceeded as exc:
            return Result(Outcome.LIMIT_EXCEEDED, f"event {event.id} of {noun} {event.subject}: {exc} ({exc.limit})",
                          hash_)
        return Result(outcome, description, hash_)


def check(machine: Machine[Any], message: InboundMessage) -> Result | None:
    """What needs no dependency to decide: the final result of a delivery that is no valid event, else None."""
    verdict = parsed(message, functools.partial(_read, machine))
    return verdict if isinstance(verdict, Result) else None


def _read(machine: Machine[Any], message: InboundMessage) -> Any:
    """The machine's event, or InvalidMessage: what the machine's ``parse`` raised besides InvalidMessage (a
    decoder's error, say) is named by its type alone, never a value of the message."""
    try:
        return machine.parse(message)
    except (InvalidMessage, LimitExceeded):
        raise
    except Exception as exc:
        raise InvalidMessage(f"the {machine.noun}'s event could not be read: {type(exc).__name__}") from exc


async def _take_identity(store: DocumentStore, record: EventIdentity,
                         message: InboundMessage) -> Result | Document | None:
    """Take the event's identity for this content, before anything of it is written: the record as this delivery
    created it, or None when an earlier delivery of this content took it (a redelivery after a crash goes on to
    apply it); PAYLOAD_MISMATCH when it was taken for other content, under another subject say, which is then
    never applied; UNREADABLE when what holds it does not read. The create is the check, across every subject's
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


async def _duplicate(releases: Releases, key: str, hash_: str, *, finish: bool) -> Result:
    """A delivery of an event already applied or parked. When its marker says its release took more batches
    than one, the release is finished first: a failure between them left the rest to this redelivery."""
    if finish:
        try:
            await releases.finish(key)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"finishing the release of {releases.part} {key}: {exc}", hash_)
    return Result(Outcome.DUPLICATE, "", hash_)


async def _apply(writes: EventWrites, message: InboundMessage, clock: Callable[[], float]) -> tuple[Outcome, str]:
    event, store, machine = writes.event, writes.store, writes.releases.machine
    try:
        await writes.apply()
        return Outcome.APPLIED, ""
    except OrderChanged:
        pass  # not at the version before it, or something is parked against it: read the subject and decide
    for _ in range(MAX_RACES):
        try:
            return await _decide(writes, message, clock, await read_known(store, machine, event.subject))
        except UnreadableDocument as exc:
            reason = f"{exc}; parked uncounted, for a version that reads it or an operator"
            await writes.park(None, _parked(writes, message, clock, reason))
            return Outcome.PARKED, f"event {event.id} with sequence {event.sequence}: {reason}"
        except OrderChanged:
            continue  # it changed before our write could land
    return Outcome.TRANSIENT, f"{machine.noun} {event.subject} kept changing under us; retry"


async def _decide(writes: EventWrites, message: InboundMessage, clock: Callable[[], float],
                  stored: Stored) -> tuple[Outcome, str]:
    """What the machine decides for the event on the subject as read, written."""
    event, subject, noun = writes.event, stored.subject, writes.releases.part
    decision = subject.decide(event)
    if decision is Outcome.STALE:
        return decision, f"{noun} {event.subject} is at version {subject.version} >= {event.sequence}"
    if decision is Outcome.INVALID_TRANSITION:
        return decision, f"{noun} {event.subject} {subject.refusal(event)}"
    if decision is Outcome.APPLIED:
        parked = await waiting(writes.store, writes.marker.consumer, event.subject) if subject.parked else []
        done = subject.apply(event, writes.data).release(parked)
        await writes.apply_and_release(stored, done)
        return decision, done.describe()
    if subject.full:
        return Outcome.LIMIT_EXCEEDED, (f"{noun} {event.subject} holds {subject.parked} parked events, the most one"
                                        f" {noun} may ({subject.machine.max_parked}); event {event.id} with sequence"
                                        f" {event.sequence} is not parked beside them (the app's limit of parked"
                                        f" events per {noun})")
    if (unknown := subject.unknown_status) is not None:
        # Counted, as any event parked against a readable subject, so that no later event passes it by its patch.
        await writes.park(stored, _parked(writes, message, clock, unknown, counted=True))
        return decision, f"event {event.id} with sequence {event.sequence}: {unknown}"
    await writes.park(stored, _parked(writes, message, clock))
    return decision, (f"{noun} {event.subject} is at version {subject.version}; event {event.id} with sequence"
                      f" {event.sequence} waits for version {subject.version + 1}")


def _parked(writes: EventWrites, message: InboundMessage, clock: Callable[[], float],
            reason: str | None = None, *, counted: bool | None = None) -> ParkedEvent:
    return ParkedEvent.of(writes.event, consumer=writes.marker.consumer, message_id=message.message_id,
                          request_hash=writes.marker.request_hash, now=clock(), content=writes.content,
                          reason=reason, counted=counted)
