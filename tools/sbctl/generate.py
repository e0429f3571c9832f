"""Realistic test traffic: valid OrderPlaced bodies and order lifecycle CloudEvents, reproducible by seed.

Every message is built as the core's model of it and checked against all of that model's rules
before it becomes a JSON body, so the traffic is valid by construction.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec
from msgspec.structs import replace

from sbctl.connection import ToolError
from shared.adapters.reservations import SOLD_OUT_PREFIX
from shared.domain.lifecycle import (
    KINDS,
    ORDER_CANCELLED,
    ORDER_SHIPPED,
    PAYMENT_CAPTURED,
    CloudEvent,
    EventData,
    OrderCancelledData,
    OrderShippedData,
    PaymentCapturedData,
)
from shared.domain.orders import OrderLine, OrderPlaced

SKUS = ["BOOK-0451", "MUG-STEEL", "TEE-M-BLK", "LAMP-DESK", "PEN-GEL-3", "BAG-TOTE", "CABLE-USBC", "PLANT-FERN"]
CURRENCIES = ["EUR", "USD", "GBP"]
CARRIERS = ["DHL", "UPS", "PostNL", "DPD"]
CANCEL_REASONS = ["customer request", "payment declined", "fraud check"]
EVENT_SOURCE = "/sbctl/generator"


def order(rng: random.Random, now: datetime | None = None) -> dict[str, Any]:
    """One valid OrderPlaced body: 1-4 items, total = sum of quantity x unit price."""
    items = [OrderLine(sku=rng.choice(SKUS), quantity=rng.randint(1, 5), unit_price=_price(rng))
             for _ in range(rng.randint(1, 4))]
    placed = (now or datetime.now(UTC)) - timedelta(seconds=rng.randint(0, 3600))
    return _body(OrderPlaced(
        order_id=f"ord-{uuid_from(rng)}",
        customer_id=f"cust-{rng.randint(1, 50000):05d}",
        currency=rng.choice(CURRENCIES),
        items=items,
        total=_total(items),
        placed_at=_text(placed.replace(microsecond=0)),
    ))


def sold_out(body: dict[str, Any]) -> dict[str, Any]:
    """The order with its first line's sku one the fulfilment stand-in (and fake) is out of stock of: its
    reservation is refused for good, so the order ends rejected (OrderRejected) rather than accepted."""
    first, *rest = body["items"]
    return {**body, "items": [{**first, "sku": SOLD_OUT_PREFIX + first["sku"]}, *rest]}


def is_sold_out(body: dict[str, Any]) -> bool:
    """Whether the order holds a sku the stand-in is out of stock of."""
    return any(str(item.get("sku", "")).startswith(SOLD_OUT_PREFIX) for item in body.get("items", []))


def order_events(rng: random.Random, placed: dict[str, Any]) -> list[dict[str, Any]]:
    """The lifecycle of one placed order: captured then shipped, or cancelled (sequence 2, 3, ...)."""
    placed_order = msgspec.convert(placed, OrderPlaced)
    when = datetime.fromisoformat(placed_order.placed_at)
    events = []
    for event_type, data in _lifecycle(rng, placed_order):
        when += timedelta(minutes=rng.randint(1, 120))
        events.append(_body(KINDS[event_type].model(
            specversion="1.0",
            id=f"evt-{uuid_from(rng)}",
            source=EVENT_SOURCE,
            type=event_type,
            subject=placed_order.order_id,
            time=_text(when),
            data=data,
        )))
    return events


def altered(rng: random.Random, body: dict[str, Any], *, subject: str | None = None) -> dict[str, Any]:
    """The same identity with other content, as a producer reusing an id would send (PayloadMismatch); for an
    event, with ``subject``, for another order: the same ``source`` and ``id`` under that subject."""
    message = _decoded(body)
    if isinstance(message, CloudEvent):
        return _body(replace(message, data=_changed(message.data), subject=subject or message.subject))
    first, *rest = message.items
    items = [replace(first, quantity=first.quantity + rng.randint(1, 3)), *rest]
    return _body(replace(message, items=items, total=_total(items)))


def _lifecycle(rng: random.Random, placed: OrderPlaced) -> list[tuple[str, EventData]]:
    """What happens to an order after it is placed: the type and data of each event, in sequence."""
    if rng.random() < 0.15:
        return [(ORDER_CANCELLED, OrderCancelledData(sequence=2, reason=rng.choice(CANCEL_REASONS)))]
    payment = PaymentCapturedData(sequence=2, payment_id=f"pay-{uuid_from(rng)}", amount=placed.total,
                                  currency=placed.currency)
    shipment = OrderShippedData(sequence=3, shipment_id=f"shp-{uuid_from(rng)}", carrier=rng.choice(CARRIERS),
                                tracking_number=f"TRK{rng.randint(10**9, 10**10 - 1)}")
    return [(PAYMENT_CAPTURED, payment), (ORDER_SHIPPED, shipment)]


def _changed(data: EventData) -> EventData:
    """The same event data with one business field changed."""
    if isinstance(data, PaymentCapturedData):
        return replace(data, amount=str(Decimal(data.amount) + 1))
    if isinstance(data, OrderShippedData):
        return replace(data, tracking_number=f"{data.tracking_number}-changed")
    if isinstance(data, OrderCancelledData):
        return replace(data, reason=f"{data.reason}-changed")
    raise TypeError(f"no change defined for {type(data).__name__}")


def _decoded(body: dict[str, Any]) -> OrderPlaced | CloudEvent:
    """A body as its model; ToolError if it breaks the model, since no valid change of it exists."""
    try:
        return msgspec.convert(body, _model(body))
    except msgspec.ValidationError as exc:
        raise ToolError(f"cannot reuse the id of an invalid message: {exc}") from None


def _model(body: dict[str, Any]) -> type[OrderPlaced | CloudEvent]:
    """OrderPlaced, or the event model the body's type names."""
    if "specversion" not in body:
        return OrderPlaced
    kind = KINDS.get(str(body.get("type")))
    if kind is None:
        raise ToolError(f"cannot reuse the id of an event of unknown type {body.get('type')!r}")
    return kind.model


def _body(message: OrderPlaced | CloudEvent) -> dict[str, Any]:
    """The JSON body of a message, checked against the constraints that construction does not check."""
    body: dict[str, Any] = msgspec.to_builtins(message)
    msgspec.convert(body, type(message))
    return body


def _total(items: list[OrderLine]) -> str:
    return str(sum((Decimal(i.unit_price) * i.quantity for i in items), Decimal(0)))


def _price(rng: random.Random) -> str:
    return str(Decimal(rng.randint(99, 19999)) / 100)


def uuid_from(rng: random.Random) -> str:
    """A version-4 UUID drawn from ``rng``, so that traffic replays by seed."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _text(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
