"""The resequencer: an event that arrives before its predecessor waits, parked, in the order's partition.

An event whose order is not yet at the version before it is parked: one batch writes its inbox
marker, a ``ParkedEvent``, and the order (or a ``PendingOrder`` standing in for an order not placed
yet) with one more parked event; its message is completed. When the predecessor is applied, or
OrderPlaced creates the order, the parked successors that are now in sequence are applied in that
same batch: the order is replaced on its etag with its state after them, each gets its event record,
and each ``ParkedEvent`` is deleted. A parked event the order's state forbids is kept, rejected, with
the reason. The happy path pays nothing: an order with nothing parked is patched on a condition that
includes ``parked = 0``, so a parked successor is never passed over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from shared.domain.documents import EventRecord, OrderDocument, ParkedEvent, ParkedStatus, PendingOrder
from shared.errors import NotFound, StoreError
from shared.ports.store import BatchOperation, Create, Delete, DocumentStore, Replace

# Each released event costs two operations (its record, the parked document's delete): with the
# order's own write and a marker, 40 stay well inside Cosmos DB's 100 operations per batch.
MAX_RELEASED_PER_BATCH = 40
MAX_PARKED_READ = 100


@dataclass(frozen=True)
class Stored:
    """What stands at an order's id: the order, a pending order, or nothing."""

    order: OrderDocument | None = None
    pending: PendingOrder | None = None
    foreign: bool = False  # a document of another kind holds the order's id

    @property
    def version(self) -> int:
        """The order's version; 0 before OrderPlaced."""
        return self.order.version if self.order else 0

    @property
    def parked(self) -> int:
        """How many events are parked against the order."""
        holder = self.order or self.pending
        return holder.parked if holder else 0

    def with_one_more_parked(self, order_id: str) -> BatchOperation:
        """The write that counts one more parked event: on the order, the pending order, or a new one."""
        if self.order is not None:
            more = msgspec.structs.replace(self.order, parked=self.order.parked + 1)
            return Replace(more.to_document(), self.order.etag)
        if self.pending is not None:
            more_pending = msgspec.structs.replace(self.pending, parked=self.pending.parked + 1)
            return Replace(more_pending.to_document(), self.pending.etag)
        return Create(PendingOrder(id=order_id, order_id=order_id, parked=1).to_document())


async def read_order(store: DocumentStore, order_id: str) -> Stored:
    """Read what stands at the order's id."""
    try:
        document = await store.read(order_id, order_id)
    except NotFound:
        return Stored()
    if OrderDocument.is_kind(document):
        return Stored(order=OrderDocument.from_document(document))
    if PendingOrder.is_kind(document):
        return Stored(pending=PendingOrder.from_document(document))
    return Stored(foreign=True)


async def waiting(store: DocumentStore, consumer: str, order_id: str) -> list[ParkedEvent]:
    """The events this consumer has parked against the order, in sequence order."""
    found = await store.query(ParkedEvent.waiting(consumer), partition_key=order_id, limit=MAX_PARKED_READ)
    return sorted((ParkedEvent.from_document(d) for d in found), key=lambda p: p.sequence)


@dataclass
class Release:
    """The writes that apply parked events onto an order, beside the order's own write."""

    order: OrderDocument
    operations: list[BatchOperation] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """What the release did, for the delivery's log record."""
        parts = [f"released versions {self.applied}"] if self.applied else []
        return "; ".join(parts + self.set_aside)


