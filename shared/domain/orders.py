"""The OrderPlaced message: its declared model, the rules beyond the model, and its canonical form."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Annotated, Any

import msgspec

from idempotent_consumer.errors import InvalidMessage
from idempotent_consumer.identity import canonical_decimal, request_hash
from idempotent_consumer.messages import InboundMessage
from shared.domain.rules import MAX_EXACT_INTEGER, Currency, Money, Name, OrderId, Timestamp, decode, timestamp

MAX_ITEMS = 1000


class OrderLine(msgspec.Struct, frozen=True, rename="camel"):
    """One order line; the price keeps the producer's spelling, the hash uses the canonical one."""

    sku: Name
    quantity: Annotated[
        int, msgspec.Meta(ge=1, le=MAX_EXACT_INTEGER, description="A JSON integer from 1 to 2^53-1.")
    ]
    unit_price: Money


class OrderPlaced(msgspec.Struct, frozen=True, rename="camel"):
    """An OrderPlaced body. Fields outside the model are ignored: neither stored nor hashed.

    Beyond the declared fields: ``total`` must equal the sum of quantity x unitPrice, compared as
    decimals, and ``placedAt`` must carry a time-zone offset. ``currency`` is stored upper-cased.
    """

    order_id: OrderId
    customer_id: Name
    currency: Currency
    items: Annotated[list[OrderLine], msgspec.Meta(min_length=1, max_length=MAX_ITEMS)]
    total: Annotated[Money, msgspec.Meta(description="Must equal the sum of quantity x unitPrice over the items.")]
    placed_at: Timestamp

    def __post_init__(self) -> None:
        timestamp(self.placed_at, "$.placedAt")
        with localcontext() as exact:
            exact.prec = 80  # wide enough that 18+10-digit prices times 2^53 quantities never round
            computed = sum((Decimal(i.quantity) * Decimal(i.unit_price) for i in self.items), Decimal(0))
        if computed != Decimal(self.total):
            raise ValueError("Expected total to equal the sum of quantity x unitPrice over the items - at `$.total`")

    @property
    def placed_at_utc(self) -> datetime:
        """placedAt in UTC."""
        return datetime.fromisoformat(self.placed_at).astimezone(UTC)

    @property
    def currency_code(self) -> str:
        """The currency as stored: upper-cased."""
        return self.currency.upper()

    def canonical(self) -> dict[str, Any]:
        """The form hashed into requestHash: one spelling per value, independent of formatting."""
        return {
            "orderId": self.order_id,
            "customerId": self.customer_id,
            "currency": self.currency_code,
            "items": [
                {"sku": i.sku, "quantity": i.quantity, "unitPrice": canonical_decimal(Decimal(i.unit_price))}
                for i in self.items
            ],
            "total": canonical_decimal(Decimal(self.total)),
            "placedAt": utc_text(self.placed_at_utc),
        }

    def request_hash(self) -> str:
        """sha256 of the canonical form."""
        return request_hash(self.canonical())


def parse_order(message: InboundMessage) -> OrderPlaced:
    """Validate an OrderPlaced delivery; raise InvalidMessage naming the first rule it breaks."""
    if not message.message_id:
        raise InvalidMessage("MessageId is missing; it must equal orderId")
    order = decode(message.body, OrderPlaced)
    if message.message_id != order.order_id:
        raise InvalidMessage("MessageId does not equal orderId")
    return order


def utc_text(moment: datetime) -> str:
    """A UTC ISO 8601 text with microseconds and a Z; a naive time is taken as UTC (the broker's are)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
