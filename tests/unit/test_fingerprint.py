"""The request hash ignores formatting, key order and decimal spelling, and nothing else."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from idempotent_consumer.identity import canonical_decimal
from shared.domain.orders import parse_order
from tests.support.orders import inbound, order_body


def hash_of(raw: bytes, message_id: str = "ord-1") -> str:
    return parse_order(inbound(raw, message_id=message_id)).request_hash()


def test_hash_is_sha256_hex() -> None:
    digest = hash_of(json.dumps(order_body("ord-1")).encode())
    assert len(digest) == 64
    int(digest, 16)


def test_formatting_and_key_order_do_not_change_the_hash() -> None:
    body = order_body("ord-1")
    compact = json.dumps(body, separators=(",", ":")).encode()
    pretty = json.dumps(dict(reversed(list(body.items()))), indent=4).encode()
    assert hash_of(compact) == hash_of(pretty)


def test_equal_decimal_spellings_hash_equally() -> None:
    a = order_body("ord-1", items=[{"sku": "S", "quantity": 2, "unitPrice": "19.99"}], total="39.98")
    b = order_body("ord-1", items=[{"sku": "S", "quantity": 2, "unitPrice": "19.990"}], total="39.980")
    assert hash_of(json.dumps(a).encode()) == hash_of(json.dumps(b).encode())


def test_equal_instants_in_other_offsets_hash_equally() -> None:
    a = order_body("ord-1", placedAt="2026-11-30T09:15:00Z")
    b = order_body("ord-1", placedAt="2026-11-30T10:15:00+01:00")
    assert hash_of(json.dumps(a).encode()) == hash_of(json.dumps(b).encode())


@pytest.mark.parametrize(
    "change",
    [
        {"customerId": "cust-43"},
        {"currency": "USD"},
        {"placedAt": "2026-11-30T09:15:01Z"},
        {"items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "19.99"}, {"sku": "SKU-3", "quantity": 1,
                                                                            "unitPrice": "5.00"}]},
    ],
)
def test_any_content_change_changes_the_hash(change: dict) -> None:
    base = order_body("ord-1")
    assert hash_of(json.dumps(base).encode()) != hash_of(json.dumps({**base, **change}).encode())


@pytest.mark.parametrize(
    ("value", "expected"),
    [("39.980", "39.98"), ("40.00", "40"), ("0.000", "0"), ("100", "100"), ("0.10", "0.1"), ("-0.0", "0")],
)
def test_canonical_decimal_spells_each_value_one_way(value: str, expected: str) -> None:
    assert canonical_decimal(Decimal(value)) == expected
