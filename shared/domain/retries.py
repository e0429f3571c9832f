"""Delayed retries: a message that keeps failing transiently is handed on to a later time as a scheduled copy.

A delivery tries a message a few times inside its lock; when it still fails transiently, the delivery
sends a copy of it to its own queue, scheduled for later (``ScheduledEnqueueTimeUtc``), and only then
completes. The copy is the message: same body, SessionId, CorrelationId, subject and application
properties, plus the ``retry*`` properties below, under a MessageId of its own (the queue's duplicate
detection would drop a copy under the original's). The consumer's key stays the original MessageId:
``unwrap`` gives the core the delivery as the original, so the order's create and the events' inbox
markers decide duplicates as for any redelivery. Past the total limit the delivery is dead-lettered
``RetryLimitExceeded``, saying how long the message was tried.

The properties, all strings, are this module's contract with every copy in flight:

- ``retryOriginalMessageId``: the MessageId the consumer keys on.
- ``retryChain``: the original's sequence number in its queue. It names the chain of copies, so that a copy
  sent again after a crash has the same MessageId (``identity.retry_message_id``) and the queue drops it,
  while a producer's resend of the original starts a chain of its own. The core reads a copy as a delivery
  of that sequence number: the same message, redelivered.
- ``retryAttempt``: 1 for the first copy, 2 for the copy of that copy, and so on.
- ``retryFirstFailedAt``: when the first delivery of the chain handed the message on (ISO 8601, UTC); the total
  limit counts from it.
- ``retryReason``: why the last delivery handed it on: the failure's description (ids, hashes and statuses,
  never payloads), cut to ``MAX_REASON_CHARS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from shared.domain import identity
from shared.domain.messages import InboundMessage
from shared.errors import InvalidMessage

ORIGINAL = "retryOriginalMessageId"
CHAIN = "retryChain"
ATTEMPT = "retryAttempt"
FIRST_FAILED_AT = "retryFirstFailedAt"
REASON = "retryReason"
PROPERTIES = (ORIGINAL, CHAIN, ATTEMPT, FIRST_FAILED_AT, REASON)
MAX_REASON_CHARS = 256
RETRY_LIMIT_EXCEEDED = "RetryLimitExceeded"


@dataclass(frozen=True)
class Chain:
    """Where a delivery stands in its chain of copies: ``attempt`` 0 is the original itself."""

    original_message_id: str
    chain: str
    attempt: int
    first_failed_at: datetime | None
    reason: str = ""

    @classmethod
    def of(cls, message: InboundMessage) -> Chain | None:
        """The chain a delivery carries, or None for an original (no ``retry*`` properties). InvalidMessage
        when the properties are there but do not read: a copy must say what it is a copy of."""
        properties = message.application_properties
        if not any(name in properties for name in (ORIGINAL, CHAIN, ATTEMPT, FIRST_FAILED_AT)):
            return None
        original, chain = properties.get(ORIGINAL, ""), properties.get(CHAIN, "")
        try:
            attempt = int(properties.get(ATTEMPT, ""))
            first = datetime.fromisoformat(properties.get(FIRST_FAILED_AT, ""))
        except ValueError:
            attempt, first = 0, None
        if not original or not chain.isdigit() or attempt < 1 or first is None or first.tzinfo is None:
            raise InvalidMessage(f"application properties {ORIGINAL}, {CHAIN} (a sequence number), {ATTEMPT} (>= 1)"
                                 f" and {FIRST_FAILED_AT} (ISO 8601 with an offset): a retry copy must carry all four")
        return cls(original, chain, attempt, first.astimezone(UTC), properties.get(REASON, ""))

    @classmethod
    def start(cls, message: InboundMessage, now: datetime) -> Chain:
        """The chain an original delivery begins when it first hands itself on, at ``now``."""
        return cls(message.message_id or "", str(message.sequence_number or 0), 0, now)


def unwrap(message: InboundMessage) -> tuple[InboundMessage, Chain | None]:
    """The delivery as the core sees it, and its chain (None for an original). A copy is its original: the
    original's MessageId, the consumer's key, and the original's sequence number, by which a side effect's
    claim knows the deliveries of its own message (``shared.handlers.side_effects``): a copy takes over the
    claim a delivery of its chain left, at once, as a redelivery does."""
    chain = Chain.of(message)
    if chain is None:
        return message, None
    return dataclasses.replace(message, message_id=chain.original_message_id, sequence_number=int(chain.chain)), chain


@dataclass(frozen=True)
class Backoff:
    """When a failing message is tried again: ``base`` x 2^(attempt-1), jittered by up to a fifth either way,
    at most ``ceiling``; never past ``total`` after the chain's first failure."""

    base_seconds: float
    ceiling_seconds: float
    total_seconds: float

    def delay(self, chain: str, attempt: int) -> float:
        """The wait before copy ``attempt`` of ``chain`` is due: deterministic, so a resent copy is due alike."""
        raw = self.base_seconds * float(2 ** min(attempt - 1, 32))
        spread = int(identity.digest("retry-jitter", chain, str(attempt))[:8], 16) / 0xFFFFFFFF
        return min(self.ceiling_seconds, raw * (0.8 + 0.4 * spread))

    def next_copy(self, chain: Chain, now: datetime) -> datetime | None:
        """When the next copy of ``chain`` is due, or None when the total limit has passed at ``now``."""
        first = chain.first_failed_at or now
        deadline = first + timedelta(seconds=self.total_seconds)
        if now >= deadline:
            return None
        return min(now + timedelta(seconds=self.delay(chain.chain, chain.attempt + 1)), deadline)


def copy_properties(chain: Chain, reason: str) -> dict[str, str]:
    """The ``retry*`` properties of ``chain``'s next copy, handed on for ``reason``."""
    first = chain.first_failed_at
    assert first is not None
    return {ORIGINAL: chain.original_message_id, CHAIN: chain.chain, ATTEMPT: str(chain.attempt + 1),
            FIRST_FAILED_AT: first.isoformat(), REASON: reason[:MAX_REASON_CHARS]}


def copy_message_id(chain: Chain) -> str:
    """The MessageId of ``chain``'s next copy: the same for a copy sent again, another for each attempt."""
    return identity.retry_message_id(chain.original_message_id, chain.chain, chain.attempt + 1)


def limit_description(chain: Chain, now: datetime, reason: str) -> str:
    """A RetryLimitExceeded dead-letter's description: how long, how many copies, and the last failure."""
    first = chain.first_failed_at or now
    tried = int((now - first).total_seconds())
    return (f"tried for {tried // 3600}h{tried % 3600 // 60:02d}m{tried % 60:02d}s since {first.isoformat()}"
            f" over {chain.attempt} delayed retries; last failure: {reason}")[:1024]


def originals(properties: Mapping[str, str]) -> dict[str, str]:
    """``properties`` without the ``retry*`` ones: what an operator's resubmission of a copy sends afresh."""
    return {name: value for name, value in properties.items() if name not in PROPERTIES}
