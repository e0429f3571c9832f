"""The transactional outbox: written with the order, published from change-feed batches and the sweep."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest

from consumers import runtime
from shared.cosmos_store import CosmosStore
from shared.keys import idempotency_key
from shared.messaging import RecordingSender
from shared.side_effects import SideEffect
from tests.functions.conftest import CosmosTarget, Deliverer
from tests.support.fault_proxy import fault_proxy
from tests.support.orders import encode, order_body


@pytest.fixture
def sender(monkeypatch: pytest.MonkeyPatch) -> RecordingSender:
    """The recording sender behind the sender port (issue #6 re-runs these against a broker)."""
    recording = RecordingSender()
    monkeypatch.setattr(runtime, "sender", lambda: recording)
    monkeypatch.setenv("ServiceBusConnection", "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=v")
    return recording


def partition(target: CosmosTarget, order_id: str, doc_type: str | None = None) -> list[dict]:
    docs = list(target.container.query_items("SELECT * FROM c", partition_key=order_id))
    return [d for d in docs if doc_type is None or d.get("type") == doc_type]


def change_feed(target: CosmosTarget, order_id: str) -> func.DocumentList:
    """The partition's documents as the host hands a change-feed batch to the function."""
    return func.DocumentList([func.Document.from_dict(d) for d in partition(target, order_id)])


def place(deliver: Deliverer, **message: Any) -> str:
    order_id = f"ord-{uuid.uuid4()}"
    deliver(encode(order_body(order_id)), message_id=order_id, **message)
    return order_id


def test_each_order_gets_exactly_one_pending_outbox_document(
    app_on_cosmos: CosmosTarget, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    for _ in range(3):
        deliver_order(encode(order_body(order_id)), message_id=order_id, correlation_id="corr-5")
    [outbox] = partition(app_on_cosmos, order_id, "outbox")
    assert (outbox["status"], outbox["destination"], outbox["correlationId"]) == ("pending", "order-accepted", "corr-5")
    assert outbox["messageId"] == idempotency_key("order-projection", "OrderAccepted", order_id)
    assert "ttl" not in outbox


def test_failed_batch_writes_neither_order_nor_outbox(
    app_on_cosmos: CosmosTarget, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    claim = SideEffect(_store(app_on_cosmos), "order-projection", "reserve-stock", 60).claim_document(
        order_id, (order_id,), None)
    app_on_cosmos.container.create_item(claim)  # the batch's third create will conflict
    assert deliver_order(encode(order_body(order_id)), message_id=order_id)[0].action == "abandon"
    assert partition(app_on_cosmos, order_id, "order") == []
    assert partition(app_on_cosmos, order_id, "outbox") == []


def test_publisher_sends_pending_outbox_from_a_change_feed_batch_and_marks_it_dispatched(
    app_on_cosmos: CosmosTarget, deliver_order: Deliverer, sender: RecordingSender,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order, correlation_id="corr-8")
    registered_functions["publish_outbox"](change_feed(app_on_cosmos, order_id))
    [(destination, message)] = sender.sent
    assert destination == "order-accepted"
    assert message.message_id == idempotency_key("order-projection", "OrderAccepted", order_id)
    assert (message.correlation_id, message.session_id, message.subject) == ("corr-8", None, "OrderAccepted")
    assert json.loads(message.body)["orderId"] == order_id
    [outbox] = partition(app_on_cosmos, order_id, "outbox")
    assert outbox["status"] == "dispatched" and outbox["ttl"] == 604800


def test_dispatched_and_other_documents_in_the_feed_are_skipped(
    app_on_cosmos: CosmosTarget, deliver_order: Deliverer, sender: RecordingSender,
    registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order)
    publish = registered_functions["publish_outbox"]
    publish(change_feed(app_on_cosmos, order_id))
    publish(change_feed(app_on_cosmos, order_id))  # the feed delivers the dispatched document again
    assert len(sender.sent) == 1


def test_session_destination_gets_the_order_as_session_id(
    monkeypatch: pytest.MonkeyPatch, app_on_cosmos: CosmosTarget, deliver_order: Deliverer,
    sender: RecordingSender, registered_functions: dict[str, Callable[..., Any]],
) -> None:
    monkeypatch.setenv("OUTBOX_REQUIRES_SESSION", "true")
    runtime.reset()
    order_id = place(deliver_order)
    registered_functions["publish_outbox"](change_feed(app_on_cosmos, order_id))
    assert sender.sent[0][1].session_id == order_id


def test_crash_before_the_mark_republishes_the_same_message_id(
    monkeypatch: pytest.MonkeyPatch, app_on_cosmos: CosmosTarget, deliver_order: Deliverer,
    sender: RecordingSender, registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order)
    feed = change_feed(app_on_cosmos, order_id)
    with fault_proxy(app_on_cosmos.endpoint.url) as proxy:
        monkeypatch.setenv("COSMOS_ENDPOINT", proxy.url)
        runtime.reset()
        monkeypatch.setattr(runtime, "sender", lambda: sender)
        proxy.fail("POST", r"/docs/?$", 503, count=None)  # the mark fails after the send
        registered_functions["publish_outbox"](feed)
    assert partition(app_on_cosmos, order_id, "outbox")[0]["status"] == "pending"
    monkeypatch.setenv("COSMOS_ENDPOINT", app_on_cosmos.endpoint.url)
    monkeypatch.setenv("OUTBOX_STUCK_AFTER_SECONDS", "1")
    runtime.reset()
    monkeypatch.setattr(runtime, "sender", lambda: sender)
    time.sleep(1.1)
    registered_functions["sweep_outbox"](TimerRequest())
    expected = idempotency_key("order-projection", "OrderAccepted", order_id)
    ids = [m.message_id for _, m in sender.sent if m.message_id == expected]
    assert len(ids) == 2  # resent under the same MessageId: a duplicate for the destination to drop
    assert partition(app_on_cosmos, order_id, "outbox")[0]["status"] == "dispatched"


def test_sweep_publishes_only_documents_pending_past_the_threshold(
    monkeypatch: pytest.MonkeyPatch, app_on_cosmos: CosmosTarget, deliver_order: Deliverer,
    sender: RecordingSender, registered_functions: dict[str, Callable[..., Any]],
) -> None:
    order_id = place(deliver_order)
    registered_functions["sweep_outbox"](TimerRequest())  # threshold 300 s: too young
    assert all(m.message_id != partition(app_on_cosmos, order_id, "outbox")[0]["messageId"] for _, m in sender.sent)
    outbox = partition(app_on_cosmos, order_id, "outbox")[0]
    app_on_cosmos.container.replace_item(outbox["id"], {**outbox, "createdAt": outbox["createdAt"] - 301})
    registered_functions["sweep_outbox"](TimerRequest())
    assert outbox["messageId"] in [m.message_id for _, m in sender.sent]
    assert partition(app_on_cosmos, order_id, "outbox")[0]["status"] == "dispatched"


def _store(target: CosmosTarget) -> CosmosStore:
    return CosmosStore(target.container)
