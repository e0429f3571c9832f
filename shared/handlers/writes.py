"""The named writes: each multi-document write of the core as a type with named parts and named failures.

A write is one transactional batch in its order's partition, all or nothing. Its layout stays here: a
handler says what it writes, and hears back what went wrong by name (``OrderIdTaken``, ``AlreadySeen``,
``OrderChanged`` from ``shared.errors``), never by a position in the batch.

An order is changed by a patch of its aggregate's changes, on its etag as read, which keeps every
field it does not set; so is a pending order. Only an order taking a pending order's place sets more
fields than one patch takes: it is merged into the pending order as read, on its etag. Nothing here
rewrites a document from a Struct.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.domain.aggregate import Order, Release, transition
from shared.domain.documents import (
    EventRecord,
    InboxMarker,
    OrderDocument,
    OutboxEntry,
    ParkedEvent,
    ParkedStatus,
    PendingOrder,
    SideEffectRecord,
    UnreadableParked,
    merged,
    schema_version,
)
from shared.domain.lifecycle import CloudEvent
from shared.errors import (
    AlreadyExists,
    AlreadySeen,
    BatchFailed,
    NotFound,
    OrderChanged,
    OrderIdTaken,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
    WriteConflict,
)
from shared.ports.store import BatchOperation, Create, Delete, Document, DocumentStore, Patch, Replace

MAX_PARKED_READ = 100
Parts = list[tuple[str, BatchOperation]]


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
    if OrderDocument.is_kind(document):
        placed = OrderDocument.from_document(document)
        return Stored(Order(order_id, placed.status, placed.version, placed.parked), document, placed.request_hash)
    if PendingOrder.is_kind(document):
        return Stored(Order(order_id, parked=PendingOrder.from_document(document).parked), document)
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
    """The events this consumer has parked against the order (``Order.release`` puts them in sequence
    order); one that does not decode here as what still reads of it, for a release to stop at."""
    found = await store.query(ParkedEvent.waiting(consumer), partition_key=order_id, limit=MAX_PARKED_READ)
    return [ParkedEvent.read_leniently(d) for d in found]


def order_write(stored: Stored, order: Order) -> BatchOperation:
    """The order's changes as a patch of its document, on its etag as read; a new pending order if none
    stood. (The aggregate changes at most seven fields: status, version, parked, updatedAt and the three
    event kinds' own, inside the ten one patch takes.)"""
    if stored.document is None:
        return Create(PendingOrder(id=order.order_id, order_id=order.order_id, parked=order.parked).to_document())
    return Patch(order.order_id, dict(order.changes), if_match=_ours(stored)["_etag"])


def _merge_on_etag(stored: Stored, changes: Mapping[str, Any]) -> Replace:
    document = _ours(stored)
    return Replace(merged(document, changes), document["_etag"])


def _ours(stored: Stored) -> Document:
    if stored.document is None or stored.foreign:
        raise StoreError(f"document {stored.order.order_id} is neither an order nor a pending order; not ours to write")
    return stored.document


def released(done: Release) -> Parts:
    """A release's writes beside the order's: each applied event's record, and its parked copy removed;
    a stale copy removed; a rejected one kept with the reason."""
    parts: Parts = []
    for parked, event in done.applied:
        parts += [("record", Create(EventRecord.of(event).to_document())), ("released", Delete(parked.id, parked.etag))]
    parts += [("released", Delete(parked.id, parked.etag)) for parked in done.stale]
    parts += [("released", Patch(parked.id, {"status": ParkedStatus.REJECTED.value, "reason": reason},
                                 {"status": ParkedStatus.PARKED.value})) for parked, reason in done.rejected]
    return parts


@dataclass(frozen=True)
class OrderIntake:
    """A new order with its OrderAccepted outbox entry and its reservation claim. It may take the place of
    a pending order: then it applies, in the same batch, the parked events its release puts in sequence."""

    order: OrderDocument
    outbox: OutboxEntry
    claim: SideEffectRecord
    adopting: tuple[Stored, Release] | None = None  # the pending order as read, and what the order releases

    async def write(self, store: DocumentStore) -> SideEffectRecord:
        """Write it all; the claim as written. Raise OrderIdTaken, or OrderChanged if the pending order moved."""
        order: BatchOperation = Create(self.order.to_document())
        conflicts: dict[str, type[WriteConflict]] = {"order": OrderIdTaken}
        release: Parts = []
        if self.adopting is not None:
            pending, done = self.adopting
            order = _merge_on_etag(pending, {**self.order.to_document(), **done.order.changes})
            conflicts, release = {"order": OrderChanged, "released": OrderChanged}, released(done)
        parts: Parts = [("order", order), ("outbox", Create(self.outbox.to_document())),
                        ("claim", Create(self.claim.to_document())), *release]
        written = await _write(store, self.order.order_id, parts, conflicts)
        return SideEffectRecord.from_document(written["claim"])


@dataclass(frozen=True)
class EventWrites:
    """One consumer's writes for one event, each behind its inbox marker, so that it applies once."""

    store: DocumentStore
    marker: InboxMarker
    event: CloudEvent

    async def apply(self) -> None:
        """The happy path, unread: the order patched on its version and state, and the event's record."""
        changes, condition = transition(self.event)
        await write_once(self.store, self.marker, [("order", Patch(self.event.order_id, changes, condition)),
                                                   ("record", Create(EventRecord.of(self.event).to_document()))])

    async def apply_and_release(self, stored: Stored, done: Release) -> None:
        """The event onto the order as read, then the parked events it releases."""
        await write_once(self.store, self.marker, [
            ("order", order_write(stored, done.order)), ("record", Create(EventRecord.of(self.event).to_document())),
            *released(done)], relied_on=("released",))

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
            kept = await self.store.read(parked.id, parked.order_id)
            raise _seen_before(ParkedEvent, kept, f"parked event {parked.id} exists") from None


async def released_by_hand(store: DocumentStore, stored: Stored, done: Release) -> None:
    """An operator's release: the order as read, changed by the release, and the release's writes."""
    await _write(store, stored.order.order_id, [("order", order_write(stored, done.order)), *released(done)],
                 {"order": OrderChanged, "released": OrderChanged})


async def set_aside(store: DocumentStore, stored: Stored, parked: ParkedEvent, reason: str) -> ParkedEvent:
    """An operator's drop: the parked event kept, marked dropped, and no longer counted on its order (if
    parking it counted it)."""
    parts: Parts = [("parked", Patch(parked.id, {"status": ParkedStatus.DROPPED.value, "reason": reason},
                                     {"status": ParkedStatus.PARKED.value}))]
    if stored.document is not None and not stored.foreign and parked.counted:
        parts.append(("order", order_write(stored, stored.order.count_parked(stored.order.parked - 1))))
    await _write(store, stored.order.order_id, parts, {"order": OrderChanged, "parked": OrderChanged})
    return msgspec.structs.replace(parked, status=ParkedStatus.DROPPED, reason=reason)


async def write_once(store: DocumentStore, marker: InboxMarker, parts: Parts,
                     relied_on: tuple[str, ...] = (), taken: tuple[str, ...] = ()) -> None:
    """Write the marker and the parts atomically. Raise AlreadySeen if the marker exists (with the first
    content's requestHash); OrderChanged if the order, or a part in ``relied_on``, was not as read; _Taken
    if a create in ``taken`` found its id taken."""
    conflicts: dict[str, type[WriteConflict]] = {
        "marker": _MarkerTaken, "order": OrderChanged, **dict.fromkeys(relied_on, OrderChanged),
        **dict.fromkeys(taken, _Taken)}
    try:
        await _write(store, marker.order_id, [("marker", Create(marker.to_document())), *parts], conflicts)
        return
    except _MarkerTaken:
        pass
    try:
        stored = await store.read(marker.id, marker.order_id)
    except NotFound as exc:
        # The marker expired between the conflict and the read; a redelivery will decide.
        raise TransientStoreError(f"marker {marker.id} vanished after a conflict") from exc
    raise _seen_before(InboxMarker, stored, f"marker {marker.id} exists")


def _seen_before(kind: type[InboxMarker] | type[ParkedEvent], document: Document, found: str) -> AlreadySeen:
    """AlreadySeen with the requestHash of the content first seen, from its marker or parked copy; from
    that one field when the rest does not decode here (a newer version's), and None when it does not
    read either, with the reason."""
    try:
        return AlreadySeen(found, kind.from_document(document).request_hash)
    except UnreadableDocument as exc:
        return AlreadySeen(f"{found}; {exc}", exc.request_hash)


class _Taken(WriteConflict):
    """A create of the batch found its id taken."""


class _MarkerTaken(_Taken):
    """The batch's marker create found the marker there."""


async def _write(store: DocumentStore, partition_key: str, parts: Parts,
                 conflicts: Mapping[str, type[WriteConflict]]) -> dict[str, Document]:
    """Run the parts as one batch; the written documents by part. A part's conflict (id taken, document
    changed or gone) raises the part's error in ``conflicts``; any other failure a StoreError naming it."""
    try:
        written = await store.execute_batch(partition_key, [operation for _, operation in parts])
    except BatchFailed as exc:
        part, error = parts[exc.index][0], exc.error
        if part in conflicts and isinstance(error, (AlreadyExists, PreconditionFailed, NotFound)):
            raise conflicts[part](f"{part} of order {partition_key}: {error}", status=error.status) from exc
        raise StoreError(f"{part} of order {partition_key}: {error}", status=error.status) from exc
    return {name: document for (name, _), document in zip(parts, written, strict=True)}
