"""Request hashes of messages already stored never change: these were computed by the code before the
msgspec models (commit 98193d3) and must come out the same from the models that replaced it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from idempotent_consumer.messages import InboundMessage
from shared.domain.lifecycle import parse_event
from shared.domain.orders import parse_order

ORDERS: list[tuple[dict[str, Any], str]] = [
    ({"orderId": "ord-1", "customerId": "c-1", "currency": "EUR",
      "items": [{"sku": "A", "quantity": 2, "unitPrice": "19.99"}], "total": "39.98",
      "placedAt": "2026-11-30T09:00:00Z"},
     "172b1bcc8f9225e154da5bab2f4de42f8e19205873a4939c365879aae5788a70"),
    ({"orderId": "ord-2", "customerId": "cust-ü", "currency": "usd",
      "items": [{"sku": "B", "quantity": 3, "unitPrice": "0.100"}, {"sku": "C", "quantity": 1, "unitPrice": "5"}],
      "total": "5.30", "placedAt": "2026-11-30T10:00:00.123456+01:00", "extra": "ignored"},
     "a9e0a8c9a09277f2ccdfdd5da174da9f9bc278f556efa0bf17703ebc7d80ee7d"),
    ({"orderId": "ord-3", "customerId": "c", "currency": "GBP",
      "items": [{"sku": "Z", "quantity": 9007199254740991, "unitPrice": "0"}], "total": "0.000",
      "placedAt": "2026-01-01 00:00:00-05:30"},
     "9ab2d7e8b85f127e282be0ff5cdfefbc830241559eac365a747b8666e76b1aed"),
]
EVENTS: list[tuple[dict[str, Any], str]] = [
    ({"specversion": "1.0", "id": "e-1", "source": "/orders", "type": "com.example.orders.PaymentCaptured",
      "subject": "ord-1", "time": "2026-11-30T10:00:00Z",
      "data": {"paymentId": "p-1", "amount": "39.980", "currency": "eur", "sequence": 2}},
     "078f34e5217a032c6cd6e2a974c441000bd5bd54ef381de483773425712bccf4"),
    ({"specversion": "1.0", "id": "e-2", "source": "/orders", "type": "com.example.orders.OrderShipped",
      "subject": "ord-1", "time": "2026-11-30T11:00:00+02:00", "datacontenttype": "application/json",
      "data": {"shipmentId": "s-1", "carrier": "DHL", "trackingNumber": "T1", "sequence": 3}},
     "06a222bce994fe452d342ab7690bd9b1287c2b61e01bef6daa670bc5253989fa"),
    ({"specversion": "1.0", "id": "e-3", "source": "/orders", "type": "com.example.orders.OrderCancelled",
      "subject": "ord-2", "time": "2026-11-30T12:00:00.5Z", "data": {"reason": "changed mind", "sequence": 2}},
     "c1ff143bdfeca742052ffefe5cd2ccdeb2ed5117eaf8d4ceaee0fb7074cfb583"),
]


@pytest.mark.parametrize(("body", "expected"), ORDERS, ids=[b["orderId"] for b, _ in ORDERS])
def test_order_hash_is_unchanged(body: dict[str, Any], expected: str) -> None:
    message = InboundMessage(message_id=body["orderId"], body=json.dumps(body).encode())
    assert parse_order(message).request_hash() == expected


@pytest.mark.parametrize(("body", "expected"), EVENTS, ids=[b["id"] for b, _ in EVENTS])
def test_event_hash_is_unchanged(body: dict[str, Any], expected: str) -> None:
    message = InboundMessage(message_id=body["id"], body=json.dumps(body).encode())
    assert parse_event(message).request_hash() == expected
