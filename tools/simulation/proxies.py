"""The ports as the handlers see them in a run: every call is a step where the scheduler may interleave or fault.

Behind each proxy is the shipped in-memory fake, which passes the same contract suite as the real
adapter. The store proxy also keeps the history of what was written, which serves as the change
feed of the outbox publisher and as evidence for the invariants.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, NoReturn

from idempotent_consumer.errors import (
    BatchFailed,
    DownstreamUnavailable,
    PreconditionFailed,
    PublishError,
    StoreError,
    TransientStoreError,
)
from idempotent_consumer.ports.sender import MessageSender, OutgoingMessage
from idempotent_consumer.ports.store import MAX_PAGE_ITEMS, BatchOperation, Create, Delete, Document, Patch, Replace
from idempotent_consumer.records import EffectStatus, OutboxEntry, SideEffectRecord
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.documents import EventRecord, OrderDocument
from shared.domain.identity import ORDER_REJECTED
from shared.domain.lifecycle import CANCELLED, OPEN_STATUSES, RESERVABLE_STATUSES
from shared.handlers.place_order import RESERVATION_CLAIM
from shared.ports.fulfilment import Reply
from simulation.faults import Chaos

RECORD_KINDS = frozenset(str(kind.__struct_config__.tag) for kind in EventRecord.__subclasses__())
# An order's fields its events set, each the event's record: its identity beside its data.
SUB_OBJECTS = RECORD_KINDS
_Key = tuple[str, str]
_IN_ORDER = f"{RESERVATION_CLAIM}/"  # the paths of a patch that writes the claim kept in its order


class History:
    """Every successful write: the order of versions, of applied events and of changed outbox entries, what the
    other writers of the container wrote last (``foreign``), and when documents expire.

    The app's writes come through ``FaultyStore``; the foreign writers' (``simulation.foreign``) come through
    ``wrote_foreign``, so that the change feed and the evidence see both, as Cosmos DB's change feed would.
    """

    def __init__(self, on_outbox_change: Callable[[], None], on_change: Callable[[], None],
                 actor: Callable[[], object] = lambda: None) -> None:
        self.order_versions: defaultdict[str, list[int]] = defaultdict(list)
        # The order's status as the app's writes left it, and what was decided against it: for each delivery (its
        # actor), the status its last claim of the reservation (the intake's create, or a takeover) left the order
        # in; and every write that contradicted the order's status when it was made (``contradictions``).
        self.order_status: dict[str, str] = {}
        self.decided: dict[tuple[object, str], str | None] = {}
        self._claims_kept: set[str] = set()  # orders whose reservation claim a write put in the order
        self.contradictions: list[str] = []
        self._actor = actor
        self.applied: defaultdict[str, list[int]] = defaultdict(list)  # order id -> sequences, as recorded
        # (source, event id) -> how often a write recorded the event: set it on its order's sub-object, where another
        # event's (or none) stood, or created its record document
        self.records_created: Counter[tuple[str, str]] = Counter()
        self._sub_objects: dict[tuple[str, str], tuple[str, str]] = {}  # (order id, field) -> the event it holds
        self.outbox_changes: dict[_Key, None] = {}  # the change feed's backlog, in order, without repeats
        self.documents: dict[_Key, None] = {}  # every document the app created, in order, without repeats
        self.changes: dict[_Key, None] = {}  # the app's writes the enrichment job has not seen yet, in order
        # The last value each foreign field was given, by document. A delete, or a create (of a document
        # whose earlier one was deleted or expired), drops what was written on the one before.
        self.foreign: dict[_Key, dict[str, Any]] = {}
        self.foreign_last: set[_Key] = set()  # documents whose latest write was a foreign writer's
        self.app_conflicts = 0  # the app's etag-conditional writes refused on a document a foreign writer wrote last
        self.expires_at: dict[_Key, float] = {}  # documents written with a ttl: when the store stops showing them
        self._on_outbox_change = on_outbox_change
        self._on_change = on_change

    def wrote(self, partition_key: str, operations: Sequence[BatchOperation], results: Sequence[Document]) -> None:
        """Note the documents one successful call of the app wrote (results line up with operations)."""
        for operation, document in zip(operations, results, strict=True):
            key = (partition_key, _doc_id(operation))
            self.foreign_last.discard(key)
            if isinstance(operation, Create | Delete):
                self.foreign.pop(key, None)
            if isinstance(operation, Create):
                self.documents[key] = None
            if not isinstance(operation, Delete):
                self.changes[key] = None
            self._note(key, operation, document)
        for operation in operations:
            self._judge(partition_key, operation)
        self._on_change()

    def reserving(self, order_id: str) -> None:
        """A reservation call for the order takes effect now: it must have been decided, by the delivery making it,
        by a claim that left the order in a status that takes one (not cancelled)."""
        status = self.decided.get((self._actor(), order_id))
        if status not in RESERVABLE_STATUSES:
            self.contradictions.append(f"order {order_id}: stock reserved by a delivery whose claim left the order"
                                       f" {status or 'unclaimed'}")

    def _judge(self, order_id: str, operation: BatchOperation) -> None:
        """Check one of the app's writes against the order's status as the batch left it: an announcement (never
        OrderAccepted for a cancelled order, never OrderRejected for a cancelled or shipped one), a reservation closed
        for its order's sake (only a cancelled one's), or an outcome left unannounced (only where it would have
        contradicted the order)."""
        status = self.order_status.get(order_id)
        if isinstance(operation, Create) and SideEffectRecord.is_kind(operation.document):
            self.decided[self._actor(), order_id] = status
        elif isinstance(operation, Create | Replace) and isinstance(operation.document.get(RESERVATION_CLAIM), dict) \
                and order_id not in self._claims_kept:  # the claim in the order's create (or its pending order's place)
            self._claims_kept.add(order_id)
            self.decided[self._actor(), order_id] = status
        elif isinstance(operation, Create) and OutboxEntry.is_kind(operation.document):
            subject = operation.document.get("subject")
            if status not in (OPEN_STATUSES if subject == ORDER_REJECTED else RESERVABLE_STATUSES):
                self.contradictions.append(f"order {order_id}: {subject} written while it was {status}")
        elif isinstance(operation, Patch) and (operation.doc_id.startswith("side-effect.") or any(
                name.startswith(_IN_ORDER) for name in operation.set_fields)):
            fields = operation.set_fields if operation.doc_id.startswith("side-effect.") else {
                name.removeprefix(_IN_ORDER): value for name, value in operation.set_fields.items()
                if name.startswith(_IN_ORDER)}
            if "attempt" in fields:
                self.decided[self._actor(), order_id] = status
            if str(fields.get("refusal", "")).startswith("order-") and status != CANCELLED:
                self.contradictions.append(f"order {order_id}: its reservation closed while the order was {status}")
            elif fields.get("announces") is False and status in (
                    OPEN_STATUSES if fields.get("status") == EffectStatus.REJECTED.value else RESERVABLE_STATUSES):
                self.contradictions.append(f"order {order_id}: its outcome ({fields.get('status')}) left unannounced"
                                           f" while the order was {status}")

    def wrote_foreign(self, partition_key: str, operation: Patch | Replace, document: Document,
                      fields: Mapping[str, Any]) -> None:
        """Note one successful write of a foreign writer, which set ``fields`` on the document."""
        key = (partition_key, _doc_id(operation))
        self.foreign.setdefault(key, {}).update(fields)
        self.foreign_last.add(key)
        self._note(key, operation, document)

    def refused(self, partition_key: str, operation: BatchOperation, error: StoreError) -> None:
        """Note an operation of the app's that failed its batch: a 412 on a foreign writer's change is counted."""
        on_etag = getattr(operation, "if_match", None) is not None  # a replace or delete (or patch) on the etag
        key = (partition_key, _doc_id(operation))
        if on_etag and isinstance(error, PreconditionFailed) and key in self.foreign_last:
            self.app_conflicts += 1

    def take_outbox_changes(self) -> list[_Key]:
        """The outbox entries changed since the last take, oldest first: one change-feed batch."""
        taken = list(self.outbox_changes)
        self.outbox_changes.clear()
        return taken

    def take_changes(self) -> list[_Key]:
        """The documents the app changed since the last take, oldest first: the enrichment job's batch."""
        taken = list(self.changes)
        self.changes.clear()
        return taken

    def _note(self, key: _Key, operation: BatchOperation, document: Document) -> None:
        ttl = document.get("ttl")
        if isinstance(ttl, int) and ttl != -1:
            self.expires_at[key] = document["_ts"] + ttl
        else:
            self.expires_at.pop(key, None)
        kind = document.get("type")
        if kind is None:  # a delete: the change feed does not show deletes
            return
        if OrderDocument.is_kind(document):
            self.order_versions[document["orderId"]].append(document["version"])
            self.order_status[document["orderId"]] = document["status"]
            self._recorded_on(document)
        elif kind in RECORD_KINDS and isinstance(operation, Create):
            self.applied[document["orderId"]].append(document["sequence"])
            self.records_created[document["eventSource"], document["eventId"]] += 1
        elif OutboxEntry.is_kind(document):
            self.outbox_changes[key] = None
            self._on_outbox_change()


    def _recorded_on(self, order: Document) -> None:
        """Note each event whose identity a write of the order set on its sub-object, where it did not stand (in
        sequence: one write may apply several)."""
        subs = [(name, sub) for name in SUB_OBJECTS
                if isinstance(sub := order.get(name), Mapping) and "eventId" in sub]
        for name, sub in sorted(subs, key=lambda found: int(found[1]["sequence"])):
            key, event = (str(order["orderId"]), name), (str(sub["eventSource"]), str(sub["eventId"]))
            if self._sub_objects.get(key) != event:
                self._sub_objects[key] = event
                self.applied[key[0]].append(int(sub["sequence"]))
                self.records_created[event] += 1


