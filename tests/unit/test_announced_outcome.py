"""What the app announces follows the effect it announces: OrderAccepted only once the stock is reserved,
OrderRejected when the service refused it for good, one of the two per order, never both, and nothing
when the call itself was refused or never finished."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from idempotent_consumer.errors import NotFound, UnreadableDocument
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import BatchOperation, Create, Document, Patch, Replace
from idempotent_consumer.records import EffectStatus, SideEffectRecord
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.adapters.reservations import KEY_REUSED
from shared.domain import identity
from shared.handlers.place_order import RESERVE_STOCK, OrderServices, failed_as_ended, place_order
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.orders import inbound, order_body
from tests.support.records import as_own_document, of_kind, replaced

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

SETTINGS = Settings(consumer_name="order-intake", fulfillment_url="http://fulfilment.invalid")
SOLD_OUT = [{"sku": "SOLDOUT-7", "quantity": 1, "unitPrice": "44.98"}]


class Scripted(InMemoryFulfilment):
    """The fake service, answering the scripted replies first, then by the reservation rule."""

    def __init__(self, *replies: Reply) -> None:
        super().__init__()
        self.replies = list(replies)

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        if self.replies:
            self.calls.append(idempotency_key)
            return self.replies.pop(0)
        return await super().reserve(idempotency_key, request)


class Recording(InMemoryStore):
    """The in-memory store, keeping each batch's operations."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[BatchOperation]] = []

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        self.batches.append(list(operations))
        return await super().execute_batch(partition_key, operations)


def place(store: InMemoryStore, fulfilment: InMemoryFulfilment, body: dict[str, Any], *,
          sequence: int | None = 1) -> Result:
    return asyncio.run(place_order(inbound(body, sequence_number=sequence),
                                   OrderServices(store, fulfilment, SETTINGS)))


def put(store: InMemoryStore, document: Document) -> None:
    """Write a document as another version would have: replaced if it is there, else created; a claim kept in its
    order, in its order."""
    if document.get("type") == "side-effect" and "rev" in document:
        asyncio.run(replaced(store, document))
        return
    try:
        asyncio.run(store.read(document["id"], document["orderId"]))
    except NotFound:
        asyncio.run(store.execute_batch(document["orderId"], [Create(document)]))
    else:
        asyncio.run(store.execute_batch(document["orderId"], [Replace(document)]))


def of_type(store: InMemoryStore, kind: str) -> list[Document]:
    return of_kind(store.documents(), kind)


def test_order_accepted_is_written_in_the_batch_that_finishes_the_reservation_not_before(claim_form: str) -> None:
    store, fulfilment = Recording(), InMemoryFulfilment()
    assert place(store, fulfilment, order_body("ord-1")).outcome is Outcome.CREATED
    intake, finish = store.batches
    if claim_form == "claim of its own":
        assert [op.document["type"] for op in intake if isinstance(op, Create)] == ["order", "side-effect"]
        # The record's patch, OrderAccepted, and the reservation on the order, which holds only while it is open.
        assert [type(op).__name__ for op in finish] == ["Patch", "Create", "Patch"]
        reserved = finish[2]
    else:  # the claim in the order's create; its finish and the reservation one patch of the order, then OrderAccepted
        assert [op.document["type"] for op in intake if isinstance(op, Create)] == ["order"]
        assert [type(op).__name__ for op in finish] == ["Patch", "Create"]
        reserved = finish[0]
        assert isinstance(reserved, Patch) and reserved.doc_id == "ord-1" and reserved.condition["reservationClaim/rev"]
        assert {"reservation", "reservationClaim/status", "due"} <= set(reserved.set_fields)
    assert isinstance(reserved, Patch) and reserved.condition["status"] == ("paid", "placed", "shipped")
    [entry] = of_type(store, "outbox")
    assert (entry["subject"], entry["destination"], entry["messageId"]) == (
        "OrderAccepted", "order-accepted", identity.outbox_message_id("order-intake", "ord-1"))
    assert entry["payload"]["orderId"] == "ord-1"
    assert store.requests == 2  # the floor is kept: the intake batch, the finish batch


@pytest.mark.parametrize("answers", [[Reply(503)], [Reply(503)] * 3], ids=["once", "three times"])
def test_a_reservation_that_has_not_finished_announces_nothing(answers: list[Reply]) -> None:
    store = InMemoryStore()
    fulfilment = Scripted(*answers)
    for _ in answers:
        assert place(store, fulfilment, order_body("ord-1")).outcome is Outcome.TRANSIENT
    assert of_type(store, "outbox") == []
    assert place(store, fulfilment, order_body("ord-1")).outcome is Outcome.DUPLICATE  # reserved now
    [entry] = of_type(store, "outbox")
    assert entry["subject"] == "OrderAccepted"


