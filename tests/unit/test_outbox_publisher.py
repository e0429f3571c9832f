"""The outbox publisher marks an entry dispatched only on the etag it read, and never sends one it could not mark."""

from __future__ import annotations

import asyncio

from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment, InMemoryStore, RecordingSender
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
