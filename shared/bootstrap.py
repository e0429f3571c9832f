"""The composition root: builds the process's services from settings, lazily and once.

The Functions blueprints call ``services()`` on each invocation; nothing connects at import time,
because under Azure Functions import happens while the host indexes the functions. Tests and the
simulator build a ``Services`` of their own (in-memory store, recording sender, fakes) and hand it
over with ``use(...)``, so no test reaches into a module's globals.

The clients are async (``azure.cosmos.aio``, aiohttp, ``azure.servicebus.aio``): each is bound to
the event loop it first runs in, which under Functions is the worker's one loop for every
invocation. ``aclose`` closes the clients a ``Services`` made itself. Their modules (aiohttp above
all) are imported on first use, not when the host indexes the functions: the first invocation pays
for them (README "Performance", cold start).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shared.ports.fulfilment import FulfilmentService
from shared.ports.sender import MessageSender
from shared.ports.store import DocumentStore
from shared.settings import Settings

_Client = TypeVar("_Client")


@dataclass
class Services:
    """What the handlers need. Each client is built on first use from ``settings``, or given up front."""

    settings: Settings
    store: DocumentStore | None = None
    fulfilment: FulfilmentService | None = None
    sender: MessageSender | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _made: list[Any] = field(default_factory=list, repr=False)

    def order_store(self) -> DocumentStore:
        """The orders container's store (orders and their events share it)."""
        with self._lock:
            if self.store is None:
                from shared.adapters.cosmos import CosmosStore  # noqa: PLC0415 - on first use, see above

                self.store = self._keep(CosmosStore.from_settings(self.settings))
            return self.store

    def fulfilment_service(self) -> FulfilmentService:
        """The fulfilment service's client, one pooled session per process."""
        with self._lock:
            settings = self.settings
            if self.fulfilment is None:
                from shared.adapters.http import HttpFulfilment  # noqa: PLC0415

                self.fulfilment = self._keep(HttpFulfilment(
                    settings.need("fulfillment_url"), connect_timeout=settings.fulfillment_connect_timeout_seconds,
                    read_timeout=settings.fulfillment_read_timeout_seconds,
                    proxy_from_environment=settings.http_proxy_from_environment,
                ))
            return self.fulfilment

    def message_sender(self) -> MessageSender:
        """The Service Bus sender, connected on first send."""
        with self._lock:
            if self.sender is None:
                from shared.adapters.servicebus import ServiceBusSender  # noqa: PLC0415

                self.sender = self._keep(ServiceBusSender.from_settings(self.settings))
            return self.sender

    async def aclose(self) -> None:
        """Close the clients this ``Services`` made, in the loop they ran in; clients handed in stay open."""
        with self._lock:
            made, self._made = self._made, []
        for client in made:
            await client.close()

    def _keep(self, client: _Client) -> _Client:
        self._made.append(client)
        return client


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
