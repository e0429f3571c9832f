"""The protocol's own records, which the consumer stores beside the business documents it writes.

They live in the container of the documents they guard, in the partition of the key they guard, told apart
by ``type``. Every kind names its partition key ``partition`` in code, stored under one JSON field,
``PARTITION_FIELD`` (the container's partition key path). A kind is a msgspec Struct: ``to_document``
gives the JSON a create writes and ``from_document`` reads a stored one back, etag included. Code
elsewhere reads attributes, never string keys. A stored document is changed by a patch of the fields that
change (``with_changes`` names them), or, where more change than one patch takes, by merging the changes
into it as read (``merged``); never rewritten from a Struct, which would drop the fields this version does
not model.

Every document the core creates carries ``schemaVersion`` (``SCHEMA_VERSION``; a document without one
was written before it was kept, and reads as 1): the version whose shape its body was written in. A
newer version only adds fields and document types. So an older version reads the fields it knows and
ignores the rest; it writes by patch or by merging into the document as read, so the newer fields
survive. A patch never sets ``schemaVersion`` (it writes fields every later version has too); a write of
a whole body sets its own, since the body is now its shape, with the other version's fields kept beside
it. A stored document that does not decode under this version's model (a newer version broke the rule)
raises ``UnreadableDocument``, naming both versions and the rule; what the handlers do then is in
docs/design.md ("Schema versions").

    outbox         OutboxEntry         an outgoing message waiting to be published
    side-effect    SideEffectRecord    the two-phase record of a call that cannot join a transaction
    inbox          InboxMarker         one consumer has applied (or parked) one event
    event-identity EventIdentity       one consumer has taken an event's identity for one subject; in a
                                       partition of its own (its partition key is its id), not its subject's
    parked-event   ParkedEvent         an event that came before its predecessor, waiting for it
    key            KeyMarker           one consumer has taken one message key (a plan's duplicate check); in the
                                       key's partition, or in one of its own for a key of ``global`` scope

The business documents (the order app's: ``shared.domain.documents``) derive from ``StoredDocument`` too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, Self

import msgspec
from msgspec import UNSET, UnsetType

from idempotent_consumer import identity
from idempotent_consumer.errors import UnreadableDocument

TYPE_FIELD = "type"
#: The JSON field that holds every document's partition key: the orders container is partitioned by ``/orderId``
#: (infra/modules/cosmos.bicep). The in-memory store reads the same field.
PARTITION_FIELD = "orderId"
# The version of the documents' shapes this code writes. A newer version that only adds fields and
# document types (the rule above) still raises it, so that a reader can tell which wrote a document.
SCHEMA_VERSION = 1
SCHEMA_FIELD = "schemaVersion"
#: When the timers may look for a record (a pending outbox entry, a claim in progress, an event still parked), None
#: once they never need to: with ``type``, the only field their queries filter on, so that the orders container's
#: indexing policy includes these two and the partition key, and nothing else (infra/orders-indexing-policy.json).
DUE_FIELD = "due"
#: The ``type`` of each of the library's records: a consumer's own documents may not use them.
RECORD_TYPES = frozenset({"outbox", "side-effect", "inbox", "event-identity", "parked-event", "key"})
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
        """The JSON document to write; the etag is the store's and is never written back. A kind the timers look
        for carries its ``due`` (``DUE_FIELD``)."""
        document: dict[str, Any] = msgspec.to_builtins(self)
        document.pop("_etag", None)
        if self.timed:
            document[DUE_FIELD] = self.due()
        return document

    #: Whether the timers (the outbox sweep, the stuck report) look for this kind: then it carries ``due``.
    timed: ClassVar[bool] = False

    def due(self) -> float | None:
        """When the timers may look for this document: the one field their queries filter on beside ``type``, so
        that the orders container indexes no other. None once they never need to, and for a kind not ``timed``."""
        return None

    def with_changes(self, **changes: Any) -> tuple[Self, dict[str, Any]]:
        """This document with ``changes`` made (attribute names), and the same changes as the JSON
        fields a patch sets: only those, so that every other stored field is kept; and, on a kind the timers
        look for, its ``due`` as the changes leave it (set on a document written before it was kept, too)."""
        names = _json_names(type(self))
        fields: dict[str, Any] = msgspec.to_builtins({names[name]: value for name, value in changes.items()})
        changed = msgspec.structs.replace(self, **changes)
        if self.timed:
            fields[DUE_FIELD] = changed.due()
        return changed, fields

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


class Event(Protocol):
    """What the records read of an ordered event: its identity (``source``, ``id``), its type, its ``subject``
    (the key whose partition holds its records), its ``sequence`` on that subject and its time as text."""

    @property
    def id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def sequence(self) -> int: ...
    @property
    def time_text(self) -> str: ...


class OutboxStatus(StrEnum):
    """Where an outbox entry is in its life."""

    PENDING = "pending"
    DISPATCHED = "dispatched"


class OutboxEntry(StoredDocument, kw_only=True, tag="outbox"):
    """An outgoing message, written in the batch of the work it announces and published afterwards.

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
    def pending(cls, partition: str, entry_id: str, *, message_id: str, subject: str, payload: msgspec.Struct,
                destination: str, correlation_id: str | None, session_id: str | None, now: float) -> OutboxEntry:
        """A pending entry: ``payload`` to be sent to ``destination`` under ``message_id`` (derived, so that
        resends are duplicates), in ``partition`` under ``entry_id``."""
        return cls(
            id=entry_id, partition=partition, status=OutboxStatus.PENDING, destination=destination,
            message_id=message_id, correlation_id=correlation_id, session_id=session_id, subject=subject,
            created_at=now, payload=msgspec.to_builtins(payload),
        )

    def body(self) -> bytes:
        """The message body: the payload as stored, as compact JSON (every field kept, a newer version's too)."""
        return msgspec.json.encode(self.payload)

    timed: ClassVar[bool] = True

    def due(self) -> float | None:
        """Pending: from its creation (the sweep sends what the change feed left); sent, never."""
        return self.created_at if self.status is OutboxStatus.PENDING else None

    @staticmethod
    def pending_before(cutoff: float) -> tuple[dict[str, Any], tuple[str, Any]]:
        """Query conditions for entries still pending that were created before ``cutoff``: by ``due``."""
        return {TYPE_FIELD: "outbox"}, (DUE_FIELD, cutoff)


