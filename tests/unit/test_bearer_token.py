"""The fulfilment call carries a bearer token of the app's managed identity when a scope is set; a token that cannot
be had, and a service's 401 or 403, are the service out of reach; no token is ever in a log line or an error."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

from idempotent_consumer.adapters.bearer import BearerToken
from idempotent_consumer.errors import DownstreamUnavailable
from idempotent_consumer.outcomes import Outcome
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.http import HttpFulfilment
from shared.settings import Settings
from tests.support.orders import inbound, order_body

SECRET = "eyJ0eXAiOiJKV1QiLCJzZWNyZXQiOiJ0b2tlbiJ9.c2VjcmV0.dG9rZW4"  # what must never be logged


class Credential:
    """An async credential that hands out ``SECRET`` for a scope, or raises ``error``; counts its calls."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.closed = error, False
        self.scopes: list[str] = []

    async def get_token(self, scope: str) -> Any:
        self.scopes.append(scope)
        if self.error is not None:
            raise self.error
        return SimpleNamespace(token=SECRET, expires_on=2_000_000_000)

    async def close(self) -> None:
        self.closed = True


class Service(BaseHTTPRequestHandler):
    """A fulfilment service that answers ``status`` and keeps each request's Authorization header."""

    status = 201
    seen: list[str | None] = []  # noqa: RUF012 - one server per test, reset by the fixture

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Service.seen.append(self.headers.get("Authorization"))
        body = {"reservationId": "res-1"} if Service.status < 300 else {"reason": "the caller lacks the role"}
        data = json.dumps(body).encode()
        self.send_response(Service.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def service() -> Iterator[str]:
    Service.status, Service.seen = 201, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_header_is_the_credentials_token_for_the_scope_from_one_credential() -> None:
    made: list[Credential] = []

    def credential() -> Credential:
        made.append(Credential())
        return made[-1]

    token = BearerToken("api://fulfilment/.default", credential)

    async def twice() -> list[dict[str, str]]:
        return [await token.header(), await token.header()]

    assert asyncio.run(twice()) == [{"Authorization": f"Bearer {SECRET}"}] * 2
    assert len(made) == 1 and made[0].scopes == ["api://fulfilment/.default"] * 2  # its cache is azure-identity's


@pytest.mark.parametrize("error", [ServiceRequestError(f"connection refused; header {SECRET}"),
                                   ClientAuthenticationError(f"identity not found: {SECRET}")],
                         ids=["endpoint unreachable", "identity refused"])
def test_a_token_that_cannot_be_had_is_the_service_out_of_reach_and_the_error_holds_no_secret(
        error: Exception) -> None:
    token = BearerToken("api://fulfilment/.default", lambda: Credential(error))
    with pytest.raises(DownstreamUnavailable) as caught:
        asyncio.run(token.header())
    assert "no token for api://fulfilment/.default" in str(caught.value)
    assert SECRET not in str(caught.value) and caught.value.__cause__ is None and caught.value.__context__ is None


def _app(url: str, credential: Credential) -> bootstrap.App:
    settings = Settings(fulfillment_url=url, fulfillment_token_scope="api://fulfilment/.default",
                        abandon_delay_seconds=0)
    fulfilment = HttpFulfilment(url, connect_timeout=2, read_timeout=2, scope=settings.fulfillment_token_scope)
    fulfilment._token = BearerToken("api://fulfilment/.default", lambda: credential)
    return bootstrap.build(settings, store=InMemoryStore(), fulfilment=fulfilment, sender=RecordingSender())


def test_every_call_carries_the_token_and_a_401_hands_the_message_on_with_no_secret_logged(
        service: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    credential = Credential()
    app = _app(service, credential)

    async def refused_then_allowed() -> tuple[Any, Any]:  # one loop: the client's session is bound to it
        Service.status = 401
        refused = await app.handle_order(inbound(order_body("ord-1")))
        Service.status = 201
        return refused, await app.handle_order(inbound(order_body("ord-1")))

    refused, allowed = asyncio.run(refused_then_allowed())
    assert (refused.outcome, refused.dependency_up) == (Outcome.TRANSIENT, False)
    assert allowed.outcome is Outcome.DUPLICATE
    assert Service.seen == [f"Bearer {SECRET}"] * 2
    assert SECRET not in caplog.text and SECRET not in refused.description


def test_without_a_scope_no_authorization_header_is_sent(service: str) -> None:
    settings = Settings(fulfillment_url=service, abandon_delay_seconds=0)
    app = bootstrap.build(settings, store=InMemoryStore(), sender=RecordingSender())
    assert asyncio.run(app.handle_order(inbound(order_body("ord-1")))).outcome is Outcome.CREATED
    assert Service.seen == [None]


def test_a_library_client_takes_its_scope_from_an_app_setting_read_on_the_first_call(
        service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotent_consumer.http import JsonHttp  # noqa: PLC0415 - the library's client, as an app uses it

    async def call(client: JsonHttp) -> int:
        try:
            return (await client.post("/credits", {"amount": "1.00"}, idempotency_key="k-1")).status
        finally:
            await client.close()

    monkeypatch.delenv("BANK_TOKEN_SCOPE", raising=False)
    unset = JsonHttp(service, scope_setting="BANK_TOKEN_SCOPE")
    client = JsonHttp(service, scope_setting="BANK_TOKEN_SCOPE")  # made, as at import, before the setting is read
    assert asyncio.run(call(unset)) == 201 and unset.bearer() is None  # unset: no token asked for, no header
    monkeypatch.setenv("BANK_TOKEN_SCOPE", "api://bank/.default")
    credential = Credential()
    client.bearer()._make = lambda: credential  # the app's credential, stood in for
    assert asyncio.run(call(client)) == 201
    assert credential.scopes == ["api://bank/.default"] and credential.closed
    assert Service.seen == [None, f"Bearer {SECRET}"]


def test_a_token_endpoint_slower_than_the_bound_is_the_service_out_of_reach() -> None:
    # A client bounds the wait by its connect timeout: a delivery does not sit out azure-identity's retries in its lock.
    class Slow(Credential):
        async def get_token(self, scope: str) -> Any:
            await asyncio.sleep(30)
            raise AssertionError("not waited for")

    with pytest.raises(DownstreamUnavailable) as caught:
        asyncio.run(BearerToken("api://fulfilment/.default", credential=Slow, timeout=0.05).header())
    assert str(caught.value) == ("app identity: no token for api://fulfilment/.default, the token endpoint did not"
                                 " answer in 0.05 s")
    assert caught.value.__cause__ is None and caught.value.__context__ is None
