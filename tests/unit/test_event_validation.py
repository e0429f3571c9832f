"""Validation of order lifecycle CloudEvents, and their request hash."""

from __future__ import annotations

import json

import pytest

from idempotent_consumer.errors import InvalidMessage
from idempotent_consumer.messages import InboundMessage
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED, parse_event
from tests.support.events import encode_event, event_body
from tests.support.orders import rule_path


def message(body: dict | bytes, *, message_id: str | None = "", session_id: str | None = None) -> InboundMessage:
    if message_id == "" and isinstance(body, dict):
        message_id = body["id"]
    raw = body if isinstance(body, bytes) else encode_event(body)
    return InboundMessage(message_id=message_id, body=raw, session_id=session_id)


def rule_for(msg: InboundMessage) -> str:
    with pytest.raises(InvalidMessage) as caught:
        parse_event(msg)
    return caught.value.rule


@pytest.mark.parametrize("event_type", [PAYMENT_CAPTURED, ORDER_SHIPPED, ORDER_CANCELLED])
def test_each_event_type_parses(event_type: str) -> None:
    event = parse_event(message(event_body("ord-1", 2, event_type), session_id="ord-1"))
    assert (event.order_id, event.sequence, event.type) == ("ord-1", 2, event_type)


def test_missing_message_id_is_invalid() -> None:
    assert "MessageId is missing" in rule_for(message(event_body("o", 2), message_id=None))


def test_message_id_must_equal_the_event_id() -> None:
    assert rule_for(message(event_body("o", 2), message_id="other")) == "MessageId does not equal the event id"


@pytest.mark.parametrize("field", ["id", "source"])
def test_identity_fields_are_required(field: str) -> None:
    body = event_body("o", 2)
    body[field] = ""
    assert rule_path(rule_for(message(body, message_id="m"))) == f"$.{field}"


def test_session_must_be_the_order() -> None:
    assert "SessionId" in rule_for(message(event_body("o", 2), session_id="another-order"))


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"specversion": "0.3"}, "$.specversion"),
        ({"type": "com.example.orders.OrderPlaced"}, "$.type"),
        ({"type": ["com.example.orders.OrderShipped"]}, "$.type"),
        ({"type": {"name": 1}}, "$.type"),
        ({"subject": "a/b"}, "$.subject"),
        ({"time": "tomorrow"}, "$.time"),
        ({"datacontenttype": "text/xml"}, "$.datacontenttype"),
        ({"data": [1]}, "$.data"),
    ],
)
def test_envelope_rules(change: dict, path: str) -> None:
    body = {**event_body("o", 2), **change}
    assert rule_path(rule_for(message(body))) == path


def test_unknown_type_names_the_types_allowed() -> None:
    rule = rule_for(message({**event_body("o", 2), "type": "com.example.orders.OrderPlaced"}))
    assert rule.startswith(f"Expected type to be one of {ORDER_CANCELLED}")


@pytest.mark.parametrize("sequence", [1, 0, -3, "2", 2.0, True, None])
def test_sequence_must_be_an_integer_of_at_least_two(sequence: object) -> None:
    body = event_body("o", 2)
    body["data"]["sequence"] = sequence
    assert rule_path(rule_for(message(body))) == "$.data.sequence"


@pytest.mark.parametrize(
    ("event_type", "field", "value"),
    [
        (PAYMENT_CAPTURED, "amount", "-1"),
        (PAYMENT_CAPTURED, "amount", 10),
        (PAYMENT_CAPTURED, "currency", "EURO"),
        (PAYMENT_CAPTURED, "paymentId", ""),
        (ORDER_SHIPPED, "carrier", None),
        (ORDER_SHIPPED, "trackingNumber", 42),
        (ORDER_CANCELLED, "reason", ""),
    ],
)
def test_data_rules_per_type(event_type: str, field: str, value: object) -> None:
    body = event_body("o", 2, event_type)
    body["data"][field] = value
    assert rule_path(rule_for(message(body))) == f"$.data.{field}"


def test_hash_ignores_formatting_and_amount_spelling() -> None:
    body = event_body("o", 2, event_id="e-1")
    respelled = event_body("o", 2, event_id="e-1", amount="44.980")
    a = parse_event(message(json.dumps(body, indent=2).encode(), message_id="e-1")).request_hash()
    b = parse_event(message(respelled)).request_hash()
    assert a == b


def test_hash_changes_with_content() -> None:
    a = parse_event(message(event_body("o", 2, event_id="e-1"))).request_hash()
    b = parse_event(message(event_body("o", 2, event_id="e-1", amount="1.00"))).request_hash()
    assert a != b
