"""The document-store port: the few operations the idempotent core needs from Cosmos DB.

Adapters: ``shared.cosmos_store.CosmosStore`` (the real one) and ``shared.memory_store.InMemoryStore``
(for unit tests of the core). ``tests/contract`` runs one suite against both, so they cannot drift.
"""

from __future__ import annotations

from typing import Any, Protocol

Document = dict[str, Any]


class DocumentStore(Protocol):
    """A container of JSON documents, partitioned by one top-level field."""

    @property
    def partition_key_field(self) -> str:
        """The top-level field whose value is a document's partition key, e.g. ``orderId``."""
        ...

    def create(self, document: Document) -> Document:
        """Create ``document`` and return it as stored (with ``_etag``).

        Raise AlreadyExists if a document with the same id exists in its partition; never overwrite.
        Raise TransientStoreError when the outcome may change on retry.
        """
        ...

    def read(self, doc_id: str, partition_key: str) -> Document:
        """Return the stored document. Raise NotFound if there is none, TransientStoreError to retry."""
        ...
