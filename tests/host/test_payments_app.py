"""The payments example (examples/payments) on the local host, against the local broker, Cosmos server and bank:
a consumer that is not about orders, built on the library with one decorator, in a container partitioned by
``/accountId``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.cosmos import ContainerProxy, PartitionKey

from devservers.bank import BankServer
from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, ROOT, HostProcess, Store, eventually, launch, peek, send, stop
from tests.host.test_app_on_host import received
from tests.support.cosmos import make_cosmos_client

pytestmark = NEEDS_313
APP = ROOT / "examples" / "payments"


@pytest.fixture(scope="module")
def ledger(store: Store) -> ContainerProxy:
    database = make_cosmos_client(store.endpoint).get_database_client(store.database)
    return database.create_container_if_not_exists("ledger", PartitionKey(path="/accountId"), default_ttl=-1)


@pytest.fixture(scope="module")
def bank() -> Iterator[BankServer]:
    with BankServer() as server:
        yield server


@pytest.fixture(scope="module")
def host(broker: Broker, store: Store, ledger: ContainerProxy, bank: BankServer) -> Iterator[HostProcess]:
    """One host of the example for the module's tests, each of which works on payments of its own."""
    account = f"AccountEndpoint={store.endpoint.url}/;AccountKey={store.endpoint.key};"
    running = launch(APP, {
        "FUNCTIONS_WORKER_RUNTIME": "python", "AzureWebJobsStorage": store.host_storage,
        "AzureFunctionsWebHost__hostid": f"payments-{uuid.uuid4().hex[:12]}",
        "ServiceBusConnection": broker.connection_string, "CosmosDBConnection": account,
        "COSMOS_ENDPOINT": store.endpoint.url, "COSMOS_KEY": store.endpoint.key,
        "COSMOS_VERIFY_TLS": str(store.endpoint.verify_tls).lower(), "COSMOS_DATABASE": store.database,
        "BANK_URL": bank.url, "ABANDON_DELAY_SECONDS": "0",
        # The library travels beside the example's function_app.py when it is deployed; here it is the checkout's.
        "PYTHONPATH": str(ROOT),
    })
    yield running
    stop(running)


def _payment(account: str = "acc-1") -> tuple[str, dict[str, Any]]:
    payment_id = f"pay-{uuid.uuid4().hex[:12]}"
    return payment_id, {"paymentId": payment_id, "accountId": account, "amount": "12.50", "currency": "EUR"}


def _documents(ledger: ContainerProxy, account: str) -> list[dict[str, Any]]:
    return list(ledger.query_items("SELECT * FROM c", partition_key=account))


def test_a_payment_is_one_entry_one_credit_and_one_payment_booked_even_when_sent_twice(
    broker: Broker, ledger: ContainerProxy, bank: BankServer, host: HostProcess,
) -> None:
    payment_id, body = _payment()
    send(broker, "payments", json.dumps(body), message_id=f"m-{uuid.uuid4()}")
    [entry] = eventually(lambda: [d for d in _documents(ledger, "acc-1") if d.get("id") == f"entry-{payment_id}"],
                         what="the ledger entry")
    assert entry["type"] == "ledger-entry" and entry["amount"] == "12.50"
    [booked] = eventually(lambda: [m for m in received(broker, "payment-booked")
                                   if json.loads(b"".join(m.body))["paymentId"] == payment_id],
                          what="PaymentBooked", timeout=60)
    assert json.loads(b"".join(booked.body))["reference"].startswith("cr-")
    # The producer sends it again under a new MessageId: the key is the payment's id, so nothing happens twice.
    copy_id = f"m-{uuid.uuid4()}"
    send(broker, "payments", json.dumps(body), message_id=copy_id)
    eventually(lambda: f"delivery payment_received messageId={copy_id} outcome=duplicate" in host.output(),
               what="the copy's duplicate outcome")
    assert [c["paymentId"] for c in bank.credits()].count(payment_id) == 1
    assert [d["type"] for d in _documents(ledger, "acc-1") if d.get("id") == f"entry-{payment_id}"] == ["ledger-entry"]
    assert not peek(broker, "payments")


def test_a_refused_credit_sends_payment_refused(
    broker: Broker, ledger: ContainerProxy, bank: BankServer, host: HostProcess,
) -> None:
    payment_id, body = _payment("closed-7")
    send(broker, "payments", json.dumps(body), message_id=payment_id)
    [refused] = eventually(lambda: [m for m in received(broker, "payment-refused")
                                    if json.loads(b"".join(m.body))["paymentId"] == payment_id],
                           what="PaymentRefused", timeout=60)
    assert json.loads(b"".join(refused.body))["refusal"] == "account-closed"
    assert not [c for c in bank.credits() if c["paymentId"] == payment_id]


def test_a_bank_outage_inside_the_lock_is_retried_under_the_same_key(
    broker: Broker, ledger: ContainerProxy, bank: BankServer, host: HostProcess,
) -> None:
    bank.fail_next(503, count=2)
    payment_id, body = _payment()
    send(broker, "payments", json.dumps(body), message_id=payment_id)
    eventually(lambda: [c for c in bank.credits() if c["paymentId"] == payment_id], what="the credit")
    [key] = [c["key"] for c in bank.credits() if c["paymentId"] == payment_id]
    assert bank.calls(key) == [503, 503, 201]


def test_a_body_that_is_not_a_payment_is_dead_lettered_invalid_message(
    broker: Broker, bank: BankServer, host: HostProcess,
) -> None:
    message_id = f"bad-{uuid.uuid4()}"
    send(broker, "payments", json.dumps({"paymentId": "p"}), message_id=message_id)
    [dead] = eventually(lambda: [m for m in peek(broker, "payments", dead_letters=True) if m.message_id == message_id],
                        what="the dead letter")
    assert dead.dead_letter_reason == "InvalidMessage"
    assert "PaymentReceived" in (dead.dead_letter_error_description or "")
