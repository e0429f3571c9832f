"""Process-wide clients and settings, made lazily on first use and then reused.

Nothing here connects at import time: under Azure Functions, import happens while the host indexes
the functions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from shared.cosmos_store import CosmosStore
from shared.settings import CosmosSettings, EventSettings
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


_order_store: _Lazy[DocumentStore] = _Lazy(lambda: CosmosStore.from_settings(CosmosSettings.from_env()))
_event_settings: _Lazy[EventSettings] = _Lazy(EventSettings.from_env)


def order_store() -> DocumentStore:
    """The orders container's store (orders and their events share it), created once per process."""
    return _order_store.get()


def event_settings() -> EventSettings:
    """The event consumer's settings, read and checked once per process."""
    return _event_settings.get()


def reset() -> None:
    """Forget the process's clients and settings, so that tests can point the app elsewhere."""
    _order_store.reset()
    _event_settings.reset()
