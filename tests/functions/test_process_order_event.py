"""process_order_event end to end: real message and settlement client, real Cosmos SDK and batches."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from azure.functions.timer import TimerRequest

from devservers.faultproxy import FaultProxy
from idempotent_consumer.delivery import run_delivery
from idempotent_consumer.functions.binding import to_inbound
from idempotent_consumer.functions.settlement import ActionsSettlement
from idempotent_consumer.identity import side_effect_id
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from shared.handlers.place_order import RESERVE_STOCK
from tests.functions.conftest import Deliverer, Harness
from tests.support.audit import audit_handler
from tests.support.events import encode_event, event_body
from tests.support.metrics import outcome_counts, overdue_counts
from tests.support.orders import encode, order_body
from tests.support.records import recorded

DOCS = r"/docs/?$"


CONSUMER = "order-projection"


@pytest.fixture
def order_id(app_on_cosmos: Harness, deliver_order: Deliverer) -> str:
    """An order placed through process_order (version 1)."""
    new = f"ord-{uuid.uuid4()}"
    assert deliver_order(encode(order_body(new)), message_id=new)[0].action == "complete"
    return new


def send(deliver: Deliverer, body: dict, **message: object) -> tuple[str, str | None, str | None]:
    message.setdefault("session_id", body["subject"])
    [settlement] = deliver(encode_event(body), message_id=body["id"], **message)
    return settlement.action, settlement.reason, settlement.description


def docs_of(target: Harness, order_id: str, doc_type: str | None = None) -> list[dict]:
    docs = list(target.container.query_items("SELECT * FROM c", partition_key=order_id))
    return [d for d in docs if doc_type is None or d.get("type") == doc_type]


def order(target: Harness, order_id: str) -> dict:
    return target.container.read_item(order_id, partition_key=order_id)


def test_event_is_applied_with_marker_record_and_patch(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    assert send(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED))[0] == "complete"
    assert (order(app_on_cosmos, order_id)["status"], order(app_on_cosmos, order_id)["version"]) == ("paid", 2)
    [marker] = docs_of(app_on_cosmos, order_id, "inbox")
    assert marker["ttl"] == 777600
    [payment] = recorded(docs_of(app_on_cosmos, order_id), "payment")
    assert payment["paymentId"] == "pay-1" and "ttl" not in payment


def test_redelivered_event_is_completed_as_duplicate(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    body = event_body(order_id, 2)
    send(deliver_event, body)
    etag = order(app_on_cosmos, order_id)["_etag"]
    assert send(deliver_event, body)[:2] == ("complete", None)
    assert order(app_on_cosmos, order_id)["_etag"] == etag
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1


def test_same_event_with_other_content_is_dead_lettered_payload_mismatch(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    body = event_body(order_id, 2)
    send(deliver_event, body)
    action, reason, description = send(deliver_event, {**body, "data": {**body["data"], "amount": "1.00"}})
    assert (action, reason) == ("deadletter", "PayloadMismatch")
    assert description is not None
    assert body["id"] in description


def test_event_already_reflected_is_completed_as_stale_and_counted(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    send(deliver_event, event_body(order_id, 2))
    before = outcome_counts()[("process_order_event", "stale")]
    assert send(deliver_event, event_body(order_id, 2))[:2] == ("complete", None)  # new id, same version
    assert outcome_counts()[("process_order_event", "stale")] == before + 1
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1


def test_events_out_of_order_are_parked_then_released_by_the_predecessor_on_cosmos(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    third = event_body(order_id, 3, ORDER_SHIPPED)
    second = event_body(order_id, 2, PAYMENT_CAPTURED)
    assert send(deliver_event, third)[0] == "complete"  # parked, not abandoned
    assert len(docs_of(app_on_cosmos, order_id, "parked-event")) == 1
    assert send(deliver_event, third)[0] == "complete"  # a redelivery of a parked event is a duplicate
    assert send(deliver_event, second)[0] == "complete"
    final = order(app_on_cosmos, order_id)
    assert (final["version"], final["status"], final["parked"]) == (3, "shipped", 0)
    assert final["payment"]["paymentId"] == "pay-1" and final["shipment"]["shipmentId"] == "shp-1"
    assert docs_of(app_on_cosmos, order_id, "parked-event") == []
    assert len(recorded(docs_of(app_on_cosmos, order_id), "shipment")) == 1


def test_an_event_before_its_order_is_released_when_the_order_is_placed_on_cosmos(
    app_on_cosmos: Harness, deliver_event: Deliverer, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    assert send(deliver_event, event_body(order_id, 2, PAYMENT_CAPTURED))[0] == "complete"
    assert order(app_on_cosmos, order_id)["type"] == "order-pending"
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "complete"
    final = order(app_on_cosmos, order_id)
    assert (final["type"], final["version"], final["status"], final["parked"]) == ("order", 2, "paid", 0)
    assert docs_of(app_on_cosmos, order_id, "parked-event") == []


@pytest.mark.parametrize(("first", "second"), [(ORDER_CANCELLED, ORDER_SHIPPED), (ORDER_CANCELLED, PAYMENT_CAPTURED),
                                               (ORDER_SHIPPED, ORDER_CANCELLED)])
def test_forbidden_transition_is_dead_lettered(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str, first: str, second: str
) -> None:
    send(deliver_event, event_body(order_id, 2, first))
    action, reason, description = send(deliver_event, event_body(order_id, 3, second))
    assert (action, reason) == ("deadletter", "InvalidTransition")
    assert description is not None
    assert second in description
    assert order(app_on_cosmos, order_id)["version"] == 2


def test_invalid_event_is_dead_lettered_with_the_rule(deliver_event: Deliverer, order_id: str) -> None:
    body = {**event_body(order_id, 2), "type": "com.example.orders.Refunded"}
    action, reason, description = send(deliver_event, body)
    assert (action, reason) == ("deadletter", "InvalidMessage")
    assert description is not None
    assert description.startswith("Expected type to be one of") and description.endswith("- at `$.type`")


def test_unavailable_cosmos_abandons(
    cosmos_proxy: FaultProxy, app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    cosmos_proxy.fail("POST", DOCS, 503, count=None)
    assert send(deliver_event, event_body(order_id, 2))[0] == "abandon"
    assert order(app_on_cosmos, order_id)["version"] == 1


def test_happy_path_is_two_cosmos_requests_the_identity_then_the_batch(
    cosmos_proxy: FaultProxy, deliver_event: Deliverer, order_id: str
) -> None:
    send(deliver_event, event_body(order_id, 2))  # warms the client
    cosmos_proxy.requests.clear()
    send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED))
    assert [method for method, _ in cosmos_proxy.requests] == ["POST", "POST"], cosmos_proxy.requests


def test_batch_failing_at_its_last_operation_writes_nothing(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    # A new order's batch is the order's create, then its reservation's claim: a document standing at the
    # claim's id makes the claim's create, the batch's last operation, fail with 409.
    order_id = f"ord-{uuid.uuid4()}"
    claim = side_effect_id(CONSUMER, RESERVE_STOCK, order_id)
    app_on_cosmos.container.create_item({"id": claim, "orderId": order_id, "type": "foreign"})
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id)
    assert settlement.action == "abandon", settlement
    assert docs_of(app_on_cosmos, order_id, "order") == []  # the order's create, first in the batch, undone


def test_two_consumers_share_the_container_and_each_applies_once(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    audit = audit_handler(app_on_cosmos.cosmos_store(), ttl_seconds=3600)
    body = event_body(order_id, 2)

    def to_audit() -> str:
        msg = deliver_event.message(encode_event(body), message_id=body["id"], session_id=order_id)
        app_on_cosmos.run(run_delivery("audit_trail", functools.partial(to_inbound, msg), audit,
                                       ActionsSettlement(msg, deliver_event.host.message_actions())))
        [settlement] = deliver_event.settlements(msg)
        return settlement.action

    before = outcome_counts()
    assert send(deliver_event, body)[0] == "complete"
    assert to_audit() == "complete"
    assert send(deliver_event, body)[0] == "complete"
    assert to_audit() == "complete"
    after = outcome_counts()
    for function in ("process_order_event", "audit_trail"):
        assert after[(function, "applied")] - before[(function, "applied")] == 1
        assert after[(function, "duplicate")] - before[(function, "duplicate")] == 1
    assert len(docs_of(app_on_cosmos, order_id, "audit")) == 1
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1
    assert {m["consumer"] for m in docs_of(app_on_cosmos, order_id, "inbox")} == {"order-projection", "audit-trail"}


def test_sixteen_concurrent_deliveries_of_one_event_apply_it_once(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    body = event_body(order_id, 2)
    messages = [deliver_event.message(encode_event(body), message_id=body["id"], session_id=order_id)
                for _ in range(16)]
    actions = deliver_event.host.message_actions()

    async def all_at_once() -> None:  # as the worker runs concurrent invocations: tasks on its one loop
        start = asyncio.Barrier(16)

        async def run(msg: object) -> None:
            await start.wait()
            await deliver_event.function(msg, actions)

        await asyncio.gather(*(run(m) for m in messages))

    before = outcome_counts()
    app_on_cosmos.run(all_at_once())
    settled = [deliver_event.settlements(m) for m in messages]
    assert Counter(s[0].action for s in settled if len(s) == 1) == {"complete": 16}
    after = outcome_counts()
    assert after[("process_order_event", "applied")] - before[("process_order_event", "applied")] == 1
    assert order(app_on_cosmos, order_id)["version"] == 2
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1


def test_marker_expires_after_its_ttl_and_business_documents_remain(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    app_on_cosmos.reconfigure(servicebus_lock_duration_seconds=1, servicebus_max_delivery_count=1,
                              servicebus_message_ttl_seconds=1, dlq_resubmit_grace_seconds=0, dedup_ttl_seconds=2)
    body = event_body(order_id, 2)
    send(deliver_event, body)
    assert len(docs_of(app_on_cosmos, order_id, "inbox")) == 1
    deadline = time.monotonic() + 15
    while docs_of(app_on_cosmos, order_id, "inbox"):
        assert time.monotonic() < deadline, "the marker should expire after its ttl"
        time.sleep(0.5)
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1
    assert order(app_on_cosmos, order_id)["version"] == 2
    assert send(deliver_event, body)[:2] == ("complete", None)  # redelivered after expiry: stale, not re-applied
    assert len(recorded(docs_of(app_on_cosmos, order_id), "payment")) == 1


def test_report_stuck_counts_an_event_parked_past_its_alert_age_on_cosmos(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    assert send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED))[0] == "complete"
    app_on_cosmos.reconfigure(parked_alert_after_seconds=1)
    time.sleep(1.1)
    before = overdue_counts()[("parked", order_id)]
    app_on_cosmos.run(registered_functions["report_stuck"](TimerRequest()))
    assert overdue_counts()[("parked", order_id)] == before + 1


NEWER = {"schemaVersion": 2, "loyalty": {"tier": "gold", "history": [10, 20]}}


def test_parking_and_releasing_on_cosmos_keep_a_newer_versions_fields_on_the_order(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    placed = order(app_on_cosmos, order_id)
    app_on_cosmos.container.replace_item(order_id, {**placed, **NEWER})
    assert send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED))[0] == "complete"  # parked: a patch
    assert send(deliver_event, event_body(order_id, 2))[0] == "complete"  # applied, releasing 3: a patch
    stored = order(app_on_cosmos, order_id)
    assert (stored["version"], stored["status"], stored["parked"]) == (3, "shipped", 0)
    assert {k: stored[k] for k in NEWER} == NEWER


def test_an_order_taking_a_pending_orders_place_on_cosmos_keeps_its_newer_fields_and_says_its_own_version(
    app_on_cosmos: Harness, deliver_event: Deliverer, deliver_order: Deliverer
) -> None:
    new = f"ord-{uuid.uuid4()}"
    assert send(deliver_event, event_body(new, 2))[0] == "complete"  # parked on a pending order
    pending = order(app_on_cosmos, new)
    app_on_cosmos.container.replace_item(new, {**pending, **NEWER})
    assert deliver_order(encode(order_body(new)), message_id=new)[0].action == "complete"
    stored = order(app_on_cosmos, new)
    assert (stored["type"], stored["version"], stored["status"]) == ("order", 2, "paid")
    # The newer fields are kept; the body is this version's, and schemaVersion says so.
    assert {k: stored[k] for k in NEWER if k != "schemaVersion"} == {k: v for k, v in NEWER.items()
                                                                      if k != "schemaVersion"}
    assert stored["schemaVersion"] == 1


def test_a_newer_producers_fields_in_an_events_data_reach_its_record_and_order_on_every_path(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    newer: dict[str, Any] = {"channel": "web", "eta": {"from": "2026-12-04", "to": "2026-12-06"}}
    assert send(deliver_event, event_body(order_id, 3, ORDER_SHIPPED, **newer))[0] == "complete"  # parked
    [parked] = docs_of(app_on_cosmos, order_id, "parked-event")
    assert {k: parked["event"]["data"][k] for k in newer} == newer  # kept as received
    assert send(deliver_event, event_body(order_id, 2, **newer))[0] == "complete"  # applied, releases 3
    stored = order(app_on_cosmos, order_id)
    for kind in ("payment", "shipment"):
        assert {k: stored[kind][k] for k in newer} == newer  # the order's sub-object, which is the event's record


def test_an_event_merges_into_a_sub_object_another_writer_put_on_its_order_on_cosmos(
    app_on_cosmos: Harness, deliver_event: Deliverer, order_id: str
) -> None:
    app_on_cosmos.container.patch_item(order_id, order_id, [{"op": "set", "path": "/payment",
                                                             "value": {"riskCheck": "passed"}}])
    assert send(deliver_event, event_body(order_id, 2))[0] == "complete"
    payment = order(app_on_cosmos, order_id)["payment"]
    assert payment["riskCheck"] == "passed" and payment["paymentId"] == "pay-1"
