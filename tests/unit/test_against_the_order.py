"""The reservation is decided, and its outcome announced, against the order's status as it is then: an order
cancelled while its reservation's call runs keeps the reservation the call made (decided while it was open), and
announces nothing; a takeover that finds the order closed makes no further call."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment, InMemoryStore, RecordingSender
from shared.domain.lifecycle import ORDER_CANCELLED
from shared.domain.outcomes import Outcome
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body

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
    [record] = [d for d in documents if d["type"] == "side-effect"]
    assert (record["status"], record["announces"]) == ("completed", False)
    order = next(d for d in documents if d["type"] == "order")
    assert order["status"] == "cancelled" and "reservation" not in order
    # A copy of the order after it: the record is finished; nothing is called or announced.
    again = asyncio.run(app.handle_order(inbound(order_body("ord-1"), sequence_number=8)))
    assert again.outcome is Outcome.ORDER_CLOSED and len(fulfilment.ledger.reservations()) == 1
