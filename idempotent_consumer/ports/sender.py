"""The outgoing-message port: send messages to a Service Bus queue or topic.

Adapters: ``idempotent_consumer.adapters.servicebus.ServiceBusSender`` (azure-servicebus) and
``idempotent_consumer.testing.memory.RecordingSender``, which keeps what was sent and models the destination's
duplicate detection. ``tests/contract/test_sender.py`` runs one suite against both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to send; ``message_id`` is derived from the incoming key, so resends are duplicates.
    ``scheduled_enqueue_time`` (aware, UTC) holds it back in its queue until then: a delayed retry's copy."""

    message_id: str
    body: bytes
    correlation_id: str | None = None
    session_id: str | None = None
    subject: str | None = None
    content_type: str | None = "application/json"
    application_properties: Mapping[str, str] = field(default_factory=dict)
    scheduled_enqueue_time: datetime | None = None
    reply_to: str | None = None
    to: str | None = None
    time_to_live: timedelta | None = None


class MessageSender(Protocol):
    """Send messages to a named destination."""

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Send every message or raise PublishError; a partial send may happen, resends are harmless."""
        ...
