"""Two-phase records for side effects that cannot join a Cosmos transaction, such as an HTTP call.

claim (create, status in_progress, with a lease) -> call -> finish (a patch on the etag, status
completed or rejected, in one batch with what the caller writes once the effect's outcome is known: the
message that announces it). The record names the message that claimed it (its sequence number). A later
delivery reads the record: completed means don't call again. In progress, it is taken over at once
by a redelivery of the claiming message (which no longer holds its lock; if its delivery is still
running, its finish fails on the etag) or by anyone once the lease has expired; a copy of the order
sent as another message finds a live claim and leaves the effect to the claimant, whose redeliveries
finish it. A takeover patches the record on its etag and calls again with the same idempotency
key, so the service drops the repeat. Every change is a patch of the fields it changes, on the etag
as read, so the fields this version does not model are kept. The create is the atomic claim: of two
concurrent copies one gets 409. Nothing here waits or asks to be tried again later while another
delivery holds the effect.

The effect knows nothing of what it calls. The call answers with a ``Reply`` (its status, and a
reference, or a refusal and a reason): a 2xx did it; ``is_transient_under_key`` says the status may
succeed later (a transient status, as for every downstream, or 409, the key still held by a concurrent
request: a takeover overlapping the first call); a refusal (the downstream's code for why) refused it for
good, the business outcome; any other answer says the call itself is wrong (its URL, credentials or
shape), which no retry inside the lock mends: the claim's lease ends, with the status and reason kept on
it, and the delivery is dead-lettered for an operator to resubmit once it is put right, which takes the
claim over and calls again. The verdict is a ``Result`` in the one vocabulary of outcomes: the caller's
``done`` when the effect happened (now or before), REJECTED when it was refused, IN_PROGRESS when another
message holds it, TRANSIENT, DOWNSTREAM_REJECTED; and ORDER_CLOSED when what the effect belongs to no longer
allows it or its announcement. A claim's create and its takeover write the caller's ``guard`` in their batch
(a patch that holds only while the order allows the effect): when it does not hold, NoLongerAllowed is raised
before any call, and the caller finishes the claim without one (``close``). The finish writes the
announcement the same way: where its conditions no longer hold, the answer is recorded and not announced
(``announces`` false).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import msgspec
from msgspec import UNSET

from idempotent_consumer import identity
from idempotent_consumer.errors import (
    AlreadyExists,
    BatchFailed,
    DownstreamUnavailable,
    NoLongerAllowed,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import (
    IDENTITY_REFUSED,
    NOT_ALLOWED,
    Outcome,
    Result,
    is_transient_under_key,
    is_unavailable,
)
from idempotent_consumer.ports.store import ABSENT, MAX_RACES, BatchOperation, Create, Document, DocumentStore, Patch
from idempotent_consumer.records import DUE_FIELD, PARTITION_FIELD, TYPE_FIELD, EffectStatus, SideEffectRecord

# What a subject's document gives a claim it keeps (``SideEffect.within``), and the claim does not repeat: its id
# (derived), type, partition, schema version, and due (the document's own).
_SUBJECT_GIVES = ("id", TYPE_FIELD, PARTITION_FIELD, "schemaVersion", DUE_FIELD)

MAX_REASON_CHARS = 200


class Reply(Protocol):
    """What a call answered: the downstream's status, and a reference (on success) or a reason."""

    @property
    def status(self) -> int:
        """The downstream's status."""

    @property
    def reference(self) -> str | None:
        """What the downstream made, on success."""

    @property
    def reason(self) -> str | None:
        """Why the downstream refused, when it says."""

    @property
    def refusal(self) -> str | None:
        """The downstream's code for why it refuses the effect for good; None when it did not refuse it."""


# What the caller writes in the finish's batch, given the record as finished (completed or rejected): the
# message that announces the outcome, say. Its creates may find their ids taken (written by a version that
# wrote them earlier); the finish is then written without them. Its patches may carry conditions on the state
# of what they patch (an order still open): one that no longer holds raises NoLongerAllowed, and the finish is
# written without the announcement. A guard is the same for a takeover: the patches that must hold for the
# effect to be made at all, written in the takeover's batch.
Announce = Callable[[SideEffectRecord], Sequence[BatchOperation]]
# What must hold of what the effect belongs to for it to be made: patches written in the claim's batch (its create
# or its takeover), given the record as claimed; one that does not hold raises NoLongerAllowed before any call.
Guard = Callable[[SideEffectRecord], Sequence[BatchOperation]]


