"""Call the functions the way the host does: a real ServiceBusReceivedMessage from the host's hand-over
format, the real ServiceBusMessageActions client over gRPC to a fake Settlement service, and the app's
real Cosmos adapter against the local Cosmos server (or COSMOS_TEST_ENDPOINT).

Each test runs the functions of a FunctionApp of its own, made from the same blueprint factory as
``function_app.app`` (so the same function code and bindings), on an ``App`` it built with
``bootstrap.build``: its ``root`` hands the functions whichever app the test set up last.

The functions are coroutine functions; like the worker, the tests await every invocation on one event
loop (the session's ``loop``), where the app's async clients live, and close the clients at the end.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import azure.functions as func
import msgspec
import pytest
from azure.cosmos import ContainerProxy, PartitionKey
from azure.servicebus import ServiceBusReceivedMessage

import function_app
from consumers.triggers import make_blueprint
from devservers.faultproxy import FaultProxy, fault_proxy
from devservers.fulfilment import FulfilmentServer
from idempotent_consumer import identity
from idempotent_consumer.adapters.cosmos import CosmosStore
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.settings import Settings
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client
from tests.support.fake_host import FakeHost, Settlement, make_received_message

T = TypeVar("T")


def user_functions(app: func.FunctionApp) -> dict[str, Callable[..., Any]]:
    """The user functions by name, as the worker indexes them from a FunctionApp (get_functions once per app)."""
    functions: dict[str, Callable[..., Any]] = {}
    for f in app.get_functions():
        name = f.get_function_name()
        assert name is not None, f  # every function is named by its decorator
        functions[name] = f.get_user_function()
    return functions


@pytest.fixture(scope="session")
def production_functions() -> dict[str, Callable[..., Any]]:
    """The user functions of ``function_app.app`` itself, on the root it builds from the environment."""
    return user_functions(function_app.app)


class Root:
    """What this test's functions run on: the ``App`` the test built last (``app_on_cosmos``, ``app_in_memory``)."""

    def __init__(self) -> None:
        self.app: bootstrap.App | None = None

    def __call__(self) -> bootstrap.App:
        assert self.app is not None, "the test should set up an app: app_on_cosmos or app_in_memory"
        return self.app


@pytest.fixture
def root() -> Root:
    """This test's root, empty until an app fixture builds an app."""
    return Root()


@pytest.fixture
def registered_functions(root: Root) -> dict[str, Callable[..., Any]]:
    """The user functions of a FunctionApp made as function_app makes its own, on this test's root."""
    app = func.FunctionApp()
    app.register_functions(make_blueprint(Settings(), root))
    return user_functions(app)


@dataclass
class CosmosTarget:
    """The container the app writes to, and the settings that point the app at it."""

    endpoint: CosmosEndpoint
    database: str
    container: ContainerProxy

    def settings(self, **changes: Any) -> Settings:
        """Settings that point the app at this container."""
        return Settings(
            cosmos_endpoint=self.endpoint.url, cosmos_key=self.endpoint.key,
            cosmos_verify_tls=self.endpoint.verify_tls, cosmos_database=self.database,
            cosmos_container=self.container.id, **changes,
        )


