"""process_order's stock reservation: the two-phase record around a real HTTP call, on real Cosmos."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devservers.fulfilment import FulfilmentServer
from idempotent_consumer import identity
from shared.adapters.http import HttpFulfilment
from shared.ports.fulfilment import Reply
from tests.functions.conftest import Deliverer, Harness
from tests.support.orders import encode, order_body


def new_order() -> tuple[str, bytes]:
    order_id = f"ord-{uuid.uuid4()}"
    return order_id, encode(order_body(order_id))


def record(target: Harness, order_id: str) -> dict:
    docs = target.container.query_items("SELECT * FROM c WHERE c.type = 'side-effect'", partition_key=order_id)
    [found] = list(docs)
    return found


def reserved(fulfilment: FulfilmentServer, order_id: str) -> dict[str, Any]:
    """The reservation the service made under the order's key ({} before it made one)."""
    return next((r for r in fulfilment.reservations() if r["key"] == key_of(order_id)), {})


def key_of(order_id: str) -> str:
    return identity.effect_key("order-projection", "reserve-stock", order_id)


class CrashAfterCall:
    """The real HTTP adapter, then a crash before the record can be finished."""

    def __init__(self, inner: HttpFulfilment) -> None:
        self.inner = inner

    async def reserve(self, key: str, request: Mapping[str, Any]) -> Reply:
        await self.inner.reserve(key, request)
        raise RuntimeError("worker crashed after the call")


@pytest.fixture
def real(fulfilment: FulfilmentServer, loop: asyncio.Runner) -> Iterator[HttpFulfilment]:
    """The real HTTP adapter, made by the test (so not closed by the app's services): closed on the loop at the end."""
    adapter = HttpFulfilment(fulfilment.url, connect_timeout=2, read_timeout=2)
    yield adapter
    loop.run(adapter.close())


