"""Translate the binding's ServiceBusReceivedMessage into the core's InboundMessage."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.amqp import AmqpMessageBodyType

from idempotent_consumer.functions.lock_renewal import held_until
from idempotent_consumer.messages import Headers, InboundMessage


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _properties(raw: Mapping[Any, Any] | None) -> dict[str, str]:
    # Through the host's converter, application property keys and values arrive as bytes.
    return {(_text(k) or ""): (_text(v) or "") for k, v in (raw or {}).items()}


def _body(msg: ServiceBusReceivedMessage) -> bytes | None:
    if msg.body_type != AmqpMessageBodyType.DATA:
        return None
    return b"".join(bytes(section) for section in msg.body)


def to_inbound(msg: ServiceBusReceivedMessage, *, renewal: float = 0.0) -> InboundMessage:
    """Read what the core needs from a received message; payload bytes go to the core unread. ``renewal`` is
    how long the host renews this message's lock from now (0 for a session's: see ``lock_renewal``)."""
    return InboundMessage(
        message_id=_text(msg.message_id) or None,
        body=_body(msg),
        correlation_id=_text(msg.correlation_id),
        session_id=_text(msg.session_id),
        delivery_count=msg.delivery_count,
        enqueued_time_utc=msg.enqueued_time_utc,
        locked_until_utc=msg.locked_until_utc,
        lock_held_until=held_until(msg.locked_until_utc, datetime.now(UTC), renewal),
        sequence_number=msg.sequence_number,
        application_properties=_properties(msg.application_properties),
        headers=Headers(subject=_text(msg.subject), content_type=_text(msg.content_type),
                        reply_to=_text(msg.reply_to), to=_text(msg.to), time_to_live=msg.time_to_live),
    )
