"""The idempotent OrderPlaced handler against the in-memory store."""

from __future__ import annotations

import pytest

from shared.errors import NotFound, StoreError, TransientStoreError
from shared.memory_store import InMemoryStore
from shared.outcomes import Outcome
from shared.place_order import place_order
from shared.store import Document
from tests.support.orders import inbound, order_body


class FailingStore(InMemoryStore):
    """An in-memory store whose next create or read raises a chosen error."""

    def __init__(self, *, create_error: Exception | None = None, read_error: Exception | None = None) -> None:
        super().__init__()
        self.create_error = create_error
        self.read_error = read_error

    def create(self, document: Document) -> Document:
        if self.create_error:
            raise self.create_error
        return super().create(document)

    def read(self, doc_id: str, partition_key: str) -> Document:
        if self.read_error:
            raise self.read_error
        return super().read(doc_id, partition_key)


def test_new_order_is_created_with_one_store_request() -> None:
    store = InMemoryStore()
    result = place_order(inbound(order_body("ord-1"), delivery_count=3), store)
    assert result.outcome is Outcome.CREATED
    assert store.requests == 1
    [doc] = store.documents()
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
    before = store.documents()
    result = place_order(inbound(order_body("ord-1"), delivery_count=1, correlation_id="other"), store)
    assert result.outcome is Outcome.DUPLICATE
    assert store.documents() == before


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
    assert first.request_hash in result.description
    assert result.request_hash in result.description
    assert "SKU-9" not in result.description


def test_invalid_order_writes_nothing_and_names_the_rule() -> None:
    store = InMemoryStore()
    result = place_order(inbound(order_body("ord-1", currency="EURO")), store)
    assert result.outcome is Outcome.INVALID
    assert result.description.startswith("currency")
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


def test_document_without_request_hash_under_same_id_is_a_mismatch() -> None:
    store = InMemoryStore()
    store.create({"id": "ord-1", "orderId": "ord-1", "type": "something-else"})
    assert place_order(inbound(order_body("ord-1")), store).outcome is Outcome.PAYLOAD_MISMATCH
