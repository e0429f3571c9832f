"""What must hold after every run, once the queues are drained: effectively once, in order, nothing lost or stuck.

Each check reads the end state (store, fulfilment ledger, destination, queues) and, where the end
state cannot tell, the history of writes seen at the store port.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from idempotent_consumer import retries
from idempotent_consumer.ports.store import Document
from idempotent_consumer.records import (
    EffectStatus,
    OutboxEntry,
    OutboxStatus,
    ParkedEvent,
    ParkedStatus,
    SideEffectRecord,
)
from idempotent_consumer.side_effects import stored_claims
from shared.domain.documents import OrderDocument, PendingOrder, event_records
from shared.domain.lifecycle import KINDS
from shared.handlers.place_order import RESERVATION_CLAIM
from simulation.broker import BrokerMessage, State
from simulation.foreign import at_path
from simulation.proxies import RECORD_KINDS
from simulation.workload import INVALID, EventPlan
from simulation.world import World


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which rule, and the ids that show it."""

    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def check(world: World, drained: bool) -> list[Violation]:
    """Every invariant, over the end of one run."""
    documents = world.store.documents()
    found: list[Violation] = []
    if not drained:
        found.append(Violation("drained", f"the run did not drain: {world.broker.unsettled()} messages unsettled,"
                                          f" {world.pending_outbox()} outbox entries pending, {world.busy} busy"))
    for rule in RULES:
        found.extend(rule(world, documents))
    return found


def one_order_each(world: World, documents: list[Document]) -> Iterable[Violation]:
    """Exactly one order document per valid order id, holding the first content, created by one delivery."""
    stored = {d["id"]: d for d in documents if OrderDocument.is_kind(d)}
    for plan in world.workload.orders:
        document = stored.pop(plan.order_id, None)
        if document is None:
            yield Violation("one-order", f"order {plan.order_id} was never stored")
        elif document["requestHash"] != plan.request_hash:
            yield Violation("one-order", f"order {plan.order_id} holds requestHash {document['requestHash'][:12]},"
                                         f" not the first content's {plan.request_hash[:12]}")
        if world.creators[plan.order_id] > 1:
            yield Violation("one-order", f"order {plan.order_id} was created by {world.creators[plan.order_id]}"
                                         " deliveries: the create let copies through")
    for order_id in stored:
        yield Violation("one-order", f"order {order_id} is stored but was never a valid order")


def _reservations(documents: list[Document]) -> dict[str, SideEffectRecord]:
    """Each order's reservation record at the end, by order id: a document of its own, or kept in its order."""
    return {d["orderId"]: SideEffectRecord.from_document(d) for d in stored_claims(documents, RESERVATION_CLAIM)}


def _closed_first(record: SideEffectRecord | None) -> bool:
    """Whether the record says its order was cancelled before its reservation finished: no further call was made,
    and an earlier one, whose answer was lost, may have reserved. ``against_the_order`` checked that it was closed
    only while the order was cancelled, and that every call was decided while it was not."""
    return record is not None and str(record.refusal or "").startswith("order-")


def one_reservation_each(world: World, documents: list[Document]) -> Iterable[Violation]:
    """Exactly one reservation at the fulfilment service for every valid order it does not refuse (at most one when the
    order was cancelled before its reservation finished); none for one it refuses (out of stock) or for anything
    else."""
    counts = Counter(str(reply.get("orderId")) for reply in world.fulfilment.ledger.reservations())
    records = _reservations(documents)
    for plan in world.workload.orders:
        count = counts.pop(plan.order_id, 0)
        closed = _closed_first(records.get(plan.order_id))
        wanted = 0 if plan.refused else 1
        if count != wanted and not (closed and count < wanted):
            why = " (out of stock)" if plan.refused else " (closed before its reservation)" if closed else ""
            yield Violation("reservation", f"order {plan.order_id} has {count} reservations, not {wanted}{why}")
    for order_id, count in counts.items():
        yield Violation("reservation", f"{count} reservations for {order_id}, which was never a valid order")
    claims = Counter(str(d.get("orderId")) for d in stored_claims(documents, RESERVATION_CLAIM))
    for order_id, count in claims.items():
        if count > 1:  # the service's keys hid the second call; the claims say the effect was claimed twice
            yield Violation("reservation", f"order {order_id} has {count} reservation claims (of its own and kept in"
                                           " the order): its reservation was claimed twice")


