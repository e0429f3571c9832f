"""Delayed retries: a message that keeps failing transiently is handed on to a later time as a scheduled copy.

A delivery tries a message a few times inside its lock; when it still fails transiently, the delivery
sends a copy of it to its own queue, scheduled for later (``ScheduledEnqueueTimeUtc``), and only then
completes. The copy is the message: same body, SessionId, CorrelationId, subject and application
properties, plus the chain's properties below, under a MessageId of its own (the queue's duplicate
detection would drop a copy under the original's). The consumer's key stays the original MessageId:
``unwrap`` gives the core the delivery as the original, so the order's create and the events' inbox
markers decide duplicates as for any redelivery. Past the total limit the delivery is dead-lettered
``RetryLimitExceeded``, saying how long the message was tried.

The properties, all strings, are this module's contract with every copy in flight. They are namespaced
(``idempotent-consumer.retry.*``), so that no producer's own property takes one of them by chance (a
producer's ``retryAttempt``, its own resend counter, is its own and travels with the message):

- ``idempotent-consumer.retry.original-message-id``: the MessageId the consumer keys on.
- ``idempotent-consumer.retry.chain``: the original's sequence number in its queue. It names the chain of
  copies, so that a copy sent again after a crash has the same MessageId (``identity.retry_message_id``) and
  the queue drops it, while a producer's resend of the original starts a chain of its own. The core reads
  a copy as a delivery of that sequence number: the same message, redelivered.
- ``idempotent-consumer.retry.attempt``: 1 for the first copy, 2 for the copy of that copy, and so on.
- ``idempotent-consumer.retry.first-failed-at``: when the first delivery of the chain handed the message on
  (ISO 8601, UTC); the total limit counts from it.
- ``idempotent-consumer.retry.reason``: why the last delivery handed it on: the failure's description (ids,
  hashes and statuses, never payloads), cut to ``MAX_REASON_CHARS``.

A message that carries any of the first four must carry them all, readable: a copy must say what it is a
copy of (InvalidMessage otherwise). The release before these names wrote ``retryOriginalMessageId``,
``retryChain``, ``retryAttempt``, ``retryFirstFailedAt`` and ``retryReason`` (``LEGACY``): a message that carries
all four of the first, readable, is still read as a copy (one scheduled before the upgrade, due for up to
``RETRY_TOTAL_SECONDS``); one that carries only some of them, or not readable, is a producer's own properties,
passed on untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from idempotent_consumer import identity
from idempotent_consumer.errors import InvalidMessage
from idempotent_consumer.messages import InboundMessage

NAMESPACE = "idempotent-consumer.retry."
ORIGINAL = NAMESPACE + "original-message-id"
CHAIN = NAMESPACE + "chain"
ATTEMPT = NAMESPACE + "attempt"
FIRST_FAILED_AT = NAMESPACE + "first-failed-at"
REASON = NAMESPACE + "reason"
PROPERTIES = (ORIGINAL, CHAIN, ATTEMPT, FIRST_FAILED_AT, REASON)


@dataclass(frozen=True)
class Names:
    """The names a chain's properties go by, in ``PROPERTIES``' order."""

    original: str
    chain: str
    attempt: str
    first_failed_at: str
    reason: str

    @property
    def all(self) -> tuple[str, ...]:
        """Every name, the reason's included."""
        return (self.original, self.chain, self.attempt, self.first_failed_at, self.reason)

    @property
    def required(self) -> tuple[str, ...]:
        """The names a copy must carry."""
        return self.all[:4]


CURRENT = Names(*PROPERTIES)
# What the release before wrote; read, never written, while copies it scheduled may still be due.
LEGACY = Names("retryOriginalMessageId", "retryChain", "retryAttempt", "retryFirstFailedAt", "retryReason")
MAX_REASON_CHARS = 256
RETRY_LIMIT_EXCEEDED = "RetryLimitExceeded"


