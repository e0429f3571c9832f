"""The named writes: each multi-document write of the core as a type with named parts and named failures.

A write is one transactional batch in its order's partition, all or nothing, inside Cosmos DB's limits
(100 operations, 2 MB). Its layout stays here: a handler says what it writes, and hears back what went
wrong by name (``OrderIdTaken``, ``AlreadySeen``, ``OrderChanged``, ``LimitExceeded`` from
``idempotent_consumer.errors``), never by a position in the batch.

A release (``Releases``) is the one write that may not fit one batch: a storm of copies parked before
their order becomes a storm of removals when the order comes. It is planned here, where the limits are
known: each batch takes as many of the release's steps as fit beside the order's own write, and is on
the order's etag, the first as read and each next one as the last batch left it; every batch sets the
order's version, state and count as they stand once its steps are written, so that the order and what
waits agree after each. What cannot fit at all (a document past 2 MB) is refused with LimitExceeded
before anything is sent.

An order is changed by a patch of its aggregate's changes, on its etag, which keeps every field it does
not set; so is a pending order. Only an order taking a pending order's place sets more fields than one
patch takes: it is merged into the pending order as read, on its etag. Nothing here rewrites a document
from a Struct.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from idempotent_consumer.errors import (
    AlreadyExists,
    AlreadySeen,
    BatchFailed,
    BatchTooLarge,
    LimitExceeded,
    NotFound,
    OrderChanged,
    OrderIdTaken,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
    WriteConflict,
)
from idempotent_consumer.ports.store import (
    ABSENT,
    BATCH_LIMIT,
    MAX_BATCH_BYTES,
    MAX_BATCH_OPERATIONS,
    MAX_RACES,
    BatchOperation,
    Create,
    Delete,
    Document,
    DocumentStore,
    Patch,
    Replace,
    operation_bytes,
    query_all,
)
from idempotent_consumer.records import (
    InboxMarker,
    ParkedEvent,
    ParkedStatus,
    SideEffectRecord,
    UnreadableParked,
    merged,
    schema_version,
)
from shared.domain.aggregate import SUB_OBJECTS, Order, Release, Step, transition
from shared.domain.documents import EventRecord, OrderDocument, OrderState, PendingOrder
from shared.domain.lifecycle import CloudEvent

Parts = list[tuple[str, BatchOperation]]
# A release's batches fail on the order (its etag moved) or on a parked event (gone, or no longer parked):
# another delivery wrote the order since; read it again.
_RELEASE_CONFLICTS: dict[str, type[WriteConflict]] = {"order": OrderChanged, "released": OrderChanged}


@dataclass(frozen=True)
class Stored:
    """What stands at an order's id: the order (version 0 when none is placed) and the document as read."""

    order: Order
    document: Document | None = None
    request_hash: str | None = None  # the placed order's
    foreign: bool = False  # a document of another kind holds the order's id


async def read_order(store: DocumentStore, order_id: str) -> Stored:
    """Read what stands at the order's id."""
    try:
        document = await store.read(order_id, order_id)
    except NotFound:
        return Stored(Order(order_id))
    objects = {name: value for name in SUB_OBJECTS if isinstance(value := document.get(name), dict)}
    if OrderDocument.is_kind(document):
        placed = OrderState.of(document)
        return Stored(Order(order_id, placed.status, placed.version, placed.parked, objects=objects), document,
                      placed.request_hash)
    if PendingOrder.is_kind(document):
        return Stored(Order(order_id, parked=PendingOrder.from_document(document).parked, objects=objects), document)
    return Stored(Order(order_id), document, foreign=True)


async def read_known(store: DocumentStore, order_id: str) -> Stored:
    """What stands at the order's id, which a handler's decision reads: UnreadableDocument if it does not
    decode here, or is a document type this version does not know."""
    stored = await read_order(store, order_id)
    if stored.foreign and stored.document is not None:
        raise UnreadableDocument(f"{stored.document.get('type')} {order_id} is of a type this version does not"
                                 " know", doc_id=order_id, schema_version=schema_version(stored.document))
    return stored


async def waiting(store: DocumentStore, consumer: str, order_id: str) -> list[ParkedEvent | UnreadableParked]:
    """Every event this consumer has parked against the order, read through all the query's pages
    (``Order.release`` puts them in sequence order); one that does not decode here as what still reads of
    it, for a release to stop at."""
    found = await query_all(store, ParkedEvent.waiting(consumer), partition_key=order_id)
    return [ParkedEvent.read_leniently(d) for d in found]


def order_write(stored: Stored, order: Order) -> BatchOperation:
    """The order's changes as a patch of its document, on its etag as read; a new pending order if none
    stood. (The aggregate changes at most seven fields: status, version, parked, updatedAt and the three
    event kinds' own, inside the ten one patch takes.)"""
    if stored.document is None:
        return Create(PendingOrder(id=order.order_id, partition=order.order_id, parked=order.parked).to_document())
    return Patch(order.order_id, dict(order.changes), if_match=_ours(stored)["_etag"])


