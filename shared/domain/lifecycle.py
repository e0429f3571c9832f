"""Order lifecycle events: CloudEvents 1.0 in structured JSON mode, one declared model per event type.

Identity is (source, id), as CloudEvents defines it. Every ``data`` carries ``sequence``: the order's
version after the event (OrderPlaced is version 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

import msgspec

from idempotent_consumer.errors import InvalidMessage
from idempotent_consumer.identity import canonical_decimal, request_hash
from idempotent_consumer.messages import InboundMessage
from shared.domain.orders import utc_text
from shared.domain.rules import MAX_EXACT_INTEGER, Currency, Money, Name, OrderId, Text, Timestamp, decode, timestamp

PAYMENT_CAPTURED = "com.example.orders.PaymentCaptured"
ORDER_SHIPPED = "com.example.orders.OrderShipped"
ORDER_CANCELLED = "com.example.orders.OrderCancelled"

Sequence = Annotated[
    int,
    msgspec.Meta(ge=2, le=MAX_EXACT_INTEGER, description="The order's version after this event; OrderPlaced is 1."),
]


class EventData(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What every event's ``data`` carries."""

    sequence: Sequence

    def canonical(self) -> dict[str, Any]:
        """The type's own fields in one spelling, as stored and hashed (``sequence`` apart)."""
        return {k: v for k, v in msgspec.to_builtins(self).items() if k != "sequence"}

    def kept(self, written: Mapping[str, Any] | None) -> dict[str, Any]:
        """What the event stores, on its order and in its record: the type's own fields in one spelling, and every
        field of ``data`` as its producer wrote it (``written``) that this version does not model, as written:
        a newer producer's or version's, which this version passes on and neither hashes nor reads."""
        known = type(self).__struct_encode_fields__
        return {**{k: v for k, v in (written or {}).items() if k not in known}, **self.canonical()}


class PaymentCapturedData(EventData, frozen=True, kw_only=True, rename="camel"):
    """data of PaymentCaptured."""

    payment_id: Name
    amount: Money
    currency: Currency

    def canonical(self) -> dict[str, Any]:
        """Amount in its canonical spelling, currency upper-cased."""
        return {
            "paymentId": self.payment_id,
            "amount": canonical_decimal(Decimal(self.amount)),
            "currency": self.currency.upper(),
        }


class OrderShippedData(EventData, frozen=True, kw_only=True, rename="camel"):
    """data of OrderShipped."""

    shipment_id: Name
    carrier: Name
    tracking_number: Name


class OrderCancelledData(EventData, frozen=True, kw_only=True, rename="camel"):
    """data of OrderCancelled."""

    reason: Text


class CloudEvent(msgspec.Struct, frozen=True, kw_only=True):
    """The structured-mode CloudEvents envelope. Fields outside the model are ignored."""

    specversion: Annotated[str, msgspec.Meta(pattern=r"^1\.0\Z", description="Must be \"1.0\".")]
    id: Name
    source: Text
    type: str
    subject: Annotated[OrderId, msgspec.Meta(description="The orderId; SessionId must equal it.")]
    time: Timestamp
    datacontenttype: Annotated[str, msgspec.Meta(pattern=r"^application/json\Z")] = "application/json"
    data: EventData

    def __post_init__(self) -> None:
        timestamp(self.time, "$.time")

    @property
    def order_id(self) -> str:
        """The order the event belongs to (``subject``)."""
        return self.subject

    @property
    def sequence(self) -> int:
        """The order's version after this event."""
        return self.data.sequence

    @property
    def time_text(self) -> str:
        """The event time in UTC, as stored and hashed."""
        return utc_text(datetime.fromisoformat(self.time).astimezone(UTC))

    @property
    def kind(self) -> EventKind:
        """The event's effect on the order."""
        return KINDS[self.type]

    def canonical(self) -> dict[str, Any]:
        """The form hashed into requestHash."""
        return {
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "subject": self.subject,
            "time": self.time_text,
            "sequence": self.sequence,
            "data": self.data.canonical(),
        }

    def request_hash(self) -> str:
        """sha256 of the canonical form."""
        return request_hash(self.canonical())


class PaymentCaptured(CloudEvent, frozen=True, kw_only=True):
    """com.example.orders.PaymentCaptured"""

    data: PaymentCapturedData


class OrderShipped(CloudEvent, frozen=True, kw_only=True):
    """com.example.orders.OrderShipped"""

    data: OrderShippedData


class OrderCancelled(CloudEvent, frozen=True, kw_only=True):
    """com.example.orders.OrderCancelled"""

    data: OrderCancelledData


@dataclass(frozen=True)
class EventKind:
    """What an event type does to an order: its model, the record it writes and the transition it makes."""

    model: type[CloudEvent]
    record_type: str
    status_after: str
    allowed_from: tuple[str, ...]


# The order state machine. placed -> paid -> shipped; cancelled is terminal; shipping may precede
# payment (cash on delivery). Anything else, e.g. ship or capture after cancel, cancel or capture
# after ship, is an InvalidTransition.
KINDS: dict[str, EventKind] = {
    PAYMENT_CAPTURED: EventKind(PaymentCaptured, "payment", "paid", ("placed",)),
    ORDER_SHIPPED: EventKind(OrderShipped, "shipment", "shipped", ("placed", "paid")),
    ORDER_CANCELLED: EventKind(OrderCancelled, "cancellation", "cancelled", ("placed", "paid")),
}


# Every status this version knows. An order in another was moved there by a newer version, whose state machine
# this one cannot speak for: its events wait parked for that version or an operator, never decided here.
KNOWN_STATUSES = frozenset({"placed", *(k.status_after for k in KINDS.values())})
# The statuses no event may follow (shipped and cancelled): an event for an order in one of them can never
# apply, in turn or not.
TERMINAL_STATUSES = frozenset({"placed", *(k.status_after for k in KINDS.values())}) - {
    status for kind in KINDS.values() for status in kind.allowed_from}
# What an order's reservation and its announced outcome may not contradict. A cancelled order takes neither: stock
# held for it, or OrderAccepted, would contradict the cancellation. A shipped order's stock may still be reserved
# and its OrderAccepted announced (its goods left: it was accepted), but never OrderRejected. (Placed and paid take
# all three.)
CANCELLED = "cancelled"
RESERVABLE_STATUSES = KNOWN_STATUSES - {CANCELLED}
OPEN_STATUSES = KNOWN_STATUSES - TERMINAL_STATUSES  # an OrderRejected may be announced only in these


class _Head(msgspec.Struct, frozen=True):
    type: Annotated[str, msgspec.Meta(max_length=255)]


def parse_event(message: InboundMessage) -> CloudEvent:
    """Validate a lifecycle event delivery; raise InvalidMessage naming the first rule it breaks."""
    if not message.message_id:
        raise InvalidMessage("MessageId is missing; it must equal the event id")
    head = decode(message.body, _Head)
    kind = KINDS.get(head.type)
    if kind is None:
        raise InvalidMessage(f"Expected type to be one of {', '.join(sorted(KINDS))} - at `$.type`")
    event = decode(message.body, kind.model)
    if message.message_id != event.id:
        raise InvalidMessage("MessageId does not equal the event id")
    if message.session_id is not None and message.session_id != event.subject:
        raise InvalidMessage("SessionId does not equal subject (the orderId)")
    return event
