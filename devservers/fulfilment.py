"""Local warehouse "fulfilment service" for tests and workstation runs; not deployed.

A real HTTP/1.1 server (stdlib, loopback only) that takes stock reservations and deduplicates them by
``Idempotency-Key``, with fault injection so tests can drive the caller's retry paths:

* ``POST /reservations`` with a JSON object body and an ``Idempotency-Key`` header. The first request
  for a key answers 201 ``{"reservationId": "res-<uuid>", "orderId": ...}`` and records one
  reservation; a repeat with the same key and body answers 200 with the same stored response and
  records nothing new; the same key with a different body answers 422. A missing/empty key or a body
  that is not a JSON object answers 400. Every answer's body is JSON; errors are ``{"reason": ...}``.
* Faults (:meth:`FulfilmentServer.fail_next`, :meth:`FulfilmentServer.stall_next`) form one FIFO
  queue: each ``POST /reservations`` takes the next queued fault, if any, before any validation or
  dedup. A *fail* answers its status and records no reservation. A *stall* waits, then handles the
  request normally, so the reservation is recorded even if the caller has timed out meanwhile.
* Every ``POST /reservations`` (faulted or not) is recorded as a :class:`Call` under its key
  (``""`` when the header is missing).
* Out-of-process control: ``POST /_control`` with ``{"fail": {"status": 503, "count": 2, "reason":
  "..."}}``, ``{"stall": {"seconds": 2, "count": 1}}``, ``{"reset": true}`` (drop queued faults) or
  ``{"clear": true}`` (forget everything); ``GET /_calls`` answers ``{key: [{"status", "body",
  "time"}, ...]}``.

In-process use::

    with FulfilmentServer() as server:
        server.fail_next(503, count=2)
        ...  # point the app at server.url
        assert server.reservation_count() == 1

From a shell: ``python -m devservers.fulfilment [--host 127.0.0.1] [--port 7072]`` prints
``listening on http://127.0.0.1:<port>`` and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ipaddress
import json
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Self, cast

__all__ = ["DEFAULT_PORT", "Call", "FulfilmentServer", "main"]

DEFAULT_PORT = 7072
_MAX_BODY_BYTES = 1024 * 1024
_POLL_INTERVAL = 0.05


@dataclass(frozen=True)
class Call:
    """One ``POST /reservations`` the server answered."""

    #: The Idempotency-Key header ("" when missing).
    key: str
    #: The parsed JSON body ({} when it was not a JSON object).
    body: dict[str, Any]
    #: The HTTP status answered.
    status: int
    #: When it was answered (``time.time()``).
    time: float


@dataclass(frozen=True)
class _Fail:
    status: int
    reason: str


@dataclass(frozen=True)
class _Stall:
    seconds: float


@dataclass(frozen=True)
class _Stored:
    body: dict[str, Any]
    response: dict[str, Any]


class _State:
    """Everything the server remembers; all access under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: deque[_Fail | _Stall] = deque()
        self.calls: dict[str, list[Call]] = {}
        self.stored: dict[str, _Stored] = {}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() closes live connections itself instead of joining their threads

    def __init__(self, address: tuple[str, int], owner: FulfilmentServer) -> None:
        self.owner = owner
        self.state = owner._state
        self.stopping = owner._stopping
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # the client went away (e.g. it timed out during a stall)
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _HTTPServerV6(_HTTPServer):
    address_family = socket.AF_INET6


