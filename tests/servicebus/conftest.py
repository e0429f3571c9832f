"""One broker for the Service Bus tests, with a generated Config.json in which every test has its own entities.

Entities are declared here, next to each other, so that names stay unique and tests cannot see each
other's messages. Durations are short (1-2 s locks, 1 s TTLs) so expiry tests finish quickly; tests
wait for expiry by polling with a deadline, never by asserting on elapsed time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSender,
    ServiceBusSubQueue,
)

from devservers.servicebus import Broker, start_broker

T = TypeVar("T")

SHORT_LOCK = {"LockDuration": "PT1S"}

QUEUES: dict[str, dict[str, Any]] = {
    "basic": {},
    "batch": {},
    "annotations": {},
    "receive-and-delete": {},
    "credit": {},
    "abandon": {"MaxDeliveryCount": 5},
    "defer": {},
    "mgmt-settle": {},
    "dead-letter": {},
    "lock-expiry": {**SHORT_LOCK, "MaxDeliveryCount": 5},
    "renew-lock": SHORT_LOCK,
    "lock-lost": {},
    "renew-lost": SHORT_LOCK,
    "max-delivery": {"MaxDeliveryCount": 2},
    "ttl-drop": {"DefaultMessageTimeToLive": "PT1S"},
    "ttl-dead-letter": {"DefaultMessageTimeToLive": "PT1S", "DeadLetteringOnMessageExpiration": True},
    "ttl-message": {"DeadLetteringOnMessageExpiration": True},
    "duplicates": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT2S"},
    "peek": {},
    "peek-dlq": {},
    "scheduled": {},
    "scheduled-cancel": {},
    "forward-source": {"ForwardTo": "forward-target"},
    "forward-target": {},
    "sessions-fifo": {"RequiresSession": True},
    "sessions-next": {"RequiresSession": True},
    "sessions-locked": {"RequiresSession": True},
    "sessions-state": {"RequiresSession": True, "LockDuration": "PT5S"},
    "sessions-empty": {"RequiresSession": True},
    "sessions-waiting": {"RequiresSession": True},
    "sessions-expiry": {"RequiresSession": True, "LockDuration": "PT2S"},
    "sessions-closed": {"RequiresSession": True, "MaxDeliveryCount": 10},
    "sessions-required": {"RequiresSession": True},
    "not-sessionful": {},
    "deferred-missing": {},
    "concurrent-renew": {"LockDuration": "PT8S"},
    "concurrent-peek": {},
    "value-body": {},
    "decimal-property": {},
    "decimal-refused": {},
    "size-standard": {},
    "size-premium": {"MaxMessageSizeInKilobytes": 1024},
    "size-sdk-test": {},
    "size-batch": {},
    "size-full-batch": {},
    "size-large-batch": {"MaxMessageSizeInKilobytes": 2048},
    "size-scheduled": {},
}

TOPICS: dict[str, dict[str, Any]] = {
    "fanout": {
        "Properties": {},
        "Subscriptions": [
            {"Name": "all"},
            {
                "Name": "eu",
                "Rules": [
                    {
                        "Name": "eu-only",
                        "Properties": {
                            "FilterType": "Correlation",
                            "CorrelationFilter": {"Properties": {"region": "eu"}},
                        },
                    }
                ],
            },
            {
                "Name": "invoices",
                "Rules": [
                    {
                        "Name": "by-label",
                        "Properties": {
                            "FilterType": "Correlation",
                            "CorrelationFilter": {"Label": "invoice", "CorrelationId": "c-1"},
                        },
                    }
                ],
            },
        ],
    },
    "topic-dlq": {"Properties": {}, "Subscriptions": [{"Name": "sub", "Properties": {"MaxDeliveryCount": 1}}]},
    "size-topic": {"Properties": {"MaxMessageSizeInKilobytes": 1024}, "Subscriptions": [{"Name": "all"}]},
}


def build_config() -> dict[str, Any]:
    return {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [{"Name": name, "Properties": props} for name, props in QUEUES.items()],
                    "Topics": [{"Name": name, **spec} for name, spec in TOPICS.items()],
                }
            ],
            "Logging": {"Type": "File"},
        }
    }


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    with start_broker(build_config()) as running:
        yield running


@pytest.fixture(scope="session")
def client(broker: Broker) -> Iterator[ServiceBusClient]:
    """One client for all tests (each sender and receiver still has its own connection).

    No retries, so errors surface at once.
    """
    with ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as sb_client:
        yield sb_client
        for closer in _background_closes:  # before the client closes the handlers it still knows
            closer.join(10)


class Handlers:
    """Short names for the SDK's handler factories, as the tests use them."""

    def __init__(self, client: ServiceBusClient) -> None:
        self.client = client

    def sender(self, queue: str) -> ServiceBusSender:
        # keep_alive=0: no keep-alive thread, which close() would have to join.
        return self.client.get_queue_sender(queue, keep_alive=0)

    def topic_sender(self, topic: str) -> ServiceBusSender:
        return self.client.get_topic_sender(topic, keep_alive=0)

    def receiver(self, queue: str, **kwargs: Any) -> ServiceBusReceiver:
        return self.client.get_queue_receiver(queue, **kwargs)

    def dead_letters(self, queue: str, **kwargs: Any) -> ServiceBusReceiver:
        return self.client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, **kwargs)

    def subscription(self, topic: str, subscription: str, **kwargs: Any) -> ServiceBusReceiver:
        return self.client.get_subscription_receiver(topic, subscription, **kwargs)


@pytest.fixture(scope="session")
def sb(client: ServiceBusClient) -> Handlers:
    return Handlers(client)


# Opening a sender or receiver takes the SDK about 0.5 s (it polls its connection every 50 ms, one
# frame at a time), and closing a receiver joins its keep-alive thread, which sleeps in 1 s steps.
# Tests therefore open their handlers in parallel and close them in the background.
_background_closes: list[threading.Thread] = []


@contextmanager
def opened(*handlers: Any) -> Iterator[tuple[Any, ...]]:
    """Open SDK senders/receivers concurrently; close them in the background when the block ends."""
    errors: list[BaseException] = []

    def enter(handler: Any) -> None:
        try:
            handler.__enter__()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=enter, args=(handler,)) for handler in handlers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        if errors:
            raise errors[0]
        yield handlers
    finally:
        for handler in handlers:
            closer = threading.Thread(target=handler.close, daemon=True)
            closer.start()
            _background_closes.append(closer)


def collect(receiver: ServiceBusReceiver, count: int, wait: float = 5.0) -> list[ServiceBusReceivedMessage]:
    """Receive until ``count`` messages have arrived or ``wait`` seconds passed; settles nothing."""
    received: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + wait
    while len(received) < count and time.monotonic() < deadline:
        received += receiver.receive_messages(max_message_count=count - len(received), max_wait_time=1)
    return received


def nothing_to_receive(receiver: ServiceBusReceiver) -> bool:
    return receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []


def wait_for(probe: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.1) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)
