"""A local managed-identity endpoint, as App Service and Functions give one to an app; not deployed.

In Azure, the Functions host sets ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER`` in the worker's environment, and
azure-identity's ``ManagedIdentityCredential`` asks that endpoint for a token: ``GET {IDENTITY_ENDPOINT}?api-version=
2019-08-01&resource=<resource>`` with the header ``X-IDENTITY-HEADER: {IDENTITY_HEADER}``, answered with JSON
``access_token``, ``expires_on`` (epoch seconds, as a string), ``resource`` (as asked) and ``token_type``
(learn.microsoft.com/azure/app-service/overview-managed-identity, "REST endpoint reference"; azure-identity
1.27's App Service path, sync and async, read from its source). This serves the same, over loopback HTTP, so that
the app's real credential runs unchanged: put ``environment()`` in the app's settings.

Its tokens are not Entra ID's: ``Tokens`` signs ``{aud, exp, sub}`` with a key of its own (HMAC-SHA256), and the
fulfilment stand-in in its token mode checks them with the same ``Tokens`` (``verify``): the audience, the expiry,
the signature. An ``outage`` answers 500 for a while, as an identity endpoint that fails does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

API_VERSION = "2019-08-01"
TOKEN_PATH = "/msi/token"


@dataclass
class Tokens:
    """Issues and checks the local tokens: ``lifetime`` seconds each, signed with a key made per instance. A token is
    taken up to ``leeway`` seconds past its expiry, as a service allows for clocks that differ
    (Microsoft.IdentityModel's default clock skew is 5 minutes): the time a call sent just before its token expired
    may take to arrive."""

    lifetime: float = 3600.0
    leeway: float = 60.0
    subject: str = "local-app"
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def issue(self, audience: str, now: float | None = None) -> tuple[str, int]:
        """A token for ``audience`` and when it expires (epoch seconds)."""
        expires = int((time.time() if now is None else now) + self.lifetime)
        claims = _b64(json.dumps({"aud": audience, "exp": expires, "sub": self.subject}).encode())
        return f"{claims}.{self._sign(claims)}", expires

    def verify(self, authorization: str | None, audience: str, now: float | None = None) -> str | None:
        """Why an ``Authorization`` header does not admit a caller to ``audience``; None when it does."""
        if not authorization or not authorization.startswith("Bearer "):
            return "no bearer token"
        claims, _, signature = authorization.removeprefix("Bearer ").partition(".")
        if not hmac.compare_digest(signature, self._sign(claims)):
            return "a token this identity endpoint did not issue"
        try:
            body: dict[str, Any] = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
        except ValueError:
            return "a token that does not decode"
        if body.get("aud") != audience:
            return "a token for another audience"
        if int(body.get("exp", 0)) + self.leeway <= (time.time() if now is None else now):
            return "an expired token"
        return None

    def _sign(self, claims: str) -> str:
        return _b64(hmac.new(self._key, claims.encode(), hashlib.sha256).digest())


class _Quiet(WSGIRequestHandler):
    """werkzeug's request handler without its per-request log line: the hosts ask for tokens all along."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class IdentityServer:
    """The endpoint; start with ``start`` (or ``with``), stop with ``stop``."""

    def __init__(self, tokens: Tokens | None = None, host: str = "127.0.0.1") -> None:
        self.tokens = tokens or Tokens()
        self.header = secrets.token_urlsafe(24)  # IDENTITY_HEADER: what a caller must send back
        self.issued_at: list[float] = []  # when each token was issued (epoch seconds)
        self.refused = 0  # requests answered 500 in an outage
        self._lock = threading.Lock()  # the server answers on a thread per request
        self._host = host
        self._down_until = 0.0
        self._httpd: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``IDENTITY_ENDPOINT``; only while running."""
        if self._httpd is None:
            raise RuntimeError("the identity endpoint is not running")
        return f"http://{self._host}:{self._httpd.port}{TOKEN_PATH}"

    @property
    def issued(self) -> int:
        """Tokens issued so far."""
        with self._lock:
            return len(self.issued_at)

    def environment(self) -> dict[str, str]:
        """The settings that make azure-identity's ManagedIdentityCredential ask this endpoint, as in Azure."""
        return {"IDENTITY_ENDPOINT": self.url, "IDENTITY_HEADER": self.header}

    def outage(self, seconds: float) -> None:
        """Answer every request 500 for ``seconds`` from now."""
        self._down_until = time.time() + seconds

    def start(self) -> Self:
        """Serve on a background thread."""
        self._httpd = make_server(self._host, 0, self._wsgi, threaded=True, request_handler=_Quiet)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="identity-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        status, body = self._answer(request)
        return Response(json.dumps(body), status, mimetype="application/json")(environ, start_response)

    def _answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        if request.method != "GET" or request.path != TOKEN_PATH:
            return 404, {"error": "not_found"}
        if time.time() < self._down_until:
            with self._lock:
                self.refused += 1
            return 500, {"error": "unavailable", "error_description": "the identity endpoint is down (an outage)"}
        if not hmac.compare_digest(request.headers.get("X-IDENTITY-HEADER", ""), self.header):
            return 401, {"error": "unauthorized", "error_description": "X-IDENTITY-HEADER is missing or wrong"}
        resource = request.args.get("resource", "")
        if request.args.get("api-version") != API_VERSION or not resource:
            return 400, {"error": "invalid_request", "error_description": "api-version and resource are required"}
        token, expires = self.tokens.issue(resource)
        with self._lock:
            self.issued_at.append(time.time())
        return 200, {"access_token": token, "expires_on": str(expires), "resource": resource, "token_type": "Bearer"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
