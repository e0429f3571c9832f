"""The document-store port: the few operations the idempotent core needs from Cosmos DB.

Adapters: ``shared.cosmos_store.CosmosStore`` (the real one) and ``shared.memory_store.InMemoryStore``
(for unit tests of the core). ``tests/contract`` runs one suite against both, so they cannot drift.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.errors import BatchTooLarge, StoreError

Document = dict[str, Any]

# Cosmos DB's limits for one transactional batch; a batch beyond them is refused, never split,
# because splitting would break its atomicity.
MAX_BATCH_OPERATIONS = 100
MAX_BATCH_BYTES = 2 * 1024 * 1024
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Create:
    """Create a document; fails with 409 if its id exists in the partition."""

    document: Document


@dataclass(frozen=True)
class Patch:
    """Set top-level fields of a document, only if every ``condition`` holds (else 412; 404 if absent).

    A condition maps a field to the value it must equal, or to a tuple of values it must be one of.
    """

    doc_id: str
    set_fields: Mapping[str, Any]
    condition: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Replace:
    """Replace a whole document, only if its etag still equals ``if_match`` (else 412)."""

    document: Document
    if_match: str | None = None


BatchOperation = Create | Patch | Replace


def check_batch(operations: Sequence[BatchOperation]) -> None:
    """Refuse a batch that Cosmos DB would reject for its size, before anything is sent."""
    if not operations:
        raise BatchTooLarge("a transactional batch needs at least one operation", status=400)
    if len(operations) > MAX_BATCH_OPERATIONS:
        raise BatchTooLarge(
            f"batch of {len(operations)} operations exceeds the limit of {MAX_BATCH_OPERATIONS}", status=400
        )
    size = sum(len(json.dumps(_payload(op), default=str).encode("utf-8")) for op in operations)
    if size > MAX_BATCH_BYTES:
        raise BatchTooLarge(f"batch of {size} bytes exceeds the limit of {MAX_BATCH_BYTES}", status=413)
    for op in operations:
        if isinstance(op, Patch):
            for name in (*op.set_fields, *op.condition):
                _check_field(name)


def _payload(op: BatchOperation) -> Any:
    if isinstance(op, Patch):
        return [op.doc_id, dict(op.set_fields), dict(op.condition)]
    return op.document


def query_text(conditions: Mapping[str, Any], before: tuple[str, Any] | None) -> tuple[str, list[dict[str, Any]]]:
    """Render a store query as Cosmos DB SQL with parameters."""
    clauses, parameters = [], []
    for n, (name, value) in enumerate(conditions.items()):
        _check_field(name)
        clauses.append(f"c.{name} = @p{n}")
        parameters.append({"name": f"@p{n}", "value": value})
    if before is not None:
        _check_field(before[0])
        clauses.append(f"c.{before[0]} < @before")
        parameters.append({"name": "@before", "value": before[1]})
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    # Field names are checked against a plain-identifier pattern; values travel as parameters.
    return "SELECT * FROM c" + where, parameters  # noqa: S608


def _check_field(name: str) -> None:
    if not _FIELD.fullmatch(name):
        raise StoreError(f"field {name!r} is not a plain top-level name", status=400)


def condition_holds(document: Document, condition: Mapping[str, Any]) -> bool:
    """Evaluate a Patch condition against a document (the in-memory store's filter predicate)."""
    for name, expected in condition.items():
        actual = document.get(name)
        if isinstance(expected, tuple):
            if actual not in expected:
                return False
        elif actual != expected:
            return False
    return True


def filter_predicate(condition: Mapping[str, Any]) -> str:
    """Render a Patch condition as a Cosmos DB filter predicate, e.g. ``from c where c.version = 2``."""
    clauses = []
    for name, expected in condition.items():
        if isinstance(expected, tuple):
            values = ", ".join(json.dumps(v) for v in expected)
            clauses.append(f"c.{name} IN ({values})")
        else:
            clauses.append(f"c.{name} = {json.dumps(expected)}")
    return "from c where " + " AND ".join(clauses)


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

    def query(
        self, conditions: Mapping[str, Any], *, before: tuple[str, Any] | None = None, limit: int = 100
    ) -> list[Document]:
        """Up to ``limit`` documents, across partitions, whose fields equal ``conditions`` and, with
        ``before=(field, value)``, whose ``field`` is less than ``value``. Raise TransientStoreError to retry.
        """
        ...

    def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        """Apply the operations atomically, in order, in one partition; return the written documents.

        Raise BatchTooLarge before sending anything when ``check_batch`` refuses the batch. Raise
        BatchFailed(index, status) when one operation fails (409, 412, 404...): then nothing is written.
        Raise TransientStoreError when the whole batch may succeed on retry.
        """
        ...
