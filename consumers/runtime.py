"""Process-wide clients and settings, made lazily on first use and then reused.

Nothing here connects at import time: under Azure Functions, import happens while the host indexes
the functions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from shared.cosmos_store import CosmosStore
from shared.fulfilment import FulfilmentService
from shared.http_fulfilment import HttpFulfilment
from shared.messaging import MessageSender
from shared.servicebus_sender import ServiceBusSender, make_client
from shared.settings import CosmosSettings, EventSettings, OrderSettings, OutboxSettings
from shared.store import DocumentStore

T = TypeVar("T")


class _Lazy(Generic[T]):
    """A value built on first use, once per process, even when many threads ask at once."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    def reset(self) -> None:
        with self._lock:
            self._value = None


def _http_fulfilment() -> FulfilmentService:
    settings = order_settings()
    return HttpFulfilment(
        settings.fulfillment_url,
        connect_timeout=settings.connect_timeout_seconds,
        read_timeout=settings.read_timeout_seconds,
    )


_order_store: _Lazy[DocumentStore] = _Lazy(lambda: CosmosStore.from_settings(CosmosSettings.from_env()))
_event_settings: _Lazy[EventSettings] = _Lazy(EventSettings.from_env)
_order_settings: _Lazy[OrderSettings] = _Lazy(OrderSettings.from_env)
_outbox_settings: _Lazy[OutboxSettings] = _Lazy(OutboxSettings.from_env)
_fulfilment: _Lazy[FulfilmentService] = _Lazy(_http_fulfilment)
_sender: _Lazy[MessageSender] = _Lazy(lambda: ServiceBusSender(make_client(outbox_settings())))
_ALL = (_order_store, _event_settings, _order_settings, _outbox_settings, _fulfilment, _sender)


def order_store() -> DocumentStore:
    """The orders container's store (orders and their events share it), created once per process."""
    return _order_store.get()


def event_settings() -> EventSettings:
    """The event consumer's settings, read and checked once per process."""
    return _event_settings.get()


def order_settings() -> OrderSettings:
    """process_order's settings, read once per process."""
    return _order_settings.get()


def outbox_settings() -> OutboxSettings:
    """The outbox publisher's settings, read once per process."""
    return _outbox_settings.get()


def fulfilment() -> FulfilmentService:
    """The fulfilment service's HTTP client, one pooled session per process."""
    return _fulfilment.get()


def sender() -> MessageSender:
    """The Service Bus sender, connected on first send."""
    return _sender.get()


def reset() -> None:
    """Forget the process's clients and settings, so that tests can point the app elsewhere."""
    for lazy in _ALL:
        lazy.reset()