@dataclass(frozen=True)
class SideEffect:
    """One named side effect of one consumer, recorded in the partition of the order it belongs to."""

    store: DocumentStore
    consumer: str
    name: str
    lease_seconds: int
    clock: Callable[[], float] = time.time
    # An app's compatibility with its own history, not the library's: True where versions of the app before it
    # announced an outcome at its intake and not at the finish (the order app). Its claims then say they announce
    # at the finish (``announces``), its finishes that they did (``announced``), and a record finished without it
    # is announced by the next delivery. None for a consumer that never announced otherwise: its finish writes its
    # announcement in its own batch, always.
    announces: bool | None = None
    # An app's compatibility with the records its earlier versions wrote, not the library's: each stored record
    # passes through it before it is read (the order app reads its old ``failed`` status as a claim whose lease
    # has ended). None: records are read as stored.
    upgrade: Callable[[Document], Document] | None = None
    # Where a claim may be kept inside its subject's document (the one whose id is its partition key, as an order's)
    # instead of a record of its own: that document's field. A claim kept there is written by a patch of it, on the
    # claim's ``rev``. None: claims are records of their own. Where it is set, both forms are read.
    within: str | None = None
    # Whether a new claim is written there (``within`` set; ``subject_fields``): only once no release that reads
    # records of their own alone still runs, which would claim the effect a second time (docs/operations.md).
    # A claim is kept in its subject only from the subject's create on (the caller puts it there), so a claim made
    # later (``run`` with neither ``claimed`` nor ``found``: none stood) is a record of its own; a caller that read the
    # subject passes the claim it holds (``held``) as ``found``.
    write_within: bool = False

    def subject_fields(self, record: SideEffectRecord) -> dict[str, Any]:
        """The fields that keep a claim inside its subject's document (``within``), for the subject's create: the
        claim, and the subject's ``due`` (the stuck report's query). Fields the subject gives (its id, partition
        and type) are not repeated."""
        if self.within is None:
            raise StoreError(f"{self.name}: no field names where a claim is kept in its subject's document")
        document = msgspec.structs.replace(record, rev=1).to_document()
        for name in _SUBJECT_GIVES:
            document.pop(name, None)
        return {self.within: document, DUE_FIELD: record.due()}

    def held(self, subject: Document) -> SideEffectRecord | None:
        """The claim a subject's document keeps (``within``), its etag the document's; None if it keeps none."""
        kept = subject.get(self.within) if self.within is not None else None
        if not isinstance(kept, dict):
            return None
        document = _as_record(kept, subject)
        return SideEffectRecord.from_document(document if self.upgrade is None else self.upgrade(document))

    def claim(self, partition: str, message: InboundMessage, request_hash: str | None = None, *,
              key: str | None = None) -> SideEffectRecord:
        """The in_progress record of the effect of ``key`` (the partition's own, as an order's, when None), in
        ``partition``; create it alone, or inside the batch that writes the message's documents."""
        key = partition if key is None else key
        return SideEffectRecord(
            id=identity.side_effect_id(self.consumer, self.name, key), partition=partition,
            consumer=self.consumer, effect=self.name, idempotency_key=identity.effect_key(self.consumer, self.name,
                                                                                         key),
            status=EffectStatus.IN_PROGRESS, attempt=1, lease_until=self.lease_until(message.lock_deadline),
            message_sequence=message.sequence_number, request_hash=request_hash, announces=self.announces,
        )

    async def find(self, record: SideEffectRecord, *, subject_next: bool = False) -> SideEffectRecord | None:
        """The stored record of ``record``'s effect, as it is now; None if there is none. One point read: of the
        form new claims are written in, then (where ``within`` is set) of the other. With ``subject_next``, the
        caller reads the subject's document itself when this finds none (and looks there with ``held``), so a read
        of it that would come second is left to the caller."""
        if self.within is None or not self.write_within:
            own = await self._own(record)
            return own if own is not None or self.within is None or subject_next else await self._in_subject(record)
        held = await self._in_subject(record)
        return held if held is not None else await self._own(record)

    async def _own(self, record: SideEffectRecord) -> SideEffectRecord | None:
        try:
            stored = await self.store.read(record.id, record.partition)
        except NotFound:
            return None
        return SideEffectRecord.from_document(stored if self.upgrade is None else self.upgrade(stored))

    async def _in_subject(self, record: SideEffectRecord) -> SideEffectRecord | None:
        try:
            return self.held(await self.store.read(record.partition, record.partition))
        except NotFound:
            return None

    async def run(
        self, claim: SideEffectRecord, message: InboundMessage, call: Callable[[str], Awaitable[Reply]], *,
        done: Outcome, claimed: bool = False, found: SideEffectRecord | None = None, announce: Announce = lambda _: (),
        guard: Guard = lambda _: (),
    ) -> Result:
        """Claim (unless ``claimed``: ``claim`` is the record as written), call, and finish the record, with
        what ``announce`` writes for the outcome in the same batch.

        ``found`` is the record as the caller just read it (a copy's one read after its conflict):
        finished, it is the verdict; in progress, the takeover rules start from it without reading again.
        The result is ``done`` when the effect happened, now or before; REJECTED when it was refused;
        ORDER_CLOSED when the announcement's conditions no longer held (the outcome is recorded, unannounced). A
        record that ``announces`` its outcome but was finished without (by a version that did not) is announced
        now. A takeover writes ``guard`` in its batch; when the guard no longer holds, NoLongerAllowed is raised
        before any call, for the caller to close the claim (``close``).
        """
        step = _Run(self, message, done, announce, guard)
        result = await step.run(claim, call, claimed=claimed, found=found)
        if result.outcome is done:
            return Result(done, result.description, claim.request_hash)
        return dataclasses.replace(result, description=f"order {claim.partition}: {result.description}",
                                   request_hash=claim.request_hash)

    async def patch(self, current: SideEffectRecord, *, announce: Announce = lambda _: (),
                    **changes: Any) -> SideEffectRecord | None:
        """Set ``changes`` on the record if it is still as read (its etag), with what ``announce`` writes for the
        record so changed, in one batch: the record as it stands then. None if it changed or vanished meanwhile
        (another delivery's write). A create of ``announce`` whose id is taken was written before (by a version
        that wrote it earlier): the batch goes again without it. A patch of ``announce`` whose condition no longer
        holds (an object it sets whole where none stood, now there) is merged into its document as read, on its
        etag. Any other failure is raised."""
        if current.etag is None:
            raise StoreError(f"{self.name} record {current.id} was not read from the store; no etag to write on")
        if current.rev is not UNSET:
            return await self._patch_within(current, announce, changes)
        changed, fields = current.with_changes(**changes)
        extra = list(announce(changed))
        for _ in range(len(extra) + MAX_RACES):
            try:
                [written, *_] = await self.store.execute_batch(
                    current.partition, [Patch(current.id, fields, if_match=current.etag, etag_only=not extra), *extra])
            except BatchFailed as exc:
                if exc.index == 0 and isinstance(exc.error, PreconditionFailed | NotFound):
                    return None
                failed = extra[exc.index - 1] if exc.index > 0 else None
                if isinstance(failed, Create) and isinstance(exc.error, AlreadyExists):
                    del extra[exc.index - 1]
                    continue
                if isinstance(failed, Patch) and isinstance(exc.error, PreconditionFailed | NotFound):
                    extra[exc.index - 1] = await self._merged(current.partition, failed)
                    continue
                error = TransientStoreError if isinstance(exc.error, TransientStoreError) else StoreError
                raise error(f"{self.name} record {current.id}: {exc.error}", status=exc.error.status) from exc
            # The patch set these fields on the record as read (the etag held), so this is the record now.
            return msgspec.structs.replace(changed, etag=written["_etag"])
        raise TransientStoreError(f"{self.name} record {current.id}: the finish's batch kept failing")

    async def _patch_within(self, current: SideEffectRecord, announce: Announce,
                            changes: Mapping[str, Any]) -> SideEffectRecord | None:
        """``patch`` of a claim kept in its subject's document: one patch of the document that sets the claim's
        changed fields, raises its ``rev`` and moves the document's ``due``, on the ``rev`` as read. What
        ``announce`` writes on the same document joins that patch (two patches of one document would cost two),
        with its conditions; where one fails while the claim stands as read, it is resolved as ``patch`` resolves
        its own (NoLongerAllowed, or merged into the document as read, on its etag)."""
        if not isinstance(rev := current.rev, int) or self.within is None:
            raise StoreError(f"{self.name} claim {current.id} is not one kept in its subject's document")
        within, subject = self.within, current.partition
        changed, fields = current.with_changes(**changes)
        stored = current.to_document()
        own = {f"{within}/{name}": value for name, value in fields.items()
               if name != DUE_FIELD and (name not in stored or stored[name] != value)}
        own |= {f"{within}/rev": rev + 1, DUE_FIELD: changed.due()}
        extra = list(announce(changed))
        joined = [op for op in extra if isinstance(op, Patch) and op.doc_id == subject]
        extra = [op for op in extra if not (isinstance(op, Patch) and op.doc_id == subject)]
        if_match: str | None = None
        for _ in range(len(extra) + len(joined) + MAX_RACES):
            write = Patch(subject, {**own, **{k: v for op in joined for k, v in op.set_fields.items()}},
                          {f"{within}/rev": rev, **{k: v for op in joined for k, v in op.condition.items()}},
                          if_match=if_match, etag_only=not extra)
            try:
                [written, *_] = await self.store.execute_batch(subject, [write, *extra])
            except BatchFailed as exc:
                failed = extra[exc.index - 1] if exc.index > 0 else None
                if exc.index == 0 and isinstance(exc.error, PreconditionFailed | NotFound):
                    if not joined or isinstance(exc.error, NotFound):
                        return None
                    try:
                        document = await self.store.read(subject, subject)
                    except NotFound:
                        return None
                    held = self.held(document)
                    if held is None or held.rev != rev:
                        return None  # another delivery wrote the claim meanwhile
                    joined, if_match = [_merge(document, op) for op in joined], document["_etag"]
                    continue
                if isinstance(failed, Create) and isinstance(exc.error, AlreadyExists):
                    del extra[exc.index - 1]
                    continue
                if isinstance(failed, Patch) and isinstance(exc.error, PreconditionFailed | NotFound):
                    extra[exc.index - 1] = await self._merged(subject, failed)
                    continue
                error = TransientStoreError if isinstance(exc.error, TransientStoreError) else StoreError
                raise error(f"{self.name} claim in {subject}: {exc.error}", status=exc.error.status) from exc
            return msgspec.structs.replace(changed, etag=written["_etag"], rev=rev + 1)
        raise TransientStoreError(f"{self.name} claim in {subject}: the finish's batch kept failing")

    async def _merged(self, partition_key: str, patch: Patch) -> Patch:
        """``patch`` as a merge into its document as read, on its etag: an object it sets is merged into the one
        that stands there, so that what another writer put in it is kept. NoLongerAllowed when the document no
        longer meets the patch's other conditions (its state), or is gone."""
        try:
            stored = await self.store.read(patch.doc_id, partition_key)
        except NotFound as exc:
            raise NoLongerAllowed(f"{patch.doc_id} is gone", {}) from exc
        return _merge(stored, patch)

    async def close(self, claim: SideEffectRecord, refusal: str, reason: str) -> Result:
        """Finish the claim without making the effect: what it belongs to no longer allows it (``refusal``, the code
        for why; ``reason``, in words). Rejected, announcing nothing: ORDER_CLOSED; or the verdict of a record that
        another delivery finished first."""
        record: SideEffectRecord | None = claim
        # No status of its own: an earlier attempt's failed call (a 503, say) was no answer to this close.
        closing: dict[str, Any] = {"status": EffectStatus.REJECTED, "refusal": refusal, "response_status": None,
                                   "reason": reason[:MAX_REASON_CHARS], "finished_at": self.clock(), "announces": False}
        for _ in range(MAX_RACES):
            current = record if record is not None and record.etag is not None else await self.find(claim)
            record = None
            if current is None:  # no claim stands (removed by hand, say): one is written, closed
                try:
                    # A record of its own, though the claim was read from its subject (and removed since): no rev.
                    await self.store.create(msgspec.structs.replace(claim, **closing, rev=UNSET).to_document())
                except AlreadyExists:
                    continue
                return Result(Outcome.ORDER_CLOSED, f"{self.name} closed: {reason}")
            if isinstance(verdict := _verdict(current, Outcome.DUPLICATE), Result):
                return verdict  # another delivery finished it first
            if await self.patch(current, **closing) is not None:
                return Result(Outcome.ORDER_CLOSED, f"{self.name} closed: {reason}")
        return Result(Outcome.TRANSIENT, f"{self.name} record {claim.id} kept changing under us")

    def lease_until(self, locked_until: datetime | None) -> float:
        """The lease a claim or takeover gets: the lock as the host keeps it, at most ``lease_seconds``."""
        cap = self.clock() + self.lease_seconds
        return min(cap, locked_until.timestamp()) if locked_until else cap


