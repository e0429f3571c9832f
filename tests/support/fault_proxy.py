"""An HTTP reverse proxy on loopback in front of a Cosmos endpoint that fails chosen requests.

The real azure-cosmos SDK talks to it as to any Cosmos gateway, so its retry policies, timeouts and
error types are the real ones; only the answers to the requests a test picks are replaced.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Fault:
    """Answer requests matching ``method`` and ``path`` (a regex) with ``status``; ``count`` None = always."""

    method: str
    path: str
    status: int
    count: int | None = 1
    stall_seconds: float = 0.0
    hits: int = 0

    def take(self, method: str, path: str) -> bool:
        if method != self.method or not re.search(self.path, path):
            return False
        if self.count is not None and self.hits >= self.count:
            return False
        self.hits += 1
        return True


class FaultProxy:
    """A reverse proxy to ``upstream`` with an injectable list of faults. Use as a context manager."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request seen, faulted or not
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, method: str, path: str, status: int, count: int | None = 1, stall_seconds: float = 0.0) -> Fault:
        """Add a fault; returns it so a test can read ``hits``."""
        fault = Fault(method, path, status, count, stall_seconds)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every fault."""
        with self._lock:
            self._faults.clear()

    def _match(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self.requests.append((method, path))
            return next((f for f in self._faults if f.take(method, path)), None)

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
                fault = proxy._match(self.command, self.path)
                if fault is not None:
                    time.sleep(fault.stall_seconds)
                    self._answer_fault(fault.status)
                    return
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    reply = upstream.getresponse()
                    data = reply.read()
                    self.send_response(reply.status)
                    for key, value in reply.getheaders():
                        if key.lower() not in _HOP_BY_HOP:
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    upstream.close()

            def _answer_fault(self, status: int) -> None:
                data = json.dumps({"code": f"Injected{status}", "message": "fault injected by test"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("x-ms-retry-after-ms", "1")
                self.send_header("x-ms-substatus", "0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

        return Handler


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """Run a FaultProxy in front of ``upstream`` for the duration of the block."""
    with FaultProxy(upstream) as proxy:
        yield proxy
