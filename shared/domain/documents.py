"""The order app's documents, each defined once and used by its writers and readers.

All live in the orders container, in the partition of their order, told apart by ``type``, beside the
protocol's own records (``idempotent_consumer.records``: outbox entries, side-effect records, inbox markers, event
identities, parked events), whose rules about fields this version does not model and schema versions hold
for these too. The rules live elsewhere (the order's in ``aggregate.ORDERS``); these only map JSON.

    order          OrderDocument       the order; events patch its status and version
    order-pending  PendingOrder        stands in for an order whose events came first; becomes the order
    payment, shipment, cancellation    EventRecord   what an applied event recorded, in releases before its
                                                     order's sub-object held its identity; read, never written

and the order's outcomes, ``OrderAccepted`` and ``OrderRejected``, which its outbox entry carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.records import PARTITION_FIELD, OutboxEntry, ParkedEvent, StoredDocument, unreadable
from shared.domain import identity
from shared.domain.lifecycle import KINDS, CloudEvent
from shared.domain.orders import OrderLine, OrderPlaced, utc_text

ORDER_ACCEPTED = identity.ORDER_ACCEPTED
ORDER_REJECTED = identity.ORDER_REJECTED


class OrderDocument(StoredDocument, kw_only=True, tag="order"):
    """An order: id = orderId = MessageId, the order's fields, its state, and where it came from."""

    customer_id: str
    currency: str
    items: list[OrderLine]
    total: str
    placed_at: str
    status: str
    version: int
    request_hash: str
    message_id: str | None
    correlation_id: str | None
    enqueued_time_utc: str | None
    delivery_count: int | None
    parked: int = 0
    payment: dict[str, Any] | UnsetType = UNSET
    shipment: dict[str, Any] | UnsetType = UNSET
    cancellation: dict[str, Any] | UnsetType = UNSET
    rejection: dict[str, Any] | UnsetType = UNSET  # the fulfilment service refused the order's reservation
    reservation: dict[str, Any] | UnsetType = UNSET  # the fulfilment service reserved its stock: reference, time
    # The attempt of the reservation's claim last taken over, written with the takeover on the order's open status.
    reservation_attempt: int | UnsetType = UNSET
    updated_at: str | UnsetType = UNSET

    @property
    def order_id(self) -> str:
        """The order's id: its document's id, and its partition."""
        return self.id

    @classmethod
    def placed(cls, order: OrderPlaced, message: InboundMessage, request_hash: str) -> OrderDocument:
        """A new order at version 1, status placed."""
        return cls(
            id=order.order_id, partition=order.order_id, customer_id=order.customer_id, currency=order.currency_code,
            items=list(order.items), total=order.total, placed_at=order.placed_at, status="placed", version=1,
            request_hash=request_hash, message_id=message.message_id, correlation_id=message.correlation_id,
            enqueued_time_utc=utc_text(message.enqueued_time_utc) if message.enqueued_time_utc else None,
            delivery_count=message.delivery_count,
        )


