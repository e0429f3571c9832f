"""A consumer's partition key field, at the codec edge.

The library's records (``records``) hold their partition key under one JSON field, ``PARTITION_FIELD``
(``orderId``: the order app's container is partitioned by ``/orderId``, and its documents must stay byte for
byte what they are). A consumer whose container is partitioned by another path (``/accountId``) hands its
store through ``repartitioned``: each of the library's records going in is written with its partition key
under the consumer's field instead, in the same place among its fields, and each coming out is read back
under ``PARTITION_FIELD``. The consumer's own documents pass as they are: they carry its field already.

A record is told by its ``type`` (``RECORD_TYPES``): those values are the library's, and a consumer's own
documents must not use them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from idempotent_consumer.ports.store import MAX_PAGE_ITEMS, BatchOperation, Create, Document, DocumentStore, Replace
from idempotent_consumer.records import PARTITION_FIELD, RECORD_TYPES, TYPE_FIELD


def _renamed(document: Mapping[str, Any], old: str, new: str) -> dict[str, Any]:
    """The document with field ``old`` named ``new``, in the same place among its fields."""
    return {(new if name == old else name): value for name, value in document.items()}


def as_record(document: Mapping[str, Any], field: str) -> dict[str, Any]:
    """A raw document of a container partitioned by ``/{field}`` (from its change feed, say) as the library reads
    its records: a record's partition key under ``PARTITION_FIELD``; any other document as it is."""
    if field != PARTITION_FIELD and document.get(TYPE_FIELD) in RECORD_TYPES and field in document:
        return _renamed(document, field, PARTITION_FIELD)
    return dict(document)


class _Repartitioned:
    """A store whose records are written with their partition key under ``field``, and read back under
    ``PARTITION_FIELD``."""

    def __init__(self, store: DocumentStore, field: str) -> None:
        self._store, self._field = store, field

    def _out(self, document: Mapping[str, Any]) -> Document:
        if document.get(TYPE_FIELD) in RECORD_TYPES and PARTITION_FIELD in document:
            return _renamed(document, PARTITION_FIELD, self._field)
        return dict(document)

    def _in(self, document: Document) -> Document:
        return as_record(document, self._field)

    def _operation(self, operation: BatchOperation) -> BatchOperation:
        if isinstance(operation, Create | Replace):
            return replace(operation, document=self._out(operation.document))
        return operation  # a patch or a delete names no partition key field

    async def create(self, document: Document) -> Document:
        return self._in(await self._store.create(self._out(document)))

    async def read(self, doc_id: str, partition_key: str) -> Document:
        return self._in(await self._store.read(doc_id, partition_key))

    async def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                          before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
                          ) -> AsyncIterator[list[Document]]:
        conditions = _renamed(conditions, PARTITION_FIELD, self._field)
        async for page in self._store.query_pages(conditions, partition_key=partition_key, before=before,
                                                  page_size=page_size):
            yield [self._in(document) for document in page]

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        written = await self._store.execute_batch(partition_key, [self._operation(op) for op in operations])
        return [self._in(document) for document in written]


def repartitioned(store: DocumentStore, field: str) -> DocumentStore:
    """``store``, for a container partitioned by ``/{field}``: ``store`` itself when that is ``PARTITION_FIELD``."""
    return store if field == PARTITION_FIELD else _Repartitioned(store, field)