@dataclass(frozen=True)
class _Run:
    """One delivery's run of an effect: its message, what counts as done, and what announces the outcome."""

    effect: SideEffect
    message: InboundMessage
    done: Outcome
    announce: Announce
    guard: Guard = lambda _: ()

    @property
    def name(self) -> str:
        return self.effect.name

    async def run(self, claim: SideEffectRecord, call: Callable[[str], Awaitable[Reply]], *, claimed: bool,
                  found: SideEffectRecord | None) -> Result:
        record = claim if claimed else await self._claim(claim, found)
        if isinstance(record, Result):
            return record
        try:
            reply = await call(record.idempotency_key)
        except DownstreamUnavailable as exc:
            await self._release(record)
            return Result(Outcome.TRANSIENT, f"{self.name}: {exc}", dependency_up=exc.slow)
        if is_transient_under_key(reply.status):  # 409: the first call, which this one overlaps, still runs
            await self._release(record)
            return Result(Outcome.TRANSIENT, f"{self.name}: HTTP {reply.status}" + (
                f", {IDENTITY_REFUSED}" if reply.status in NOT_ALLOWED else ""),
                          dependency_up=not is_unavailable(reply.status))
        if 200 <= reply.status < 300 or reply.refusal is not None:
            return await self._finish(record, reply)
        # The call itself is wrong, not the effect: nothing is recorded as its outcome, and the claim is left for
        # the delivery an operator resubmits once the cause is put right.
        reason = _reason(reply)
        if await self._release(record, response_status=reply.status, reason=reason) is None:
            settled = await self._read(record)  # another delivery wrote the record meanwhile: it may have finished
            if isinstance(settled, Result):
                return settled
        return Result(Outcome.DOWNSTREAM_REJECTED, f"{self.name}: HTTP {reply.status}"
                                                   + (f", reason: {reason}" if reason else "")
                                                   + "; the call was refused, not the effect: put the cause right and"
                                                     " resubmit, which calls again under the same key")

    async def _claim(self, record: SideEffectRecord, found: SideEffectRecord | None) -> SideEffectRecord | Result:
        effect, message = self.effect, self.message
        if found is None:
            try:
                return await self._create(record)
            except AlreadyExists:
                pass
        for _ in range(MAX_RACES):
            current = await (self._settled(found) if found is not None else self._read(record))
            found = None
            if isinstance(current, Result):
                return current
            if current.lease_until > effect.clock() and not _same_message(current, message):
                return Result(Outcome.IN_PROGRESS, f"{self.name}: claimed by message {current.message_sequence},"
                                                   f" attempt {current.attempt}, whose redeliveries finish it")
            if (deadline := message.lock_deadline) is not None and deadline.timestamp() <= effect.clock():
                # Our lock has run out, renewals included: the message is someone else's now, and so is the claim.
                return Result(Outcome.TRANSIENT, f"{self.name}: this delivery's lock ran out")
            taken = await effect.patch(current, announce=self.guard, status=EffectStatus.IN_PROGRESS,
                                       attempt=current.attempt + 1, message_sequence=message.sequence_number,
                                       lease_until=effect.lease_until(message.lock_deadline))
            if taken is not None:
                return taken
        return Result(Outcome.TRANSIENT, f"{self.name}: the claim kept changing under us")

    async def _create(self, record: SideEffectRecord) -> SideEffectRecord:
        """The claim created, with its guard in one batch: AlreadyExists when a claim stands; NoLongerAllowed when
        the guard does not hold."""
        guard = list(self.guard(record))
        try:
            [written, *_] = await self.effect.store.execute_batch(record.partition, [Create(record.to_document()),
                                                                                    *guard])
        except BatchFailed as exc:
            if exc.index == 0 and isinstance(exc.error, AlreadyExists):
                raise exc.error from exc
            failed = guard[exc.index - 1] if exc.index > 0 else None
            if isinstance(failed, Patch) and isinstance(exc.error, PreconditionFailed | NotFound):
                raise NoLongerAllowed(f"{self.name} claim {record.id}: {exc.error}", {}) from exc
            error = TransientStoreError if isinstance(exc.error, TransientStoreError) else StoreError
            raise error(f"{self.name} record {record.id}: {exc.error}", status=exc.error.status) from exc
        return SideEffectRecord.from_document(written)

    async def _finish(self, record: SideEffectRecord, reply: Reply) -> Result:
        """Record the call's answer (a 2xx completed it, a refusal rejected it), with what ``announce`` writes for
        it, in one batch. If the record changed while we called, read it again: finished by someone else, it
        stands; taken over by another delivery of our own message (one whose lock ran out, say), we finish it
        ourselves, since we hold the answer; taken by another message, that message's deliveries finish it."""
        status = EffectStatus.COMPLETED if 200 <= reply.status < 300 else EffectStatus.REJECTED
        answer: dict[str, Any] = {"status": status, "response_status": reply.status, "reference": reply.reference,
                  "refusal": reply.refusal, "finished_at": self.effect.clock()}
        for _ in range(MAX_RACES):
            finished = await self._announced(record, reason=_reason(reply), **answer,
                                             **({"announced": True} if record.announces else {}))
            if isinstance(finished, Result):
                return finished
            if finished is not None:
                return Result(self.done if status is EffectStatus.COMPLETED else Outcome.REJECTED, summary(finished))
            stored = await self.effect.find(record)
            if stored is not None and _closed_uncalled(stored) and status is EffectStatus.COMPLETED:
                # Closed by another delivery (its order cancelled) while this call ran past its lease, and the call
                # reserved after all: what it made is recorded, still unannounced.
                made = await self.effect.patch(stored, status=status, response_status=reply.status,
                                               reference=reply.reference, finished_at=answer["finished_at"])
                if made is not None:
                    return Result(Outcome.ORDER_CLOSED, f"{summary(made)}; the outcome is not announced")
                continue
            current = await self._read(record)
            if isinstance(current, Result):
                return current
            if not _same_message(current, self.message):
                return Result(Outcome.IN_PROGRESS, f"{self.name}: message {current.message_sequence} took the"
                                                   " claim over after our lease; it finishes the record")
            record = current
        return Result(Outcome.TRANSIENT, f"{self.name}: the record kept changing under us")

    async def _read(self, record: SideEffectRecord) -> SideEffectRecord | Result:
        """The stored record if still in progress; its verdict if finished; TRANSIENT if gone."""
        current = await self.effect.find(record)
        if current is None:  # removed under us: the redelivery claims it anew
            return Result(Outcome.TRANSIENT, f"{self.name}: record removed under us")
        return await self._settled(current)

    async def _settled(self, record: SideEffectRecord) -> SideEffectRecord | Result:
        """The verdict of a finished record, its outcome announced first if it ``announces`` it and the version that
        finished it did not; the record itself while it is in progress."""
        for _ in range(MAX_RACES):
            if record.status not in (EffectStatus.COMPLETED, EffectStatus.REJECTED) or not record.announces \
                    or record.announced:
                return _verdict(record, self.done)
            announced = await self._announced(record, announced=True)
            if isinstance(announced, Result):
                return announced
            if announced is not None:
                return _verdict(record, self.done)
            current = await self.effect.find(record)
            if current is None:
                return Result(Outcome.TRANSIENT, f"{self.name}: record removed under us")
            record = current
        return Result(Outcome.TRANSIENT, f"{self.name}: the record kept changing under us")

    async def _announced(self, record: SideEffectRecord, **changes: Any) -> SideEffectRecord | Result | None:
        """Patch ``changes`` onto the record with what ``announce`` writes for it: the record as it stands then, or
        None if it changed meanwhile. Where the announcement's conditions no longer hold (an order cancelled while
        its stock was reserved, or shipped before it was refused), the changes are written unannounced
        (``announces`` false, the reason why beside the downstream's): ORDER_CLOSED."""
        try:
            return await self.effect.patch(record, announce=self.announce, **changes)
        except NoLongerAllowed as exc:
            why = "; ".join(filter(None, [f"not announced: {exc}", changes.get("reason")]))[:MAX_REASON_CHARS]
            unannounced = {k: v for k, v in changes.items() if k != "announced"}
            finished = await self.effect.patch(record, **{**unannounced, "reason": why, "announces": False})
        if finished is None:
            return None
        return Result(Outcome.ORDER_CLOSED, f"{summary(finished)}; the outcome is not announced")

    async def _release(self, record: SideEffectRecord, **diagnosis: Any) -> SideEffectRecord | None:
        """End the lease early after a failed call, so that the redelivery may take over at once; with the
        answer that ended it (``response_status``, ``reason``) kept on the record for operators. None when the
        record changed meanwhile."""
        return await self.effect.patch(record, lease_until=self.effect.clock(), **diagnosis)


