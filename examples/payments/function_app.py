"""Payments into a ledger, effectively once: PaymentReceived -> a ledger entry, one bank credit, PaymentBooked."""

import azure.functions as func
import msgspec

from idempotent_consumer import Effect, Plan, Send
from idempotent_consumer.functions import Consumer, Context
from idempotent_consumer.http import JsonHttp


class PaymentReceived(msgspec.Struct, frozen=True, rename="camel"):
    payment_id: str
    account_id: str
    amount: str
    currency: str


bank = JsonHttp.from_setting("BANK_URL")
ledger = Consumer("ledger-writer", container="ledger", partition_key="/accountId")


@ledger.queue("payments", model=PaymentReceived, key=lambda p: p.payment_id)
def payment_received(p: PaymentReceived, ctx: Context) -> Plan:
    entry = {"id": f"entry-{p.payment_id}", "type": "ledger-entry", **msgspec.to_builtins(p)}
    return Plan(create=[entry],
                effect=Effect("credit", lambda key: bank.post("/credits", entry, idempotency_key=key)),
                on_done=lambda r: [Send("payment-booked", {"paymentId": p.payment_id, "reference": r.reference},
                                        to="payment-booked")],
                on_refused=lambda r: [Send("payment-refused", {"paymentId": p.payment_id, "refusal": r.refusal},
                                           to="payment-refused")])


app = func.FunctionApp()
app.register_functions(ledger)
