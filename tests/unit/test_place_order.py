"""The idempotent OrderPlaced handler against the in-memory store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from idempotent_consumer.errors import BatchFailed, NotFound, StoreError, TransientStoreError
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import BatchOperation, Document, Patch, Replace
from idempotent_consumer.records import EffectStatus, SideEffectRecord
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.handlers.place_order import OrderServices
from shared.handlers.place_order import place_order as place
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.orders import inbound, order_body, rule_path
from tests.support.records import claims, removed, replaced

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

SETTINGS = Settings(consumer_name="order-intake", fulfillment_url="http://fulfilment.invalid")
run = asyncio.run  # the in-memory fakes hold nothing across calls: a fresh loop per call will do


def place_order(message, store: InMemoryStore) -> Result:
    return run(place(message, OrderServices(store, InMemoryFulfilment(), SETTINGS)))


def orders(store: InMemoryStore) -> list[Document]:
    return [d for d in store.documents() if d.get("type") == "order"]


class FailingStore(InMemoryStore):
    """An in-memory store whose next create or read raises a chosen error."""

    def __init__(self, *, create_error: Exception | None = None, read_error: Exception | None = None) -> None:
        super().__init__()
        self.create_error = create_error
        self.read_error = read_error

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        if self.create_error:
            raise self.create_error
        return await super().execute_batch(partition_key, operations)

    async def read(self, doc_id: str, partition_key: str) -> Document:
        if self.read_error:
            raise self.read_error
        return await super().read(doc_id, partition_key)


def test_new_order_is_created_in_one_batch_and_its_reservation_finished_in_one_more() -> None:
    store = InMemoryStore()
    result = place_order(inbound(order_body("ord-1"), delivery_count=3), store)
    assert result.outcome is Outcome.CREATED
    assert store.requests == 2
    [doc] = orders(store)
    assert doc["id"] == doc["orderId"] == doc["messageId"] == "ord-1"
    assert (doc["type"], doc["status"], doc["version"]) == ("order", "placed", 1)
    assert doc["requestHash"] == result.request_hash
    assert doc["correlationId"] == "corr-1"
    assert doc["enqueuedTimeUtc"] == "2026-11-30T09:15:01.000000Z"
    assert doc["deliveryCount"] == 3
    assert doc["items"][0] == {"sku": "SKU-1", "quantity": 2, "unitPrice": "19.99"}


def test_redelivered_order_is_a_duplicate_and_changes_nothing() -> None:
    store = InMemoryStore()
    place_order(inbound(order_body("ord-1")), store)
    before = orders(store)
    result = place_order(inbound(order_body("ord-1"), delivery_count=1, correlation_id="other"), store)
    assert result.outcome is Outcome.DUPLICATE
    assert orders(store) == before


OTHER_ITEMS = {"items": [{"sku": "SKU-9", "quantity": 1, "unitPrice": "44.98"}]}


@pytest.mark.parametrize(("changed", "outcome"), [({}, Outcome.DUPLICATE), (OTHER_ITEMS, Outcome.PAYLOAD_MISMATCH)])
def test_a_copy_costs_the_failed_batch_and_one_read_of_the_record(changed: dict, outcome: Outcome) -> None:
    store = InMemoryStore()
    place_order(inbound(order_body("ord-1")), store)
    before = store.requests
    assert place_order(inbound(order_body("ord-1", **changed)), store).outcome is outcome
    assert store.requests - before == 2


def test_a_copy_finding_a_record_without_its_hash_reads_the_order_and_is_still_a_duplicate() -> None:
    store = InMemoryStore()
    place_order(inbound(order_body("ord-1")), store)
    [record] = claims(store.documents())
    del record["requestHash"]  # claimed before the record kept the hash
    run(replaced(store, record))
    result = place_order(inbound(order_body("ord-1")), store)
    assert result.outcome is Outcome.DUPLICATE
    other = place_order(inbound(order_body("ord-1", **OTHER_ITEMS)), store)
    assert other.outcome is Outcome.PAYLOAD_MISMATCH


def test_redelivery_with_other_spelling_of_same_content_is_a_duplicate() -> None:
    store = InMemoryStore()
    place_order(inbound(order_body("ord-1")), store)
    assert place_order(inbound(order_body("ord-1", total="44.980")), store).outcome is Outcome.DUPLICATE


def test_redelivered_order_with_other_items_is_a_payload_mismatch_naming_both_hashes() -> None:
    store = InMemoryStore()
    first = place_order(inbound(order_body("ord-1")), store)
    other = order_body("ord-1", items=[{"sku": "SKU-9", "quantity": 1, "unitPrice": "44.98"}])
    result = place_order(inbound(other), store)
    assert result.outcome is Outcome.PAYLOAD_MISMATCH
    assert "ord-1" in result.description
    assert first.request_hash is not None and result.request_hash is not None
    assert first.request_hash in result.description
    assert result.request_hash in result.description
    assert "SKU-9" not in result.description


def test_invalid_order_writes_nothing_and_names_the_rule() -> None:
    store = InMemoryStore()
    result = place_order(inbound(order_body("ord-1", currency="EURO")), store)
    assert result.outcome is Outcome.INVALID
    assert rule_path(result.description) == "$.currency"
    assert store.requests == 0


@pytest.mark.parametrize("status", [408, 429, 449, 500, 503])
def test_transient_create_failure_is_transient(status: int) -> None:
    store = FailingStore(create_error=TransientStoreError("busy", status=status))
    assert place_order(inbound(order_body("ord-1")), store).outcome is Outcome.TRANSIENT


@pytest.mark.parametrize("error", [TransientStoreError("busy", status=429), NotFound("gone", status=404)])
def test_failed_read_after_conflict_is_transient(error: Exception) -> None:
    store = FailingStore()
    place_order(inbound(order_body("ord-1")), store)
    store.read_error = error
    assert place_order(inbound(order_body("ord-1")), store).outcome is Outcome.TRANSIENT


def test_unexpected_store_error_propagates_to_the_caller() -> None:
    store = FailingStore(create_error=StoreError("forbidden", status=403))
    with pytest.raises(StoreError):
        place_order(inbound(order_body("ord-1")), store)


def test_a_document_of_a_type_it_does_not_know_under_the_same_id_is_unreadable_not_a_mismatch() -> None:
    store = InMemoryStore()
    run(store.create({"id": "ord-1", "orderId": "ord-1", "type": "something-else"}))
    result = place_order(inbound(order_body("ord-1")), store)
    assert result.outcome is Outcome.UNREADABLE  # no requestHash there says it is other content
    assert "something-else ord-1 is of a type this version does not know" in result.description


def test_a_delivery_whose_lock_ran_out_does_not_take_a_claim_over() -> None:
    store = InMemoryStore()
    now = [1_000_000.0]
    effect = SideEffect(store, "order-intake", "reserve-stock", 60, lambda: now[0])
    lock = datetime.fromtimestamp(now[0] + 30, UTC)
    first = InboundMessage(message_id="o", body=None, sequence_number=5, locked_until_utc=lock)
    run(store.create((claim := effect.claim("o", first)).to_document()))
    now[0] += 31  # the lock has run out; the same message's live redelivery owns the claim now
    calls: list[str] = []

    async def succeed(key: str) -> Reply:
        calls.append(key)
        return Reply(201)

    result = run(effect.run(claim, first, succeed, done=Outcome.CREATED))
    assert result.outcome is Outcome.TRANSIENT
    assert calls == []
    assert SideEffectRecord.from_document(run(store.read(store.documents()[0]["id"], "o"))).attempt == 1


def test_a_finish_that_finds_its_own_message_took_the_claim_over_finishes_it() -> None:
    store = InMemoryStore()
    effect = SideEffect(store, "order-intake", "reserve-stock", 60)
    message = InboundMessage(message_id="o", body=None, sequence_number=5)
    claim = effect.claim("o", message)
    record_id = claim.id

    async def call_while_a_stale_delivery_takes_over(key: str) -> Reply:
        current = await store.read(record_id, "o")
        await store.execute_batch("o", [Replace({**current, "attempt": 9}, if_match=current["_etag"])])
        return Reply(201, {"reservationId": "res-1"})

    result = run(effect.run(claim, message, call_while_a_stale_delivery_takes_over, done=Outcome.CREATED))
    assert result.outcome is Outcome.CREATED
    stored = SideEffectRecord.from_document(run(store.read(record_id, "o")))
    assert (stored.status, stored.reference) == (EffectStatus.COMPLETED, "res-1")


def test_a_claim_made_again_after_its_record_was_removed_keeps_the_hash(claim_form: str) -> None:
    store = InMemoryStore()
    place_order(inbound(order_body("ord-1")), store)
    [record] = claims(store.documents())
    run(removed(store, record))
    assert place_order(inbound(order_body("ord-1")), store).outcome is Outcome.DUPLICATE
    [again] = claims(store.documents())
    assert again["requestHash"] == record["requestHash"]
    before = store.requests
    assert place_order(inbound(order_body("ord-1")), store).outcome is Outcome.DUPLICATE
    # A claim made again is a document of its own in either form (SideEffect.within): where new claims are kept in
    # the order, a copy reads the order first, then that document.
    assert store.requests - before == (2 if claim_form == "claim of its own" else 3)


class RecordWriteFails(InMemoryStore):
    """An in-memory store whose writes of the reservation record (a batch that patches it first, or its order's
    ``reservationClaim``) fail with a chosen error."""

    def __init__(self, error: StoreError) -> None:
        super().__init__()
        self.error = error

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        [first, *_] = operations
        target = first.doc_id if isinstance(first, Patch) else first.document.get("id", "") if isinstance(
            first, Replace) else ""
        if isinstance(first, Patch) and (target.startswith("side-effect")
                                         or any(name.startswith("reservationClaim/") for name in first.set_fields)):
            raise BatchFailed(0, self.error)
        return await super().execute_batch(partition_key, operations)


def test_a_record_write_that_fails_for_another_reason_than_a_race_is_raised_not_taken_for_a_race() -> None:
    store = RecordWriteFails(StoreError("forbidden", status=403))
    with pytest.raises(StoreError, match="forbidden") as caught:
        place_order(inbound(order_body("ord-1")), store)
    assert not isinstance(caught.value, TransientStoreError)
    store.error = TransientStoreError("throttled", status=429)
    assert place_order(inbound(order_body("ord-1")), store).outcome is Outcome.TRANSIENT
