"""sbctl retries: list the copies the consumer handed on for a delayed retry, and send chosen ones now.

A copy waits in its queue as a scheduled message, with its chain's application properties
(``idempotent_consumer.retries``): its original MessageId, attempt, first failure and reason. ``list`` peeks
them. ``send-now`` sends each chosen copy again, due at once, and only then cancels the scheduled one,
so that a failure between the two leaves the message twice (the consumer absorbs the duplicate) and
never not at all.

Service Bus lets a session-enabled queue be read only through a session receiver, which takes the
session's lock: on the events queue (sessions on), each command names the session (the orderId).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusMessageState, ServiceBusReceivedMessage
from azure.servicebus.exceptions import ServiceBusError, SessionCannotBeLockedError

from idempotent_consumer import retries
from sbctl.connection import ToolError
from sbctl.dlq import clip, text_properties

PAGE = 100
SEND_NOW_SUFFIX = ".now"


@dataclass(frozen=True)
class Waiting:
    """One copy waiting for its retry: ids, when and why, never the body."""

    original_message_id: str
    attempt: int
    due: datetime | None
    first_failed_at: str
    reason: str
    sequence_number: int
    message_id: str
    session_id: str | None

    @classmethod
    def of(cls, message: ServiceBusReceivedMessage) -> Waiting | None:
        """The copy ``message`` is, or None for any other message (not a copy, or not scheduled)."""
        chain = retries.chain_of(text_properties(message))
        if message.state is not ServiceBusMessageState.SCHEDULED or chain is None:
            return None
        first = chain.first_failed_at.isoformat() if chain.first_failed_at else ""
        return cls(chain.original_message_id, chain.attempt, message.scheduled_enqueue_time_utc, first, chain.reason,
                   message.sequence_number or 0, str(message.message_id), message.session_id)

    def as_json(self) -> dict[str, Any]:
        """The keys of ``retries list --json``."""
        return {"originalMessageId": self.original_message_id, "attempt": self.attempt,
                "due": self.due.isoformat() if self.due else None, "firstFailedAt": self.first_failed_at,
                "reason": self.reason, "sequenceNumber": self.sequence_number, "messageId": self.message_id,
                "sessionId": self.session_id}


@contextmanager
def session_hints(queue: str) -> Iterator[None]:
    """The two ways reading a session-enabled queue fails, as one line each that says what to do."""
    try:
        yield
    except SessionCannotBeLockedError:
        raise ToolError(f"the session of {queue} is held by a consumer right now; try again in a moment") from None
    except ServiceBusError as exc:
        if "requires sessions" not in str(exc):
            raise
        raise ToolError(f"{queue} is session-enabled: it can be read one session at a time; give --session "
                        "ORDER_ID") from None


def _receiver(client: ServiceBusClient, queue: str, session: str | None) -> Any:
    return client.get_queue_receiver(queue, session_id=session) if session else client.get_queue_receiver(queue)


def waiting(client: ServiceBusClient, queue: str, session: str | None = None,
            ids: frozenset[str] = frozenset()) -> list[tuple[Waiting, ServiceBusReceivedMessage]]:
    """Every copy waiting in ``queue`` (in ``session``), peeked page by page; only those of ``ids`` if given."""
    found: list[tuple[Waiting, ServiceBusReceivedMessage]] = []
    with _receiver(client, queue, session) as receiver:
        next_sequence = 0
        while page := receiver.peek_messages(max_message_count=PAGE, sequence_number=next_sequence):
            for message in page:
                copy = Waiting.of(message)
                if copy is not None and (not ids or copy.original_message_id in ids):
                    found.append((copy, message))
            next_sequence = max(m.sequence_number or 0 for m in page) + 1
    return found


def send_now(client: ServiceBusClient, queue: str, chosen: Sequence[tuple[Waiting, ServiceBusReceivedMessage]],
             report: Callable[[Waiting], None]) -> None:
    """Send each chosen copy again, due now, then cancel its scheduled one: never the other way round."""
    with client.get_queue_sender(queue) as sender:
        for copy, message in chosen:
            sender.send_messages(now_copy(message))
            sender.cancel_scheduled_messages(copy.sequence_number)
            report(copy)


def now_copy(message: ServiceBusReceivedMessage) -> ServiceBusMessage:
    """``message`` due at once, under a MessageId of its own (the queue would drop the scheduled one's)."""
    properties: dict[str | bytes, Any] = {name: value for name, value in text_properties(message).items()}
    return ServiceBusMessage(
        b"".join(bytes(section) for section in message.body),
        message_id=f"{message.message_id}{SEND_NOW_SUFFIX}", correlation_id=message.correlation_id,
        session_id=message.session_id, subject=message.subject, content_type=message.content_type,
        reply_to=message.reply_to, to=message.to,
        application_properties=properties or None,
    )


COLUMNS = ["originalMessageId", "attempt", "due", "firstFailedAt", "reason"]
REASON_WIDTH = 60


def table(rows: Sequence[Waiting]) -> str:
    """A plain-text table of the copies waiting; a long reason is cut at a word."""
    cells = [[r.original_message_id, str(r.attempt), r.due.isoformat(timespec="seconds") if r.due else "",
              r.first_failed_at, clip(" ".join(r.reason.split()), REASON_WIDTH)] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(COLUMNS)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *(line(c) for c in cells)])
