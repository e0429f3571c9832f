"""The one vocabulary of results, from a downstream's reply to the settlement.

A downstream answers with a status; ``is_transient`` says, for every downstream alike (Cosmos DB and
the fulfilment service), whether asking again later may succeed. The core's decision about a delivery
is an ``Outcome``; the delivery policy maps each outcome to its settlement in one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypeVar

from idempotent_consumer.errors import InvalidMessage, LimitExceeded
from idempotent_consumer.messages import InboundMessage

T = TypeVar("T")

# Timeout, throttled, Cosmos DB's retry-with, server error, bad gateway, unavailable, gateway timeout.
# Anything else (501 Not Implemented, 505 and the 4xx) will answer the same when asked again.
TRANSIENT_STATUSES = frozenset({408, 429, 449, 500, 502, 503, 504})


def is_transient(status: int | None) -> bool:
    """Whether a downstream's status may turn into success if asked again later."""
    return status in TRANSIENT_STATUSES


# What a service following the IETF Idempotency-Key draft (and Stripe) answers a request whose key another
# request still being processed holds. Cosmos DB's 409 (the id is taken) is no such answer: this rule is for
# calls made under an idempotency key only.
KEY_IN_USE = 409


# What a service behind Entra ID (or a gateway) answers when the app's identity is not allowed: the same for every
# message, so it is no message's fault. The service is unavailable to us, as in an outage: the delivery is handed
# on and its breaker counts it, until the identity is given its role (docs/design.md, "Who calls").
NOT_ALLOWED = frozenset({401, 403})
# What a delivery's detail says then, or when the app has no token to call with: the `identity` alert reads it
# (infra/modules/alerts.bicep), which tells this apart from an outage of the service.
IDENTITY_MARK = "app identity:"
IDENTITY_REFUSED = f"{IDENTITY_MARK} not allowed, grant it the service's role"


def is_unavailable(status: int | None) -> bool:
    """Whether a downstream's status says it is out of our reach for now: transient, or the app not allowed."""
    return is_transient(status) or status in NOT_ALLOWED


def is_transient_under_key(status: int | None) -> bool:
    """Whether a call made under an idempotency key may succeed if made again later: a transient status, the app
    not allowed (yet), or the key still held by a concurrent request (the first call's, which a redelivery's
    takeover may overlap)."""
    return is_unavailable(status) or status == KEY_IN_USE


# An abandon must reach the broker while the lock still holds, or the message waits out the lock.
LOCK_MARGIN_SECONDS = 5.0


class Outcome(StrEnum):
    """The outcome of one delivery, as logged and counted. Values are stable: alerts rely on them."""

    CREATED = "created"
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    STALE = "stale"
    PAYLOAD_MISMATCH = "payload_mismatch"
    UNREADABLE = "unreadable"
    INVALID = "invalid"
    INVALID_TRANSITION = "invalid_transition"
    LIMIT_EXCEEDED = "limit_exceeded"
    INVALID_PLAN = "invalid_plan"  # the handler declared a plan the library cannot carry out: the same every delivery
    PARKED = "parked"
    REJECTED = "rejected"  # the downstream refused the order's effect for good: a business outcome, announced
    # The order's status would contradict the effect or its announcement (cancelled before it was made; cancelled or,
    # for a refusal, shipped before it was announced): what would contradict it is not done (no call; or the call's
    # outcome recorded, not announced).
    ORDER_CLOSED = "order_closed"
    IN_PROGRESS = "in_progress"
    DOWNSTREAM_REJECTED = "downstream_rejected"
    TRANSIENT = "transient"
    HANDED_ON = "handed_on"  # still transient after the delivery's attempts: a copy is scheduled for later
    RETRY_LIMIT_EXCEEDED = "retry_limit_exceeded"  # handed on for RETRY_TOTAL_SECONDS, and failing still
    ERROR = "error"


@dataclass(frozen=True)
class Result:
    """An outcome with a description fit for a dead-letter record: ids, hashes and rules, no payload."""

    outcome: Outcome
    description: str = ""
    request_hash: str | None = None
    # TRANSIENT only: the dependency showed itself up (it answered that the key's first request is still in
    # flight, or took the request and was slow to answer). The message may succeed later, but this is no sign
    # of an outage, and the breaker does not count it.
    dependency_up: bool = False


def abandon_wait(delay_seconds: float, locked_until: datetime | None, now: float) -> float:
    """How long a delivery about to be abandoned waits inside its lock first.

    Service Bus offers an abandoned message again at once, so abandoning straight away would spend
    MaxDeliveryCount deliveries in about a second. Waiting ``delay_seconds`` first spreads them over
    minutes; the wait ends LOCK_MARGIN_SECONDS before the lock does, so that the abandon still lands.
    """
    if locked_until is None:
        return delay_seconds
    return max(0.0, min(delay_seconds, locked_until.timestamp() - now - LOCK_MARGIN_SECONDS))


def parsed(message: InboundMessage, parse: Callable[[InboundMessage], T]) -> T | Result:
    """The message as ``parse`` reads it, or the final result of one it cannot: INVALID naming the rule it breaks,
    LIMIT_EXCEEDED naming the limit. Needs no dependency, so it is decided before any breaker is asked."""
    try:
        return parse(message)
    except InvalidMessage as exc:
        return Result(Outcome.INVALID, exc.rule)
    except LimitExceeded as exc:
        return Result(Outcome.LIMIT_EXCEEDED, f"messageId {message.message_id}: {exc} ({exc.limit})")
