"""Process-wide clients, made lazily on first use and then reused; nothing connects at import time."""

from __future__ import annotations

import threading

from shared.cosmos_store import CosmosStore
from shared.settings import CosmosSettings
from shared.store import DocumentStore

_lock = threading.Lock()
_order_store: DocumentStore | None = None


def order_store() -> DocumentStore:
    """The orders container's store, created once per process from the environment's settings."""
    global _order_store  # noqa: PLW0603 - a once-per-process client is the point
    if _order_store is None:
        with _lock:
            if _order_store is None:
                _order_store = CosmosStore.from_settings(CosmosSettings.from_env())
    return _order_store


def reset() -> None:
    """Forget the process's clients, so that tests can point the app at another endpoint."""
    global _order_store  # noqa: PLW0603
    with _lock:
        _order_store = None
