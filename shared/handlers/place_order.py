"""The idempotent OrderPlaced handler: the create is the duplicate check, then stock is reserved once.

One transactional batch creates the order, its OrderAccepted outbox entry and the claim of the
stock reservation; the reservation call follows, and its record is finished before the message is
completed. A duplicate delivery finds the order and finishes a reservation that is not yet confirmed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from shared.domain.documents import OrderDocument, OutboxEntry, SideEffectRecord
from shared.domain.messages import InboundMessage
from shared.domain.orders import OrderPlaced, parse_order
from shared.domain.outcomes import Outcome, Result
from shared.errors import (
    AlreadyExists,
    BatchFailed,
    InvalidMessage,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from shared.handlers.resequencer import read_order, release, waiting
from shared.handlers.side_effects import EffectOutcome, EffectReply, EffectResult, ReplyKind, SideEffect
from shared.ports.fulfilment import FulfilmentService, Reply
from shared.ports.store import BatchOperation, Create, DocumentStore, Replace
from shared.settings import Settings

RESERVE_STOCK = "reserve-stock"
MAX_RACES = 5  # how often a pending order may change between our read and our write before we give up
_EFFECT_OUTCOMES = {
    EffectOutcome.BUSY: Outcome.IN_PROGRESS,
    EffectOutcome.TRANSIENT: Outcome.TRANSIENT,
    EffectOutcome.REJECTED: Outcome.DOWNSTREAM_REJECTED,
}


@dataclass(frozen=True)
class OrderServices:
    """What process_order works with: the store, the fulfilment service, the settings and a clock."""

    store: DocumentStore
    fulfilment: FulfilmentService
    settings: Settings
    clock: Callable[[], float] = field(default=time.time)


async def place_order(message: InboundMessage, services: OrderServices) -> Result:
    """Validate; create order, outbox entry and reservation claim in one batch; on conflict compare
    request hashes; then reserve stock through the two-phase record.

    There is no read before the write: a read-then-write would let two concurrent copies both see
    "absent". Errors other than those handled here propagate, and the caller abandons the message.
    """
    try:
        order = parse_order(message)
    except InvalidMessage as exc:
        return Result(Outcome.INVALID, exc.rule)
    hash_ = order.request_hash()
    settings = services.settings
    effect = SideEffect(services.store, settings.consumer_name, RESERVE_STOCK, settings.side_effect_lease_seconds,
                        services.clock)
    try:
        created, claim = await _create(order, message, hash_, services, effect)
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"create failed: {exc}", hash_)
    if isinstance(created, Result):
        return created
    try:
        reservation = await effect.run(
            order_id=order.order_id,
            dedup_key=(order.order_id,),
            message=message,
            call=lambda key: _reserve(services.fulfilment, key, order),
            claimed=claim if created is Outcome.CREATED else None,
            found=claim if created is Outcome.DUPLICATE else None,
            request_hash=hash_,
        )
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"reservation record: {exc}", hash_)
    return _result(created, reservation, order, hash_)


async def _create(
    order: OrderPlaced, message: InboundMessage, hash_: str, services: OrderServices, effect: SideEffect
) -> tuple[Outcome | Result, SideEffectRecord | None]:
    """CREATED with the written claim, DUPLICATE with the claim as read (or None), or a final Result.

    A copy's id is taken: its one read is of the reservation claim, written in the order's batch,
    which holds both the first content's requestHash and the reservation's state. Only without a
    claim that names a hash (a pending order at the id, a record from before the hash was kept) does
    it read the order too, after that read: one more request on those paths. A pending order means
    events came first and are parked: the order replaces it, on its etag, in the same batch as its
    outbox entry and claim, with the parked events it releases.
    """
    settings, store = services.settings, services.store
    placed = OrderDocument.placed(order, message, hash_)
    outbox = OutboxEntry.order_accepted(
        order, message, consumer=settings.consumer_name, destination=settings.outbox_destination,
        requires_session=settings.outbox_requires_session, now=services.clock(),
    )
    claim = effect.claim(order.order_id, (order.order_id,), message, hash_)
    write: list[BatchOperation] = [Create(placed.to_document())]
    for _ in range(MAX_RACES):
        try:
            written = await store.execute_batch(
                order.order_id, [write[0], Create(outbox.to_document()), Create(claim.to_document()), *write[1:]]
            )
            return Outcome.CREATED, SideEffectRecord.from_document(written[2])
        except BatchFailed as exc:
            # The id taken, or (adopting a pending order) it or a parked event changed: read again.
            if not (exc.at(0, AlreadyExists) or isinstance(exc.error, (PreconditionFailed, NotFound))):
                raise StoreError(f"order {order.order_id}: {exc}") from exc
            taken = exc.at(0, AlreadyExists)
        if taken and (found := await effect.find(claim)) is not None and found.request_hash is not None:
            return _compare(order.order_id, found.request_hash, hash_), found
        stored = await read_order(store, order.order_id)
        if stored.order is not None or stored.foreign:
            return _compare(order.order_id, stored.order.request_hash if stored.order else None, hash_), None
        write = [Create(placed.to_document())]
        if stored.pending is not None:
            adopted = msgspec.structs.replace(placed, parked=stored.pending.parked)
            done = release(adopted, await waiting(store, settings.consumer_name, order.order_id))
            write = [Replace(done.order.to_document(), stored.pending.etag), *done.operations]
    return Result(Outcome.TRANSIENT, f"order {order.order_id} kept changing under us; retry", hash_), None


def _compare(order_id: str, stored_hash: str | None, hash_: str) -> Outcome | Result:
    if stored_hash == hash_:
        return Outcome.DUPLICATE
    return Result(
        Outcome.PAYLOAD_MISMATCH,
        f"messageId {order_id} already stored with requestHash {stored_hash}; this delivery has {hash_}",
        hash_,
    )


async def _reserve(fulfilment: FulfilmentService, key: str, order: OrderPlaced) -> EffectReply:
    return effect_reply(await fulfilment.reserve(key, reservation_request(order)))


def reservation_request(order: OrderPlaced) -> dict[str, object]:
    """The reservation the fulfilment service is asked for: the order id and its lines' quantities."""
    return {"orderId": order.order_id, "items": [{"sku": i.sku, "quantity": i.quantity} for i in order.items]}


def effect_reply(reply: Reply) -> EffectReply:
    """The fulfilment service's reply as a side-effect reply: 2xx succeeded; 408, 429, 5xx transient."""
    if 200 <= reply.status < 300:
        reference = reply.body.get("reservationId")
        return EffectReply(ReplyKind.SUCCEEDED, reply.status, reference=str(reference) if reference else None)
    if reply.status in (408, 429) or reply.status >= 500:
        return EffectReply(ReplyKind.TRANSIENT, reply.status)
    return EffectReply(ReplyKind.REJECTED, reply.status, reason=str(reply.body.get("reason", "")) or None)


def _result(created: Outcome, reservation: EffectResult, order: OrderPlaced, hash_: str) -> Result:
    if reservation.outcome is EffectOutcome.DONE:
        return Result(created, reservation.description, hash_)
    description = f"order {order.order_id}: {reservation.description}"
    return Result(_EFFECT_OUTCOMES[reservation.outcome], description, hash_)
