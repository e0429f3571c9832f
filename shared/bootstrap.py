"""The composition root: builds the process's services from settings, lazily and once.

The Functions blueprints call ``services()`` on each invocation; nothing connects at import time,
because under Azure Functions import happens while the host indexes the functions. Tests and the
simulator build a ``Services`` of their own (in-memory store, recording sender, fakes) and hand it
over with ``use(...)``, so no test reaches into a module's globals.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from shared.adapters.cosmos import CosmosStore
from shared.adapters.http import HttpFulfilment
from shared.adapters.servicebus import ServiceBusSender, make_client
from shared.ports.fulfilment import FulfilmentService
from shared.ports.sender import MessageSender
from shared.ports.store import DocumentStore
from shared.settings import Settings


class _Once:
    """A value built on first use, once, even when many threads ask at once."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._value: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._value is None:
                self._value = self._build()
            return self._value


@dataclass
class Services:
    """What the handlers need. Each client is built on first use from ``settings``, or given up front."""

    settings: Settings
    store: DocumentStore | None = None
    fulfilment: FulfilmentService | None = None
    sender: MessageSender | None = None
    _lazy: dict[str, _Once] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._lazy = {
            "store": _Once(lambda: self.store or _cosmos_store(self.settings)),
            "fulfilment": _Once(lambda: self.fulfilment or _http_fulfilment(self.settings)),
            "sender": _Once(lambda: self.sender or _servicebus_sender(self.settings)),
        }

    def order_store(self) -> DocumentStore:
        """The orders container's store (orders and their events share it)."""
        store: DocumentStore = self._lazy["store"].get()
        return store

    def fulfilment_service(self) -> FulfilmentService:
        """The fulfilment service's client, one pooled session per process."""
        service: FulfilmentService = self._lazy["fulfilment"].get()
        return service

    def message_sender(self) -> MessageSender:
        """The Service Bus sender, connected on first send."""
        sender: MessageSender = self._lazy["sender"].get()
        return sender


def _cosmos_store(settings: Settings) -> DocumentStore:
    return CosmosStore.from_settings(settings)


def _http_fulfilment(settings: Settings) -> FulfilmentService:
    return HttpFulfilment(
        settings.need("fulfillment_url"),
        connect_timeout=settings.fulfillment_connect_timeout_seconds,
        read_timeout=settings.fulfillment_read_timeout_seconds,
    )


def _servicebus_sender(settings: Settings) -> MessageSender:
    return ServiceBusSender(make_client(settings))


_lock = threading.Lock()
_current: Services | None = None


def services() -> Services:
    """The process's services: built from the environment's settings on first call, then reused."""
    global _current  # noqa: PLW0603 - the one process-wide root, set once
    with _lock:
        if _current is None:
            _current = Services(Settings.from_env())
        return _current


@contextmanager
def use(replacement: Services) -> Iterator[Services]:
    """Run the app on ``replacement`` inside the block, then restore what was there before."""
    global _current  # noqa: PLW0603
    with _lock:
        previous, _current = _current, replacement
    try:
        yield replacement
    finally:
        with _lock:
            _current = previous
