"""Derived ids and keys: pinned to known values (they are a contract), deterministic, legal ids, and never
colliding across parts, consumers or kinds."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotent_consumer import identity
from idempotent_consumer.identity import derive_id, digest, effect_key
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.domain import identity as order_ids
from shared.domain.lifecycle import ORDER_SHIPPED
from shared.handlers.apply_event import apply_order_event
from shared.handlers.place_order import OrderServices, place_order
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import claims

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

LEGAL_ID = re.compile(r"[A-Za-z0-9_.-]{1,255}")
CONSUMER = "order-projection"

# Computed by the code in production before identity.py gathered the formulas (commit a9c6fb4). A change
# here gives every in-flight order new keys: its stock is reserved again, its events applied again.
KNOWN: list[tuple[str, str]] = [
    (identity.effect_key(CONSUMER, "reserve-stock", "ord-1"),
     "effect.reserve-stock.7513e7ab5de2438aef12afc2ad4d093cce1d679b92c75280d8bd7ccf46bc82d2"),
    (identity.side_effect_id(CONSUMER, "reserve-stock", "ord-1"),
     "side-effect.reserve-stock.34727a05772edf36efc935de2cab861ccba7f6d73181818d33b144a1ff73c44e"),
    (order_ids.outbox_id(CONSUMER, "ord-1"),
     "outbox.OrderAccepted.b982dcfb50be54176cfa2613a682afb6e116f7883aa710d06a13ac024a287a92"),
    (order_ids.outbox_message_id(CONSUMER, "ord-1"),
     "effect.OrderAccepted.fa4956c2656b5ea8c25bf750d52ce3351e74094d77f75e589aa3488178228c61"),
    (identity.inbox_marker_id(CONSUMER, "/orders", "e-1"),
     "inbox.order-projection.7081295d55dfccdc0830efaaf7955cbfad6537e5bd06ea111fc0d23c7c291268"),
    (identity.parked_event_id(CONSUMER, "/orders", "e-2", 3),
     "parked.v3.e6a89b150f3f68de59a0056be90f7474c626de69aa3caf415cb238957fb38e3b"),
    (order_ids.event_record_id("payment", "/orders", "e-1", "p-1"),
     "payment.p-1.cd74a9640520d7fd1f75c70347fedbd4a31f98ba7e6d028047ab0ba2e13cf4f2"),
    (identity.effect_key("billing/ü", "reserve stock#", "ord/1?"),
     "effect.reserve_stock_.4eda7fd696e9a4451a49c42b9c3c654bd4b95b8a9cf7ddcdc5e01b8a7276549f"),
    # Pinned when OrderRejected came (issue 30).
    (order_ids.rejected_message_id(CONSUMER, "ord-1"),
     "effect.OrderRejected.7133b827a179922a6d278c38d645a3b7421dec58683f62df8e4c404cbc4be361"),
    # Pinned when delayed retries came (issue 32): a copy in flight must dedup against its resend.
    (identity.retry_message_id("ord-1", "42", 1),
     "retry.1_ord-1.40ba1b11e3b2b5785ddd55d6cfb3d820361adf52b7938adf6f140633b1cb4bfa"),
    # Pinned when the plan came (issue 42): a key's marker, in its partition and across partitions.
    (identity.key_marker_id(CONSUMER, "ord-1"),
     "key.order-projection.b0111078f7d40e4520f0da6a630a29945fb1d0d4ab32e31de590e58ab3ac8d35"),
    (identity.key_identity_id(CONSUMER, "ord-1"),
     "key-identity.order-projection.0f5d4e08626e25d397bd6433910521d054caa01522a63529b65f1ebe47fbb121"),
]


@pytest.mark.parametrize(("derived", "expected"), KNOWN, ids=[e.split(".", 1)[0] + str(i) for i, (_, e) in
                                                              enumerate(KNOWN)])
def test_derived_ids_and_keys_are_unchanged(derived: str, expected: str) -> None:
    assert derived == expected


def test_same_parts_derive_the_same_id() -> None:
    assert derive_id("inbox", "billing", "/src", "e-1") == derive_id("inbox", "billing", "/src", "e-1")


def test_part_boundaries_matter() -> None:
    assert digest("ab", "c") != digest("a", "bc")
    assert digest("a/b") != digest("a", "b")


def test_consumers_and_kinds_derive_different_ids() -> None:
    ids = {
        derive_id("inbox", "billing", "/src", "e-1"),
        derive_id("inbox", "shipping", "/src", "e-1"),
        derive_id("outbox", "billing", "/src", "e-1"),
        derive_id("inbox", "billing", "/src", "e-2"),
    }
    assert len(ids) == 4


def test_label_does_not_decide_identity() -> None:
    assert derive_id("inbox", "x", label="a").rsplit(".", 1)[1] == derive_id("inbox", "x", label="b").rsplit(".", 1)[1]


@given(parts=st.lists(st.text(), min_size=1, max_size=4), label=st.text())
def test_any_parts_derive_a_legal_cosmos_id(parts: list[str], label: str) -> None:
    assert LEGAL_ID.fullmatch(derive_id("inbox", *parts, label=label))


@given(a=st.lists(st.text(max_size=5), min_size=1, max_size=3), b=st.lists(st.text(max_size=5), min_size=1, max_size=3))
def test_different_parts_never_share_a_digest(a: list[str], b: list[str]) -> None:
    if a != b:
        assert digest(*a) != digest(*b)


def test_idempotency_keys_are_deterministic_and_distinct_across_consumers_and_effects() -> None:
    assert effect_key("intake", "reserve-stock", "ord-1") == effect_key("intake", "reserve-stock", "ord-1")
    keys = {
        effect_key(consumer, effect, order)
        for consumer in ("intake", "billing")
        for effect in ("reserve-stock", "OrderAccepted")
        for order in ("ord-1", "ord-2")
    }
    assert len(keys) == 8
    assert all(LEGAL_ID.fullmatch(k) and len(k) <= 128 for k in keys)


def test_the_handlers_write_and_send_exactly_the_pinned_ids() -> None:
    # The ids above are the ones the handlers use, not only what the functions compute.
    store, fulfilment = InMemoryStore(), InMemoryFulfilment()
    settings = Settings(consumer_name=CONSUMER, fulfillment_url="http://fulfilment.invalid")
    asyncio.run(place_order(inbound(order_body("ord-1")), OrderServices(store, fulfilment, settings)))
    shipped = event_body("ord-1", 3, ORDER_SHIPPED, event_id="e-2", source="/orders")
    paid = event_body("ord-1", 2, event_id="e-1", source="/orders", paymentId="p-1")
    deliver = lambda body: asyncio.run(apply_order_event(  # noqa: E731
        InboundMessage(message_id=body["id"], body=encode_event(body)), store, settings))
    assert deliver(shipped).outcome.value == "parked"  # e-2 waits for e-1, under the pinned id
    assert KNOWN[5][1] in {d["id"] for d in store.documents()}
    assert deliver(paid).description == "released versions [3]"
    ids = {d["id"] for d in [*store.documents(), *claims(store.documents())]}  # a claim in its order: its id derived
    assert fulfilment.calls == [KNOWN[0][1]]
    assert {KNOWN[1][1], KNOWN[2][1], KNOWN[4][1]} <= ids  # claim, outbox, marker
    # The payment's record is its order's sub-object; the record id stays pinned for those earlier releases wrote.
    assert KNOWN[6][1] not in ids
    [outbox] = [d for d in store.documents() if d["type"] == "outbox"]
    assert outbox["messageId"] == KNOWN[3][1]
    assert identity.inbox_marker_id(CONSUMER, "/orders", "e-2") in ids
    assert KNOWN[5][1] not in ids  # the parked copy of e-2, removed when e-1 released it


def test_the_order_apps_ids_are_the_generic_ones_under_its_names_and_another_name_gets_its_own() -> None:
    accepted, rejected = order_ids.ORDER_ACCEPTED, order_ids.ORDER_REJECTED
    assert order_ids.outbox_id(CONSUMER, "ord-1") == identity.outgoing_entry_id(CONSUMER, accepted, "ord-1")
    assert order_ids.rejected_correction_id(CONSUMER, "ord-1") == identity.outgoing_entry_id(CONSUMER, rejected,
                                                                                           "ord-1")
    assert order_ids.outbox_message_id(CONSUMER, "ord-1") == identity.outgoing_message_id(CONSUMER, accepted, "ord-1")
    assert order_ids.rejected_message_id(CONSUMER, "ord-1") == identity.outgoing_message_id(CONSUMER, rejected,
                                                                                          "ord-1")
    booked = identity.outgoing_entry_id("ledger-writer", "PaymentBooked", "pay-1")
    assert booked.startswith("outbox.PaymentBooked.") and booked != identity.outgoing_entry_id(
        "ledger-writer", "PaymentRefused", "pay-1")
