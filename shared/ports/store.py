"""The document-store port: the few operations the idempotent core needs from Cosmos DB.

Adapters: ``shared.adapters.cosmos.CosmosStore`` (the real one) and ``shared.adapters.memory.InMemoryStore``
(for unit tests and the simulator). ``tests/contract`` runs one suite against both, so they cannot drift.
Each adapter renders conditions its own way (Cosmos SQL, a Python predicate); failures come back as
the shared error family, never as HTTP statuses. Every operation is a coroutine, as the functions that
use it are ``async def``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from shared.errors import BatchTooLarge, StoreError

Document = dict[str, Any]

# Cosmos DB's limits for one transactional batch; a batch beyond them is refused, never split,
# because splitting would break its atomicity.
MAX_BATCH_OPERATIONS = 100
MAX_BATCH_BYTES = 2 * 1024 * 1024
# "There's a limit of 10 patch operations that can be added in a single patch specification"
# (https://learn.microsoft.com/azure/cosmos-db/partial-document-update-faq); each set field is one.
MAX_PATCH_FIELDS = 10
# How often a document may change between a read and the conditional write that follows it before the
# caller gives up; the delivery then ends transient and its redelivery starts again.
MAX_RACES = 5
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Create:
    """Create a document; fails with 409 if its id exists in the partition."""

    document: Document


@dataclass(frozen=True)
class Patch:
    """Set top-level fields of a document, only if every ``condition`` holds and, with ``if_match``, its
    etag still equals it (else 412; 404 if absent). Every other field is kept as stored.

    A condition maps a field to the value it must equal, or to a tuple of values it must be one of.
    At most MAX_PATCH_FIELDS fields are set by one patch.

    With ``etag_only``, the caller needs nothing back but the document's new etag: the batch returns
    ``{"id", "_etag"}`` for this operation. A batch of this patch alone is then one point patch that asks
    for no body (Cosmos DB's ``Prefer: return=minimal``): the same request on the wire, and no document
    for the client to parse.
    """

    doc_id: str
    set_fields: Mapping[str, Any]
    condition: Mapping[str, Any] = field(default_factory=dict)
    if_match: str | None = None
    etag_only: bool = False


@dataclass(frozen=True)
class Replace:
    """Replace a whole document, only if its etag still equals ``if_match`` (else 412)."""

    document: Document
    if_match: str | None = None


@dataclass(frozen=True)
class Delete:
    """Delete a document, only if its etag still equals ``if_match`` (else 412; 404 if absent)."""

    doc_id: str
    if_match: str | None = None


BatchOperation = Create | Patch | Replace | Delete


def check_batch(operations: Sequence[BatchOperation]) -> None:
    """Refuse a batch that Cosmos DB would reject for its size, before anything is sent."""
    if not operations:
        raise BatchTooLarge("a transactional batch needs at least one operation", status=400)
    if len(operations) > MAX_BATCH_OPERATIONS:
        raise BatchTooLarge(
            f"batch of {len(operations)} operations exceeds the limit of {MAX_BATCH_OPERATIONS}", status=400
        )
    # msgspec encodes about ten times faster than json.dumps; the size is what counts here, not the text.
    size = sum(len(msgspec.json.encode(_payload(op), enc_hook=str)) for op in operations)
    if size > MAX_BATCH_BYTES:
        raise BatchTooLarge(f"batch of {size} bytes exceeds the limit of {MAX_BATCH_BYTES}", status=413)
    for op in operations:
        if isinstance(op, Patch):
            if len(op.set_fields) > MAX_PATCH_FIELDS:
                raise StoreError(f"patch of {op.doc_id} sets {len(op.set_fields)} fields; Cosmos DB takes at most"
                                 f" {MAX_PATCH_FIELDS} in one patch", status=400)
            for name in (*op.set_fields, *op.condition):
                check_field(name)


def batch_result(op: BatchOperation, written: Document) -> Document:
    """What a batch returns for ``op``: the document written, or its id and etag alone for an
    ``etag_only`` patch."""
    if isinstance(op, Patch) and op.etag_only:
        return {"id": written["id"], "_etag": written["_etag"]}
    return written


def _payload(op: BatchOperation) -> Any:
    if isinstance(op, Patch):
        return [op.doc_id, dict(op.set_fields), dict(op.condition), op.if_match]
    if isinstance(op, Delete):
        return op.doc_id
    return op.document


def check_field(name: str) -> None:
    """Refuse a field name that is not a plain top-level identifier (conditions, patches, queries)."""
    if not _is_plain(name):
        raise StoreError(f"field {name!r} is not a plain top-level name", status=400)


@functools.lru_cache(maxsize=1024)
def _is_plain(name: str) -> bool:
    # The names come from the code, a few dozen: cached, a patch's check costs no regex per field.
    return _FIELD.fullmatch(name) is not None


class DocumentStore(Protocol):
    """A container of JSON documents, partitioned by their top-level ``orderId``."""

    async def create(self, document: Document) -> Document:
        """Create ``document`` and return it as stored (with ``_etag``).

        Raise AlreadyExists if a document with the same id exists in its partition; never overwrite.
        Raise TransientStoreError when the outcome may change on retry.
        """
        ...

    async def read(self, doc_id: str, partition_key: str) -> Document:
        """Return the stored document. Raise NotFound if there is none, TransientStoreError to retry."""
        ...

    async def query(
        self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
        before: tuple[str, Any] | None = None, limit: int = 100,
    ) -> list[Document]:
        """Up to ``limit`` documents whose fields equal ``conditions`` and, with ``before=(field, value)``,
        whose ``field`` is less than ``value``: in one partition, or across all when ``partition_key`` is
        None. Raise TransientStoreError to retry.
        """
        ...

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        """Apply the operations atomically, in order, in one partition; return the written documents.

        Raise BatchTooLarge before sending anything when ``check_batch`` refuses the batch. Raise
        BatchFailed(index, error) when one operation fails, with ``error`` an AlreadyExists (create),
        PreconditionFailed (etag or condition), NotFound (patch or replace of a missing document) or
        StoreError: then nothing is written. Raise TransientStoreError when the whole batch may succeed
        on retry.
        """
        ...
