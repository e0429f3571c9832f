"""The plan's intake on the in-memory store: one batch writes the key's marker, the handler's documents, the outbox
entries and the effects' claims; a redelivery finishes what is left and writes nothing twice; other content under
the key, or a document that is not the key's, is refused; each limit is reached and passed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest

from idempotent_consumer import identity
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.plan import MAX_OUTGOING_BODY_BYTES, Effect, Intake, Plan, Scope, Send
from idempotent_consumer.ports.partition import repartitioned
from idempotent_consumer.ports.store import MAX_BATCH_OPERATIONS
from idempotent_consumer.testing.memory import InMemoryStore

FIELD = "accountId"


@dataclass(frozen=True)
class Reply:
    status: int
    reference: str | None = None
    reason: str | None = None
    refusal: str | None = None


class Bank:
    """A downstream that answers each key's call from a script, and counts the calls by key."""

    def __init__(self, *answers: Reply) -> None:
        self.answers = list(answers) or [Reply(201, reference="ref-1")]
        self.calls: list[str] = []

    async def credit(self, key: str) -> Reply:
        self.calls.append(key)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _message(sequence: int = 1) -> InboundMessage:
    return InboundMessage(message_id="pay-1", body=b"{}", sequence_number=sequence)


def _plan(bank: Bank, account: str = "acc-1", **extra: Any) -> Plan:
    return Plan(create=[{"id": "entry-pay-1", "type": "ledger-entry", FIELD: account, "amount": "10.00"}],
                effect=Effect("credit", bank.credit),
                on_done=lambda reply: [Send("payment-booked", {"paymentId": "pay-1", "reference": reply.reference},
                                            to="payment-booked")],
                on_refused=lambda reply: [Send("payment-refused", {"paymentId": "pay-1", "why": reply.refusal},
                                               to="payment-refused")], **extra)


def _setup(scope: Scope = Scope.PARTITION) -> tuple[InMemoryStore, Intake]:
    store = InMemoryStore(partition_field=FIELD)
    return store, Intake(repartitioned(store, FIELD), "ledger-writer", partition_field=FIELD, scope=scope)


def _run(intake: Intake, plan: Plan, *, account: str = "acc-1", hash_: str = "h1", sequence: int = 1) -> Result:
    return asyncio.run(intake.run(plan, key="pay-1", partition=account, message=_message(sequence),
                                  request_hash=hash_))


def _types(store: InMemoryStore) -> list[str]:
    return sorted(d["type"] for d in store.documents())


def test_the_first_delivery_writes_the_plan_calls_once_and_announces_in_the_finish() -> None:
    store, intake = _setup()
    bank = Bank()
    result = _run(intake, _plan(bank))
    assert result.outcome is Outcome.CREATED and result.request_hash == "h1"
    assert bank.calls == [identity.effect_key("ledger-writer", "credit", "pay-1")]
    assert _types(store) == ["key", "ledger-entry", "outbox", "side-effect"]
    [entry] = [d for d in store.documents() if d["type"] == "outbox"]
    assert entry["messageId"] == identity.outgoing_message_id("ledger-writer", "payment-booked", "pay-1")
    assert entry["payload"] == {"paymentId": "pay-1", "reference": "ref-1"} and entry["correlationId"] == "pay-1"
    # Every document is stored in the consumer's partition, under its own partition key field.
    assert {d[FIELD] for d in store.documents()} == {"acc-1"} and all("orderId" not in d for d in store.documents())


def test_a_redelivery_writes_nothing_again_and_calls_nothing_again() -> None:
    store, intake = _setup()
    bank = Bank()
    _run(intake, _plan(bank))
    before = store.documents()
    again = _run(intake, _plan(bank), sequence=1)
    assert again.outcome is Outcome.DUPLICATE
    assert len(bank.calls) == 1 and store.documents() == before


def test_other_content_under_the_key_is_a_payload_mismatch_naming_both_hashes() -> None:
    store, intake = _setup()
    _run(intake, _plan(Bank()))
    before = store.documents()
    other = _run(intake, _plan(Bank()), hash_="h2")
    assert other.outcome is Outcome.PAYLOAD_MISMATCH
    assert "h1" in other.description and "h2" in other.description
    assert store.documents() == before


def test_a_failed_call_is_taken_over_by_the_redelivery_under_the_same_key() -> None:
    store, intake = _setup()
    bank = Bank(Reply(503), Reply(201, reference="ref-2"))
    first = _run(intake, _plan(bank))
    assert first.outcome is Outcome.TRANSIENT
    assert [d["type"] for d in store.documents() if d["type"] == "outbox"] == []
    second = _run(intake, _plan(bank))
    assert second.outcome is Outcome.DUPLICATE
    assert len(bank.calls) == 2 and len(set(bank.calls)) == 1  # the same idempotency key, so the bank drops a repeat
    [entry] = [d for d in store.documents() if d["type"] == "outbox"]
    assert entry["payload"]["reference"] == "ref-2"


