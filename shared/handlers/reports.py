"""Reports of work that waits too long: events parked past an alert age, side effects stuck in progress.

Neither is retried here. A parked event waits for its predecessor; a side effect in progress waits
for a redelivery of the message that claimed it. The report makes the wait visible: a warning per
item and the ``consumer.overdue`` counter by kind and order, which an alert rule can watch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.domain.documents import ParkedEvent, SideEffectRecord
from shared.ports.store import DocumentStore
from shared.telemetry import record_overdue

MAX_REPORTED = 100


@dataclass(frozen=True)
class StuckReport:
    """What one run found."""

    parked: tuple[ParkedEvent, ...]
    side_effects: tuple[SideEffectRecord, ...]


async def report_stuck(
    store: DocumentStore, *, consumer: str, now: float, parked_after: float, stuck_after: float
) -> StuckReport:
    """Find, log and count events parked longer than ``parked_after`` and side effects whose lease
    ended more than ``stuck_after`` seconds ago, up to MAX_REPORTED of each."""
    parked = tuple(ParkedEvent.from_document(d) for d in await store.query(
        ParkedEvent.waiting(consumer), before=("parkedAt", now - parked_after), limit=MAX_REPORTED))
    stuck = tuple(SideEffectRecord.from_document(d) for d in await store.query(
        SideEffectRecord.in_progress(), before=("leaseUntil", now - stuck_after), limit=MAX_REPORTED))
    for event in parked:
        record_overdue("parked", event.order_id, f"sequence={event.sequence} eventId={event.event_id}"
                                                 f" parkedSeconds={now - event.parked_at:.0f}")
    for record in stuck:
        record_overdue("side-effect", record.order_id, f"effect={record.effect} attempt={record.attempt}"
                                                       f" claimant={record.message_sequence}")
    return StuckReport(parked, stuck)
