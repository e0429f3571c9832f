"""Ports watched for the breaker: what one delivery attempt reached of its dependencies.

``attempt()`` opens a ``Reach`` for one attempt, in its own task's (or greenlet's) context; the handlers'
store and fulfilment service, wrapped by ``watched_store`` and ``watched_fulfilment``, note in it each
dependency that answered (whatever it answered: a 409 is Cosmos DB up) and each that was down
(unreachable, 5xx, 429, a transient store error). The breaker (``idempotent_consumer.breaker``) closes only on a probe
that reached each dependency found down.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from idempotent_consumer.errors import BatchFailed, ConfigurationError, TransientStoreError
from idempotent_consumer.ports.store import MAX_PAGE_ITEMS, BatchOperation, Document, DocumentStore

STORE = "store"


@dataclass
class Reach:
    """What one attempt showed of its dependencies: those that answered, and those that were down."""

    answered: set[str] = field(default_factory=set)
    down: set[str] = field(default_factory=set)


_reach: ContextVar[Reach | None] = ContextVar("reach", default=None)


@contextlib.contextmanager
def attempt() -> Iterator[Reach]:
    """Note, for the attempt run inside, which dependencies answered and which were down (its own task's or
    greenlet's context: attempts running side by side each keep their own)."""
    reach = Reach()
    token = _reach.set(reach)
    try:
        yield reach
    finally:
        _reach.reset(token)


def note(dependency: str, *, up: bool) -> None:
    """Note in the current attempt's ``Reach`` that ``dependency`` answered (``up``) or was down."""
    reach = _reach.get()
    if reach is not None:
        (reach.answered if up else reach.down).add(dependency)


class _WatchedStore:
    """A store that notes, in the current attempt's ``Reach``, whether Cosmos DB answered or was down."""

    def __init__(self, store: DocumentStore) -> None:
        self._store = store

    @contextlib.contextmanager
    def _watch(self) -> Iterator[None]:
        try:
            yield
        except TransientStoreError:
            note(STORE, up=False)
            raise
        except BatchFailed as exc:
            note(STORE, up=not isinstance(exc.error, TransientStoreError))
            raise
        except ConfigurationError:
            raise  # the store was never asked: the app's own setting (its identity) is wrong
        except Exception:
            note(STORE, up=True)  # an answer: not found, taken, changed
            raise
        note(STORE, up=True)

    async def create(self, document: Document) -> Document:
        with self._watch():
            return await self._store.create(document)

    async def read(self, doc_id: str, partition_key: str) -> Document:
        with self._watch():
            return await self._store.read(doc_id, partition_key)

    async def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                          before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
                          ) -> AsyncIterator[list[Document]]:
        with self._watch():
            async for page in self._store.query_pages(conditions, partition_key=partition_key, before=before,
                                                      page_size=page_size):
                yield page

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        with self._watch():
            return await self._store.execute_batch(partition_key, operations)


def watched_store(store: DocumentStore) -> DocumentStore:
    """``store``, noting what it answered in the current attempt's ``Reach``."""
    return _WatchedStore(store)
