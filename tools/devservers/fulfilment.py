"""Local warehouse "fulfilment service" for tests and workstation runs; not deployed.

A real HTTP/1.1 server (loopback only) that takes stock reservations by the one reservation rule,
``shared.adapters.reservations.ReservationLedger``, with fault injection so tests can drive the
caller's retry paths:

* ``POST /reservations`` with a JSON object body and an ``Idempotency-Key`` header answers as the
  ledger does: 201 ``{"reservationId": "res-<uuid>", "orderId": ...}`` for a key's first request, 200
  with the same reply for a repeat of it, 422 for another request under the key. A missing/empty key
  or a body that is not a JSON object answers 400, a body over 1 MiB 413. Every answer's body is
  JSON; errors are ``{"reason": ...}``.
* Faults (:meth:`FulfilmentServer.fail_next`, :meth:`FulfilmentServer.stall_next`,
  :meth:`FulfilmentServer.lose_next`) form one FIFO queue: each ``POST /reservations`` takes the next
  queued fault, if any, before any validation or dedup. A *fail* answers its status and records no
  reservation. A *stall* waits, then handles the request normally, so the reservation is recorded even
  if the caller has timed out meanwhile. A *lose* handles the request normally, then drops the
  connection unanswered: the reservation is made and the caller cannot know.
* Every ``POST /reservations`` (faulted or not) is recorded as a :class:`Call` under its key
  (``""`` when the header is missing).
* Behaviours of real services, off by default (``--ietf``, ``--forget-keys-after``, ``--processing-seconds``):
  a request under a key another request still holds is answered 409, as the IETF Idempotency-Key
  draft and Stripe answer it; keys are forgotten a set time after their first reservation, so that a
  request under one reserves again; each new reservation takes a processing time (drawn from a range)
  while it holds its key, and a repeat is answered from the stored reply at once. Every reservation
  made is kept for counting, a forgotten key's too.
* A token mode (``tokens`` and ``audience``): a reservation without a bearer token that ``tokens`` issued for
  ``audience`` (devservers.identity, the local managed-identity endpoint), unexpired, is answered 401 and
  recorded, and reserves nothing, as a service behind Entra ID answers a caller it does not admit.
* An outage (:meth:`FulfilmentServer.outage`): for a number of seconds every reservation request is
  answered 503 (or the status given), recorded, and reserves nothing; queued faults wait for its end.
* Out-of-process control: ``POST /_control`` with ``{"fail": {"status": 503, "count": 2, "reason":
  "..."}}``, ``{"stall": {"seconds": 2, "count": 1}}``, ``{"lose": {"count": 1}}``, ``{"outage": {"seconds":
  180, "status": 503}}``, ``{"reset": true}`` (drop queued faults, end an outage) or ``{"clear": true}``
  (forget everything); ``GET /_calls`` answers ``{key: [{"status", "body",
  "time"}, ...]}``.

The HTTP plumbing is werkzeug's threaded development server, which azure-functions already installs
and which, unlike the stdlib's single-threaded HTTP/1.0 ``wsgiref``, serves concurrent callers; it
closes the connection after every answer (``Connection: close``), so clients reconnect per call.

In-process use::

    with FulfilmentServer() as server:
        server.fail_next(503, count=2)
        ...  # point the app at server.url
        assert server.reservation_count() == 1

From a shell: ``python -m devservers.fulfilment [--host 127.0.0.1] [--port 7072] [--verbose]`` prints
``listening on http://127.0.0.1:<port>`` and serves until SIGTERM/SIGINT. Every request is logged at
INFO on ``devservers.fulfilment.requests`` (method, path, status, and the Idempotency-Key of a
reservation; never a body), which ``--verbose`` shows on stderr.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import logging
import random
import socket
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from werkzeug.exceptions import BadRequest, HTTPException, RequestEntityTooLarge
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from devservers._child import port_number
from devservers.identity import Tokens
from devservers.stopsignal import StopSignals
from shared.adapters.reservations import ReservationLedger
from shared.ports.fulfilment import IDEMPOTENCY_HEADER, RESERVATIONS_PATH, Reply

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

__all__ = ["DEFAULT_PORT", "Call", "FulfilmentServer", "main"]

DEFAULT_PORT = 7072
_POLL_INTERVAL = 0.05
_requests = logging.getLogger("devservers.fulfilment.requests")


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
class _Lose:
    pass


class _Request(Request):
    max_content_length = 1024 * 1024


class _Handler(WSGIRequestHandler):
    """werkzeug's request handler, without Nagle's delay, request logging or lingering after a drop."""

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; with Nagle on, the body can wait ~40 ms for a delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_dropped(self, error: BaseException, environ: WSGIEnvironment | None = None) -> None:
        self.close_connection = True  # unanswered (a stall cut by stop()): close instead of awaiting a next request

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class FulfilmentServer:
    """The local fulfilment service. Start with :meth:`start` (or ``with``), stop with :meth:`stop`.

    Faults and records survive stop/start; :meth:`clear` forgets them.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, ietf: bool = False,
                 forget_keys_after: float | None = None, processing_seconds: tuple[float, float] = (0.0, 0.0),
                 tokens: Tokens | None = None, audience: str | None = None) -> None:
        _check_loopback(host)
        if forget_keys_after is not None and forget_keys_after <= 0:
            raise ValueError("forget_keys_after must be positive")
        if not 0 <= processing_seconds[0] <= processing_seconds[1]:
            raise ValueError("processing_seconds must be a range of non-negative seconds, the least first")
        self.host = host
        self.port = port
        self.processing_seconds = processing_seconds
        # The token mode: every reservation needs a bearer token ``tokens`` issued for ``audience`` (the app's
        # managed identity's, from the local identity endpoint, devservers.identity); else 401, nothing reserved.
        self.tokens, self.audience = tokens, audience
        self.refused_tokens: Counter[str] = Counter()  # the token mode's 401s, by why (Tokens.verify's reason)
        self._random = random.Random()  # a test double's processing time, not security
        self._lock = threading.Lock()  # makes a reservation and its Call record one step for observers
        self._ledger = ReservationLedger(conflict_in_flight=ietf, forget_after_seconds=forget_keys_after)
        self._faults: deque[_Fail | _Stall | _Lose] = deque()
        self._down: tuple[float, int] | None = None  # an outage: until when, answering what status
        self._calls: dict[str, list[Call]] = {}
        self._stopping = threading.Event()
        self._httpd: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``; only while running."""
        if self._httpd is None:
            raise RuntimeError("the fulfilment server is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._httpd.port}"

    def start(self) -> Self:
        """Listen and serve on a background thread; raise OSError if the port is taken."""
        if self._httpd is not None:
            raise RuntimeError("the fulfilment server is already running")
        self._stopping.clear()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # Bound here because werkzeug answers a failed bind with sys.exit(1); it serves a copy of the socket.
        with socket.create_server((self.host, self.port), family=family) as listener:
            port = listener.getsockname()[1]
            httpd = make_server(
                self.host, port, self._wsgi, threaded=True, request_handler=_Handler, fd=listener.fileno()
            )
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(_POLL_INTERVAL,), name=f"fulfilment-devserver:{port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and interrupt stalls, whose callers get no answer. Safe to call twice."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._stopping.set()
        httpd.shutdown()
        thread.join()  # serve_forever closes the listening socket on its way out
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
        with self._lock:
            self._faults.extend(_Fail(status, reason) for _ in range(count))

    def stall_next(self, seconds: float, count: int = 1) -> None:
        """Wait ``seconds`` before handling each of the next ``count`` reservation requests normally."""
        if seconds < 0 or count < 0:
            raise ValueError("seconds and count must not be negative")
        with self._lock:
            self._faults.extend(_Stall(seconds) for _ in range(count))

    def lose_next(self, count: int = 1) -> None:
        """Handle each of the next ``count`` reservation requests normally, then drop it unanswered."""
        if count < 0:
            raise ValueError("count must not be negative")
        with self._lock:
            self._faults.extend(_Lose() for _ in range(count))

    def outage(self, seconds: float, status: int = 503) -> None:
        """Answer every reservation request with ``status`` for the next ``seconds`` (0 ends an outage now), as a
        service that is down does; each is recorded as a call, and reserves nothing."""
        if seconds < 0 or not 100 <= status <= 599:
            raise ValueError("seconds must not be negative, and status must be an HTTP status code")
        with self._lock:
            self._down = (time.time() + seconds, status) if seconds else None

    def reset_faults(self) -> None:
        """Drop all queued faults and end an outage."""
        with self._lock:
            self._faults.clear()
            self._down = None

    def clear(self) -> None:
        """Forget faults, calls and reservations."""
        with self._lock:
            self._faults.clear()
            self._calls.clear()
            self._ledger.clear()
            self.refused_tokens.clear()

    # -- inspection ------------------------------------------------------------------------------

    def pending_faults(self) -> int:
        """How many queued faults no request has taken yet."""
        with self._lock:
            return len(self._faults)

    def calls(self, key: str) -> list[Call]:
        """The reservation requests made with ``key``, oldest first."""
        with self._lock:
            return list(self._calls.get(key, ()))

    def keys(self) -> list[str]:
        """Every Idempotency-Key seen (``""`` for requests without one), in order of first use."""
        with self._lock:
            return list(self._calls)

    def reservations(self) -> list[dict[str, Any]]:
        """Every reservation made, oldest first: its ``reservationId``, ``orderId`` and ``key``."""
        with self._lock:
            return self._ledger.reservations()

    def reservation_count(self) -> int:
        """How many reservations were made (a key forgotten and used again makes a second)."""
        with self._lock:
            return self._ledger.count()

    def token_refusals(self) -> int:
        """Reservations the token mode refused (401): none, or none valid, of the identity endpoint's tokens."""
        with self._lock:
            return sum(self.refused_tokens.values())

    def forgotten_keys(self) -> int:
        """How many keys were forgotten (``forget_keys_after``) and then asked for again."""
        with self._lock:
            return self._ledger.forgotten()

    # -- HTTP ------------------------------------------------------------------------------------

    def _wsgi(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = _Request(environ)
        try:
            reply = self._route(request)
        except HTTPException as err:
            reply = Reply(err.code or 500, {"reason": err.description})
        except ConnectionAbortedError:
            _log_request(request, "aborted")
            raise
        _log_request(request, str(reply.status))
        response = Response(json.dumps(reply.body), reply.status, mimetype="application/json")
        return response(environ, start_response)

    def _route(self, request: Request) -> Reply:
        route = (request.method, request.path)
        if route == ("POST", RESERVATIONS_PATH):
            return self._reservation(request)
        if route == ("POST", "/_control"):
            _apply_control(self, _json_object(request.get_data()))
            return Reply(200, {"ok": True})
        if route == ("GET", "/_calls"):
            with self._lock:
                return Reply(200, {key: [_call_json(c) for c in calls] for key, calls in self._calls.items()})
        return Reply(404, {"reason": f"no route for {request.method} {request.path}"})

    def _reservation(self, request: Request) -> Reply:
        key = request.headers.get(IDEMPOTENCY_HEADER, "").strip()
        try:
            body = _json_object(request.get_data())
        except RequestEntityTooLarge as err:
            return self._answer(key, {}, Reply(413, {"reason": err.description}))
        if self.tokens is not None and (refused := self.tokens.verify(request.headers.get("Authorization"),
                                                                        str(self.audience))) is not None:
            with self._lock:
                self.refused_tokens[refused] += 1
            return self._answer(key, body or {}, Reply(401, {"reason": f"not allowed: {refused}"}))
        with self._lock:
            down = self._down if self._down is not None and time.time() < self._down[0] else None
            fault = self._faults.popleft() if self._faults and down is None else None
        if down is not None:
            return self._answer(key, body or {}, Reply(down[1], {"reason": "the service is down (an outage)"}))
        if isinstance(fault, _Fail):
            return self._answer(key, body or {}, Reply(fault.status, {"reason": fault.reason}))
        if key and (busy := self._ledger.begin(key)) is not None:
            return self._answer(key, body or {}, busy)
        try:
            stall = (fault.seconds if isinstance(fault, _Stall) else 0.0) + self._processing_time(key)
            if stall and self._stopping.wait(stall):
                raise ConnectionAbortedError("stopping")  # werkzeug then drops the connection unanswered
            if not key:
                return self._answer(key, body or {}, Reply(400, {"reason": f"{IDEMPOTENCY_HEADER} header is required"}))
            if body is None:
                return self._answer(key, {}, Reply(400, {"reason": "body must be a JSON object"}))
            reply = self._answer(key, body, None)
        finally:
            if key:
                self._ledger.end(key)
        if isinstance(fault, _Lose):
            raise ConnectionAbortedError("response lost")  # werkzeug then drops the connection unanswered
        return reply

    def _processing_time(self, key: str) -> float:
        """How long a request takes before it is answered: a new reservation's processing time; a repeat is
        answered from the stored reply at once."""
        low, high = self.processing_seconds
        if not high or self._ledger.remembers(key):
            return 0.0
        with self._lock:
            return self._random.uniform(low, high)

    def _answer(self, key: str, body: dict[str, Any], reply: Reply | None) -> Reply:
        """Record the call and return ``reply``; for ``None``, the ledger's reply, made in the same step."""
        with self._lock:
            if reply is None:
                reply = self._ledger.reserve(key, body)
            self._calls.setdefault(key, []).append(Call(key, body, reply.status, time.time()))
        return reply


def _log_request(request: Request, outcome: str) -> None:
    """One line per request: method, path, status, and a reservation's Idempotency-Key; never the body."""
    key = request.headers.get(IDEMPOTENCY_HEADER) if request.path == RESERVATIONS_PATH else None
    _requests.info("%s %s %s%s", request.method, request.path, outcome, f" key={key}" if key is not None else "")


def _call_json(call: Call) -> dict[str, Any]:
    return {"status": call.status, "body": call.body, "time": call.time}


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _apply_control(server: FulfilmentServer, command: Mapping[str, Any] | None) -> None:
    known = {"fail", "stall", "lose", "outage", "reset", "clear"}
    if not command or not set(command) <= known:
        raise BadRequest(f"expected a JSON object with one or more of {sorted(known)}")
    try:
        if command.get("clear"):
            server.clear()
        if command.get("reset"):
            server.reset_faults()
        if "fail" in command:
            fail = command["fail"]
            if not isinstance(fail, dict) or "status" not in fail:
                raise BadRequest("fail needs {status, count?, reason?}")
            server.fail_next(
                int(fail["status"]), count=int(fail.get("count", 1)), reason=str(fail.get("reason", "injected fault"))
            )
        if "stall" in command:
            stall = command["stall"]
            if not isinstance(stall, dict) or "seconds" not in stall:
                raise BadRequest("stall needs {seconds, count?}")
            server.stall_next(float(stall["seconds"]), count=int(stall.get("count", 1)))
        if "outage" in command:
            outage = command["outage"]
            if not isinstance(outage, dict) or "seconds" not in outage:
                raise BadRequest("outage needs {seconds, status?}")
            server.outage(float(outage["seconds"]), int(outage.get("status", 503)))
        if "lose" in command:
            lose = command["lose"]
            if not isinstance(lose, dict):
                raise BadRequest("lose needs {count?}")
            server.lose_next(count=int(lose.get("count", 1)))
    except (TypeError, ValueError) as err:
        raise BadRequest(str(err)) from None


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the fulfilment devserver listens on loopback only, not {host!r}")


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM/SIGINT; print ``listening on <url>`` once ready."""
    parser = argparse.ArgumentParser(
        prog="python -m devservers.fulfilment", description="Run the local fulfilment service in the foreground.",
        epilog=f"example:\n  python -m devservers.fulfilment --port {DEFAULT_PORT} --verbose\n"
               "  python -m devservers.fulfilment --ietf --forget-keys-after 86400 --processing-seconds 0 3\n\n"
               "exit status: 0 "
               "stopped by SIGTERM or SIGINT; 1 cannot listen (e.g. the port is in use); 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    parser.add_argument("--ietf", action="store_true",
                        help="answer 409 to a request under a key that another request still holds, as the IETF"
                             " Idempotency-Key draft does (default: answer requests under one key one at a time)")
    parser.add_argument("--forget-keys-after", type=_positive_seconds, metavar="SECONDS",
                        help="forget a key this long after its reservation, so that a request under it reserves"
                             " again (default: never)")
    parser.add_argument("--processing-seconds", type=_positive_seconds, nargs=2, metavar=("LEAST", "MOST"),
                        default=(0.0, 0.0), help="how long each new reservation takes while it holds its key, drawn"
                                                 " between LEAST and MOST (default: 0 0)")
    parser.add_argument("--verbose", action="store_true",
                        help="log one line per request on stderr (method, path, status, Idempotency-Key; no bodies)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    done = StopSignals()
    try:
        server = FulfilmentServer(args.host, args.port, ietf=args.ietf, forget_keys_after=args.forget_keys_after,
                                  processing_seconds=tuple(args.processing_seconds)).start()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: {_cannot_listen(args.host, args.port, err)}", file=sys.stderr)
        return 1
    try:
        print(f"listening on {server.url}", flush=True)
        done.wait()
    finally:
        server.stop()
    return 0


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; give seconds of 0 or more")
    return seconds


def _cannot_listen(host: str, port: int, err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use (another fulfilment stand-in, or make run?); stop that, or "
                "choose another --port (0 = any free)")
    return f"cannot listen on {host}:{port}: {err.strerror or err}"


if __name__ == "__main__":
    sys.exit(main())
