"""The composition root: builds the process's services from settings, lazily and once.

The Functions blueprints call ``services()`` on each invocation; nothing connects at import time,
because under Azure Functions import happens while the host indexes the functions. Tests and the
simulator build a ``Services`` of their own (in-memory store, recording sender, fakes) and hand it
over with ``use(...)``, so no test reaches into a module's globals.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from shared.adapters.cosmos import CosmosStore
from shared.adapters.http import HttpFulfilment
from shared.adapters.servicebus import ServiceBusSender, make_client
from shared.ports.fulfilment import FulfilmentService
from shared.ports.sender import MessageSender
from shared.ports.store import DocumentStore
from shared.settings import Settings


@dataclass
class Services:
    """What the handlers need. Each client is built on first use from ``settings``, or given up front."""

    settings: Settings
    store: DocumentStore | None = None
    fulfilment: FulfilmentService | None = None
    sender: MessageSender | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def order_store(self) -> DocumentStore:
        """The orders container's store (orders and their events share it)."""
        with self._lock:
            self.store = self.store or CosmosStore.from_settings(self.settings)
            return self.store

    def fulfilment_service(self) -> FulfilmentService:
        """The fulfilment service's client, one pooled session per process."""
        with self._lock:
            settings = self.settings
            self.fulfilment = self.fulfilment or HttpFulfilment(
                settings.need("fulfillment_url"), connect_timeout=settings.fulfillment_connect_timeout_seconds,
                read_timeout=settings.fulfillment_read_timeout_seconds,
                proxy_from_environment=settings.http_proxy_from_environment,
            )
            return self.fulfilment

    def message_sender(self) -> MessageSender:
        """The Service Bus sender, connected on first send."""
        with self._lock:
            self.sender = self.sender or ServiceBusSender(make_client(self.settings))
            return self.sender


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
