"""report_stuck finds what waits too long, and only that: parked events and side effects in progress."""

from __future__ import annotations

import asyncio
import logging

import pytest

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.reports import report_stuck
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.lifecycle import ORDER_SHIPPED
from shared.handlers.apply_event import apply_order_event
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.metrics import overdue_counts

run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def park(store: InMemoryStore, clock: Clock, order_id: str) -> None:
    body = event_body(order_id, 3, ORDER_SHIPPED)
    message = InboundMessage(message_id=body["id"], body=encode_event(body), session_id=order_id)
    assert run(apply_order_event(message, store, Settings(), clock)).outcome.value == "parked"


def test_parked_events_older_than_the_alert_age_are_reported_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    store = InMemoryStore(default_ttl=-1, clock=clock)
    park(store, clock, "ord-old")
    clock.now += 1000
    park(store, clock, "ord-young")
    before = overdue_counts()
    with caplog.at_level(logging.WARNING):
        found = run(report_stuck(store, consumer="order-projection", now=clock.now, parked_after=900,
                                 stuck_after=300))
    assert [p.partition for p in found.parked] == ["ord-old"]
    assert overdue_counts()[("parked", "ord-old")] == before[("parked", "ord-old")] + 1
    assert any("overdue parked orderId=ord-old" in r.getMessage() for r in caplog.records)


def test_side_effects_in_progress_past_their_lease_are_reported_but_finished_ones_are_not() -> None:
    clock = Clock()
    store = InMemoryStore(default_ttl=-1, clock=clock)
    effect = SideEffect(store, "order-projection", "reserve-stock", 60, clock)
    message = InboundMessage(message_id="m", body=None, sequence_number=1)
    run(store.create(effect.claim("ord-stuck", message).to_document()))
    service = InMemoryFulfilment()

    async def reserve(key: str) -> Reply:
        return await service.reserve(key, {"orderId": "ord-done"})

    result = run(effect.run(effect.claim("ord-done", message), message, reserve, done=Outcome.CREATED))
    assert result.outcome is Outcome.CREATED
    clock.now += 60 + 301
    found = run(report_stuck(store, consumer="order-projection", now=clock.now, parked_after=900, stuck_after=300))
    assert [r.partition for r in found.side_effects] == ["ord-stuck"]
