"""sbctl dlq: list, resubmit and purge dead-lettered messages of a queue."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageLockLostError

from idempotent_consumer import retries
from sbctl.detection import Detection

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
    #: Only these (the messages a first resubmit pass held back).
    sequence_numbers: frozenset[int] | None = None
    #: Only a delayed retry's copies: a release that knows no copy (the one before delayed retries) dead-letters
    #: them InvalidMessage, and their resubmission under the original MessageId maps them back.
    copies: bool = False

    def matches(self, message: ServiceBusReceivedMessage) -> bool:
        """True when the message passes every filter that was given."""
        if self.reason is not None and message.dead_letter_reason != self.reason:
            return False
        if self.sequence_numbers is not None and message.sequence_number not in self.sequence_numbers:
            return False
        if self.copies and retries.chain_of(text_properties(message)) is None:
            return False
        return not self.ids or original_id(message) in self.ids

    def missing(self, found: Iterable[DeadLetter]) -> list[str]:
        """The requested MessageIds that no matching dead letter had."""
        return sorted(self.ids - {row.message_id for row in found if row.message_id is not None})


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
        """The dead letter as listed: a delayed retry's copy under its original MessageId."""
        return cls(original_id(message), message.dead_letter_reason, message.dead_letter_error_description,
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
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
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


def text_properties(message: ServiceBusReceivedMessage) -> dict[str, str]:
    """A received message's application properties as text (the SDK may hand keys and values over as bytes)."""
    def text(value: Any) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return {text(k): text(v) for k, v in (message.application_properties or {}).items()}


def original_id(message: ServiceBusReceivedMessage) -> str | None:
    """The MessageId the producer sent ``message`` under: a delayed retry's copy carries it as a property."""
    chain = retries.chain_of(text_properties(message))
    return chain.original_message_id if chain is not None else message.message_id


def resubmit_copy(message: ServiceBusReceivedMessage) -> ServiceBusMessage:
    """The message as the producer sent it: its MessageId, body and properties, without the dead-letter ones and,
    for a delayed retry's copy, without the ``retry*`` ones: the resubmission starts afresh."""
    kept = retries.originals(text_properties(message))
    properties = {k: v for k, v in (message.application_properties or {}).items()
                  if k not in _DEAD_LETTER_PROPERTIES and (k.decode() if isinstance(k, bytes) else k) in kept}
    return ServiceBusMessage(
        b"".join(bytes(section) for section in message.body),
        message_id=original_id(message),
        correlation_id=message.correlation_id,
        session_id=message.session_id,
        subject=message.subject,
        content_type=message.content_type,
        reply_to=message.reply_to,
        to=message.to,
        application_properties=properties or None,
    )


def hold_until(row: DeadLetter, detection: Detection, now: datetime) -> datetime | None:
    """Until when the queue would drop a resubmission of ``row`` (same MessageId); None if it would not now.

    The window runs from the original send: the dead letter's enqueued time, which the local broker
    keeps from the original when it dead-letters. Should Service Bus report the time of
    dead-lettering there instead, that time is later, so the hold lasts longer than needed, never less.
    A message without MessageId is never a duplicate.
    """
    if row.message_id is None:
        return None
    until = detection.drops_until(row.enqueued_time or now)
    return until if until is not None and until > now else None


@dataclass(frozen=True)
class Held:
    """A dead letter left in the dead-letter queue because its resubmission would be dropped until ``until``."""

    dead_letter: DeadLetter
    until: datetime


@dataclass
class Resubmission:
    """What a resubmit pass did with the dead letters it selected."""

    resubmitted: list[DeadLetter] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)

    @property
    def selected(self) -> list[DeadLetter]:
        return [*self.resubmitted, *(h.dead_letter for h in self.held)]


