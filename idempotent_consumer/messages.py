"""The transport-neutral view of one delivery that the core works on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Headers:
    """A message's properties the core carries over unread (None: not set)."""

    subject: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    to: str | None = None
    time_to_live: timedelta | None = None


@dataclass(frozen=True)
class InboundMessage:
    """One delivery as the core sees it: broker metadata plus the raw body.

    ``body`` is None when the message carried no data section (an AMQP value or sequence body),
    which the validators report as an invalid message rather than guessing at an encoding.
    ``delivery_count`` is None when the binding does not pass it: the pinned Functions binding
    extension (1.0.0b2) drops the AMQP header that carries it. ``sequence_number`` is the broker's
    number for this message in its entity: a redelivery of the same message has the same one, a copy
    sent again by a producer has another. ``locked_until_utc`` is the lock as the message came with it;
    ``lock_held_until`` how long the host keeps renewing it (the binding computes it from host.json's
    ``maxAutoLockRenewalDuration``), None where nothing renews it. ``headers`` are the other properties the
    producer set (subject, content type, reply-to, to, time to live), which the core never reads but a
    delayed retry's copy carries over.
    """

    message_id: str | None
    body: bytes | None
    correlation_id: str | None = None
    session_id: str | None = None
    delivery_count: int | None = None
    enqueued_time_utc: datetime | None = None
    locked_until_utc: datetime | None = None
    sequence_number: int | None = None
    application_properties: Mapping[str, str] = field(default_factory=dict)
    lock_held_until: datetime | None = None
    headers: Headers = field(default_factory=Headers)

    @property
    def lock_deadline(self) -> datetime | None:
        """Until when this delivery holds its lock at the least: as the host renews it (``lock_held_until``),
        or else the lock it came with. The leases and the waits of the delivery are decided on it."""
        return self.lock_held_until or self.locked_until_utc
