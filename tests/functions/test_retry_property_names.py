"""The application properties the consumer reserves for its delayed retries' copies are namespaced, through the
function entry points: a producer's own ``retryAttempt`` (a common name for its resend counter) is its own, and
travels with the message; a copy the release before scheduled, under the old names, is still read as its
original while such copies may be due (RETRY_TOTAL_SECONDS)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from devservers.fulfilment import FulfilmentServer
from idempotent_consumer import identity, retries
from idempotent_consumer.testing.memory import RecordingSender
from tests.functions.conftest import Deliverer, Harness, reservation_calls
from tests.support.orders import encode, order_body

PRODUCERS_OWN = {"retryAttempt": "2", "retryReason": "resent by the checkout after a timeout", "tenant": "eu"}




def test_a_producers_own_retry_attempt_property_is_not_taken_for_a_copy(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id,
                                 application_properties=dict(PRODUCERS_OWN))
    assert settlement.action == "complete", settlement
    assert reservation_calls(fulfilment, order_id) == [201]


def test_a_copy_handed_on_keeps_the_producers_retry_attempt_and_carries_its_chain_under_the_namespaced_names(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, handing_on: RecordingSender
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    fulfilment.fail_next(503, count=1)
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=71,
                                 application_properties=dict(PRODUCERS_OWN))
    assert settlement.action == "complete"
    [(_, copy)] = handing_on.sent
    properties = dict(copy.application_properties)
    assert {k: properties[k] for k in PRODUCERS_OWN} == PRODUCERS_OWN
    assert (properties[retries.ORIGINAL], properties[retries.CHAIN], properties[retries.ATTEMPT]) == (
        order_id, "71", "1")
    [settlement] = deliver_order(copy.body, message_id=copy.message_id, sequence_number=90,
                                 application_properties=properties)
    assert settlement.action == "complete"
    assert reservation_calls(fulfilment, order_id) == [503, 201]


def test_a_copy_the_release_before_scheduled_under_the_old_names_is_read_as_its_original(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, handing_on: RecordingSender
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    fulfilment.fail_next(503, count=1)
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=72)
    assert settlement.action == "complete"
    handing_on.sent.clear()
    # The release before wrote the chain under un-namespaced names; its copy of the second attempt comes due now.
    legacy = {retries.LEGACY.original: order_id, retries.LEGACY.chain: "72", retries.LEGACY.attempt: "1",
              retries.LEGACY.first_failed_at: datetime.now(UTC).isoformat(), retries.LEGACY.reason: "HTTP 503",
              "tenant": "eu"}
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=f"retry.1_{order_id}.legacy",
                                 sequence_number=95, application_properties=legacy)
    assert settlement.action == "complete", settlement
    assert reservation_calls(fulfilment, order_id) == [503, 201]


def test_a_copy_of_a_legacy_copy_is_handed_on_under_the_new_names_only(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer, handing_on: RecordingSender
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    first = datetime.now(UTC).isoformat()
    legacy = {retries.LEGACY.original: order_id, retries.LEGACY.chain: "73", retries.LEGACY.attempt: "2",
              retries.LEGACY.first_failed_at: first, retries.LEGACY.reason: "HTTP 503", "tenant": "eu"}
    fulfilment.fail_next(503, count=1)
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=f"retry.2_{order_id}.legacy",
                                 sequence_number=96, application_properties=legacy)
    assert settlement.action == "complete"
    [(_, copy)] = handing_on.sent
    assert copy.message_id == identity.retry_message_id(order_id, "73", 3)
    assert dict(copy.application_properties) == {
        "tenant": "eu", retries.ORIGINAL: order_id, retries.CHAIN: "73", retries.ATTEMPT: "3",
        retries.FIRST_FAILED_AT: first, retries.REASON: copy.application_properties[retries.REASON]}
