"""Two-phase records for side effects that cannot join a Cosmos transaction, such as an HTTP call.

claim (create, status in_progress, with a lease) -> call -> finish (etag-conditional replace, status
completed or failed). A redelivery reads the record: completed means don't call again; in_progress
with a live lease means another instance is at work; an expired lease is taken over with an
etag-conditional replace, and the call is repeated with the same idempotency key, so the service
drops the repeat. The create is the atomic claim: of two concurrent copies one gets 409.

The effect knows nothing of what it calls: the call answers with an ``EffectReply``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import msgspec

from shared.domain.documents import EffectStatus, SideEffectRecord
from shared.domain.keys import derive_id, idempotency_key
from shared.errors import AlreadyExists, BatchFailed, DownstreamUnavailable, NotFound
from shared.ports.store import DocumentStore, Replace

MAX_REASON_CHARS = 200


class ReplyKind(StrEnum):
    """How a call ended, as far as retrying goes."""

    SUCCEEDED = "succeeded"  # it happened: finish the record completed
    TRANSIENT = "transient"  # it may succeed later: release the lease, retry on redelivery
    REJECTED = "rejected"  # refused for good: finish the record failed


@dataclass(frozen=True)
class EffectReply:
    """What the call answered: its kind, the downstream status, and a reference or a short reason."""

    kind: ReplyKind
    status: int | None = None
    reference: str | None = None
    reason: str | None = None


class EffectOutcome(StrEnum):
    """What the caller should do with the message."""

    DONE = "done"  # the effect happened (now or before): complete
    BUSY = "busy"  # another instance holds a live lease
    TRANSIENT = "transient"  # the service may succeed later
    REJECTED = "rejected"  # the service refused for good: dead-letter DownstreamRejected


@dataclass(frozen=True)
class EffectResult:
    """The verdict, described for the log or the dead-letter description."""

    outcome: EffectOutcome
    description: str


@dataclass(frozen=True)
class SideEffect:
    """One named side effect of one consumer, recorded in the partition of the message it belongs to."""

    store: DocumentStore
    consumer: str
    name: str
    lease_seconds: int
    clock: Callable[[], float] = time.time

    def claim(self, order_id: str, dedup_key: tuple[str, ...], locked_until: datetime | None) -> SideEffectRecord:
        """The in_progress record; create it alone, or inside the batch that writes the message's documents."""
        key = idempotency_key(self.consumer, self.name, *dedup_key)
        return SideEffectRecord(
            id=derive_id("side-effect", self.consumer, self.name, *dedup_key, label=self.name), order_id=order_id,
            consumer=self.consumer, effect=self.name, idempotency_key=key, status=EffectStatus.IN_PROGRESS,
            attempt=1, lease_until=self._lease_until(locked_until),
        )

    def run(
        self,
        *,
        order_id: str,
        dedup_key: tuple[str, ...],
        locked_until: datetime | None,
        call: Callable[[str], EffectReply],
        claimed: SideEffectRecord | None = None,
    ) -> EffectResult:
        """Claim (unless ``claimed`` is the record already created), call, and finish the record."""
        record = claimed or self._claim(order_id, dedup_key, locked_until)
        if isinstance(record, EffectResult):
            return record
        try:
            reply = call(record.idempotency_key)
        except DownstreamUnavailable as exc:
            self._release(record)
            return EffectResult(EffectOutcome.TRANSIENT, f"{self.name}: {exc}")
        if reply.kind is ReplyKind.SUCCEEDED:
            return self._finish(record, EffectStatus.COMPLETED, reply, EffectOutcome.DONE)
        if reply.kind is ReplyKind.TRANSIENT:
            self._release(record)
            return EffectResult(EffectOutcome.TRANSIENT, f"{self.name}: HTTP {reply.status}")
        return self._finish(record, EffectStatus.FAILED, reply, EffectOutcome.REJECTED)

    def _claim(
        self, order_id: str, dedup_key: tuple[str, ...], locked_until: datetime | None
    ) -> SideEffectRecord | EffectResult:
        record = self.claim(order_id, dedup_key, locked_until)
        try:
            return SideEffectRecord.from_document(self.store.create(record.to_document()))
        except AlreadyExists:
            pass
        try:
            current = SideEffectRecord.from_document(self.store.read(record.id, order_id))
        except NotFound:  # expired or removed between the 409 and the read
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: record changed under us")
        if current.status is EffectStatus.COMPLETED:
            return EffectResult(EffectOutcome.DONE, summary(current))
        if current.status is EffectStatus.FAILED:
            return EffectResult(EffectOutcome.REJECTED, summary(current))
        if current.lease_until > self.clock():
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: attempt {current.attempt} holds a live lease")
        return self._take_over(current, locked_until)

    def _take_over(self, current: SideEffectRecord, locked_until: datetime | None) -> SideEffectRecord | EffectResult:
        taken = msgspec.structs.replace(current, attempt=current.attempt + 1,
                                        lease_until=self._lease_until(locked_until))
        written = self._replace(current, taken)
        if written is None:
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: another instance took the expired lease")
        return written

    def _finish(
        self, record: SideEffectRecord, status: EffectStatus, reply: EffectReply, outcome: EffectOutcome
    ) -> EffectResult:
        finished = msgspec.structs.replace(
            record, status=status, response_status=reply.status, reference=reply.reference,
            reason=(reply.reason or "")[:MAX_REASON_CHARS] or None, finished_at=self.clock(),
        )
        if self._replace(record, finished) is None:
            # Our lease was taken over while we called; the other instance finishes the record.
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: lease lost before the record was finished")
        return EffectResult(outcome, summary(finished))

    def _release(self, record: SideEffectRecord) -> None:
        """End the lease early after a failed call, so that the redelivery may take over at once."""
        self._replace(record, msgspec.structs.replace(record, lease_until=self.clock()))

    def _replace(self, current: SideEffectRecord, new: SideEffectRecord) -> SideEffectRecord | None:
        """Write ``new`` if ``current`` is still what is stored; None if someone else changed it."""
        try:
            [written] = self.store.execute_batch(current.order_id, [Replace(new.to_document(), current.etag)])
        except BatchFailed:
            return None
        return SideEffectRecord.from_document(written)

    def _lease_until(self, locked_until: datetime | None) -> float:
        cap = self.clock() + self.lease_seconds
        return min(cap, locked_until.timestamp()) if locked_until else cap


def summary(record: SideEffectRecord) -> str:
    """The record's facts in one line: status, attempt, downstream status, reference, reason."""
    parts = [f"{record.effect} {record.status}", f"attempt {record.attempt}"]
    if record.response_status is not None:
        parts.append(f"HTTP {record.response_status}")
    if record.reference:
        parts.append(f"reference {record.reference}")
    if record.reason:
        parts.append(f"reason: {record.reason}")
    return ", ".join(parts)
