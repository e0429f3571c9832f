"""The order-event handler: marker, order patch and event record in one transactional batch.

The happy path is one request: the inbox marker, the order's patch on the condition "version is the
one before, the state allows it, nothing is parked", and the event record. When the condition fails
the order is read once and the resequencer decides: stale, invalid transition, applied with the
parked successors it releases, or parked until its predecessor comes. Nothing here abandons to wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shared.domain.documents import EventRecord, OrderDocument, ParkedEvent
from shared.domain.lifecycle import CloudEvent, parse_event
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Outcome, Result
from shared.errors import InvalidMessage, NotFound, PreconditionFailed, StoreError, TransientStoreError
from shared.handlers.inbox import Inbox, InboxResult, InboxStatus
from shared.handlers.resequencer import Stored, read_order, release, waiting
from shared.ports.store import BatchOperation, Create, DocumentStore, Patch, Replace
from shared.settings import Settings

PATCH_INDEX = 0  # the order patch precedes the event record, so a version conflict shows first
MAX_RACES = 5  # how often the order may change between our read and our write before we give up


async def apply_order_event(
    message: InboundMessage, store: DocumentStore, settings: Settings, clock: Callable[[], float] = time.time
) -> Result:
    """Apply one lifecycle event exactly once for this consumer, in order, or park it until it can be."""
    try:
        event = parse_event(message)
    except InvalidMessage as exc:
        return Result(Outcome.INVALID, exc.rule)
    applier = _EventApplier(message, event, store, settings, clock)
    try:
        return await applier.apply()
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"store unavailable: {exc}", applier.hash)


def event_operations(event: CloudEvent) -> list[BatchOperation]:
    """The event's writes after the marker: the conditional order patch, then the event record."""
    changes, condition = OrderDocument.transition(event)
    return [Patch(event.order_id, changes, condition), Create(EventRecord.of(event).to_document())]


class _EventApplier:
    """One delivery's application; holds what the outcome branches share."""

    def __init__(self, message: InboundMessage, event: CloudEvent, store: DocumentStore, settings: Settings,
                 clock: Callable[[], float]) -> None:
        self.message = message
        self.event = event
        self.store = store
        self.consumer = settings.consumer_name
        self.clock = clock
        self.hash = event.request_hash()
        self.inbox = Inbox(store, settings.consumer_name, settings.dedup_ttl_seconds)

    async def apply(self) -> Result:
        verdict = await self._write(event_operations(self.event))
        if (seen := self._seen(verdict, Outcome.APPLIED, "")) is not None:
            return seen
        if verdict.failed_operation != PATCH_INDEX or not isinstance(verdict.error, (NotFound, PreconditionFailed)):
            raise StoreError(f"event {self.event.id}: operation {verdict.failed_operation} failed: {verdict.error}")
        for _ in range(MAX_RACES):
            result = await self._resequence(await read_order(self.store, self.event.order_id))
            if result is not None:
                return result
        return self._result(Outcome.TRANSIENT, f"order {self.event.order_id} kept changing under us; retry")

    async def _resequence(self, stored: Stored) -> Result | None:
        """Decide on the order as read; None when it changed before our write could land."""
        event = self.event
        if stored.foreign:
            raise StoreError(f"document {event.order_id} is neither an order nor a pending order")
        if stored.version >= event.sequence:
            return self._result(Outcome.STALE, f"order {event.order_id} is at version {stored.version}"
                                               f" >= {event.sequence}")
        if stored.order is not None and stored.version == event.sequence - 1:
            if not stored.order.allows(event):
                allowed = ", ".join(event.kind.allowed_from)
                return self._result(Outcome.INVALID_TRANSITION, f"order {event.order_id} is {stored.order.status};"
                                                                f" {event.type} may follow only {allowed}")
            return await self._apply_and_release(stored.order)
        parked = ParkedEvent.of(event, consumer=self.consumer, message_id=self.message.message_id,
                                request_hash=self.hash, now=self.clock())
        verdict = await self._write([Create(parked.to_document()), stored.with_one_more_parked(event.order_id)])
        description = (f"order {event.order_id} is at version {stored.version}; event {event.id} with sequence"
                       f" {event.sequence} waits for version {stored.version + 1}")
        return self._seen(verdict, Outcome.PARKED, description)

    async def _apply_and_release(self, order: OrderDocument) -> Result | None:
        event = self.event
        parked = await waiting(self.store, self.consumer, event.order_id) if order.parked else []
        done = release(order.applied(event), parked)
        verdict = await self._write([Replace(done.order.to_document(), order.etag),
                               Create(EventRecord.of(event).to_document()), *done.operations])
        return self._seen(verdict, Outcome.APPLIED, done.describe())

    async def _write(self, operations: list[BatchOperation]) -> InboxResult:
        event = self.event
        return await self.inbox.apply(partition_key=event.order_id, dedup_key=(event.source, event.id),
                                request_hash=self.hash, operations=operations,
                                event=(event.type, event.time_text, event.id))

    def _seen(self, verdict: InboxResult, written: Outcome, description: str) -> Result | None:
        """The outcome of a write: ``written`` if it landed, duplicate or mismatch on the marker, None on a race."""
        if verdict.status is InboxStatus.APPLIED:
            return self._result(written, description)
        if verdict.status is InboxStatus.DUPLICATE:
            return self._result(Outcome.DUPLICATE, "")
        if verdict.status is InboxStatus.PAYLOAD_MISMATCH:
            return self._result(
                Outcome.PAYLOAD_MISMATCH,
                f"event {self.event.source} {self.event.id} (messageId {self.message.message_id}) already"
                f" seen by {self.inbox.consumer_name} with requestHash {verdict.stored_hash};"
                f" this delivery has {self.hash}",
            )
        return None

    def _result(self, outcome: Outcome, description: str) -> Result:
        return Result(outcome, description, self.hash)
