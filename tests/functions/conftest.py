"""Call the functions the way the host does: a real ServiceBusReceivedMessage from the host's hand-over
format, the real ServiceBusMessageActions client over gRPC to a fake Settlement service, and the app's
real Cosmos adapter against the local Cosmos server (or COSMOS_TEST_ENDPOINT)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.cosmos import ContainerProxy, PartitionKey

import function_app
from consumers import runtime
from devservers.fulfilment import FulfilmentServer
from shared.fulfilment import InMemoryFulfilment
from shared.memory_store import InMemoryStore
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client
from tests.support.fake_host import FakeHost, Settlement, make_received_message
from tests.support.fault_proxy import FaultProxy, fault_proxy


@pytest.fixture(scope="session")
def registered_functions() -> dict[str, Callable[..., Any]]:
    """The user functions as the worker indexes them from function_app.app (get_functions once per app)."""
    return {f.get_function_name(): f.get_user_function() for f in function_app.app.get_functions()}


@dataclass
class CosmosTarget:
    """The container the app writes to, and the settings that point the app at it."""

    endpoint: CosmosEndpoint
    database: str
    container: ContainerProxy

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        return {
            "COSMOS_ENDPOINT": endpoint_url or self.endpoint.url,
            "COSMOS_KEY": self.endpoint.key,
            "COSMOS_VERIFY_TLS": "true" if self.endpoint.verify_tls else "false",
            "COSMOS_DATABASE": self.database,
            "COSMOS_CONTAINER": self.container.id,
        }


@pytest.fixture(scope="session")
def cosmos_target(cosmos_endpoint: CosmosEndpoint) -> CosmosTarget:
    """A database and orders container (partition key /orderId, TTL on) made for this test session."""
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"fn-{uuid.uuid4().hex[:8]}")
    container = database.create_container_if_not_exists(
        "orders", partition_key=PartitionKey(path="/orderId"), default_ttl=-1
    )
    return CosmosTarget(cosmos_endpoint, database.id, container)


@pytest.fixture(scope="session")
def fulfilment_server() -> Iterator[FulfilmentServer]:
    """The fulfilment service on loopback: a real HTTP server that deduplicates by Idempotency-Key."""
    with FulfilmentServer() as server:
        yield server


@pytest.fixture
def fulfilment(fulfilment_server: FulfilmentServer) -> Iterator[FulfilmentServer]:
    """The fulfilment server with no faults left over from another test."""
    fulfilment_server.reset_faults()
    yield fulfilment_server
    fulfilment_server.reset_faults()


@pytest.fixture
def app_on_cosmos(
    monkeypatch: pytest.MonkeyPatch, cosmos_target: CosmosTarget, fulfilment: FulfilmentServer
) -> Iterator[CosmosTarget]:
    """Point the app's settings at the test container and the fulfilment server; clients are made lazily."""
    for name, value in cosmos_target.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FULFILLMENT_URL", fulfilment.url)
    monkeypatch.setenv("FULFILLMENT_READ_TIMEOUT_SECONDS", "2")
    runtime.reset()
    yield cosmos_target
    runtime.reset()


@pytest.fixture
def cosmos_proxy(monkeypatch: pytest.MonkeyPatch, app_on_cosmos: CosmosTarget) -> Iterator[FaultProxy]:
    """The app's Cosmos traffic through a proxy on loopback that can fail chosen requests."""
    with fault_proxy(app_on_cosmos.endpoint.url) as proxy:
        monkeypatch.setenv("COSMOS_ENDPOINT", proxy.url)
        runtime.reset()
        yield proxy


@pytest.fixture
def app_in_memory(monkeypatch: pytest.MonkeyPatch) -> InMemoryStore:
    """Run the app's functions against an in-memory store and fulfilment (for property-based tests)."""
    store = InMemoryStore()
    service = InMemoryFulfilment()
    monkeypatch.setenv("FULFILLMENT_URL", "http://fulfilment.invalid")
    runtime.reset()
    monkeypatch.setattr(runtime, "order_store", lambda: store)
    monkeypatch.setattr(runtime, "fulfilment", lambda: service)
    return store


class Deliverer:
    """Deliver a message to a function as the host would, and read back how it was settled."""

    def __init__(self, host: FakeHost, functions: dict[str, Callable[..., Any]], name: str) -> None:
        self.host = host
        self.function = functions[name]

    def __call__(self, body: bytes, **message: Any) -> list[Settlement]:
        msg = make_received_message(body, **message)
        self.function(msg, self.host.message_actions())
        return self.host.recorder.settlements_for(msg.lock_token)

    def message(self, body: bytes, **message: Any) -> Any:
        return make_received_message(body, **message)


@pytest.fixture
def deliver_order(fake_host: FakeHost, registered_functions: dict[str, Callable[..., Any]]) -> Deliverer:
    """Deliver to process_order."""
    return Deliverer(fake_host, registered_functions, "process_order")


@pytest.fixture
def deliver_event(fake_host: FakeHost, registered_functions: dict[str, Callable[..., Any]]) -> Deliverer:
    """Deliver to process_order_event."""
    return Deliverer(fake_host, registered_functions, "process_order_event")
