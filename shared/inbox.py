"""The inbox: apply a message's writes exactly once per consumer, as one transactional batch.

The batch is [create marker, *operations], in the message's partition. The marker's id is derived
from the consumer's name and the message's dedup key, so several consumers can share one container,
each applying every message once: a marker keyed on the message alone would let the first consumer
block the others. The happy path is that one batch request and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.errors import AlreadyExists, BatchFailed, NotFound, TransientStoreError
from shared.keys import derive_id
from shared.store import BatchOperation, Create, DocumentStore

MARKER_TYPE = "inbox"


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
    failed_status: int | None = None


class Inbox:
    """Per-consumer exactly-once application of writes, backed by markers with a TTL."""

    def __init__(self, store: DocumentStore, consumer_name: str, marker_ttl_seconds: int) -> None:
        self._store = store
        self.consumer_name = consumer_name
        self.marker_ttl_seconds = marker_ttl_seconds

    def marker_id(self, *dedup_key: str) -> str:
        """The marker's id: a legal Cosmos id, whatever the consumer name and key contain."""
        return derive_id(MARKER_TYPE, self.consumer_name, *dedup_key, label=self.consumer_name)

    def apply(
        self,
        *,
        partition_key: str,
        dedup_key: Sequence[str],
        request_hash: str,
        operations: Sequence[BatchOperation],
        marker_fields: Mapping[str, Any] | None = None,
    ) -> InboxResult:
        """Write the marker and the operations atomically, or say why not.

        A 409 on the marker means this consumer saw the key before: the stored hash decides between
        duplicate and payload mismatch. A failure of one of ``operations`` is returned for the caller
        to interpret; nothing was written. Transient failures raise TransientStoreError.
        """
        marker_id = self.marker_id(*dedup_key)
        marker = {
            **(marker_fields or {}),
            "id": marker_id,
            self._store.partition_key_field: partition_key,
            "type": MARKER_TYPE,
            "consumer": self.consumer_name,
            "requestHash": request_hash,
            "ttl": self.marker_ttl_seconds,
        }
        try:
            self._store.execute_batch(partition_key, [Create(marker), *operations])
        except BatchFailed as exc:
            if exc.index == 0 and exc.status == 409:
                return self._seen_before(marker_id, partition_key, request_hash)
            return InboxResult(InboxStatus.OPERATION_FAILED, failed_operation=exc.index - 1, failed_status=exc.status)
        except AlreadyExists:  # pragma: no cover - adapters report batch conflicts as BatchFailed
            return self._seen_before(marker_id, partition_key, request_hash)
        return InboxResult(InboxStatus.APPLIED)

    def _seen_before(self, marker_id: str, partition_key: str, request_hash: str) -> InboxResult:
        try:
            stored = self._store.read(marker_id, partition_key)
        except NotFound as exc:
            # The marker expired between the 409 and the read; a redelivery will decide.
            raise TransientStoreError(f"marker {marker_id} vanished after a conflict", status=404) from exc
        stored_hash = stored.get("requestHash")
        if stored_hash == request_hash:
            return InboxResult(InboxStatus.DUPLICATE, stored_hash=stored_hash)
        return InboxResult(InboxStatus.PAYLOAD_MISMATCH, stored_hash=str(stored_hash))
