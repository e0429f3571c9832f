"""The simulator can fail: each classic bug of an idempotent consumer, and each limit ignored, planted in a wrapper
here, is found within 200 seeds.

Each test wires one broken port or handler into the run and asserts that a violation of the rule the
bug breaks shows up within MAX_SEEDS seeds, and that the correct system passes that same seed: the
bug, not the seed, is what fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec

from idempotent_consumer import identity
from idempotent_consumer.delivery import Handler
from idempotent_consumer.errors import AlreadyExists, BatchFailed, NotFound, PublishError
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.writes import Releases
from idempotent_consumer.outcomes import Result
from idempotent_consumer.ports.sender import MessageSender, OutgoingMessage
from idempotent_consumer.ports.store import (
    ABSENT,
    MAX_PAGE_ITEMS,
    BatchOperation,
    Create,
    Delete,
    Document,
    DocumentStore,
    Patch,
    Replace,
)
from idempotent_consumer.records import OutboxEntry, OutboxStatus
from shared.domain import identity as order_ids
from shared.domain.documents import OrderAccepted, OrderDocument
from shared.ports.fulfilment import FulfilmentService, Reply
from simulation.run import simulate
from simulation.scheduler import drive
from simulation.world import SETTINGS, Wiring

MAX_SEEDS = 200


class _Delegating:
    """A store that passes every call through; the broken stores below change one of them."""

    def __init__(self, store: DocumentStore) -> None:
        self.store = store

    async def create(self, document: Document) -> Document:
        return await self.store.create(document)

    async def read(self, doc_id: str, partition_key: str) -> Document:
        return await self.store.read(doc_id, partition_key)

    def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                    before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
                    ) -> AsyncIterator[list[Document]]:
        return self.store.query_pages(conditions, partition_key=partition_key, before=before,
                                         page_size=page_size)

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        return await self.store.execute_batch(partition_key, operations)


class ReadThenCreate(_Delegating):
    """Bug 1: the order's create done as "read, and write if absent" (an upsert): two copies both find it absent."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        first = operations[0]
        if not (isinstance(first, Create) and OrderDocument.is_kind(first.document)):
            return await self.store.execute_batch(partition_key, operations)
        try:
            await self.store.read(partition_key, partition_key)
        except NotFound:
            pass
        else:
            raise BatchFailed(0, AlreadyExists(f"document {partition_key} already exists"))
        try:
            return await self.store.execute_batch(partition_key, operations)
        except BatchFailed as exc:
            if not isinstance(exc.error, AlreadyExists):
                raise
        overwrite = [Replace(op.document) if isinstance(op, Create) else op for op in operations]
        return await self.store.execute_batch(partition_key, overwrite)


class VersionUnchecked(_Delegating):
    """Bug 3: the order's version check removed: patches without their condition, replaces without the etag."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        return await self.store.execute_batch(partition_key, [_unchecked(op, partition_key) for op in operations])


def _unchecked(operation: BatchOperation, order_id: str) -> BatchOperation:
    if isinstance(operation, Patch) and operation.doc_id == order_id:
        return Patch(operation.doc_id, operation.set_fields)
    if isinstance(operation, Replace) and operation.document["id"] == order_id:
        return Replace(operation.document)
    return operation


class KeyPerCall:
    """Bug 2: the idempotency key derived per delivery: every call carries a fresh nonce."""

    def __init__(self, fulfilment: FulfilmentService) -> None:
        self.fulfilment = fulfilment
        self.nonces = itertools.count(1)

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        return await self.fulfilment.reserve(f"{idempotency_key}.{next(self.nonces)}", request)


def fresh_sequence_numbers(handler: Handler) -> Handler:
    """Bug 4: every delivery looks like another message, so a redelivery cannot take over its own claim."""
    numbers = itertools.count(10**9)

    async def place(message: InboundMessage) -> Result:
        return await handler(dataclasses.replace(message, sequence_number=next(numbers)))

    return place


class OrderRewrittenFromItsModel(_Delegating):
    """Bug 5: park and release write the order whole from its typed model, on the etag they read, instead of
    patching the fields they change: every field this version does not model, such as another writer's, is
    dropped."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        typed = [await self._typed(op, partition_key) for op in operations]
        return await self.store.execute_batch(partition_key, typed)

    async def _typed(self, operation: BatchOperation, order_id: str) -> BatchOperation:
        # The order's patch on its etag is a park's or a release's (an event in turn patches on its version).
        if isinstance(operation, Patch) and operation.doc_id == order_id and operation.if_match is not None:
            stored = await self.store.read(order_id, order_id)
            if OrderDocument.is_kind(stored):
                order = OrderDocument.from_document({**stored, **operation.set_fields})
                return Replace(order.to_document(), operation.if_match)
        return operation


