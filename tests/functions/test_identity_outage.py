"""An identity outage is an outage, through the function entry points (issue 40, part 6): the app's Cosmos DB
client, with a managed identity whose token endpoint fails, on the local Cosmos server. Unreachable or failing
for now (5xx), the order is handed on as in any outage; refused (4xx: a wrong identity), the app fails loudly and
the delivery is abandoned, never handed on."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError
from azure.cosmos.aio import CosmosClient

from idempotent_consumer.adapters.cosmos import CosmosStore
from idempotent_consumer.testing.memory import RecordingSender
from tests.functions.conftest import Deliverer, Harness
from tests.support.orders import encode, order_body
from tests.support.tls import tls_front


class FailingIdentity:
    """An async token credential whose token endpoint answers ``status``, as azure-identity raises it."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.asked = 0

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.asked += 1
        error = ClientAuthenticationError(f"token endpoint answered {self.status}")
        error.status_code = self.status
        raise error

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> FailingIdentity:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


IdentityApp = Callable[[int], RecordingSender]


@pytest.fixture
def identity_app(app_on_cosmos: Harness) -> Iterator[IdentityApp]:
    """Run the functions on an app whose Cosmos DB client (the real SDK, over TLS to the local server: it sends a
    token only over https) authenticates with a failing identity; its copies recorded."""
    with tls_front(app_on_cosmos.endpoint.url) as url:
        def on(status: int) -> RecordingSender:
            settings = msgspec.structs.replace(app_on_cosmos.target.settings(), cosmos_key=None, cosmos_endpoint=url,
                                               cosmos_verify_tls=False)
            client = CosmosClient(url, credential=FailingIdentity(status), connection_verify=False,
                                  enable_endpoint_discovery=False)  # the local server names no region of its own
            app_on_cosmos.stack.callback(lambda: app_on_cosmos.loop.run(client.close()))
            recording = RecordingSender()
            app_on_cosmos.reconfigure(store=CosmosStore.from_settings(settings, client), sender=recording,
                                      delayed_retries=True, retry_in_lock_attempts=2)
            return recording
        yield on


def test_a_token_endpoint_that_fails_for_now_is_an_outage_and_the_order_is_handed_on(
    deliver_order: Deliverer, identity_app: IdentityApp
) -> None:
    sender = identity_app(503)
    order_id = f"ord-{uuid.uuid4()}"
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=11)
    assert settlement.action == "complete"  # handed on: a copy scheduled, as in any outage
    [(queue, copy)] = sender.sent
    assert queue == "orders" and "token endpoint failed" in copy.application_properties[
        "idempotent-consumer.retry.reason"]


def test_a_refused_identity_fails_loudly_and_the_delivery_is_abandoned_not_handed_on(
    deliver_order: Deliverer, identity_app: IdentityApp, caplog: pytest.LogCaptureFixture
) -> None:
    sender = identity_app(400)
    order_id = f"ord-{uuid.uuid4()}"
    [settlement] = deliver_order(encode(order_body(order_id)), message_id=order_id, sequence_number=12)
    assert settlement.action == "abandon"
    assert sender.sent == []
    assert any("ConfigurationError" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
