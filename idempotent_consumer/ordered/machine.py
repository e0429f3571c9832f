"""Ordered processing's rules: a subject's state (``Subject``) and what an event does to it, by the state machine
a consumer supplies (``Machine``).

Each event carries the version its subject has after it (``sequence``). An event is stale at or below the
subject's version, applies when it is the next version and the machine allows it from the subject's status,
and is parked (waits for its predecessor) otherwise. A subject not created yet (its events came first) is at
version 0 and only counts what waits for it.

The subject knows no storage: ``changes`` are the fields set since it was read, which the writes merge into
the stored document, so fields this version does not model are kept. An event's sub-object (the field the
machine names for it) is set whole only where none stands; where one does (another writer put fields into
it), the event's fields are merged into it as read (``objects``), so that theirs are kept.

A subject in a status the machine does not know (a newer version's) decides nothing here: its events are
parked, counted, for the version that knows the status or an operator, and never rejected. The parked
count is changed by what this version parks and releases, never set from what it counts, so that the
events a newer version counts stay counted.

The stored subject's fields the library reads and writes are ``status``, ``version``, ``parked`` and
``updatedAt``; the machine's sub-objects beside them, and every other field its own.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from idempotent_consumer.errors import UnreadableDocument
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.ports.store import MAX_PATCH_FIELDS
from idempotent_consumer.records import Event, ParkedEvent, UnreadableParked


class OrderedEvent(Event, Protocol):
    """An ordered event as the library reads it: the records' ``Event`` and the hash of its content."""

    def request_hash(self) -> str: ...


E = TypeVar("E", bound=OrderedEvent)
#: The fields besides its sub-objects that the ordered mode sets on a subject: status, version, parked, updatedAt.
SUBJECT_FIELDS = ("status", "version", "parked", "updatedAt")
#: The most sub-objects a machine may have: with ``SUBJECT_FIELDS``, one patch's 10 operations.
MAX_SUB_OBJECTS = MAX_PATCH_FIELDS - len(SUBJECT_FIELDS)


@dataclass(frozen=True)
class StoredState:
    """What the machine reads of a stored subject: its status (None for the placeholder that stands in for a
    subject whose events came first), version, count of parked events, and the requestHash it was created with."""

    status: str | None
    version: int = 0
    parked: int = 0
    request_hash: str | None = None


