"""The plan: what a handler declares for one message, and the intake that carries it out effectively once.

A handler does not write: it returns a ``Plan`` of what the message makes (documents to create, messages to
send, effects to call, and what to send once an effect has answered), and the library writes it. Declared, not
performed, because the protocol's guarantee is that the duplicate check and the writes commit together:

    one transactional batch, in the key's partition:
        Create KeyMarker(consumer, key, requestHash)       the duplicate check
        Create each of plan.create                         the handler's documents
        Create an OutboxEntry for each of plan.send        sent by the outbox publisher afterwards
        Create a SideEffectRecord (in progress) per effect the claim, before any call
    then, for each effect: call it under its idempotency key, and finish its record in one batch with the
    outbox entries its ``on_done`` (or ``on_refused``) declares.

A 409 on the marker is a duplicate only when the stored requestHash matches: the redelivery then finishes what
the first delivery left (an effect in progress is taken over under the same key, an unannounced outcome
announced), and writes nothing again. Another hash is PAYLOAD_MISMATCH, dead-lettered naming both hashes. A 409
on any other document of the plan, with no marker standing, is a document that is not this key's (another
writer's, or one whose marker expired): also dead-lettered, never overwritten, never dropped.

Every id is derived from (consumer, name, key): an outgoing message's MessageId and its outbox entry's id, an
effect's record id and its idempotency key (``idempotent_consumer.identity``). So a plan names each effect and
each outgoing message, and a name is used once per plan.

Dedup scope (``Scope``): a key is unique within its partition (``PARTITION``, the default, one request for the
intake), or across the container (``GLOBAL``: a KeyMarker in the key's own partition is created first, and its
hash covers the partition, so that the same key under another partition is a PayloadMismatch; one request more).
Choose ``GLOBAL`` whenever the key does not determine the partition.

Limits: the intake is one batch, so a plan's documents, entries and claims are at most 100 operations and 2 MB
together, and each document at most 2 MB (Cosmos DB's limits); each outgoing body at most 256 KB (Service Bus
Standard's message). A plan past one is not written: LIMIT_EXCEEDED, dead-lettered naming the limit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from idempotent_consumer import identity
from idempotent_consumer.errors import (
    AlreadyExists,
    BatchFailed,
    BatchTooLarge,
    DownstreamUnavailable,
    NotFound,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
)
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import BatchOperation, Create, Document, DocumentStore, check_batch
from idempotent_consumer.records import (
    PARTITION_FIELD,
    RECORD_TYPES,
    TYPE_FIELD,
    EffectStatus,
    KeyMarker,
    OutboxEntry,
    OutboxStatus,
    SideEffectRecord,
)
from idempotent_consumer.side_effects import Reply, SideEffect

#: An outgoing body, at most: Service Bus Standard's 256 KB message (whatever the tier), less the room the sender
#: keeps for a batch's envelope and the message's own properties (``adapters.servicebus.BATCH_ENVELOPE_BYTES``), so
#: that an entry written is one that can be sent.
MAX_OUTGOING_BODY_BYTES = 256 * 1024 - 1024
OUTGOING_LIMIT = (f"Service Bus Standard's 256 KB message, less 1 KB for its envelope and properties:"
                  f" {MAX_OUTGOING_BODY_BYTES} bytes of body")
#: Characters Cosmos DB refuses in an id.
ID_FORBIDDEN = frozenset("/\\?#")


class Scope(StrEnum):
    """Where a key is unique: within its partition, or across the container."""

    PARTITION = "partition"
    GLOBAL = "global"


@dataclass(frozen=True)
class Send:
    """An outgoing message: ``body`` (a msgspec Struct, a dataclass or a mapping) sent as JSON to ``to``, a queue or
    topic, once, under a MessageId derived from (consumer, ``name``, key). ``subject`` defaults to ``name``."""

    name: str
    body: Any
    to: str
    subject: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class Answer:
    """What an effect's call answered, as its record keeps it: given to ``on_done`` and ``on_refused``."""

    status: int
    reference: str | None
    reason: str | None
    refusal: str | None


Announcement = Callable[[Answer], Sequence[Send]]