def one_outcome_each(world: World, documents: list[Document]) -> Iterable[Violation]:
    """Each valid order announces exactly one of OrderAccepted and OrderRejected, as what happened to its stock:
    OrderAccepted once reserved, OrderRejected once refused (out of stock); never an OrderAccepted without a
    reservation. At least once, always under one MessageId; but an order whose outcome would have contradicted it
    (cancelled; shipped before a refusal) announces nothing (its record says so, and ``against_the_order`` checked
    the order's status when that was written).

    The destination's duplicate detection drops a resend inside its window; a resend past it (after
    publishing kept failing that long) arrives again under the same MessageId, for the destination's
    consumers to drop, as the README says. Such resends are not violations: the design does not promise more.
    """
    accepted = delivered(world, world.settings.outbox_destination)
    rejected = delivered(world, world.settings.outbox_rejected_destination)
    reserved = {str(reply.get("orderId")) for reply in world.fulfilment.ledger.reservations()}
    records = _reservations(documents)
    for plan in world.workload.orders:
        ids = {"OrderAccepted": set(accepted.pop(plan.order_id, [])),
               "OrderRejected": set(rejected.pop(plan.order_id, []))}
        record = records.get(plan.order_id)
        silent = record is not None and record.announces is False
        announced = "OrderRejected" if plan.refused else "OrderAccepted"
        wanted = [0, 0] if silent else [1, 1]
        if [len(ids[announced]), sum(map(len, ids.values()))] != wanted:
            yield Violation("outcome", f"order {plan.order_id} reached the destinations under"
                                       f" {len(ids['OrderAccepted'])} OrderAccepted and {len(ids['OrderRejected'])}"
                                       f" OrderRejected MessageIds, not {'none' if silent else 'one ' + announced}")
        if ids["OrderAccepted"] and plan.order_id not in reserved:
            yield Violation("outcome", f"order {plan.order_id}: OrderAccepted without a reservation")
    for kind, stray in (("OrderAccepted", accepted), ("OrderRejected", rejected)):
        for order_id, message_ids in stray.items():
            yield Violation("outcome", f"{len(message_ids)} {kind} delivered for {order_id}, which was never a valid"
                                       " order")


def against_the_order(world: World, documents: list[Document]) -> Iterable[Violation]:
    """Nothing acts against the order's status at the time it is done: every reservation was decided by a claim
    (the intake's, or a takeover) that left the order not cancelled; every announcement was written while the
    order's status allowed it; a reservation closed for its order's sake, or an outcome left unannounced, only
    where its status would have contradicted it."""
    for contradiction in world.history.contradictions:
        yield Violation("against-the-order", contradiction)


def delivered(world: World, destination: str) -> dict[str, list[str]]:
    """The MessageIds of the messages a destination kept, by order id."""
    found: dict[str, list[str]] = {}
    for sent_to, message in world.sender.delivered:
        if sent_to == destination:
            found.setdefault(str(json.loads(message.body)["orderId"]), []).append(message.message_id)
    return found


def events_once_in_order(world: World, documents: list[Document]) -> Iterable[Violation]:
    """Every valid event applied exactly once, in version order, to the state the state machine gives."""
    orders = {d["id"]: d for d in documents if OrderDocument.is_kind(d)}
    found = [dict(record) for _, record in event_records(documents)]
    records = {(d["eventSource"], d["eventId"]): d for d in found if d.get("type") in RECORD_KINDS}
    recorded = Counter((d["eventSource"], d["eventId"]) for d in found)
    history = world.history
    for plan in world.workload.orders:
        for event in plan.events:
            keys = event.keys  # the event and its copies rebuilt under new ids: one applies
            created = sum(history.records_created[k] for k in keys)
            if sum(recorded[k] for k in keys) != 1 or created != 1:
                copies = f" and its {len(event.aliases)} rebuilt copies were" if event.aliases else " was"
                yield Violation("events", f"event {event.event_id} (v{event.sequence} of {plan.order_id}){copies}"
                                          f" recorded {created} times")
            yield from _newer_kept(event, [records[k] for k in keys if k in records], orders.get(plan.order_id))
        applied = history.applied[plan.order_id]
        if applied != sorted(applied):
            yield Violation("events", f"order {plan.order_id}: events applied in the order {applied}")
        versions = history.order_versions[plan.order_id]
        if any(later < earlier for earlier, later in itertools.pairwise(versions)):
            yield Violation("events", f"order {plan.order_id}: its version went back, written as {versions}")
        order = orders.get(plan.order_id)
        if order is not None and (order["version"], order["status"]) != (plan.final_version, plan.final_status):
            yield Violation("events", f"order {plan.order_id} ends at version {order['version']} {order['status']};"
                                      f" its events lead to {plan.final_version} {plan.final_status}")


