"""The outgoing-message port: send messages to a Service Bus queue or topic.

Adapters: ``shared.servicebus_sender.ServiceBusSender`` (azure-servicebus) and ``RecordingSender``
below, which keeps what was sent for tests.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to send; ``message_id`` is derived from the incoming key, so resends are duplicates."""

    message_id: str
    body: bytes
    correlation_id: str | None = None
    session_id: str | None = None
    subject: str | None = None
    content_type: str = "application/json"
    application_properties: Mapping[str, str] = field(default_factory=dict)


class MessageSender(Protocol):
    """Send messages to a named destination."""

    def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Send every message or raise PublishError; a partial send may happen, resends are harmless."""
        ...


class RecordingSender:
    """A sender that records what it was asked to send, for tests without a broker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[tuple[str, OutgoingMessage]] = []

    def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Record the messages."""
        with self._lock:
            self.sent.extend((destination, m) for m in messages)