@dataclass(frozen=True)
class Effect:
    """A call that cannot join the batch (an HTTP request, say), made at most once in effect: ``call`` is given the
    effect's idempotency key, which it must send on (the downstream drops a repeat), and answers with a ``Reply``.
    ``on_done`` and ``on_refused`` declare what is sent once it answered: written with its record's finish."""

    name: str
    call: Callable[[str], Awaitable[Reply]]
    on_done: Announcement | None = None
    on_refused: Announcement | None = None


@dataclass(frozen=True)
class Plan:
    """What one message makes: ``create`` (documents in the key's partition), ``send`` (messages), and effects
    (``effect``, or several in ``effects``); ``on_done`` and ``on_refused`` belong to ``effect``."""

    create: Sequence[Mapping[str, Any]] = ()
    send: Sequence[Send] = ()
    effect: Effect | None = None
    effects: Sequence[Effect] = ()
    on_done: Announcement | None = None
    on_refused: Announcement | None = None

    def all_effects(self) -> list[Effect]:
        """Every effect of the plan, ``effect`` first with the plan's announcements unless it has its own."""
        found = list(self.effects)
        if self.effect is not None:
            effect = self.effect
            found.insert(0, Effect(effect.name, effect.call, on_done=effect.on_done or self.on_done,
                                   on_refused=effect.on_refused or self.on_refused))
        elif self.on_done is not None or self.on_refused is not None:
            raise PlanError("on_done and on_refused belong to the plan's effect, and it has none")
        return found


class PlanError(ValueError):
    """A plan the library cannot carry out as declared (a name used twice, a document outside the key's
    partition, a record's type): the handler's fault, the same for every delivery of the message."""


