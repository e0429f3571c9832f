"""The outbox publisher marks an entry dispatched only on the etag it read, and never sends one it could not mark."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from idempotent_consumer.errors import PublishError, TransientStoreError
from idempotent_consumer.outbox import FINISH_TRIES
from idempotent_consumer.ports.sender import OutgoingMessage
from idempotent_consumer.ports.store import Delete, Patch
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.settings import Settings
from tests.support.orders import inbound, order_body

SETTINGS = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)
run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


def test_an_entry_without_an_etag_is_not_sent_and_left_pending_not_marked_unconditionally() -> None:
    store, sender = InMemoryStore(default_ttl=-1), RecordingSender()
    app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender)
    run(app.handle_order(inbound(order_body("ord-1"))))
    [entry] = [d for d in store.documents() if d["type"] == "outbox"]
    del entry["_etag"]  # not as the store handed it out: a mark on it would hold whatever changed since
    report = run(app.publisher().publish([entry]))
    assert (report.dispatched, report.failed) == ((), (entry["id"],))
    assert sender.sent == []
    assert [d["status"] for d in store.documents() if d["type"] == "outbox"] == ["pending"]


class CountingSender(RecordingSender):
    """Records each send call's destination and size; fails the calls whose number (from 1) is in
    ``failing``, and every call that holds the MessageId ``poison``."""

    def __init__(self, failing: frozenset[int] = frozenset(), poison: str | None = None) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.destinations: list[str] = []
        self._failing = failing
        self._poison = poison

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        self.calls.append(len(messages))
        self.destinations.append(destination)
        if len(self.calls) in self._failing or any(m.message_id == self._poison for m in messages):
            raise PublishError(f"send to {destination} failed: injected")
        await super().send(destination, messages)


def _backlog(orders: int, sender: RecordingSender) -> tuple[bootstrap.App, InMemoryStore]:
    """``orders`` orders placed an hour ago whose OrderAccepted was never published: the sweep's backlog."""
    now = [time.time() - 3600]
    store = InMemoryStore(default_ttl=-1)
    app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender, clock=lambda: now[0])
    for n in range(orders):
        run(app.handle_order(inbound(order_body(f"ord-{n}"))))
    now[0] = time.time()
    return app, store


def _outbox(store: InMemoryStore) -> list[dict[str, Any]]:
    return [d for d in store.documents() if d["type"] == "outbox"]


def _pending(store: InMemoryStore) -> int:
    return sum(1 for d in _outbox(store) if d["status"] == "pending")


def test_one_sweep_publishes_a_backlog_of_250_in_sends_of_100_each_followed_by_its_marks() -> None:
    sender = CountingSender()
    app, store = _backlog(250, sender)
    report = run(app.publisher().sweep(stuck_after_seconds=300))
    assert (len(report.dispatched), report.failed, sender.calls) == (250, (), [100, 100, 50])
    assert _pending(store) == 0
    assert len({m.message_id for _, m in sender.delivered}) == 250


def test_a_chunk_whose_send_failed_is_sent_again_one_entry_at_a_time() -> None:
    sender = CountingSender(failing=frozenset({2}))
    app, store = _backlog(250, sender)
    report = run(app.publisher().sweep(stuck_after_seconds=300))
    assert (len(report.dispatched), report.failed, _pending(store)) == (250, (), 0)
    assert sender.calls == [100, 100, *[1] * 100, 50]


def test_an_entry_that_cannot_be_sent_holds_back_no_other_and_stays_pending() -> None:
    sender = CountingSender()
    app, store = _backlog(150, sender)
    poisoned = _outbox(store)[42]
    sender._poison = poisoned["messageId"]
    report = run(app.publisher().sweep(stuck_after_seconds=300))
    assert (len(report.dispatched), report.failed) == (149, (poisoned["id"],))
    assert [d["id"] for d in _outbox(store) if d["status"] == "pending"] == [poisoned["id"]]


def test_entries_for_two_destinations_go_in_sends_of_their_own() -> None:
    sender = CountingSender()
    app, store = _backlog(5, sender)
    other = _outbox(store)[1]
    # as written by an app configured for another queue
    run(store.execute_batch(other["orderId"], [Patch(other["id"], {"destination": "order-accepted-eu"})]))
    report = run(app.publisher().sweep(stuck_after_seconds=300))
    assert len(report.dispatched) == 5
    assert sorted(zip(sender.destinations, sender.calls, strict=True)) == [("order-accepted", 4),
                                                                           ("order-accepted-eu", 1)]