def _newer_kept(event: EventPlan, records: list[Document], order: Document | None) -> Iterable[Violation]:
    """The fields a newer producer added to an event's data are on its order's sub-object, and on its record
    document where an earlier release wrote one."""
    if not event.newer:
        return
    sub_object = KINDS[event.type].record_type
    for where, document in [*(("its record", r) for r in records),
                            *((f"its order's {sub_object}", order.get(sub_object)) for _ in [0] if order)]:
        for name, value in event.newer:
            if not isinstance(document, dict) or document.get(name) != value:
                yield Violation("newer-fields", f"event {event.event_id} (v{event.sequence}): {where} lacks the"
                                                f" newer producer's {name} {value!r}")


def settled_as_expected(world: World, documents: list[Document]) -> Iterable[Violation]:
    """No valid message dead-lettered (by an outage either: no ``MaxDeliveryCountExceeded``, and
    ``RetryLimitExceeded`` only where a long outage outlasted the chain: its last delivery tried while the dependency
    was down, and the operator's resubmission then judged as the message); every invalid or mismatching one
    dead-lettered with its reason; an event that can never apply completed (parked, then rejected) or dead-lettered
    InvalidTransition (it came after). A message handed on is judged with its copies: the original completed, and
    the chain ending as the message should."""
    resubmitted = {id(m.resubmission_of) for q in world.broker.queues.values() for m in q.messages
                   if m.resubmission_of is not None}
    for queue in world.broker.queues.values():
        for root, chain in chains(queue.messages).items():
            sent = world.workload.messages[root.tag]
            ends = {(m.state, m.reason) for m in chain}
            if sent.or_dead_lettered is not None and (State.DEAD_LETTERED, sent.or_dead_lettered) in ends:
                ends.discard((State.DEAD_LETTERED, sent.or_dead_lettered))
                if ends <= {(State.COMPLETED, None)}:
                    continue
            wanted = (State.COMPLETED, None) if sent.expect is None else (State.DEAD_LETTERED, sent.expect)
            limited = False
            for message in chain:
                if (message.state, message.reason) in (wanted, (State.COMPLETED, None)):
                    continue
                if message.reason == retries.RETRY_LIMIT_EXCEEDED and (why := _limit_broken(world, message,
                                                                                             resubmitted)) is None:
                    limited = True  # tried at its last delivery, in a long outage, and resubmitted: judged there
                    continue
                yield Violation("settlement", f"{sent.label} {message}{_copy(message)} is {message.state}"
                                              f" {message.reason or ''}: {message.description or ''}"
                                              + (f" ({why})" if message.reason == retries.RETRY_LIMIT_EXCEEDED
                                                 else ""))
            if sent.expect is not None and wanted not in ends and not limited:
                yield Violation("settlement", f"{sent.label} {root} and its {len(chain) - 1} copies all completed,"
                                              f" none dead-lettered {sent.expect}")


def _limit_broken(world: World, message: BrokerMessage, resubmitted: set[int]) -> str | None:
    """Why a message dead-lettered RetryLimitExceeded should not have been, or None when it is what a long outage
    does: its chain's last delivery tried (not handed on untried), while the dependency was still down, and the
    operator resubmitted it afterwards (that resubmission is judged as the message)."""
    outage = world.chaos.outage
    if outage is None or not outage.long:
        return "no outage outlasted RETRY_TOTAL_SECONDS"
    if message.settled_at is None or message.settled_at > outage.end + world.settings.servicebus_lock_duration_seconds:
        return "its last delivery came after the outage"
    if "not tried" in (message.description or ""):
        return "its last delivery was not tried"
    if id(message) not in resubmitted:
        return "never resubmitted"
    return None


def chains(messages: Iterable[BrokerMessage]) -> dict[BrokerMessage, list[BrokerMessage]]:
    """Each message a producer sent, with the copies delayed retries made of it (by ``retryChain``), in order."""
    messages = list(messages)
    found: dict[BrokerMessage, list[BrokerMessage]] = {}
    for message in messages:
        chain = message.properties.get(retries.CHAIN)
        if chain is None:
            found[message] = [message]
        else:
            found[messages[int(chain) - 1]].append(message)
    return found


def _copy(message: BrokerMessage) -> str:
    attempt = message.properties.get(retries.ATTEMPT)
    return f" (retry copy {attempt})" if attempt else ""