@dataclass(frozen=True)
class Intake:
    """One consumer's intake of plans: its store (documents stored with their partition key under
    ``partition_field``), name, effects' lease, markers' ttl and scope."""

    store: DocumentStore
    consumer: str
    lease_seconds: int = 60
    marker_ttl: int | None = None
    scope: Scope = Scope.PARTITION
    partition_field: str = PARTITION_FIELD
    clock: Callable[[], float] = time.time

    async def run(self, plan: Plan, *, key: str, partition: str, message: InboundMessage, request_hash: str) -> Result:
        """Carry out ``plan`` for the message of ``key`` in ``partition`` (its content hashing to ``request_hash``):
        the first delivery writes it and makes its effects; a redelivery finishes what is left; other content under
        the same key is PAYLOAD_MISMATCH. A store that may answer later is TRANSIENT, wherever it failed; a record
        this version cannot read, UNREADABLE."""
        try:
            return await self._run(plan, key=key, partition=partition, message=message, request_hash=request_hash)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"key {key}: {exc}", request_hash)
        except UnreadableDocument as exc:
            return Result(Outcome.UNREADABLE, f"key {key}: {exc}", request_hash)

    async def _run(self, plan: Plan, *, key: str, partition: str, message: InboundMessage,
                   request_hash: str) -> Result:
        try:
            effects = plan.all_effects()
            names = [effect.name for effect in effects] + [send.name for send in plan.send]
            if len(set(names)) != len(names):
                raise PlanError(f"a name is used twice in the plan ({sorted(names)}): one name, one id")
            operations, claims = self._intake(plan, effects, key=key, partition=partition, message=message,
                                              request_hash=request_hash)
            check_batch(operations)
            self._check_announcements(plan, effects, key=key, partition=partition, message=message)
        except PlanError as exc:
            return Result(Outcome.INVALID_PLAN, f"key {key}: {exc}", request_hash)
        except BatchTooLarge as exc:
            return Result(Outcome.LIMIT_EXCEEDED, f"key {key}: the plan's intake: {exc} ({exc.limit})", request_hash)
        except StoreError as exc:  # an item the store refuses (an id too long, say): the same every time
            return Result(Outcome.LIMIT_EXCEEDED, f"key {key}: the plan's intake: {exc}", request_hash)
        if self.scope is Scope.GLOBAL and (taken := await self._take_globally(key, request_hash)) is not None:
            return taken
        try:
            written = await self.store.execute_batch(partition, operations)
        except BatchFailed as exc:
            if isinstance(exc.error, TransientStoreError):
                return Result(Outcome.TRANSIENT, f"key {key}: the intake's batch: {exc.error}", request_hash)
            if not isinstance(exc.error, AlreadyExists):
                if exc.error.status == 400:  # the store refuses what the plan declares: the same every time
                    return Result(Outcome.INVALID_PLAN, f"key {key}: the store refused the plan's batch:"
                                                        f" {exc.error}", request_hash)
                raise
            return await self._again(effects, exc.index, operations, key=key, partition=partition, message=message,
                                     request_hash=request_hash)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"key {key}: the intake's batch: {exc}", request_hash)
        first = len(operations) - len(claims)
        records = [SideEffectRecord.from_document(document) for document in written[first:]]
        return await self._effects(effects, records, key=key, message=message, request_hash=request_hash,
                                   done=Outcome.CREATED, claimed=True)

    def _intake(self, plan: Plan, effects: Sequence[Effect], *, key: str, partition: str, message: InboundMessage,
                request_hash: str) -> tuple[list[BatchOperation], list[SideEffectRecord]]:
        """The intake's batch (marker, documents, entries, claims) and its claims."""
        marker = KeyMarker(id=identity.key_marker_id(self.consumer, key), partition=partition, consumer=self.consumer,
                           key=key, request_hash=request_hash,
                           ttl=msgspec.UNSET if self.marker_ttl is None else self.marker_ttl)
        operations: list[BatchOperation] = [Create(marker.to_document())]
        operations += [Create(self._document(document, partition)) for document in plan.create]
        operations += [Create(entry.to_document()) for entry in self._entries(plan.send, key=key, partition=partition,
                                                                              message=message)]
        claims = [self._side_effect(effect).claim(partition, message, request_hash, key=key) for effect in effects]
        for claim in claims:
            operations.append(Create(claim.to_document()))
        return operations, claims

    def _document(self, document: Mapping[str, Any], partition: str) -> Document:
        """A plan's document as created: its partition key set when it names none; a PlanError when it names
        another, or takes a record's type."""
        if document.get(TYPE_FIELD) in RECORD_TYPES:
            raise PlanError(f"document {document.get('id')} has type {document.get(TYPE_FIELD)!r}, which the"
                            " library's records use")
        if not isinstance(document.get("id"), str) or not document["id"]:
            raise PlanError("a document to create has no id")
        if forbidden := sorted(ID_FORBIDDEN & set(document["id"])):
            raise PlanError(f"document id {document['id'][:64]!r} holds {forbidden}, which Cosmos DB refuses in an id")
        stored = document.get(self.partition_field, partition)
        if stored != partition:
            raise PlanError(f"document {document['id']} is in partition {stored}, not the key's {partition}: a"
                            " plan's writes share one batch, in one partition")
        return {**document, self.partition_field: partition}

    def _entries(self, sends: Sequence[Send], *, key: str, partition: str,
                 message: InboundMessage) -> list[OutboxEntry]:
        """The outbox entries of ``sends``; LIMIT_EXCEEDED (as BatchTooLarge) past Service Bus's message size."""
        entries = []
        for send in sends:
            payload = msgspec.to_builtins(send.body)
            if not isinstance(payload, dict):
                raise PlanError(f"message {send.name}'s body is not an object")
            if (size := len(msgspec.json.encode(payload))) > MAX_OUTGOING_BODY_BYTES:
                raise BatchTooLarge(f"message {send.name}'s body is {size} bytes", limit=OUTGOING_LIMIT)
            entries.append(OutboxEntry(
                id=identity.outgoing_entry_id(self.consumer, send.name, key), partition=partition,
                status=OutboxStatus.PENDING,
                destination=send.to, message_id=identity.outgoing_message_id(self.consumer, send.name, key),
                correlation_id=message.message_id, session_id=send.session_id, subject=send.subject or send.name,
                payload=payload, created_at=self.clock()))
        return entries

    def _check_announcements(self, plan: Plan, effects: Sequence[Effect], *, key: str, partition: str,
                             message: InboundMessage) -> None:
        """Before anything is written or called: what each effect would announce, asked with a stand-in answer
        (an empty reference and refusal), must use names of its own (an announcement's create under a name taken
        would be read as written before, and dropped) and fit the finish's batch and Service Bus's message. A
        handler whose announcement needs the answer's values to be built is checked again at the finish."""
        names = Counter(send.name for send in plan.send) + Counter(effect.name for effect in effects)
        for effect in effects:
            announced: set[str] = set()
            for declared, answer in ((effect.on_done, Answer(200, "", None, None)),
                                     (effect.on_refused, Answer(422, None, "", ""))):
                if declared is None:
                    continue
                try:
                    sends = list(declared(answer))
                except Exception:  # noqa: S112 - it needs the real answer: checked at the finish instead
                    continue
                announced |= {send.name for send in sends}
                entries = self._entries(sends, key=key, partition=partition, message=message)
                check_batch([Create(entry.to_document()) for entry in entries] or [Create({"id": "-"})])
            names.update(announced)
        if taken := sorted(name for name, n in names.items() if n > 1):
            raise PlanError(f"names used more than once among the plan's messages, effects and announcements:"
                            f" {taken}; one name, one id")

    def _side_effect(self, effect: Effect) -> SideEffect:
        return SideEffect(self.store, self.consumer, effect.name, self.lease_seconds, self.clock)

    async def _take_globally(self, key: str, request_hash: str) -> Result | None:
        """The key's identity across partitions, created before the batch: None when it is ours (created now, or by
        an earlier delivery of the same content), else PAYLOAD_MISMATCH."""
        doc_id = identity.key_identity_id(self.consumer, key)
        record = KeyMarker(id=doc_id, partition=doc_id, consumer=self.consumer, key=key, request_hash=request_hash,
                           ttl=msgspec.UNSET if self.marker_ttl is None else self.marker_ttl)
        try:
            await self.store.create(record.to_document())
            return None
        except AlreadyExists:
            pass
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"key {key}: its identity's create: {exc}", request_hash)
        return self._compare(await self._marker(doc_id, doc_id), key, request_hash, where="across partitions")

    async def _marker(self, doc_id: str, partition: str) -> KeyMarker | Result | None:
        try:
            return KeyMarker.from_document(await self.store.read(doc_id, partition))
        except NotFound:
            return None
        except UnreadableDocument as exc:
            return Result(Outcome.UNREADABLE, str(exc), exc.request_hash)
        except TransientStoreError as exc:
            return Result(Outcome.TRANSIENT, f"marker {doc_id}: {exc}")

    @staticmethod
    def _compare(marker: KeyMarker | Result | None, key: str, request_hash: str, *, where: str) -> Result | None:
        if isinstance(marker, Result):
            return marker
        if marker is None:  # expired between the create and the read: the key is free again, the batch decides
            return None
        if marker.request_hash != request_hash:
            return Result(Outcome.PAYLOAD_MISMATCH, f"key {key} was taken {where} by content with requestHash"
                                                    f" {marker.request_hash}; this message's is {request_hash}",
                          request_hash)
        return None

    async def _again(self, effects: Sequence[Effect], index: int, operations: Sequence[BatchOperation], *, key: str,
                     partition: str, message: InboundMessage, request_hash: str) -> Result:
        """The intake's batch found a document of it standing (operation ``index``): a duplicate when it is the
        key's marker with this content's hash, which then finishes the effects; else the message is refused."""
        marker_id = identity.key_marker_id(self.consumer, key)
        if index != 0:
            taken = operations[index]
            doc_id = taken.document.get("id") if isinstance(taken, Create) else "?"
            return Result(Outcome.PAYLOAD_MISMATCH, f"key {key}: document {doc_id} already stands in partition"
                                                    f" {partition} and no marker of the key does: it is not this"
                                                    " key's (another writer's, or its marker expired)", request_hash)
        marker = await self._marker(marker_id, partition)
        if marker is None:
            return Result(Outcome.TRANSIENT, f"key {key}: its marker vanished between the create and the read",
                          request_hash)
        if (verdict := self._compare(marker, key, request_hash, where=f"in partition {partition}")) is not None:
            return verdict
        claims = [self._side_effect(effect).claim(partition, message, request_hash, key=key) for effect in effects]
        found = [await self._side_effect(effect).find(claim) for effect, claim in zip(effects, claims, strict=True)]
        if missing := [effect.name for effect, record in zip(effects, found, strict=True) if record is None]:
            # A claim is written in the marker's batch: one that is not there was not in the plan that took the key.
            return Result(Outcome.INVALID_PLAN, f"key {key}: the plan is not the one that took the key (no claim of"
                                                f" {missing}): a handler must declare the same plan for the same"
                                                " message", request_hash)
        return await self._effects(effects, [f or c for f, c in zip(found, claims, strict=True)], key=key,
                                   message=message, request_hash=request_hash, done=Outcome.DUPLICATE, claimed=False,
                                   found=found)

    async def _effects(self, effects: Sequence[Effect], records: Sequence[SideEffectRecord], *, key: str,
                       message: InboundMessage, request_hash: str, done: Outcome, claimed: bool,
                       found: Sequence[SideEffectRecord | None] | None = None) -> Result:
        """Run each effect from its record: ``done`` when each happened (now or before), REJECTED when one was
        refused; the first other verdict (in progress, transient, the call refused) as it is."""
        rejected: list[str] = []
        descriptions: list[str] = []
        for i, (effect, record) in enumerate(zip(effects, records, strict=True)):
            side = self._side_effect(effect)
            try:
                result = await side.run(record, message, _guarded(effect), done=done, claimed=claimed,
                                        found=None if found is None else found[i],
                                        announce=self._announcer(effect, key=key, message=message))
            except PlanError as exc:  # its announcement: the claim stays, for the fixed handler's redelivery
                return Result(Outcome.INVALID_PLAN, f"key {key}: {exc}", request_hash)
            except BatchTooLarge as exc:  # the same: the finish cannot be written as declared
                return Result(Outcome.LIMIT_EXCEEDED, f"key {key}: effect {effect.name}'s finish: {exc} ({exc.limit});"
                                                      " its record stays in progress, for the fixed handler's"
                                                      " resubmission to call again under the same key",
                              request_hash)
            if result.outcome is Outcome.REJECTED:
                rejected.append(effect.name)
            elif result.outcome is not done:
                return result
            descriptions.append(result.description)
        description = f"key {key}" + "".join(f"; {d}" for d in descriptions)
        return Result(Outcome.REJECTED if rejected else done, description, request_hash)

    def _announcer(self, effect: Effect, *, key: str,
                   message: InboundMessage) -> Callable[[SideEffectRecord], Sequence[BatchOperation]]:
        """What the finish of ``effect``'s record writes: the outbox entries its announcement declares."""
        def announce(record: SideEffectRecord) -> Sequence[BatchOperation]:
            if record.status is EffectStatus.COMPLETED:
                declared = effect.on_done
            elif record.status is EffectStatus.REJECTED:
                declared = effect.on_refused
            else:
                return ()
            if declared is None:
                return ()
            answer = Answer(record.response_status or 0, record.reference, record.reason, record.refusal)
            sends = declared(answer)
            if effect.name in (send.name for send in sends):
                raise PlanError(f"effect {effect.name} announces a message of its own name")
            return [Create(entry.to_document()) for entry in self._entries(sends, key=key, partition=record.partition,
                                                                          message=message)]
        return announce


def _guarded(effect: Effect) -> Callable[[str], Awaitable[Reply]]:
    """``effect``'s call, any exception of it (but the effect's own DownstreamUnavailable) read as the call not
    answered: the claim's lease ends and the message is tried again, then handed on, never abandoned at once. Only
    the exception's type is kept: its message may hold what the call sent."""
    async def call(key: str) -> Reply:
        try:
            return await effect.call(key)
        except DownstreamUnavailable:
            raise
        except Exception as exc:
            raise DownstreamUnavailable(f"{effect.name}: the call raised {type(exc).__name__}") from exc
    return call
