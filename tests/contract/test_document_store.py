"""One contract for every DocumentStore (the library's conformance suite, ``idempotent_consumer.testing.conformance``):
the in-memory fake, as tests use it and as the simulators page it, the fake for a container partitioned by another
field, and the Cosmos adapter on a real server. If the fake drifts from Cosmos DB's behaviour, the same test fails
for one of them. Below the suite, what only the Cosmos adapter does."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.core.pipeline.transport import AioHttpTransport
from azure.cosmos import PartitionKey
from azure.cosmos.aio import CosmosClient as AsyncCosmosClient

from idempotent_consumer.adapters.cosmos import CosmosStore, make_client
from idempotent_consumer.ports.store import (
    MAX_PAGE_ITEMS,
    DocumentStore,
    Patch,
    query_all,
)
from idempotent_consumer.testing.conformance import StoreConformance
from idempotent_consumer.testing.memory import InMemoryStore
from shared.settings import Settings
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client


@pytest.fixture(scope="module")
def cosmos_store(cosmos_endpoint: CosmosEndpoint, loop: asyncio.Runner) -> Iterator[CosmosStore]:
    """The adapter as the app makes it, on a container of its own (made and dropped with the sync client)."""
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"contract-{uuid.uuid4().hex[:8]}")
    database.create_container_if_not_exists("orders", PartitionKey(path="/orderId"), default_ttl=-1)
    store = CosmosStore.from_settings(Settings(
        cosmos_endpoint=cosmos_endpoint.url, cosmos_key=cosmos_endpoint.key,
        cosmos_verify_tls=cosmos_endpoint.verify_tls, cosmos_database=database.id, cosmos_container="orders"))
    yield store
    loop.run(store.close())
    client.delete_database(database.id)


class FakeClock:
    """The in-memory store's clock, advanced by the TTL tests instead of sleeping."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class TestInMemoryStore(StoreConformance):
    """The fake as tests use it, and as the simulators set it (pages of one document, an empty page first)."""

    @pytest.fixture(params=["as tests use it", "as simulated"])
    def store_and_wait(self, request: pytest.FixtureRequest) -> tuple[DocumentStore, Callable[[float], None]]:
        clock = FakeClock()

        def advance(seconds: float) -> None:
            clock.now += seconds

        simulated = request.param == "as simulated"
        return InMemoryStore(default_ttl=-1, clock=clock, partition_field=self.partition_field,
                             page_items=1 if simulated else MAX_PAGE_ITEMS, empty_first_page=simulated), advance


class TestInMemoryStoreOfAnotherPartitionKey(TestInMemoryStore):
    """The fake for a container partitioned by ``/accountId``, as a library consumer's may be."""

    partition_field = "accountId"


class TestCosmosStore(StoreConformance):
    """The adapter as the app makes it, on the local Cosmos server (or COSMOS_TEST_ENDPOINT)."""

    @pytest.fixture
    def store_and_wait(self, cosmos_store: CosmosStore) -> tuple[DocumentStore, Callable[[float], None]]:
        return cosmos_store, time.sleep


def new_id() -> str:
    return f"ord-{uuid.uuid4()}"


def doc(order_id: str, **fields: object) -> dict[str, Any]:
    return {"id": order_id, "orderId": order_id, **fields}


def test_the_adapter_opens_the_client_it_made_so_that_it_keeps_session_tokens(
    cosmos_store: CosmosStore, loop: asyncio.Runner
) -> None:
    # Opening an async client (``__aenter__``) reads the account, whose consistency (Session, on the
    # local server as in infra/) makes the client keep session tokens; one never opened keeps none,
    # and a read after our own write could reach a replica that has not seen it. The wire shows no
    # difference here (the local server sends no tokens), so this looks at the SDK's session.
    loop.run(query_all(cosmos_store, {"id": "absent"}))
    [client] = [owned for owned in cosmos_store._owned if isinstance(owned, AsyncCosmosClient)]
    assert client.client_connection.session is not None


