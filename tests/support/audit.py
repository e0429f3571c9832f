"""A second, independent consumer of order events for the tests: it writes one audit record per event.

It shares the orders container with process_order_event and writes behind an inbox marker of its own
consumer name (``write_once``), which is what lets both apply every event once without blocking each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from idempotent_consumer.errors import AlreadySeen, InvalidMessage, TransientStoreError
from idempotent_consumer.identity import derive_id
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.writes import write_once
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import Create, DocumentStore
from idempotent_consumer.records import InboxMarker
from shared.domain.lifecycle import parse_event

AUDIT_CONSUMER = "audit-trail"


def audit_handler(store: DocumentStore, ttl_seconds: int) -> Callable[[InboundMessage], Awaitable[Result]]:
    """A handler (async, as run_delivery awaits it) that records each event once in an audit document."""

    async def handle(message: InboundMessage) -> Result:
        try:
            event = parse_event(message)
        except InvalidMessage as exc:
            return Result(Outcome.INVALID, exc.rule)
        hash_ = event.request_hash()
        record = {
            "id": derive_id("audit", AUDIT_CONSUMER, event.source, event.id),
            "orderId": event.order_id,
            "type": "audit",
            "eventType": event.type,
            "eventId": event.id,
        }
        try:
            marker = InboxMarker.of(event, AUDIT_CONSUMER, hash_, ttl_seconds)
            await write_once(store, marker, [("audit", Create(record))], noun="order")
        except AlreadySeen as seen:
            outcome = Outcome.DUPLICATE if seen.stored_hash == hash_ else Outcome.PAYLOAD_MISMATCH
            return Result(outcome, request_hash=hash_)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, str(exc), hash_)
        return Result(Outcome.APPLIED, request_hash=hash_)

    return handle
