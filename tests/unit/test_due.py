"""``due``: the one field besides ``type`` the timers' queries filter on, kept as each record's state gives it, and
set by ``migrations.set_due`` on the records a release before wrote without it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from idempotent_consumer.errors import BatchFailed, PreconditionFailed
from idempotent_consumer.migrations import set_due
from idempotent_consumer.ports.store import MAX_PAGE_ITEMS, BatchOperation, Document
from idempotent_consumer.records import (
    DUE_FIELD,
    EffectStatus,
    InboxMarker,
    OutboxEntry,
    OutboxStatus,
    ParkedEvent,
    ParkedStatus,
    SideEffectRecord,
)
from idempotent_consumer.testing.memory import InMemoryStore

ENTRY = OutboxEntry(id="outbox.1", partition="o-1", status=OutboxStatus.PENDING, destination="q", message_id="m",
                    correlation_id=None, session_id=None, subject="OrderAccepted", payload={}, created_at=100.0)
CLAIM = SideEffectRecord(id="side-effect.1", partition="o-1", consumer="c", effect="reserve", idempotency_key="k",
                         status=EffectStatus.IN_PROGRESS, attempt=1, lease_until=160.0)
PARKED = ParkedEvent(id="parked.1", partition="o-1", consumer="c", sequence=3, event_type="t", event_id="e",
                     event_source="s", message_id="m", request_hash="h", parked_at=120.0, event={})


def test_each_timed_record_is_due_from_its_time_while_the_timers_need_it_and_never_after() -> None:
    assert [r.to_document()[DUE_FIELD] for r in (ENTRY, CLAIM, PARKED)] == [100.0, 160.0, 120.0]
    assert ENTRY.with_changes(status=OutboxStatus.DISPATCHED, dispatched_at=130.0)[1][DUE_FIELD] is None
    assert CLAIM.with_changes(attempt=2, lease_until=200.0)[1][DUE_FIELD] == 200.0  # a takeover moves it
    assert CLAIM.with_changes(status=EffectStatus.COMPLETED, reference="r")[1][DUE_FIELD] is None
    assert PARKED.with_changes(status=ParkedStatus.REJECTED, reason="x")[1][DUE_FIELD] is None


def test_a_record_the_timers_never_look_for_carries_no_due() -> None:
    marker = InboxMarker(id="inbox.1", partition="o-1", consumer="c", event_type="t", request_hash="h", ttl=60)
    assert DUE_FIELD not in marker.to_document()
    assert DUE_FIELD not in marker.with_changes(ttl=120)[1]


def _before(record: OutboxEntry | SideEffectRecord | ParkedEvent) -> Document:
    """The record as a release before ``due`` wrote it."""
    return {k: v for k, v in record.to_document().items() if k != DUE_FIELD}


def test_set_due_sets_it_where_it_lacks_leaves_what_has_it_and_what_does_not_decode() -> None:
    store = InMemoryStore()
    newer = {**_before(msgspec.structs.replace(PARKED, id="parked.2")), "sequence": "third", "schemaVersion": 2}
    for document in (_before(ENTRY), _before(CLAIM), PARKED.to_document(), newer):
        asyncio.run(store.create(document))
    counts = asyncio.run(set_due(store))
    assert counts == {"outbox set": 1, "side-effect set": 1, "parked-event already": 1, "parked-event unreadable": 1}
    assert asyncio.run(store.read("outbox.1", "o-1"))[DUE_FIELD] == 100.0
    assert asyncio.run(store.read("side-effect.1", "o-1"))[DUE_FIELD] == 160.0
    assert DUE_FIELD not in asyncio.run(store.read("parked.2", "o-1"))  # a newer version's: left to it


class WrittenMeanwhile(InMemoryStore):
    """Every write refused on its etag: another delivery wrote the record since the backfill read it."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        raise BatchFailed(0, PreconditionFailed("etag moved", status=412))


def test_set_due_leaves_a_record_written_meanwhile() -> None:
    store = WrittenMeanwhile()
    asyncio.run(store.create(_before(ENTRY)))
    assert asyncio.run(set_due(store)) == {"outbox changed": 1}


def test_a_release_reads_what_waits_by_type_and_so_finds_an_event_parked_by_the_release_before() -> None:
    from idempotent_consumer.ordered.writes import waiting  # noqa: PLC0415

    store = InMemoryStore()
    asyncio.run(store.create(_before(PARKED)))  # no due
    asyncio.run(store.create(PARKED.to_document() | {"id": "parked.other", "consumer": "another"}))
    asyncio.run(store.create(PARKED.to_document() | {"id": "parked.aside", "status": "rejected", DUE_FIELD: None}))
    assert [p.id for p in asyncio.run(waiting(store, "c", "o-1"))] == ["parked.1"]


def test_set_due_reads_past_the_first_query_page() -> None:
    store = InMemoryStore()
    for n in range(MAX_PAGE_ITEMS + 1):  # one more than a query page holds
        asyncio.run(store.create(_before(msgspec.structs.replace(PARKED, id=f"parked.{n}"))))
    assert asyncio.run(set_due(store)) == {"parked-event set": MAX_PAGE_ITEMS + 1}
    assert all(d[DUE_FIELD] == 120.0 for d in store.documents())
