"""An HTTP reverse proxy on loopback in front of a Cosmos endpoint that fails chosen or random requests.

The real azure-cosmos SDK talks to it as to any Cosmos gateway, so its retry policies, timeouts and
error types are the real ones; only the answers to the requests picked for a fault are replaced.

Faults come two ways, and a request takes at most one:

- **scripted** (tests): ``fail(method, path, status)`` answers matching requests with a status, and
  ``inject(method, path, kind)`` applies one of the kinds below;
- **random** (the chaos suite): ``RandomFaults(seed, rates)`` draws a kind, or none, per request.

The kinds (``Kind``) are what Cosmos and the network do to a client:

========================  =====================================================================
``throttle``              429 with ``x-ms-retry-after-ms`` (substatus 3200); nothing forwarded
``unavailable``           503; nothing forwarded
``reset``                 the connection is reset before the request is forwarded
``delay``                 the request is forwarded after ``delay_seconds``
``lose_response``         the request is forwarded and takes effect; the connection is reset
                          instead of the answer (the write happened, the client cannot know)
========================  =====================================================================

``counts`` holds the faults injected by kind (scripted status faults count as ``status:<code>``).

A ``tap`` sees every exchange twice: before it is forwarded (``status`` None) and once the upstream
answered (``status`` set). When it returns True the client's connection is reset there: before, the
request never reaches the upstream; after, it took effect and its answer is lost. The chaos suite
taps to kill the host behind a proxy at a chosen moment (before a write, after it, mid-call). An ``observe``
callable sees each answer relayed whole, its body included (``bench.feed`` counts the change feed's items so).

As a process: ``python -m devservers.faultproxy --upstream http://127.0.0.1:8081 --rate throttle=0.05
--rate lose_response=0.01 --seed 7 [--writes-only] [--port 0]`` prints ``listening on <url>``, serves
until SIGTERM or Ctrl-C, then prints the faults it injected by kind on stderr.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from devservers._child import port_number
from devservers.stopsignal import StopSignals

__all__ = ["Fault", "FaultProxy", "Kind", "Observer", "RandomFaults", "Tap", "fault_proxy"]

# (method, path, request headers by lower-case name, request body, upstream status or None before
# forwarding) -> reset the connection here?
Tap = Callable[[str, str, Mapping[str, str], bytes, int | None], bool]
# (method, path, request headers by lower-case name, upstream status, answer body): each answer relayed whole, for a
# benchmark that counts what the upstream sent (the change feed's items, say).
Observer = Callable[[str, str, Mapping[str, str], int, bytes], None]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OUTAGE = "outage"  # the count of requests refused while the proxy's upstream was down (FaultProxy.outage)


class Kind(StrEnum):
    THROTTLE = "throttle"
    UNAVAILABLE = "unavailable"
    RESET = "reset"
    DELAY = "delay"
    LOSE_RESPONSE = "lose_response"


@dataclass
class Fault:
    """Fault requests matching ``method`` and ``path`` (a regex); ``count`` None = always.

    ``status`` answers with that status; ``kind`` applies a Kind instead (then ``status`` is 0).
    """

    method: str
    path: str
    status: int = 0
    count: int | None = 1
    stall_seconds: float = 0.0
    kind: Kind | None = None
    hits: int = 0

    def take(self, method: str, path: str) -> bool:
        if method != self.method or not re.search(self.path, path):
            return False
        if self.count is not None and self.hits >= self.count:
            return False
        self.hits += 1
        return True


@dataclass
class RandomFaults:
    """Per request, a Kind with its probability in ``rates`` (the rest pass), from a seeded generator.

    ``methods`` limits which requests may be faulted (default: every method).
    """

    seed: int
    rates: Mapping[Kind, float]
    methods: frozenset[str] | None = None
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if sum(self.rates.values()) > 1:
            raise ValueError(f"fault rates add up to {sum(self.rates.values()):g}, more than 1")
        self._random = random.Random(self.seed)

    def draw(self, method: str) -> Kind | None:
        if self.methods is not None and method not in self.methods:
            return None
        roll = self._random.random()
        for kind, rate in self.rates.items():
            if roll < rate:
                return kind
            roll -= rate
        return None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away (killed, timed out) is routine here, not a traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class FaultProxy:
    """A reverse proxy to ``upstream`` with injectable faults. Use as a context manager."""

    def __init__(self, upstream: str, *, random_faults: RandomFaults | None = None, delay_seconds: float = 0.2,
                 retry_after_ms: int = 10, port: int = 0, tap: Tap | None = None,
                 observe: Observer | None = None) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._faults: list[Fault] = []
        self._random = random_faults
        self.delay_seconds = delay_seconds
        self.retry_after_ms = retry_after_ms
        self.tap = tap
        self.observe = observe
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request seen, faulted or not
        self.counts: Counter[str] = Counter()  # faults injected, by kind
        self._down_until = 0.0  # an outage: every request answered 503 until then
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, method: str, path: str, status: int, count: int | None = 1, stall_seconds: float = 0.0) -> Fault:
        """Answer matching requests with ``status``; returns the fault so a test can read ``hits``."""
        return self._add(Fault(method, path, status, count, stall_seconds))

    def inject(self, method: str, path: str, kind: Kind, count: int | None = 1) -> Fault:
        """Apply ``kind`` to matching requests; returns the fault so a test can read ``hits``."""
        return self._add(Fault(method, path, count=count, kind=kind))

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def outage(self, seconds: float) -> None:
        """Answer every request 503 for the next ``seconds`` (0 ends an outage now): the service down, as Cosmos DB
        answers when it is unavailable. Counted as ``outage``."""
        with self._lock:
            self._down_until = time.time() + seconds if seconds > 0 else 0.0

    def clear(self) -> None:
        """Remove every scripted fault, and end an outage."""
        with self._lock:
            self._faults.clear()
            self._down_until = 0.0

    def _match(self, method: str, path: str) -> Fault | Kind | None:
        with self._lock:
            self.requests.append((method, path))
            if time.time() < self._down_until:
                self.counts[OUTAGE] += 1
                return Kind.UNAVAILABLE
            scripted = next((f for f in self._faults if f.take(method, path)), None)
            if scripted is not None:
                self.counts[str(scripted.kind) if scripted.kind else f"status:{scripted.status}"] += 1
                return scripted
            drawn = self._random.draw(method) if self._random is not None else None
            if drawn is not None:
                self.counts[str(drawn)] += 1
            return drawn

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                match = proxy._match(self.command, self.path)
                if isinstance(match, Fault):
                    time.sleep(match.stall_seconds)
                    kind = match.kind
                    if kind is None:
                        self._answer(match.status, "0")
                        return
                else:
                    kind = match
                if kind is Kind.THROTTLE:
                    self._answer(429, "3200")
                elif kind is Kind.UNAVAILABLE:
                    self._answer(503, "0")
                elif kind is Kind.RESET:
                    self._reset()
                else:
                    if kind is Kind.DELAY:
                        time.sleep(proxy.delay_seconds)
                    if self._tapped(body, None):
                        self._reset()
                        return
                    status, headers, data = self._forward(body)
                    if kind is Kind.LOSE_RESPONSE or self._tapped(body, status):
                        self._reset()
                        return
                    if proxy.observe is not None:
                        proxy.observe(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                      status, data)
                    self.send_response(status)
                    for key, value in headers:
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def _tapped(self, body: bytes, status: int | None) -> bool:
                headers = {k.lower(): v for k, v in self.headers.items()}
                return proxy.tap is not None and proxy.tap(self.command, self.path, headers, body, status)

            def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    reply = upstream.getresponse()
                    data = reply.read()
                    kept = [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP_BY_HOP]
                    return reply.status, kept, data
                finally:
                    upstream.close()

            def _reset(self) -> None:
                """Close the client's connection with a TCP reset (SO_LINGER 0), answering nothing."""
                self.close_connection = True
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

            def _answer(self, status: int, substatus: str) -> None:
                data = json.dumps({"code": f"Injected{status}", "message": "fault injected by the proxy"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("x-ms-retry-after-ms", str(proxy.retry_after_ms))
                self.send_header("x-ms-substatus", substatus)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

        return Handler


@contextmanager
def fault_proxy(upstream: str, **options: object) -> Iterator[FaultProxy]:
    """Run a FaultProxy in front of ``upstream`` for the duration of the block (options as FaultProxy's)."""
    with FaultProxy(upstream, **options) as proxy:  # type: ignore[arg-type]
        yield proxy


def _rate(text: str) -> tuple[Kind, float]:
    """An argparse type for --rate: KIND=PROBABILITY."""
    kind, _, value = text.partition("=")
    try:
        rate = float(value)
        parsed = Kind(kind.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KIND=PROBABILITY with KIND one of {', '.join(k.value for k in Kind)}"
        ) from None
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the probability must be between 0 and 1")
    return parsed, rate


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM/SIGINT; print ``listening on <url>`` once ready."""
    parser = argparse.ArgumentParser(
        prog="python -m devservers.faultproxy",
        description="Run a fault-injecting proxy in front of a plain-HTTP Cosmos endpoint.",
        epilog="example:\n  python -m devservers.faultproxy --upstream http://127.0.0.1:8081 --rate throttle=0.05 "
        "--rate lose_response=0.01 --seed 7 --writes-only\n\nexit status: 0 stopped by SIGTERM or SIGINT; "
        "1 cannot listen (the port is in use); 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--upstream", required=True, help="the Cosmos endpoint to forward to (http://host:port)")
    parser.add_argument("--port", type=port_number, default=0, help="port to listen on (default 0 = any free)")
    parser.add_argument("--rate", type=_rate, action="append", default=[], metavar="KIND=P",
                        help=f"fault a request with KIND at probability P; repeatable; kinds: "
                        f"{', '.join(k.value for k in Kind)}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random fault plan (default 0)")
    parser.add_argument("--writes-only", action="store_true", help="fault only POST, PUT, PATCH and DELETE")
    parser.add_argument("--delay-seconds", type=float, default=0.2, help="pause of a delay fault (default 0.2)")
    parser.add_argument("--retry-after-ms", type=int, default=10,
                        help="x-ms-retry-after-ms of a throttle fault (default 10)")
    args = parser.parse_args(argv)
    if not args.upstream.lower().startswith("http://"):
        parser.error(f"--upstream {args.upstream!r}: give a plain-HTTP endpoint (http://host:port)")
    try:
        plan = RandomFaults(args.seed, dict(args.rate), WRITES if args.writes_only else None)
    except ValueError as err:
        parser.error(f"--rate: {err}")
    try:
        proxy = FaultProxy(args.upstream, random_faults=plan, delay_seconds=args.delay_seconds,
                           retry_after_ms=args.retry_after_ms, port=args.port)
    except OSError as err:
        print(f"error: cannot listen on 127.0.0.1:{args.port} ({err.strerror}); choose another --port "
              "(0 = any free)", file=sys.stderr)
        return 1
    stopped = StopSignals()  # SIGTERM, and Ctrl-C
    with proxy:
        print(f"listening on {proxy.url}", flush=True)
        stopped.wait()
    injected = " ".join(f"{kind}={count}" for kind, count in sorted(proxy.counts.items())) or "none"
    print(f"faults injected: {injected} (of {len(proxy.requests)} requests)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
