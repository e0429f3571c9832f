"""Errors the local broker reports the way Service Bus does, so that the SDK raises its own exception types.

Lock-lost, session-lock-lost, session-cannot-be-locked, message-not-found and the session-id check
have their tests next to the behaviour they belong to (test_sdk_queues.py, test_sdk_sessions.py).
"""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusError

from tests.servicebus.conftest import Handlers


def test_sending_to_a_missing_queue_raises_entity_not_found(sb: Handlers) -> None:
    sender = sb.sender("no-such-queue")
    with pytest.raises(MessagingEntityNotFoundError, match="no-such-queue"):
        sender.send_messages(ServiceBusMessage("lost"))
    sender.close()


def test_receiving_from_a_missing_subscription_raises_entity_not_found(sb: Handlers) -> None:
    receiver = sb.subscription("fanout", "no-such-subscription")
    with pytest.raises(MessagingEntityNotFoundError):
        receiver.receive_messages(max_message_count=1, max_wait_time=1)
    receiver.close()


def test_receiving_from_a_topic_is_refused(sb: Handlers) -> None:
    receiver = sb.receiver("fanout")
    with pytest.raises(ServiceBusError, match="subscription"):
        receiver.receive_messages(max_message_count=1, max_wait_time=1)
    receiver.close()
