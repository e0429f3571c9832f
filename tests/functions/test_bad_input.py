"""Property-based: whatever the body and properties, a delivery ends in exactly one settlement and loses nothing.

Runs process_order as the host calls it (real message decoding, real settlement client) over an
in-memory store, so that every abandon here would be a crash in our own code, not a store fault.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotent_consumer.testing.memory import InMemoryStore
from shared.domain.lifecycle import KINDS
from tests.functions.conftest import Deliverer
from tests.support.events import event_body
from tests.support.metrics import outcome_counts
from tests.support.orders import order_body

RUN = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
huge_numbers = st.integers(min_value=10**20, max_value=10**400) | st.sampled_from(["1e999", "-1e999", "9" * 5000])
order_fields = st.sampled_from(["orderId", "customerId", "currency", "items", "total", "placedAt"])
item_fields = st.sampled_from(["sku", "quantity", "unitPrice"])


@st.composite
def mutated_orders(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A valid order with one field replaced, removed, or one item field broken."""
    body: dict[str, Any] = order_body(draw(st.sampled_from(["ord-1", "ord-2", "ord-3"])))
    choice = draw(st.sampled_from(["replace", "remove", "item", "huge", "none"]))
    if choice == "replace":
        body[draw(order_fields)] = draw(json_values)
    elif choice == "remove":
        del body[draw(order_fields)]
    elif choice == "item":
        body["items"][0][draw(item_fields)] = draw(json_values | huge_numbers)
    elif choice == "huge":
        body["items"][0]["quantity"] = draw(huge_numbers.filter(lambda v: isinstance(v, int)))
    raw = json.dumps(body).encode()
    message_id = draw(st.sampled_from([body.get("orderId"), None, "other-id", ""]))
    return raw, message_id if isinstance(message_id, str) else None


def deep_nesting(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8")),
    st.text(max_size=50).map(lambda t: t.encode("utf-16")),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(min_value=1, max_value=50_000).map(deep_nesting),
    huge_numbers.map(lambda n: f'{{"orderId": "ord-1", "total": {n}}}'.encode()),
    st.just(b'{"orderId": "ord-1", "pad": "' + b"x" * (256 * 1024) + b'"}'),
)
properties = st.fixed_dictionaries(
    {
        "message_id": st.none() | st.text(max_size=300) | st.just("ord-1"),
        "correlation_id": st.none() | st.text(max_size=50),
        "application_properties": st.none() | st.dictionaries(st.text(min_size=1, max_size=10),
                                                             st.text(max_size=10), max_size=3),
    }
)


def assert_settled_once(deliver: Deliverer, body: bytes, **props: Any) -> None:
    [settlement] = deliver(body, **props)
    if settlement.reason == "LimitExceeded":  # only a body past 256 KB
        assert len(body) > 256 * 1024 and "262144" in (settlement.description or "")
    assert settlement.action in {"complete", "deadletter"}, "only a crash could abandon with an in-memory store"
    if settlement.action == "deadletter":
        assert settlement.reason in {"InvalidMessage", "PayloadMismatch", "LimitExceeded"}
        assert settlement.description


@RUN
@given(body=bodies, props=properties)
def test_any_body_and_properties_end_in_one_settlement(
    app_in_memory: InMemoryStore, deliver_order: Deliverer, body: bytes, props: dict[str, Any]
) -> None:
    assert_settled_once(deliver_order, body, **props)


@RUN
@given(order=mutated_orders())
def test_broken_orders_end_in_one_settlement(
    app_in_memory: InMemoryStore, deliver_order: Deliverer, order: tuple[bytes, str | None]
) -> None:
    body, message_id = order
    assert_settled_once(deliver_order, body, message_id=message_id)


amqp_values = st.text(min_size=1, max_size=30) | st.integers(min_value=-(2**31), max_value=2**31 - 1) | st.lists(
    st.text(max_size=10), min_size=1, max_size=4
)


@RUN
@given(value=amqp_values)
def test_value_bodies_are_dead_lettered_invalid(
    app_in_memory: InMemoryStore, deliver_order: Deliverer, value: Any
) -> None:
    [settlement] = deliver_order(b"", message_id="ord-1", body_value=value)
    assert (settlement.action, settlement.reason) == ("deadletter", "InvalidMessage")


event_fields = st.sampled_from(["specversion", "id", "source", "type", "subject", "time", "data", "datacontenttype"])


@st.composite
def mutated_events(draw: st.DrawFn) -> tuple[bytes, str | None, str | None]:
    """A valid event with one envelope or data field replaced or removed, and varied identities."""
    body: dict[str, Any] = event_body("ord-1", draw(st.integers(min_value=-2, max_value=5)),
                                      draw(st.sampled_from(sorted(KINDS))))
    choice = draw(st.sampled_from(["replace", "remove", "data", "none"]))
    if choice == "replace":
        body[draw(event_fields)] = draw(json_values | huge_numbers)
    elif choice == "remove":
        body.pop(draw(event_fields))
    elif choice == "data":
        body["data"][draw(st.sampled_from(sorted(body["data"])))] = draw(json_values | huge_numbers)
    message_id = draw(st.sampled_from([body.get("id"), None, "other-id"]))
    session_id = draw(st.sampled_from([body.get("subject"), None, "ord-2"]))
    return (json.dumps(body).encode(), message_id if isinstance(message_id, str) else None,
            session_id if isinstance(session_id, str) else None)


@RUN
@given(body=bodies, props=properties)
def test_any_event_body_and_properties_end_in_one_settlement(
    app_in_memory: InMemoryStore, deliver_event: Deliverer, body: bytes, props: dict[str, Any]
) -> None:
    assert_settled_once(deliver_event, body, **props)


@RUN
@given(event=mutated_events())
def test_broken_events_end_in_one_settlement(
    app_in_memory: InMemoryStore, deliver_event: Deliverer, event: tuple[bytes, str | None, str | None]
) -> None:
    body, message_id, session_id = event
    errors_before = outcome_counts()[("process_order_event", "error")]
    [settlement] = deliver_event(body, message_id=message_id, session_id=session_id)
    assert outcome_counts()[("process_order_event", "error")] == errors_before, "a crash, not a decision"
    assert settlement.action in {"complete", "deadletter", "abandon"}
    if settlement.action == "deadletter":
        assert settlement.reason in {"InvalidMessage", "PayloadMismatch", "InvalidTransition", "LimitExceeded",
                                     "OutOfOrder"}
        assert settlement.description
