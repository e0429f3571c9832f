"""Two-phase records for side effects that cannot join a Cosmos transaction, such as an HTTP call.

claim (create, status in_progress, with a lease) -> call -> finish (etag-conditional replace, status
completed or failed). A redelivery reads the record: completed means don't call again; in_progress
with a live lease means another instance is at work; an expired lease is taken over with an
etag-conditional replace, and the call is repeated with the same idempotency key, so the service
drops the repeat. The create is the atomic claim: of two concurrent copies one gets 409.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from shared.errors import AlreadyExists, BatchFailed, DownstreamUnavailable, NotFound
from shared.fulfilment import Reply
from shared.keys import derive_id, idempotency_key
from shared.store import Document, DocumentStore, Replace

RECORD_TYPE = "side-effect"
MAX_REASON_CHARS = 200


class EffectStatus(StrEnum):
    """Status of a side-effect record."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class EffectOutcome(StrEnum):
    """What the caller should do with the message."""

    DONE = "done"  # the effect happened (now or before): complete
    BUSY = "busy"  # another instance holds a live lease: abandon
    TRANSIENT = "transient"  # the service may succeed later: abandon
    REJECTED = "rejected"  # the service refused for good: dead-letter DownstreamRejected


@dataclass(frozen=True)
class EffectResult:
    """The verdict with its record's facts (status, attempt, reservation) for the log or dead-letter."""

    outcome: EffectOutcome
    description: str
    record: Mapping[str, Any]


@dataclass(frozen=True)
class SideEffect:
    """One named side effect of one consumer, recorded in the partition of the message it belongs to."""

    store: DocumentStore
    consumer: str
    name: str
    lease_seconds: int
    clock: Callable[[], float] = time.time

    def key(self, *dedup_key: str) -> str:
        """The idempotency key sent downstream."""
        return idempotency_key(self.consumer, self.name, *dedup_key)

    def claim_document(self, partition_key: str, dedup_key: tuple[str, ...], locked_until: datetime | None) -> Document:
        """The in_progress record; create it alone, or inside the batch that writes the message's documents."""
        return {
            "id": derive_id(RECORD_TYPE, self.consumer, self.name, *dedup_key, label=self.name),
            self.store.partition_key_field: partition_key,
            "type": RECORD_TYPE,
            "consumer": self.consumer,
            "effect": self.name,
            "idempotencyKey": self.key(*dedup_key),
            "status": EffectStatus.IN_PROGRESS.value,
            "attempt": 1,
            "leaseUntil": self._lease_until(locked_until),
        }

    def run(
        self,
        *,
        partition_key: str,
        dedup_key: tuple[str, ...],
        locked_until: datetime | None,
        call: Callable[[str], Reply],
        claimed: Document | None = None,
    ) -> EffectResult:
        """Claim (unless ``claimed`` is the record already created), call, and finish the record."""
        record = claimed or self._claim(partition_key, dedup_key, locked_until)
        if isinstance(record, EffectResult):
            return record
        try:
            reply = call(record["idempotencyKey"])
        except DownstreamUnavailable as exc:
            self._release(record)
            return EffectResult(EffectOutcome.TRANSIENT, f"{self.name}: {exc}", record)
        if reply.succeeded:
            return self._finish(record, EffectStatus.COMPLETED, reply, EffectOutcome.DONE)
        if reply.transient:
            self._release(record)
            return EffectResult(EffectOutcome.TRANSIENT, f"{self.name}: HTTP {reply.status}", record)
        return self._finish(record, EffectStatus.FAILED, reply, EffectOutcome.REJECTED)

    def _claim(
        self, partition_key: str, dedup_key: tuple[str, ...], locked_until: datetime | None
    ) -> Document | EffectResult:
        document = self.claim_document(partition_key, dedup_key, locked_until)
        try:
            return self.store.create(document)
        except AlreadyExists:
            pass
        try:
            current = self.store.read(document["id"], partition_key)
        except NotFound:  # expired or removed between the 409 and the read
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: record changed under us", document)
        status = current.get("status")
        if status == EffectStatus.COMPLETED:
            return EffectResult(EffectOutcome.DONE, _summary(self.name, current), current)
        if status == EffectStatus.FAILED:
            return EffectResult(EffectOutcome.REJECTED, _summary(self.name, current), current)
        if float(current.get("leaseUntil", 0)) > self.clock():
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: attempt {current.get('attempt')} holds a live lease",
                                current)
        return self._take_over(current, locked_until)

    def _take_over(self, current: Document, locked_until: datetime | None) -> Document | EffectResult:
        taken = {**_plain(current), "attempt": int(current.get("attempt", 1)) + 1,
                 "leaseUntil": self._lease_until(locked_until)}
        try:
            [written] = self.store.execute_batch(
                taken[self.store.partition_key_field], [Replace(taken, if_match=current["_etag"])]
            )
        except BatchFailed:
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: another instance took the expired lease", current)
        return written

    def _finish(self, record: Document, status: EffectStatus, reply: Reply, outcome: EffectOutcome) -> EffectResult:
        finished = {
            **_plain(record),
            "status": status.value,
            "responseStatus": reply.status,
            "reservationId": reply.body.get("reservationId"),
            "reason": str(reply.body.get("reason", ""))[:MAX_REASON_CHARS] or None,
            "finishedAt": self.clock(),
        }
        try:
            self.store.execute_batch(
                record[self.store.partition_key_field], [Replace(finished, if_match=record["_etag"])]
            )
        except BatchFailed:
            # Our lease was taken over while we called; the other instance finishes the record.
            return EffectResult(EffectOutcome.BUSY, f"{self.name}: lease lost before the record was finished",
                                record)
        return EffectResult(outcome, _summary(self.name, finished), finished)

    def _release(self, record: Document) -> None:
        """End the lease early after a failed call, so that the redelivery may take over at once."""
        released = {**_plain(record), "leaseUntil": self.clock()}
        try:
            self.store.execute_batch(
                record[self.store.partition_key_field], [Replace(released, if_match=record["_etag"])]
            )
        except BatchFailed:
            return  # someone else holds the record now; nothing to release

    def _lease_until(self, locked_until: datetime | None) -> float:
        cap = self.clock() + self.lease_seconds
        return min(cap, locked_until.timestamp()) if locked_until else cap


def _plain(document: Document) -> Document:
    return {k: v for k, v in document.items() if not k.startswith("_")}


def _summary(name: str, record: Mapping[str, Any]) -> str:
    parts = [f"{name} {record.get('status')}", f"attempt {record.get('attempt')}"]
    if record.get("responseStatus") is not None:
        parts.append(f"HTTP {record.get('responseStatus')}")
    if record.get("reservationId"):
        parts.append(f"reservation {record.get('reservationId')}")
    if record.get("reason"):
        parts.append(f"reason: {record.get('reason')}")
    return ", ".join(parts)
