"""The order-event handler: marker, order patch and event record in one transactional batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress

import msgspec

from shared.domain.documents import EventRecord, GapCounter, OrderDocument
from shared.domain.keys import derive_id
from shared.domain.lifecycle import CloudEvent, parse_event
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Outcome, Result
from shared.errors import (
    AlreadyExists,
    BatchFailed,
    InvalidMessage,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from shared.handlers.inbox import Inbox, InboxResult, InboxStatus
from shared.ports.store import BatchOperation, Create, DocumentStore, Patch, Replace
from shared.settings import Settings

PATCH_INDEX = 0  # the order patch precedes the event record, so a version conflict shows first


def apply_order_event(
    message: InboundMessage, store: DocumentStore, settings: Settings, clock: Callable[[], float] = time.time
) -> Result:
    """Apply one lifecycle event exactly once for this consumer, in order, or say why not."""
    try:
        event = parse_event(message)
    except InvalidMessage as exc:
        return Result(Outcome.INVALID, exc.rule)
    applier = _EventApplier(message, event, store, settings)
    try:
        return applier.apply()
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"store unavailable: {exc}", applier.hash)


def event_operations(event: CloudEvent) -> list[BatchOperation]:
    """The event's writes after the marker: the conditional order patch, then the event record."""
    changes, condition = OrderDocument.transition(event)
    return [Patch(event.order_id, changes, condition), Create(EventRecord.of(event).to_document())]


class _EventApplier:
    """One delivery's application; holds what the outcome branches share."""

    def __init__(self, message: InboundMessage, event: CloudEvent, store: DocumentStore, settings: Settings):
        self.message = message
        self.event = event
        self.store = store
        self.settings = settings
        self.hash = event.request_hash()
        self.inbox = Inbox(store, settings.consumer_name, settings.dedup_ttl_seconds)

    def apply(self) -> Result:
        event = self.event
        verdict = self.inbox.apply(
            partition_key=event.order_id,
            dedup_key=(event.source, event.id),
            request_hash=self.hash,
            operations=event_operations(event),
            event=(event.type, event.time_text, event.id),
        )
        return self._interpret(verdict)

    def _interpret(self, verdict: InboxResult) -> Result:
        if verdict.status is InboxStatus.APPLIED:
            return Result(Outcome.APPLIED, request_hash=self.hash)
        if verdict.status is InboxStatus.DUPLICATE:
            return Result(Outcome.DUPLICATE, request_hash=self.hash)
        if verdict.status is InboxStatus.PAYLOAD_MISMATCH:
            return self._result(
                Outcome.PAYLOAD_MISMATCH,
                f"event {self.event.source} {self.event.id} (messageId {self.message.message_id}) already"
                f" applied by {self.inbox.consumer_name} with requestHash {verdict.stored_hash};"
                f" this delivery has {self.hash}",
            )
        if verdict.failed_operation != PATCH_INDEX or not isinstance(verdict.error, (NotFound, PreconditionFailed)):
            raise StoreError(f"event {self.event.id}: operation {verdict.failed_operation} failed: {verdict.error}")
        return self._version_conflict()

    def _version_conflict(self) -> Result:
        event = self.event
        try:
            order = OrderDocument.from_document(self.store.read(event.order_id, event.order_id))
            stored_version, status = order.version, order.status
        except NotFound:
            stored_version, status = 0, "absent"
        if stored_version >= event.sequence:
            return self._result(
                Outcome.STALE, f"order {event.order_id} is at version {stored_version} >= {event.sequence}"
            )
        if stored_version == event.sequence - 1:
            allowed = ", ".join(event.kind.allowed_from)
            return self._result(
                Outcome.INVALID_TRANSITION,
                f"order {event.order_id} is {status}; {event.type} may follow only {allowed}",
            )
        attempt = self._attempt()
        description = (
            f"order {event.order_id} is at version {stored_version}; event {event.id} has sequence"
            f" {event.sequence}; missing version {stored_version + 1} (attempt {attempt})"
        )
        if attempt >= self.settings.out_of_order_max_deliveries:
            return self._result(Outcome.OUT_OF_ORDER, description)
        return self._result(Outcome.GAP, description)

    def _attempt(self) -> int:
        """This delivery's attempt number, 1-based.

        The Python message reports prior failed attempts (the AMQP header), so attempt =
        delivery_count + 1. When the binding does not pass the count, a counter document in the
        order's partition, expiring with the markers, counts the gap deliveries instead. It is
        written only on this path, never on the happy path.
        """
        if self.message.delivery_count is not None:
            return self.message.delivery_count + 1
        event = self.event
        counter = GapCounter(id=derive_id("gap-attempts", self.inbox.consumer_name, event.source, event.id),
                             order_id=event.order_id, attempts=1, ttl=self.inbox.marker_ttl_seconds)
        try:
            self.store.create(counter.to_document())
            return 1
        except AlreadyExists:
            current = GapCounter.from_document(self.store.read(counter.id, event.order_id))
        counted = msgspec.structs.replace(current, attempts=current.attempts + 1)
        with suppress(BatchFailed):  # a concurrent copy counted this round; the count stays advisory
            self.store.execute_batch(event.order_id, [Replace(counted.to_document(), if_match=current.etag)])
        return counted.attempts

    def _result(self, outcome: Outcome, description: str) -> Result:
        return Result(outcome, description, self.hash)
