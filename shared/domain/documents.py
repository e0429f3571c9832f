"""Every kind of document the consumer stores, each defined once and used by its writers and readers.

All live in the orders container, in the partition of their order, told apart by ``type``. The container is
partitioned by ``/orderId`` (``PARTITION_FIELD``), and every kind names its partition key ``partition`` in
code: the order's id for all but ``EventIdentity``, whose own id is its partition. A kind is a msgspec
Struct: ``to_document`` gives the JSON a create writes and ``from_document`` reads a stored one back, etag
included. Code elsewhere reads attributes, never
string keys. The rules live elsewhere (the order's in ``aggregate.Order``); these only map JSON. A
stored document is changed by a patch of the fields that change (``with_changes`` names them), or,
where more change than one patch takes (an order taking a pending order's place), by merging the
changes into it as read (``merged``); never rewritten from a Struct, which would drop the fields
this version does not model.

Every document the core creates carries ``schemaVersion`` (``SCHEMA_VERSION``; a document without one
was written before it was kept, and reads as 1): the version whose shape its body was written in. A
newer version only adds fields and document types. So an older version reads the fields it knows and
ignores the rest; it writes by patch or by merging into the document as read, so the newer fields
survive. A patch never sets ``schemaVersion`` (it writes fields every later version has too); a write of
a whole body (an order taking a pending order's place) sets its own, since the body is now its shape,
with the other version's fields kept beside it.
A stored document that does not decode under this version's model (a newer version broke the rule)
raises ``UnreadableDocument``, naming both versions and the rule; what the handlers do then is in
docs/design.md ("Schema versions").

    order          OrderDocument       the order; events patch its status and version
    order-pending  PendingOrder        stands in for an order whose events came first; becomes the order
    outbox         OutboxEntry         the order's outcome (OrderAccepted or OrderRejected) waiting to be published
    side-effect    SideEffectRecord    the two-phase record of a call that cannot join a transaction
    inbox          InboxMarker         one consumer has applied (or parked) one event
    event-identity EventIdentity       one consumer has taken an event's identity for one subject; in a
                                       partition of its own (its partition key is its id), not its order's
    parked-event   ParkedEvent         an event that came before its predecessor, waiting for it
    payment, shipment, cancellation    EventRecord   what an applied event recorded
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Self

import msgspec
from msgspec import UNSET, UnsetType

from shared.domain import identity
from shared.domain.lifecycle import KINDS, CloudEvent
from shared.domain.messages import InboundMessage
from shared.domain.orders import OrderLine, OrderPlaced, utc_text
from shared.errors import UnreadableDocument

TYPE_FIELD = "type"
#: The JSON field that holds every document's partition key: the orders container is partitioned by ``/orderId``
#: (infra/modules/cosmos.bicep). The in-memory store reads the same field.
PARTITION_FIELD = "orderId"
# The version of the documents' shapes this code writes. A newer version that only adds fields and
# document types (the rule above) still raises it, so that a reader can tell which wrote a document.
SCHEMA_VERSION = 1
SCHEMA_FIELD = "schemaVersion"
ORDER_ACCEPTED = identity.ORDER_ACCEPTED
ORDER_REJECTED = identity.ORDER_REJECTED
# Written by Cosmos DB itself; a document written back leaves them to the store.
SYSTEM_PROPERTIES = frozenset({"_rid", "_self", "_etag", "_attachments", "_ts", "_lsn"})


def merged(document: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A stored document with ``changes`` set: every other field kept, the store's own left to it, and the
    changes' ``schemaVersion`` when they hold one (a whole body written: its shape is the writer's); a
    sub-object of the document that the changes set too keeps the fields they do not."""
    kept = {k: v for k, v in document.items() if k not in SYSTEM_PROPERTIES}
    return {**kept, **{k: {**kept[k], **v} if isinstance(v, Mapping) and isinstance(kept.get(k), Mapping) else v
                       for k, v in changes.items()}}


