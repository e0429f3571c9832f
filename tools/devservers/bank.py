"""Local "bank" for the payments example (examples/payments): credits an account once per Idempotency-Key; not
deployed.

* ``POST /credits`` with a JSON object body and an ``Idempotency-Key`` header: 201 ``{"reference": "cr-<n>"}`` for
  a key's first request, 200 with the same reply for a repeat of it; 422 ``{"refusal": "account-closed", "reason":
  ...}`` for an ``accountId`` that starts with ``closed-`` (a refusal for good); 400 without a key or an object.
* ``fail_next(status, count)`` answers the next requests with ``status`` and credits nothing.
* Every request is recorded under its key (``calls``); ``credits()`` are the credits made.

The HTTP plumbing is werkzeug's threaded development server, as the fulfilment stand-in's
(``devservers.fulfilment``). From a shell: ``python -m devservers.bank [--port 7073]`` prints ``listening on
http://127.0.0.1:<port>`` and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from devservers.fulfilment import _Handler
from devservers.stopsignal import StopSignals


class BankServer:
    """The local bank; ``with BankServer() as bank`` serves on a free loopback port."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._lock = threading.Lock()
        self._replies: dict[str, tuple[int, dict[str, Any]]] = {}
        self._calls: dict[str, list[int]] = {}
        self._failing: list[int] = []
        self._credits: list[dict[str, Any]] = []
        self._httpd: BaseWSGIServer | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the bank is not running")
        return f"http://127.0.0.1:{self._httpd.port}"

    def __enter__(self) -> Self:
        with socket.create_server(("127.0.0.1", self.port)) as listener:
            self._httpd = make_server("127.0.0.1", listener.getsockname()[1], self._wsgi, threaded=True,
                                      request_handler=_Handler, fd=listener.fileno())
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="bank-devserver", daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd = None

    def fail_next(self, status: int, count: int = 1) -> None:
        """Answer the next ``count`` requests with ``status``, crediting nothing."""
        with self._lock:
            self._failing += [status] * count

    def calls(self, key: str) -> list[int]:
        """The statuses answered under ``key``, in order."""
        with self._lock:
            return list(self._calls.get(key, []))

    def credits(self) -> list[dict[str, Any]]:
        """Every credit made, in order, with its key."""
        with self._lock:
            return [dict(c) for c in self._credits]

    def _wsgi(self, environ: Any, start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        status, body = self._answer(request)
        return Response(json.dumps(body), status=status, content_type="application/json")(environ, start_response)

    def _answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        if (request.method, request.path) != ("POST", "/credits"):
            return 404, {"reason": f"no route for {request.method} {request.path}"}
        key = request.headers.get("Idempotency-Key", "")
        try:
            body = json.loads(request.get_data() or b"null")
        except ValueError:
            body = None
        with self._lock:
            status, reply = self._decide(key, body)
            self._calls.setdefault(key, []).append(status)
            return status, reply

    def _decide(self, key: str, body: Any) -> tuple[int, dict[str, Any]]:
        if self._failing:
            return self._failing.pop(0), {"reason": "injected fault"}
        if not key or not isinstance(body, dict):
            return 400, {"reason": "an Idempotency-Key and a JSON object are required"}
        if key in self._replies:
            status, reply = self._replies[key]
            return (200 if status == 201 else status), reply
        if str(body.get("accountId", "")).startswith("closed-"):
            self._replies[key] = (422, {"refusal": "account-closed", "reason": "the account is closed"})
        else:
            self._credits.append({"key": key, **body})
            self._replies[key] = (201, {"reference": f"cr-{len(self._credits)}"})
        return self._replies[key]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devservers.bank", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=7073)
    args = parser.parse_args(argv)
    stop = StopSignals()
    with BankServer(args.port) as bank:
        print(f"listening on {bank.url}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