def _patch_on(order_id: str, etag: str) -> Callable[[Order], BatchOperation]:
    """The order's changes as a patch on ``etag``, for the batches of a release after its first."""
    return lambda order: Patch(order_id, dict(order.changes), if_match=etag)


def _merge_on_etag(stored: Stored, changes: Mapping[str, Any]) -> Replace:
    document = _ours(stored)
    return Replace(merged(document, changes), document["_etag"])


def _ours(stored: Stored) -> Document:
    if stored.document is None or stored.foreign:
        raise StoreError(f"document {stored.order.order_id} is neither an order nor a pending order; not ours to write")
    return stored.document


@dataclass(frozen=True)
class Releases:
    """Writes releases: the steps of each in as many batches as Cosmos DB's limits take, each on the order's etag.

    A rejected or dropped parked event is kept for operators with a ``ttl`` of ``set_aside_ttl`` seconds, so
    that what is set aside neither fills the container nor a listing for good.
    """

    store: DocumentStore
    consumer: str
    set_aside_ttl: int
    max_operations: int = MAX_BATCH_OPERATIONS  # a batch's budget: Cosmos DB's limits
    max_bytes: int = MAX_BATCH_BYTES

    def step_parts(self, step: Step) -> Parts:
        """One step's writes: an applied event's record and its parked copy removed; a stale copy removed; a
        rejected one kept, marked, with the reason and its ttl."""
        parked = step.parked
        if step.event is not None:
            return [("record", Create(EventRecord.document(step.event, parked.data))),
                    ("released", Delete(parked.id, parked.etag))]
        if step.rejection is None:
            return [("released", Delete(parked.id, parked.etag))]
        return [("released", self.set_aside(parked, ParkedStatus.REJECTED, step.rejection))]

    def set_aside(self, parked: ParkedEvent, status: ParkedStatus, reason: str) -> Patch:
        """The patch that sets a parked event aside (rejected or dropped), kept until its ttl ends."""
        return Patch(parked.id, {"status": status.value, "reason": reason, "ttl": self.set_aside_ttl},
                     {"status": ParkedStatus.PARKED.value})

    def plan(self, order: Callable[[Order], BatchOperation], done: Release, start: int, *,
             head: Sequence[tuple[str, BatchOperation]] = (),
             tail: Sequence[tuple[str, BatchOperation]] = ()) -> tuple[Parts, int]:
        """The next batch of ``done`` from step ``start``: ``head``, the order's write (``order`` of the order
        once the batch's steps are written), ``tail``, then as many steps as fit in Cosmos DB's limits; and
        how many steps it took. A batch with neither head nor tail takes at least one step. Raise
        LimitExceeded when the fixed parts, or one step alone, cannot fit."""
        fixed = [*head, ("order", order(done.order)), *tail]
        ops, size = len(fixed), sum(operation_bytes(op) for _, op in fixed)
        if ops > self.max_operations or size > self.max_bytes:
            raise LimitExceeded(f"order {done.start.order_id}: its own writes take {ops} operations and {size} bytes"
                                " of one transactional batch", limit=BATCH_LIMIT)
        steps: Parts = []
        taken = 0
        for step in done.steps[start:]:
            parts = self.step_parts(step)
            cost = sum(operation_bytes(op) for _, op in parts)
            if ops + len(parts) > self.max_operations or size + cost > self.max_bytes:
                break
            steps += parts
            ops, size, taken = ops + len(parts), size + cost, taken + 1
        if not taken and not head and not tail and start < len(done.steps):
            raise LimitExceeded(f"order {done.start.order_id}: parked event {done.steps[start].parked.id} alone does"
                                " not fit one transactional batch", limit=BATCH_LIMIT)
        return [*head, ("order", order(done.after(start + taken))), *tail, *steps], taken

    async def rest(self, order_id: str, etag: str, done: Release, start: int) -> None:
        """Write the steps of ``done`` from ``start`` on, in batches, the first on ``etag``. When the order moved
        meanwhile (another delivery wrote it), read it and what waits again, and release what it then decides.
        Raise TransientStoreError when it keeps moving: the rest waits for the next delivery that finishes it."""
        for _ in range(MAX_RACES):
            try:
                while start < len(done.steps):
                    parts, taken = self.plan(_patch_on(order_id, etag), done, start)
                    written = await _write(self.store, order_id, parts, _RELEASE_CONFLICTS)
                    etag, start = written["order"]["_etag"], start + taken
                return
            except OrderChanged:
                pass
            stored = await self.read(order_id)
            if stored is None or stored.document is None:
                return
            done = stored.order.release(await waiting(self.store, self.consumer, order_id))
            start, etag = 0, stored.document["_etag"]
        raise TransientStoreError(f"order {order_id} kept changing under its release; the rest waits for a redelivery")

    async def finish(self, order_id: str) -> Release | None:
        """Release what the order, as it stands, decides of what waits for it: the rest of a release an earlier
        delivery began and could not finish. None when nothing counted waits, or the order is not placed, or
        does not decode here (a newer version's, which finishes it)."""
        stored = await self.read(order_id)
        if stored is None or stored.document is None or not stored.order.parked:
            return None
        done = stored.order.release(await waiting(self.store, self.consumer, order_id))
        if done.steps:
            await self.rest(order_id, stored.document["_etag"], done, 0)
        return done

    async def read(self, order_id: str) -> Stored | None:
        """The placed order as it stands; None when none is placed or it does not decode here."""
        try:
            stored = await read_known(self.store, order_id)
        except UnreadableDocument:
            return None
        return stored if stored.order.status is not None else None

    async def by_hand(self, stored: Stored, done: Release) -> None:
        """An operator's release: the order as read, changed by the release, and the release's writes, in as
        many batches as they take. Raise OrderChanged if the order moved before the first."""
        parts, taken = self.plan(lambda order: order_write(stored, order), done, 0)
        written = await _write(self.store, stored.order.order_id, parts, _RELEASE_CONFLICTS)
        await self.rest(stored.order.order_id, written["order"]["_etag"], done, taken)