def _doc_id(operation: BatchOperation) -> str:
    return operation.doc_id if isinstance(operation, Patch | Delete) else str(operation.document["id"])


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
        # How near the limits the run came: queries read past their first page, batches of 90 operations or
        # more, the largest batch.
        self.limits: Counter[str] = Counter()

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

    async def query_pages(
        self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
        before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
    ) -> AsyncIterator[list[Document]]:
        """Query, as the store does, under chaos at every page (each is a request); see DocumentStore."""
        pages = self._store.query_pages(conditions, partition_key=partition_key, before=before, page_size=page_size)
        read = 0
        while True:
            try:
                page = await self._chaos.through("store.query", lambda: anext(pages), refuse=_store_unavailable,
                                                 lose=_store_timeout)
            except StopAsyncIteration:
                self.limits["queries"] += 1
                self.limits["queries_past_a_page"] += read > 1
                return
            read += 1
            yield page

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        """Execute a transactional batch, as the store does; see DocumentStore."""
        self.limits["batches_of_90_or_more"] += len(operations) >= 90
        self.limits["largest_batch"] = max(self.limits["largest_batch"], len(operations))
        call = f"store.batch {partition_key[:12]} [{_operations(operations)}]" if self._chaos.tracing else "store.batch"
        return await self._chaos.through(call, lambda: self._batch(partition_key, operations),
                                   refuse=_store_unavailable, lose=_store_timeout)

    async def _create(self, document: Document) -> Document:
        written = await self._store.create(document)
        self._history.wrote(written["orderId"], [Create(document)], [written])
        return written

    async def _batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        try:
            written = await self._store.execute_batch(partition_key, operations)
        except BatchFailed as exc:
            self._history.refused(partition_key, operations[exc.index], exc.error)
            raise
        self._history.wrote(partition_key, operations, written)
        return written


