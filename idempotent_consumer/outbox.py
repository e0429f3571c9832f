"""The transactional outbox's publisher: the order's outcome is written with its reservation's finish and published
afterwards.

The outbox entry (``OutboxEntry``: OrderAccepted, or OrderRejected) is created in the same transactional
batch as the finish of the order's reservation record, in its partition, so the outcome never exists without
what it announces, nor a finished reservation without its outcome. The publisher sends pending entries (from
the change feed, and from the sweep for anything the feed missed), one send per hundred entries of a
destination, and then deletes each on the etag it was read with (one delete costs half a patch, and leaves no
document for a TTL to remove). With ``dispatched_ttl_seconds`` above 0 it marks them dispatched instead and keeps
them that long: a patch of ``status``, ``dispatchedAt`` and ``ttl`` on the etag as read, so the fields this version
does not model are kept. One that finds the entry changed (412) reads it again and finishes it on its new
etag while it is still pending and still the message sent. A delete (or mark) that meets a transient failure is
tried again at once, up to ``FINISH_TRIES`` in all; one that still fails, or a crash between send and delete,
leaves the entry pending, and the change feed or the sweep resends the same MessageId, which the destination's
duplicate detection (inside its window) and its consumers' idempotency absorb.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from idempotent_consumer.errors import (
    BatchFailed,
    ConsumerError,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
)
from idempotent_consumer.ports.sender import MessageSender, OutgoingMessage
from idempotent_consumer.ports.store import BatchOperation, Delete, DocumentStore, Patch
from idempotent_consumer.records import OutboxEntry, OutboxStatus

logger = logging.getLogger("idempotent_consumer.outbox")
#: Entries per send: the sender splits a send that does not fit one batch, this keeps a send's marks close.
SEND_CHUNK = 100
#: Tries of a sent entry's delete (or mark) that meets a transient failure (a 503, a timeout), at once, before the
#: entry is left pending for the sweep: the sweep resends it minutes later, past a short duplicate-detection window.
FINISH_TRIES = 3


def outgoing_message(entry: OutboxEntry) -> OutgoingMessage:
    """The message an outbox entry stands for."""
    return OutgoingMessage(
        message_id=entry.message_id, body=entry.body(), correlation_id=entry.correlation_id,
        session_id=entry.session_id, subject=entry.subject, application_properties={"type": entry.subject},
    )


@dataclass(frozen=True)
class PublishReport:
    """What one publisher run did, by outbox document id."""

    dispatched: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: int = 0


class OutboxPublisher:
    """Sends pending outbox entries, then deletes them (``dispatched_ttl_seconds`` 0) or marks them dispatched and
    keeps them that long."""

    def __init__(
        self,
        store: DocumentStore,
        sender: MessageSender,
        *,
        dispatched_ttl_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._sender = sender
        self._ttl = dispatched_ttl_seconds
        self._clock = clock

    async def publish(self, documents: Iterable[Mapping[str, Any]]) -> PublishReport:
        """Publish the pending outbox entries among ``documents`` (a change-feed batch holds others too).

        The entries go out in sends of at most ``SEND_CHUNK`` per destination, each followed by the marks of
        its entries, so that a backlog costs one send per chunk rather than one per entry. A chunk whose send
        fails is sent again one entry at a time. An entry that fails is logged and left pending for the
        next change or the sweep.
        """
        pending: list[OutboxEntry] = []
        failed: list[str] = []
        skipped = 0
        for document in documents:
            if not OutboxEntry.is_kind(document):
                skipped += 1
                continue
            try:
                entry = OutboxEntry.from_document(document)
            except UnreadableDocument as exc:
                logger.warning("outbox entry not published: %s; left pending", exc)
                failed.append(exc.doc_id)
                continue
            if entry.status is not OutboxStatus.PENDING:
                skipped += 1
            elif entry.etag is None:  # a delete or mark without one would be unconditional; the sweep reads it with one
                _not_published(entry, StoreError(f"outbox {entry.id} was not read from the store; no etag to delete"
                                                 " or mark it on"))
                failed.append(entry.id)
            else:
                pending.append(entry)
        dispatched: list[str] = []
        for chunk in _chunks(pending):
            await self._publish_chunk(chunk, dispatched, failed)
        return PublishReport(tuple(dispatched), tuple(failed), skipped)

    async def _publish_chunk(self, chunk: list[OutboxEntry], dispatched: list[str], failed: list[str]) -> None:
        """One send for the chunk, then each entry's delete (or mark); the ids go to ``dispatched`` or ``failed``."""
        try:
            await self._sender.send(chunk[0].destination, [outgoing_message(entry) for entry in chunk])
        except ConsumerError as exc:
            if len(chunk) == 1:
                _not_published(chunk[0], exc)
                failed.append(chunk[0].id)
                return
            # One entry that cannot be sent (too large, refused) must not hold back the others, and a
            # destination that takes no batches (a partitioned entity whose messages differ in partition
            # key) still gets every entry: the chunk again, one entry per send.
            logger.warning("a send of %d outbox entries failed: %s; sending them one by one", len(chunk), exc)
            for entry in chunk:
                await self._publish_chunk([entry], dispatched, failed)
            return
        for entry in chunk:
            try:
                await self._finish(entry)
                dispatched.append(entry.id)
            except ConsumerError as exc:
                _not_published(entry, exc)
                failed.append(entry.id)

    async def sweep(self, *, stuck_after_seconds: int) -> PublishReport:
        """Publish every pending outbox entry older than the threshold, a query page at a time.

        The sweep reads through all the pages rather than a first batch of them, so that an entry whose
        mark failed after its send is resent by the next sweep, inside the destination's duplicate-detection
        window, however long the backlog ahead of it.
        """
        conditions, before = OutboxEntry.pending_before(self._clock() - stuck_after_seconds)
        reports: list[PublishReport] = []
        async for page in self._store.query_pages(conditions, before=before):
            if page:
                reports.append(await self.publish(page))
        found = sum(len(r.dispatched) + len(r.failed) + r.skipped for r in reports)
        if found:
            logger.warning("sweep found %d stuck outbox documents", found, extra={"stuck": found})
        return PublishReport(tuple(i for r in reports for i in r.dispatched),
                             tuple(i for r in reports for i in r.failed), sum(r.skipped for r in reports))

    async def _finish(self, entry: OutboxEntry) -> None:
        """Delete a sent entry, or mark it dispatched where it is kept, on the etag it was read with.

        One changed since it was read (412) is read again: still pending, and still the message that was sent
        (a writer set a field of the entry that is not the message's: ``due`` by ``sbctl index backfill``, another
        writer's own field), it is finished on its new etag, since it went out; otherwise it is left (gone;
        finished by another publisher; or its message changed, which its next change-feed delivery or the sweep
        sends)."""
        sent = outgoing_message(entry)
        for tries_left in range(FINISH_TRIES - 1, -1, -1):
            try:
                await self._store.execute_batch(entry.partition, [self._done(entry)])
                break
            except BatchFailed as exc:
                if isinstance(exc.error, NotFound):
                    break  # gone: another publisher sent it and deleted it (or its mark's ttl ran out)
                if isinstance(exc.error, PreconditionFailed):
                    current = await self._still_sent(entry, sent)
                    if current is None or not tries_left:
                        break
                    entry = current
                    continue
                if not isinstance(exc.error, TransientStoreError) or not tries_left:
                    raise
            except TransientStoreError:
                if not tries_left:
                    raise
        logger.info("outbox %s dispatched messageId=%s", entry.id, entry.message_id,
                    extra={"outboxId": entry.id, "messageId": entry.message_id})


    def _done(self, entry: OutboxEntry) -> BatchOperation:
        """The entry's finish, on its etag: its delete, or its mark where sent entries are kept."""
        if self._ttl:
            _, mark = entry.with_changes(status=OutboxStatus.DISPATCHED, dispatched_at=self._clock(), ttl=self._ttl)
            return Patch(entry.id, mark, if_match=entry.etag, etag_only=True)
        return Delete(entry.id, entry.etag)

    async def _still_sent(self, entry: OutboxEntry, sent: OutgoingMessage) -> OutboxEntry | None:
        """The entry as it stands now, if it is still pending and still the message ``sent``; else None."""
        try:
            current = OutboxEntry.from_document(await self._store.read(entry.id, entry.partition))
        except (NotFound, UnreadableDocument):
            return None
        if current.status is not OutboxStatus.PENDING or current.destination != entry.destination \
                or outgoing_message(current) != sent:
            return None
        return current


def _chunks(entries: list[OutboxEntry]) -> Iterator[list[OutboxEntry]]:
    """The entries by destination, in their order, in lists of at most SEND_CHUNK."""
    by_destination: dict[str, list[OutboxEntry]] = {}
    for entry in entries:
        by_destination.setdefault(entry.destination, []).append(entry)
    for group in by_destination.values():
        for start in range(0, len(group), SEND_CHUNK):
            yield group[start:start + SEND_CHUNK]


def _not_published(entry: OutboxEntry, error: Exception) -> None:
    logger.warning("outbox %s not published: %s; left pending", entry.id, error,
                   extra={"outboxId": entry.id, "orderId": entry.partition})
