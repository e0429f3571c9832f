"""One contract for every DocumentStore: the in-memory fake and the Cosmos adapter on a real server.

If the fake drifts from Cosmos DB's behaviour, the same test fails for one of them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from azure.cosmos import PartitionKey

from shared.cosmos_store import CosmosStore
from shared.errors import AlreadyExists, NotFound
from shared.memory_store import InMemoryStore
from shared.store import DocumentStore
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client


@pytest.fixture(scope="module")
def cosmos_container(cosmos_endpoint: CosmosEndpoint) -> Iterator[object]:
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"contract-{uuid.uuid4().hex[:8]}")
    yield database.create_container_if_not_exists("orders", PartitionKey(path="/orderId"), default_ttl=-1)
    client.delete_database(database.id)


@pytest.fixture(params=["memory", "cosmos"])
def store(request: pytest.FixtureRequest) -> DocumentStore:
    if request.param == "memory":
        return InMemoryStore()
    return CosmosStore(request.getfixturevalue("cosmos_container"))


def doc(order_id: str, **fields: object) -> dict:
    return {"id": order_id, "orderId": order_id, **fields}


def new_id() -> str:
    return f"ord-{uuid.uuid4()}"


def test_create_returns_the_document_with_an_etag(store: DocumentStore) -> None:
    order_id = new_id()
    created = store.create(doc(order_id, total="1.00"))
    assert created["id"] == order_id
    assert created["total"] == "1.00"
    assert created["_etag"]


def test_read_returns_what_was_created(store: DocumentStore) -> None:
    order_id = new_id()
    store.create(doc(order_id, items=[{"sku": "S", "quantity": 2}]))
    read = store.read(order_id, order_id)
    assert read["items"] == [{"sku": "S", "quantity": 2}]


def test_second_create_of_the_same_id_raises_already_exists_and_keeps_the_first(store: DocumentStore) -> None:
    order_id = new_id()
    store.create(doc(order_id, version=1))
    with pytest.raises(AlreadyExists) as caught:
        store.create(doc(order_id, version=2))
    assert caught.value.status == 409
    assert store.read(order_id, order_id)["version"] == 1


def test_read_of_a_missing_document_raises_not_found(store: DocumentStore) -> None:
    with pytest.raises(NotFound) as caught:
        store.read("no-such-order", "no-such-order")
    assert caught.value.status == 404


def test_read_in_another_partition_raises_not_found(store: DocumentStore) -> None:
    order_id = new_id()
    store.create(doc(order_id))
    with pytest.raises(NotFound):
        store.read(order_id, "another-partition")


def test_same_id_in_two_partitions_is_two_documents(store: DocumentStore) -> None:
    shared_id = new_id()
    store.create({"id": shared_id, "orderId": "p-1"})
    store.create({"id": shared_id, "orderId": "p-2"})
    assert store.read(shared_id, "p-1")["orderId"] == "p-1"
    assert store.read(shared_id, "p-2")["orderId"] == "p-2"


def test_partition_key_field_is_order_id(store: DocumentStore) -> None:
    assert store.partition_key_field == "orderId"


def test_sixteen_concurrent_creates_of_one_id_have_exactly_one_winner(store: DocumentStore) -> None:
    order_id = new_id()
    start = threading.Barrier(16)

    def attempt(n: int) -> str:
        start.wait()
        try:
            store.create(doc(order_id, writer=n))
        except AlreadyExists:
            return "conflict"
        return "created"

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(attempt, range(16)))
    assert results.count("created") == 1
    assert results.count("conflict") == 15
