"""The idempotent OrderPlaced handler: the create is the duplicate check, then stock is reserved once.

One transactional batch (the ordered mode's ``Intake``) creates the order and the claim of the stock reservation; the
reservation call follows, and its record is finished before the message is completed, in one batch with
the order's outcome in the outbox: OrderAccepted when the stock is reserved, OrderRejected (and the
rejection on the order) when the service refused it for good. So what the app announces follows what
happened, and an order announces one outcome, once. A copy finds the order's id taken: the requestHash
stored with the claim decides between duplicate and payload mismatch, and a duplicate finishes a
reservation that is not yet confirmed. There is no read before the write: a read-then-write would let
two concurrent copies both see "absent". A copy that meets documents at the order's id this version
cannot decode (a newer version broke the additive rule; docs/design.md, "Schema versions") decides by
the requestHash they still hold and leaves the reservation to the version that wrote them; where no
requestHash reads, and the order does not decide it either, it is dead-lettered UnreadableDocument,
never called a mismatch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import msgspec

from idempotent_consumer.errors import (
    LimitExceeded,
    NoLongerAllowed,
    OrderChanged,
    OrderIdTaken,
    StoreError,
    TransientStoreError,
    UnreadableDocument,
)
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.writes import Intake, Releases, read_known, waiting
from idempotent_consumer.outcomes import Outcome, Result, parsed
from idempotent_consumer.ports.store import (
    ABSENT,
    MAX_RACES,
    BatchOperation,
    Create,
    Document,
    DocumentStore,
    Patch,
)
from idempotent_consumer.records import EffectStatus, SideEffectRecord
from idempotent_consumer.side_effects import SideEffect
from shared.domain import documents, identity
from shared.domain.aggregate import ORDERS
from shared.domain.aggregate import order as order_state
from shared.domain.documents import OrderDocument, OrderRejected
from shared.domain.lifecycle import CANCELLED, OPEN_STATUSES, RESERVABLE_STATUSES
from shared.domain.orders import OrderPlaced, parse_order, utc_text
from shared.ports.fulfilment import FulfilmentService, reservation_request
from shared.settings import Settings

RESERVE_STOCK = "reserve-stock"
#: The order document's field that keeps its reservation claim, where it is kept there (RESERVATION_CLAIM_IN_ORDER).
RESERVATION_CLAIM = "reservationClaim"
# The order app's compatibility with its own history (the library's ``SideEffect.announces``): releases before
# the reservation's finish announced OrderAccepted at the intake, so this release's claims say that their finish
# announces, and a record finished without it is announced by the next delivery.
ANNOUNCES_AT_FINISH = True


def failed_as_ended(document: Document) -> Document:
    """The order app's compatibility with its own history (the library's ``SideEffect.upgrade``): releases before
    REJECTED marked a reservation ``failed`` for any answer neither 2xx nor transient. Such a record reads as a claim
    whose lease has ended, which the next delivery (an operator's resubmission) takes over and calls again."""
    lease, finished = document.get("leaseUntil"), document.get("finishedAt") or 0.0
    if document.get("status") != "failed" or not isinstance(lease, int | float) \
            or not isinstance(finished, int | float):
        return document  # what does not read so stays as stored: its decoding names what is wrong
    return {**document, "status": EffectStatus.IN_PROGRESS.value, "leaseUntil": min(lease, finished)}


@dataclass(frozen=True)
class OrderServices:
    """What process_order works with: the store, the fulfilment service, the settings, a clock, and the writer
    of releases (``Releases``, the one that plans their batches)."""

    store: DocumentStore
    fulfilment: FulfilmentService
    settings: Settings
    clock: Callable[[], float] = field(default=time.time)
    releases: type[Releases] = Releases


def reservation(store: DocumentStore, settings: Settings, clock: Callable[[], float] = time.time) -> SideEffect:
    """The order's stock reservation as the library's two-phase effect: its claim a document of its own, or kept in
    the order (``RESERVATION_CLAIM``) where RESERVATION_CLAIM_IN_ORDER says so; both forms are read."""
    return SideEffect(store, settings.consumer_name, RESERVE_STOCK, settings.side_effect_lease_seconds, clock,
                      announces=ANNOUNCES_AT_FINISH, upgrade=failed_as_ended, within=RESERVATION_CLAIM,
                      write_within=settings.reservation_claim_in_order)


async def place_order(message: InboundMessage, services: OrderServices) -> Result:
    """Validate; write the order's intake in one batch; on a taken id compare request hashes; then
    reserve stock through the two-phase record. Other errors propagate: the delivery policy abandons."""
    order = parsed(message, parse_order)
    if isinstance(order, Result):
        return order
    hash_, settings = order.request_hash(), services.settings
    effect = reservation(services.store, settings, services.clock)
    claim = effect.claim(order.order_id, message, hash_)
    placed = OrderDocument.placed(order, message, hash_).to_document()
    intake = Intake(order.order_id, {**placed, **effect.subject_fields(claim)}, []) if effect.write_within else \
        Intake(order.order_id, placed, [("claim", Create(claim.to_document()))])
    releases = services.releases(services.store, settings.consumer_name, settings.parked_set_aside_ttl_seconds, ORDERS)
    try:
        written = await _write(intake, claim, hash_, releases, effect)
        if isinstance(written, Result):
            return written
        done, record, intake_adopts = written
        if done is Outcome.DUPLICATE and (record is None or record.status is EffectStatus.IN_PROGRESS):
            # Its reservation is not finished, so neither may be the release its order began (the release
            # is written before the call): this delivery finishes both.
            await releases.finish(order.order_id)
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"create failed: {exc}", hash_)
    except UnreadableDocument as exc:
        return _unreadable(order.order_id, exc, hash_)
    except LimitExceeded as exc:
        return Result(Outcome.LIMIT_EXCEEDED, f"order {order.order_id}: {exc} ({exc.limit})", hash_)
    try:
        return await _reserve(order, message, services, effect, unwritten=claim, record=record, done=done,
                              adopted=done is Outcome.CREATED and intake_adopts)
    except TransientStoreError as exc:
        return Result(Outcome.TRANSIENT, f"reservation record: {exc}", hash_)
    except UnreadableDocument as exc:  # rewritten, under the call, by a version whose record this one cannot read
        return _left_to_writer(order.order_id, exc, hash_)  # the order is this content's: it was created, or compared


