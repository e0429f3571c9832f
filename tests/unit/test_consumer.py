"""The Consumer blueprint: the trigger settings it owns, its companions, its settings under a prefix, the decoding
of a message, and the payments example (examples/payments) end to end on the in-memory store and sender, with its
bank call over HTTP to the local bank."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import azure.functions as func
import msgspec
import pytest

from devservers.bank import BankServer
from idempotent_consumer import Plan
from idempotent_consumer.errors import ConfigurationError
from idempotent_consumer.functions import Consumer, Context
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "payments"


class Note(msgspec.Struct, rename="camel"):
    note_id: str
    board_id: str


def bindings(functions: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Each function's bindings as the worker reports them to the host (an app's functions are got once: the
    library validates their names on each call)."""
    return {f.get_function_name(): [json.loads(b) for b in f.get_raw_bindings()] for f in functions}


def test_the_blueprint_owns_the_triggers_settings_and_brings_its_companions() -> None:
    notes = Consumer("note-keeper", container="notes", partition_key="/boardId", env={})

    @notes.queue("notes", model=Note, key=lambda n: n.note_id)
    async def note_written(note: Note, ctx: Context) -> Plan:
        return Plan()

    app = func.FunctionApp()
    app.register_functions(notes)
    functions = app.get_functions()
    found = bindings(functions)
    assert set(found) == {"note_written", "note_keeper_publish_outbox", "note_keeper_sweep_outbox",
                          "note_keeper_report_stuck"}
    [trigger] = found["note_written"]
    assert trigger["type"] == "serviceBusTrigger" and trigger["queueName"] == "notes"
    assert trigger["autoCompleteMessages"] is False and trigger["connection"] == "ServiceBusConnection"
    [feed] = found["note_keeper_publish_outbox"]
    assert (feed["type"], feed["containerName"], feed["leaseContainerName"]) == ("cosmosDBTrigger", "notes", "leases")
    assert feed["leaseContainerPrefix"] == "note-keeper." and feed["createLeaseContainerIfNotExists"] is False
    # The SDK-type binding: the worker hands the function the message and its settlement actions.
    [function] = [f for f in functions if f.get_function_name() == "note_written"]
    assert set(function.get_user_function().__annotations__) >= {"msg", "message_actions"}
    # The publisher's batch is run again when its invocation fails (its worker lost between a send and a delete):
    # the retry policy the Functions host runs for the Cosmos DB trigger, the checkpoint held.
    [publisher] = [f for f in functions if f.get_function_name() == "note_keeper_publish_outbox"]
    assert publisher.get_settings_dict("retry_policy") == {
        "setting_name": "retry_policy", "strategy": "fixed_delay", "max_retry_count": "5", "delay_interval": "00:00:05"}
    assert all(f.get_settings_dict("retry_policy") is None for f in functions if f is not publisher)


def test_settings_are_read_under_the_prefix_and_every_bad_one_is_named() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Consumer("n", container="c", partition_key="/boardId", prefix="NOTES_",
                 env={"NOTES_BREAKER_WINDOW": "1", "NOTES_DEDUP_TTL_SECONDS": "x",
                      "BREAKER_WINDOW": "not read: unprefixed"})
    assert "NOTES_BREAKER_WINDOW" in str(caught.value) and "NOTES_DEDUP_TTL_SECONDS" in str(caught.value)
    assert "2 settings" in str(caught.value)


def test_the_retention_rule_is_checked_for_each_queue_naming_it() -> None:
    notes = Consumer("n", container="c", partition_key="/boardId", prefix="NOTES_",
                     env={"NOTES_DEDUP_TTL_SECONDS": "60"})
    with pytest.raises(ConfigurationError, match=r"NOTES_DEDUP_TTL_SECONDS.*for queue notes"):
        notes.queue("notes", model=Note)


def test_the_first_invocation_names_every_missing_setting_at_once() -> None:
    notes = Consumer("n", container="c", partition_key="/boardId", env={})
    with pytest.raises(ConfigurationError) as caught:
        notes.runtime().store()
    assert "COSMOS_ENDPOINT" in str(caught.value) and "ServiceBusConnection" in str(caught.value)


@pytest.mark.parametrize(("path", "why"), [("/a/b", "top-level path"), ("/id", "field 'id' of their own"),
                                           ("/key", "field 'key'"), ("/status", "field 'status'")])
def test_a_partition_key_path_the_library_cannot_take_is_refused(path: str, why: str) -> None:
    # A record's own field would be overwritten by its partition key at the store's edge.
    with pytest.raises(ValueError, match=why):
        Consumer("n", container="c", partition_key=path, env={})