@dataclass(frozen=True)
class Chain:
    """Where a delivery stands in its chain of copies: ``attempt`` 0 is the original itself; ``names`` are the
    properties it was read under (``LEGACY`` for a copy the release before scheduled)."""

    original_message_id: str
    chain: str
    attempt: int
    first_failed_at: datetime | None
    reason: str = ""
    names: Names = CURRENT

    @classmethod
    def of(cls, message: InboundMessage) -> Chain | None:
        """The chain a delivery carries, or None for an original. InvalidMessage when any of the namespaced
        properties is there but they do not all read: a copy must say what it is a copy of. The legacy names
        make a copy only when all four read; otherwise they are the producer's own."""
        properties = message.application_properties
        if any(name in properties for name in CURRENT.required):
            chain = cls._read(properties, CURRENT)
            if chain is None:
                raise InvalidMessage(f"application properties {ORIGINAL}, {CHAIN} (a sequence number), {ATTEMPT}"
                                     f" (>= 1) and {FIRST_FAILED_AT} (ISO 8601 with an offset): a retry copy must"
                                     " carry all four")
            return chain
        return cls._read(properties, LEGACY)

    @classmethod
    def _read(cls, properties: Mapping[str, str], names: Names) -> Chain | None:
        original, chain = properties.get(names.original, ""), properties.get(names.chain, "")
        try:
            attempt = int(properties.get(names.attempt, ""))
            first = datetime.fromisoformat(properties.get(names.first_failed_at, ""))
        except ValueError:
            return None
        if not original or not chain.isdigit() or attempt < 1 or first.tzinfo is None:
            return None
        return cls(original, chain, attempt, first.astimezone(UTC), properties.get(names.reason, ""), names)

    @classmethod
    def start(cls, message: InboundMessage, now: datetime) -> Chain:
        """The chain an original delivery begins when it first hands itself on, at ``now``."""
        return cls(message.message_id or "", str(message.sequence_number or 0), 0, now)


def chain_of(properties: Mapping[str, str]) -> Chain | None:
    """The chain ``properties`` carry, or None: an original, or a copy whose properties do not read (which a
    delivery dead-letters ``InvalidMessage``); for operators' tools and logs, which must not fail on one."""
    try:
        return Chain.of(InboundMessage(message_id=None, body=None, application_properties=properties))
    except InvalidMessage:
        return None


def attempt_of(properties: Mapping[str, str]) -> int | None:
    """The attempt a delivery's properties say it is (None for an original, or properties that do not read)."""
    chain = chain_of(properties)
    return chain.attempt if chain is not None else None


def unwrap(message: InboundMessage) -> tuple[InboundMessage, Chain | None]:
    """The delivery as the core sees it, and its chain (None for an original). A copy is its original: the
    original's MessageId, the consumer's key, and the original's sequence number, by which a side effect's
    claim knows the deliveries of its own message (``idempotent_consumer.side_effects``): a copy takes over the
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
        """When the next copy of ``chain`` is due, or None when this delivery is the chain's last: the total
        limit has passed at ``now``, or is less than ``base_seconds`` away. So the copy due at the limit is the
        last even when it comes a little early by this instance's clock (skew), instead of being handed on
        again, due at once, under a new id each time until the clock passes the limit."""
        first = chain.first_failed_at or now
        deadline = first + timedelta(seconds=self.total_seconds)
        if now >= deadline or deadline - now < timedelta(seconds=self.base_seconds):
            return None
        return min(now + timedelta(seconds=self.delay(chain.chain, chain.attempt + 1)), deadline)


def copy_properties(chain: Chain, reason: str) -> dict[str, str]:
    """The properties (``PROPERTIES``) of ``chain``'s next copy, handed on for ``reason``."""
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
    """``properties`` without a chain's: what a copy carries over of the producer's own, and what an operator's
    resubmission of a copy sends afresh. The legacy names go only where they made a copy (all four readable);
    otherwise they are the producer's own, and stay."""
    chain = chain_of(properties)
    dropped = {*PROPERTIES, *(chain.names.all if chain is not None else ())}
    return {name: value for name, value in properties.items() if name not in dropped}
