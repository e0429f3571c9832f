"""The breaker and a chain's last delivery, through the function entry points (issue 40, part 5): what needs no
dependency is decided before the breaker is asked; only a call that reached the dependency closes it; the chain's
last delivery gets every try of its lock, probe or not; and a last copy that comes a little early by this
instance's clock is the last all the same."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from devservers.fulfilment import FulfilmentServer
from idempotent_consumer import retries
from idempotent_consumer.testing.memory import RecordingSender
from tests.functions.conftest import Deliverer, Harness, reservation_calls
from tests.support.orders import encode, order_body

OPEN_SECONDS = 30
TOTAL = 3600


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sender(app_on_cosmos: Harness, clock: Clock) -> Iterator[RecordingSender]:
    recording = RecordingSender()
    app_on_cosmos.reconfigure(sender=recording, clock=clock, delayed_retries=True, retry_in_lock_attempts=3,
                              breaker_window=4, breaker_open_seconds=OPEN_SECONDS, retry_backoff_seconds=10,
                              retry_total_seconds=TOTAL)
    yield recording



def open_the_breaker(harness: Harness, deliver: Deliverer, fulfilment: FulfilmentServer,
                     sender: RecordingSender) -> None:
    """Two orders meet the fulfilment service down: six failed attempts of a window of four open the breaker."""
    fulfilment.fail_next(503, count=1000)
    for _ in range(2):
        order_id = f"ord-{uuid.uuid4()}"
        assert deliver(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    [breaker] = harness.app.breakers
    assert breaker.is_open
    sender.sent.clear()


def test_an_amqp_value_body_is_dead_lettered_invalid_while_the_breaker_is_open_not_handed_on_empty(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender
) -> None:
    open_the_breaker(app_on_cosmos, deliver_order, fulfilment, sender)
    order_id = f"ord-{uuid.uuid4()}"
    [settlement] = deliver_order(None, message_id=order_id, body_value=order_body(order_id))
    assert (settlement.action, settlement.reason) == ("deadletter", "InvalidMessage")
    assert sender.sent == []


def test_a_message_without_a_message_id_is_dead_lettered_for_it_while_the_breaker_is_open(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender
) -> None:
    open_the_breaker(app_on_cosmos, deliver_order, fulfilment, sender)
    [settlement] = deliver_order(encode(order_body(f"ord-{uuid.uuid4()}")), message_id=None)
    assert (settlement.action, settlement.reason) == ("deadletter", "InvalidMessage")
    assert "MessageId is missing" in (settlement.description or "")
    assert sender.sent == []


def test_a_probe_answered_from_cosmos_alone_does_not_close_the_breaker_and_the_next_delivery_probes(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender,
    clock: Clock,
) -> None:
    done = f"ord-{uuid.uuid4()}"
    assert deliver_order(encode(order_body(done)), message_id=done)[0].action == "complete"  # reserved
    open_the_breaker(app_on_cosmos, deliver_order, fulfilment, sender)
    [breaker] = app_on_cosmos.app.breakers
    clock.now += OPEN_SECONDS
    # The probe is a copy of an order whose stock is reserved: Cosmos DB answers it; the service is not asked.
    assert deliver_order(encode(order_body(done)), message_id=done)[0].action == "complete"
    assert breaker.is_open, "a probe that never reached the fulfilment service closed the breaker"
    fulfilment.reset_faults()
    fresh = f"ord-{uuid.uuid4()}"
    assert deliver_order(encode(order_body(fresh)), message_id=fresh)[0].action == "complete"
    assert reservation_calls(fulfilment, fresh) == [201]  # the next delivery was the probe, at once
    assert not breaker.is_open


def copy_of(order_id: str, *, attempt: int, first: datetime) -> dict[str, str]:
    return {retries.ORIGINAL: order_id, retries.CHAIN: "5", retries.ATTEMPT: str(attempt),
            retries.FIRST_FAILED_AT: first.isoformat()}


def test_the_chains_last_delivery_admitted_as_the_probe_gets_every_try_of_its_lock(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender,
    clock: Clock,
) -> None:
    open_the_breaker(app_on_cosmos, deliver_order, fulfilment, sender)
    clock.now += OPEN_SECONDS  # a probe is due
    order_id = f"ord-{uuid.uuid4()}"
    first = datetime.fromtimestamp(clock.now - TOTAL, UTC)  # the chain's deadline is now: this is its last delivery
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=f"retry.9_{order_id}", sequence_number=88,
                                 application_properties=copy_of(order_id, attempt=9, first=first))
    assert (settlement.action, settlement.reason) == ("deadletter", "RetryLimitExceeded")
    assert reservation_calls(fulfilment, order_id) == [503, 503, 503]
    assert sender.sent == []


def test_a_last_copy_a_little_early_by_this_instances_clock_is_the_last_not_handed_on_again(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, sender: RecordingSender,
    clock: Clock,
) -> None:
    fulfilment.fail_next(503, count=1000)
    order_id = f"ord-{uuid.uuid4()}"
    first = datetime.fromtimestamp(clock.now, UTC) - timedelta(seconds=TOTAL - 2)  # due at the limit, 2 s early
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=f"retry.9_{order_id}", sequence_number=89,
                                 application_properties=copy_of(order_id, attempt=9, first=first))
    assert (settlement.action, settlement.reason) == ("deadletter", "RetryLimitExceeded")
    assert reservation_calls(fulfilment, order_id) == [503, 503, 503]
    assert sender.sent == []