def _verdict(record: SideEffectRecord, done: Outcome) -> SideEffectRecord | Result:
    """``done`` or REJECTED for a finished record, ORDER_CLOSED for one finished unannounced because what it belongs
    to closed (``announces`` false); the record itself while it is in progress."""
    if record.status in (EffectStatus.COMPLETED, EffectStatus.REJECTED) and record.announces is False:
        return Result(Outcome.ORDER_CLOSED, summary(record))
    if record.status is EffectStatus.COMPLETED:
        return Result(done, summary(record))
    if record.status is EffectStatus.REJECTED:
        return Result(Outcome.REJECTED, summary(record))
    return record


def _closed_uncalled(record: SideEffectRecord) -> bool:
    """Whether the record was closed for what it belongs to (``close``) without a call of its own answering."""
    return record.status is EffectStatus.REJECTED and record.announces is False and record.response_status is None


def stored_claims(documents: Iterable[Mapping[str, Any]], within: str) -> Iterator[Document]:
    """Every claim among ``documents`` as a record of its own reads (for reports and proofs): the records of their
    own, and the claims kept in their subjects' documents under ``within``, each with the id, type and partition
    such a record would have."""
    tag = SideEffectRecord.__struct_config__.tag
    for document in documents:
        if document.get(TYPE_FIELD) == tag:
            yield dict(document)
        elif isinstance(kept := document.get(within), dict):
            yield _as_record(kept, document)


