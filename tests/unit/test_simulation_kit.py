"""The simulation kit pointed at the payments example: a smoke run of its seeds with 0 violations (the 2,000 are
``make simulate-payments``), the same seeds replaying step for step, and the planted bugs it must find: one in a
user's handler, two in the protocol."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import msgspec
import pytest

from idempotent_consumer import Effect, Plan, Send, side_effects
from idempotent_consumer import plan as plan_module
from idempotent_consumer.functions import Consumer, Context
from idempotent_consumer.testing.simulation import Spec, World, run, simulate
from tests.unit.test_consumer import EXAMPLE

SMOKE_SEEDS = range(25)


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    """examples/payments/simulation.py, with the example's function_app beside it as the worker imports it."""
    sys.path.insert(0, str(EXAMPLE))
    saved = sys.modules.pop("function_app", None)
    try:
        spec = importlib.util.spec_from_file_location("payments_simulation", EXAMPLE / "simulation.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop("function_app", None)
        if saved is not None:
            sys.modules["function_app"] = saved


def test_the_payments_example_holds_every_invariant_under_every_fault(example: ModuleType) -> None:
    report = simulate(example.SPEC, SMOKE_SEEDS)
    assert not report.violations, report.summary()
    # The faults were met: copies and other content refused, closed accounts refused, outages handed on.
    for outcome in ("created", "duplicate", "payload_mismatch", "rejected", "invalid", "handed_on"):
        assert report.outcomes[outcome] > 0, (outcome, report.summary())


def test_a_seed_replays_step_for_step(example: ModuleType) -> None:
    first, again = run(example.SPEC, 7)[0], run(example.SPEC, 7)[0]
    assert [(m, r.outcome, r.description) for m, r in first.deliveries] == \
        [(m, r.outcome, r.description) for m, r in again.deliveries]
    def stored(world: World) -> list[dict[str, Any]]:  # an etag is the store's random token
        return [{k: v for k, v in d.items() if k != "_etag"} for d in world.documents()]

    assert stored(first) == stored(again)


class Payment(msgspec.Struct, frozen=True, rename="camel"):
    payment_id: str
    account_id: str
    amount: str
    currency: str


class Bank:
    """A client the run wires to its bank."""

    async def post(self, path: str, body: Any, *, idempotency_key: str) -> Any:
        raise AssertionError("not wired")


def _buggy_consumer(bank: Bank) -> Consumer:
    """The example with a user's bug: the credit's key is made from the delivery's MessageId, not the one the
    library hands the call, so a producer's copy under a new MessageId credits the account again."""
    ledger = Consumer("ledger-writer", container="ledger", partition_key="/accountId", env={})

    @ledger.queue("payments", model=Payment, key=lambda p: p.payment_id)
    def payment_received(p: Payment, ctx: Context) -> Plan:
        entry = {"id": f"entry-{p.payment_id}", "type": "ledger-entry", **msgspec.to_builtins(p)}
        own_key = f"credit-{ctx.message.message_id}"
        return Plan(create=[entry], effect=Effect("credit", lambda key: bank.post("/credits", entry,
                                                                                 idempotency_key=own_key)),
                    on_done=lambda r: [Send("payment-booked", {"paymentId": p.payment_id, "reference": r.reference},
                                            to="payment-booked")])
    return ledger


def test_it_finds_a_planted_bug_in_a_users_handler(example: ModuleType) -> None:
    bank = Bank()

    def wire(world: World) -> None:
        bank.post = world.services["credit"].post  # type: ignore[method-assign]

    spec = Spec(consumer=_buggy_consumer(bank), function="payment_received", messages=example.messages,
                services={"credit": lambda request: (201, {})}, wire=wire)
    report = simulate(spec, SMOKE_SEEDS, first_violation=True)
    found = [v for vs in report.violations.values() for v in vs]
    assert any("which no accepted message derives (one effect per key)" in v for v in found), report.summary()


def test_it_finds_a_protocol_that_makes_an_effect_again_under_a_new_key(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted: a takeover calls under a key of its own attempt, as a protocol that forgot the record's key would.
    original = side_effects._Run.run

    async def run_with_a_new_key(self: Any, claim: Any, call: Any, **options: Any) -> Any:
        return await original(self, claim, lambda key: call(f"{key}-{claim.attempt}"), **options)

    monkeypatch.setattr(side_effects._Run, "run", run_with_a_new_key)
    report = simulate(example.SPEC, SMOKE_SEEDS, first_violation=True)
    found = [v for vs in report.violations.values() for v in vs]
    assert any("(one effect per key)" in v for v in found), report.summary()


def test_it_finds_a_protocol_that_writes_without_its_marker(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted: the intake's batch without the key's marker, so the create is no longer the duplicate check.
    original = plan_module.Intake._intake

    def without_the_marker(self: Any, *args: Any, **options: Any) -> Any:
        operations, claims = original(self, *args, **options)
        return operations[1:], claims

    monkeypatch.setattr(plan_module.Intake, "_intake", without_the_marker)
    report = simulate(example.SPEC, SMOKE_SEEDS, first_violation=True)
    found = [v for vs in report.violations.values() for v in vs]
    assert any("0 markers" in v for v in found), report.summary()


def test_the_ledgers_own_invariant_finds_a_booking_that_names_another_credit(example: ModuleType) -> None:
    world, _ = run(example.SPEC, 3)
    assert not list(example.booked_payments_are_credited_and_in_the_ledger(world))
    queued = world.broker.queues["payment-booked"][0]
    booked = json.loads(queued.message.body)
    forged = json.dumps({**booked, "reference": "credit-999"}).encode()
    queued.message = dataclasses.replace(queued.message, body=forged)
    found = list(example.booked_payments_are_credited_and_in_the_ledger(world))
    assert any("not a credit of it" in v for v in found)
