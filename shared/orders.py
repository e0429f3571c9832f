"""The OrderPlaced message: validation, canonical form and the order document."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any

from shared.errors import InvalidMessage
from shared.fingerprint import canonical_decimal, request_hash
from shared.messages import InboundMessage
from shared.validation import (
    parse_json_object,
    require_amount,
    require_cosmos_id,
    require_currency,
    require_positive_int,
    require_string,
    require_timestamp,
)

ORDER_DOCUMENT_TYPE = "order"
MAX_ITEMS = 1000


@dataclass(frozen=True)
class OrderItem:
    """One order line; amounts keep the producer's spelling, the hash uses the canonical one."""

    sku: str
    quantity: int
    unit_price: str


@dataclass(frozen=True)
class Order:
    """A validated OrderPlaced body."""

    order_id: str
    customer_id: str
    currency: str
    items: tuple[OrderItem, ...]
    total: str
    placed_at: str
    placed_at_utc: datetime

    def canonical(self) -> dict[str, Any]:
        """The form hashed into requestHash: one spelling per value, independent of formatting."""
        return {
            "orderId": self.order_id,
            "customerId": self.customer_id,
            "currency": self.currency,
            "items": [
                {"sku": i.sku, "quantity": i.quantity, "unitPrice": canonical_decimal(Decimal(i.unit_price))}
                for i in self.items
            ],
            "total": canonical_decimal(Decimal(self.total)),
            "placedAt": _utc_text(self.placed_at_utc),
        }

    def request_hash(self) -> str:
        """sha256 of the canonical form."""
        return request_hash(self.canonical())


def parse_order(message: InboundMessage) -> Order:
    """Validate an OrderPlaced delivery; raise InvalidMessage naming the first rule it breaks."""
    if not message.message_id:
        raise InvalidMessage("MessageId is missing; it must equal orderId")
    body = parse_json_object(message.body)
    order_id = require_cosmos_id(body, "orderId")
    if message.message_id != order_id:
        raise InvalidMessage("MessageId does not equal orderId")
    customer_id = require_string(body, "customerId", max_length=255)
    currency = require_currency(body, "currency")
    items = _parse_items(body.get("items"))
    total = require_amount(body, "total")
    with localcontext() as exact:
        exact.prec = 80  # wide enough that 18+10-digit prices times 2^53 quantities never round
        computed = sum((Decimal(i.quantity) * Decimal(i.unit_price) for i in items), Decimal(0))
    if computed != total:
        raise InvalidMessage("total does not equal the sum of quantity x unitPrice over the items")
    placed_at_utc = require_timestamp(body, "placedAt").astimezone(UTC)
    return Order(
        order_id=order_id,
        customer_id=customer_id,
        currency=currency,
        items=items,
        total=str(body["total"]),
        placed_at=str(body["placedAt"]),
        placed_at_utc=placed_at_utc,
    )


def _parse_items(raw: object) -> tuple[OrderItem, ...]:
    if not isinstance(raw, list):
        raise InvalidMessage("items must be a JSON array")
    if not raw:
        raise InvalidMessage("items must hold at least one item")
    if len(raw) > MAX_ITEMS:
        raise InvalidMessage(f"items holds more than {MAX_ITEMS} items")
    parsed = []
    for index, item in enumerate(raw):
        where = f"items[{index}]."
        if not isinstance(item, dict):
            raise InvalidMessage(f"items[{index}] must be a JSON object")
        sku = require_string(item, "sku", where, max_length=255)
        quantity = require_positive_int(item, "quantity", where)
        require_amount(item, "unitPrice", where)
        parsed.append(OrderItem(sku=sku, quantity=quantity, unit_price=item["unitPrice"]))
    return tuple(parsed)


def order_document(order: Order, message: InboundMessage, hash_: str) -> dict[str, Any]:
    """Build the order document: id = orderId = MessageId, the order fields, status and metadata."""
    return {
        "id": order.order_id,
        "orderId": order.order_id,
        "type": ORDER_DOCUMENT_TYPE,
        "customerId": order.customer_id,
        "currency": order.currency,
        "items": [{"sku": i.sku, "quantity": i.quantity, "unitPrice": i.unit_price} for i in order.items],
        "total": order.total,
        "placedAt": order.placed_at,
        "status": "placed",
        "version": 1,
        "requestHash": hash_,
        "messageId": message.message_id,
        "correlationId": message.correlation_id,
        "enqueuedTimeUtc": _utc_text(message.enqueued_time_utc) if message.enqueued_time_utc else None,
        "deliveryCount": message.delivery_count,
    }


def _utc_text(moment: datetime) -> str:
    if moment.tzinfo is None:  # the broker's times are UTC; a naive value means UTC, not local time
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
