"""A bearer token for the app's managed identity, on the calls an effect makes to a service behind Entra ID.

With a scope (a service's application ID URI, ``api://fulfilment/.default``), each call carries
``Authorization: Bearer <token>`` from the credential the data planes use (``credentials.managed_identity``:
the managed identity in Azure, read through ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER``; the developer's
sign-in elsewhere). azure-identity caches the token per credential and refreshes it before it expires, so one
``BearerToken`` per client, for the process's life: its credential is made on the first call, in the worker's
event loop.

A token that cannot be had (the identity endpoint unreachable or failing, the identity refused) is the service
being unavailable to us, for every message alike: ``DownstreamUnavailable``, whose delivery is handed on and
counted by its breaker, never dead-lettered. Its message names the scope and what failed, never a token: the
token is in the header alone, and no log line or error here holds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from idempotent_consumer.adapters.credentials import TokenFailure, managed_identity, token_failure
from idempotent_consumer.errors import DownstreamUnavailable
from idempotent_consumer.outcomes import IDENTITY_MARK

AUTHORIZATION = "Authorization"


class BearerToken:
    """``Authorization: Bearer`` for ``scope``, from the app's credential, cached and refreshed by azure-identity."""

    def __init__(self, scope: str, credential: Callable[[], Any] = managed_identity, *,
                 timeout: float | None = None) -> None:
        self.scope = scope
        self._make = credential
        self._credential: Any = None
        # How long a call waits for its token, at most (None: as long as azure-identity's own retries take, about
        # 5 s against an endpoint that fails): a client passes its connect timeout, since the token is part of
        # reaching the service, and a delivery's lock is no place to sit out the identity endpoint's outage.
        self.timeout = timeout

    async def header(self) -> dict[str, str]:
        """The header for one call; DownstreamUnavailable when no token can be had now."""
        if self._credential is None:
            self._credential = self._make()
        failed: DownstreamUnavailable | None = None
        try:
            token = await asyncio.wait_for(self._credential.get_token(self.scope), self.timeout)
        except TimeoutError:
            failed = DownstreamUnavailable(f"{IDENTITY_MARK} no token for {self.scope}, the token endpoint did not"
                                           f" answer in {self.timeout:g} s")
        except Exception as exc:  # any failure of the credential: the service is out of our reach
            kind = token_failure(exc)
            why = "the identity was refused" if kind is TokenFailure.CONFIGURATION else "the token endpoint failed"
            failed = DownstreamUnavailable(f"{IDENTITY_MARK} no token for {self.scope}, {why} ({type(exc).__name__})")
        if failed is not None:  # raised here, outside the handler: no cause or context whose text might hold a secret
            raise failed
        return {AUTHORIZATION: f"Bearer {token.token}"}

    async def close(self) -> None:
        """Close the credential, if one was made."""
        if self._credential is not None and hasattr(self._credential, "close"):
            await self._credential.close()
