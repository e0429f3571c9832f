"""The reservation claim kept inside its order (RESERVATION_CLAIM_IN_ORDER): one write fewer per order, the claim
guarded by its own ``rev`` (the order's etag moves with every event), and either form read by every release from
the one that writes it, so that hosts writing either form run side by side (docs/operations.md)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.ports.store import Create, Patch, Replace
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.lifecycle import PAYMENT_CAPTURED
from shared.handlers.place_order import RESERVATION_CLAIM
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body
from tests.support.records import claims

OWN = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)
IN_ORDER = msgspec.structs.replace(OWN, reservation_claim_in_order=True)
NOW = 1_800_000_000.0


class Recorded(InMemoryStore):
    """The in-memory store, counting requests per kind: batches (with their operations) and point reads."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[Any]] = []
        self.reads = 0

    async def execute_batch(self, partition_key: str, operations: Any) -> list[dict[str, Any]]:
        self.batches.append(list(operations))
        return await super().execute_batch(partition_key, operations)

    async def read(self, doc_id: str, partition_key: str) -> dict[str, Any]:
        self.reads += 1
        return await super().read(doc_id, partition_key)


def app(settings: Settings, store: InMemoryStore, fulfilment: InMemoryFulfilment | None = None) -> bootstrap.App:
    return bootstrap.build(settings, store=store, fulfilment=fulfilment or InMemoryFulfilment(),
                           sender=RecordingSender(), clock=lambda: NOW)


def place(host: bootstrap.App, order_id: str = "ord-1", sequence: int = 1) -> Outcome:
    return asyncio.run(host.handle_order(inbound(order_body(order_id), sequence_number=sequence))).outcome


def test_a_new_order_writes_its_claim_in_the_orders_create_and_finishes_it_with_one_patch_of_the_order() -> None:
    store = Recorded()
    assert place(app(IN_ORDER, store)) is Outcome.CREATED
    intake, finish = store.batches
    assert [type(op).__name__ for op in intake] == ["Create"] and RESERVATION_CLAIM in intake[0].document
    assert [type(op).__name__ for op in finish] == ["Patch", "Create"]  # the order (claim and reservation), the entry
    assert all(len(op.set_fields) <= 10 for op in finish if isinstance(op, Patch))
    assert [d["type"] for d in store.documents()] == ["order", "outbox"]
    [order] = [d for d in store.documents() if d["type"] == "order"]
    claim = order[RESERVATION_CLAIM]
    assert (claim["status"], claim["rev"], claim["announced"], order["due"]) == ("completed", 2, True, None)
    assert order["reservation"]["reference"] == claim["reference"]
    assert not {"id", "type", "orderId", "due"} & set(claim)  # what the order gives it is not repeated


def test_a_copy_of_a_finished_order_is_a_refused_batch_and_one_read_of_the_order() -> None:
    store, fulfilment = Recorded(), InMemoryFulfilment()
    host = app(IN_ORDER, store, fulfilment)
    place(host)
    batches, reads = len(store.batches), store.reads
    assert place(host, sequence=2) is Outcome.DUPLICATE
    assert (len(store.batches) - batches, store.reads - reads) == (1, 1)
    assert fulfilment.reservation_count() == 1


class PaidDuringTheCall(InMemoryFulfilment):
    """The service, which reserves; while it does, the order's payment is applied (the order's etag moves)."""

    host: bootstrap.App | None = None

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        assert self.host is not None
        body = event_body("ord-1", 2, PAYMENT_CAPTURED)
        paid = await self.host.handle_event(inbound(encode_event(body), message_id=body["id"]))
        assert paid.outcome is Outcome.APPLIED
        return await super().reserve(idempotency_key, request)


def test_an_event_applied_to_the_order_under_the_call_does_not_stand_in_the_claims_way() -> None:
    store, fulfilment = InMemoryStore(), PaidDuringTheCall()
    fulfilment.host = host = app(IN_ORDER, store, fulfilment)
    assert place(host) is Outcome.CREATED
    [order] = [d for d in store.documents() if d["type"] == "order"]
    assert (order["status"], order["version"], order["payment"]["paymentId"]) == ("paid", 2, "pay-1")
    assert (order[RESERVATION_CLAIM]["status"], order["reservation"]["reference"]) == (
        "completed", order[RESERVATION_CLAIM]["reference"])
    assert fulfilment.reservation_count() == 1
    assert [d["subject"] for d in store.documents() if d["type"] == "outbox"] == ["OrderAccepted"]