@dataclass(frozen=True)
class OrderIntake:
    """A new order with its reservation claim (its outcome is announced once the reservation is finished). It
    may take the place of a pending order: then it applies the parked events its release puts in sequence, as
    many as fit in the same batch, and the rest in batches after it."""

    order: OrderDocument
    claim: SideEffectRecord
    adopting: tuple[Stored, Release] | None = None  # the pending order as read, and what the order releases

    async def write(self, releases: Releases) -> SideEffectRecord:
        """Write it all; the claim as written. Raise OrderIdTaken, OrderChanged if the pending order moved,
        or LimitExceeded if the order's own documents do not fit one batch."""
        tail: Parts = [("claim", Create(self.claim.to_document()))]
        order_id = self.order.order_id
        if self.adopting is None:
            written = await _write(releases.store, order_id, [("order", Create(self.order.to_document())), *tail],
                                   {"order": OrderIdTaken})
            return SideEffectRecord.from_document(written["claim"])
        pending, done = self.adopting
        document = self.order.to_document()
        parts, taken = releases.plan(lambda order: _merge_on_etag(pending, {**document, **order.changes}), done, 0,
                                     tail=tail)
        written = await _write(releases.store, order_id, parts, _RELEASE_CONFLICTS)
        await releases.rest(order_id, written["order"]["_etag"], done, taken)
        return SideEffectRecord.from_document(written["claim"])


@dataclass(frozen=True)
class EventWrites:
    """One consumer's writes for one event, each behind its inbox marker, so that it applies once; ``content``
    is the event as its producer wrote it, which its park keeps and its record and order store the data of."""

    releases: Releases
    marker: InboxMarker
    event: CloudEvent
    content: Mapping[str, Any]

    @property
    def data(self) -> Mapping[str, Any] | None:
        """The event's ``data`` as its producer wrote it."""
        data = self.content.get("data")
        return data if isinstance(data, Mapping) else None

    @property
    def store(self) -> DocumentStore:
        """The store the writes go to."""
        return self.releases.store

    async def apply(self) -> None:
        """The happy path, unread: the order patched on its version and state, and the event's record. The event's
        sub-object is set whole, so only where none stands (another writer may have put one there, whose fields
        the read path keeps)."""
        changes, condition = transition(self.event, self.data)
        condition[self.event.kind.record_type] = ABSENT
        await write_once(self.store, self.marker, [("order", Patch(self.event.order_id, changes, condition)),
                                                   ("record", Create(EventRecord.document(self.event, self.data)))])

    async def apply_and_release(self, stored: Stored, done: Release) -> None:
        """The event onto the order as read, then the parked events it releases: as many as fit beside it in
        its marker's batch, the rest in batches after it. The marker of a release that takes more than one
        batch says so (``releasing``), so that a redelivery after a failure between them finishes it."""
        record: Parts = [("record", Create(EventRecord.document(self.event, self.data)))]
        releasing = msgspec.structs.replace(self.marker, releasing=True)
        parts, taken = self.releases.plan(lambda order: order_write(stored, order), done, 0,
                                          head=[("marker", Create(releasing.to_document()))], tail=record)
        marker = releasing if taken < len(done.steps) else self.marker
        written = await write_once(self.store, marker, parts[1:], relied_on=("released",))
        await self.releases.rest(self.event.order_id, written["order"]["_etag"], done, taken)

    async def park(self, stored: Stored | None, parked: ParkedEvent) -> None:
        """The event parked, and counted on its order (or on a pending order standing in for it); with
        ``stored`` None (what stands at the order's id does not decode here), parked alone, uncounted
        (``parked.counted`` false).

        A parked copy already there (its marker expired while it waited, and the event was sent again)
        is the event seen before: AlreadySeen with the parked copy's requestHash.
        """
        parts: Parts = [("parked", Create(parked.to_document()))]
        if stored is not None:
            parts.append(("order", order_write(stored, stored.order.count_parked(stored.order.parked + 1))))
        try:
            await write_once(self.store, self.marker, parts, taken=("parked",))
        except _Taken:
            kept = await self.store.read(parked.id, parked.partition)
            raise _seen_before(ParkedEvent, kept, f"parked event {parked.id} exists") from None


