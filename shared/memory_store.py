"""An in-memory DocumentStore for unit tests of the core; it passes the same contract suite as Cosmos."""

from __future__ import annotations

import copy
import threading
import time
import uuid

from shared.errors import AlreadyExists, NotFound, StoreError
from shared.store import Document


class InMemoryStore:
    """Documents keyed by (partition key, id), guarded by one lock; etags change on every write."""

    def __init__(self, partition_key_field: str = "orderId") -> None:
        self._field = partition_key_field
        self._documents: dict[tuple[str, str], Document] = {}
        self._lock = threading.Lock()
        self.requests = 0  # what a Cosmos request would be counted as; tests assert on it

    @property
    def partition_key_field(self) -> str:
        """The top-level field holding the partition key."""
        return self._field

    def create(self, document: Document) -> Document:
        """Create a document; raise AlreadyExists if its id is taken in its partition."""
        key = (self._partition_key_of(document), document["id"])
        with self._lock:
            self.requests += 1
            if key in self._documents:
                raise AlreadyExists(f"document {document['id']} already exists", status=409)
            stored = self._stamp(copy.deepcopy(document))
            self._documents[key] = stored
            return copy.deepcopy(stored)

    def read(self, doc_id: str, partition_key: str) -> Document:
        """Return a copy of the stored document or raise NotFound."""
        with self._lock:
            self.requests += 1
            stored = self._documents.get((partition_key, doc_id))
            if stored is None:
                raise NotFound(f"document {doc_id} not found", status=404)
            return copy.deepcopy(stored)

    def documents(self) -> list[Document]:
        """Every stored document, for assertions in tests."""
        with self._lock:
            return [copy.deepcopy(d) for d in self._documents.values()]

    def _partition_key_of(self, document: Document) -> str:
        value = document.get(self._field)
        if not isinstance(value, str):
            raise StoreError(f"document {document.get('id')} has no string {self._field}", status=400)
        return value

    @staticmethod
    def _stamp(document: Document) -> Document:
        document["_etag"] = f'"{uuid.uuid4()}"'
        document["_ts"] = int(time.time())
        return document
