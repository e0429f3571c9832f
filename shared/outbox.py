"""The transactional outbox: an OrderAccepted message written with the order, published afterwards.

The outbox document is created in the same transactional batch as the order, in its partition, so
the order never exists without its message nor the message without its order. The publisher sends
pending documents (from the change feed, and from the sweep for anything the feed missed) and then
marks them dispatched with a ttl. A crash between send and mark resends the same MessageId, which the
destination's duplicate detection and its consumers' idempotency absorb.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.errors import BatchFailed, ConsumerError
from shared.keys import derive_id, idempotency_key
from shared.messages import InboundMessage
from shared.messaging import MessageSender, OutgoingMessage
from shared.orders import Order
from shared.store import Document, DocumentStore, Replace

OUTBOX_TYPE = "outbox"
ORDER_ACCEPTED = "OrderAccepted"
PENDING = "pending"
DISPATCHED = "dispatched"

logger = logging.getLogger("idempotent_consumer.outbox")


def outbox_document(
    order: Order, message: InboundMessage, *, consumer: str, destination: str, requires_session: bool, now: float
) -> Document:
    """The pending OrderAccepted outbox document for a newly created order."""
    return {
        "id": derive_id(OUTBOX_TYPE, consumer, ORDER_ACCEPTED, order.order_id, label=ORDER_ACCEPTED),
        "orderId": order.order_id,
        "type": OUTBOX_TYPE,
        "status": PENDING,
        "destination": destination,
        "messageId": idempotency_key(consumer, ORDER_ACCEPTED, order.order_id),
        "correlationId": message.correlation_id,
        "sessionId": order.order_id if requires_session else None,
        "subject": ORDER_ACCEPTED,
        "payload": {
            "orderId": order.order_id,
            "customerId": order.customer_id,
            "currency": order.currency,
            "total": order.total,
            "placedAt": order.placed_at,
        },
        "createdAt": now,
    }


def outgoing_message(document: Mapping[str, Any]) -> OutgoingMessage:
    """The message an outbox document stands for."""
    return OutgoingMessage(
        message_id=str(document["messageId"]),
        body=json.dumps(document["payload"], separators=(",", ":")).encode("utf-8"),
        correlation_id=document.get("correlationId"),
        session_id=document.get("sessionId"),
        subject=document.get("subject"),
        application_properties={"type": str(document.get("subject"))},
    )


@dataclass(frozen=True)
class PublishReport:
    """What one publisher run did, by outbox document id."""

    dispatched: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: int = 0


class OutboxPublisher:
    """Sends pending outbox documents and marks them dispatched."""

    def __init__(
        self,
        store: DocumentStore,
        sender: MessageSender,
        *,
        dispatched_ttl_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._sender = sender
        self._ttl = dispatched_ttl_seconds
        self._clock = clock

    def publish(self, documents: Iterable[Mapping[str, Any]]) -> PublishReport:
        """Publish the pending outbox documents among ``documents`` (a change-feed batch holds others too).

        A document that fails is logged and left pending for the next change or the sweep.
        """
        dispatched, failed, skipped = [], [], 0
        for document in documents:
            if document.get("type") != OUTBOX_TYPE or document.get("status") != PENDING:
                skipped += 1
                continue
            try:
                self._publish_one(document)
                dispatched.append(str(document["id"]))
            except ConsumerError as exc:
                logger.warning("outbox %s not published: %s; left pending", document.get("id"), exc,
                               extra={"outboxId": document.get("id"), "orderId": document.get("orderId")})
                failed.append(str(document["id"]))
        return PublishReport(tuple(dispatched), tuple(failed), skipped)

    def sweep(self, *, stuck_after_seconds: int, limit: int = 100) -> PublishReport:
        """Find pending outbox documents older than the threshold and publish them."""
        cutoff = self._clock() - stuck_after_seconds
        stuck = self._store.query({"type": OUTBOX_TYPE, "status": PENDING}, before=("createdAt", cutoff), limit=limit)
        if stuck:
            logger.warning("sweep found %d stuck outbox documents", len(stuck), extra={"stuck": len(stuck)})
        return self.publish(stuck)

    def _publish_one(self, document: Mapping[str, Any]) -> None:
        self._sender.send(str(document["destination"]), [outgoing_message(document)])
        marked = {k: v for k, v in document.items() if not k.startswith("_")}
        marked.update(status=DISPATCHED, dispatchedAt=self._clock(), ttl=self._ttl)
        try:
            self._store.execute_batch(str(document["orderId"]), [Replace(marked, if_match=document.get("_etag"))])
        except BatchFailed as exc:
            if exc.status != 412:
                raise
            # Changed since this copy was read: another publisher dispatched it. Resending was harmless.
        logger.info("outbox %s dispatched messageId=%s", document["id"], document["messageId"],
                    extra={"outboxId": document["id"], "messageId": document["messageId"]})