def test_created_order_reserves_once_with_the_derived_key(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id, body = new_order()
    assert deliver_order(body, message_id=order_id)[0].action == "complete"
    stored = record(app_on_cosmos, order_id)
    assert (stored["status"], stored["attempt"], stored["responseStatus"]) == ("completed", 1, 201)
    assert stored["idempotencyKey"] == key_of(order_id)
    assert stored["reference"] == reserved(fulfilment, order_id)["reservationId"]
    [call] = fulfilment.calls(key_of(order_id))
    items = [{"sku": "SKU-1", "quantity": 2}, {"sku": "SKU-2", "quantity": 1}]
    assert call.body == {"orderId": order_id, "items": items}


def test_duplicate_after_completion_does_not_call_again(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    order_id, body = new_order()
    deliver_order(body, message_id=order_id)
    with caplog.at_level("INFO"):
        assert deliver_order(body, message_id=order_id)[0].action == "complete"
    assert len(fulfilment.calls(key_of(order_id))) == 1
    [logged] = [r for r in caplog.records if r.name == "idempotent_consumer"]
    assert vars(logged)["outcome"] == "duplicate"
    assert "reserve-stock completed" in logged.getMessage() and "reference res-" in logged.getMessage()


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_transient_answer_abandons_and_the_redelivery_reserves_once(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, status: int
) -> None:
    order_id, body = new_order()
    fulfilment.fail_next(status)
    assert deliver_order(body, message_id=order_id)[0].action == "abandon"
    released = record(app_on_cosmos, order_id)
    assert released["status"] == "in_progress" and released["leaseUntil"] <= time.time()
    assert deliver_order(body, message_id=order_id)[0].action == "complete"
    assert record(app_on_cosmos, order_id)["attempt"] == 2
    assert [c.status for c in fulfilment.calls(key_of(order_id))] == [status, 201]
    assert [r["key"] for r in fulfilment.reservations()].count(key_of(order_id)) == 1


def test_timeout_abandons_and_the_repeat_call_is_absorbed_by_the_service(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id, body = new_order()
    fulfilment.stall_next(3)  # read timeout is 2 s: the call times out, the service still reserves
    assert deliver_order(body, message_id=order_id)[0].action == "abandon"
    deadline = time.monotonic() + 5
    while not reserved(fulfilment, order_id):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert deliver_order(body, message_id=order_id)[0].action == "complete"
    statuses = [c.status for c in fulfilment.calls(key_of(order_id))]
    assert statuses == [201, 200]  # one reservation; the repeat got the stored answer
    assert record(app_on_cosmos, order_id)["reference"] == reserved(fulfilment, order_id)["reservationId"]


def test_unreachable_service_abandons(app_on_cosmos: Harness, deliver_order: Deliverer) -> None:
    with FulfilmentServer() as closing:
        url = closing.url
    app_on_cosmos.reconfigure(fulfillment_url=url)
    order_id, body = new_order()
    assert deliver_order(body, message_id=order_id)[0].action == "abandon"


def of_type(target: Harness, order_id: str, kind: str) -> list[dict[str, Any]]:
    return list(target.container.query_items("SELECT * FROM c WHERE c.type = @t", partition_key=order_id,
                                             parameters=[{"name": "@t", "value": kind}]))


@pytest.mark.parametrize("status", [400, 404, 422, 501])
def test_a_refused_call_is_dead_lettered_announces_nothing_and_a_resubmission_reserves(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, status: int
) -> None:
    # Not the order refused, the call: a wrong URL or credentials, the draft's 422 for a key reused with another
    # request. Nothing is announced, and the claim waits for the operator's resubmission.
    order_id, body = new_order()
    fulfilment.fail_next(status, reason="no such route")
    [settlement] = deliver_order(body, message_id=order_id, sequence_number=1)
    assert (settlement.action, settlement.reason) == ("deadletter", "DownstreamRejected")
    assert settlement.description is not None
    assert f"HTTP {status}" in settlement.description and "no such route" in settlement.description
    held = record(app_on_cosmos, order_id)
    assert (held["status"], held["responseStatus"], held["reason"]) == ("in_progress", status, "no such route")
    assert of_type(app_on_cosmos, order_id, "outbox") == []
    [again] = deliver_order(body, message_id=order_id, sequence_number=2)  # resubmitted once put right
    assert again.action == "complete"
    assert (record(app_on_cosmos, order_id)["status"], record(app_on_cosmos, order_id)["attempt"]) == ("completed", 2)
    assert [e["subject"] for e in of_type(app_on_cosmos, order_id, "outbox")] == ["OrderAccepted"]
    assert [c.status for c in fulfilment.calls(key_of(order_id))] == [status, 201]


def test_an_order_out_of_stock_is_completed_rejected_and_announced_once_as_order_rejected(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    body = encode(order_body(order_id, items=[{"sku": "SOLDOUT-3", "quantity": 1, "unitPrice": "44.98"}]))
    [settlement] = deliver_order(body, message_id=order_id, sequence_number=1)
    assert settlement.action == "complete"
    assert (record(app_on_cosmos, order_id)["status"], record(app_on_cosmos, order_id)["refusal"]) == (
        "rejected", "out-of-stock")
    [order] = of_type(app_on_cosmos, order_id, "order")
    assert order["rejection"]["reason"] == "SOLDOUT-3 is out of stock"
    [entry] = of_type(app_on_cosmos, order_id, "outbox")
    assert (entry["subject"], entry["destination"], entry["status"]) == ("OrderRejected", "order-rejected", "pending")
    # A copy: rejected again, from the record, without a call; still one outcome.
    assert deliver_order(body, message_id=order_id, sequence_number=2)[0].action == "complete"
    assert len(fulfilment.calls(key_of(order_id))) == 1 and len(of_type(app_on_cosmos, order_id, "outbox")) == 1
    assert reserved(fulfilment, order_id) == {}


def test_no_order_accepted_exists_while_the_reservation_has_not_succeeded(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id, body = new_order()
    fulfilment.fail_next(503, count=2)
    for _ in range(2):
        assert deliver_order(body, message_id=order_id, sequence_number=1)[0].action == "abandon"
        assert of_type(app_on_cosmos, order_id, "outbox") == []  # nothing for the change feed to publish
    assert deliver_order(body, message_id=order_id, sequence_number=1)[0].action == "complete"
    [entry] = of_type(app_on_cosmos, order_id, "outbox")
    assert entry["subject"] == "OrderAccepted" and entry["payload"]["orderId"] == order_id


def test_crash_after_the_call_a_copy_completes_and_the_redelivery_takes_over_at_once(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, real: HttpFulfilment,
) -> None:
    order_id, body = new_order()
    app_on_cosmos.reconfigure(fulfilment=CrashAfterCall(real))
    lock_ends = datetime.now(UTC) + timedelta(minutes=1)
    first = deliver_order(body, message_id=order_id, locked_until=lock_ends, sequence_number=7)
    assert first[0].action == "abandon"
    claimed = record(app_on_cosmos, order_id)
    assert (claimed["status"], claimed["messageSequence"]) == ("in_progress", 7)
    assert claimed["leaseUntil"] == pytest.approx(lock_ends.timestamp(), 1)
    app_on_cosmos.reconfigure(fulfilment=real)
    # A copy sent as another message, while the claim is live: a duplicate, completed, no second call.
    [copy] = deliver_order(body, message_id=order_id, sequence_number=8)
    assert (copy.action, len(fulfilment.calls(key_of(order_id)))) == ("complete", 1)
    assert record(app_on_cosmos, order_id)["status"] == "in_progress"
    # The claiming message's redelivery takes over at once, lease or not, and calls with the same key.
    assert deliver_order(body, message_id=order_id, sequence_number=7)[0].action == "complete"
    finished = record(app_on_cosmos, order_id)
    assert (finished["status"], finished["attempt"]) == ("completed", 2)
    assert fulfilment.keys().count(key_of(order_id)) == 1
    assert [c.status for c in fulfilment.calls(key_of(order_id))] == [201, 200]


def test_a_copy_takes_over_a_claim_whose_lease_expired(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, real: HttpFulfilment,
) -> None:
    order_id, body = new_order()
    # A one-second lease: the host renews the claimant's lock for minutes, so its lease ends by the setting.
    app_on_cosmos.reconfigure(fulfilment=CrashAfterCall(real), side_effect_lease_seconds=1)
    lease_ends = time.time() + 1
    deliver_order(body, message_id=order_id, sequence_number=1)
    app_on_cosmos.reconfigure(fulfilment=real)
    time.sleep(max(0.0, lease_ends - time.time()) + 0.2)
    assert deliver_order(body, message_id=order_id, sequence_number=2)[0].action == "complete"
    finished = record(app_on_cosmos, order_id)
    assert (finished["status"], finished["attempt"], finished["messageSequence"]) == ("completed", 2, 2)
    assert [c.status for c in fulfilment.calls(key_of(order_id))] == [201, 200]


def test_lease_is_capped_by_the_setting(
    app_on_cosmos: Harness, deliver_order: Deliverer, real: HttpFulfilment,
) -> None:
    app_on_cosmos.reconfigure(side_effect_lease_seconds=5, fulfilment=CrashAfterCall(real))
    order_id, body = new_order()
    before = time.time()
    deliver_order(body, message_id=order_id, locked_until=datetime.now(UTC) + timedelta(minutes=5))
    assert record(app_on_cosmos, order_id)["leaseUntil"] <= before + 6


def test_a_takeover_and_its_finish_on_cosmos_keep_the_fields_this_version_does_not_model(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id, body = new_order()
    fulfilment.fail_next(503)
    assert deliver_order(body, message_id=order_id, sequence_number=3)[0].action == "abandon"
    released = record(app_on_cosmos, order_id)
    foreign = {"schemaVersion": 2, "compensation": {"policy": "refund", "steps": ["void", "notify"]}}
    app_on_cosmos.container.replace_item(released["id"], {**released, **foreign})
    assert deliver_order(body, message_id=order_id, sequence_number=3)[0].action == "complete"
    finished = record(app_on_cosmos, order_id)
    assert (finished["status"], finished["attempt"], finished["responseStatus"]) == ("completed", 2, 201)
    assert {k: finished[k] for k in foreign} == foreign


def test_a_409_for_a_key_in_use_is_transient_and_the_next_delivery_reserves_once(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    # A service following the IETF Idempotency-Key draft answers 409 to a request whose key a concurrent one
    # holds (a takeover overlapping the first call): the delivery waits inside its lock and is abandoned, the
    # record released, never marked failed nor the message dead-lettered.
    order_id, body = new_order()
    fulfilment.fail_next(409, reason="a request with this Idempotency-Key is being processed")
    [settled, *_] = deliver_order(body, message_id=order_id, sequence_number=3)
    assert settled.action == "abandon"
    released = record(app_on_cosmos, order_id)
    assert released["status"] == "in_progress" and released["leaseUntil"] <= time.time()
    assert deliver_order(body, message_id=order_id, sequence_number=3)[0].action == "complete"
    assert record(app_on_cosmos, order_id)["status"] == "completed"
    assert [c.status for c in fulfilment.calls(key_of(order_id))] == [409, 201]  # one reservation, by the second
