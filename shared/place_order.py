"""The idempotent OrderPlaced handler: the create is the duplicate check, then stock is reserved once.

One transactional batch creates the order, its OrderAccepted outbox document and the claim of the
stock reservation; the reservation call follows, and its record is finished before the message is
completed. A duplicate delivery finds the order and finishes a reservation that is not yet confirmed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.errors import BatchFailed, InvalidMessage, NotFound, StoreError, TransientStoreError
from shared.fulfilment import FulfilmentService, Reply
from shared.messages import InboundMessage
from shared.orders import Order, order_document, parse_order
from shared.outbox import outbox_document
from shared.outcomes import Outcome, Result
from shared.settings import OrderSettings
from shared.side_effects import EffectOutcome, EffectResult, SideEffect
from shared.store import Create, Document, DocumentStore

RESERVE_STOCK = "reserve-stock"
_EFFECT_OUTCOMES = {
    EffectOutcome.BUSY: Outcome.IN_PROGRESS,
    EffectOutcome.TRANSIENT: Outcome.TRANSIENT,
    EffectOutcome.REJECTED: Outcome.DOWNSTREAM_REJECTED,
}


@dataclass(frozen=True)
class OrderServices:
    """What process_order works with: the store, the fulfilment service, its settings and a clock."""

    store: DocumentStore
    fulfilment: FulfilmentService
    settings: OrderSettings
    clock: Callable[[], float] = field(default=time.time)


def place_order(message: InboundMessage, services: OrderServices) -> Result:
    """Validate; create order, outbox document and reservation claim in one batch; on 409 compare
    request hashes; then reserve stock through the two-phase record.

    There is no read before the write: a read-then-write would let two concurrent copies both see
    "absent". Errors other than those handled here propagate, and the caller abandons the message.
    """
    try:
        order = parse_order(message)
    except InvalidMessage as exc:
        return Result(Outcome.INVALID, exc.rule)
    hash_ = order.request_hash()
    effect = SideEffect(services.store, services.settings.consumer_name, RESERVE_STOCK,
                        services.settings.lease_seconds, services.clock)
    try:
        created, claim = _create(order, message, hash_, services, effect)
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"create failed: {exc}", hash_)
    if isinstance(created, Result):
        return created
    try:
        reservation = effect.run(
            partition_key=order.order_id,
            dedup_key=(order.order_id,),
            locked_until=message.locked_until_utc,
            call=lambda key: _reserve(services.fulfilment, key, order),
            claimed=claim,
        )
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"reservation record: {exc}", hash_)
    return _result(created, reservation, order, hash_)


def _create(
    order: Order, message: InboundMessage, hash_: str, services: OrderServices, effect: SideEffect
) -> tuple[Outcome | Result, Document | None]:
    """CREATED with the written claim, DUPLICATE without one, or a final Result."""
    settings = services.settings
    documents = [
        order_document(order, message, hash_),
        outbox_document(order, message, consumer=settings.consumer_name, destination=settings.outbox_destination,
                        requires_session=settings.outbox_requires_session, now=services.clock()),
        effect.claim_document(order.order_id, (order.order_id,), message.locked_until_utc),
    ]
    try:
        written = services.store.execute_batch(order.order_id, [Create(d) for d in documents])
    except BatchFailed as exc:
        if exc.index == 0 and exc.status == 409:
            return _conflict(services.store, order.order_id, hash_), None
        raise StoreError(f"order {order.order_id}: batch operation {exc.index} failed", status=exc.status) from exc
    return Outcome.CREATED, written[2]


def _conflict(store: DocumentStore, order_id: str, hash_: str) -> Outcome | Result:
    try:
        existing = store.read(order_id, order_id)
    except (TransientStoreError, NotFound) as exc:
        # NotFound: the document went away between the 409 and the read; the redelivery decides.
        return Result(Outcome.TRANSIENT, f"read after 409 failed: {exc}", hash_)
    stored_hash = existing.get("requestHash")
    if stored_hash == hash_:
        return Outcome.DUPLICATE
    return Result(
        Outcome.PAYLOAD_MISMATCH,
        f"messageId {order_id} already stored with requestHash {stored_hash}; this delivery has {hash_}",
        hash_,
    )


def _reserve(fulfilment: FulfilmentService, key: str, order: Order) -> Reply:
    request: dict[str, Any] = {
        "orderId": order.order_id,
        "items": [{"sku": i.sku, "quantity": i.quantity} for i in order.items],
    }
    return fulfilment.reserve(key, request)


def _result(created: Outcome, reservation: EffectResult, order: Order, hash_: str) -> Result:
    if reservation.outcome is EffectOutcome.DONE:
        return Result(created, reservation.description, hash_)
    description = f"order {order.order_id}: {reservation.description}"
    return Result(_EFFECT_OUTCOMES[reservation.outcome], description, hash_)