async def _reserve(order: OrderPlaced, message: InboundMessage, services: OrderServices, effect: SideEffect, *,
                   unwritten: SideEffectRecord, record: SideEffectRecord | None, done: Outcome,
                   adopted: bool) -> Result:
    """Reserve the order's stock through its two-phase record, never for a cancelled order: not for one the events its
    own intake released cancelled (``adopted``: it took a pending order's place), nor on a takeover that finds it
    cancelled since its claim was written (while its copy waited out an outage)."""
    created, claim = done is Outcome.CREATED, record or unwritten
    hash_ = unwritten.request_hash or ""
    if adopted and (closed := await _closed(services.store, order.order_id)) is not None:
        return await _close(effect, claim, order.order_id, closed, hash_, called=False)
    request = reservation_request(order)
    try:
        return await effect.run(claim, message, lambda key: services.fulfilment.reserve(key, request),
                                done=done, claimed=created, found=None if created else record,
                                announce=functools.partial(_outcome, order, message, services),
                                guard=lambda taken: [_while(RESERVABLE_STATUSES, order.order_id,
                                                            {"reservationAttempt": taken.attempt})])
    except NoLongerAllowed as exc:
        refused = exc.document  # the order as the guard's merge read it, or nothing read yet
    if refused:
        status = refused.get("status")
    else:
        status = (await read_known(services.store, ORDERS, order.order_id)).subject.status
    if status == CANCELLED:
        return await _close(effect, claim, order.order_id, str(status), hash_, called=True)
    if status in RESERVABLE_STATUSES:
        return Result(Outcome.TRANSIENT, f"order {order.order_id} changed under its reservation's takeover", hash_)
    return Result(Outcome.IN_PROGRESS, f"order {order.order_id} is {status}, a status this version does not know:"
                                       " its reservation is left to the version that does", hash_)


def check_order(message: InboundMessage) -> Result | None:
    """What needs no dependency to decide: the final result of a delivery that is no valid OrderPlaced, else None."""
    verdict = parsed(message, parse_order)
    return verdict if isinstance(verdict, Result) else None


