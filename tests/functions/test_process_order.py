"""process_order end to end: real message, real settlement client, real Cosmos SDK on a local server."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azurefunctions.extensions.bindings.servicebus.serviceBusMessageActions import SettlementError

from devservers.faultproxy import FaultProxy, fault_proxy
from idempotent_consumer.adapters.cosmos import THROTTLE_RETRIES
from idempotent_consumer.delivery import run_delivery
from idempotent_consumer.functions.binding import to_inbound
from idempotent_consumer.functions.settlement import ActionsSettlement
from shared.domain.orders import parse_order
from tests.functions.conftest import Deliverer, Harness
from tests.support.fake_host import FakeHost, make_received_message
from tests.support.orders import encode, inbound, order_body

ROOT = Path(__file__).resolve().parents[2]
DOCS = r"/docs/?$"
DOC = r"/docs/[^/]+/?$"


def new_id() -> str:
    return f"ord-{uuid.uuid4()}"


def stored(target: Harness, order_id: str) -> dict:
    return target.container.read_item(order_id, partition_key=order_id)


def count_orders(target: Harness, order_id: str) -> int:
    query = "SELECT VALUE COUNT(1) FROM c WHERE c.orderId = @id AND c.type = 'order'"
    params: list[dict[str, object]] = [{"name": "@id", "value": order_id}]
    # A VALUE query yields scalars, though azure-cosmos types every item as a dict.
    count: object = next(iter(target.container.query_items(query, parameters=params, partition_key=order_id)))
    assert isinstance(count, int), count
    return count


def test_new_order_is_created_and_completed(app_on_cosmos: Harness, deliver_order: Deliverer) -> None:
    order_id = new_id()
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, correlation_id="corr-9")
    assert settlement.action == "complete"
    doc = stored(app_on_cosmos, order_id)
    assert doc["id"] == doc["orderId"] == doc["messageId"] == order_id
    assert (doc["type"], doc["status"], doc["version"]) == ("order", "placed", 1)
    assert doc["correlationId"] == "corr-9"
    assert doc["enqueuedTimeUtc"].endswith("Z")
    assert doc["requestHash"] == parse_order(inbound(order_body(order_id))).request_hash()


def test_delivery_count_is_stored_when_the_binding_passes_it(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = new_id()
    deliver_order(encode(order_body(order_id)), message_id=order_id, delivery_count=2, layout="marker_prefix")
    # The host's header counts as .NET does: the wire's 2 prior deliveries make this the third.
    assert stored(app_on_cosmos, order_id)["deliveryCount"] == 3


def test_redelivered_order_is_completed_as_duplicate_and_changes_nothing(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = new_id()
    deliver_order(encode(order_body(order_id)), message_id=order_id)
    before = stored(app_on_cosmos, order_id)
    pretty = json.dumps(order_body(order_id, total="44.980"), indent=2).encode()
    [settlement] = deliver_order(pretty, message_id=order_id, correlation_id="retry")
    assert settlement.action == "complete"
    assert stored(app_on_cosmos, order_id)["_etag"] == before["_etag"]
    assert count_orders(app_on_cosmos, order_id) == 1


def test_redelivered_order_with_other_items_is_dead_lettered_payload_mismatch(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = new_id()
    deliver_order(encode(order_body(order_id)), message_id=order_id)
    original_hash = stored(app_on_cosmos, order_id)["requestHash"]
    other = order_body(order_id, items=[{"sku": "SKU-SECRET", "quantity": 1, "unitPrice": "44.98"}])
    [settlement] = deliver_order(encode(other), message_id=order_id)
    assert (settlement.action, settlement.reason) == ("deadletter", "PayloadMismatch")
    assert settlement.description is not None
    assert order_id in settlement.description
    assert original_hash in settlement.description
    assert parse_order(inbound(other)).request_hash() in settlement.description
    assert "SKU-SECRET" not in settlement.description
    assert stored(app_on_cosmos, order_id)["requestHash"] == original_hash


@pytest.mark.parametrize(
    ("body", "message_id", "rule"),
    [
        (b"\xff\xfe", "m-1", "body is not UTF-8 JSON"),
        (b"{oops", "m-2", "body is not UTF-8 JSON"),
        (encode(order_body("m-3", currency="EURO")), "m-3", "{3}\\\\Z' - at `$.currency`"),
        (encode(order_body("m-4")), None, "MessageId is missing"),
        (encode(order_body("m-5")), "m-6", "MessageId does not equal orderId"),
        (encode(order_body("m-7", total="1.00")), "m-7", "sum of quantity x unitPrice over the items - at `$.total`"),
    ],
)
def test_invalid_message_is_dead_lettered_with_the_rule(
    app_on_cosmos: Harness, deliver_order: Deliverer, body: bytes, message_id: str | None, rule: str
) -> None:
    [settlement] = deliver_order(body, message_id=message_id)
    assert (settlement.action, settlement.reason) == ("deadletter", "InvalidMessage")
    assert settlement.description is not None
    assert rule in settlement.description
    if message_id:
        assert count_orders(app_on_cosmos, message_id) == 0


def test_message_without_data_body_is_dead_lettered_invalid(
    deliver_order: Deliverer, app_on_cosmos: Harness
) -> None:
    [settlement] = deliver_order(b"", message_id="m-value", body_value={"orderId": "m-value"})
    assert (settlement.action, settlement.reason) == ("deadletter", "InvalidMessage")
    assert settlement.description is not None
    assert "data section" in settlement.description


@pytest.mark.parametrize("status", [429, 503])
def test_throttled_or_unavailable_create_is_abandoned(
    cosmos_proxy: FaultProxy, app_on_cosmos: Harness, deliver_order: Deliverer, status: int
) -> None:
    fault = cosmos_proxy.fail("POST", DOCS, status, count=None)
    order_id = new_id()
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id)
    assert settlement.action == "abandon"
    assert fault.hits >= 1
    assert count_orders(app_on_cosmos, order_id) == 0


def test_order_is_created_once_cosmos_recovers(
    cosmos_proxy: FaultProxy, app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    cosmos_proxy.fail("POST", DOCS, 503, count=None)
    order_id = new_id()
    body = encode(order_body(order_id))
    assert deliver_order(body, message_id=order_id)[0].action == "abandon"
    cosmos_proxy.clear()
    assert deliver_order(body, message_id=order_id)[0].action == "complete"
    assert count_orders(app_on_cosmos, order_id) == 1


def test_unreachable_cosmos_is_abandoned(deliver_order: Deliverer, app_on_cosmos: Harness) -> None:
    with fault_proxy(app_on_cosmos.endpoint.url) as proxy:
        closed = proxy.url
    app_on_cosmos.reconfigure(cosmos_endpoint=closed)
    order_id = new_id()
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id)
    assert settlement.action == "abandon"


def test_failed_read_after_conflict_is_abandoned(cosmos_proxy: FaultProxy, deliver_order: Deliverer) -> None:
    order_id = new_id()
    deliver_order(encode(order_body(order_id)), message_id=order_id)
    fault = cosmos_proxy.fail("GET", DOC, 503, count=None)
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id)
    assert settlement.action == "abandon"
    assert fault.hits >= 1


def test_new_order_costs_two_cosmos_requests(cosmos_proxy: FaultProxy, deliver_order: Deliverer) -> None:
    first = new_id()
    deliver_order(encode(order_body(first)), message_id=first)  # warms the client: account, container
    cosmos_proxy.requests.clear()
    order_id = new_id()
    deliver_order(encode(order_body(order_id)), message_id=order_id)
    # the intake batch (order, reservation claim), then the batch that finishes the reservation record and creates
    # its OrderAccepted outbox entry
    assert [method for method, _ in cosmos_proxy.requests] == ["POST", "POST"], cosmos_proxy.requests


def test_forbidden_by_cosmos_is_an_error_and_abandoned(
    cosmos_proxy: FaultProxy, app_on_cosmos: Harness, deliver_order: Deliverer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cosmos_proxy.fail("POST", DOCS, 403, count=None)
    order_id = new_id()
    with caplog.at_level(logging.INFO):
        [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id)
    assert settlement.action == "abandon"
    [record] = [r for r in caplog.records if r.name == "idempotent_consumer"]
    assert vars(record)["outcome"] == "error"
    assert any(r.exc_info for r in caplog.records if r.name == "idempotent_consumer.delivery")


def test_function_app_builds_its_app_from_the_environment_and_a_missing_setting_is_an_error_that_names_it(
    production_functions: dict[str, Callable[..., Any]], fake_host: FakeHost, loop: asyncio.Runner,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # function_app.app's own process_order, on the root it builds at its first invocation: without
    # COSMOS_ENDPOINT the store cannot be made, so nothing connects, and the delivery is abandoned.
    monkeypatch.delenv("COSMOS_ENDPOINT", raising=False)
    order_id = new_id()
    msg = make_received_message(encode(order_body(order_id)), message_id=order_id)
    with caplog.at_level(logging.INFO):
        loop.run(production_functions["process_order"](msg, fake_host.message_actions()))
    assert msg.lock_token is not None
    [settlement] = fake_host.recorder.settlements_for(msg.lock_token)
    assert settlement.action == "abandon"
    errors = [r.exc_info for r in caplog.records if r.exc_info]
    assert errors and "COSMOS_ENDPOINT: is required" in str(errors[0][1])


def test_lost_lock_on_complete_is_logged_and_raised_then_redelivery_is_a_duplicate(
    app_on_cosmos: Harness, deliver_order: Deliverer, caplog: pytest.LogCaptureFixture
) -> None:
    order_id = new_id()
    body = encode(order_body(order_id))
    deliver_order.host.recorder.fail_next(action="complete")
    msg = deliver_order.message(body, message_id=order_id)
    with caplog.at_level(logging.INFO), pytest.raises(SettlementError):
        deliver_order.invoke(msg)
    assert any("settlement complete failed" in r.getMessage() for r in caplog.records)
    [redelivered] = deliver_order(body, message_id=order_id)
    assert redelivered.action == "complete"
    outcomes = [vars(r)["outcome"] for r in caplog.records if r.name == "idempotent_consumer"]
    assert outcomes == ["created"]
    assert count_orders(app_on_cosmos, order_id) == 1


def test_log_record_per_delivery_has_ids_and_outcome_but_no_payload(
    app_on_cosmos: Harness, deliver_order: Deliverer, caplog: pytest.LogCaptureFixture
) -> None:
    order_id = new_id()
    body = encode(order_body(order_id, customerId="jane.doe@example.com"))
    with caplog.at_level(logging.DEBUG):
        deliver_order(body, message_id=order_id, correlation_id="corr-77")
        deliver_order(body, message_id=order_id, correlation_id="corr-77")
    records = [r for r in caplog.records if r.name == "idempotent_consumer"]
    assert [(vars(r)["messageId"], vars(r)["correlationId"], vars(r)["outcome"]) for r in records] == [
        (order_id, "corr-77", "created"),
        (order_id, "corr-77", "duplicate"),
    ]
    assert all(isinstance(vars(r)["durationMs"], float) for r in records)
    assert all("jane.doe" not in r.getMessage() for r in caplog.records)


def test_importing_the_app_connects_to_nothing() -> None:
    code = (
        "import function_app; "
        "print(sorted(f.get_function_name() for f in function_app.app.get_functions()))"
    )
    # An endpoint that refuses connections: a client made at import would fail the import.
    env = {"PATH": "/usr/bin:/bin", "COSMOS_ENDPOINT": "http://127.0.0.1:9", "FULFILLMENT_URL": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert "process_order" in out.stdout


def function_bindings(env: dict[str, str]) -> dict[str, dict]:
    code = (
        "import json, function_app; "
        "print(json.dumps({f.get_function_name(): json.loads(f.get_function_json())['bindings'][0] "
        "for f in function_app.app.get_functions()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env},
                         capture_output=True, text=True, check=True, timeout=60)
    bindings: dict[str, dict] = json.loads(out.stdout.strip().splitlines()[-1])
    return bindings


def test_bindings_are_peeklock_with_explicit_settlement_on_the_configured_queues() -> None:
    bindings = function_bindings({"ORDERS_QUEUE": "orders-blue", "ORDER_EVENTS_QUEUE": "events-blue"})
    orders, events = bindings["process_order"], bindings["process_order_event"]
    for binding in (orders, events):
        assert binding["type"] == "serviceBusTrigger"
        assert binding["connection"] == "ServiceBusConnection"
        assert binding["autoCompleteMessages"] is False
    assert orders["queueName"] == "orders-blue"
    assert "isSessionsEnabled" not in orders
    assert events["queueName"] == "events-blue"
    assert events["isSessionsEnabled"] is True


def test_throttling_retries_are_bounded_inside_the_lock(
    cosmos_proxy: FaultProxy, app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    fault = cosmos_proxy.fail("POST", DOCS, 429, count=None)
    order_id = new_id()
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "abandon"
    assert fault.hits == THROTTLE_RETRIES + 1


def test_a_failing_telemetry_exporter_does_not_cost_the_settlement(
    app_on_cosmos: Harness, deliver_order: Deliverer, fake_host: FakeHost
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("exporter down")

    order_id = new_id()
    msg = deliver_order.message(encode(order_body(order_id)), message_id=order_id)
    app = app_on_cosmos.app
    app_on_cosmos.run(run_delivery("process_order", functools.partial(to_inbound, msg), app.handle_order,
                                   ActionsSettlement(msg, fake_host.message_actions()), record=broken))
    [settlement] = deliver_order.settlements(msg)
    assert settlement.action == "complete"
    assert count_orders(app_on_cosmos, order_id) == 1
