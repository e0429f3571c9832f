"""The committed JSON Schemas are the models' own, and say what the consumer accepts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sbctl import schemas
from tests.support.events import DATA, event_body
from tests.support.orders import order_body

ROOT = Path(__file__).resolve().parents[2]


def committed(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((ROOT / "schemas" / name).read_text())
    return result


@pytest.mark.parametrize("name", sorted(schemas.rendered()))
def test_committed_schema_is_not_stale(name: str) -> None:
    assert (ROOT / "schemas" / name).read_text() == schemas.rendered()[name], "run: python -m sbctl schemas"


def test_there_is_no_committed_schema_without_a_model() -> None:
    assert {p.name for p in (ROOT / "schemas").glob("*.json")} == set(schemas.rendered())


def test_a_valid_order_passes_its_schema_and_a_broken_one_fails() -> None:
    schema = committed("order-placed.schema.json")
    jsonschema.validate(order_body("ord-1"), schema)
    broken: Mapping[str, object]
    for broken in ({"currency": "EURO"}, {"total": 44.98}, {"orderId": "a/b"}, {"items": []}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(order_body("ord-1", **broken), schema)


@pytest.mark.parametrize("event_type", sorted(DATA))
def test_each_event_passes_its_own_schema_only(event_type: str) -> None:
    file_of = {"com.example.orders.PaymentCaptured": "payment-captured", "com.example.orders.OrderShipped":
               "order-shipped", "com.example.orders.OrderCancelled": "order-cancelled"}
    body = event_body("ord-1", 2, event_type)
    for other, name in file_of.items():
        schema = committed(f"{name}.schema.json")
        if other == event_type:
            jsonschema.validate(body, schema)
        else:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(body, schema)