def _as_record(kept: Mapping[str, Any], subject: Mapping[str, Any]) -> Document:
    """A claim kept in ``subject`` as the document of a record of its own: what the subject gives it added."""
    key = str(subject["id"])
    return {**kept, TYPE_FIELD: SideEffectRecord.__struct_config__.tag, PARTITION_FIELD: key,
            "_etag": subject.get("_etag"),
            "id": identity.side_effect_id(str(kept.get("consumer")), str(kept.get("effect")), key)}


def _merge(stored: Document, patch: Patch) -> Patch:
    """``patch`` merged into ``stored`` (its document as read), on its etag: an object it sets is merged into the one
    that stands there. NoLongerAllowed when the document does not meet the patch's conditions but for ``ABSENT``."""
    if not _meets(stored, patch.condition):
        raise NoLongerAllowed(f"{stored.get('type')} {patch.doc_id} no longer meets {_conditions(patch)}", stored)
    fields = {name: {**stored[name], **value} if isinstance(value, dict) and isinstance(stored.get(name), dict)
              else value for name, value in patch.set_fields.items()}
    return Patch(patch.doc_id, fields, if_match=stored["_etag"])


def _meets(document: Document, condition: Mapping[str, Any]) -> bool:
    """Whether a stored document meets a patch's conditions but for ``ABSENT`` (which a merge resolves)."""
    for name, expected in condition.items():
        if expected is ABSENT:
            continue
        value = document.get(name)
        if not (value in expected if isinstance(expected, tuple) else value == expected):
            return False
    return True


def _conditions(patch: Patch) -> str:
    return ", ".join(f"{name} in {list(value)}" if isinstance(value, tuple) else f"{name} = {value}"
                     for name, value in patch.condition.items() if value is not ABSENT)


def _reason(reply: Reply) -> str | None:
    return (reply.reason or "")[:MAX_REASON_CHARS] or None


def _same_message(record: SideEffectRecord, message: InboundMessage) -> bool:
    """Whether this delivery is of the message that claimed the record; unknown counts as the same,
    because taking over is always safe (etag, same idempotency key) and leaving it might strand it."""
    if record.message_sequence is None or message.sequence_number is None:
        return True
    return record.message_sequence == message.sequence_number


def summary(record: SideEffectRecord) -> str:
    """The record's facts in one line: status, attempt, downstream status, reference, reason."""
    parts = [f"{record.effect} {record.status}", f"attempt {record.attempt}"]
    if record.response_status is not None:
        parts.append(f"HTTP {record.response_status}")
    if record.reference:
        parts.append(f"reference {record.reference}")
    if record.refusal:
        parts.append(f"refusal {record.refusal}")
    if record.reason:
        parts.append(f"reason: {record.reason}")
    return ", ".join(parts)