def release(order: OrderDocument, parked: list[ParkedEvent]) -> Release:
    """Apply the parked events that are in sequence after ``order``, in one pass by sequence.

    A parked event at or below the order's version (another event took its version) is stale and
    removed; one the order's state forbids is rejected and kept with the reason, and what waits behind
    it stays parked. The state machine allows chains of a few events only; the cap is a safety net.
    """
    result = Release(order)
    remaining = 0
    for waiting_event in sorted(parked, key=lambda p: (p.sequence, p.parked_at)):
        version = result.order.version
        if waiting_event.sequence <= version:
            result.operations.append(Delete(waiting_event.id, waiting_event.etag))
            result.set_aside.append(f"parked version {waiting_event.sequence} was stale and is removed")
        elif waiting_event.sequence > version + 1 or len(result.applied) == MAX_RELEASED_PER_BATCH:
            remaining += 1
        elif result.order.allows(event := waiting_event.cloud_event()):
            result.order = result.order.applied(event)
            result.operations += [Create(EventRecord.of(event).to_document()), Delete(waiting_event.id,
                                                                                        waiting_event.etag)]
            result.applied.append(event.sequence)
        else:
            allowed = ", ".join(event.kind.allowed_from)
            reason = f"order is {result.order.status}; {event.type} may follow only {allowed}"
            rejected = msgspec.structs.replace(waiting_event, status=ParkedStatus.REJECTED, reason=reason)
            result.operations.append(Replace(rejected.to_document(), waiting_event.etag))
            result.set_aside.append(f"parked version {event.sequence} rejected: {reason}")
    result.order = msgspec.structs.replace(result.order, parked=remaining)
    return result


async def find_parked(store: DocumentStore, consumer: str, order_id: str | None) -> list[ParkedEvent]:
    """What this consumer has parked, for one order or all (rejected and dropped ones included)."""
    conditions = {k: v for k, v in ParkedEvent.waiting(consumer).items() if k != "status"}
    found = await store.query(conditions, partition_key=order_id, limit=MAX_PARKED_READ)
    return sorted((ParkedEvent.from_document(d) for d in found), key=lambda p: (p.order_id, p.sequence))


async def _one_parked(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> ParkedEvent:
    for parked in await find_parked(store, consumer, order_id):
        if parked.event_id == event_id and parked.status is ParkedStatus.PARKED:
            return parked
    raise NotFound(f"no event {event_id} waits parked against order {order_id}")


async def force_release(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> Release:
    """Apply a parked event now, its missing predecessors notwithstanding (an operator's decision),
    then what waits behind it. Raise NotFound, or StoreError when the order's state forbids it."""
    parked = await _one_parked(store, consumer, order_id, event_id)
    stored = await read_order(store, order_id)
    if stored.order is None:
        raise StoreError(f"order {order_id} is not placed yet; a parked event can only join a placed order")
    event = parked.cloud_event()
    skipped_to = msgspec.structs.replace(stored.order, version=event.sequence - 1)
    if not skipped_to.allows(event):
        raise StoreError(f"order {order_id} is {stored.order.status}; {event.type} may not follow")
    others = [p for p in await waiting(store, consumer, order_id) if p.id != parked.id]
    if earlier := [p.sequence for p in others if p.sequence < parked.sequence]:
        raise StoreError(f"versions {earlier} of order {order_id} are parked before it; release those first")
    done = release(skipped_to.applied(event), others)
    await store.execute_batch(order_id, [Replace(done.order.to_document(), stored.order.etag),
                                   Create(EventRecord.of(event).to_document()), Delete(parked.id, parked.etag),
                                   *done.operations])
    done.applied.insert(0, event.sequence)
    return done


async def drop(store: DocumentStore, consumer: str, order_id: str, event_id: str) -> ParkedEvent:
    """Set a parked event aside for good (an operator's decision): kept, marked dropped, no longer counted."""
    parked = await _one_parked(store, consumer, order_id, event_id)
    stored = await read_order(store, order_id)
    holder = stored.order or stored.pending
    dropped = msgspec.structs.replace(parked, status=ParkedStatus.DROPPED, reason="dropped by an operator")
    operations: list[BatchOperation] = [Replace(dropped.to_document(), parked.etag)]
    if holder is not None:
        fewer = msgspec.structs.replace(holder, parked=max(0, holder.parked - 1))
        operations.append(Replace(fewer.to_document(), holder.etag))
    await store.execute_batch(order_id, operations)
    return dropped
