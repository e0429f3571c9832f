"""Ordered processing's writes: each multi-document write as a type with named parts and named failures.

A write is one transactional batch in its subject's partition, all or nothing, inside Cosmos DB's limits
(100 operations, 2 MB). Its layout stays here: a handler says what it writes, and hears back what went
wrong by name (``OrderIdTaken``, ``AlreadySeen``, ``OrderChanged``, ``LimitExceeded`` from
``idempotent_consumer.errors``), never by a position in the batch. A batch's part that writes the subject
is named by the machine's noun ("order"), so that what fails reads "order of order o-1".

A release (``Releases``) is the one write that may not fit one batch: a storm of copies parked before
their subject becomes a storm of removals when the subject comes. It is planned here, where the limits are
known: each batch takes as many of the release's steps as fit beside the subject's own write, and is on
the subject's etag, the first as read and each next one as the last batch left it; every batch sets the
subject's version, state and count as they stand once its steps are written, so that the subject and what
waits agree after each. What cannot fit at all (a document past 2 MB) is refused with LimitExceeded
before anything is sent.

A subject is changed by a patch of its changes, on its etag, which keeps every field it does not set; so is
its placeholder. Only a subject taking its placeholder's place sets more fields than one patch takes: it is
merged into the placeholder as read, on its etag. Nothing here rewrites a document from a Struct.
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
from idempotent_consumer.ordered.machine import (
    SUBJECT_FIELDS,
    Machine,
    OrderedEvent,
    Release,
    Step,
    Subject,
    transition,
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
    DUE_FIELD,
    InboxMarker,
    ParkedEvent,
    ParkedStatus,
    UnreadableParked,
    merged,
    schema_version,
)

Parts = list[tuple[str, BatchOperation]]


@dataclass(frozen=True)
class Stored:
    """What stands at a subject's id: the subject (version 0 when none is created) and the document as read."""

    subject: Subject
    document: Document | None = None
    request_hash: str | None = None  # the created subject's
    foreign: bool = False  # a document of another kind holds the subject's id


async def read_subject(store: DocumentStore, machine: Machine[Any], key: str) -> Stored:
    """Read what stands at the subject's id."""
    try:
        document = await store.read(key, key)
    except NotFound:
        return Stored(Subject(machine, key))
    objects = {name: value for name in machine.sub_objects if isinstance(value := document.get(name), dict)}
    state = machine.read(document)
    if state is None:
        return Stored(Subject(machine, key), document, foreign=True)
    subject = Subject(machine, key, state.status, state.version, state.parked, objects=objects)
    return Stored(subject, document, state.request_hash if state.status is not None else None)


async def read_known(store: DocumentStore, machine: Machine[Any], key: str) -> Stored:
    """What stands at the subject's id, which a handler's decision reads: UnreadableDocument if it does not
    decode here, or is a document type this version does not know."""
    stored = await read_subject(store, machine, key)
    if stored.foreign and stored.document is not None:
        raise UnreadableDocument(f"{stored.document.get('type')} {key} is of a type this version does not"
                                 " know", doc_id=key, schema_version=schema_version(stored.document))
    return stored


async def waiting(store: DocumentStore, consumer: str, key: str) -> list[ParkedEvent | UnreadableParked]:
    """Every event this consumer has parked against the subject, read through all the query's pages
    (``Subject.release`` puts them in sequence order); one that does not decode here as what still reads of
    it, for a release to stop at."""
    found = await query_all(store, ParkedEvent.KIND, partition_key=key)  # this consumer's, still parked: as read
    return [ParkedEvent.read_leniently(d) for d in found if ParkedEvent.waits_for(consumer, d)]


def subject_write(stored: Stored, subject: Subject) -> BatchOperation:
    """The subject's changes as a patch of its document, on its etag as read; a new placeholder if none
    stood. (A transition changes at most seven fields: status, version, parked, updatedAt and the sub-objects
    it sets, inside the ten one patch takes.) A subject its first event creates is created where nothing stood,
    and takes its placeholder's place, merged into it on its etag, where one did."""
    created = stored.subject.status is None and subject.status is not None
    if stored.document is None:
        if created:
            return Create(dict(subject.changes))
        return Create(subject.machine.placeholder(subject.key, subject.parked))
    if created:
        return merge_on_etag(stored, subject.changes)
    return Patch(subject.key, dict(subject.changes), if_match=_ours(stored)["_etag"])


def merge_on_etag(stored: Stored, changes: Mapping[str, Any]) -> Replace:
    """The document as read with ``changes`` merged in, on its etag: a subject taking its placeholder's place."""
    document = _ours(stored)
    return Replace(merged(document, changes), document["_etag"])


