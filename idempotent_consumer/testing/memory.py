"""In-memory fakes of the library's ports, for a consumer's tests: the store and the sender.

Each passes the same contract suite as its real adapter (``tests/contract``), so a test or the
simulator that runs on them runs on the real thing's behaviour.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from idempotent_consumer.errors import (
    AlreadyExists,
    BatchFailed,
    NotFound,
    PreconditionFailed,
    PublishError,
    StoreError,
)
from idempotent_consumer.ports.sender import OutgoingMessage
from idempotent_consumer.ports.store import (
    ABSENT,
    MAX_PAGE_ITEMS,
    BatchOperation,
    Create,
    Delete,
    Document,
    Patch,
    batch_result,
    check_batch,
    check_field,
    check_item,
)
from idempotent_consumer.records import PARTITION_FIELD

_Partition = dict[str, Document]  # one partition's documents by id
_Json = TypeVar("_Json")


class InMemoryStore:
    """Documents by partition key, then id, guarded by one lock; etags change on every write.

    TTL follows Cosmos DB: with ``default_ttl`` None, expiry is off; -1 turns it on without a
    default, and a document's own ``ttl`` (seconds, -1 = never) then applies. A query page holds at most
    ``page_items`` documents, whatever page size is asked for, as Cosmos DB's pages are bounded too; with
    ``empty_first_page``, every query answers an empty page first, as Cosmos DB may while more follow (across
    partition ranges). The simulator sets both, so that its readers cross pages.
    """

    def __init__(self, *, default_ttl: int | None = None, clock: Callable[[], float] = time.time,
                 page_items: int = MAX_PAGE_ITEMS, empty_first_page: bool = False,
                 partition_field: str = PARTITION_FIELD) -> None:
        self._partition_field = partition_field  # the container's partition key path, without its slash
        self._default_ttl = default_ttl
        self._page_items = page_items
        self._empty_first_page = empty_first_page
        self._clock = clock
        self._documents: dict[str, _Partition] = {}  # a query in one partition reads that partition alone
        self._lock = threading.Lock()
        self.requests = 0  # what a Cosmos request would be counted as; tests assert on it

    async def create(self, document: Document) -> Document:
        """Create a document; raise AlreadyExists if its id is taken in its partition, BatchTooLarge (before
        anything is written) if it is larger than an item may be."""
        check_item(document)
        with self._lock:
            self.requests += 1
            partition = self._documents.setdefault(self._partition_key_of(document), {})
            return _json_copy(self._create(partition, document))

    async def read(self, doc_id: str, partition_key: str) -> Document:
        """Return a copy of the stored document or raise NotFound."""
        with self._lock:
            self.requests += 1
            return _json_copy(self._get(self._documents.get(partition_key, {}), doc_id))

    async def query_pages(
        self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
        before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
    ) -> AsyncIterator[list[Document]]:
        """Live documents matching every condition (and below ``before``), in one partition or across all, in
        pages of at most ``page_size`` and of this store's ``page_items``. Each page is read when it is asked
        for, after the position where the last one ended (its last document's partition and id), as Cosmos
        DB's continuation resumes: what changed in between is seen as it is then."""
        for name in (*conditions, *([before[0]] if before else [])):
            check_field(name)
        size, after = max(1, min(page_size, self._page_items)), ("", "")
        if self._empty_first_page:
            with self._lock:
                self.requests += 1
            yield []
        while True:
            with self._lock:
                self.requests += 1
                within = ([self._documents.get(partition_key, {})] if partition_key is not None
                          else list(self._documents.values()))
                found = sorted(  # the cheap tests first: a simulation runs thousands of queries
                    (position, d) for partition in within for d in partition.values()
                    if all(d.get(k) == v for k, v in conditions.items())
                    and (before is None or _less(d.get(before[0]), before[1]))
                    and (position := _position(d, self._partition_field)) > after and not self._expired(d))
                page = [_json_copy(d) for _, d in found[:size]]
            yield page
            if len(found) <= size:
                return
            after = found[size - 1][0]

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        """Apply all operations to a copy, and keep the copy only if every one succeeded."""
        check_batch(operations)
        with self._lock:
            self.requests += 1
            working = dict(self._documents.get(partition_key, {}))  # a batch is in one partition
            results = []
            for index, op in enumerate(operations):
                try:
                    results.append(batch_result(op, self._apply(working, partition_key, op)))
                except StoreError as exc:
                    raise BatchFailed(index, exc) from exc
            self._documents[partition_key] = working
            return _json_copy(results)

    def documents(self) -> list[Document]:
        """Every live stored document, for assertions in tests."""
        with self._lock:
            return [_json_copy(d) for partition in self._documents.values() for d in partition.values()
                    if not self._expired(d)]

    def _apply(self, docs: _Partition, partition_key: str, op: BatchOperation) -> Document:
        if isinstance(op, Create):
            self._require_partition(op.document, partition_key)
            return self._create(docs, op.document)
        if isinstance(op, Patch):
            current = self._get(docs, op.doc_id)
            if op.if_match is not None and current["_etag"] != op.if_match:
                raise PreconditionFailed(f"etag of {op.doc_id} changed", status=412)
            if not _condition_holds(current, op.condition):
                raise PreconditionFailed(f"condition on {op.doc_id} does not hold", status=412)
            # Stored documents are never changed in place, so the new version may share the fields it keeps.
            patched = self._stamp(_set_paths(current, _json_copy(dict(op.set_fields)), op.doc_id))
            docs[op.doc_id] = patched
            return patched
        if isinstance(op, Delete):
            current = self._get(docs, op.doc_id)
            if op.if_match is not None and current["_etag"] != op.if_match:
                raise PreconditionFailed(f"etag of {op.doc_id} changed", status=412)
            del docs[op.doc_id]
            return {}
        self._require_partition(op.document, partition_key)
        current = self._get(docs, op.document["id"])
        if op.if_match is not None and current["_etag"] != op.if_match:
            raise PreconditionFailed(f"etag of {op.document['id']} changed", status=412)
        replaced = self._stamp(_json_copy(op.document))
        docs[op.document["id"]] = replaced
        return replaced

    def _create(self, docs: _Partition, document: Document) -> Document:
        """Create ``document`` in ``docs``, the partition it names (the caller's to check)."""
        key = document["id"]
        existing = docs.get(key)
        if existing is not None and not self._expired(existing):
            raise AlreadyExists(f"document {document['id']} already exists", status=409)
        stored = self._stamp(_json_copy(document))
        docs[key] = stored
        return stored

    def _get(self, docs: _Partition, doc_id: str) -> Document:
        stored = docs.get(doc_id)
        if stored is None or self._expired(stored):
            raise NotFound(f"document {doc_id} not found", status=404)
        return stored

    def _expired(self, document: Document) -> bool:
        if self._default_ttl is None:
            return False
        ttl = document.get("ttl", self._default_ttl)
        if not isinstance(ttl, int) or ttl == -1:
            return False
        return bool(document["_ts"] + ttl <= self._clock())

    def _require_partition(self, document: Document, partition_key: str) -> None:
        if self._partition_key_of(document) != partition_key:
            raise StoreError(f"document {document.get('id')} is not in partition {partition_key}", status=400)

    def _partition_key_of(self, document: Document) -> str:
        if not isinstance(value := document.get(self._partition_field), str):
            raise StoreError(f"document {document.get('id')} has no string {self._partition_field}", status=400)
        return value

    def _stamp(self, document: Document) -> Document:
        document["_etag"] = f'"{uuid.uuid4()}"'
        document["_ts"] = int(self._clock())
        return document


def _set_paths(document: Document, fields: Mapping[str, Any], doc_id: str) -> Document:
    """The document with ``fields`` set: a top-level name, or a path into an object that must be there (Cosmos
    DB answers 400 for one whose parent is missing). The objects on a path are copied, never changed in place."""
    result = dict(document)
    for path, value in fields.items():
        *parents, last = path.split("/")
        target = result
        for name in parents:
            child = target.get(name)
            if not isinstance(child, dict):
                raise StoreError(f"patch of {doc_id}: no object at /{'/'.join(parents)} to set /{path} in", status=400)
            target[name] = target = dict(child)
        target[last] = value
    return result


def _condition_holds(document: Document, condition: Mapping[str, Any]) -> bool:
    """A Patch condition as a predicate: each field equals its value, is one of a tuple of values, or (ABSENT) is
    not there."""
    for path, expected in condition.items():
        *parents, name = path.split("/")
        within: Any = document
        for parent in parents:
            within = within.get(parent) if isinstance(within, dict) else None
        if not isinstance(within, dict):  # no object on the path: its field is not there
            within = {}
        if expected is ABSENT:
            if name in within:
                return False
            continue
        actual = within.get(name)
        if actual not in expected if isinstance(expected, tuple) else actual != expected:
            return False
    return True


def _json_copy(value: _Json) -> _Json:
    """A copy of a JSON value, as Cosmos DB would hand it back: through JSON (tuples become lists), and about
    five times faster than ``copy.deepcopy`` for the large orders the simulator writes."""
    copied: _Json = msgspec.json.decode(msgspec.json.encode(value), type=type(value))
    return copied


def _position(document: Document, partition_field: str) -> tuple[str, str]:
    """Where a document stands in a query's pages: by partition, then id."""
    return str(document.get(partition_field)), str(document.get("id"))


def _less(value: Any, bound: Any) -> bool:
    try:
        return bool(value is not None and value < bound)
    except TypeError:  # Cosmos compares across types without error and finds no match
        return False


class RecordingSender:
    """A sender that records what it was asked to send and what the destination would keep.

    ``sent`` is every message sent; ``delivered`` drops a MessageId already sent to the same
    destination within ``detection_window_seconds``, as Service Bus duplicate detection does
    (the window counts from the first send and does not slide). A message with a scheduled enqueue time
    waits in ``scheduled`` until ``release_due`` (called on every send) finds it due. With
    ``destinations``, a send anywhere else raises PublishError, as a missing queue does.
    """

    def __init__(
        self, *, detection_window_seconds: float = 600, clock: Callable[[], float] = time.time,
        destinations: Collection[str] | None = None,
    ) -> None:
        self._destinations = destinations
        self._lock = threading.Lock()
        self._window = detection_window_seconds
        self._clock = clock
        self._first_sent: dict[tuple[str, str], float] = {}
        self.sent: list[tuple[str, OutgoingMessage]] = []
        self.delivered: list[tuple[str, OutgoingMessage]] = []
        self.scheduled: list[tuple[str, OutgoingMessage]] = []

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Record the messages; keep as delivered (or scheduled) those the destination's duplicate detection
        would."""
        if self._destinations is not None and destination not in self._destinations:
            raise PublishError(f"send to {destination} failed: no such queue or topic")
        with self._lock:
            now = self._clock()
            for message in messages:
                self.sent.append((destination, message))
                key = (destination, message.message_id)
                first = self._first_sent.get(key)
                if first is None or now - first >= self._window:
                    self._first_sent[key] = now
                    self.scheduled.append((destination, message))
        self.release_due()

    def release_due(self) -> None:
        """Move the scheduled messages now due into ``delivered``, in the order they were sent."""
        with self._lock:
            now = self._clock()
            due = [(d, m) for d, m in self.scheduled
                   if m.scheduled_enqueue_time is None or m.scheduled_enqueue_time.timestamp() <= now]
            self.scheduled = [item for item in self.scheduled if item not in due]
            self.delivered.extend(due)
