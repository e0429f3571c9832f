"""Reports of work that waits too long: events parked past an alert age, side effects stuck in progress.

Neither is retried here. A parked event waits for its predecessor; a side effect in progress waits
for a redelivery of the message that claimed it. The report makes the wait visible: a warning per
item and the ``consumer.overdue`` counter by kind and order, which an alert rule can watch. An item
that does not decode here (a newer version's) is reported as it stands, by its id and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from idempotent_consumer.errors import UnreadableDocument
from idempotent_consumer.ports.store import Document, DocumentStore, query_all
from idempotent_consumer.records import TYPE_FIELD, EffectStatus, ParkedEvent, SideEffectRecord
from idempotent_consumer.side_effects import stored_claims
from idempotent_consumer.telemetry import record_overdue

_Kind = TypeVar("_Kind", ParkedEvent, SideEffectRecord)


@dataclass(frozen=True)
class StuckReport:
    """What one run found."""

    parked: tuple[ParkedEvent, ...]
    side_effects: tuple[SideEffectRecord, ...]
    unreadable: tuple[str, ...] = ()  # ids of the items found that do not decode here, reported by id


async def report_stuck(
    store: DocumentStore, *, consumer: str, now: float, parked_after: float, stuck_after: float,
    claims_within: tuple[str, str] | None = None,
) -> StuckReport:
    """Find, log and count events parked longer than ``parked_after`` and side effects whose lease
    ended more than ``stuck_after`` seconds ago: every one, read through all the queries' pages. With
    ``claims_within`` (a subject's ``type`` and the field that keeps its claim: ``SideEffect.within``), the claims
    kept in those subjects too, found by the subject's ``due``."""
    unreadable: list[str] = []
    # Each query filters on type and due alone, the paths the orders container indexes; what else it asks
    # (this consumer's, still parked, still in progress) is checked as read.
    conditions, before = ParkedEvent.parked_before(now - parked_after)
    parked = _decoded(ParkedEvent, "parked", unreadable, [
        d for d in await query_all(store, conditions, before=before) if ParkedEvent.waits_for(consumer, d)])
    conditions, before = SideEffectRecord.in_progress_before(now - stuck_after)
    found = await query_all(store, conditions, before=before)
    if claims_within is not None:
        subject_type, within = claims_within
        found += stored_claims(await query_all(store, {TYPE_FIELD: subject_type}, before=before), within)
    stuck = _decoded(SideEffectRecord, "side-effect", unreadable, [
        d for d in found if d.get("status") == EffectStatus.IN_PROGRESS.value])
    for event in parked:
        record_overdue("parked", event.partition, f"sequence={event.sequence} eventId={event.event_id}"
                                                 f" parkedSeconds={now - event.parked_at:.0f}")
    for record in stuck:
        record_overdue("side-effect", record.partition, f"effect={record.effect} attempt={record.attempt}"
                                                       f" claimant={record.message_sequence}")
    return StuckReport(parked, stuck, tuple(unreadable))


def _decoded(kind: type[_Kind], label: str, unreadable: list[str], found: Iterable[Document]) -> tuple[_Kind, ...]:
    """The items that decode; each one that does not is reported by its id now, and noted in ``unreadable``."""
    items = []
    for document in found:
        try:
            items.append(kind.from_document(document))
        except UnreadableDocument as exc:
            unreadable.append(exc.doc_id)
            record_overdue(label, str(document.get("orderId")), f"id={exc.doc_id} unreadable: {exc}")
    return tuple(items)
