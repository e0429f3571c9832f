"""The reservation is decided, and its outcome announced, against the order's status as it is then: an order
cancelled while its reservation's call runs keeps the reservation the call made (decided while it was open), and
announces nothing; a takeover that finds the order closed makes no further call."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.records import SideEffectRecord
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.lifecycle import ORDER_CANCELLED
from shared.handlers.place_order import reservation
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import claims, removed

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

SETTINGS = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)


class CancelledDuringTheCall(InMemoryFulfilment):
    """The service, which reserves; while it does, the order's cancellation is applied."""

    def __init__(self) -> None:
        super().__init__()
        self.app: bootstrap.App | None = None

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        assert self.app is not None
        cancel = event_body(str(request["orderId"]), 2, ORDER_CANCELLED)
        applied = await self.app.handle_event(inbound(encode_event(cancel), message_id=cancel["id"]))
        assert applied.outcome is Outcome.APPLIED
        return await super().reserve(idempotency_key, request)


def test_an_order_cancelled_while_its_reservation_call_runs_is_reserved_and_announces_nothing() -> None:
    store, fulfilment = InMemoryStore(), CancelledDuringTheCall()
    app = bootstrap.build(SETTINGS, store=store, fulfilment=fulfilment, sender=RecordingSender())
    fulfilment.app = app
    result = asyncio.run(app.handle_order(inbound(order_body("ord-1"), sequence_number=7)))
    assert result.outcome is Outcome.ORDER_CLOSED
    assert "not announced" in result.description
    assert len(fulfilment.ledger.reservations()) == 1  # decided, and made, while the order was open
    documents = store.documents()
    assert [d for d in documents if d["type"] == "outbox"] == []
    [record] = claims(documents)
    assert (record["status"], record["announces"]) == ("completed", False)
    order = next(d for d in documents if d["type"] == "order")
    assert order["status"] == "cancelled" and "reservation" not in order
    # A copy of the order after it: the record is finished; nothing is called or announced.
    again = asyncio.run(app.handle_order(inbound(order_body("ord-1"), sequence_number=8)))
    assert again.outcome is Outcome.ORDER_CLOSED and len(fulfilment.ledger.reservations()) == 1


def cancel(app: bootstrap.App, order_id: str) -> None:
    body = event_body(order_id, 2, ORDER_CANCELLED)
    assert asyncio.run(app.handle_event(inbound(encode_event(body), message_id=body["id"]))).outcome is \
        Outcome.APPLIED


class Down(InMemoryFulfilment):
    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        return Reply(503)


def test_a_cancelled_orders_copy_whose_claim_was_removed_writes_it_closed_instead_of_retrying() -> None:
    store = InMemoryStore()
    app = bootstrap.build(SETTINGS, store=store, fulfilment=Down(), sender=RecordingSender())
    assert asyncio.run(app.handle_order(inbound(order_body("ord-2"), sequence_number=7))).outcome is Outcome.TRANSIENT
    [claim] = claims(store.documents())
    asyncio.run(removed(store, claim))  # removed by hand
    cancel(app, "ord-2")
    again = asyncio.run(app.handle_order(inbound(order_body("ord-2"), sequence_number=9)))
    assert again.outcome is Outcome.ORDER_CLOSED
    [closed] = claims(store.documents())
    assert (closed["status"], closed["refusal"], closed["announces"]) == ("rejected", "order-cancelled", False)


class ClosedUnderTheCall(InMemoryFulfilment):
    """The service, which reserves; while it does, another delivery closes the claim (the order cancelled after this
    call's lease ran out)."""

    def __init__(self) -> None:
        super().__init__()
        self.close: Any = None

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        await self.close()
        return await super().reserve(idempotency_key, request)


def test_a_reservation_made_after_another_delivery_closed_its_claim_is_recorded_with_its_reference() -> None:
    store, fulfilment = InMemoryStore(), ClosedUnderTheCall()
    app = bootstrap.build(SETTINGS, store=store, fulfilment=fulfilment, sender=RecordingSender())

    async def close() -> None:
        [claim] = claims(store.documents())
        effect = reservation(store, SETTINGS)  # the app's, in the claim's form
        closed = await effect.close(SideEffectRecord.from_document(claim), "order-cancelled", "cancelled")
        assert closed.outcome is Outcome.ORDER_CLOSED
    fulfilment.close = close
    result = asyncio.run(app.handle_order(inbound(order_body("ord-3"), sequence_number=7)))
    assert result.outcome is Outcome.ORDER_CLOSED
    [record] = claims(store.documents())
    assert (record["status"], record["announces"], record["responseStatus"]) == ("completed", False, 201)
    assert record["reference"] and [d for d in store.documents() if d["type"] == "outbox"] == []
