"""sbctl dlq: list, resubmit and purge dead-lettered messages of a queue."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)

from sbctl.connection import translated

PAGE = 100
RECEIVE_WAIT_SECONDS = 2
# Set by Service Bus when it dead-letters; a resubmitted message starts clean without them.
_DEAD_LETTER_PROPERTIES = {b"DeadLetterReason", b"DeadLetterErrorDescription", "DeadLetterReason",
                           "DeadLetterErrorDescription"}


@dataclass(frozen=True)
class Selection:
    """Which dead-lettered messages a command acts on: by reason, by MessageId, or all."""

    reason: str | None = None
    ids: frozenset[str] = frozenset()

    def matches(self, message: ServiceBusReceivedMessage) -> bool:
        """True when the message passes both filters that were given."""
        if self.reason is not None and message.dead_letter_reason != self.reason:
            return False
        return not self.ids or message.message_id in self.ids


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered message as the tools report it: ids and reasons, never the body."""

    message_id: str | None
    reason: str | None
    description: str | None
    delivery_count: int | None
    enqueued_time: datetime | None
    sequence_number: int | None

    @classmethod
    def of(cls, message: ServiceBusReceivedMessage) -> DeadLetter:
        return cls(message.message_id, message.dead_letter_reason, message.dead_letter_error_description,
                   message.delivery_count, message.enqueued_time_utc, message.sequence_number)

    def as_json(self) -> dict[str, Any]:
        """The keys of `dlq list --json`."""
        return {
            "messageId": self.message_id,
            "reason": self.reason,
            "description": self.description,
            "deliveryCount": self.delivery_count,
            "enqueuedTime": self.enqueued_time.isoformat() if self.enqueued_time else None,
        }


def peek_all(client: ServiceBusClient, queue: str, selection: Selection = Selection(),
             limit: int | None = None) -> list[DeadLetter]:
    """Every dead-lettered message that matches, without locking or removing any."""
    with translated(queue), client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        return _peek(receiver, selection, limit)


def _peek(receiver: Any, selection: Selection, limit: int | None) -> list[DeadLetter]:
    found: list[DeadLetter] = []
    next_sequence = 0
    while limit is None or len(found) < limit:
        page = receiver.peek_messages(max_message_count=PAGE, sequence_number=next_sequence)
        if not page:
            break
        found.extend(DeadLetter.of(m) for m in page if selection.matches(m))
        next_sequence = max(m.sequence_number or 0 for m in page) + 1
    return found[:limit] if limit is not None else found


def resubmit_copy(message: ServiceBusReceivedMessage) -> ServiceBusMessage:
    """The message as it was sent: same MessageId, body and properties, without the dead-letter ones."""
    properties = {k: v for k, v in (message.application_properties or {}).items() if k not in _DEAD_LETTER_PROPERTIES}
    return ServiceBusMessage(
        b"".join(bytes(section) for section in message.body),
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        session_id=message.session_id,
        subject=message.subject,
        content_type=message.content_type,
        reply_to=message.reply_to,
        to=message.to,
        application_properties=properties or None,
    )


def _locked(
    client: ServiceBusClient, queue: str, selection: Selection
) -> Iterator[tuple[Any, ServiceBusReceivedMessage]]:
    """Receive the DLQ in PeekLock and yield (receiver, message) for each match exactly once.

    A peek first takes stock of what is there, so the loop ends as soon as all of it was seen rather
    than after an idle wait. Messages that don't match stay locked until the end, so they are not
    received again, and are then abandoned back to the dead-letter queue (their delivery count rises).
    """
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as peeker:
        stock = {d.sequence_number for d in _peek(peeker, Selection(), None)}
    if not stock:
        return
    held: list[ServiceBusReceivedMessage] = []
    seen: set[int | None] = set()
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                   receive_mode=ServiceBusReceiveMode.PEEK_LOCK) as receiver:
        try:
            while not stock <= seen:
                batch = receiver.receive_messages(max_message_count=PAGE, max_wait_time=RECEIVE_WAIT_SECONDS)
                if not batch:
                    break
                for message in batch:
                    if message.sequence_number in seen or not selection.matches(message):
                        held.append(message)
                    else:
                        yield receiver, message
                    seen.add(message.sequence_number)
        finally:
            for message in held:
                receiver.abandon_message(message)


def resubmit(client: ServiceBusClient, queue: str, selection: Selection,
             report: Callable[[DeadLetter], None]) -> int:
    """Send each matching dead-lettered message back to its queue, then remove it from the DLQ."""
    count = 0
    with translated(queue), client.get_queue_sender(queue) as sender:
        for receiver, message in _locked(client, queue, selection):
            sender.send_messages(resubmit_copy(message))
            receiver.complete_message(message)  # only after the resubmission was sent
            report(DeadLetter.of(message))
            count += 1
    return count


def purge(client: ServiceBusClient, queue: str, selection: Selection,
          report: Callable[[DeadLetter], None]) -> int:
    """Delete every matching dead-lettered message."""
    count = 0
    with translated(queue):
        for receiver, message in _locked(client, queue, selection):
            receiver.complete_message(message)
            report(DeadLetter.of(message))
            count += 1
    return count


def table(rows: Sequence[DeadLetter]) -> str:
    """A plain-text table of dead letters."""
    headers = ["messageId", "reason", "description", "deliveryCount", "enqueuedTime"]
    cells = [[str(v if v is not None else "") for v in r.as_json().values()] for r in rows]
    widths = [min(60, max([len(h)] + [len(c[i]) for c in cells])) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v[:w].ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(c) for c in cells)])
