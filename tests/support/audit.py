"""A second, independent consumer of order events for the tests: it writes one audit record per event.

It shares the orders container with process_order_event and uses the same Inbox piece under its own
consumer name, which is what lets both apply every event once without blocking each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from shared.domain.keys import derive_id
from shared.domain.lifecycle import parse_event
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Outcome, Result
from shared.errors import InvalidMessage, TransientStoreError
from shared.handlers.inbox import Inbox, InboxStatus
from shared.ports.store import Create, DocumentStore

AUDIT_CONSUMER = "audit-trail"
_OUTCOMES = {
    InboxStatus.APPLIED: Outcome.APPLIED,
    InboxStatus.DUPLICATE: Outcome.DUPLICATE,
    InboxStatus.PAYLOAD_MISMATCH: Outcome.PAYLOAD_MISMATCH,
}


def audit_handler(store: DocumentStore, ttl_seconds: int) -> Callable[[InboundMessage], Awaitable[Result]]:
    """A handler (async, as run_delivery awaits it) that records each event once in an audit document."""
    inbox = Inbox(store, AUDIT_CONSUMER, ttl_seconds)

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
            verdict = await inbox.apply(partition_key=event.order_id, dedup_key=(event.source, event.id),
                                  request_hash=hash_, operations=[Create(record)])
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, str(exc), hash_)
        return Result(_OUTCOMES.get(verdict.status, Outcome.ERROR), request_hash=hash_)

    return handle
