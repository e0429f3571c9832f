"""Messages as the broker keeps them, and the queue of those ready for delivery.

Pure Python and free of any AMQP library, like the rest of the store.
"""

from __future__ import annotations

import enum
import heapq
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Envelope", "MessageState", "ReadyQueue", "StoredMessage"]


class MessageState(enum.IntEnum):
    """Values of the ``x-opt-message-state`` annotation (the SDK's ServiceBusMessageState)."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


@dataclass(frozen=True, eq=False)
class Envelope:
    """A message as sent, reduced to what the broker routes on; ``payload`` is the wire layer's own."""

    payload: Any
    message_id: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    application_properties: Mapping[str, Any] = field(default_factory=dict)
    #: The message's own time to live in seconds (AMQP header ``ttl``), if it has one.
    ttl: float | None = None
    #: ``x-opt-scheduled-enqueue-time`` in seconds since the epoch, if set.
    scheduled_enqueue_time: float | None = None


@dataclass(eq=False)
class StoredMessage:
    """A message held by an entity, with its sequence number, counters, lock and dead-letter details."""

    envelope: Envelope
    sequence_number: int
    enqueued_time: float
    #: Effective time to live (the message's, capped by the entity defaults); None = never expires.
    ttl: float | None
    expires_at: float | None
    state: MessageState = MessageState.ACTIVE
    delivery_count: int = 0
    lock_token: uuid.UUID | None = None
    locked_until: float | None = None
    lock_owner: object | None = None
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    dead_letter_source: str | None = None
    forward_hops: int = 0
    #: Bumped whenever the message becomes available, so stale heap entries can be recognised.
    available_version: int = 0

    @property
    def session_id(self) -> str | None:
        return self.envelope.session_id

    @property
    def locked(self) -> bool:
        return self.lock_token is not None

    def header_delivery_count(self, *, delivering: bool = False) -> int:
        """The AMQP header's delivery-count: deliveries before the one in progress (or the next one).

        ``delivering`` is true when the message is being handed out right now (a ReceiveAndDelete
        delivery is no longer locked, yet its own delivery must not count).
        """
        in_progress = delivering or self.locked
        return max(0, self.delivery_count - 1) if in_progress else self.delivery_count

    def copy_for(self) -> StoredMessage:
        """A copy for another entity (a subscription, a dead-letter queue), keeping the counters."""
        return StoredMessage(
            envelope=self.envelope,
            sequence_number=self.sequence_number,
            enqueued_time=self.enqueued_time,
            ttl=self.ttl,
            expires_at=self.expires_at,
            delivery_count=self.delivery_count,
            dead_letter_reason=self.dead_letter_reason,
            dead_letter_description=self.dead_letter_description,
            dead_letter_source=self.dead_letter_source,
            forward_hops=self.forward_hops,
        )


class ReadyQueue:
    """Messages available for delivery, lowest sequence number first.

    Entries are not removed when a message is locked, deferred or gone; they go stale and are
    dropped when they reach the front.
    """

    def __init__(self, messages: Mapping[int, StoredMessage]) -> None:
        self._messages = messages
        self._heap: list[tuple[int, int]] = []

    def push(self, message: StoredMessage) -> None:
        """Make ``message`` available (again); any earlier entry for it goes stale."""
        message.state = MessageState.ACTIVE
        message.available_version += 1
        heapq.heappush(self._heap, (message.sequence_number, message.available_version))

    def first(self) -> int | None:
        """The lowest sequence number available, or None."""
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop(self) -> StoredMessage | None:
        """Take the available message with the lowest sequence number, or None."""
        first = self.first()
        if first is None:
            return None
        heapq.heappop(self._heap)
        return self._messages[first]

    def _is_live(self, entry: tuple[int, int]) -> bool:
        message = self._messages.get(entry[0])
        return (
            message is not None
            and message.state is MessageState.ACTIVE
            and not message.locked
            and message.available_version == entry[1]
        )
