"""AMQP values Service Bus carries that the broker must store and deliver intact, sent with the SDK."""

from __future__ import annotations

from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType

from tests.servicebus.conftest import Handlers, collect, opened


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