class RecordingTransport(AioHttpTransport):  # type: ignore[misc]  # azure-core is untyped here
    """The product's transport, keeping each document request's method and Prefer header and its answer's
    body (not the SDK's reads of the container's metadata)."""

    def __init__(self) -> None:
        super().__init__(use_env_settings=False)
        self.sent: list[tuple[str, str | None, bytes]] = []

    async def send(self, request: Any, **kwargs: Any) -> Any:
        response = await super().send(request, **kwargs)
        await response.load_body()
        if request.url.endswith("/docs") or "/docs/" in request.url:  # writes of documents only
            self.sent.append((request.method, request.headers.get("Prefer"), response.body()))
        return response


def test_the_adapter_sends_an_etag_only_patch_alone_as_one_point_patch_that_asks_for_no_body(
    cosmos_endpoint: CosmosEndpoint, loop: asyncio.Runner
) -> None:
    # The batch of one patch costs one request as well; the point patch with ``Prefer: return=minimal``
    # spares the client the document's parse (docs/performance.md). Azure answers it with the etag alone.
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"contract-{uuid.uuid4().hex[:8]}")
    database.create_container_if_not_exists("orders", PartitionKey(path="/orderId"))
    settings = Settings(cosmos_endpoint=cosmos_endpoint.url, cosmos_key=cosmos_endpoint.key,
                        cosmos_verify_tls=cosmos_endpoint.verify_tls, cosmos_database=database.id,
                        cosmos_container="orders")
    transport = RecordingTransport()

    async def patch_twice() -> None:
        async with make_client(settings, transport=transport) as async_client:
            store = CosmosStore.from_settings(settings, client=async_client)
            order_id = new_id()
            created = await store.create(doc(order_id, version=1))
            del transport.sent[:]
            [alone] = await store.execute_batch(order_id, [Patch(order_id, {"version": 2}, if_match=created["_etag"],
                                                                 etag_only=True)])
            await store.execute_batch(order_id, [Patch(order_id, {"version": 3}, if_match=alone["_etag"])])

    try:
        loop.run(patch_twice())
    finally:
        client.delete_database(database.id)
    (point_method, point_prefer, point_body), (batch_method, batch_prefer, batch_body) = transport.sent
    assert (point_method, point_prefer, point_body) == ("PATCH", "return=minimal", b"")
    [answer] = json.loads(batch_body)  # the batch of the other patch: its document in full
    assert (batch_method, batch_prefer, answer["resourceBody"]["version"]) == ("POST", None, 3)


class OverwritingStore(InMemoryStore):
    """Planted: a store whose create overwrites a document of the same id, as an upsert would."""

    async def create(self, document: dict[str, Any]) -> dict[str, Any]:
        self._documents.get(str(document.get("orderId")), {}).pop(str(document.get("id")), None)
        return await super().create(document)


class PiecemealStore(InMemoryStore):
    """Planted: a store whose batch writes its operations one by one, so that a failure keeps those before it."""

    async def execute_batch(self, partition_key: str, operations: Any) -> list[dict[str, Any]]:
        written = []
        for operation in operations:
            written += await super().execute_batch(partition_key, [operation])
        return written


@pytest.mark.parametrize(("store", "test"), [
    (OverwritingStore(default_ttl=-1), "test_second_create_of_the_same_id_raises_already_exists_and_keeps_the_first"),
    (OverwritingStore(default_ttl=-1), "test_sixteen_concurrent_creates_of_one_id_have_exactly_one_winner"),
    (PiecemealStore(default_ttl=-1), "test_batch_that_fails_at_any_operation_writes_nothing"),
], ids=["overwrites", "overwrites under a race", "piecemeal"])
def test_the_suite_finds_a_store_that_drifts_from_cosmos_db(store: InMemoryStore, test: str,
                                                            loop: asyncio.Runner) -> None:
    suite = StoreConformance()
    method = getattr(suite, test)
    options = {"failing_at": 2} if "fails_at_any" in test else {}
    with pytest.raises((AssertionError, pytest.fail.Exception)):  # a failed assert, or pytest.raises's
        method(store, loop=loop, **options)
