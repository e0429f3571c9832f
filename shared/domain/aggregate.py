"""The order aggregate, ``Order``: its state, version and count of parked events, and the rules that change them.

Events move an order through the state machine of ``lifecycle.KINDS``; each carries the version the
order has after it. An event is stale at or below the order's version, applies when it is the next
version and the state allows it, and is parked (waits for its predecessor) otherwise. An order not
placed yet (events came first) is at version 0 and only counts what waits for it.

The aggregate knows no storage: ``changes`` are the fields set since it was read, which the writes
merge into the stored document, so fields this version does not model are kept. An event's sub-object
(``payment``, ``shipment``, ``cancellation``) is set whole only where none stands; where one does (another
writer put fields into it), the event's fields are merged into it as read (``objects``), so that theirs
are kept. The event's data is stored as its producer wrote it, the fields this version does not model
included (``EventData.kept``).

An order in a status this version does not know (a newer version's) decides nothing here: its events are
parked, counted, for the version that knows the status or an operator, and never rejected. The parked
count is changed by what this version parks and releases, never set from what it counts, so that the
events a newer version counts stay counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from idempotent_consumer.errors import UnreadableDocument
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.records import ParkedEvent, UnreadableParked
from shared.domain import documents
from shared.domain.lifecycle import KINDS, KNOWN_STATUSES, TERMINAL_STATUSES, CloudEvent

# The most events one order holds parked and counted. A storm past it (a producer that rebuilds its events'
# ids on every retry while their order is held back) would make a release read and settle more than a
# delivery does inside its lock; the event past it is dead-lettered LimitExceeded instead. A full backlog
# takes 10 query pages and about 11 batches to release (docs/design.md, "Limits").
MAX_PARKED_EVENTS = 1000


# The order's fields the events' kinds set, one sub-object each.
SUB_OBJECTS = frozenset(kind.record_type for kind in KINDS.values())


def transition(event: CloudEvent, written: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields an event sets on its order, and the condition under which it may, unread: (set, condition).

    ``written`` is the event's ``data`` as its producer wrote it, whose fields this version does not model are
    kept. The condition makes the version and state checks part of the same atomic write; it also asks that
    nothing is parked against the order, so that a parked successor is never passed over. (The write adds that
    the event's sub-object is not there yet: it is set whole.)
    """
    kind = event.kind
    changes = {"status": kind.status_after, "version": event.sequence, kind.record_type: event.data.kept(written),
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
    # The events' sub-objects as read, where they stand: an event's fields are merged into its own.
    objects: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def decide(self, event: CloudEvent) -> Outcome:
        """STALE, APPLIED, INVALID_TRANSITION or PARKED: what the event does to the order as it stands. An
        order in a terminal status takes no event, in turn or not: parking one would strand it. One in a status
        this version does not know parks it (``unknown_status``)."""
        in_turn = self._turn(event.sequence)
        if in_turn is Outcome.STALE:
            return in_turn
        if self.unknown_status is not None:
            return Outcome.PARKED
        if self.status in TERMINAL_STATUSES:
            return Outcome.INVALID_TRANSITION
        if in_turn is Outcome.PARKED:
            return in_turn
        return Outcome.APPLIED if self.status in event.kind.allowed_from else Outcome.INVALID_TRANSITION

    def _turn(self, sequence: int) -> Outcome:
        """STALE at or below the version, PARKED before its turn (or before the order), else APPLIED."""
        if self.version >= sequence:
            return Outcome.STALE
        return Outcome.PARKED if self.status is None or self.version != sequence - 1 else Outcome.APPLIED

    @property
    def unknown_status(self) -> str | None:
        """Why the order decides nothing here, when a newer version moved it to a status this one does not know."""
        if self.status is None or self.status in KNOWN_STATUSES:
            return None
        return (f"order {self.order_id} is {self.status}, a status this version does not know (a newer version's);"
                " parked for a version that knows it, or an operator")

    @property
    def full(self) -> bool:
        """Whether the order holds as many parked events as one order may (MAX_PARKED_EVENTS)."""
        return self.parked >= MAX_PARKED_EVENTS

    def refusal(self, event: CloudEvent) -> str:
        """Why the order's state forbids the event: "is <status>; <type> may follow only <statuses>"."""
        return f"is {self.status}; {event.type} may follow only {', '.join(event.kind.allowed_from)}"

    def apply(self, event: CloudEvent, written: Mapping[str, Any] | None = None) -> Order:
        """The order after the event (its version and state already checked); ``written``, the event's data as its
        producer wrote it. The event's sub-object, where one stands, keeps the fields it holds."""
        changes, _ = transition(event, written)
        kind = event.kind.record_type
        if (stored := self.objects.get(kind)) is not None:
            changes[kind] = {**stored, **changes[kind]}
        return self._with(**changes)

    def skip_to(self, event: CloudEvent) -> Order:
        """The order as if the event's missing predecessors had applied: an operator's decision."""
        return replace(self, version=event.sequence - 1)

    def count_parked(self, parked: int) -> Order:
        """The order with ``parked`` events waiting for it."""
        return self._with(parked=max(0, parked))

    def release(self, waiting: Sequence[ParkedEvent | UnreadableParked]) -> Release:
        """Settle the parked events that the order, as it stands, decides: in one pass by sequence.

        ``waiting`` must be every event parked against the order (all the query's pages): the pass decides
        by sequence, and the count it leaves is what still waits. A parked event in sequence after the order
        applies; one at or below the order's version (another event took its version) is stale; one the
        order's state forbids is rejected with the reason, and so is every one still waiting once the order
        is in a terminal status, since none can ever apply. One that does not decode here
        (``UnreadableParked``, or an event ``cloud_event`` cannot read) stops the release when it is in turn,
        or its sequence does not read: it stays parked, and so does every event at or after its sequence.
        Stale or out of turn, it stays and stops nothing. The order then counts what still waits and was
        counted when it was parked: one parked uncounted (its order did not decode then) stays uncounted, so
        that its drop leaves the count right.
        """
        order, steps, notes, held = self, [], [], False
        kept: list[ParkedEvent | UnreadableParked] = []
        for parked in sorted(waiting, key=_in_sequence):
            if held:
                kept.append(parked)
            elif isinstance(parked, UnreadableParked):
                kept.append(parked)
                if held := parked.sequence is None or order._turn(parked.sequence) is Outcome.APPLIED:
                    notes.append(f"{parked.reason}; it stays parked, with what follows it")
            elif (turn := order._turn(parked.sequence)) is Outcome.STALE:  # only an event in turn is decoded
                steps.append(Step(parked))
            elif turn is Outcome.PARKED and order.status not in TERMINAL_STATUSES:
                kept.append(parked)
            elif isinstance(event := _event_of(parked), UnreadableDocument):
                kept.append(parked)
                held = turn is Outcome.APPLIED
                notes.append(f"{event}; it stays parked" + (", with what follows it" if held else ""))
            elif (unknown := order.unknown_status) is not None:
                kept.append(parked)
                held = True
                notes.append(f"{unknown}: event v{parked.sequence} stays parked, with what follows it")
            elif turn is Outcome.APPLIED and order.decide(event) is Outcome.APPLIED:
                order = order.apply(event, parked.data)
                steps.append(Step(parked, event=event))
            else:
                steps.append(Step(parked, rejection=f"order {order.refusal(event)}"))
        stale = sum(step.kind == "stale" for step in steps)
        rejected = [step for step in steps if step.kind == "rejected"]
        if stale:
            notes.append(f"{stale} parked at or below the version {'were' if stale > 1 else 'was'} stale and"
                         f" {'are' if stale > 1 else 'is'} removed")
        if rejected:
            notes.append(f"{len(rejected)} parked rejected: {rejected[0].rejection}")
        applied = [step for step in steps if step.kind == "applied"]
        # Applied events are written in sequence; what is removed or rejected may go in any batch after them.
        ordered = applied + [step for step in steps if step.kind != "applied"]
        return Release(self, ordered, notes)

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
        return documents.cloud_event(parked)
    except UnreadableDocument as exc:
        return exc


@dataclass(frozen=True)
class Step:
    """One parked event a release settles: applied (with its event), rejected (with the reason), or stale."""

    parked: ParkedEvent
    event: CloudEvent | None = None
    rejection: str | None = None

    @property
    def kind(self) -> str:
        """``applied``, ``rejected`` or ``stale``."""
        return "applied" if self.event is not None else "rejected" if self.rejection is not None else "stale"


@dataclass(frozen=True)
class Release:
    """What a release decides: the order it starts from, the parked events it settles (``steps``, the applied
    ones first, in sequence), and what it set aside.

    A release may be written in several batches, each taking the next steps. ``after(n)`` is the order once
    the first ``n`` are written: its version and state from the events applied among them, and its count
    lowered by the counted ones among them, so that the order and what waits agree after every batch. The
    count is lowered, never set from what this version reads: what a newer version parked and counted (a
    kind of document this one does not know) stays counted.
    """

    start: Order
    steps: list[Step]
    notes: list[str] = field(default_factory=list)

    def after(self, done: int) -> Order:
        """The order once the first ``done`` steps are written."""
        order = self.start
        for step in self.steps[:done]:
            if step.event is not None:
                order = order.apply(step.event, step.parked.data)
        return order.count_parked(self.start.parked - sum(step.parked.counted for step in self.steps[:done]))

    @property
    def order(self) -> Order:
        """The order once every step is written."""
        return self.after(len(self.steps))

    @property
    def applied(self) -> list[tuple[ParkedEvent, CloudEvent]]:
        """The parked events applied, with their events, in sequence."""
        return [(step.parked, step.event) for step in self.steps if step.event is not None]

    def describe(self) -> str:
        """What the release did, for the delivery's log record."""
        versions = [event.sequence for _, event in self.applied]
        return "; ".join(([f"released versions {versions}"] if versions else []) + self.notes)
