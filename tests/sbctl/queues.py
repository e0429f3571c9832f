"""What the sbctl tests do to queues with the SDK alone: configure, dead-letter, drain and look for messages."""

from __future__ import annotations

import json

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue


def queue(name: str, **properties: object) -> dict:
    """A queue for the broker's Config.json: short locks, no duplicate detection unless asked."""
    defaults = {"LockDuration": "PT30S", "MaxDeliveryCount": 10, "RequiresDuplicateDetection": False,
                "RequiresSession": False, "DefaultMessageTimeToLive": "PT1H",
                "DuplicateDetectionHistoryTimeWindow": "PT1M", "DeadLetteringOnMessageExpiration": False}
    return {"Name": name, "Properties": {**defaults, **properties}}


def config(*queues: dict) -> dict:
    return {"UserConfig": {"Namespaces": [{"Name": "sbctl", "Queues": list(queues), "Topics": []}]}}


def drain(conn: str, name: str, *, session: str | None = None, dead_letter: bool = False) -> list:
    """Receive and complete everything there is."""
    with ServiceBusClient.from_connection_string(conn) as client:
        kwargs: dict = {"max_wait_time": 1}
        if dead_letter:
            kwargs["sub_queue"] = ServiceBusSubQueue.DEAD_LETTER
        if session is not None:
            kwargs["session_id"] = session
        with client.get_queue_receiver(name, **kwargs) as receiver:
            received = []
            while batch := receiver.receive_messages(max_message_count=100, max_wait_time=0.5):
                for message in batch:
                    receiver.complete_message(message)
                received.extend(batch)
            return received


def dead_letter(conn: str, name: str, messages: list[tuple[str, str]]) -> None:
    """Send (messageId, reason) pairs and dead-letter each with its reason."""
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_queue_sender(name) as sender:
            sender.send_messages([ServiceBusMessage(json.dumps({"orderId": mid}), message_id=mid,
                                                    application_properties={"origin": "test"})
                                  for mid, _ in messages])
        reasons = dict(messages)
        with client.get_queue_receiver(name, max_wait_time=2) as receiver:
            pending = len(messages)
            while pending:
                for message in receiver.receive_messages(max_message_count=pending, max_wait_time=2):
                    mid = message.message_id
                    assert mid is not None  # every message was sent with one
                    receiver.dead_letter_message(message, reason=reasons[mid], error_description=f"because {mid}")
                    pending -= 1


def where(conn: str, name: str, message_id: str) -> list[str]:
    """Which of the queue and its dead-letter queue hold a message with this MessageId (by peeking)."""
    found = []
    with ServiceBusClient.from_connection_string(conn) as client:
        for place, sub_queue in (("queue", None), ("dead-letter queue", ServiceBusSubQueue.DEAD_LETTER)):
            with client.get_queue_receiver(name, sub_queue=sub_queue) as receiver:
                peeked = receiver.peek_messages(max_message_count=100)
            found += [place] * sum(m.message_id == message_id for m in peeked)
    return found
