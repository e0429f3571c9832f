"""The order-event handler: marker, order patch and business document in one transactional batch."""

from __future__ import annotations

from contextlib import suppress

from shared.errors import AlreadyExists, BatchFailed, InvalidMessage, NotFound, StoreError, TransientStoreError
from shared.events import OrderEvent, parse_event
from shared.inbox import Inbox, InboxResult, InboxStatus
from shared.keys import derive_id
from shared.messages import InboundMessage
from shared.outcomes import Outcome, Result
from shared.settings import EventSettings
from shared.store import BatchOperation, Create, DocumentStore, Patch, Replace

PATCH_INDEX = 0  # the order patch precedes the business document, so a version conflict shows first
GAP_COUNTER_TYPE = "gap-attempts"


def apply_order_event(message: InboundMessage, store: DocumentStore, settings: EventSettings) -> Result:
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


def event_operations(event: OrderEvent) -> list[BatchOperation]:
    """The event's writes after the marker: the conditional order patch, then the business document."""
    condition = {"version": event.sequence - 1, "status": event.kind.allowed_from}
    return [Patch(event.order_id, event.order_changes(), condition), Create(event.business_document())]


class _EventApplier:
    """One delivery's application; holds what the outcome branches share."""

    def __init__(self, message: InboundMessage, event: OrderEvent, store: DocumentStore, settings: EventSettings):
        self.message = message
        self.event = event
        self.store = store
        self.settings = settings
        self.hash = event.request_hash()
        self.inbox = Inbox(store, settings.consumer_name, settings.retention.dedup_ttl_seconds)

    def apply(self) -> Result:
        event = self.event
        verdict = self.inbox.apply(
            partition_key=event.order_id,
            dedup_key=(event.source, event.event_id),
            request_hash=self.hash,
            operations=event_operations(event),
            marker_fields={"eventType": event.type, "eventTime": event.canonical()["time"], "eventId": event.event_id},
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
                f"event {self.event.source} {self.event.event_id} (messageId {self.message.message_id}) already"
                f" applied by {self.inbox.consumer_name} with requestHash {verdict.stored_hash};"
                f" this delivery has {self.hash}",
            )
        if verdict.failed_operation != PATCH_INDEX or verdict.failed_status not in (404, 412):
            raise StoreError(
                f"event {self.event.event_id}: operation {verdict.failed_operation} failed"
                f" with HTTP {verdict.failed_status}",
                status=verdict.failed_status,
            )
        return self._version_conflict()

    def _version_conflict(self) -> Result:
        event = self.event
        try:
            order = self.store.read(event.order_id, event.order_id)
            stored_version, status = int(order.get("version", 0)), str(order.get("status"))
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
            f"order {event.order_id} is at version {stored_version}; event {event.event_id} has sequence"
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
        counter_id = derive_id(GAP_COUNTER_TYPE, self.inbox.consumer_name, event.source, event.event_id)
        counter = {
            "id": counter_id,
            self.store.partition_key_field: event.order_id,
            "type": GAP_COUNTER_TYPE,
            "attempts": 1,
            "ttl": self.inbox.marker_ttl_seconds,
        }
        try:
            self.store.create(counter)
            return 1
        except AlreadyExists:
            current = self.store.read(counter_id, event.order_id)
        attempts = int(current.get("attempts", 0)) + 1
        with suppress(BatchFailed):  # a concurrent copy counted this round; the count stays advisory
            self.store.execute_batch(
                event.order_id, [Replace({**counter, "attempts": attempts}, if_match=current["_etag"])]
            )
        return attempts

    def _result(self, outcome: Outcome, description: str) -> Result:
        return Result(outcome, description, self.hash)