async def _write(
    intake: Intake, claim: SideEffectRecord, hash_: str, releases: Releases, effect: SideEffect
) -> tuple[Outcome, SideEffectRecord | None, bool] | Result:
    """CREATED with the claim as written, DUPLICATE with the claim as read (or None), or a final Result; and
    whether the intake took a pending order's place (and released what waited on it).

    A copy's one read is of the reservation claim, written in the order's batch, which holds both the
    first content's requestHash and the reservation's state. Only without a claim that names a hash
    (a pending order at the id, a record from before the hash was kept) does it read the order too:
    one more request on those paths. A pending order means events came first and are parked: the
    order takes its place, with the parked events it releases, in the same batch.
    """
    order_id, store = intake.key, releases.store
    for _ in range(MAX_RACES):
        unread: UnreadableDocument | None = None  # the claim, not decoding and naming no hash: the order decides
        found: SideEffectRecord | None = None
        try:
            written = await intake.write(releases)
            created = effect.held(written[releases.part]) if effect.write_within else \
                SideEffectRecord.from_document(written["claim"])
            if created is None:
                raise StoreError(f"order {order_id}: its reservation claim was not written with it")
            return Outcome.CREATED, created, intake.adopting is not None
        except OrderIdTaken:
            try:
                found = await effect.find(claim, subject_next=True)  # the order is read below when it finds none
            except UnreadableDocument as exc:
                if exc.request_hash is not None:
                    return _unreadable(order_id, exc, hash_)
                found, unread = None, exc
            if found is not None and found.request_hash is not None:
                return _with_adoption(_seen(order_id, found.request_hash, hash_, found))
        except OrderChanged:
            pass  # the pending order, or an event parked against it, moved: read again
        stored = await read_known(store, ORDERS, order_id)
        if stored.subject.status is not None:
            # The claim as it stands now: kept in the order as read (which may have taken its pending order's place
            # since the claim was looked for), or the one found. With neither, the reservation claims it anew. One
            # kept there that does not decode is decided as one of its own is: by its hash, else by the order's.
            held, unread = _kept_in(effect, stored.document, unread)
            if unread is not None and unread.request_hash is not None:
                return _unreadable(order_id, unread, hash_)
            if unread is not None and stored.request_hash == hash_:
                return _left_to_writer(order_id, unread, hash_)
            return _with_adoption(_seen(order_id, stored.request_hash, hash_, held if held is not None else found))
        adopting = None
        if stored.document is not None:  # a pending order: the order takes its place and releases what waits
            placed = order_state(order_id, intake.document["status"], intake.document["version"],
                                 stored.subject.parked, objects=stored.subject.objects)
            adopting = stored, placed.release(await waiting(store, releases.consumer, order_id))
        intake = replace(intake, adopting=adopting)
    return Result(Outcome.TRANSIENT, f"order {order_id} kept changing under us; retry", hash_)


def _kept_in(effect: SideEffect, document: Document | None, unread: UnreadableDocument | None,
             ) -> tuple[SideEffectRecord | None, UnreadableDocument | None]:
    """The claim the order as read keeps (``SideEffect.held``), and the claim that does not decode: ``unread``, or
    the one kept there."""
    if document is None or unread is not None:
        return None, unread
    try:
        return effect.held(document), None
    except UnreadableDocument as exc:
        return None, exc


def _with_adoption(seen: tuple[Outcome, SideEffectRecord | None] | Result,
                   ) -> tuple[Outcome, SideEffectRecord | None, bool] | Result:
    return seen if isinstance(seen, Result) else (*seen, False)


def _while(statuses: frozenset[str], order_id: str, fields: dict[str, Any],
           condition: dict[str, Any] | None = None) -> Patch:
    """A patch of the order that holds only while its status is one of ``statuses``: the reservation's takeover and
    its announcement are written with one, so that neither lands on an order whose status it would contradict."""
    return Patch(order_id, fields, {"status": tuple(sorted(statuses)), **(condition or {})})


async def _closed(store: DocumentStore, order_id: str) -> str | None:
    """The order's status when it takes no reservation (cancelled); None otherwise."""
    stored = await read_known(store, ORDERS, order_id)
    return stored.subject.status if stored.subject.status == CANCELLED else None


async def _close(effect: SideEffect, claim: SideEffectRecord, order_id: str, status: str, hash_: str, *,
                 called: bool) -> Result:
    """The reservation of an order cancelled before it finished: no call (``called``: none more, where an earlier
    attempt's call, whose answer was lost, may have reserved the stock), nothing announced, and the claim finished
    (rejected, ``refusal`` order-<status>), so that no later delivery calls either."""
    reason = (f"order {order_id} was {status} before its reservation finished: no further call, nothing announced;"
              " an earlier attempt may have reserved stock under its key" if called else
              f"order {order_id} was {status} before its stock was reserved: no call, nothing announced")
    result = await effect.close(claim, f"order-{status}", reason)
    return Result(result.outcome, f"order {order_id}: {result.description}", hash_)