class Down(InMemoryFulfilment):
    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        self.calls.append(idempotency_key)
        return Reply(503)


def test_hosts_writing_either_form_finish_each_others_claims_and_reserve_once() -> None:
    # The rollout of the setting: hosts of this release with it off and on run side by side, each reading both forms.
    for first, second in ((IN_ORDER, OWN), (OWN, IN_ORDER)):
        store, fulfilment = InMemoryStore(), InMemoryFulfilment()
        assert place(app(first, store, Down())) is Outcome.TRANSIENT  # claimed, the call failed, the lease released
        assert place(app(second, store, fulfilment), sequence=2) is Outcome.DUPLICATE  # taken over and finished
        [claim] = claims(store.documents())
        assert (claim["status"], claim["attempt"], "rev" in claim) == ("completed", 2, first is IN_ORDER)
        assert place(app(first, store, fulfilment), sequence=3) is Outcome.DUPLICATE  # the verdict, no call
        assert fulfilment.reservation_count() == 1
        assert [d["subject"] for d in store.documents() if d["type"] == "outbox"] == ["OrderAccepted"]


def test_the_stuck_report_finds_a_claim_kept_in_its_order_past_its_lease_and_not_one_finished() -> None:
    store = InMemoryStore()
    place(app(IN_ORDER, store, Down()))
    place(app(IN_ORDER, store), order_id="ord-2")
    report = asyncio.run(app(IN_ORDER, store).report_stuck(NOW + 10_000))
    assert [(r.partition, r.attempt) for r in report.side_effects] == [("ord-1", 1)]


def test_a_claim_kept_in_its_order_keeps_the_fields_another_writer_added_to_it() -> None:
    store = InMemoryStore()
    place(app(IN_ORDER, store, Down()))
    order = asyncio.run(store.read("ord-1", "ord-1"))
    claim = {**order[RESERVATION_CLAIM], "auditedBy": "crm", "rev": order[RESERVATION_CLAIM]["rev"] + 1}
    asyncio.run(store.execute_batch("ord-1", [Patch("ord-1", {RESERVATION_CLAIM: claim})]))
    assert place(app(IN_ORDER, store), sequence=2) is Outcome.DUPLICATE
    kept = asyncio.run(store.read("ord-1", "ord-1"))[RESERVATION_CLAIM]
    assert (kept["status"], kept["auditedBy"]) == ("completed", "crm")


def test_a_claim_another_delivery_leased_in_the_order_is_left_to_it() -> None:
    # Every writer of a claim kept in its order raises its rev: a takeover is conditioned on it, not on the etag.
    store = InMemoryStore()
    host = app(IN_ORDER, store, Down())
    place(host)
    order = asyncio.run(store.read("ord-1", "ord-1"))
    rev = order[RESERVATION_CLAIM]["rev"]
    asyncio.run(store.execute_batch("ord-1", [Patch("ord-1", {f"{RESERVATION_CLAIM}/rev": rev + 1,
                                                              f"{RESERVATION_CLAIM}/leaseUntil": NOW + 600})]))
    # Another delivery's live lease now: a copy from another message leaves the effect to it.
    assert place(app(IN_ORDER, store), sequence=2) is Outcome.IN_PROGRESS


