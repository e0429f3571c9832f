"""An effect's HTTP call: a JSON POST under an idempotency key, answered as a ``Reply`` the effect understands.

    bank = JsonHttp.from_setting("BANK_URL")
    Effect("credit", lambda key: bank.post("/credits", body, idempotency_key=key))

With ``scope`` (a service's application ID URI, ``api://bank/.default``), or ``scope_setting`` (an app setting that
holds one: unset or empty, no token), each call carries a bearer token of the app's managed identity
(``adapters.bearer``); a 401 or 403 then says the identity is not allowed, for every message
alike: the service is unavailable to us, and the delivery is handed on, never dead-lettered.

The answer maps onto the effect's rules (``idempotent_consumer.side_effects``): a 2xx did it, and its
``reference`` field is kept on the record; a 4xx whose body names a ``refusal`` refused it for good (the business
outcome, announced by ``on_refused``); a transient status (408, 429, 5xx), a 409 (the key still held by a
concurrent request), a timeout or a connection error may succeed later, so the claim's lease ends and the
message is tried again; any other answer says the call itself is wrong, and the message is dead-lettered
DownstreamRejected with the status and the body's ``reason``.

aiohttp (azure-core's async transport, so already installed) is imported on the first call, not at import: a
function app that imports this while the host indexes it pays nothing for it until then. One pooled session per
client, made in the worker's event loop. The base URL may be named by a setting, read on the first call, so that
an unset one fails the call that needs it, naming the setting, and not the app's indexing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from idempotent_consumer.errors import ConfigurationError, DownstreamUnavailable

IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class JsonReply:
    """What the service answered: its status and its JSON body (empty when it sent none)."""

    status: int
    body: Mapping[str, Any]

    @property
    def reference(self) -> str | None:
        """What the service made, on success: the body's ``reference``."""
        return _text(self.body.get("reference")) if 200 <= self.status < 300 else None

    @property
    def reason(self) -> str | None:
        """Why the service refused, when it says: the body's ``reason``."""
        return _text(self.body.get("reason"))

    @property
    def refusal(self) -> str | None:
        """The service's code for a refusal for good: the body's ``refusal``, on a 4xx other than 408, 409, 429."""
        if 400 <= self.status < 500 and self.status not in (401, 403, 408, 409, 429):
            return _text(self.body.get("refusal"))
        return None


class JsonHttp:
    """POST JSON to ``{base_url}{path}`` with an Idempotency-Key; connect and read timeouts bound each call."""

    def __init__(self, base_url: str | None = None, *, setting: str | None = None, connect_timeout: float = 3.0,
                 read_timeout: float = 10.0, proxy_from_environment: bool = False, scope: str | None = None,
                 scope_setting: str | None = None) -> None:
        self._base_url, self._setting = base_url, setting
        # With a scope (or the app setting ``scope_setting`` naming one, read when a call is made until it does;
        # unset or empty: none), each call carries a bearer token of the app's managed identity for it (BearerToken).
        self._scope, self._scope_setting = scope, scope_setting
        self._token: Any = None
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._trust_env = proxy_from_environment
        self._session: Any = None

    @classmethod
    def from_setting(cls, name: str, **options: Any) -> JsonHttp:
        """A client whose base URL is the app setting ``name``, read on the first call."""
        return cls(setting=name, **options)

    @property
    def base_url(self) -> str:
        """The base URL; ConfigurationError naming its setting when that is unset."""
        if self._base_url is None:
            value = os.environ.get(self._setting or "", "").strip()
            if not value.startswith(("http://", "https://")):
                raise ConfigurationError(str(self._setting), "is required: the base URL (http:// or https://)")
            self._base_url = value
        return self._base_url.rstrip("/")

    def bearer(self) -> Any:
        """The token for this client's scope (``adapters.bearer.BearerToken``), made on first use; None without a
        scope."""
        if self._token is None:
            scope = self._scope or os.environ.get(self._scope_setting or "", "").strip()
            if scope:
                from idempotent_consumer.adapters.bearer import BearerToken  # noqa: PLC0415 - an adapter, with a scope

                self._token = BearerToken(scope, timeout=self._connect_timeout)
        return self._token

    async def post(self, path: str, body: Mapping[str, Any], *, idempotency_key: str) -> JsonReply:
        """Send one request; a timeout or a connection error raises DownstreamUnavailable (``slow`` when the
        service took the request and was slow to answer)."""
        import aiohttp  # noqa: PLC0415 - on the first call: see the module's docstring

        url = self.base_url + path
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self._connect_timeout + self._read_timeout,
                                            sock_connect=self._connect_timeout, sock_read=self._read_timeout)
            self._session = aiohttp.ClientSession(timeout=timeout, trust_env=self._trust_env)
        token = self.bearer()
        headers = {IDEMPOTENCY_HEADER: idempotency_key, **(await token.header() if token else {})}
        try:
            async with self._session.post(url, json=dict(body), headers=headers) as answer:
                status = answer.status
                try:
                    found = await answer.json(content_type=None)
                except ValueError:
                    found = {}
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                aiohttp.ClientResponseError) as exc:
            slow = isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError)
            raise DownstreamUnavailable(f"POST {path} failed: {type(exc).__name__}", slow=slow) from exc
        return JsonReply(status, found if isinstance(found, dict) else {})

    async def close(self) -> None:
        """Close the pooled session (and the token's credential)."""
        if self._session is not None:
            await self._session.close()
        if self._token is not None:
            await self._token.close()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
