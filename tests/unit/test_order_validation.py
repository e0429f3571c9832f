"""Every validation rule of an OrderPlaced delivery, and the rule named when it fails."""

from __future__ import annotations

import json

import pytest

from shared.errors import InvalidMessage
from shared.orders import parse_order
from shared.validation import MAX_BODY_BYTES
from tests.support.orders import inbound, order_body


def rule_for(message) -> str:
    with pytest.raises(InvalidMessage) as caught:
        parse_order(message)
    return caught.value.rule


def test_valid_order_parses_with_upper_case_currency() -> None:
    order = parse_order(inbound(order_body("ord-1", currency="eur")))
    assert order.order_id == "ord-1"
    assert order.currency == "EUR"
    assert [i.quantity for i in order.items] == [2, 1]


def test_missing_message_id_is_invalid() -> None:
    assert "MessageId is missing" in rule_for(inbound(order_body("ord-1"), message_id=None))


def test_message_id_must_equal_order_id() -> None:
    assert rule_for(inbound(order_body("ord-1"), message_id="ord-2")) == "MessageId does not equal orderId"


@pytest.mark.parametrize("bad_id", ["a/b", "a\\b", "a?b", "a#b", "x" * 256, "", "   "])
def test_order_id_must_be_a_valid_cosmos_id(bad_id: str) -> None:
    rule = rule_for(inbound(order_body("o", orderId=bad_id), message_id=bad_id or "m"))
    assert rule.startswith("orderId")


def test_order_id_of_255_characters_is_accepted() -> None:
    order_id = "x" * 255
    assert parse_order(inbound(order_body(order_id))).order_id == order_id


def test_items_must_not_be_empty() -> None:
    assert rule_for(inbound(order_body("o", items=[], total="0"))) == "items must hold at least one item"


@pytest.mark.parametrize("quantity", [0, -1, 1.5, 2.0, "2", True, None, 2**53])
def test_quantity_must_be_a_positive_integer(quantity: object) -> None:
    body = order_body("o", items=[{"sku": "S", "quantity": quantity, "unitPrice": "1"}], total="1")
    assert rule_for(inbound(body)).startswith("items[0].quantity")


@pytest.mark.parametrize("price", ["-1.00", "abc", "1e3", 1.5, "NaN", "1.", ".5", "1" * 19])
def test_unit_price_must_be_a_decimal_string_at_least_zero(price: object) -> None:
    body = order_body("o", items=[{"sku": "S", "quantity": 1, "unitPrice": price}], total="1")
    assert rule_for(inbound(body)).startswith("items[0].unitPrice")


def test_free_item_is_accepted() -> None:
    body = order_body("o", items=[{"sku": "S", "quantity": 3, "unitPrice": "0.00"}], total="0")
    assert parse_order(inbound(body)).total == "0"


def test_total_must_equal_sum_of_quantity_times_price() -> None:
    assert "does not equal the sum" in rule_for(inbound(order_body("o", total="44.97")))


def test_total_compares_as_decimal_not_text() -> None:
    assert parse_order(inbound(order_body("o", total="44.980"))).total == "44.980"


@pytest.mark.parametrize("currency", ["EU", "EURO", "E1R", 978, "€UR", None])
def test_currency_must_be_three_letters(currency: object) -> None:
    assert rule_for(inbound(order_body("o", currency=currency))).startswith("currency")


@pytest.mark.parametrize("placed_at", ["yesterday", "2026-11-30T09:15:00", 1700000000])
def test_placed_at_must_be_a_timestamp_with_offset(placed_at: object) -> None:
    assert rule_for(inbound(order_body("o", placedAt=placed_at))).startswith("placedAt")


def test_customer_id_is_required() -> None:
    body = order_body("o")
    del body["customerId"]
    assert rule_for(inbound(body)).startswith("customerId")


def test_body_must_be_utf8() -> None:
    assert rule_for(inbound(b"\xff\xfe{}", message_id="o")) == "body is not valid UTF-8"


def test_body_must_be_json() -> None:
    assert rule_for(inbound(b"{not json", message_id="o")) == "body is not valid JSON"


def test_body_must_be_an_object() -> None:
    assert rule_for(inbound(b"[1, 2]", message_id="o")) == "body must be a JSON object"


def test_deeply_nested_body_is_invalid_not_a_crash() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    assert rule_for(inbound(body, message_id="o")) in {"body is nested too deeply to parse", "body is not valid JSON"}


def test_number_with_thousands_of_digits_is_invalid_not_a_crash() -> None:
    body = b'{"orderId": "o", "n": ' + b"9" * 5000 + b"}"
    assert rule_for(inbound(body, message_id="o")) == "body is not valid JSON"


def test_body_over_256_kb_is_invalid() -> None:
    body = order_body("o", padding="x" * MAX_BODY_BYTES)
    assert "at most 262144" in rule_for(inbound(json.dumps(body).encode(), message_id="o"))


def test_body_without_data_section_is_invalid() -> None:
    message = inbound(order_body("o"))
    message = type(message)(message_id="o", body=None)
    assert rule_for(message) == "body must be a data section holding UTF-8 JSON"