def schema_version(document: Mapping[str, Any]) -> int | None:
    """The schema version a stored document was written under: 1 when it names none, None when it names
    one that is not a number."""
    version = document.get(SCHEMA_FIELD, 1)
    return version if isinstance(version, int) and not isinstance(version, bool) else None


@functools.cache
def _json_names(kind: type[msgspec.Struct]) -> dict[str, str]:
    """A kind's attribute names and the JSON names they are stored under."""
    return dict(zip(kind.__struct_fields__, kind.__struct_encode_fields__, strict=True))


class StoredDocument(msgspec.Struct, kw_only=True, rename="camel", tag_field=TYPE_FIELD):
    """Fields every kind has: its id, its partition key (stored as ``PARTITION_FIELD``), the schema version it was
    written under and, once read, its etag."""

    id: str
    partition: str = msgspec.field(name=PARTITION_FIELD)
    schema_version: int = SCHEMA_VERSION
    etag: str | None = msgspec.field(default=None, name="_etag")

    def to_document(self) -> dict[str, Any]:
        """The JSON document to write; the etag is the store's and is never written back."""
        document: dict[str, Any] = msgspec.to_builtins(self)
        document.pop("_etag", None)
        return document

    def with_changes(self, **changes: Any) -> tuple[Self, dict[str, Any]]:
        """This document with ``changes`` made (attribute names), and the same changes as the JSON
        fields a patch sets: only those, so that every other stored field is kept."""
        names = _json_names(type(self))
        fields: dict[str, Any] = msgspec.to_builtins({names[name]: value for name, value in changes.items()})
        return msgspec.structs.replace(self, **changes), fields

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Self:
        """Read a stored document of this kind, ignoring the fields it does not model; UnreadableDocument
        if it does not decode as one (naming the rule and the path, never a value)."""
        try:
            return msgspec.convert(document, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise unreadable(document, str(exc)) from exc

    @classmethod
    def is_kind(cls, document: Mapping[str, Any]) -> bool:
        """Whether a raw document (from a query or the change feed) is of this kind."""
        tag = cls.__struct_config__.tag
        return bool(document.get(TYPE_FIELD) == tag)


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


class OutboxStatus(StrEnum):
    """Where an outbox entry is in its life."""

    PENDING = "pending"
    DISPATCHED = "dispatched"


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


class OutboxEntry(StoredDocument, kw_only=True, tag="outbox"):
    """An outgoing message: the order's outcome, written in the batch that finishes the order's reservation and
    published afterwards. One per order (its id is the order's), so an order never announces two outcomes.

    The payload is kept as JSON, as it was written: the publisher sends it as stored, so the fields a newer
    version wrote into it reach the destination.
    """

    status: OutboxStatus
    destination: str
    message_id: str
    correlation_id: str | None
    session_id: str | None
    subject: str
    payload: dict[str, Any]
    created_at: float
    dispatched_at: float | UnsetType = UNSET
    ttl: int | UnsetType = UNSET

    @classmethod
    def order_accepted(
        cls, order: OrderPlaced, message: InboundMessage, *, consumer: str, destination: str, requires_session: bool,
        now: float,
    ) -> OutboxEntry:
        """The pending OrderAccepted entry of an order whose stock is reserved; its MessageId is derived, so
        resends are duplicates."""
        accepted = OrderAccepted(order.order_id, order.customer_id, order.currency_code, order.total, order.placed_at)
        return cls._outcome(order.order_id, message, ORDER_ACCEPTED, identity.outbox_message_id(consumer,
                            order.order_id), accepted, consumer=consumer, destination=destination,
                            requires_session=requires_session, now=now)

    @classmethod
    def order_rejected(
        cls, order: OrderPlaced, message: InboundMessage, rejected: OrderRejected, *, consumer: str, destination: str,
        requires_session: bool, now: float,
    ) -> OutboxEntry:
        """The pending OrderRejected entry of an order whose reservation the service refused; under the same
        entry id as OrderAccepted, so that an order holds one outcome or the other, never both."""
        return cls._outcome(order.order_id, message, ORDER_REJECTED, identity.rejected_message_id(consumer,
                            order.order_id), rejected, consumer=consumer, destination=destination,
                            requires_session=requires_session, now=now)

    @classmethod
    def _outcome(cls, order_id: str, message: InboundMessage, subject: str, message_id: str, payload: msgspec.Struct,
                 *, consumer: str, destination: str, requires_session: bool, now: float) -> OutboxEntry:
        """The pending entry of an order's outcome, under the order's one outcome id."""
        return cls(
            id=identity.outbox_id(consumer, order_id), partition=order_id, status=OutboxStatus.PENDING,
            destination=destination, message_id=message_id, correlation_id=message.correlation_id,
            session_id=order_id if requires_session else None, subject=subject, created_at=now,
            payload=msgspec.to_builtins(payload),
        )

    def body(self) -> bytes:
        """The message body: the payload as stored, as compact JSON (every field kept, a newer version's too)."""
        return msgspec.json.encode(self.payload)

    @staticmethod
    def pending_before(cutoff: float) -> tuple[dict[str, Any], tuple[str, Any]]:
        """Query conditions for entries still pending that were created before ``cutoff``."""
        return {TYPE_FIELD: "outbox", "status": OutboxStatus.PENDING.value}, ("createdAt", cutoff)


class EffectStatus(StrEnum):
    """Status of a side-effect record."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"  # the downstream did it
    REJECTED = "rejected"  # the downstream refused it for good, and said why: the business outcome
    # Written by versions before REJECTED: any answer that was neither 2xx nor transient. Read as a claim whose
    # lease has ended, which the next delivery (an operator's resubmission) takes over and calls again.
    FAILED = "failed"


class SideEffectRecord(StoredDocument, kw_only=True, tag="side-effect"):
    """The two-phase record of one named effect of one message: claimed, then completed or failed."""

    consumer: str
    effect: str
    idempotency_key: str
    status: EffectStatus
    attempt: int
    lease_until: float
    message_sequence: int | None = None
    # The claiming message's requestHash, so that a copy's one read tells both whether it is the same
    # content and the effect's state. None on records claimed before it was kept.
    request_hash: str | None = None
    response_status: int | None = None
    reference: str | None = None
    refusal: str | None = None  # the downstream's code for why it refused, when REJECTED
    # True on a claim whose finish writes the order's outcome (this version's claims); then ``announced`` says the
    # finish did. A claim an earlier version wrote announced OrderAccepted at its intake, and says neither.
    announces: bool | None = None
    announced: bool | None = None
    reason: str | None = None
    finished_at: float | None = None

    @staticmethod
    def in_progress() -> dict[str, Any]:
        """Query conditions for records still in progress."""
        return {TYPE_FIELD: "side-effect", "status": EffectStatus.IN_PROGRESS.value}


class InboxMarker(StoredDocument, kw_only=True, tag="inbox"):
    """One consumer has applied one message; it expires after ``ttl`` seconds."""

    consumer: str
    request_hash: str
    ttl: int
    event_type: str | UnsetType = UNSET
    event_time: str | UnsetType = UNSET
    event_id: str | UnsetType = UNSET
    # True when the event's release took more batches than its marker's: a redelivery that finds the marker
    # finishes the release (docs/design.md, "Limits"). Absent otherwise.
    releasing: bool | UnsetType = UNSET

    @classmethod
    def of(cls, event: CloudEvent, consumer: str, request_hash: str, ttl: int) -> InboxMarker:
        """The marker of one consumer's event, with the event's type, time and id kept for operators."""
        return cls(id=identity.inbox_marker_id(consumer, event.source, event.id), partition=event.order_id,
                   consumer=consumer, request_hash=request_hash, ttl=ttl, event_type=event.type,
                   event_time=event.time_text, event_id=event.id)


class EventIdentity(StoredDocument, kw_only=True, tag="event-identity"):
    """One consumer took an event's identity (its ``source`` and ``id``) for the content it first came with, its
    subject included (``requestHash`` covers it). Its partition is its own: ``partition`` is its id, since an
    identity belongs to no one order. It expires after ``ttl`` seconds, with the inbox markers."""

    consumer: str
    event_source: str
    event_id: str
    subject: str
    request_hash: str
    ttl: int

    @classmethod
    def of(cls, event: CloudEvent, consumer: str, request_hash: str, ttl: int) -> EventIdentity:
        """The identity record of one consumer's event, for the event's content as it came."""
        doc_id = identity.event_identity_id(consumer, event.source, event.id)
        return cls(id=doc_id, partition=doc_id, consumer=consumer, event_source=event.source, event_id=event.id,
                   subject=event.subject, request_hash=request_hash, ttl=ttl)


class ParkedStatus(StrEnum):
    """Where a parked event is: waiting, or set aside for good (recorded, never deleted unseen)."""

    PARKED = "parked"
    REJECTED = "rejected"  # released onto an order whose state forbids it
    DROPPED = "dropped"  # an operator dropped it


class ParkedEvent(StoredDocument, kw_only=True, tag="parked-event"):
    """A lifecycle event that arrived before its predecessor; its message was completed."""

    consumer: str
    sequence: int
    event_type: str
    event_id: str
    event_source: str
    message_id: str | None
    request_hash: str
    parked_at: float
    status: ParkedStatus = ParkedStatus.PARKED
    reason: str | None = None  # why it was set aside; or, still parked, why it waits other than for its turn
    counted: bool = True  # whether parking it counted it on its order (not when the order did not decode)
    event: dict[str, Any]

    @classmethod
    def of(cls, event: CloudEvent, *, consumer: str, message_id: str | None, request_hash: str,
           now: float, content: Mapping[str, Any] | None = None, reason: str | None = None,
           counted: bool | None = None) -> ParkedEvent:
        """The parked copy of an event: ``content``, the event as its producer wrote it (every field kept, a newer
        producer's too), which ``cloud_event`` turns back into the validated event; with a ``reason`` (why it
        waits, other than for its predecessor), parked uncounted unless ``counted`` says otherwise."""
        return cls(
            id=identity.parked_event_id(consumer, event.source, event.id, event.sequence),
            partition=event.order_id, consumer=consumer, sequence=event.sequence, event_type=event.type,
            event_id=event.id, event_source=event.source, message_id=message_id, request_hash=request_hash,
            parked_at=now, reason=reason, counted=reason is None if counted is None else counted,
            event=dict(content) if content is not None else msgspec.to_builtins(event),
        )

    @property
    def data(self) -> Mapping[str, Any] | None:
        """The event's ``data`` as its producer wrote it, which its release stores as written."""
        data = self.event.get("data")
        return data if isinstance(data, Mapping) else None

    def cloud_event(self) -> CloudEvent:
        """The event as it was validated when it was parked; UnreadableDocument if this version cannot
        decode it (a newer version parked an event of a type or shape this one does not know)."""
        if (kind := KINDS.get(self.event_type)) is None:
            raise unreadable(msgspec.to_builtins(self), f"event type {self.event_type} is not one it knows")
        try:
            return msgspec.convert(self.event, kind.model)
        except msgspec.ValidationError as exc:
            raise unreadable(msgspec.to_builtins(self), f"its event: {exc}") from exc

    @classmethod
    def read_leniently(cls, document: Mapping[str, Any]) -> ParkedEvent | UnreadableParked:
        """Read a stored parked event; one that does not decode here as the fields of it that still read."""
        try:
            return cls.from_document(document)
        except UnreadableDocument as exc:
            return UnreadableParked.of(document, exc)

    @staticmethod
    def waiting(consumer: str) -> dict[str, Any]:
        """Query conditions for the events one consumer has parked and still waits to apply."""
        return {**ParkedEvent.of_consumer(consumer), "status": ParkedStatus.PARKED.value}

    @staticmethod
    def of_consumer(consumer: str) -> dict[str, Any]:
        """Query conditions for every event one consumer parked, set aside or not."""
        return {TYPE_FIELD: "parked-event", "consumer": consumer}


class UnreadableParked(msgspec.Struct, frozen=True, kw_only=True):
    """A parked event that does not decode here (a newer version's), by the fields of it that still read:
    a release stops at it, and leaves it parked and counted as it was."""

    id: str
    sequence: int | None  # None when that does not read either: it then holds back every parked event
    counted: bool
    reason: str  # the UnreadableDocument's: the document, both versions and the rule

    @classmethod
    def of(cls, document: Mapping[str, Any], error: UnreadableDocument) -> UnreadableParked:
        """What still reads of a parked event that does not decode. Counted unless it says otherwise, as
        the model's default is: a count too high only sends the next event through a read."""
        sequence, counted = document.get("sequence"), document.get("counted", True)
        readable = isinstance(sequence, int) and not isinstance(sequence, bool)
        return cls(id=error.doc_id, sequence=sequence if readable else None,
                   counted=counted if isinstance(counted, bool) else True, reason=str(error))


class EventRecord(StoredDocument, kw_only=True):
    """What an applied event recorded: its identity, sequence and the type's own fields. It never expires."""

    event_id: str
    event_source: str
    event_time: str
    sequence: int

    @staticmethod
    def document(event: CloudEvent, written: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The record an event writes when it applies, as JSON: its own fields, and the fields of ``data`` as its
        producer wrote it (``written``) that this version does not model, as written. Beside the record's own,
        except those whose names the record or the store already give a meaning to (``id``, ``ttl``, ``_ts``, a
        field of the record...): those go inside a ``data`` object, so that none changes the record."""
        record = EventRecord.of(event).to_document()
        extra = {k: v for k, v in event.data.kept(written).items() if k not in record or record[k] != v}
        clashing = {k: v for k, v in extra.items() if k in record or k in _RESERVED or k.startswith("_")}
        kept = {k: v for k, v in extra.items() if k not in clashing}
        return {**kept, **record, **({"data": clashing} if clashing else {})}

    @staticmethod
    def of(event: CloudEvent) -> EventRecord:
        """The record an event writes when it applies."""
        records = {c.__struct_config__.tag: c for c in EventRecord.__subclasses__()}
        record_type: type[EventRecord] = records[event.kind.record_type]
        data = event.data.canonical()
        label = str(data.get("paymentId") or data.get("shipmentId") or event.order_id)
        known = {"id": identity.event_record_id(event.kind.record_type, event.source, event.id, label),
                 PARTITION_FIELD: event.order_id, "eventId": event.id, "eventSource": event.source,
                 "eventTime": event.time_text, "sequence": event.sequence}
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
_RESERVED = frozenset({"id", "type", "orderId", "schemaVersion", "ttl", "data", "eventId", "eventSource", "eventTime",
                       "sequence"})


def unreadable(document: Mapping[str, Any], rule: str) -> UnreadableDocument:
    """The error for a stored document this version cannot decode: its kind, id and schema version, this
    version's, and msgspec's rule; with its requestHash when that one field still reads."""
    doc_id, request_hash = str(document.get("id")), document.get("requestHash")
    return UnreadableDocument(
        f"{document.get(TYPE_FIELD)} {doc_id} (schemaVersion {document.get(SCHEMA_FIELD, 1)}) does not decode under"
        f" schema version {SCHEMA_VERSION}: {rule}", doc_id=doc_id, schema_version=schema_version(document),
        request_hash=request_hash if isinstance(request_hash, str) else None)
