"""AMQP values Service Bus carries that the broker must store and deliver intact, sent with the SDK."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import ServiceBusError

from tests.servicebus.conftest import Handlers, collect, opened

DECIMALS: dict[str, Any] = {
    "price": Decimal("1.5"),
    "refund": Decimal("-2.25"),
    "count": Decimal("100"),
    "hundred": Decimal("1E+2"),
    "rate": Decimal("0.0000000000000000000000000001"),  # scale 28, the most System.Decimal has
    "total": Decimal("4294967.295"),  # the largest coefficient azure-servicebus 7.15 decodes right (2**32 - 1)
}


def test_value_body_with_binary_map_keys_is_stored_and_delivered_intact(sb: Handlers) -> None:
    body = {b"k": b"v", b"nested": {b"inner": [b"a", 1]}, b"n": 2}
    with opened(sb.sender("value-body"), sb.receiver("value-body")) as (sender, receiver):
        sender.send_messages(AmqpAnnotatedMessage(value_body=body, application_properties={"kind": "value"}))
        [message] = collect(receiver, 1)
        assert message.body_type == AmqpMessageBodyType.VALUE
        assert message.body == body
        assert message.application_properties == {b"kind": b"value"}
        [peeked] = receiver.peek_messages(1, sequence_number=1)  # through $management too
        assert peeked.body == body
        receiver.complete_message(message)


def test_decimal_application_properties_are_delivered_with_their_values(sb: Handlers) -> None:
    with opened(sb.sender("decimal-property"), sb.receiver("decimal-property")) as (sender, receiver):
        sent: Any = {**DECIMALS, "kind": "money"}  # Decimal is missing from the SDK's annotation, not its encoder
        sender.send_messages(ServiceBusMessage(b"x", application_properties=sent))
        [message] = collect(receiver, 1)
        properties: dict[Any, Any] = message.application_properties or {}
        assert {key.decode(): value for key, value in properties.items() if key != b"kind"} == DECIMALS
        assert all(isinstance(value, Decimal) for key, value in properties.items() if key != b"kind")
        [peeked] = receiver.peek_messages(1, sequence_number=1)  # through $management too
        assert (peeked.application_properties or {})[b"price"] == Decimal("1.5")
        receiver.complete_message(message)


@pytest.mark.parametrize(
    "value",
    [
        Decimal("1E-29"),  # scale 29: System.Decimal holds at most 28
        Decimal("123456789012345678901234567890"),  # more than System.Decimal's 96-bit coefficient
    ],
)
def test_a_decimal_service_bus_cannot_hold_is_refused_on_send(sb: Handlers, value: Decimal) -> None:
    with opened(sb.sender("decimal-refused"), sb.receiver("decimal-refused")) as (sender, receiver):
        with pytest.raises(ServiceBusError, match="argument-out-of-range") as raised:
            properties: Any = {"price": value}
            sender.send_messages(ServiceBusMessage(b"x", application_properties=properties))
        assert "price" in str(raised.value)
        assert receiver.peek_messages(1, sequence_number=1) == []  # nothing was accepted
