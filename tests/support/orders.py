"""Builders for OrderPlaced bodies and inbound messages used across the tests."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from idempotent_consumer.messages import InboundMessage


def order_body(order_id: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid OrderPlaced body; keyword overrides replace top-level fields."""
    body: dict[str, Any] = {
        "orderId": order_id or f"ord-{uuid.uuid4()}",
        "customerId": "cust-42",
        "currency": "EUR",
        "items": [
            {"sku": "SKU-1", "quantity": 2, "unitPrice": "19.99"},
            {"sku": "SKU-2", "quantity": 1, "unitPrice": "5.00"},
        ],
        "total": "44.98",
        "placedAt": "2026-11-30T09:15:00Z",
    }
    body.update(overrides)
    return body


def encode(body: Any) -> bytes:
    """JSON-encode a body the way a producer would."""
    return json.dumps(body).encode("utf-8")


def inbound(body: Any, *, message_id: str | None = "", delivery_count: int = 0, **kw: Any) -> InboundMessage:
    """An InboundMessage whose MessageId defaults to the body's orderId."""
    if message_id == "":
        message_id = body.get("orderId") if isinstance(body, dict) else None
    raw = body if isinstance(body, bytes) else encode(body)
    return InboundMessage(
        message_id=message_id,
        body=raw,
        correlation_id=kw.pop("correlation_id", "corr-1"),
        delivery_count=delivery_count,
        enqueued_time_utc=kw.pop("enqueued_time_utc", datetime(2026, 11, 30, 9, 15, 1, tzinfo=UTC)),
        **kw,
    )


_AT = re.compile(r" - at `(?P<path>[^`]+)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def rule_path(rule: str) -> str:
    """The field path an InvalidMessage rule names, such as ``$.items[0].quantity``."""
    at = _AT.search(rule)
    base = at["path"] if at else "$"
    missing = _MISSING.search(rule)
    return f"{base}.{missing['field']}" if missing else base