@dataclass
class Harness:
    """The app as a test set it up; ``reconfigure`` builds another, with other settings or fakes.

    The clients an app made are closed on the loop when it is replaced and at the end.
    """

    target: CosmosTarget
    settings: Settings
    stack: ExitStack
    loop: asyncio.Runner
    root: Root
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def app(self) -> bootstrap.App:
        """The app the functions run on now."""
        return self.root()

    @property
    def container(self) -> ContainerProxy:
        return self.target.container

    @property
    def endpoint(self) -> Any:
        return self.target.endpoint

    def reconfigure(self, **changes: Any) -> bootstrap.App:
        """Build a new app: ``store``, ``fulfilment``, ``sender`` replace clients, ``clock`` the app's time, the rest
        are settings."""
        for name in ("store", "fulfilment", "sender", "clock"):
            if name in changes:
                self.overrides[name] = changes.pop(name)
        self.settings = msgspec.structs.replace(self.settings, **changes)
        self.close()
        self.root.app = bootstrap.build(self.settings, **self.overrides)
        return self.root.app

    def close(self) -> None:
        """Close the clients the current app made (clients handed in are their maker's to close)."""
        if self.root.app is not None:
            self.loop.run(self.root.app.aclose())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the loop the app's clients live in."""
        return self.loop.run(coro)

    def cosmos_store(self) -> CosmosStore:
        """The real Cosmos adapter on the test container directly (past any fault proxy); closed at the end."""
        store = CosmosStore.from_settings(self.target.settings())
        self.stack.callback(lambda: self.loop.run(store.close()))
        return store


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
    cosmos_target: CosmosTarget, fulfilment: FulfilmentServer, loop: asyncio.Runner, root: Root
) -> Iterator[Harness]:
    """An app pointed at the test container and the fulfilment server; its clients are made lazily (in the
    loop, on first use) and closed when the test ends.

    These tests drive each redelivery by hand, so a transient failure is tried once and abandoned, as with
    DELAYED_RETRIES false; ``test_delayed_retries.py`` runs the default, which tries in the lock and hands on."""
    settings = cosmos_target.settings(fulfillment_url=fulfilment.url, fulfillment_read_timeout_seconds=2,
                                      abandon_delay_seconds=0, delayed_retries=False)
    with ExitStack() as stack:
        harness = Harness(cosmos_target, settings, stack, loop, root)
        stack.callback(harness.close)  # last: after the clients it handed in are closed
        harness.reconfigure()
        yield harness


@pytest.fixture
def cosmos_proxy(app_on_cosmos: Harness) -> Iterator[FaultProxy]:
    """The app's Cosmos traffic through a proxy on loopback that can fail chosen requests."""
    with fault_proxy(app_on_cosmos.endpoint.url) as proxy:
        app_on_cosmos.reconfigure(cosmos_endpoint=proxy.url)
        yield proxy


@pytest.fixture
def app_in_memory(root: Root) -> InMemoryStore:
    """Run the functions on an app over an in-memory store and fulfilment (for property-based tests)."""
    store = InMemoryStore()
    root.app = bootstrap.build(Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0),
                               store=store, fulfilment=InMemoryFulfilment())
    return store


class Deliverer:
    """Deliver a message to a function as the host would (awaited on the loop), and read back how it was settled."""

    def __init__(
        self, host: FakeHost, functions: dict[str, Callable[..., Any]], name: str, loop: asyncio.Runner
    ) -> None:
        self.host = host
        self.function = functions[name]
        self.loop = loop

    def __call__(self, body: bytes | None, **message: Any) -> list[Settlement]:
        msg = make_received_message(body, **message)
        self.invoke(msg)
        return self.settlements(msg)

    def invoke(self, msg: ServiceBusReceivedMessage, actions: Any = None) -> None:
        """Run the function on ``msg`` to its end, as the worker awaits one invocation."""
        self.loop.run(self.function(msg, actions or self.host.message_actions()))

    def message(self, body: bytes, **message: Any) -> ServiceBusReceivedMessage:
        return make_received_message(body, **message)

    def settlements(self, msg: ServiceBusReceivedMessage) -> list[Settlement]:
        """How the host was asked to settle ``msg``, in arrival order."""
        assert msg.lock_token is not None  # the host's hand-over always carries one
        return self.host.recorder.settlements_for(msg.lock_token)


@pytest.fixture
def deliver_order(
    fake_host: FakeHost, registered_functions: dict[str, Callable[..., Any]], loop: asyncio.Runner
) -> Deliverer:
    """Deliver to process_order."""
    return Deliverer(fake_host, registered_functions, "process_order", loop)


@pytest.fixture
def deliver_event(
    fake_host: FakeHost, registered_functions: dict[str, Callable[..., Any]], loop: asyncio.Runner
) -> Deliverer:
    """Deliver to process_order_event."""
    return Deliverer(fake_host, registered_functions, "process_order_event", loop)


@pytest.fixture
def handing_on(app_on_cosmos: Harness) -> Iterator[RecordingSender]:
    """The app with delayed retries on and one try in the lock: a transient failure is handed on at once, its copy
    recorded (for the test to deliver when it likes)."""
    recording = RecordingSender()
    app_on_cosmos.reconfigure(sender=recording, delayed_retries=True, retry_in_lock_attempts=1)
    yield recording


def reservation_calls(fulfilment: FulfilmentServer, order_id: str) -> list[int]:
    """The statuses the fulfilment stand-in answered to the order's reservation calls, in order."""
    return [c.status for c in fulfilment.calls(identity.effect_key("order-projection", "reserve-stock", order_id))]
