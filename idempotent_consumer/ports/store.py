"""The document-store port: the few operations the idempotent core needs from Cosmos DB.

Adapters: ``idempotent_consumer.adapters.cosmos.CosmosStore`` (the real one) and
``idempotent_consumer.testing.memory.InMemoryStore`` (for unit tests and the simulator).
``tests/contract`` runs one suite against both, so they cannot drift. Each adapter renders conditions its
own way (Cosmos SQL, a Python predicate); failures come back as the library's error family, never as HTTP
statuses. Every operation is a coroutine, as the functions that use it are ``async def``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from idempotent_consumer.errors import BatchTooLarge, StoreError

Document = dict[str, Any]

# Cosmos DB's limits for one transactional batch. ``check_batch`` refuses a batch beyond them before anything
# is sent; the named writes (ordered/writes.py) plan their batches inside them, splitting what may be
# split and refusing what cannot fit with LimitExceeded.
MAX_BATCH_OPERATIONS = 100
MAX_BATCH_BYTES = 2 * 1024 * 1024
# An item is at most 2 MB of JSON, its id at most 255 characters (the local server checks both too).
MAX_ITEM_BYTES = 2 * 1024 * 1024
MAX_ID_CHARS = 255
BATCH_LIMIT = f"Cosmos DB's transactional batch: {MAX_BATCH_OPERATIONS} operations, {MAX_BATCH_BYTES} bytes"
ITEM_LIMIT = f"Cosmos DB's item: {MAX_ITEM_BYTES} bytes"
# What one operation adds to the batch's request beyond its document or fields: its type, id, partition key
# and condition, as the SDK encodes them. Counted generously, so that a batch this port takes is one Cosmos
# DB takes: 100 operations cost 50 KB of the 2 MB.
OPERATION_OVERHEAD_BYTES = 512
# "There's a limit of 10 patch operations that can be added in a single patch specification"
# (https://learn.microsoft.com/azure/cosmos-db/partial-document-update-faq); each set field is one.
MAX_PATCH_FIELDS = 10
# Cosmos DB answers a query a page at a time: at most the page size asked for (100 when none is), at most 4 MB,
# and sometimes fewer, even none, while more follow; the rest comes through the continuation token. A
# reader that stops at the first page sees part of the answer, so the port hands out pages, never a page
# for the whole (``query_all`` reads them all).
MAX_PAGE_ITEMS = 100
# How often a document may change between a read and the conditional write that follows it before the
# caller gives up; the delivery then ends transient and its redelivery starts again.
MAX_RACES = 5
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Absent:
    """The value a Patch condition gives a field that must not be in the document."""

    def __repr__(self) -> str:
        return "ABSENT"

    __str__ = __repr__


ABSENT = _Absent()


@dataclass(frozen=True)
class Create:
    """Create a document; fails with 409 if its id exists in the partition."""

    document: Document


@dataclass(frozen=True)
class Patch:
    """Set fields of a document, only if every ``condition`` holds and, with ``if_match``, its etag still
    equals it (else 412; 404 if absent). Every other field is kept as stored.

    A field is a top-level name, or a path into an object field (``payment/review``): as in Cosmos DB, the
    object it names a field of must be there (else 400, and nothing of the batch is written).

    A condition maps a field (or a path into an object field, ``claim/rev``) to the value it must equal, to a
    tuple of values it must be one of, or to ``ABSENT``: the field must not be in the document.
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
    """Refuse a batch that Cosmos DB would reject for its size, or for an item's, before anything is sent."""
    if not operations:
        raise BatchTooLarge("a transactional batch needs at least one operation", limit=BATCH_LIMIT, status=400)
    if len(operations) > MAX_BATCH_OPERATIONS:
        raise BatchTooLarge(f"batch of {len(operations)} operations exceeds the limit of {MAX_BATCH_OPERATIONS}",
                            limit=BATCH_LIMIT, status=400)
    size = 0
    for op in operations:
        size += (measured := operation_bytes(op))
        if isinstance(op, Create | Replace):
            _check_item(op.document, measured - OPERATION_OVERHEAD_BYTES)
        if isinstance(op, Patch):
            if len(op.set_fields) > MAX_PATCH_FIELDS:
                raise StoreError(f"patch of {op.doc_id} sets {len(op.set_fields)} fields; Cosmos DB takes at most"
                                 f" {MAX_PATCH_FIELDS} in one patch", status=400)
            for path in op.set_fields:
                for name in path.split("/"):
                    check_field(name)
            for path in op.condition:
                for name in path.split("/"):
                    check_field(name)
    if size > MAX_BATCH_BYTES:
        raise BatchTooLarge(f"batch of {size} bytes exceeds the limit of {MAX_BATCH_BYTES}", limit=BATCH_LIMIT,
                            status=413)


def check_item(document: Document) -> None:
    """Refuse a document that Cosmos DB would not store (over 2 MB, or an id over 255 characters)."""
    _check_item(document, len(msgspec.json.encode(document, enc_hook=str)))


def _check_item(document: Document, size: int) -> None:
    if size > MAX_ITEM_BYTES:
        raise BatchTooLarge(f"document {str(document.get('id'))[:64]} is {size} bytes; Cosmos DB stores an item of at"
                            f" most {MAX_ITEM_BYTES}", limit=ITEM_LIMIT, status=413)
    if len(str(document.get("id"))) > MAX_ID_CHARS:
        raise StoreError(f"an id of {len(str(document.get('id')))} characters; Cosmos DB takes at most {MAX_ID_CHARS}",
                         status=400)


def operation_bytes(op: BatchOperation) -> int:
    """What ``op`` costs of a batch's 2 MB: its document or fields as JSON, and its overhead."""
    # msgspec encodes about ten times faster than json.dumps; the size is what counts here, not the text.
    return len(msgspec.json.encode(_payload(op), enc_hook=str)) + OPERATION_OVERHEAD_BYTES


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

        Raise AlreadyExists if a document with the same id exists in its partition; never overwrite. Raise
        BatchTooLarge before sending anything when ``check_batch`` refuses it (larger than an item may be).
        Raise TransientStoreError when the outcome may change on retry.
        """
        ...

    async def read(self, doc_id: str, partition_key: str) -> Document:
        """Return the stored document. Raise NotFound if there is none, TransientStoreError to retry."""
        ...

    def query_pages(
        self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
        before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
    ) -> AsyncIterator[list[Document]]:
        """Every document whose fields equal ``conditions`` and, with ``before=(field, value)``, whose
        ``field`` is less than ``value``, in one partition or across all when ``partition_key`` is None: a
        page at a time, following the continuation until the last page. A page holds at most
        ``page_size`` documents and may hold fewer, even none, while more follow. Documents written or
        removed while the pages are read may or may not be seen; none that stays unchanged is missed or
        given twice. Raise TransientStoreError to retry.
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


async def query_all(store: DocumentStore, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                    before: tuple[str, Any] | None = None) -> list[Document]:
    """Every document a query finds, read through all its pages."""
    found: list[Document] = []
    async for page in store.query_pages(conditions, partition_key=partition_key, before=before):
        found += page
    return found
