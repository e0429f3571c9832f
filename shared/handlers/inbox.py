"""The inbox: apply a message's writes exactly once per consumer, as one transactional batch.

The batch is [create marker, *operations], in the message's partition. The marker's id is derived
from the consumer's name and the message's dedup key, so several consumers can share one container,
each applying every message once: a marker keyed on the message alone would let the first consumer
block the others. The happy path is that one batch request and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared.domain.documents import InboxMarker
from shared.domain.keys import derive_id
from shared.errors import AlreadyExists, BatchFailed, NotFound, StoreError, TransientStoreError
from shared.ports.store import BatchOperation, Create, DocumentStore


class InboxStatus(StrEnum):
    """What happened to one message at the inbox."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    PAYLOAD_MISMATCH = "payload_mismatch"
    OPERATION_FAILED = "operation_failed"


@dataclass(frozen=True)
class InboxResult:
    """The inbox's verdict. For OPERATION_FAILED, ``failed_operation`` indexes the caller's operations."""

    status: InboxStatus
    stored_hash: str | None = None
    failed_operation: int | None = None
    error: StoreError | None = None


class Inbox:
    """Per-consumer exactly-once application of writes, backed by markers with a TTL."""

    def __init__(self, store: DocumentStore, consumer_name: str, marker_ttl_seconds: int) -> None:
        self._store = store
        self.consumer_name = consumer_name
        self.marker_ttl_seconds = marker_ttl_seconds

    def marker_id(self, *dedup_key: str) -> str:
        """The marker's id: a legal Cosmos id, whatever the consumer name and key contain."""
        return derive_id("inbox", self.consumer_name, *dedup_key, label=self.consumer_name)

    async def apply(
        self,
        *,
        partition_key: str,
        dedup_key: Sequence[str],
        request_hash: str,
        operations: Sequence[BatchOperation],
        event: tuple[str, str, str] | None = None,
    ) -> InboxResult:
        """Write the marker and the operations atomically, or say why not.

        ``event`` is (type, time, id), kept on the marker for operators. A conflict on the marker means
        this consumer saw the key before: the stored hash decides between duplicate and payload
        mismatch. A failure of one of ``operations`` is returned for the caller to interpret; nothing
        was written. Transient failures raise TransientStoreError.
        """
        marker = InboxMarker(id=self.marker_id(*dedup_key), order_id=partition_key, consumer=self.consumer_name,
                             request_hash=request_hash, ttl=self.marker_ttl_seconds)
        if event is not None:
            marker.event_type, marker.event_time, marker.event_id = event
        try:
            await self._store.execute_batch(partition_key, [Create(marker.to_document()), *operations])
        except BatchFailed as exc:
            if exc.at(0, AlreadyExists):
                return await self._seen_before(marker.id, partition_key, request_hash)
            return InboxResult(InboxStatus.OPERATION_FAILED, failed_operation=exc.index - 1, error=exc.error)
        return InboxResult(InboxStatus.APPLIED)

    async def _seen_before(self, marker_id: str, partition_key: str, request_hash: str) -> InboxResult:
        try:
            stored = InboxMarker.from_document(await self._store.read(marker_id, partition_key))
        except NotFound as exc:
            # The marker expired between the conflict and the read; a redelivery will decide.
            raise TransientStoreError(f"marker {marker_id} vanished after a conflict") from exc
        if stored.request_hash == request_hash:
            return InboxResult(InboxStatus.DUPLICATE, stored_hash=stored.request_hash)
        return InboxResult(InboxStatus.PAYLOAD_MISMATCH, stored_hash=stored.request_hash)
