"""The local managed-identity endpoint, read by azure-identity's real ManagedIdentityCredential through the
environment variables Functions sets, and the fulfilment stand-in in its token mode, which admits its tokens only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from devservers.fulfilment import FulfilmentServer
from devservers.identity import IdentityServer, Tokens
from idempotent_consumer.errors import DownstreamUnavailable
from shared.adapters.http import HttpFulfilment

SCOPE, AUDIENCE = "api://fulfilment/.default", "api://fulfilment"


class Recorded(Tokens):
    """The endpoint's tokens, each one it issued kept, so that a test can look for it where it must not be."""

    def __init__(self) -> None:
        super().__init__()
        self.handed_out: list[str] = []

    def issue(self, audience: str, now: float | None = None) -> tuple[str, int]:
        token, expires = super().issue(audience, now)
        self.handed_out.append(token)
        return token, expires


@pytest.fixture
def identity(monkeypatch: pytest.MonkeyPatch) -> Iterator[IdentityServer]:
    with IdentityServer(Recorded()) as server:
        for name, value in server.environment().items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("IDENTITY_SERVER_THUMBPRINT", raising=False)
        yield server


def reserve(url: str, scope: str | None, calls: int = 1) -> list[int]:
    """The statuses of ``calls`` reservations through the app's adapter, in one event loop."""
    client = HttpFulfilment(url, connect_timeout=2, read_timeout=5, scope=scope)

    async def run() -> list[int]:
        try:
            return [(await client.reserve(f"key-{n}", {"orderId": "o", "items": []})).status for n in range(calls)]
        finally:
            await client.close()

    return asyncio.run(run())


def test_the_apps_credential_gets_a_token_once_and_every_call_carries_it(
        identity: IdentityServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with FulfilmentServer(tokens=identity.tokens, audience=AUDIENCE) as service:
        assert reserve(service.url, SCOPE, calls=3) == [201, 201, 201]
        assert identity.issued == 1  # cached by azure-identity for its lifetime
        assert reserve(service.url, None) == [401]  # no scope, no header: refused, nothing reserved
        assert service.reservation_count() == 3
    tokens = identity.tokens
    assert isinstance(tokens, Recorded) and tokens.handed_out
    for secret in (*tokens.handed_out, identity.header):
        assert secret not in caplog.text


def test_the_stand_in_refuses_a_token_for_another_audience_or_expired(identity: IdentityServer) -> None:
    with FulfilmentServer(tokens=identity.tokens, audience="api://another-service") as service:
        assert reserve(service.url, SCOPE) == [401]
        assert service.refused_tokens == {"a token for another audience": 1}
    token, _ = identity.tokens.issue(AUDIENCE, now=0.0)  # expired long ago
    assert identity.tokens.verify(f"Bearer {token}", AUDIENCE) == "an expired token"
    # Taken up to the leeway past its expiry (a call sent just before), not a second more.
    token, expires = identity.tokens.issue(AUDIENCE, now=1000.0)
    leeway = identity.tokens.leeway
    assert identity.tokens.verify(f"Bearer {token}", AUDIENCE, now=expires + leeway - 1) is None
    assert identity.tokens.verify(f"Bearer {token}", AUDIENCE, now=expires + leeway) == "an expired token"
    assert identity.tokens.verify(f"Bearer {token}x", AUDIENCE) == "a token this identity endpoint did not issue"
    assert Tokens().verify(f"Bearer {identity.tokens.issue(AUDIENCE)[0]}", AUDIENCE) is not None  # another key's


def test_an_identity_endpoint_that_is_down_is_the_service_out_of_reach(identity: IdentityServer) -> None:
    identity.outage(60)
    with FulfilmentServer(tokens=identity.tokens, audience=AUDIENCE) as service:
        with pytest.raises(DownstreamUnavailable, match=r"no token for api://fulfilment/\.default"):
            reserve(service.url, SCOPE)
        assert service.calls("key-0") == []  # no call was made without its token
    assert identity.refused > 0
