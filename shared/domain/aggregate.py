"""The order aggregate, ``Order``: its state, version and count of parked events, and the rules that change them.

Events move an order through the state machine of ``lifecycle.KINDS``; each carries the version the
order has after it. An event is stale at or below the order's version, applies when it is the next
version and the state allows it, and is parked (waits for its predecessor) otherwise. An order not
placed yet (events came first) is at version 0 and only counts what waits for it.

The aggregate knows no storage: ``changes`` are the fields set since it was read, which the writes
merge into the stored document, so fields this version does not model are kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shared.domain.documents import ParkedEvent, UnreadableParked
from shared.domain.lifecycle import CloudEvent
from shared.domain.outcomes import Outcome
from shared.errors import UnreadableDocument

# The state machine allows chains of a few events only; a safety net for one batch (each released
# event costs two operations: with the order's own write and a marker, 40 stay inside 100).
MAX_RELEASED_PER_BATCH = 40


def transition(event: CloudEvent) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields an event sets on its order, and the condition under which it may, unread: (set, condition).

    The condition makes the version and state checks part of the same atomic write; it also asks that
    nothing is parked against the order, so that a parked successor is never passed over.
    """
    kind = event.kind
    changes = {"status": kind.status_after, "version": event.sequence, kind.record_type: event.data.canonical(),
               "updatedAt": event.time_text}
    return changes, {"version": event.sequence - 1, "status": kind.allowed_from, "parked": 0}


@dataclass(frozen=True)
class Order:
    """One order's state as read (or after the changes made to it since)."""

    order_id: str
    status: str | None = None  # None: not placed yet
    version: int = 0
    parked: int = 0
    changes: Mapping[str, Any] = field(default_factory=dict)

    def decide(self, event: CloudEvent) -> Outcome:
        """STALE, APPLIED, INVALID_TRANSITION or PARKED: what the event does to the order as it stands."""
        in_turn = self._turn(event.sequence)
        if in_turn is not Outcome.APPLIED:
            return in_turn
        return Outcome.APPLIED if self.status in event.kind.allowed_from else Outcome.INVALID_TRANSITION

    def _turn(self, sequence: int) -> Outcome:
        """STALE at or below the version, PARKED before its turn (or before the order), else APPLIED."""
        if self.version >= sequence:
            return Outcome.STALE
        return Outcome.PARKED if self.status is None or self.version != sequence - 1 else Outcome.APPLIED

    def refusal(self, event: CloudEvent) -> str:
        """Why the order's state forbids the event: "is <status>; <type> may follow only <statuses>"."""
        return f"is {self.status}; {event.type} may follow only {', '.join(event.kind.allowed_from)}"

    def apply(self, event: CloudEvent) -> Order:
        """The order after the event (its version and state already checked)."""
        changes, _ = transition(event)
        return self._with(**changes)

    def skip_to(self, event: CloudEvent) -> Order:
        """The order as if the event's missing predecessors had applied: an operator's decision."""
        return replace(self, version=event.sequence - 1)

    def count_parked(self, parked: int) -> Order:
        """The order with ``parked`` events waiting for it."""
        return self._with(parked=max(0, parked))

    def release(self, waiting: Sequence[ParkedEvent | UnreadableParked]) -> Release:
        """Apply the parked events that are in sequence after the order, in one pass by sequence.

        A parked event at or below the order's version (another event took its version) is stale; one
        the order's state forbids is rejected with the reason, and what waits behind it stays parked.
        One that does not decode here (``UnreadableParked``, or an event ``cloud_event`` cannot read)
        stops the release when it is in turn, or its sequence does not read: it stays parked, and so does
        every event at or after its sequence. Stale or out of turn, it stays and stops nothing. The order
        then counts what still waits and was counted when it was parked: one parked uncounted (its order
        did not decode then) stays uncounted, so that its drop leaves the count right.
        """
        order, done, held = self, Release(self), False
        kept: list[ParkedEvent | UnreadableParked] = []
        for parked in sorted(waiting, key=_in_sequence):
            if held:
                kept.append(parked)
            elif isinstance(parked, UnreadableParked):
                kept.append(parked)
                if held := parked.sequence is None or order._turn(parked.sequence) is Outcome.APPLIED:
                    done.notes.append(f"{parked.reason}; it stays parked, with what follows it")
            elif (turn := order._turn(parked.sequence)) is Outcome.STALE:  # only an event in turn is decoded
                done.stale.append(parked)
                done.notes.append(f"parked version {parked.sequence} was stale and is removed")
            elif turn is Outcome.PARKED or len(done.applied) == MAX_RELEASED_PER_BATCH:
                kept.append(parked)
            elif isinstance(event := _event_of(parked), UnreadableDocument):
                kept.append(parked)
                held = True
                done.notes.append(f"{event}; it stays parked, with what follows it")
            elif order.decide(event) is Outcome.APPLIED:
                order = order.apply(event)
                done.applied.append((parked, event))
            else:
                done.rejected.append((parked, reason := f"order {order.refusal(event)}"))
                done.notes.append(f"parked version {parked.sequence} rejected: {reason}")
        done.order = order.count_parked(sum(parked.counted for parked in kept))
        return done

    def _with(self, **changes: Any) -> Order:
        state = {k: changes[k] for k in ("status", "version", "parked") if k in changes}
        return replace(self, **state, changes={**self.changes, **changes})


def _in_sequence(parked: ParkedEvent | UnreadableParked) -> tuple[float, bool, float]:
    """By sequence, and by when parked; an unreadable event first at its sequence (it holds back the
    rest), and first of all when its sequence does not read (it holds back every one)."""
    if isinstance(parked, UnreadableParked):
        return -math.inf if parked.sequence is None else parked.sequence, False, 0.0
    return parked.sequence, True, parked.parked_at


def _event_of(parked: ParkedEvent) -> CloudEvent | UnreadableDocument:
    try:
        return parked.cloud_event()
    except UnreadableDocument as exc:
        return exc


@dataclass
class Release:
    """What a release did: the order after it, and the parked events it applied, found stale or rejected."""

    order: Order
    applied: list[tuple[ParkedEvent, CloudEvent]] = field(default_factory=list)
    stale: list[ParkedEvent] = field(default_factory=list)
    rejected: list[tuple[ParkedEvent, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was set aside, in the order it was decided

    def describe(self) -> str:
        """What the release did, for the delivery's log record."""
        versions = [event.sequence for _, event in self.applied]
        return "; ".join(([f"released versions {versions}"] if versions else []) + self.notes)