def resubmit(client: ServiceBusClient, queue: str, selection: Selection, detection: Detection, *,
             report: Callable[[DeadLetter], None], report_held: Callable[[Held], None],
             on_sent: Callable[[DeadLetter], None] = lambda _: None) -> Resubmission:
    """Send each matching dead letter back to its queue, then remove it from the dead-letter queue.
    ``on_sent`` hears of each resubmission as soon as it is sent, before its dead letter is removed (which may
    fail, its lock lost: the next pass sends it again).

    One whose resubmission the queue's duplicate detection would drop stays in the dead-letter queue
    (its lock is abandoned), so that no message ever ends up in neither queue.
    """
    done = Resubmission()
    with ExitStack() as senders:
        sender: Any = None

        def act(receiver: Any, message: ServiceBusReceivedMessage) -> bool:
            nonlocal sender
            row = DeadLetter.of(message)
            until = hold_until(row, detection, datetime.now(UTC))
            if until is not None:
                done.held.append(Held(row, until))
                report_held(done.held[-1])
                return False
            sender = sender or senders.enter_context(client.get_queue_sender(queue))
            sender.send_messages(resubmit_copy(message))
            on_sent(row)
            receiver.complete_message(message)  # only after the resubmission was sent
            done.resubmitted.append(row)
            report(row)
            return True

        _each_locked(client, queue, selection, act)
    return done


def purge(client: ServiceBusClient, queue: str, selection: Selection,
          report: Callable[[DeadLetter], None]) -> list[DeadLetter]:
    """Delete every matching dead letter; return what was deleted."""
    deleted: list[DeadLetter] = []

    def act(receiver: Any, message: ServiceBusReceivedMessage) -> bool:
        receiver.complete_message(message)
        deleted.append(DeadLetter.of(message))
        report(deleted[-1])
        return True

    _each_locked(client, queue, selection, act)
    return deleted


def _each_locked(client: ServiceBusClient, queue: str, selection: Selection,
                 act: Callable[[Any, ServiceBusReceivedMessage], bool]) -> None:
    """Receive the DLQ in PeekLock and call ``act(receiver, message)`` once for each match.

    ``act`` returns True when it settled the message. A peek first takes stock of what is there, so
    the loop ends as soon as all of it was seen rather than after an idle wait. Messages that don't
    match, and those ``act`` left alone, stay locked until the end, so they are not received again,
    and are then abandoned back to the dead-letter queue (their delivery count rises); one whose lock ran out
    meanwhile is back there already.
    """
    kept: list[ServiceBusReceivedMessage] = []
    seen: set[int | None] = set()
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                   receive_mode=ServiceBusReceiveMode.PEEK_LOCK) as receiver:
        stock = {d.sequence_number for d in _peek(receiver, Selection(), None)}
        try:
            while stock and not stock <= seen:
                batch = receiver.receive_messages(max_message_count=PAGE, max_wait_time=RECEIVE_WAIT_SECONDS)
                if not batch:
                    break
                for message in batch:
                    fresh = message.sequence_number not in seen
                    seen.add(message.sequence_number)
                    if not (fresh and selection.matches(message) and act(receiver, message)):
                        kept.append(message)
        finally:
            for message in kept:
                # A lock that ran out while the others were handled (a short lock, a long dead-letter queue) has
                # already given the message back: there is nothing left to abandon.
                with contextlib.suppress(MessageLockLostError):
                    receiver.abandon_message(message)


COLUMNS = ["messageId", "reason", "description", "deliveryCount", "enqueuedTime"]
DESCRIPTION_WIDTH = 60


def table(rows: Sequence[DeadLetter]) -> str:
    """A plain-text table of dead letters; a long description is cut at a word and marked with an ellipsis."""
    cells = [[" ".join(str(v).split()) if v is not None else "" for v in r.as_json().values()] for r in rows]
    for row in cells:
        row[2] = clip(row[2], DESCRIPTION_WIDTH)
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(COLUMNS)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *(line(c) for c in cells)])


def clip(text: str, width: int) -> str:
    """``text`` if it fits in ``width``; else cut, at a word boundary where one is near, with a trailing ``…``."""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    if space >= width // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"
