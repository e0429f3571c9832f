"""The ports as the handlers see them in a run: every call is a step where the scheduler may interleave or fault.

Behind each proxy is the shipped in-memory fake, which passes the same contract suite as the real
adapter. The store proxy also keeps the history of what was written, which serves as the change
feed of the outbox publisher and as evidence for the invariants.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from shared.adapters.memory import InMemoryFulfilment, InMemoryStore, RecordingSender
from shared.domain.documents import EventRecord, OrderDocument, OutboxEntry
from shared.errors import DownstreamUnavailable, PublishError, TransientStoreError
from shared.ports.fulfilment import Reply
from shared.ports.sender import OutgoingMessage
from shared.ports.store import BatchOperation, Create, Delete, Document, Patch
from simulation.faults import Chaos

RECORD_KINDS = frozenset(str(kind.__struct_config__.tag) for kind in EventRecord.__subclasses__())
_Key = tuple[str, str]


class History:
    """Every successful write, as the order of versions, of applied events and of changed outbox entries."""

    def __init__(self, on_outbox_change: Callable[[], None]) -> None:
        self.order_versions: defaultdict[str, list[int]] = defaultdict(list)
        self.applied: defaultdict[str, list[int]] = defaultdict(list)  # order id -> sequences, as recorded
        self.records_created: Counter[str] = Counter()  # event id -> event records created
        self.outbox_changes: dict[_Key, None] = {}  # the change feed's backlog, in order, without repeats
        self._on_outbox_change = on_outbox_change

    def wrote(self, operations: Sequence[BatchOperation], results: Sequence[Document]) -> None:
        """Note the documents one successful call wrote (results line up with operations)."""
        for operation, document in zip(operations, results, strict=True):
            kind = document.get("type")
            if kind is None:  # a delete: the change feed does not show deletes
                continue
            if OrderDocument.is_kind(document):
                self.order_versions[document["orderId"]].append(document["version"])
            elif kind in RECORD_KINDS and isinstance(operation, Create):
                self.applied[document["orderId"]].append(document["sequence"])
                self.records_created[document["eventId"]] += 1
            elif OutboxEntry.is_kind(document):
                self.outbox_changes[(document["orderId"], document["id"])] = None
                self._on_outbox_change()

    def take_outbox_changes(self) -> list[_Key]:
        """The outbox entries changed since the last take, oldest first: one change-feed batch."""
        taken = list(self.outbox_changes)
        self.outbox_changes.clear()
        return taken


def _kind(document: Document) -> str:
    return str(document.get("type", "?"))


def _operations(operations: Sequence[BatchOperation]) -> str:
    """A batch as the trace shows it: each operation's verb and document kind."""
    named = []
    for operation in operations:
        if isinstance(operation, Patch | Delete):
            named.append(f"{type(operation).__name__.lower()} {operation.doc_id[:12]}")
        else:
            named.append(f"{type(operation).__name__.lower()} {_kind(operation.document)}")
    return ", ".join(named)


def _store_unavailable(text: str) -> NoReturn:
    raise TransientStoreError(f"injected: {text}", status=503)


def _store_timeout(text: str) -> TransientStoreError:
    return TransientStoreError(f"injected: {text}", status=408)


class FaultyStore:
    """The document store under chaos; transient failures are TransientStoreError, as the Cosmos adapter maps them."""

    def __init__(self, store: InMemoryStore, chaos: Chaos, history: History) -> None:
        self._store = store
        self._chaos = chaos
        self._history = history

    async def create(self, document: Document) -> Document:
        """Create, as the store does; see DocumentStore."""
        call = f"store.create {_kind(document)}" if self._chaos.tracing else "store.create"
        return await self._chaos.through(call, lambda: self._create(document),
                                   refuse=_store_unavailable, lose=_store_timeout)

    async def read(self, doc_id: str, partition_key: str) -> Document:
        """Read, as the store does; see DocumentStore."""
        call = f"store.read {doc_id[:24]}" if self._chaos.tracing else "store.read"
        return await self._chaos.through(call, lambda: self._store.read(doc_id, partition_key),
                                   refuse=_store_unavailable, lose=_store_timeout)

    async def query(
        self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
        before: tuple[str, Any] | None = None, limit: int = 100,
    ) -> list[Document]:
        """Query, as the store does; see DocumentStore."""
        return await self._chaos.through(
            "store.query", lambda: self._store.query(conditions, partition_key=partition_key, before=before,
                                                     limit=limit),
            refuse=_store_unavailable, lose=_store_timeout)

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        """Execute a transactional batch, as the store does; see DocumentStore."""
        call = f"store.batch {partition_key[:12]} [{_operations(operations)}]" if self._chaos.tracing else "store.batch"
        return await self._chaos.through(call, lambda: self._batch(partition_key, operations),
                                   refuse=_store_unavailable, lose=_store_timeout)

    async def _create(self, document: Document) -> Document:
        written = await self._store.create(document)
        self._history.wrote([Create(document)], [written])
        return written

    async def _batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        written = await self._store.execute_batch(partition_key, operations)
        self._history.wrote(operations, written)
        return written


class FaultyFulfilment:
    """The fulfilment service under chaos: unreachable (DownstreamUnavailable) or 503 before, a timeout after."""

    def __init__(self, fulfilment: InMemoryFulfilment, chaos: Chaos) -> None:
        self._fulfilment = fulfilment
        self._chaos = chaos

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Reserve, as the service does; see FulfilmentService."""
        return await self._chaos.through(
            "fulfilment.reserve", lambda: self._fulfilment.reserve(idempotency_key, request),
            refuse=self._refuse, lose=DownstreamUnavailable)

    def _refuse(self, text: str) -> Reply:
        if self._chaos.coin():
            raise DownstreamUnavailable(f"injected: {text}")
        return Reply(503, {})


def _publish_refused(text: str) -> NoReturn:
    raise PublishError(f"injected: {text}")


class FaultySender:
    """The OrderAccepted destination under chaos: PublishError before the send, or after it went out."""

    def __init__(self, sender: RecordingSender, chaos: Chaos) -> None:
        self._sender = sender
        self._chaos = chaos

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Send, as the destination does; see MessageSender."""
        call = f"sender.send {' '.join(m.message_id[-12:] for m in messages)}" if self._chaos.tracing else "sender.send"
        await self._chaos.through(call, lambda: self._sender.send(destination, messages),
                            refuse=_publish_refused, lose=PublishError)