class Machine(Protocol[E]):
    """The state machine a consumer supplies for ordered processing: its events, its statuses and its documents.

    ``noun`` names a subject in descriptions ("order"). ``known`` is every status this version knows, and
    ``terminal`` those no event may follow. ``sub_objects`` are the subject's fields its events set, one per
    event kind: at most ``MAX_SUB_OBJECTS``, so that one patch of a release (status, version, parked, updatedAt
    and each kind's sub-object) stays inside Cosmos DB's 10 operations. ``max_parked`` is the most events one
    subject holds parked. ``creates``: whether an event of sequence 1 creates its subject (``create``), when the
    machine allows it from no status (``allowed_from`` empty); when false, the subject is created by another
    handler (the order app's OrderPlaced, in its own intake) and its events start at 2.
    """

    noun: str
    known: frozenset[str]
    terminal: frozenset[str]
    sub_objects: frozenset[str]
    max_parked: int
    creates: bool

    def parse(self, message: InboundMessage) -> E:
        """The delivery's event; InvalidMessage naming the first rule it breaks."""
        ...

    def allowed_from(self, event: E) -> Collection[str]:
        """The statuses the event may follow."""
        ...

    def status_after(self, event: E) -> str:
        """The subject's status once the event applies."""
        ...

    def sub_object(self, event: E, written: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
        """The field the event sets on its subject and its value, ``written`` being the event's data as its
        producer wrote it (whose fields this version does not model are kept)."""
        ...

    def record(self, event: E, written: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The document an event writes when it applies, in its subject's partition, in the same batch as its
        subject's patch; None for none (the event's sub-object on its subject is its record: one create fewer)."""
        ...

    def decode(self, parked: ParkedEvent) -> E:
        """A parked event as it was validated when it was parked; UnreadableDocument if this version cannot."""
        ...

    def read(self, document: Mapping[str, Any]) -> StoredState | None:
        """What stands at a subject's id: its state; None for a document that is not the machine's;
        UnreadableDocument when the state does not decode here."""
        ...

    def placeholder(self, key: str, parked: int) -> dict[str, Any]:
        """The document that stands in for a subject whose events came first, counting ``parked``. The subject takes
        its place by a merge into it as read: what ``create`` does not set of the placeholder's fields stays."""
        ...

    def create(self, event: E, written: Mapping[str, Any] | None) -> dict[str, Any]:
        """The subject's document as its first event (sequence 1) creates it, its id the event's subject; the
        library adds the transition's fields (status, version, the event's sub-object, updatedAt). Called only
        when ``creates``."""
        ...


def transition(machine: Machine[Any], event: OrderedEvent,
               written: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields an event sets on its subject, and the condition under which it may, unread: (set, condition).

    The condition makes the version and state checks part of the same atomic write; it also asks that nothing
    is parked against the subject, so that a parked successor is never passed over. (The write adds that the
    event's sub-object is not there yet: it is set whole.)
    """
    name, value = machine.sub_object(event, written)
    changes = {"status": machine.status_after(event), "version": event.sequence, name: value,
               "updatedAt": event.time_text}
    return changes, {"version": event.sequence - 1, "status": tuple(machine.allowed_from(event)), "parked": 0}


@dataclass(frozen=True)
class Subject:
    """One subject's state as read (or after the changes made to it since)."""

    machine: Machine[Any]
    key: str
    status: str | None = None  # None: not created yet
    version: int = 0
    parked: int = 0
    changes: Mapping[str, Any] = field(default_factory=dict)
    # The events' sub-objects as read, where they stand: an event's fields are merged into its own.
    objects: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def decide(self, event: OrderedEvent) -> Outcome:
        """STALE, APPLIED, INVALID_TRANSITION or PARKED: what the event does to the subject as it stands. A
        subject in a terminal status takes no event, in turn or not: parking one would strand it. One in a status
        this version does not know parks it (``unknown_status``)."""
        in_turn = self._turn(event.sequence)
        if in_turn is Outcome.STALE:
            return in_turn
        if self.unknown_status is not None:
            return Outcome.PARKED
        if self.status in self.machine.terminal:
            return Outcome.INVALID_TRANSITION
        if in_turn is Outcome.PARKED:
            return in_turn
        allowed = self.machine.allowed_from(event)
        if self.status is None:  # the subject's first event creates it, if it is one the machine creates it by
            return Outcome.INVALID_TRANSITION if allowed else Outcome.APPLIED
        return Outcome.APPLIED if self.status in allowed else Outcome.INVALID_TRANSITION

    def _turn(self, sequence: int) -> Outcome:
        """STALE at or below the version, PARKED before its turn (or before the subject, unless it is the first
        event of a machine whose first event creates its subject), else APPLIED."""
        if self.version >= sequence:
            return Outcome.STALE
        if self.status is None:
            return Outcome.APPLIED if sequence == 1 and self.machine.creates else Outcome.PARKED
        return Outcome.PARKED if self.version != sequence - 1 else Outcome.APPLIED

    @property
    def unknown_status(self) -> str | None:
        """Why the subject decides nothing here, when a newer version moved it to a status this one does not know."""
        if self.status is None or self.status in self.machine.known:
            return None
        return (f"{self.machine.noun} {self.key} is {self.status}, a status this version does not know (a newer"
                " version's); parked for a version that knows it, or an operator")

    @property
    def full(self) -> bool:
        """Whether the subject holds as many parked events as one may (the machine's ``max_parked``)."""
        return self.parked >= self.machine.max_parked

    def refusal(self, event: OrderedEvent) -> str:
        """Why the subject's state forbids the event: "is <status>; <type> may follow only <statuses>"."""
        if self.status is None:
            return f"does not exist yet; {event.type} does not create one"
        return f"is {self.status}; {event.type} may follow only {', '.join(self.machine.allowed_from(event))}"

    def apply(self, event: OrderedEvent, written: Mapping[str, Any] | None = None) -> Subject:
        """The subject after the event (its version and state already checked); ``written``, the event's data as
        its producer wrote it. The event's sub-object, where one stands, keeps the fields it holds."""
        changes, _ = transition(self.machine, event, written)
        name, _value = self.machine.sub_object(event, written)
        if (stored := self.objects.get(name)) is not None:
            changes[name] = {**stored, **changes[name]}
        if self.status is None:  # its first event creates it, counting what waits (so that its next event's patch,
            # on nothing parked, holds)
            changes = {**self.machine.create(event, written), **changes, "parked": self.parked}
        return self._with(**changes)

    def skip_to(self, event: OrderedEvent) -> Subject:
        """The subject as if the event's missing predecessors had applied: an operator's decision."""
        return replace(self, version=event.sequence - 1)

    def count_parked(self, parked: int) -> Subject:
        """The subject with ``parked`` events waiting for it."""
        return self._with(parked=max(0, parked))

    def release(self, waiting: Sequence[ParkedEvent | UnreadableParked]) -> Release:
        """Settle the parked events that the subject, as it stands, decides: in one pass by sequence.

        ``waiting`` must be every event parked against the subject (all the query's pages): the pass decides
        by sequence, and the count it leaves is what still waits. A parked event in sequence after the subject
        applies; one at or below its version (another event took its version) is stale; one its state forbids
        is rejected with the reason, and so is every one still waiting once it is in a terminal status, since
        none can ever apply. One that does not decode here (``UnreadableParked``, or an event the machine cannot
        decode) stops the release when it is in turn, or its sequence does not read: it stays parked, and so
        does every event at or after its sequence. Stale or out of turn, it stays and stops nothing. The subject
        then counts what still waits and was counted when it was parked: one parked uncounted (its subject did
        not decode then) stays uncounted, so that its drop leaves the count right.
        """
        subject, steps, notes, held = self, [], [], False
        kept: list[ParkedEvent | UnreadableParked] = []
        terminal = self.machine.terminal
        for parked in sorted(waiting, key=_in_sequence):
            if held:
                kept.append(parked)
            elif isinstance(parked, UnreadableParked):
                kept.append(parked)
                if held := parked.sequence is None or subject._turn(parked.sequence) is Outcome.APPLIED:
                    notes.append(f"{parked.reason}; it stays parked, with what follows it")
            elif (turn := subject._turn(parked.sequence)) is Outcome.STALE:  # only an event in turn is decoded
                steps.append(Step(parked))
            elif turn is Outcome.PARKED and subject.status not in terminal:
                kept.append(parked)
            elif isinstance(event := self._event_of(parked), UnreadableDocument):
                kept.append(parked)
                held = turn is Outcome.APPLIED
                notes.append(f"{event}; it stays parked" + (", with what follows it" if held else ""))
            elif (unknown := subject.unknown_status) is not None:
                kept.append(parked)
                held = True
                notes.append(f"{unknown}: event v{parked.sequence} stays parked, with what follows it")
            elif turn is Outcome.APPLIED and subject.decide(event) is Outcome.APPLIED:
                subject = subject.apply(event, parked.data)
                steps.append(Step(parked, event=event))
            else:
                steps.append(Step(parked, rejection=f"{self.machine.noun} {subject.refusal(event)}"))
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

    def _event_of(self, parked: ParkedEvent) -> OrderedEvent | UnreadableDocument:
        try:
            event: OrderedEvent = self.machine.decode(parked)
        except UnreadableDocument as exc:
            return exc
        return event

    def _with(self, **changes: Any) -> Subject:
        state = {k: changes[k] for k in ("status", "version", "parked") if k in changes}
        return replace(self, **state, changes={**self.changes, **changes})


def _in_sequence(parked: ParkedEvent | UnreadableParked) -> tuple[float, bool, float]:
    """By sequence, and by when parked; an unreadable event first at its sequence (it holds back the
    rest), and first of all when its sequence does not read (it holds back every one)."""
    if isinstance(parked, UnreadableParked):
        return -math.inf if parked.sequence is None else parked.sequence, False, 0.0
    return parked.sequence, True, parked.parked_at


@dataclass(frozen=True)
class Step:
    """One parked event a release settles: applied (with its event), rejected (with the reason), or stale."""

    parked: ParkedEvent
    event: OrderedEvent | None = None
    rejection: str | None = None

    @property
    def kind(self) -> str:
        """``applied``, ``rejected`` or ``stale``."""
        return "applied" if self.event is not None else "rejected" if self.rejection is not None else "stale"


@dataclass(frozen=True)
class Release:
    """What a release decides: the subject it starts from, the parked events it settles (``steps``, the applied
    ones first, in sequence), and what it set aside.

    A release may be written in several batches, each taking the next steps. ``after(n)`` is the subject once
    the first ``n`` are written: its version and state from the events applied among them, and its count
    lowered by the counted ones among them, so that the subject and what waits agree after every batch. The
    count is lowered, never set from what this version reads: what a newer version parked and counted (a
    kind of document this one does not know) stays counted.
    """

    start: Subject
    steps: list[Step]
    notes: list[str] = field(default_factory=list)

    def after(self, done: int) -> Subject:
        """The subject once the first ``done`` steps are written."""
        subject = self.start
        for step in self.steps[:done]:
            if step.event is not None:
                subject = subject.apply(step.event, step.parked.data)
        return subject.count_parked(self.start.parked - sum(step.parked.counted for step in self.steps[:done]))

    @property
    def subject(self) -> Subject:
        """The subject once every step is written."""
        return self.after(len(self.steps))

    @property
    def applied(self) -> list[tuple[ParkedEvent, OrderedEvent]]:
        """The parked events applied, with their events, in sequence."""
        return [(step.parked, step.event) for step in self.steps if step.event is not None]

    def describe(self) -> str:
        """What the release did, for the delivery's log record."""
        versions = [event.sequence for _, event in self.applied]
        return "; ".join(([f"released versions {versions}"] if versions else []) + self.notes)
