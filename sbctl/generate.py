"""Realistic test traffic: valid OrderPlaced bodies and order lifecycle CloudEvents, reproducible by seed."""

from __future__ import annotations

import copy
import random
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

SKUS = ["BOOK-0451", "MUG-STEEL", "TEE-M-BLK", "LAMP-DESK", "PEN-GEL-3", "BAG-TOTE", "CABLE-USBC", "PLANT-FERN"]
CURRENCIES = ["EUR", "USD", "GBP"]
CARRIERS = ["DHL", "UPS", "PostNL", "DPD"]
EVENT_SOURCE = "/sbctl/generator"


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _price(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(99, 19999)) / 100


def order(rng: random.Random, now: datetime | None = None) -> dict[str, Any]:
    """One valid OrderPlaced body: 1-4 items, total = sum of quantity x unit price."""
    lines = [(rng.choice(SKUS), rng.randint(1, 5), _price(rng)) for _ in range(rng.randint(1, 4))]
    items = [{"sku": sku, "quantity": quantity, "unitPrice": str(price)} for sku, quantity, price in lines]
    total = sum((price * quantity for _, quantity, price in lines), Decimal(0))
    placed = (now or datetime.now(UTC)) - timedelta(seconds=rng.randint(0, 3600))
    return {
        "orderId": f"ord-{_uuid(rng)}",
        "customerId": f"cust-{rng.randint(1, 50000):05d}",
        "currency": rng.choice(CURRENCIES),
        "items": items,
        "total": str(total),
        "placedAt": placed.replace(microsecond=0).isoformat().replace("+00:00", "Z"),
    }


def order_events(rng: random.Random, placed: dict[str, Any]) -> list[dict[str, Any]]:
    """The lifecycle of one placed order: captured then shipped, or cancelled (sequence 2, 3, ...)."""
    when = datetime.fromisoformat(str(placed["placedAt"]).replace("Z", "+00:00"))
    kinds: list[tuple[str, dict[str, Any]]]
    if rng.random() < 0.15:
        kinds = [("OrderCancelled", {"reason": rng.choice(["customer request", "payment declined", "fraud check"])})]
    else:
        kinds = [
            ("PaymentCaptured", {"paymentId": f"pay-{_uuid(rng)}", "amount": placed["total"],
                                 "currency": placed["currency"]}),
            ("OrderShipped", {"shipmentId": f"shp-{_uuid(rng)}", "carrier": rng.choice(CARRIERS),
                              "trackingNumber": f"TRK{rng.randint(10**9, 10**10 - 1)}"}),
        ]
    events = []
    for sequence, (name, data) in enumerate(kinds, start=2):
        when += timedelta(minutes=rng.randint(1, 120))
        events.append({
            "specversion": "1.0",
            "id": f"evt-{_uuid(rng)}",
            "source": EVENT_SOURCE,
            "type": f"com.example.orders.{name}",
            "subject": placed["orderId"],
            "time": when.isoformat().replace("+00:00", "Z"),
            "datacontenttype": "application/json",
            "data": {**data, "sequence": sequence},
        })
    return events


def altered(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """The same identity with other content, as a producer reusing an id would send (PayloadMismatch)."""
    changed = copy.deepcopy(body)
    if "specversion" in changed:
        data = changed["data"]
        for key in ("amount", "trackingNumber", "reason"):
            if key in data:
                data[key] = str(Decimal(data[key]) + 1) if key == "amount" else f"{data[key]}-changed"
                break
        return changed
    line = changed["items"][0]
    line["quantity"] += rng.randint(1, 3)
    total = sum((Decimal(i["unitPrice"]) * i["quantity"] for i in changed["items"]), Decimal(0))
    changed["total"] = str(total)
    return changed