def test_a_refusal_is_recorded_and_announced_by_on_refused() -> None:
    store, intake = _setup()
    result = _run(intake, _plan(Bank(Reply(422, reason="no funds", refusal="insufficient-funds"))))
    assert result.outcome is Outcome.REJECTED
    [entry] = [d for d in store.documents() if d["type"] == "outbox"]
    assert entry["destination"] == "payment-refused" and entry["payload"]["why"] == "insufficient-funds"


def test_a_document_that_is_not_the_keys_is_refused_and_left_as_it_stands() -> None:
    store, intake = _setup()
    foreign = {"id": "entry-pay-1", "type": "ledger-entry", FIELD: "acc-1", "amount": "99.00", "by": "another writer"}
    asyncio.run(store.create(foreign))
    bank = Bank()
    result = _run(intake, _plan(bank))
    assert result.outcome is Outcome.PAYLOAD_MISMATCH and "entry-pay-1" in result.description
    assert bank.calls == [] and _types(store) == ["ledger-entry"]
    assert store.documents()[0]["by"] == "another writer"


def test_the_batch_limit_is_reached_and_passed() -> None:
    # The marker and the claim take two of the batch's operations; the handler's documents the rest.
    def plan(documents: int) -> Plan:
        return Plan(create=[{"id": f"doc-{n}", FIELD: "acc-1"} for n in range(documents)],
                    effect=Effect("credit", Bank().credit))

    store, intake = _setup()
    assert _run(intake, plan(MAX_BATCH_OPERATIONS - 2)).outcome is Outcome.CREATED
    store, intake = _setup()
    past = _run(intake, plan(MAX_BATCH_OPERATIONS - 1))
    assert past.outcome is Outcome.LIMIT_EXCEEDED and f"exceeds the limit of {MAX_BATCH_OPERATIONS}" in past.description
    assert store.documents() == []


def test_the_batch_bytes_limit_and_the_item_limit_are_refused_before_anything_is_written() -> None:
    store, intake = _setup()
    big = "x" * (1024 * 1024)
    result = _run(intake, Plan(create=[{"id": "a", "blob": big}, {"id": "b", "blob": big}]))
    assert result.outcome is Outcome.LIMIT_EXCEEDED and "bytes" in result.description
    item = _run(intake, Plan(create=[{"id": "a", "blob": "x" * (2 * 1024 * 1024)}]))
    assert item.outcome is Outcome.LIMIT_EXCEEDED and "2097152" in item.description
    assert store.documents() == []


def test_an_outgoing_body_at_service_bus_size_is_sent_and_one_byte_past_is_refused() -> None:
    def plan(size: int) -> Plan:
        return Plan(send=[Send("note", {"text": "x" * (size - len('{"text":""}'))}, to="notes")])

    store, intake = _setup()
    assert _run(intake, plan(MAX_OUTGOING_BODY_BYTES)).outcome is Outcome.CREATED
    store, intake = _setup()
    past = _run(intake, plan(MAX_OUTGOING_BODY_BYTES + 1))
    assert past.outcome is Outcome.LIMIT_EXCEEDED and str(MAX_OUTGOING_BODY_BYTES + 1) in past.description
    assert store.documents() == []


@pytest.mark.parametrize(("plan", "why"), [
    (Plan(send=[Send("a", {}, to="q"), Send("a", {}, to="q")]), "used twice"),
    (Plan(create=[{"id": "x", FIELD: "acc-2"}]), "not the key's acc-1"),
    (Plan(create=[{"id": "x", "type": "outbox"}]), "library's records"),
    (Plan(create=[{"type": "ledger-entry"}]), "no id"),
    (Plan(on_done=lambda reply: []), "has none"),
    (Plan(send=[Send("a", [1, 2], to="q")]), "not an object"),
])
def test_a_plan_the_library_cannot_carry_out_is_dead_lettered_invalid_plan(plan: Plan, why: str) -> None:
    store, intake = _setup()
    result = _run(intake, plan)
    assert result.outcome is Outcome.INVALID_PLAN and why in result.description
    assert store.documents() == []


def test_partition_scope_takes_the_same_key_in_two_partitions_as_two_messages() -> None:
    store, intake = _setup(Scope.PARTITION)
    assert _run(intake, _plan(Bank(), "acc-1")).outcome is Outcome.CREATED
    assert _run(intake, _plan(Bank(), "acc-2"), account="acc-2", hash_="h2").outcome is Outcome.CREATED
    assert sorted(d[FIELD] for d in store.documents() if d["type"] == "key") == ["acc-1", "acc-2"]


