"""First message: the time from starting a new local host to its first settled message, telemetry off and on.

One local stack (broker, Cosmos server, fulfilment stand-in: demo/stack.py) and a loopback stand-in of
Application Insights' ingestion endpoint. For each run and each mode, alternating: one valid OrderPlaced
(a fresh orderId) is sent to the orders queue first, so that it waits; then a new host is started
(``python -m devservers.host``, which runs the production worker) and timed from the moment its process
is started to the moment the message is settled. With telemetry on, its settings add Application
Insights' connection string (the stand-in) and no statsbeat, as in Azure; the first invocation then
installs the counters' exporter (idempotent_consumer.telemetry.export_to_azure_monitor).

The settlement signal is the host's own log line for the delivery, ``process_order messageId=<id>
outcome=Succeeded settlement=complete ...``, written right after the broker took the settlement: its
timestamp (milliseconds, the host's clock, which is this machine's) ends the measurement, so polling
adds nothing to the figure. The orders queue is then peeked empty as a check.

The exporter sends every 60 s, which no run waits for; the check that it was installed in the worker
is the stand-in's request count: the SDK flushes its meter provider when the worker exits, so each
telemetry-on host, once stopped, has sent at least one request, and no telemetry-off host any.

Each mode first runs one uncounted host (the first hosts also fill the page cache).

    python -m bench.first_message [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import re
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from demo.stack import HostProcess, Stack, settings_file

QUEUE = "orders"
SETTLE_TIMEOUT_SECONDS = 120
FLUSH_WAIT_SECONDS = 5  # after a telemetry-on host stopped, for its exit's export to arrive
_SETTLED = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ process_order messageId=(?P<id>\S+)"
                      r" outcome=(?P<outcome>\S+) settlement=(?P<settlement>\S+)", re.MULTILINE)


class Ingestion:
    """A loopback stand-in of Application Insights' ingestion endpoint: POST /v2.1/track answers 200."""

    def __init__(self) -> None:
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.split("?")[0] != "/v2.1/track":
                    self.send_error(404)
                    return
                with lock:
                    outer.requests += 1
                items = _item_count(body, self.headers.get("Content-Encoding"))
                reply = json.dumps({"itemsReceived": items, "itemsAccepted": items, "errors": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def connection_string(self) -> str:
        return ("InstrumentationKey=00000000-0000-0000-0000-000000000000;"
                f"IngestionEndpoint=http://127.0.0.1:{self.port}/")

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _item_count(body: bytes, encoding: str | None) -> int:
    """The envelopes in a track request: a JSON array, or newline-delimited JSON."""
    import gzip  # noqa: PLC0415

    with contextlib.suppress(OSError, ValueError):
        text = (gzip.decompress(body) if encoding == "gzip" else body).decode()
        with contextlib.suppress(ValueError):
            parsed = json.loads(text)
            return len(parsed) if isinstance(parsed, list) else 1
        return sum(1 for line in text.splitlines() if line.strip())
    return 1


def _order(order_id: str) -> dict[str, Any]:
    """A valid OrderPlaced body (tests/support/orders.py's order_body shape)."""
    return {"orderId": order_id, "customerId": "cust-42", "currency": "EUR",
            "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "19.99"},
                      {"sku": "SKU-2", "quantity": 1, "unitPrice": "5.00"}],
            "total": "44.98", "placedAt": "2026-11-30T09:15:00Z"}


def _settled_at(host: HostProcess, message_id: str, deadline: float) -> float:
    """The epoch seconds of the host's settlement line for ``message_id``; waits for it."""
    while time.monotonic() < deadline:
        for line in _SETTLED.finditer(host.text()):
            if line["id"] == message_id:
                if line["settlement"] != "complete":
                    raise RuntimeError(f"{message_id}: outcome={line['outcome']} settlement={line['settlement']}")
                return datetime.strptime(line["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged
        if host.process.poll() is not None:
            raise RuntimeError(f"the host exited ({host.process.returncode}):\n{host.text()[-3000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"{message_id} not settled in {SETTLE_TIMEOUT_SECONDS} s:\n{host.text()[-3000:]}")


def _one(stack: Stack, client: ServiceBusClient, settings: Path) -> float:
    """Send one order, start a host, time it to the order's settlement, stop the host."""
    order_id = f"ord-{uuid.uuid4()}"
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage(json.dumps(_order(order_id)), message_id=order_id,
                                               correlation_id=f"corr-{order_id}", content_type="application/json"))
    started = time.time()
    host = stack.start_host(settings)
    try:
        settled = _settled_at(host, order_id, time.monotonic() + SETTLE_TIMEOUT_SECONDS)
    finally:
        stack.stop_hosts()
    with client.get_queue_receiver(QUEUE) as receiver:
        if left := receiver.peek_messages(max_message_count=10):
            raise RuntimeError(f"the orders queue still holds {[m.message_id for m in left]}")
    return settled - started


@contextlib.contextmanager
def _stack() -> Iterator[Stack]:
    stack = Stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def measure(runs: int, modes: tuple[str, ...] = ("off", "on"), warm_up: int = 1) -> dict[str, Any]:
    """Median seconds from starting a host to its first settled message per mode (``off_s``, ``on_s``), on minus
    off (``difference_s``), each run's seconds (``off_runs_s``, ``on_runs_s``) and the export requests; after
    ``warm_up`` uncounted rounds."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    exported: dict[str, int] = {mode: 0 for mode in modes}
    ingestion = Ingestion()
    try:
        with _stack() as stack, ServiceBusClient.from_connection_string(stack.broker.connection_string) as client:
            settings = {"off": stack.settings_file, "on": settings_file({
                **stack.values, "APPLICATIONINSIGHTS_CONNECTION_STRING": ingestion.connection_string(),
                "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true"})}
            for round_ in range(warm_up + runs):
                for mode in modes:
                    before = ingestion.requests
                    seconds = _one(stack, client, settings[mode])
                    if round_ < warm_up:
                        continue  # not counted: the first hosts also fill the page cache
                    times[mode].append(seconds)
                    if mode == "on":
                        deadline = time.monotonic() + FLUSH_WAIT_SECONDS
                        while ingestion.requests == before and time.monotonic() < deadline:
                            time.sleep(0.1)
                    exported[mode] += ingestion.requests - before
    finally:
        ingestion.stop()
    if "on" in modes and exported["on"] < runs:
        raise RuntimeError(f"telemetry on: {exported['on']} export requests from {runs} hosts; the exporter"
                           " was not installed in the worker")
    if "off" in modes and exported["off"]:
        raise RuntimeError(f"telemetry off: {exported['off']} export requests")
    result: dict[str, Any] = {f"{mode}_s": statistics.median(times[mode]) for mode in modes}
    result.update({f"{mode}_runs_s": times[mode] for mode in modes})
    result.update({f"{mode}_export_requests": exported[mode] for mode in modes})
    if "off" in modes and "on" in modes:
        result["difference_s"] = result["on_s"] - result["off_s"]
    return result


def main() -> None:
    """Print the medians and the difference."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="hosts started per mode (default 3)")
    runs = parser.parse_args().runs
    if runs < 1:
        parser.error("--runs must be at least 1")
    figures = measure(runs)
    print(f"first settled message after starting a host, median of {runs}: telemetry off"
          f" {figures['off_s']:.2f} s, on {figures['on_s']:.2f} s, difference {figures['difference_s']:+.2f} s"
          f" (runs off {', '.join(f'{t:.2f}' for t in figures['off_runs_s'])};"
          f" on {', '.join(f'{t:.2f}' for t in figures['on_runs_s'])};"
          f" export requests on stop: {figures['on_export_requests']:.0f})")


if __name__ == "__main__":
    main()