def first_seed_failing(wiring: Wiring, rule: str, about: str = "") -> int | None:
    """The first seed below MAX_SEEDS whose run breaks ``rule``, with a violation whose detail starts with ``about``."""
    for seed in range(MAX_SEEDS):
        if any(v.rule == rule and v.detail.startswith(about) for v in simulate(seed, wiring=wiring).violations):
            return seed
    return None


def assert_found(wiring: Wiring, rule: str, about: str = "") -> None:
    seed = first_seed_failing(wiring, rule, about)
    assert seed is not None, f"no seed below {MAX_SEEDS} broke {rule}"
    print(f"{rule} broken at seed {seed}")
    assert simulate(seed).violations == [], f"seed {seed} fails without the bug too"


def test_a_read_then_create_is_found_as_an_order_created_twice() -> None:
    assert_found(Wiring(store=ReadThenCreate), "one-order")


def test_an_idempotency_key_per_delivery_is_found_as_a_second_reservation() -> None:
    assert_found(Wiring(fulfilment=KeyPerCall), "reservation")


def test_a_removed_version_check_is_found_as_events_applied_out_of_order() -> None:
    assert_found(Wiring(store=VersionUnchecked), "events")


def test_a_redelivery_that_cannot_take_over_its_own_claim_is_found_as_a_side_effect_left_in_progress() -> None:
    assert_found(Wiring(handle_order=fresh_sequence_numbers), "stuck")


def test_an_order_rewritten_from_its_typed_model_is_found_as_another_writers_field_dropped() -> None:
    assert_found(Wiring(store=OrderRewrittenFromItsModel), "foreign-fields", about="order ")


class FirstPageOnly(_Delegating):
    """Bug 6: the read of what waits takes the query's first page for the whole of it (what a reader of a
    bounded, unordered read did): an event in turn on a later page is never released."""

    def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                    before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
                    ) -> AsyncIterator[list[Document]]:
        pages = self.store.query_pages(conditions, partition_key=partition_key, before=before, page_size=page_size)
        if conditions.get("type") != "parked-event":
            return pages
        return _first(pages)


async def _first(pages: AsyncIterator[list[Document]]) -> AsyncIterator[list[Document]]:
    async for page in pages:
        yield page
        return


@dataclasses.dataclass(frozen=True)
class BudgetIgnored(Releases):
    """Bug 7: a release written in one batch whatever it holds, Cosmos DB's 100 operations and 2 MB ignored."""

    max_operations: int = 10**9
    max_bytes: int = 10**12


def test_a_release_that_reads_only_the_first_page_is_found_as_an_event_left_parked() -> None:
    assert_found(Wiring(store=FirstPageOnly), "stuck", about="event ")


def test_a_release_that_ignores_the_batch_budget_is_found_as_a_valid_event_or_order_dead_lettered() -> None:
    assert_found(Wiring(releases=BudgetIgnored), "settlement")


class AcceptedAtIntake(_Delegating):
    """Bug 8: OrderAccepted announced in the order's intake batch, before its reservation (the design before issue
    30): an order the service refuses is announced accepted, and its OrderRejected, whose entry finds the id taken,
    is never written."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        intake = [op for op in operations if isinstance(op, Create) and OrderDocument.is_kind(op.document)]
        if not intake:
            return await self.store.execute_batch(partition_key, operations)
        order = OrderDocument.from_document(intake[0].document)
        entry = OutboxEntry(
            id=order_ids.outbox_id(SETTINGS.consumer_name, order.order_id), partition=order.order_id,
            status=OutboxStatus.PENDING, destination=SETTINGS.outbox_destination,
            message_id=order_ids.outbox_message_id(SETTINGS.consumer_name, order.order_id), correlation_id=None,
            session_id=None, subject=order_ids.ORDER_ACCEPTED, created_at=0.0,
            payload=msgspec.to_builtins(OrderAccepted(order.order_id, order.customer_id, order.currency, order.total,
                                                      order.placed_at)))
        written = await self.store.execute_batch(partition_key, [*operations, Create(entry.to_document())])
        return written[:len(operations)]


def test_order_accepted_announced_before_the_reservation_is_found_as_an_order_accepted_without_one() -> None:
    assert_found(Wiring(store=AcceptedAtIntake), "outcome")


class SubObjectSetWhole(_Delegating):
    """Bug 9: an event's sub-object set whole on the happy path whether or not one stands (the condition that it
    is absent dropped): what another writer put inside the payment or shipment is lost."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        return await self.store.execute_batch(partition_key, [
            Patch(op.doc_id, op.set_fields, {k: v for k, v in op.condition.items() if v is not ABSENT}, op.if_match,
                  op.etag_only) if isinstance(op, Patch) else op for op in operations])