def test_global_scope_refuses_the_same_key_under_another_partition() -> None:
    store, intake = _setup(Scope.GLOBAL)
    bank = Bank()
    assert _run(intake, _plan(bank, "acc-1")).outcome is Outcome.CREATED
    other = _run(intake, _plan(bank, "acc-2"), account="acc-2", hash_="h2")
    assert other.outcome is Outcome.PAYLOAD_MISMATCH and "across partitions" in other.description
    assert len(bank.calls) == 1 and not [d for d in store.documents() if d[FIELD] == "acc-2"]
    # The same content again is a duplicate through both records.
    assert _run(intake, _plan(bank, "acc-1")).outcome is Outcome.DUPLICATE


def test_several_named_effects_each_have_their_own_record_and_key() -> None:
    store, intake = _setup()
    bank, fees = Bank(), Bank()
    plan = Plan(effects=[Effect("credit", bank.credit), Effect("fee", fees.credit)])
    assert _run(intake, plan).outcome is Outcome.CREATED
    assert bank.calls != fees.calls and len(bank.calls) == len(fees.calls) == 1
    assert sorted(d["effect"] for d in store.documents() if d["type"] == "side-effect") == ["credit", "fee"]


def test_an_announcement_past_a_limit_is_refused_before_the_call_when_the_plan_shows_it() -> None:
    store, intake = _setup()
    bank = Bank()
    big = "x" * MAX_OUTGOING_BODY_BYTES
    plan = Plan(effect=Effect("credit", bank.credit),
                on_done=lambda reply: [Send("payment-booked", {"blob": big}, to="payment-booked")])
    result = _run(intake, plan)
    assert result.outcome is Outcome.LIMIT_EXCEEDED and bank.calls == [] and store.documents() == []


def test_an_announcement_past_a_limit_that_only_the_answer_shows_is_refused_at_the_finish_and_never_spins() -> None:
    store, intake = _setup()
    bank = Bank(Reply(201, reference="x" * MAX_OUTGOING_BODY_BYTES))

    def booked(reply: Any) -> list[Send]:
        return [Send("payment-booked", {"reference": reply.reference.upper()}, to="payment-booked")]

    result = _run(intake, Plan(effect=Effect("credit", bank.credit), on_done=booked))
    assert result.outcome is Outcome.LIMIT_EXCEEDED and "stays in progress" in result.description
    [record] = [d for d in store.documents() if d["type"] == "side-effect"]
    assert record["status"] == "in_progress" and not [d for d in store.documents() if d["type"] == "outbox"]


def test_two_effects_announcing_under_one_name_are_refused_before_anything_is_written() -> None:
    store, intake = _setup()
    bank = Bank()

    def booked(reply: Any) -> list[Send]:
        return [Send("booked", {"ok": True}, to="booked")]

    plan = Plan(effects=[Effect("credit", bank.credit, on_done=booked), Effect("fee", bank.credit, on_done=booked)])
    result = _run(intake, plan)
    assert result.outcome is Outcome.INVALID_PLAN and "['booked']" in result.description
    assert bank.calls == [] and store.documents() == []


def test_a_redelivery_whose_plan_is_not_the_one_that_took_the_key_is_refused_not_half_carried_out() -> None:
    _store, intake = _setup()
    bank = Bank()
    _run(intake, Plan(create=[{"id": "d1", FIELD: "acc-1"}]))
    changed = Plan(create=[{"id": "d1", FIELD: "acc-1"}, {"id": "d2", FIELD: "acc-1"}],
                   effect=Effect("credit", bank.credit))
    result = _run(intake, changed)
    assert result.outcome is Outcome.INVALID_PLAN and "['credit']" in result.description and bank.calls == []


def test_a_call_that_raises_ends_its_claims_lease_and_is_tried_again_never_abandoned_at_once() -> None:
    store, intake = _setup()
    calls: list[str] = []

    async def broken(key: str) -> Reply:
        calls.append(key)
        raise RuntimeError("BANK_URL=https://user:secret@bank is not reachable")

    result = _run(intake, Plan(effect=Effect("credit", broken)))
    assert result.outcome is Outcome.TRANSIENT and "RuntimeError" in result.description
    assert "secret" not in result.description
    [record] = [d for d in store.documents() if d["type"] == "side-effect"]
    assert record["status"] == "in_progress" and record["leaseUntil"] <= time.time()


def test_an_id_cosmos_db_refuses_is_refused_before_the_batch() -> None:
    _store, intake = _setup()
    result = _run(intake, Plan(create=[{"id": "entry/1", FIELD: "acc-1"}]))
    assert result.outcome is Outcome.INVALID_PLAN and "Cosmos DB refuses" in result.description
