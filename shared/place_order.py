"""The idempotent OrderPlaced handler: the create is both the duplicate check and the write."""

from __future__ import annotations

from shared.errors import AlreadyExists, InvalidMessage, NotFound, TransientStoreError
from shared.messages import InboundMessage
from shared.orders import order_document, parse_order
from shared.outcomes import Outcome, Result
from shared.store import DocumentStore


def place_order(message: InboundMessage, store: DocumentStore) -> Result:
    """Validate, then create the order document; on 409 compare request hashes.

    The happy path is one store request and there is no read before the write: a read-then-write
    would let two concurrent copies both see "absent". Errors other than those handled here
    propagate, and the caller abandons the message.
    """
    try:
        order = parse_order(message)
    except InvalidMessage as exc:
        return Result(Outcome.INVALID, exc.rule)
    hash_ = order.request_hash()
    try:
        store.create(order_document(order, message, hash_))
    except AlreadyExists:
        return _settle_conflict(store, order.order_id, hash_)
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"create failed: {exc}", hash_)
    return Result(Outcome.CREATED, request_hash=hash_)


def _settle_conflict(store: DocumentStore, order_id: str, hash_: str) -> Result:
    try:
        existing = store.read(order_id, order_id)
    except (TransientStoreError, NotFound) as exc:
        # NotFound: the document went away between the 409 and the read; the redelivery decides.
        return Result(Outcome.TRANSIENT, f"read after 409 failed: {exc}", hash_)
    stored_hash = existing.get("requestHash")
    if stored_hash == hash_:
        return Result(Outcome.DUPLICATE, request_hash=hash_)
    return Result(
        Outcome.PAYLOAD_MISMATCH,
        f"messageId {order_id} already stored with requestHash {stored_hash}; this delivery has {hash_}",
        hash_,
    )