def test_a_refused_reservation_publishes_order_rejected_records_it_and_completes() -> None:
    store, fulfilment = InMemoryStore(), InMemoryFulfilment()
    result = place(store, fulfilment, order_body("ord-1", items=SOLD_OUT))
    assert result.outcome is Outcome.REJECTED
    assert "refusal out-of-stock" in result.description and "SOLDOUT-7 is out of stock" in result.description
    [record] = of_type(store, "side-effect")
    assert (record["status"], record["refusal"], record["responseStatus"]) == ("rejected", "out-of-stock", 422)
    [order] = of_type(store, "order")
    assert order["rejection"]["refusal"] == "out-of-stock" and order["rejection"]["responseStatus"] == 422
    assert order["status"] == "placed"  # the lifecycle's status is the events'; the rejection sits beside it
    [entry] = of_type(store, "outbox")
    assert (entry["subject"], entry["destination"], entry["messageId"]) == (
        "OrderRejected", "order-rejected", identity.rejected_message_id("order-intake", "ord-1"))
    assert entry["payload"] == {"orderId": "ord-1", "customerId": "cust-42", "refusal": "out-of-stock",
                                "reason": "SOLDOUT-7 is out of stock", "rejectedAt": order["rejection"]["rejectedAt"]}
    assert fulfilment.ledger.count() == 0


def test_a_copy_of_a_rejected_order_is_rejected_again_without_a_call() -> None:
    store, fulfilment = InMemoryStore(), InMemoryFulfilment()
    place(store, fulfilment, order_body("ord-1", items=SOLD_OUT))
    assert place(store, fulfilment, order_body("ord-1", items=SOLD_OUT), sequence=2).outcome is Outcome.REJECTED
    assert len(fulfilment.calls) == 1 and len(of_type(store, "outbox")) == 1


@pytest.mark.parametrize("reply", [Reply(422, {"reason": KEY_REUSED}), Reply(400), Reply(404),
                                   Reply(501), Reply(422, {"refusal": "", "reason": "empty code"})],
                         ids=["422 key reused", "400", "404", "501", "422 empty refusal"])
def test_a_refused_call_announces_nothing_and_leaves_the_claim_for_a_resubmission(reply: Reply) -> None:
    store = InMemoryStore()
    fulfilment = Scripted(reply)
    result = place(store, fulfilment, order_body("ord-1"))
    assert result.outcome is Outcome.DOWNSTREAM_REJECTED
    assert f"HTTP {reply.status}" in result.description and "resubmit" in result.description
    assert of_type(store, "outbox") == []
    [record] = of_type(store, "side-effect")
    assert (record["status"], record["responseStatus"]) == ("in_progress", reply.status)
    # The operator puts the cause right and resubmits: a new message, which takes the claim over and calls again.
    assert place(store, fulfilment, order_body("ord-1"), sequence=9).outcome is Outcome.DUPLICATE
    [record] = of_type(store, "side-effect")
    assert (record["status"], record["attempt"], record["messageSequence"]) == ("completed", 2, 9)
    assert [e["subject"] for e in of_type(store, "outbox")] == ["OrderAccepted"]


def test_a_record_an_earlier_version_marked_failed_is_taken_over_by_the_resubmission() -> None:
    store, fulfilment = InMemoryStore(), Scripted(Reply(503))
    place(store, fulfilment, order_body("ord-1"))
    [record] = of_type(store, "side-effect")
    # Releases before REJECTED wrote every claim as a document of its own.
    asyncio.run(as_own_document(store, {**record, "status": "failed", "responseStatus": 422,
                                        "finishedAt": record["leaseUntil"]}))
    assert place(store, fulfilment, order_body("ord-1"), sequence=5).outcome is Outcome.DUPLICATE
    [record] = of_type(store, "side-effect")
    assert (record["status"], record["attempt"]) == ("completed", 2)
    assert len(of_type(store, "outbox")) == 1


def test_failed_is_the_order_apps_history_not_a_status_the_library_reads() -> None:
    store, fulfilment = InMemoryStore(), Scripted(Reply(503))
    place(store, fulfilment, order_body("ord-1"))
    [record] = of_type(store, "side-effect")
    asyncio.run(as_own_document(store, {**record, "status": "failed", "finishedAt": record["leaseUntil"] - 5}))
    claim = SideEffectRecord.from_document(record)
    with pytest.raises(UnreadableDocument):  # a library consumer never wrote it, and has no hook
        asyncio.run(SideEffect(store, SETTINGS.consumer_name, RESERVE_STOCK, 60).find(claim))
    hooked = SideEffect(store, SETTINGS.consumer_name, RESERVE_STOCK, 60, upgrade=failed_as_ended)
    found = asyncio.run(hooked.find(claim))
    assert found is not None and found.status is EffectStatus.IN_PROGRESS
    assert found.lease_until == record["leaseUntil"] - 5  # its lease ended when the old version finished it


def as_the_version_before(store: InMemoryStore, order_id: str, *, entry: bool = True) -> None:
    """The order's claim as the version before wrote it (no ``announces``), with the OrderAccepted entry that
    version wrote in its intake batch."""
    [record] = [d for d in of_type(store, "side-effect") if d["orderId"] == order_id]
    asyncio.run(as_own_document(store, {k: v for k, v in record.items() if k not in ("announces", "announced")}))
    if entry:
        put(store, {"id": identity.outbox_id("order-intake", order_id), "orderId": order_id, "type": "outbox",
                    "status": "dispatched", "subject": "OrderAccepted", "written": "by the version before"})