def test_a_finish_after_another_message_finished_the_claim_takes_its_verdict_and_announces_nothing_more() -> None:
    # The claim's rev is its guard: the order's etag moves with every event, so a finish conditioned on it would
    # lose to any event, and one conditioned on nothing would write over another message's finish.
    store, now, announced = InMemoryStore(), [NOW], itertools.count(1)
    effect = SideEffect(store, "intake", "reserve-stock", 60, lambda: now[0], within=RESERVATION_CLAIM,
                        write_within=True)
    first = InboundMessage(message_id="o", body=None, sequence_number=1)
    claim = effect.claim("o", first)
    [order] = asyncio.run(store.execute_batch("o", [Create({"id": "o", "orderId": "o", "type": "order",
                                                            **effect.subject_fields(claim)})]))
    held = effect.held(order)
    assert held is not None

    def announce(_: Any) -> list[Create]:
        return [Create({"id": f"entry-{next(announced)}", "orderId": "o", "type": "entry"})]

    async def reserve(key: str) -> Reply:
        return Reply(201, {"reservationId": "res-1"})

    async def slow_call(key: str) -> Reply:  # runs past its lease; another message takes the claim over and finishes
        now[0] += 61
        copy = InboundMessage(message_id="o-copy", body=None, sequence_number=2)
        taken = await effect.run(claim, copy, reserve, done=Outcome.DUPLICATE, found=await effect.find(claim),
                                 announce=announce)
        assert taken.outcome is Outcome.DUPLICATE
        return await reserve(key)

    result = asyncio.run(effect.run(held, first, slow_call, done=Outcome.CREATED, claimed=True, announce=announce))
    assert result.outcome is Outcome.CREATED  # the effect happened: finished by the other message, which announced it
    assert [d["id"] for d in store.documents() if d["type"] == "entry"] == ["entry-1"]
    kept = asyncio.run(store.read("o", "o"))[RESERVATION_CLAIM]
    assert (kept["attempt"], kept["messageSequence"], kept["status"]) == (2, 2, "completed")


class RefusedWithReference(InMemoryFulfilment):
    """A service whose refusal carries a reference too: the finish then sets the most fields it ever does."""

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        return Reply(422, {"refusal": "out-of-stock", "reason": "SKU-1 is out of stock", "reservationId": "res-0"})


def test_the_largest_finish_is_one_patch_of_at_most_ten_fields() -> None:
    store = Recorded()
    assert place(app(IN_ORDER, store, RefusedWithReference())) is Outcome.REJECTED
    [patch] = [op for op in store.batches[1] if isinstance(op, Patch)]
    # The claim's status, responseStatus, reference, refusal, reason, finishedAt, announced and rev; the order's
    # due and rejection: Cosmos DB's 10, which a field more would pass (the store refuses it, by check_batch).
    assert len(patch.set_fields) == 10


def test_a_claim_closed_after_it_was_removed_from_its_order_is_a_record_of_its_own_that_takes_later_writes() -> None:
    store = InMemoryStore()
    effect = SideEffect(store, "intake", "reserve-stock", 60, lambda: NOW, within=RESERVATION_CLAIM, write_within=True)
    claim = effect.claim("o", InboundMessage(message_id="o", body=None, sequence_number=1))
    [order] = asyncio.run(store.execute_batch("o", [Create({"id": "o", "orderId": "o", "type": "order",
                                                            **effect.subject_fields(claim)})]))
    held = effect.held(order)
    assert held is not None and held.rev == 1
    kept = {k: v for k, v in order.items() if k != RESERVATION_CLAIM and not k.startswith("_")}
    asyncio.run(store.execute_batch("o", [Replace(kept)]))  # removed by hand
    assert asyncio.run(effect.close(held, "order-cancelled", "cancelled")).outcome is Outcome.ORDER_CLOSED
    closed = asyncio.run(effect.find(claim))
    assert closed is not None and closed.rev is UNSET and closed.status.value == "rejected"
    assert asyncio.run(effect.patch(closed, reason="checked")) is not None  # on its own etag, not the order's rev


def test_a_claim_kept_in_the_order_that_does_not_decode_is_decided_alike_by_hosts_writing_either_form() -> None:
    for settings in (OWN, IN_ORDER):
        store = InMemoryStore()
        place(app(IN_ORDER, store, Down()))
        order = asyncio.run(store.read("ord-1", "ord-1"))
        unreadable = {k: v for k, v in order[RESERVATION_CLAIM].items() if k != "requestHash"}
        asyncio.run(store.execute_batch("ord-1", [Patch("ord-1", {RESERVATION_CLAIM: {**unreadable, "attempt": "two",
                                                                                    "rev": 9}})]))
        # Its order's requestHash is this delivery's: the reservation is left to the version that wrote the claim.
        assert place(app(settings, store), sequence=2) is Outcome.IN_PROGRESS
        other = inbound(order_body("ord-1", items=[{"sku": "SKU-9", "quantity": 1, "unitPrice": "44.98"}]))
        assert asyncio.run(app(settings, store).handle_order(other)).outcome is Outcome.PAYLOAD_MISMATCH