@pytest.fixture
def payments(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, BankServer]]:
    """The example's function_app, imported as the worker imports it, with its bank."""
    with BankServer() as bank:
        monkeypatch.setenv("BANK_URL", bank.url)
        spec = importlib.util.spec_from_file_location("payments_function_app", EXAMPLE / "function_app.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module, bank
        sys.modules.pop("payments_function_app", None)


def _payment(payment_id: str = "pay-1", account: str = "acc-1", **fields: Any) -> bytes:
    return json.dumps({"paymentId": payment_id, "accountId": account, "amount": "12.50", "currency": "EUR",
                       **fields}).encode()


def _deliver(consumer: Consumer, body: bytes, message_id: str = "m-1", sequence: int = 1) -> Any:
    return asyncio.run(consumer.handle("payment_received", InboundMessage(message_id, body, sequence_number=sequence)))


def test_the_example_app_is_the_blueprint_and_its_companions(payments: tuple[ModuleType, BankServer]) -> None:
    module, _ = payments
    assert set(bindings(module.app.get_functions())) == {"payment_received", "ledger_writer_publish_outbox",
                                         "ledger_writer_sweep_outbox", "ledger_writer_report_stuck"}


def test_a_payment_is_one_entry_one_credit_and_one_booked_message_however_often_it_comes(
    payments: tuple[ModuleType, BankServer],
) -> None:
    module, bank = payments
    store, sender = InMemoryStore(partition_field="accountId"), RecordingSender()
    runtime = module.ledger.runtime(store=store, sender=sender)
    assert _deliver(module.ledger, _payment()).outcome is Outcome.CREATED
    # The producer sent it again, under another MessageId: the key is the payment's id.
    assert _deliver(module.ledger, _payment(), message_id="m-2", sequence=2).outcome is Outcome.DUPLICATE
    assert len(bank.credits()) == 1
    entries = [d for d in store.documents() if d["type"] == "ledger-entry"]
    assert [(e["id"], e["accountId"]) for e in entries] == [("entry-pay-1", "acc-1")]
    # The change feed hands the publisher the container's documents as stored, partition key and all.
    report = asyncio.run(runtime.publish(store.documents()))
    [(destination, message)] = [(d, m) for d, m in sender.sent]
    assert destination == "payment-booked" and len(report.dispatched) == 1
    assert json.loads(message.body) == {"paymentId": "pay-1", "reference": "cr-1"}


def test_a_refused_credit_is_announced_by_payment_refused(payments: tuple[ModuleType, BankServer]) -> None:
    module, bank = payments
    store, sender = InMemoryStore(partition_field="accountId"), RecordingSender()
    runtime = module.ledger.runtime(store=store, sender=sender)
    assert _deliver(module.ledger, _payment(account="closed-9")).outcome is Outcome.REJECTED
    asyncio.run(runtime.publish(store.documents()))
    [(destination, message)] = sender.sent
    assert destination == "payment-refused" and json.loads(message.body)["refusal"] == "account-closed"
    assert bank.credits() == []


def test_other_content_under_a_payments_id_is_dead_lettered_not_credited(
    payments: tuple[ModuleType, BankServer],
) -> None:
    module, bank = payments
    module.ledger.runtime(store=InMemoryStore(partition_field="accountId"), sender=RecordingSender())
    _deliver(module.ledger, _payment())
    other = _deliver(module.ledger, json.dumps({**json.loads(_payment()), "amount": "99.00"}).encode(), "m-3", 3)
    assert other.outcome is Outcome.PAYLOAD_MISMATCH and len(bank.credits()) == 1


@pytest.mark.parametrize(("body", "outcome", "why"), [
    (b"{not json", Outcome.INVALID, "body is not a PaymentReceived"),
    (json.dumps({"paymentId": "p", "accountId": "a", "amount": "1"}).encode(), Outcome.INVALID, "currency"),
    (json.dumps({"paymentId": "", "accountId": "a", "amount": "1", "currency": "EUR"}).encode(), Outcome.INVALID,
     "key is empty"),
    (json.dumps({"paymentId": "p", "accountId": "", "amount": "1", "currency": "EUR"}).encode(), Outcome.INVALID,
     "names no accountId"),
    (_payment(note="x" * (256 * 1024)), Outcome.LIMIT_EXCEEDED, "at most 262144"),
    (b"[" * 100_000 + b"]" * 100_000, Outcome.INVALID, "is not a PaymentReceived"),
])
def test_a_message_the_handler_cannot_take_is_refused_before_it_is_called(
    payments: tuple[ModuleType, BankServer], body: bytes, outcome: Outcome, why: str,
) -> None:
    module, bank = payments
    store = InMemoryStore(partition_field="accountId")
    module.ledger.runtime(store=store, sender=RecordingSender())
    result = _deliver(module.ledger, body)
    assert result.outcome is outcome and why in result.description
    assert store.documents() == [] and bank.credits() == []


def test_the_examples_local_files_are_what_its_local_run_needs() -> None:
    from devservers.servicebus.config import load_config  # noqa: PLC0415 - a dev server's, for this test alone

    values = json.loads((EXAMPLE / "local.settings.sample.json").read_text())["Values"]
    settings = Consumer("ledger-writer", container="ledger", partition_key="/accountId", env=values).settings.complete()
    assert settings.cosmos_database == "payments" and values["BANK_URL"].startswith("http://")
    assert values["AzureWebJobsStorage"] == "UseDevelopmentStorage=true" and "CosmosDBConnection" in values
    queues = {q.name: q for q in load_config(EXAMPLE / "servicebus-config.json").queues}
    assert set(queues) == {"payments", "payment-booked", "payment-refused"}
    assert all(q.requires_duplicate_detection for q in queues.values())
    # The queues' message time to live is what the settings say it is, so that the retention rule holds for it.
    assert {q.settings.default_message_ttl for q in queues.values()} == {settings.servicebus_message_ttl_seconds}
    assert {q.settings.lock_duration for q in queues.values()} == {settings.servicebus_lock_duration_seconds}


class Tier(msgspec.Struct):
    tier: Literal["gold", "silver"]
    board_id: str = msgspec.field(name="boardId")


def test_a_value_of_the_message_never_reaches_the_dead_letters_description() -> None:
    notes = Consumer("n", container="c", partition_key="/boardId", env={})

    @notes.queue("tiers", model=Tier)
    def tiers(t: Tier, ctx: Context) -> Plan:
        return Plan()

    result = notes.check("tiers", InboundMessage("m", json.dumps({"tier": "secret-4111", "boardId": "b"}).encode()))
    assert result is not None and result.outcome is Outcome.INVALID
    assert "secret" not in result.description and "$.tier" in result.description


def test_a_handler_that_raises_is_dead_lettered_naming_only_the_exceptions_type() -> None:
    notes = Consumer("n", container="c", partition_key="/boardId", env={})

    @notes.queue("tiers", model=Tier)
    def tiers(t: Tier, ctx: Context) -> Plan:
        raise KeyError(f"no board {t.board_id}")

    notes.runtime(store=InMemoryStore(partition_field="boardId"), sender=RecordingSender())
    result = asyncio.run(notes.handle("tiers", InboundMessage("m", b'{"tier": "gold", "boardId": "b-7"}')))
    assert result.outcome is Outcome.INVALID_PLAN and "KeyError" in result.description
    assert "b-7" not in result.description.replace("key m", "")


def test_the_same_content_spelt_otherwise_hashes_the_same() -> None:
    notes = Consumer("n", container="c", partition_key="/boardId", env={})

    @notes.queue("counts", model=dict)
    def counts(c: dict[str, Any], ctx: Context) -> Plan:
        return Plan()

    entry = notes.queues["counts"]
    first = notes.decode(entry, InboundMessage("m", b'{"boardId": "b", "n": 1, "items": [2]}'))
    again = notes.decode(entry, InboundMessage("m", b'{ "items": [2.0], "n": 1.0, "boardId": "b" }'))
    other = notes.decode(entry, InboundMessage("m", b'{"boardId": "b", "n": 1.5, "items": [2]}'))
    assert not isinstance(first, Result) and not isinstance(again, Result) and not isinstance(other, Result)
    assert first[3] == again[3] != other[3]


def test_an_app_with_a_history_keeps_its_names_settings_runtime_and_a_handler_of_its_own() -> None:
    from idempotent_consumer.functions.consumer import Companions  # noqa: PLC0415 - what this test is about
    from idempotent_consumer.runtime import Runtime  # noqa: PLC0415
    from idempotent_consumer.settings import ConsumerSettings  # noqa: PLC0415

    settings = ConsumerSettings(cosmos_container="notes", stuck_report_schedule="0 */7 * * * *")
    runtimes = [Runtime("old-notes", settings, partition_field="boardId")]

    async def handle(runtime: Runtime, message: InboundMessage) -> Result:  # its deliveries: tests/functions
        return Result(Outcome.CREATED)

    def refuse(message: InboundMessage) -> Result | None:
        return Result(Outcome.INVALID, "no body") if not message.body else None

    notes = Consumer("old-notes", container="notes", partition_key="/boardId", settings=settings,
                     root=lambda: runtimes[-1], companions=Companions(publish_outbox="publish", sweep_outbox="sweep",
                                                                     report_stuck="report", lease_prefix=""))
    notes.handler("notes", handle, check=refuse, function_name="process_note")
    app = func.FunctionApp()
    app.register_functions(notes)
    found = bindings(app.get_functions())
    assert set(found) == {"process_note", "publish", "sweep", "report"}
    [trigger] = found["process_note"]
    assert (trigger["queueName"], trigger["autoCompleteMessages"]) == ("notes", False)
    assert "isSessionsEnabled" not in trigger  # false is the host's default: the binding says only what it changes
    [feed] = found["publish"]
    assert "leaseContainerPrefix" not in feed  # the leases the publisher was deployed with: the feed resumes there
    assert found["report"][0]["schedule"] == "0 */7 * * * *"  # the app's settings, not ConsumerSettings read again
    # The runtime is the root's, asked for on each invocation: a test (or the app) may hand in another.
    assert notes.runtime() is runtimes[0]
    runtimes.append(Runtime("old-notes", settings, partition_field="boardId"))
    assert notes.runtime() is runtimes[1]
    with pytest.raises(ValueError, match="name 'notes'"):
        Consumer("old-notes", container="other", partition_key="/boardId", settings=settings)