class _BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fulfilment-devserver/1"

    @property
    def _server(self) -> _HTTPServer:
        return cast(_HTTPServer, self.server)

    def setup(self) -> None:
        super().setup()
        with self._server.connections_lock:
            self._server.connections.add(self.connection)

    def finish(self) -> None:
        with self._server.connections_lock:
            self._server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- routing ---------------------------------------------------------------------------------

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/reservations":
            self._reservations()
        elif path == "/_control":
            self._control()
        else:
            self._discard_body()
            self._reply(404, {"reason": f"no route for POST {path}"})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self._discard_body()
        if path == "/_calls":
            state = self._server.state
            with state.lock:
                calls = {
                    key: [{"status": c.status, "body": c.body, "time": c.time} for c in key_calls]
                    for key, key_calls in state.calls.items()
                }
            self._reply(200, calls)
        else:
            self._reply(404, {"reason": f"no route for GET {path}"})

    # -- endpoints -------------------------------------------------------------------------------

    def _reservations(self) -> None:
        state = self._server.state
        key = (self.headers.get("Idempotency-Key") or "").strip()
        try:
            raw = self._read_body()
        except _BadRequest as err:
            self.close_connection = True
            self._answer(key, {}, err.status, {"reason": err.reason})
            return
        body = _json_object(raw)

        with state.lock:
            fault = state.faults.popleft() if state.faults else None
        if isinstance(fault, _Stall):
            if self._server.stopping.wait(fault.seconds):
                self.close_connection = True  # stopping: drop the request unanswered
                return
        elif isinstance(fault, _Fail):
            self._answer(key, body or {}, fault.status, {"reason": fault.reason})
            return

        if not key:
            self._answer(key, body or {}, 400, {"reason": "Idempotency-Key header is required"})
            return
        if body is None:
            self._answer(key, {}, 400, {"reason": "body must be a JSON object"})
            return

        with state.lock:
            stored = state.stored.get(key)
            if stored is None:
                response = {"reservationId": f"res-{uuid.uuid4()}", "orderId": body.get("orderId")}
                state.stored[key] = _Stored(body=copy.deepcopy(body), response=response)
                status = 201
            elif stored.body == body:
                response, status = stored.response, 200
            else:
                response, status = {"reason": "Idempotency-Key reused with a different request"}, 422
            self._record(key, body, status)
        self._reply(status, response)

    def _control(self) -> None:
        try:
            command = _json_object(self._read_body())
            if command is None:
                raise _BadRequest(400, "body must be a JSON object")
            _apply_control(self._server.owner, command)
        except _BadRequest as err:
            self._reply(err.status, {"reason": err.reason})
            return
        self._reply(200, {"ok": True})

    # -- helpers ---------------------------------------------------------------------------------

    def _answer(self, key: str, body: dict[str, Any], status: int, response: dict[str, Any]) -> None:
        with self._server.state.lock:
            self._record(key, body, status)
        self._reply(status, response)

    def _record(self, key: str, body: dict[str, Any], status: int) -> None:
        """Record a call; the caller holds the state lock."""
        call = Call(key=key, body=copy.deepcopy(body), status=status, time=time.time())
        self._server.state.calls.setdefault(key, []).append(call)

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise _BadRequest(411, "chunked bodies are not supported; send Content-Length")
        length_header = self.headers.get("Content-Length") or "0"
        try:
            length = int(length_header)
        except ValueError:
            raise _BadRequest(400, "invalid Content-Length") from None
        if length < 0 or length > _MAX_BODY_BYTES:
            raise _BadRequest(413 if length > 0 else 400, "invalid Content-Length")
        return self.rfile.read(length) if length else b""

    def _discard_body(self) -> None:
        try:
            self._read_body()
        except _BadRequest:
            self.close_connection = True

    def _reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client went away; the call is recorded regardless


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _apply_control(server: FulfilmentServer, command: dict[str, Any]) -> None:
    known = {"fail", "stall", "reset", "clear"}
    if not command or not set(command) <= known:
        raise _BadRequest(400, f"expected one or more of {sorted(known)}")
    try:
        if command.get("clear"):
            server.clear()
        if command.get("reset"):
            server.reset_faults()
        if "fail" in command:
            fail = command["fail"]
            if not isinstance(fail, dict) or "status" not in fail:
                raise _BadRequest(400, "fail needs {status, count?, reason?}")
            server.fail_next(
                int(fail["status"]),
                count=int(fail.get("count", 1)),
                reason=str(fail.get("reason", "injected fault")),
            )
        if "stall" in command:
            stall = command["stall"]
            if not isinstance(stall, dict) or "seconds" not in stall:
                raise _BadRequest(400, "stall needs {seconds, count?}")
            server.stall_next(float(stall["seconds"]), count=int(stall.get("count", 1)))
    except (TypeError, ValueError) as err:
        raise _BadRequest(400, str(err)) from None


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the fulfilment devserver listens on loopback only, not {host!r}")


class FulfilmentServer:
    """The local fulfilment service. Start with :meth:`start` (or ``with``), stop with :meth:`stop`.

    Faults and records survive stop/start; :meth:`clear` forgets them.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        _check_loopback(host)
        self.host = host
        self.port = port
        self._state = _State()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``; only while running."""
        if self._httpd is None:
            raise RuntimeError("the fulfilment server is not running")
        port = self._httpd.server_address[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("the fulfilment server is already running")
        self._stopping.clear()
        server_class = _HTTPServerV6 if ":" in self.host else _HTTPServer
        httpd = server_class((self.host, self.port), self)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL},
            name=f"fulfilment-devserver:{httpd.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close connections, interrupting stalls. Safe to call twice."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- fault injection -------------------------------------------------------------------------

    def fail_next(self, status: int, count: int = 1, reason: str = "injected fault") -> None:
        """Answer the next ``count`` reservation requests with ``status`` and ``{"reason": reason}``."""
        if not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status code, not {status}")
        if count < 0:
            raise ValueError("count must not be negative")
        with self._state.lock:
            self._state.faults.extend(_Fail(status, reason) for _ in range(count))

    def stall_next(self, seconds: float, count: int = 1) -> None:
        """Wait ``seconds`` before handling each of the next ``count`` reservation requests normally."""
        if seconds < 0 or count < 0:
            raise ValueError("seconds and count must not be negative")
        with self._state.lock:
            self._state.faults.extend(_Stall(seconds) for _ in range(count))

    def reset_faults(self) -> None:
        """Drop all queued faults."""
        with self._state.lock:
            self._state.faults.clear()

    def clear(self) -> None:
        """Forget faults, calls and reservations."""
        with self._state.lock:
            self._state.faults.clear()
            self._state.calls.clear()
            self._state.stored.clear()

    # -- inspection ------------------------------------------------------------------------------

    def calls(self, key: str) -> list[Call]:
        """The reservation requests made with ``key``, oldest first."""
        with self._state.lock:
            return list(self._state.calls.get(key, ()))

    def keys(self) -> list[str]:
        """Every Idempotency-Key seen (``""`` for requests without one), in order of first use."""
        with self._state.lock:
            return list(self._state.calls)

    def reservations(self) -> dict[str, dict[str, Any]]:
        """Key → the stored 201 response of the reservation made for it."""
        with self._state.lock:
            return {key: copy.deepcopy(stored.response) for key, stored in self._state.stored.items()}

    def reservation_count(self) -> int:
        with self._state.lock:
            return len(self._state.stored)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.fulfilment", description="Run the local fulfilment service in the foreground."
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    args = parser.parse_args(argv)

    done = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server = FulfilmentServer(args.host, args.port)
        server.start()
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        print(f"listening on {server.url}", flush=True)
        while not done.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
