"""The HTTP adapter of the fulfilment port: aiohttp with explicit connect and read timeouts.

aiohttp is what azure-core's async transport (and so ``azure.cosmos.aio``) runs on: one HTTP stack
for both clients, and no further import at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from idempotent_consumer.adapters.bearer import BearerToken
from idempotent_consumer.errors import DownstreamUnavailable
from shared.ports.fulfilment import IDEMPOTENCY_HEADER, RESERVATIONS_PATH, Reply


class HttpFulfilment:
    """POST {base_url}/reservations; one pooled session per process, made in the event loop on first call."""

    def __init__(self, base_url: str, *, connect_timeout: float, read_timeout: float,
                 proxy_from_environment: bool = False, scope: str | None = None) -> None:
        self._url = base_url.rstrip("/") + RESERVATIONS_PATH
        # FULFILLMENT_TOKEN_SCOPE: each call carries a bearer token of the app's managed identity for it.
        self._token = BearerToken(scope, timeout=connect_timeout) if scope else None
        # sock_read bounds each wait for bytes, as requests' read timeout did; total bounds the whole call,
        # which requests never did, so that an answer trickling in cannot hold a delivery past its lock.
        self._timeout = aiohttp.ClientTimeout(total=connect_timeout + read_timeout, sock_connect=connect_timeout,
                                              sock_read=read_timeout)
        self._trust_env = proxy_from_environment  # HTTP_PROXY_FROM_ENVIRONMENT
        self._session: aiohttp.ClientSession | None = None

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Send the reservation; timeouts and connection errors raise DownstreamUnavailable."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, trust_env=self._trust_env)
        headers = {IDEMPOTENCY_HEADER: idempotency_key, **(await self._token.header() if self._token else {})}
        try:
            async with self._session.post(self._url, json=dict(request), headers=headers) as response:
                status = response.status
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    body = {}
        # ClientResponseError: an answer that is not HTTP (a bad status line), which requests raised as ConnectionError.
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                aiohttp.ClientResponseError) as exc:
            # A timeout once connected (the read's, or the whole call's: the connect has its own, shorter) is a
            # service that took the request and is slow to answer, not one that is down.
            slow = isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError)
            raise DownstreamUnavailable(f"fulfilment call failed: {type(exc).__name__}", slow=slow) from exc
        return Reply(status, body if isinstance(body, dict) else {})

    async def close(self) -> None:
        """Close the pooled session (and the token's credential)."""
        if self._session is not None:
            await self._session.close()
        if self._token is not None:
            await self._token.close()
