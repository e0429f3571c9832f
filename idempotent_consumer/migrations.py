"""Moving a container in use to the lean indexing policy: ``due`` set on the records a release before wrote.

The timers (the outbox sweep, the stuck report) find what they look for by ``type`` and ``due`` alone, the
paths the lean policy indexes (``DUE_FIELD``). A pending outbox entry, a claim in progress or an event still
parked that a release before ``due`` wrote carries none, so those queries miss it until ``set_due`` has set
it: every record of those kinds, read through all the pages (by ``type``, which both policies index), that
lacks the field is patched with its due as its state gives it, on the etag it was read with. One that changed
meanwhile was written by this release (whose every write sets ``due``), or is gone: it is left. Run once
every host runs this release; then the policy may drop what the release before queried (docs/operations.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from idempotent_consumer.errors import BatchFailed, NotFound, PreconditionFailed, UnreadableDocument
from idempotent_consumer.ports.store import DocumentStore, Patch, query_all
from idempotent_consumer.records import (
    DUE_FIELD,
    TYPE_FIELD,
    OutboxEntry,
    ParkedEvent,
    SideEffectRecord,
    StoredDocument,
)

#: The kinds the timers look for, each of which carries ``due``.
TIMED: tuple[type[StoredDocument], ...] = (OutboxEntry, SideEffectRecord, ParkedEvent)


async def set_due(store: DocumentStore) -> Counter[str]:
    """Set ``due`` on every record of the timed kinds that lacks it; what was done, counted by kind and outcome:
    ``<kind> set``, ``<kind> already`` (it carried one), ``<kind> changed`` (written meanwhile, or gone, left),
    ``<kind> unreadable`` (a newer version's, left to it)."""
    counts: Counter[str] = Counter()
    for kind in TIMED:
        tag = str(kind.__struct_config__.tag)
        for document in await query_all(store, {TYPE_FIELD: tag}):
            if DUE_FIELD in document:
                counts[f"{tag} already"] += 1
                continue
            counts[f"{tag} {await _set_one(store, kind, document)}"] += 1
    return counts


async def _set_one(store: DocumentStore, kind: type[StoredDocument], document: dict[str, Any]) -> str:
    try:
        record = kind.from_document(document)
    except UnreadableDocument:
        return "unreadable"
    try:
        await store.execute_batch(record.partition, [Patch(record.id, {DUE_FIELD: record.due()},
                                                           if_match=document["_etag"], etag_only=True)])
    except BatchFailed as exc:
        if isinstance(exc.error, PreconditionFailed | NotFound):
            return "changed"
        raise exc.error from exc
    return "set"