def _outcome(order: OrderPlaced, message: InboundMessage, services: OrderServices,
             finished: SideEffectRecord) -> list[BatchOperation]:
    """What the reservation's finish writes beside it: OrderAccepted in the outbox, and the reservation on the order,
    when it completed (unless the order was cancelled meanwhile); OrderRejected, and the rejection on the order, when
    the service refused it (unless the order was cancelled or shipped meanwhile: a shipped order is never announced
    rejected). The order's patch holds only in those statuses; otherwise NoLongerAllowed, and the finish is written
    unannounced. A claim the version before wrote announced
    OrderAccepted at its intake: its completion writes nothing more, and its refusal writes OrderRejected as a
    correction, under an id of its own."""
    settings, now = services.settings, services.clock()
    session = settings.outbox_requires_session
    if finished.status is EffectStatus.COMPLETED:
        if not finished.announces:
            return []
        reserved = {"reference": finished.reference, "reservedAt": utc_text(
            datetime.fromtimestamp(finished.finished_at or now, UTC))}
        return [Create(documents.accepted_entry(order, message, consumer=settings.consumer_name, now=now,
                                                  destination=settings.outbox_destination,
                                                  requires_session=session).to_document()),
                _while(RESERVABLE_STATUSES, order.order_id, {"reservation": reserved}, {"reservation": ABSENT})]
    rejected = OrderRejected(order_id=order.order_id, customer_id=order.customer_id,
                             refusal=str(finished.refusal), reason=finished.reason, rejected_at=utc_text(
                                 datetime.fromtimestamp(finished.finished_at or now, UTC)))
    rejection = {"refusal": rejected.refusal, "reason": rejected.reason, "responseStatus": finished.response_status,
                 "rejectedAt": rejected.rejected_at}
    entry = documents.rejected_entry(order, message, rejected, consumer=settings.consumer_name, now=now,
                                       destination=settings.outbox_rejected_destination, requires_session=session)
    if not finished.announces:
        entry = msgspec.structs.replace(entry, id=identity.rejected_correction_id(settings.consumer_name,
                                                                                  order.order_id))
    # Set whole where none stands; where another writer put one there, merged into it (SideEffect.patch).
    return [Create(entry.to_document()),
            _while(OPEN_STATUSES, order.order_id, {"rejection": rejection}, {"rejection": ABSENT})]


def _unreadable(order_id: str, exc: UnreadableDocument, hash_: str) -> Result:
    """A delivery meeting a document at the order's id that does not decode here, decided by the requestHash
    it still holds: the same is the order stored, another a mismatch. With none that reads, nothing here
    can tell: dead-lettered UnreadableDocument, for an operator to resubmit once every consumer reads it."""
    if exc.request_hash == hash_:
        return _left_to_writer(order_id, exc, hash_)
    if exc.request_hash is None:
        return Result(Outcome.UNREADABLE, f"messageId {order_id}: {exc}; no requestHash reads there to compare"
                                          f" with this delivery's {hash_}; resubmit it once every consumer reads"
                                          " that version", hash_)
    return Result(Outcome.PAYLOAD_MISMATCH, f"messageId {order_id} already stored with requestHash"
                                            f" {exc.request_hash}; this delivery has {hash_} ({exc})", hash_)


def _left_to_writer(order_id: str, exc: UnreadableDocument, hash_: str) -> Result:
    """The order stored is this delivery's, and its reservation record does not decode here: left to the
    version that wrote it, whose redeliveries finish it."""
    return Result(Outcome.IN_PROGRESS, f"order {order_id} is stored; {exc}; its reservation is left to the"
                                       " version that wrote it", hash_)


def _seen(order_id: str, stored_hash: str | None, hash_: str,
          found: SideEffectRecord | None) -> tuple[Outcome, SideEffectRecord | None] | Result:
    if stored_hash == hash_:
        return Outcome.DUPLICATE, found
    return Result(Outcome.PAYLOAD_MISMATCH,
                  f"messageId {order_id} already stored with requestHash {stored_hash}; this delivery has {hash_}",
                  hash_)