class RecordFromItsModel(_Delegating):
    """Bug 10: an event's record (its order's sub-object) written from this version's model: the fields a newer
    producer added to its data are dropped."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        return await self.store.execute_batch(partition_key, [
            Patch(op.doc_id, {k: _modelled(k, v) for k, v in op.set_fields.items()}, op.condition, op.if_match,
                  op.etag_only) if isinstance(op, Patch) else op for op in operations])


def _modelled(name: str, value: Any) -> Any:
    if name in ("payment", "shipment", "cancellation") and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("channel", "trace")}
    return value


def test_a_sub_object_set_whole_over_another_writers_is_found_as_its_field_dropped() -> None:
    assert_found(Wiring(store=SubObjectSetWhole), "foreign-fields", about="order ")


def test_a_record_written_from_its_model_is_found_as_a_newer_producers_field_dropped() -> None:
    assert_found(Wiring(store=RecordFromItsModel), "newer-fields")


class SuspendsOnOutboxMark(_Delegating):
    """Not an idempotency bug: a port that suspends its coroutine, here only where the outbox publisher
    deletes (or marks) an entry it sent. The simulator has no event loop, so it must fail the run, not lose it."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        [first, *_] = operations
        if _finishes_sent(first):
            await asyncio.sleep(0)
        return await self.store.execute_batch(partition_key, operations)


def _finishes_sent(operation: BatchOperation) -> bool:
    """Whether an operation is the publisher's finish of a sent entry: the delete of an outbox entry, a patch setting
    dispatched, or a replace of the entry."""
    if isinstance(operation, Delete):
        return operation.doc_id.startswith("outbox.")
    if isinstance(operation, Patch):
        return operation.set_fields.get("status") == OutboxStatus.DISPATCHED.value
    return isinstance(operation, Replace) and OutboxEntry.is_kind(operation.document)


def test_a_port_that_suspends_fails_the_run_even_in_the_outbox_publisher() -> None:
    report = simulate(0, wiring=Wiring(store=SuspendsOnOutboxMark))
    assert {v.rule for v in report.violations} >= {"unexpected-error"}
    assert any("outbox invocation" in v.detail for v in report.violations)
    assert not simulate(0).violations


class CompletedBeforeHandedOn:
    """Bug 11: a handing-on that completes the current delivery before its copy is safely sent: the copy is
    held back and sent only after the settlement, so a crash or a failed send between the two loses the
    message (it left its queue, and no copy will bring it back)."""

    def __init__(self, sender: MessageSender) -> None:
        self.sender = sender
        self.held: list[tuple[str, Sequence[OutgoingMessage]]] = []

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        if destination in (SETTINGS.orders_queue, SETTINGS.order_events_queue):
            self.held.append((destination, messages))  # "sent", as far as the delivery can tell
            return
        await self.sender.send(destination, messages)

    def after_settle(self) -> None:
        held, self.held = self.held, []
        for destination, messages in held:
            with contextlib.suppress(PublishError):  # the send failed after the delivery was completed: lost
                drive(self.sender.send(destination, messages))


def test_a_hand_on_that_completes_before_its_copy_is_sent_is_found_as_a_message_lost() -> None:
    assert_found(Wiring(sender=CompletedBeforeHandedOn), "one-order")


class KeyWithoutSource(_Delegating):
    """Bug 12: an event's keys (its inbox marker and its identity record) derived from its id without its source:
    a distinct event of another source under the same id is taken for the first, with other content."""

    def __init__(self, store: DocumentStore) -> None:
        super().__init__(store)
        self.ids: dict[str, str] = {}  # the id the app derives -> the one the bug derives

    def _rekeyed(self, document: Document) -> Document:
        kind = document.get("type")
        if kind not in ("inbox", "event-identity"):
            return document
        wrong = identity.derive_id(str(kind), document["consumer"], document["eventId"])
        self.ids[document["id"]] = wrong
        return {**document, "id": wrong, **({"orderId": wrong} if kind == "event-identity" else {})}

    async def create(self, document: Document) -> Document:
        return await self.store.create(self._rekeyed(document))

    async def read(self, doc_id: str, partition_key: str) -> Document:
        return await self.store.read(self.ids.get(doc_id, doc_id), self.ids.get(partition_key, partition_key))

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        return await self.store.execute_batch(partition_key, [
            Create(self._rekeyed(op.document)) if isinstance(op, Create) else op for op in operations])


def test_an_event_key_without_its_source_is_found_as_another_sources_event_dead_lettered() -> None:
    assert_found(Wiring(store=KeyWithoutSource), "settlement")


class ReservedWithoutReadingTheOrder(_Delegating):
    """Bug 13: a reservation's takeover written without the order's status (its guard dropped from the batch): a
    copy that waited out an outage reserves the stock of an order cancelled or shipped meanwhile."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        guarded = [op for op in operations if isinstance(op, Patch) and "reservationAttempt" in op.set_fields]
        if not guarded:
            return await self.store.execute_batch(partition_key, operations)
        kept = [op for op in operations if op not in guarded]
        written = await self.store.execute_batch(partition_key, kept)
        return [*written, *({"id": op.doc_id} for op in guarded)]


def test_a_reservation_made_without_reading_the_orders_status_is_found_as_one_against_the_order() -> None:
    assert_found(Wiring(store=ReservedWithoutReadingTheOrder), "against-the-order")