async def set_aside(releases: Releases, stored: Stored, parked: ParkedEvent, reason: str) -> ParkedEvent:
    """An operator's drop: the parked event kept, marked dropped until its ttl ends, and no longer counted on
    its order (if parking it counted it)."""
    parts: Parts = [("parked", releases.set_aside(parked, ParkedStatus.DROPPED, reason))]
    if stored.document is not None and not stored.foreign and parked.counted:
        parts.append(("order", order_write(stored, stored.order.count_parked(stored.order.parked - 1))))
    await _write(releases.store, stored.order.order_id, parts, {"order": OrderChanged, "parked": OrderChanged})
    return msgspec.structs.replace(parked, status=ParkedStatus.DROPPED, reason=reason)


async def write_once(store: DocumentStore, marker: InboxMarker, parts: Parts,
                     relied_on: tuple[str, ...] = (), taken: tuple[str, ...] = ()) -> dict[str, Document]:
    """Write the marker and the parts atomically; the written documents by part. Raise AlreadySeen if the
    marker exists (with the first content's requestHash); OrderChanged if the order, or a part in
    ``relied_on``, was not as read; _Taken if a create in ``taken`` found its id taken."""
    conflicts: dict[str, type[WriteConflict]] = {
        "marker": _MarkerTaken, "order": OrderChanged, **dict.fromkeys(relied_on, OrderChanged),
        **dict.fromkeys(taken, _Taken)}
    try:
        return await _write(store, marker.partition, [("marker", Create(marker.to_document())), *parts], conflicts)
    except _MarkerTaken:
        pass
    try:
        stored = await store.read(marker.id, marker.partition)
    except NotFound as exc:
        # The marker expired between the conflict and the read; a redelivery will decide.
        raise TransientStoreError(f"marker {marker.id} vanished after a conflict") from exc
    raise _seen_before(InboxMarker, stored, f"marker {marker.id} exists")


def _seen_before(kind: type[InboxMarker] | type[ParkedEvent], document: Document, found: str) -> AlreadySeen:
    """AlreadySeen with the requestHash of the content first seen, from its marker or parked copy; from
    that one field when the rest does not decode here (a newer version's), and None when it does not
    read either, with the reason. A marker that says its release took more batches than one says so too."""
    try:
        seen = kind.from_document(document)
    except UnreadableDocument as exc:
        return AlreadySeen(f"{found}; {exc}", exc.request_hash)
    return AlreadySeen(found, seen.request_hash, releasing=isinstance(seen, InboxMarker) and seen.releasing is True)


class _Taken(WriteConflict):
    """A create of the batch found its id taken."""


class _MarkerTaken(_Taken):
    """The batch's marker create found the marker there."""


async def _write(store: DocumentStore, partition_key: str, parts: Parts,
                 conflicts: Mapping[str, type[WriteConflict]]) -> dict[str, Document]:
    """Run the parts as one batch; the written documents by part. A part's conflict (id taken, document
    changed or gone) raises the part's error in ``conflicts``; a batch past Cosmos DB's limits LimitExceeded;
    any other failure a StoreError naming it."""
    try:
        written = await store.execute_batch(partition_key, [operation for _, operation in parts])
    except BatchTooLarge as exc:  # refused before it was sent: the same batch can never be written
        raise LimitExceeded(f"order {partition_key}: {exc}", limit=exc.limit) from exc
    except BatchFailed as exc:
        part, error = parts[exc.index][0], exc.error
        if part in conflicts and isinstance(error, (AlreadyExists, PreconditionFailed, NotFound)):
            raise conflicts[part](f"{part} of order {partition_key}: {error}", status=error.status) from exc
        raise StoreError(f"{part} of order {partition_key}: {error}", status=error.status) from exc
    return {name: document for (name, _), document in zip(parts, written, strict=True)}
