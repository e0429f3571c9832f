"""Builders for order lifecycle CloudEvents used across the tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED

SOURCE = "/orders/checkout"

DATA: dict[str, dict[str, Any]] = {
    PAYMENT_CAPTURED: {"paymentId": "pay-1", "amount": "44.98", "currency": "EUR"},
    ORDER_SHIPPED: {"shipmentId": "shp-1", "carrier": "DHL", "trackingNumber": "JD0001"},
    ORDER_CANCELLED: {"reason": "customer request"},
}


def event_body(order_id: str, sequence: int, event_type: str = PAYMENT_CAPTURED, *, event_id: str | None = None,
               source: str = SOURCE, **data: Any) -> dict[str, Any]:
    """A valid structured-mode CloudEvent for an order; keyword arguments override data fields."""
    return {
        "specversion": "1.0",
        "id": event_id or f"evt-{uuid.uuid4()}",
        "source": source,
        "type": event_type,
        "subject": order_id,
        "time": "2026-11-30T10:00:00Z",
        "datacontenttype": "application/json",
        "data": {**DATA[event_type], "sequence": sequence, **data},
    }


def encode_event(body: dict[str, Any]) -> bytes:
    """JSON-encode an event."""
    return json.dumps(body).encode("utf-8")