def outage_carried_over(world: World, documents: list[Document]) -> Iterable[Violation]:
    """An outage shorter than RETRY_TOTAL_SECONDS dead-letters nothing (``settled_as_expected`` sees to each
    message) and every message it met is processed once after it (``one_order_each``, ``events_once_in_order``);
    here, that no copy was made when delayed retries are off, none outlived the drain, none was made of an invalid
    message (it needs no dependency: dead-lettered as it came, breaker open or not), and every copy kept the
    producer's own application properties."""
    for queue in world.broker.queues.values():
        for message in queue.messages:
            if message.state is State.SCHEDULED:
                yield Violation("retries", f"{message}{_copy(message)} is still scheduled at the end")
            if not world.settings.delayed_retries and retries.CHAIN in message.properties:
                yield Violation("retries", f"{message}{_copy(message)}: a copy with DELAYED_RETRIES false")
        for root, chain in chains(queue.messages).items():
            sent = world.workload.messages[root.tag]
            if sent.expect == INVALID and len(chain) > 1:
                yield Violation("retries", f"{sent.label} {root}: handed on although no dependency could help it")
            for copy in chain[1:]:
                lost = {k: v for k, v in sent.properties if copy.properties.get(k) != v}
                if lost:
                    yield Violation("retries", f"{sent.label} {copy}{_copy(copy)} lost its producer's properties"
                                               f" {sorted(lost)}")


def no_unexpected_error(world: World, documents: list[Document]) -> Iterable[Violation]:
    """No handler raised an unexpected exception (outcome ``error``): the README calls that a bug."""
    for error in world.errors:
        yield Violation("unexpected-error", error)


def nothing_left_waiting(world: World, documents: list[Document]) -> Iterable[Violation]:
    """No side effect left in progress, no event left parked, no order left pending once all was delivered."""
    for document in documents:
        if (undone := left_undone(document)) is not None:
            yield Violation("stuck", undone)


def left_undone(document: Document) -> str | None:
    """What the document says is still waiting to be done, or None; the demo's report reads the same rule.

    Waiting means something will still act on it: a side effect in progress, an outbox entry pending, a
    pending order, an event parked (``ParkedEvent.waiting``, what report_stuck counts). An event set aside
    for good, rejected on release or dropped by an operator, is a final record, kept with its reason.
    """
    claim = next(stored_claims([document], RESERVATION_CLAIM), None)  # of its own, or kept in its order
    if claim is not None and (record := SideEffectRecord.from_document(claim)).status is EffectStatus.IN_PROGRESS:
        return f"side effect {record.effect} of {record.partition} is in progress (attempt {record.attempt})"
    if ParkedEvent.is_kind(document):
        parked = ParkedEvent.from_document(document)
        if parked.status is ParkedStatus.PARKED:
            return f"event v{parked.sequence} {parked.event_id} of {parked.partition} is still parked"
    elif PendingOrder.is_kind(document):
        return f"order {document['orderId']} is still pending, with parked events"
    elif OutboxEntry.is_kind(document):
        entry = OutboxEntry.from_document(document)
        if entry.status is OutboxStatus.PENDING:
            return f"outbox entry {entry.id} of {entry.partition} is still pending"
    return None


def foreign_fields_kept(world: World, documents: list[Document]) -> Iterable[Violation]:
    """Every field another writer wrote (``simulation.foreign``) is there at the end with the last value it
    wrote, on every document still stored: the app keeps what it does not model. A document deleted, or
    expired by its ttl, took its fields with it, by design."""
    stored = {(d["orderId"], d["id"]): d for d in documents}
    history, now = world.history, world.clock.now
    for key, fields in history.foreign.items():
        document = stored.get(key)
        if document is None:
            if history.expires_at.get(key, float("inf")) > now:
                yield Violation("foreign-fields", f"document {key[1]} of {key[0]} is gone, neither deleted nor"
                                                  f" expired; a foreign writer wrote {', '.join(sorted(fields))}")
            continue
        kind = document.get("type", "?")
        for name, value in sorted(fields.items()):
            there, found = at_path(document, name)
            if not there:
                yield Violation("foreign-fields", f"{kind} {key[1]} of {key[0]}: field {name} was dropped"
                                                  f" (a foreign writer last wrote {value!r})")
            elif found != value:
                yield Violation("foreign-fields", f"{kind} {key[1]} of {key[0]}: field {name} holds"
                                                  f" {found!r}, not {value!r}, which a foreign writer"
                                                  " wrote last")


RULES: tuple[Callable[[World, list[Document]], Iterable[Violation]], ...] = (
    one_order_each, one_reservation_each, one_outcome_each, against_the_order, events_once_in_order,
    settled_as_expected,
    outage_carried_over, no_unexpected_error, nothing_left_waiting, foreign_fields_kept,
)