def test_a_claim_the_version_before_wrote_completes_without_a_second_order_accepted() -> None:
    store, fulfilment = InMemoryStore(), Scripted(Reply(503))
    place(store, fulfilment, order_body("ord-1"))
    as_the_version_before(store, "ord-1")
    assert place(store, fulfilment, order_body("ord-1")).outcome is Outcome.DUPLICATE
    [entry] = of_type(store, "outbox")
    assert entry["written"] == "by the version before"
    assert of_type(store, "side-effect")[0]["status"] == "completed"


def test_a_claim_the_version_before_wrote_and_the_service_refuses_is_corrected_by_order_rejected() -> None:
    # The version before announced OrderAccepted at intake, before the call; the refusal is announced beside it.
    store, fulfilment = InMemoryStore(), Scripted(Reply(503))
    place(store, fulfilment, order_body("ord-1", items=SOLD_OUT))
    as_the_version_before(store, "ord-1")
    assert place(store, fulfilment, order_body("ord-1", items=SOLD_OUT)).outcome is Outcome.REJECTED
    entries = {e["subject"]: e for e in of_type(store, "outbox")}
    assert entries["OrderAccepted"]["written"] == "by the version before"
    assert entries["OrderRejected"]["id"] == identity.rejected_correction_id("order-intake", "ord-1")
    assert entries["OrderRejected"]["messageId"] == identity.rejected_message_id("order-intake", "ord-1")


def test_a_claim_this_version_wrote_that_the_version_before_finished_is_announced_by_the_next_delivery() -> None:
    # The version before finishes a claim by patching the record alone: no outcome. The next delivery that reads
    # the record (a copy, a resubmission) finds it announces its outcome and was not announced, and writes it.
    store, fulfilment = InMemoryStore(), Scripted(Reply(503))
    place(store, fulfilment, order_body("ord-1"))
    [record] = of_type(store, "side-effect")
    put(store, {**record, "status": "completed", "responseStatus": 201, "reference": "res-1"})
    assert of_type(store, "outbox") == []
    assert place(store, fulfilment, order_body("ord-1"), sequence=2).outcome is Outcome.DUPLICATE
    [entry] = of_type(store, "outbox")
    assert entry["subject"] == "OrderAccepted" and of_type(store, "side-effect")[0]["announced"] is True
    assert len(fulfilment.calls) == 1  # not called again: the reservation stands
    assert place(store, fulfilment, order_body("ord-1"), sequence=3).outcome is Outcome.DUPLICATE
    assert len(of_type(store, "outbox")) == 1


def test_a_rejection_another_writer_put_on_the_order_first_is_merged_not_replaced() -> None:
    store, fulfilment = InMemoryStore(), Scripted(Reply(503))
    place(store, fulfilment, order_body("ord-1", items=SOLD_OUT))
    [order] = of_type(store, "order")
    put(store, {**order, "rejection": {"notifiedBy": "crm"}})
    assert place(store, fulfilment, order_body("ord-1", items=SOLD_OUT)).outcome is Outcome.REJECTED
    [order] = of_type(store, "order")
    assert order["rejection"]["notifiedBy"] == "crm" and order["rejection"]["refusal"] == "out-of-stock"


def test_a_refused_call_whose_record_another_delivery_finished_meanwhile_takes_that_verdict() -> None:
    store = InMemoryStore()

    class FinishedUnderTheCall(InMemoryFulfilment):
        async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
            # Another delivery of the order finishes the record while this call runs, which is then refused.
            [record] = of_type(store, "side-effect")
            await replaced(store, {**record, "status": "completed", "announced": True, "responseStatus": 201})
            return Reply(404, {"reason": "no such route"})

    result = place(store, FinishedUnderTheCall(), order_body("ord-1"))
    assert result.outcome is Outcome.CREATED  # the effect happened: completed, not dead-lettered DownstreamRejected


@pytest.mark.parametrize("status", [401, 403])
def test_a_service_that_does_not_allow_the_app_is_out_of_reach_not_a_refused_call(status: int) -> None:
    # The same answer for every message: the app's identity lacks its role. Not the message's fault, so not
    # dead-lettered: the claim's lease ends, the dependency counts as down (its breaker), nothing is announced.
    store = InMemoryStore()
    fulfilment = Scripted(Reply(status, {"refusal": "forbidden", "reason": "the caller lacks the role"}))
    result = place(store, fulfilment, order_body("ord-1"))
    assert (result.outcome, result.dependency_up) == (Outcome.TRANSIENT, False)
    assert of_type(store, "outbox") == []
    [record] = of_type(store, "side-effect")
    assert record["status"] == "in_progress"
    # Once the role is granted, the next delivery (a redelivery, or the handed-on copy) takes over and reserves.
    assert place(store, fulfilment, order_body("ord-1")).outcome is Outcome.DUPLICATE
    assert [e["subject"] for e in of_type(store, "outbox")] == ["OrderAccepted"]