def test_the_sweep_reads_every_page_of_a_backlog_in_one_run() -> None:
    sender = CountingSender()
    app, store = _backlog(250, sender)
    store._page_items = 7  # pages far smaller than the backlog: the sweep must follow them all
    report = run(app.publisher().sweep(stuck_after_seconds=300))
    assert (len(report.dispatched), _pending(store)) == (250, 0)


class FailingFinishes(InMemoryStore):
    """Fails the publisher's delete of a sent entry ``times`` times with a 503 (the whole request, as the adapter
    raises it), then writes as asked."""

    def __init__(self, times: int) -> None:
        super().__init__(default_ttl=-1)
        self.times = times

    async def execute_batch(self, partition_key: str, operations: Sequence[Any]) -> list[dict[str, Any]]:
        if self.times and any(isinstance(op, Delete) and op.doc_id.startswith("outbox.") for op in operations):
            self.times -= 1
            raise TransientStoreError(f"batch of 1 in {partition_key}: HTTP 503", status=503)
        return await super().execute_batch(partition_key, operations)


def test_a_sent_entry_whose_delete_meets_a_503_is_deleted_by_a_try_again_not_left_for_the_sweep() -> None:
    store, sender = FailingFinishes(FINISH_TRIES - 1), RecordingSender()
    app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender)
    run(app.handle_order(inbound(order_body("ord-1"))))
    [entry] = [d for d in store.documents() if d["type"] == "outbox"]
    report = run(app.publisher().publish([entry]))
    assert (report.dispatched, report.failed) == ((entry["id"],), ())
    assert [d for d in store.documents() if d["type"] == "outbox"] == [] and len(sender.sent) == 1


def test_a_sent_entry_whose_delete_keeps_failing_is_left_pending_for_the_sweep() -> None:
    store, sender = FailingFinishes(FINISH_TRIES), RecordingSender()
    app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender)
    run(app.handle_order(inbound(order_body("ord-1"))))
    [entry] = [d for d in store.documents() if d["type"] == "outbox"]
    report = run(app.publisher().publish([entry]))
    assert (report.dispatched, report.failed) == ((), (entry["id"],))
    assert [d["status"] for d in store.documents() if d["type"] == "outbox"] == ["pending"]


class WrittenUnderTheSend(RecordingSender):
    """Sends; meanwhile another writer patches the entry (its ``fields``), as ``sbctl index backfill`` sets ``due``
    or an enrichment job adds a field of its own, or the message itself (a ``payload/`` path)."""

    def __init__(self, store: InMemoryStore, fields: dict[str, Any]) -> None:
        super().__init__()
        self.store, self.fields = store, fields

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        await super().send(destination, messages)
        for entry in _outbox(self.store):
            await self.store.execute_batch(entry["orderId"], [Patch(entry["id"], self.fields)])


def test_a_sent_entry_changed_under_its_send_but_not_in_its_message_is_deleted_on_its_new_etag() -> None:
    for fields in ({"due": 1.0}, {"enrichedBy": "crm"}):
        store = InMemoryStore(default_ttl=-1)
        sender = WrittenUnderTheSend(store, fields)
        app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender)
        run(app.handle_order(inbound(order_body("ord-1"))))
        [entry] = _outbox(store)
        report = run(app.publisher().publish([entry]))
        assert (report.dispatched, _outbox(store), len(sender.sent)) == ((entry["id"],), [], 1), fields


def test_a_sent_entry_whose_message_changed_under_its_send_is_left_for_its_new_message_to_be_sent() -> None:
    store = InMemoryStore(default_ttl=-1)
    sender = WrittenUnderTheSend(store, {"payload/channel": "web"})
    app = bootstrap.build(SETTINGS, store=store, fulfilment=InMemoryFulfilment(), sender=sender)
    run(app.handle_order(inbound(order_body("ord-1"))))
    [entry] = _outbox(store)
    run(app.publisher().publish([entry]))
    [left] = _outbox(store)
    assert left["status"] == "pending" and left["payload"]["channel"] == "web"  # the sweep or the feed sends it
