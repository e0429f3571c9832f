"""The one place that maps outcomes to complete, abandon or dead-letter, and performs the call."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from shared.domain.outcomes import Outcome, Result

# Service Bus caps dead-letter descriptions; keep ours well inside and never include payloads.
MAX_DESCRIPTION_CHARS = 1024


class Action(StrEnum):
    """The three explicit settlements a PeekLock delivery can end in."""

    COMPLETE = "complete"
    ABANDON = "abandon"
    DEADLETTER = "deadletter"


@dataclass(frozen=True)
class Settlement:
    """What to do with a delivery; ``reason`` is the dead-letter reason operators alert on."""

    action: Action
    reason: str | None = None


SETTLEMENTS: dict[Outcome, Settlement] = {
    Outcome.CREATED: Settlement(Action.COMPLETE),
    Outcome.APPLIED: Settlement(Action.COMPLETE),
    Outcome.DUPLICATE: Settlement(Action.COMPLETE),
    Outcome.STALE: Settlement(Action.COMPLETE),
    Outcome.PAYLOAD_MISMATCH: Settlement(Action.DEADLETTER, "PayloadMismatch"),
    Outcome.INVALID: Settlement(Action.DEADLETTER, "InvalidMessage"),
    Outcome.INVALID_TRANSITION: Settlement(Action.DEADLETTER, "InvalidTransition"),
    Outcome.PARKED: Settlement(Action.COMPLETE),
    Outcome.IN_PROGRESS: Settlement(Action.COMPLETE),
    Outcome.DOWNSTREAM_REJECTED: Settlement(Action.DEADLETTER, "DownstreamRejected"),
    Outcome.TRANSIENT: Settlement(Action.ABANDON),
    Outcome.ERROR: Settlement(Action.ABANDON),
}


class MessageActions(Protocol):
    """The settlement calls of the binding's ServiceBusMessageActions that we use."""

    def complete(self, message: Any) -> None:
        """Complete: the message is removed from the queue."""

    def abandon(self, message: Any) -> None:
        """Abandon: the lock is released and the message is redelivered."""

    def deadletter(
        self, message: Any, deadletter_reason: str | None = None, deadletter_error_description: str | None = None
    ) -> None:
        """Move the message to the dead-letter queue with a reason and description."""


def settle(msg: Any, actions: MessageActions, result: Result) -> Settlement:
    """Make exactly one settlement call for the delivery; a failed call raises (the caller logs it)."""
    settlement = SETTLEMENTS[result.outcome]
    if settlement.action is Action.COMPLETE:
        actions.complete(msg)
    elif settlement.action is Action.ABANDON:
        actions.abandon(msg)
    else:
        actions.deadletter(
            msg,
            deadletter_reason=settlement.reason,
            deadletter_error_description=result.description[:MAX_DESCRIPTION_CHARS] or settlement.reason,
        )
    return settlement
