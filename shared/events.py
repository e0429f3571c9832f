"""Order lifecycle events: CloudEvents 1.0 (structured JSON), their validation, hash and documents."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from shared.errors import InvalidMessage
from shared.fingerprint import canonical_decimal, request_hash
from shared.keys import derive_id
from shared.messages import InboundMessage
from shared.validation import (
    MAX_EXACT_INTEGER,
    parse_json_object,
    require_amount,
    require_cosmos_id,
    require_currency,
    require_object,
    require_string,
    require_timestamp,
)

PAYMENT_CAPTURED = "com.example.orders.PaymentCaptured"
ORDER_SHIPPED = "com.example.orders.OrderShipped"
ORDER_CANCELLED = "com.example.orders.OrderCancelled"


@dataclass(frozen=True)
class EventKind:
    """What an event type does to an order: the document it writes and the transition it makes."""

    document_type: str
    status_after: str
    allowed_from: tuple[str, ...]


# The order state machine. placed -> paid -> shipped; cancelled is terminal; shipping may precede
# payment (cash on delivery). Anything else, e.g. ship or capture after cancel, cancel or capture
# after ship, is an InvalidTransition.
KINDS: dict[str, EventKind] = {
    PAYMENT_CAPTURED: EventKind("payment", "paid", ("placed",)),
    ORDER_SHIPPED: EventKind("shipment", "shipped", ("placed", "paid")),
    ORDER_CANCELLED: EventKind("cancellation", "cancelled", ("placed", "paid")),
}


@dataclass(frozen=True)
class OrderEvent:
    """A validated lifecycle event. Identity is (source, id), as CloudEvents defines it."""

    event_id: str
    source: str
    type: str
    order_id: str
    time_utc: datetime
    sequence: int
    data: Mapping[str, Any]  # the type's fields, canonical spelling

    @property
    def kind(self) -> EventKind:
        """The event's effect on the order."""
        return KINDS[self.type]

    def canonical(self) -> dict[str, Any]:
        """The form hashed into requestHash."""
        return {
            "id": self.event_id,
            "source": self.source,
            "type": self.type,
            "subject": self.order_id,
            "time": self.time_utc.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "sequence": self.sequence,
            "data": dict(self.data),
        }

    def request_hash(self) -> str:
        """sha256 of the canonical form."""
        return request_hash(self.canonical())

    def business_document(self) -> dict[str, Any]:
        """The event's own record (payment, shipment, cancellation). It carries no ttl: it never expires."""
        kind = self.kind
        label = str(self.data.get("paymentId") or self.data.get("shipmentId") or self.order_id)
        return {
            "id": derive_id(kind.document_type, self.source, self.event_id, label=label),
            "orderId": self.order_id,
            "type": kind.document_type,
            "eventId": self.event_id,
            "eventSource": self.source,
            "eventTime": self.canonical()["time"],
            "sequence": self.sequence,
            **self.data,
        }

    def order_changes(self) -> dict[str, Any]:
        """Fields set on the order document when the event applies."""
        return {
            "status": self.kind.status_after,
            "version": self.sequence,
            self.kind.document_type: dict(self.data),
            "updatedAt": self.canonical()["time"],
        }


def parse_event(message: InboundMessage) -> OrderEvent:
    """Validate a lifecycle event delivery; raise InvalidMessage naming the first rule it breaks."""
    if not message.message_id:
        raise InvalidMessage("MessageId is missing; it must equal the event id")
    body = parse_json_object(message.body)
    if body.get("specversion") != "1.0":
        raise InvalidMessage("specversion must be \"1.0\"")
    event_id = require_string(body, "id", max_length=255)
    source = require_string(body, "source", max_length=1024)
    if message.message_id != event_id:
        raise InvalidMessage("MessageId does not equal the event id")
    event_type = body.get("type")
    if not isinstance(event_type, str) or event_type not in KINDS:
        raise InvalidMessage(f"type must be one of {', '.join(sorted(KINDS))}")
    order_id = require_cosmos_id(body, "subject")
    if message.session_id is not None and message.session_id != order_id:
        raise InvalidMessage("SessionId does not equal subject (the orderId)")
    content_type = body.get("datacontenttype", "application/json")
    if content_type != "application/json":
        raise InvalidMessage("datacontenttype must be application/json")
    time_utc = require_timestamp(body, "time").astimezone(UTC)
    data = require_object(body, "data")
    sequence = data.get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int) or not 2 <= sequence <= MAX_EXACT_INTEGER:
        raise InvalidMessage("data.sequence must be an integer of at least 2 (OrderPlaced is version 1)")
    return OrderEvent(
        event_id=event_id,
        source=source,
        type=str(event_type),
        order_id=order_id,
        time_utc=time_utc,
        sequence=sequence,
        data=_parse_data(str(event_type), data),
    )


def _parse_data(event_type: str, data: Mapping[str, Any]) -> dict[str, Any]:
    if event_type == PAYMENT_CAPTURED:
        amount: Decimal = require_amount(data, "amount", "data.")
        return {
            "paymentId": require_string(data, "paymentId", "data.", max_length=255),
            "amount": canonical_decimal(amount),
            "currency": require_currency(data, "currency", "data."),
        }
    if event_type == ORDER_SHIPPED:
        return {
            "shipmentId": require_string(data, "shipmentId", "data.", max_length=255),
            "carrier": require_string(data, "carrier", "data.", max_length=255),
            "trackingNumber": require_string(data, "trackingNumber", "data.", max_length=255),
        }
    return {"reason": require_string(data, "reason", "data.", max_length=1024)}
