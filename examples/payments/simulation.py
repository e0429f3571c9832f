"""The payments example under the library's simulation kit: every fault a run can meet, the generic invariants,
and one of the ledger's own. From the repository's root: ``make simulate-payments`` (2,000 seeds), or
``PYTHONPATH=. python examples/payments/simulation.py --seeds N [--first S]``; exit 1 when an invariant broke."""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import function_app as payments
from idempotent_consumer.testing.simulation import Spec, World, simulate

ACCOUNTS = ("acc-1", "acc-2", "acc-3", "closed-1")


def messages(rng: random.Random) -> Sequence[bytes]:
    """A run's payments: a few accounts, one of them closed (the bank refuses its credits)."""
    return [json.dumps({"paymentId": f"pay-{n}", "accountId": rng.choice(ACCOUNTS),
                        "amount": f"{rng.randint(1, 500)}.{rng.randint(0, 99):02d}", "currency": "EUR"}).encode()
            for n in range(rng.randint(5, 25))]


def alter(body: bytes, rng: random.Random) -> bytes:
    """The same payment id with another amount: other content under the key."""
    return json.dumps({**json.loads(body), "amount": f"{rng.randint(501, 999)}.00"}).encode()


def foreign(body: bytes) -> Mapping[str, Any]:
    """Another writer's document where the payment's ledger entry goes."""
    payment = json.loads(body)
    return {"id": f"entry-{payment['paymentId']}", "type": "ledger-entry", "accountId": payment["accountId"],
            "by": "another writer"}


def bank(request: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """The bank's answer to a credit's first request."""
    if str(request.get("accountId", "")).startswith("closed-"):
        return 422, {"refusal": "account-closed", "reason": "the account is closed"}
    return 201, {}


def wire(world: World) -> None:
    """The example's bank client reaches the run's bank."""
    payments.bank.post = world.services["credit"].post  # type: ignore[method-assign]


def booked_payments_are_credited_and_in_the_ledger(world: World) -> Iterable[str]:
    """The ledger's own invariant: each PaymentBooked names a payment whose entry is in the ledger and whose credit
    the bank made under the reference it carries; each credit made is booked once."""
    credit = world.services["credit"]
    made = {credit.answers[key].body["reference"]: request for key, request in credit.made.items()}
    entries = {d["id"] for d in world.documents("ledger-entry")}
    booked = [json.loads(m.body) for m in world.delivered("payment-booked")]
    for message in booked:
        if f"entry-{message['paymentId']}" not in entries:
            yield f"PaymentBooked {message['paymentId']} has no ledger entry"
        if made.get(message["reference"], {}).get("paymentId") != message["paymentId"]:
            yield f"PaymentBooked {message['paymentId']} names {message['reference']}, not a credit of it"
    if len(booked) != len(made):
        yield f"{len(made)} credits made, {len(booked)} booked"


SPEC = Spec(consumer=payments.ledger, function="payment_received", messages=messages, services={"credit": bank},
            wire=wire, alter=alter, foreign=foreign, invariants=[booked_payments_are_credited_and_in_the_ledger])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--first", type=int, default=0)
    args = parser.parse_args(argv)
    report = simulate(SPEC, range(args.first, args.first + args.seeds))
    print(report.summary())
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
