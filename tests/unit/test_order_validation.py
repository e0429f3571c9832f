"""Every validation rule of an OrderPlaced delivery, and the rule named when it fails."""

from __future__ import annotations

import json

import pytest

from idempotent_consumer.errors import InvalidMessage, LimitExceeded
from shared.domain.orders import parse_order
from shared.domain.rules import MAX_BODY_BYTES
from tests.support.orders import inbound, order_body, rule_path


def rule_for(message) -> str:
    with pytest.raises(InvalidMessage) as caught:
        parse_order(message)
    return caught.value.rule


def test_valid_order_parses_with_upper_case_currency() -> None:
    order = parse_order(inbound(order_body("ord-1", currency="eur")))
    assert order.order_id == "ord-1"
    assert order.currency_code == "EUR"
    assert [i.quantity for i in order.items] == [2, 1]


def test_missing_message_id_is_invalid() -> None:
    assert "MessageId is missing" in rule_for(inbound(order_body("ord-1"), message_id=None))


def test_message_id_must_equal_order_id() -> None:
    assert rule_for(inbound(order_body("ord-1"), message_id="ord-2")) == "MessageId does not equal orderId"


@pytest.mark.parametrize("bad_id", ["a/b", "a\\b", "a?b", "a#b", "x" * 129, "", "   "])
def test_order_id_must_be_a_valid_cosmos_id(bad_id: str) -> None:
    rule = rule_for(inbound(order_body("o", orderId=bad_id), message_id=bad_id or "m"))
    assert rule_path(rule) == "$.orderId"


def test_order_id_of_128_characters_the_most_a_message_id_holds_is_accepted() -> None:
    order_id = "x" * 128
    assert parse_order(inbound(order_body(order_id))).order_id == order_id


def test_items_must_not_be_empty() -> None:
    assert rule_for(inbound(order_body("o", items=[], total="0"))) == "Expected `array` of length >= 1 - at `$.items`"


@pytest.mark.parametrize("quantity", [0, -1, 1.5, 2.0, "2", True, None, 2**53])
def test_quantity_must_be_a_positive_integer(quantity: object) -> None:
    body = order_body("o", items=[{"sku": "S", "quantity": quantity, "unitPrice": "1"}], total="1")
    assert rule_path(rule_for(inbound(body))) == "$.items[0].quantity"


@pytest.mark.parametrize("price", ["-1.00", "abc", "1e3", 1.5, "NaN", "1.", ".5", "1" * 19, "1.00\n", " 1"])
def test_unit_price_must_be_a_decimal_string_at_least_zero(price: object) -> None:
    body = order_body("o", items=[{"sku": "S", "quantity": 1, "unitPrice": price}], total="1")
    assert rule_path(rule_for(inbound(body))) == "$.items[0].unitPrice"


def test_free_item_is_accepted() -> None:
    body = order_body("o", items=[{"sku": "S", "quantity": 3, "unitPrice": "0.00"}], total="0")
    assert parse_order(inbound(body)).total == "0"


def test_total_must_equal_sum_of_quantity_times_price() -> None:
    rule = rule_for(inbound(order_body("o", total="44.97")))
    assert rule == "Expected total to equal the sum of quantity x unitPrice over the items - at `$.total`"


def test_total_compares_as_decimal_not_text() -> None:
    assert parse_order(inbound(order_body("o", total="44.980"))).total == "44.980"


@pytest.mark.parametrize("currency", ["EU", "EURO", "E1R", 978, "€UR", None])
def test_currency_must_be_three_letters(currency: object) -> None:
    assert rule_path(rule_for(inbound(order_body("o", currency=currency)))) == "$.currency"


@pytest.mark.parametrize("placed_at", ["yesterday", "2026-11-30T09:15:00", 1700000000])
def test_placed_at_must_be_a_timestamp_with_offset(placed_at: object) -> None:
    assert rule_path(rule_for(inbound(order_body("o", placedAt=placed_at)))) == "$.placedAt"


def test_customer_id_is_required() -> None:
    body = order_body("o")
    del body["customerId"]
    assert rule_path(rule_for(inbound(body))) == "$.customerId"


def test_body_must_be_utf8() -> None:
    assert rule_for(inbound(b"\xff\xfe{}", message_id="o")).startswith("body is not UTF-8 JSON")


def test_body_must_be_json() -> None:
    assert rule_for(inbound(b"{not json", message_id="o")).startswith("body is not UTF-8 JSON")


def test_body_must_be_an_object() -> None:
    assert rule_for(inbound(b"[1, 2]", message_id="o")) == "Expected `object`, got `array`"


def test_deeply_nested_body_is_invalid_not_a_crash() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    assert rule_for(inbound(body, message_id="o")) == "Expected `object`, got `array`"


def test_number_with_thousands_of_digits_is_invalid_not_a_crash() -> None:
    unknown_field = b'{"orderId": "o", "n": ' + b"9" * 5000 + b"}"
    assert rule_path(rule_for(inbound(unknown_field, message_id="o"))) == "$.customerId"
    body = order_body("o", items=[{"sku": "S", "quantity": 1, "unitPrice": "1"}], total="1")
    huge = json.dumps(body).replace('"quantity": 1', '"quantity": ' + "9" * 5000).encode()
    assert rule_for(inbound(huge, message_id="o")) == "Integer value out of range - at `$.items[0].quantity`"


def test_a_body_of_256_kb_is_read_and_one_byte_more_is_past_the_limit() -> None:
    body = order_body("o")
    padding = MAX_BODY_BYTES - len(json.dumps({**body, "padding": ""}).encode())
    at_limit = json.dumps({**body, "padding": "x" * padding}).encode()
    assert len(at_limit) == MAX_BODY_BYTES and parse_order(inbound(at_limit, message_id="o")).order_id == "o"
    over = json.dumps({**body, "padding": "x" * (padding + 1)}).encode()
    with pytest.raises(LimitExceeded) as caught:
        parse_order(inbound(over, message_id="o"))
    assert "at most 262144" in str(caught.value) and "256 KB" in caught.value.limit


def test_body_without_data_section_is_invalid() -> None:
    message = inbound(order_body("o"))
    message = type(message)(message_id="o", body=None)
    assert rule_for(message) == "body must be a data section holding UTF-8 JSON"