def _patch_on(key: str, etag: str) -> Callable[[Subject], BatchOperation]:
    """The subject's changes as a patch on ``etag``, for the batches of a release after its first: the fields the
    ordered mode sets (a subject its first event created in the first batch is not created again)."""
    def patch(subject: Subject) -> Patch:
        fields = {k: v for k, v in subject.changes.items() if k in SUBJECT_FIELDS or k in subject.machine.sub_objects}
        return Patch(key, fields, if_match=etag)
    return patch


def _ours(stored: Stored) -> Document:
    if stored.document is None or stored.foreign:
        noun = stored.subject.machine.noun
        raise StoreError(f"document {stored.subject.key} is neither an {noun} nor a pending {noun}; not ours to write")
    return stored.document


@dataclass(frozen=True)
class Releases:
    """Writes releases: the steps of each in as many batches as Cosmos DB's limits take, each on the subject's etag.

    A rejected or dropped parked event is kept for operators with a ``ttl`` of ``set_aside_ttl`` seconds, so
    that what is set aside neither fills the container nor a listing for good.
    """

    store: DocumentStore
    consumer: str
    set_aside_ttl: int
    machine: Machine[Any]
    max_operations: int = MAX_BATCH_OPERATIONS  # a batch's budget: Cosmos DB's limits
    max_bytes: int = MAX_BATCH_BYTES

    @property
    def part(self) -> str:
        """The name of a batch's part that writes the subject (and the conflicts that name it)."""
        return self.machine.noun

    def conflicts(self) -> dict[str, type[WriteConflict]]:
        """A release's batches fail on the subject (its etag moved) or on a parked event (gone, or no longer
        parked): another delivery wrote the subject since; read it again."""
        return {self.part: OrderChanged, "released": OrderChanged}

    def step_parts(self, step: Step) -> Parts:
        """One step's writes: an applied event's record (if the machine keeps one) and its parked copy removed; a
        stale copy removed; a rejected one kept, marked, with the reason and its ttl."""
        parked = step.parked
        if step.event is not None:
            return [*self.record(step.event, parked.data), ("released", Delete(parked.id, parked.etag))]
        if step.rejection is None:
            return [("released", Delete(parked.id, parked.etag))]
        return [("released", self.set_aside(parked, ParkedStatus.REJECTED, step.rejection))]

    def record(self, event: OrderedEvent, data: Mapping[str, Any] | None) -> Parts:
        """The applied event's record, as a part of its batch: none when the machine keeps none apart from the
        event's sub-object."""
        record = self.machine.record(event, data)
        return [] if record is None else [("record", Create(record))]

    def set_aside(self, parked: ParkedEvent, status: ParkedStatus, reason: str) -> Patch:
        """The patch that sets a parked event aside (rejected or dropped), kept until its ttl ends."""
        return Patch(parked.id, {"status": status.value, "reason": reason, "ttl": self.set_aside_ttl,
                                 DUE_FIELD: None}, {"status": ParkedStatus.PARKED.value})

    def plan(self, write: Callable[[Subject], BatchOperation], done: Release, start: int, *,
             head: Sequence[tuple[str, BatchOperation]] = (),
             tail: Sequence[tuple[str, BatchOperation]] = ()) -> tuple[Parts, int]:
        """The next batch of ``done`` from step ``start``: ``head``, the subject's write (``write`` of the subject
        once the batch's steps are written), ``tail``, then as many steps as fit in Cosmos DB's limits; and
        how many steps it took. A batch with neither head nor tail takes at least one step. Raise
        LimitExceeded when the fixed parts, or one step alone, cannot fit."""
        noun = self.part
        fixed = [*head, (noun, write(done.subject)), *tail]
        ops, size = len(fixed), sum(operation_bytes(op) for _, op in fixed)
        if ops > self.max_operations or size > self.max_bytes:
            raise LimitExceeded(f"{noun} {done.start.key}: its own writes take {ops} operations and {size} bytes"
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
            raise LimitExceeded(f"{noun} {done.start.key}: parked event {done.steps[start].parked.id} alone does"
                                " not fit one transactional batch", limit=BATCH_LIMIT)
        return [*head, (noun, write(done.after(start + taken))), *tail, *steps], taken

    async def write(self, key: str, parts: Parts, conflicts: Mapping[str, type[WriteConflict]]) -> dict[str, Document]:
        """Run the parts as one batch in the subject's partition (``write_parts``)."""
        return await write_parts(self.store, key, parts, conflicts, noun=self.part)

    async def rest(self, key: str, etag: str, done: Release, start: int) -> None:
        """Write the steps of ``done`` from ``start`` on, in batches, the first on ``etag``. When the subject moved
        meanwhile (another delivery wrote it), read it and what waits again, and release what it then decides.
        Raise TransientStoreError when it keeps moving: the rest waits for the next delivery that finishes it."""
        for _ in range(MAX_RACES):
            try:
                while start < len(done.steps):
                    parts, taken = self.plan(_patch_on(key, etag), done, start)
                    written = await self.write(key, parts, self.conflicts())
                    etag, start = written[self.part]["_etag"], start + taken
                return
            except OrderChanged:
                pass
            stored = await self.read(key)
            if stored is None or stored.document is None:
                return
            done = stored.subject.release(await waiting(self.store, self.consumer, key))
            start, etag = 0, stored.document["_etag"]
        raise TransientStoreError(f"{self.part} {key} kept changing under its release; the rest waits for a"
                                  " redelivery")

    async def finish(self, key: str) -> Release | None:
        """Release what the subject, as it stands, decides of what waits for it: the rest of a release an earlier
        delivery began and could not finish. None when nothing counted waits, or the subject is not created, or
        does not decode here (a newer version's, which finishes it)."""
        stored = await self.read(key)
        if stored is None or stored.document is None or not stored.subject.parked:
            return None
        done = stored.subject.release(await waiting(self.store, self.consumer, key))
        if done.steps:
            await self.rest(key, stored.document["_etag"], done, 0)
        return done

    async def read(self, key: str) -> Stored | None:
        """The created subject as it stands; None when none is created or it does not decode here."""
        try:
            stored = await read_known(self.store, self.machine, key)
        except UnreadableDocument:
            return None
        return stored if stored.subject.status is not None else None

    async def by_hand(self, stored: Stored, done: Release) -> None:
        """An operator's release: the subject as read, changed by the release, and the release's writes, in as
        many batches as they take. Raise OrderChanged if the subject moved before the first."""
        parts, taken = self.plan(lambda subject: subject_write(stored, subject), done, 0)
        written = await self.write(stored.subject.key, parts, self.conflicts())
        await self.rest(stored.subject.key, written[self.part]["_etag"], done, taken)


@dataclass(frozen=True)
class Intake:
    """A new subject (``document``) with what its batch writes beside it (``tail``: a claim, say). It may take
    the place of its placeholder: then it applies the parked events its release puts in sequence, as many as fit
    in the same batch, and the rest in batches after it."""

    key: str
    document: dict[str, Any]
    tail: Parts
    adopting: tuple[Stored, Release] | None = None  # the placeholder as read, and what the subject releases

    async def write(self, releases: Releases) -> dict[str, Document]:
        """Write it all; the written documents by part. Raise OrderIdTaken, OrderChanged if the placeholder moved,
        or LimitExceeded if the subject's own documents do not fit one batch."""
        if self.adopting is None:
            return await releases.write(self.key, [(releases.part, Create(self.document)), *self.tail],
                                        {releases.part: OrderIdTaken})
        placeholder, done = self.adopting
        parts, taken = releases.plan(lambda subject: merge_on_etag(placeholder, {**self.document, **subject.changes}),
                                     done, 0, tail=self.tail)
        written = await releases.write(self.key, parts, releases.conflicts())
        await releases.rest(self.key, written[releases.part]["_etag"], done, taken)
        return written


@dataclass(frozen=True)
class EventWrites:
    """One consumer's writes for one event, each behind its inbox marker, so that it applies once; ``content``
    is the event as its producer wrote it, which its park keeps and its record and subject store the data of."""

    releases: Releases
    marker: InboxMarker
    event: OrderedEvent
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
        """The happy path, unread: the subject patched on its version and state, and the event's record (if the
        machine keeps one). The
        event's sub-object is set whole, so only where none stands (another writer may have put one there, whose
        fields the read path keeps)."""
        machine, part, key = self.releases.machine, self.releases.part, self.event.subject
        write: BatchOperation
        if machine.creates and self.event.sequence == 1 and not machine.allowed_from(self.event):
            # The subject's first event: the create is the check; taken, it is read and decided
            write = Create(dict(Subject(machine, key).apply(self.event, self.data).changes))
        else:
            changes, condition = transition(machine, self.event, self.data)
            condition[machine.sub_object(self.event, self.data)[0]] = ABSENT
            write = Patch(key, changes, condition)
        await write_once(self.store, self.marker, [(part, write), *self.releases.record(self.event, self.data)],
                         noun=part)

    async def apply_and_release(self, stored: Stored, done: Release) -> None:
        """The event onto the subject as read, then the parked events it releases: as many as fit beside it in
        its marker's batch, the rest in batches after it. The marker of a release that takes more than one
        batch says so (``releasing``), so that a redelivery after a failure between them finishes it."""
        record = self.releases.record(self.event, self.data)
        releasing = msgspec.structs.replace(self.marker, releasing=True)
        parts, taken = self.releases.plan(lambda subject: subject_write(stored, subject), done, 0,
                                          head=[("marker", Create(releasing.to_document()))], tail=record)
        marker = releasing if taken < len(done.steps) else self.marker
        written = await write_once(self.store, marker, parts[1:], relied_on=("released",), noun=self.releases.part)
        await self.releases.rest(self.event.subject, written[self.releases.part]["_etag"], done, taken)

    async def park(self, stored: Stored | None, parked: ParkedEvent) -> None:
        """The event parked, and counted on its subject (or on a placeholder standing in for it); with
        ``stored`` None (what stands at the subject's id does not decode here), parked alone, uncounted
        (``parked.counted`` false).

        A parked copy already there (its marker expired while it waited, and the event was sent again)
        is the event seen before: AlreadySeen with the parked copy's requestHash.
        """
        parts: Parts = [("parked", Create(parked.to_document()))]
        if stored is not None:
            count = stored.subject.count_parked(stored.subject.parked + 1)
            parts.append((self.releases.part, subject_write(stored, count)))
        try:
            await write_once(self.store, self.marker, parts, taken=("parked",), noun=self.releases.part)
        except _Taken:
            kept = await self.store.read(parked.id, parked.partition)
            raise _seen_before(ParkedEvent, kept, f"parked event {parked.id} exists") from None


async def set_aside(releases: Releases, stored: Stored, parked: ParkedEvent, reason: str) -> ParkedEvent:
    """An operator's drop: the parked event kept, marked dropped until its ttl ends, and no longer counted on
    its subject (if parking it counted it)."""
    parts: Parts = [("parked", releases.set_aside(parked, ParkedStatus.DROPPED, reason))]
    if stored.document is not None and not stored.foreign and parked.counted:
        parts.append((releases.part, subject_write(stored, stored.subject.count_parked(stored.subject.parked - 1))))
    await releases.write(stored.subject.key, parts, {releases.part: OrderChanged, "parked": OrderChanged})
    return msgspec.structs.replace(parked, status=ParkedStatus.DROPPED, reason=reason)


async def write_once(store: DocumentStore, marker: InboxMarker, parts: Parts, relied_on: tuple[str, ...] = (),
                     taken: tuple[str, ...] = (), *, noun: str) -> dict[str, Document]:
    """Write the marker and the parts atomically; the written documents by part. Raise AlreadySeen if the
    marker exists (with the first content's requestHash); OrderChanged if the subject (the part named ``noun``),
    or a part in ``relied_on``, was not as read; _Taken if a create in ``taken`` found its id taken."""
    conflicts: dict[str, type[WriteConflict]] = {
        "marker": _MarkerTaken, noun: OrderChanged, **dict.fromkeys(relied_on, OrderChanged),
        **dict.fromkeys(taken, _Taken)}
    try:
        return await write_parts(store, marker.partition, [("marker", Create(marker.to_document())), *parts],
                                 conflicts, noun=noun)
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


async def write_parts(store: DocumentStore, partition_key: str, parts: Parts,
                      conflicts: Mapping[str, type[WriteConflict]], *, noun: str) -> dict[str, Document]:
    """Run the parts as one batch; the written documents by part. A part's conflict (id taken, document
    changed or gone) raises the part's error in ``conflicts``; a batch past Cosmos DB's limits LimitExceeded;
    any other failure a StoreError naming it."""
    try:
        written = await store.execute_batch(partition_key, [operation for _, operation in parts])
    except BatchTooLarge as exc:  # refused before it was sent: the same batch can never be written
        raise LimitExceeded(f"{noun} {partition_key}: {exc}", limit=exc.limit) from exc
    except BatchFailed as exc:
        part, error = parts[exc.index][0], exc.error
        if part in conflicts and isinstance(error, (AlreadyExists, PreconditionFailed, NotFound)):
            raise conflicts[part](f"{part} of {noun} {partition_key}: {error}", status=error.status) from exc
        raise StoreError(f"{part} of {noun} {partition_key}: {error}", status=error.status) from exc
    return {name: document for (name, _), document in zip(parts, written, strict=True)}