class EffectStatus(StrEnum):
    """Status of a side-effect record."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"  # the downstream did it
    REJECTED = "rejected"  # the downstream refused it for good, and said why: the business outcome
    # A status an app's earlier versions wrote is the app's to read (``SideEffect.upgrade``): the order app's
    # ``failed`` reads as a claim whose lease has ended.


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
    # Kept inside its subject's document (``SideEffect.within``): how many writes it has had, which each write raises
    # and is conditioned on, since the document's etag moves with every write of the subject too. Unset on a record
    # of its own, which its own etag guards.
    rev: int | UnsetType = UNSET

    timed: ClassVar[bool] = True

    def due(self) -> float | None:
        """In progress: from the end of its lease (the stuck report names what stays past it); finished, never."""
        return self.lease_until if self.status is EffectStatus.IN_PROGRESS else None

    @staticmethod
    def in_progress_before(cutoff: float) -> tuple[dict[str, Any], tuple[str, Any]]:
        """Query conditions for records still in progress whose lease ended before ``cutoff``: by ``due``."""
        return {TYPE_FIELD: "side-effect"}, (DUE_FIELD, cutoff)


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
    def of(cls, event: Event, consumer: str, request_hash: str, ttl: int) -> InboxMarker:
        """The marker of one consumer's event, with the event's type, time and id kept for operators."""
        return cls(id=identity.inbox_marker_id(consumer, event.source, event.id), partition=event.subject,
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
    def of(cls, event: Event, consumer: str, request_hash: str, ttl: int) -> EventIdentity:
        """The identity record of one consumer's event, for the event's content as it came."""
        doc_id = identity.event_identity_id(consumer, event.source, event.id)
        return cls(id=doc_id, partition=doc_id, consumer=consumer, event_source=event.source, event_id=event.id,
                   subject=event.subject, request_hash=request_hash, ttl=ttl)


class KeyMarker(StoredDocument, kw_only=True, tag="key"):
    """One consumer has taken one message key for the content it first came with (``requestHash``): created in the
    batch of the plan's writes (``idempotent_consumer.plan``), it is their duplicate check. Kept for ``ttl`` seconds,
    when it names one, else as long as the container keeps documents."""

    consumer: str
    key: str
    request_hash: str
    ttl: int | UnsetType = UNSET


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
    def of(cls, event: Event, *, consumer: str, message_id: str | None, request_hash: str,
           now: float, content: Mapping[str, Any] | None = None, reason: str | None = None,
           counted: bool | None = None) -> ParkedEvent:
        """The parked copy of an event: ``content``, the event as its producer wrote it (every field kept, a newer
        producer's too), which the consumer's own decoding turns back into the validated event; with a
        ``reason`` (why it waits, other than for its predecessor), parked uncounted unless ``counted`` says
        otherwise."""
        return cls(
            id=identity.parked_event_id(consumer, event.source, event.id, event.sequence),
            partition=event.subject, consumer=consumer, sequence=event.sequence, event_type=event.type,
            event_id=event.id, event_source=event.source, message_id=message_id, request_hash=request_hash,
            parked_at=now, reason=reason, counted=reason is None if counted is None else counted,
            event=dict(content) if content is not None else msgspec.to_builtins(event),
        )

    @property
    def data(self) -> Mapping[str, Any] | None:
        """The event's ``data`` as its producer wrote it, which its release stores as written."""
        data = self.event.get("data")
        return data if isinstance(data, Mapping) else None

    @classmethod
    def read_leniently(cls, document: Mapping[str, Any]) -> ParkedEvent | UnreadableParked:
        """Read a stored parked event; one that does not decode here as the fields of it that still read."""
        try:
            return cls.from_document(document)
        except UnreadableDocument as exc:
            return UnreadableParked.of(document, exc)

    timed: ClassVar[bool] = True

    def due(self) -> float | None:
        """Still parked: from when it was parked (the stuck report names what waits too long); set aside, never."""
        return self.parked_at if self.status is ParkedStatus.PARKED else None

    #: Query conditions for every parked event, of every consumer, set aside or not: the one indexed path
    #: (``type``) a query of them filters on, the rest filtered as read (``waits_for``, ``of_consumer``).
    KIND: ClassVar[Mapping[str, Any]] = MappingProxyType({TYPE_FIELD: "parked-event"})

    @staticmethod
    def parked_before(cutoff: float) -> tuple[dict[str, Any], tuple[str, Any]]:
        """Query conditions for events still parked since before ``cutoff``, of every consumer: by ``due``."""
        return dict(ParkedEvent.KIND), (DUE_FIELD, cutoff)

    @staticmethod
    def of_consumer(consumer: str, document: Mapping[str, Any]) -> bool:
        """Whether a parked event, as read, is one ``consumer`` parked, set aside or not."""
        return document.get("consumer") == consumer

    @staticmethod
    def waits_for(consumer: str, document: Mapping[str, Any]) -> bool:
        """Whether a parked event, as read, is one ``consumer`` parked and still waits to apply."""
        return document.get("consumer") == consumer and document.get("status") == ParkedStatus.PARKED.value


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


def unreadable(document: Mapping[str, Any], rule: str) -> UnreadableDocument:
    """The error for a stored document this version cannot decode: its kind, id and schema version, this
    version's, and msgspec's rule; with its requestHash when that one field still reads."""
    doc_id, request_hash = str(document.get("id")), document.get("requestHash")
    return UnreadableDocument(
        f"{document.get(TYPE_FIELD)} {doc_id} (schemaVersion {document.get(SCHEMA_FIELD, 1)}) does not decode under"
        f" schema version {SCHEMA_VERSION}: {rule}", doc_id=doc_id, schema_version=schema_version(document),
        request_hash=request_hash if isinstance(request_hash, str) else None)


#: Every JSON field one of the library's records has: a container's partition key path must not be one of them but
#: ``PARTITION_FIELD`` (where the records keep their partition key).
RECORD_FIELDS = frozenset(name for kind in (OutboxEntry, SideEffectRecord, InboxMarker, EventIdentity, ParkedEvent,
                                            KeyMarker) for name in _json_names(kind).values()) | {TYPE_FIELD}