class FaultyFulfilment:
    """The fulfilment service under chaos: unreachable (DownstreamUnavailable) or 503 before, a timeout after."""

    def __init__(self, fulfilment: InMemoryFulfilment, chaos: Chaos, history: History | None = None) -> None:
        self._fulfilment = fulfilment
        self._chaos = chaos
        self._history = history

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Reserve, as the service does; see FulfilmentService."""
        return await self._chaos.through(
            "fulfilment.reserve", lambda: self._reserve(idempotency_key, request),
            refuse=self._refuse, lose=DownstreamUnavailable)

    async def _reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        if self._history is not None:
            self._history.reserving(str(request.get("orderId")))
        return await self._fulfilment.reserve(idempotency_key, request)

    def _refuse(self, text: str) -> Reply:
        if self._chaos.coin():
            raise DownstreamUnavailable(f"injected: {text}")
        return Reply(503, {})


def _publish_refused(text: str) -> NoReturn:
    raise PublishError(f"injected: {text}")


class FaultySender:
    """The namespace under chaos (the outcome destinations, and the queues for delayed retries' copies):
    PublishError before the send, or after it went out."""

    def __init__(self, sender: MessageSender, chaos: Chaos) -> None:
        self._sender = sender
        self._chaos = chaos

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Send, as the destination does; see MessageSender."""
        call = f"sender.send {' '.join(m.message_id[-12:] for m in messages)}" if self._chaos.tracing else "sender.send"
        await self._chaos.through(call, lambda: self._sender.send(destination, messages),
                            refuse=_publish_refused, lose=PublishError)