class OrderState(msgspec.Struct, kw_only=True, rename="camel"):
    """What a decision on a stored order reads of it: its state, version, count of parked events and
    requestHash. Its lines are not decoded, which the largest orders (a thousand of them) make worth it."""

    status: str
    version: int
    parked: int = 0
    request_hash: str

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> OrderState:
        """The state of a stored order; UnreadableDocument if these fields do not decode here."""
        try:
            return msgspec.convert(document, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise unreadable(document, str(exc)) from exc


class PendingOrder(StoredDocument, kw_only=True, tag="order-pending"):
    """Holds an order's id while events that came before OrderPlaced are parked; the order replaces it."""

    version: int = 0
    parked: int = 0


class OrderAccepted(msgspec.Struct, frozen=True, rename="camel"):
    """The OrderAccepted message body: the order was stored and its stock reserved."""

    order_id: str
    customer_id: str
    currency: str
    total: str
    placed_at: str


class OrderRejected(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The OrderRejected message body: the fulfilment service refused the order's reservation for good."""

    order_id: str
    customer_id: str
    refusal: str  # the service's short code for why (out-of-stock, unknown-sku...)
    reason: str | None  # the service's words, at most 200 characters
    rejected_at: str


def accepted_entry(order: OrderPlaced, message: InboundMessage, *, consumer: str, destination: str,
                   requires_session: bool, now: float) -> OutboxEntry:
    """The pending OrderAccepted entry of an order whose stock is reserved; its MessageId is derived, so
    resends are duplicates. One per order (its id is the order's), so an order never announces two outcomes."""
    accepted = OrderAccepted(order.order_id, order.customer_id, order.currency_code, order.total, order.placed_at)
    return _outcome(order.order_id, message, ORDER_ACCEPTED, identity.outbox_message_id(consumer, order.order_id),
                    accepted, consumer=consumer, destination=destination, requires_session=requires_session, now=now)


def rejected_entry(order: OrderPlaced, message: InboundMessage, rejected: OrderRejected, *, consumer: str,
                   destination: str, requires_session: bool, now: float) -> OutboxEntry:
    """The pending OrderRejected entry of an order whose reservation the service refused; under the same
    entry id as OrderAccepted, so that an order holds one outcome or the other, never both."""
    return _outcome(order.order_id, message, ORDER_REJECTED, identity.rejected_message_id(consumer, order.order_id),
                    rejected, consumer=consumer, destination=destination, requires_session=requires_session, now=now)


def _outcome(order_id: str, message: InboundMessage, subject: str, message_id: str, payload: msgspec.Struct, *,
             consumer: str, destination: str, requires_session: bool, now: float) -> OutboxEntry:
    """The pending entry of an order's outcome, under the order's one outcome id."""
    return OutboxEntry.pending(order_id, identity.outbox_id(consumer, order_id), message_id=message_id,
                               subject=subject, payload=payload, destination=destination,
                               correlation_id=message.correlation_id,
                               session_id=order_id if requires_session else None, now=now)


def cloud_event(parked: ParkedEvent) -> CloudEvent:
    """A parked event as it was validated when it was parked; UnreadableDocument if this version cannot
    decode it (a newer version parked an event of a type or shape this one does not know)."""
    if (kind := KINDS.get(parked.event_type)) is None:
        raise unreadable(msgspec.to_builtins(parked), f"event type {parked.event_type} is not one it knows")
    try:
        return msgspec.convert(parked.event, kind.model)
    except msgspec.ValidationError as exc:
        raise unreadable(msgspec.to_builtins(parked), f"its event: {exc}") from exc


def sub_object(event: CloudEvent, written: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What an applied event sets on its order, under its kind's field (``payment``, ``shipment``,
    ``cancellation``): the type's own fields and the fields of ``data`` as its producer wrote it (``written``) that
    this version does not model, as written; and the event's identity (``eventId``, ``eventSource``, ``eventTime``,
    ``sequence``), which makes the sub-object the event's record. A producer's field whose name the identity takes
    goes inside a ``data`` object, so that none changes the identity."""
    return _with_identity(_IDENTITY_FIELDS, event.data.kept(written), _identity(event), underscored=False)


def _identity(event: CloudEvent) -> dict[str, Any]:
    return {"eventId": event.id, "eventSource": event.source, "eventTime": event.time_text,
            "sequence": event.sequence}


def _with_identity(reserved: frozenset[str], kept: Mapping[str, Any], known: Mapping[str, Any], *,
                   underscored: bool = True) -> dict[str, Any]:
    """``known`` with the fields of ``kept`` beside it, except those whose names ``known`` or ``reserved`` give a
    meaning to (or, ``underscored``, that start with ``_``, as the store's own do at a document's top): those go
    inside a ``data`` object, so that none changes ``known``."""
    extra = {k: v for k, v in kept.items() if k not in known or known[k] != v}
    clashing = {k: v for k, v in extra.items()
                if k in known or k in reserved or (underscored and k.startswith("_"))}
    kept_beside = {k: v for k, v in extra.items() if k not in clashing}
    return {**kept_beside, **known, **({"data": clashing} if clashing else {})}


def event_records(documents: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every applied event's record among ``documents``, by kind (``payment``, ``shipment``, ``cancellation``): an
    order's sub-object that carries an event's identity, or a record document an earlier release wrote."""
    kinds = {kind.record_type for kind in KINDS.values()}
    for document in documents:
        kind = document.get("type")
        if kind == "order":
            for name in sorted(kinds):
                if isinstance(sub := document.get(name), Mapping) and "eventId" in sub:
                    yield name, sub
        elif kind in kinds:
            yield str(kind), document


class EventRecord(StoredDocument, kw_only=True):
    """What an applied event recorded as a document of its own, in releases before its order's sub-object held
    its identity (``sub_object``). This version writes none; the records written before stay (they never
    expire), and this model reads them."""

    event_id: str
    event_source: str
    event_time: str
    sequence: int

    @staticmethod
    def document(event: CloudEvent, written: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The record an earlier release wrote when the event applied, as JSON: its own fields, and the fields of
        ``data`` as its producer wrote it (``written``) that this version does not model, as written. Beside the
        record's own, except those whose names the record or the store already give a meaning to (``id``, ``ttl``,
        ``_ts``, a field of the record...): those go inside a ``data`` object, so that none changes the record."""
        return _with_identity(_RESERVED, event.data.kept(written), EventRecord.of(event).to_document())

    @staticmethod
    def of(event: CloudEvent) -> EventRecord:
        """The record an earlier release wrote when the event applied."""
        records = {c.__struct_config__.tag: c for c in EventRecord.__subclasses__()}
        record_type: type[EventRecord] = records[event.kind.record_type]
        data = event.data.canonical()
        label = str(data.get("paymentId") or data.get("shipmentId") or event.order_id)
        known = {"id": identity.event_record_id(event.kind.record_type, event.source, event.id, label),
                 PARTITION_FIELD: event.order_id, **_identity(event)}
        return msgspec.convert({**data, **known}, record_type)


class PaymentRecord(EventRecord, kw_only=True, tag="payment"):
    """A captured payment."""

    payment_id: str
    amount: str
    currency: str


class ShipmentRecord(EventRecord, kw_only=True, tag="shipment"):
    """A shipment."""

    shipment_id: str
    carrier: str
    tracking_number: str


class CancellationRecord(EventRecord, kw_only=True, tag="cancellation"):
    """A cancellation."""

    reason: str



# Names the store or the record's kind give a meaning to, which a producer's field must not take on a record.
_IDENTITY_FIELDS = frozenset({"eventId", "eventSource", "eventTime", "sequence", "data"})
_RESERVED = frozenset({"id", "type", "orderId", "schemaVersion", "ttl", *_IDENTITY_FIELDS})
