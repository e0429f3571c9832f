"""One structured record per delivery with ids and outcome only, and an OpenTelemetry counter."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.telemetry import LOGGER_NAME, export_to_azure_monitor, record_delivery
from tests.support.metrics import outcome_counts
from tests.support.orders import inbound, order_body

ROOT = Path(__file__).resolve().parents[2]


def test_record_has_ids_outcome_and_duration_but_no_payload(caplog: pytest.LogCaptureFixture) -> None:
    message = inbound(order_body("ord-7", customerId="alice@example.com"), delivery_count=2)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        record_delivery("process_order", message, Result(Outcome.CREATED, request_hash="abc"), 12.345)
    [record] = caplog.records
    fields = vars(record)  # what ``extra`` set: LogRecord declares only the standard attributes
    assert fields["messageId"] == "ord-7"
    assert fields["correlationId"] == "corr-1"
    assert fields["deliveryCount"] == 2
    assert fields["outcome"] == "created"
    assert fields["durationMs"] == 12.3
    assert "alice@example.com" not in record.getMessage()
    assert "alice@example.com" not in repr(record.__dict__)


def test_rejections_are_logged_as_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        record_delivery("process_order", inbound(order_body("o")), Result(Outcome.INVALID, "currency bad"), 1)
    assert caplog.records[0].levelno == logging.WARNING
    assert "currency bad" in caplog.records[0].getMessage()


def test_outcomes_are_counted_by_function_and_outcome() -> None:
    before = outcome_counts()
    record_delivery("fn_a", inbound(order_body("o")), Result(Outcome.DUPLICATE), 1)
    record_delivery("fn_a", inbound(order_body("o")), Result(Outcome.DUPLICATE), 1)
    after = outcome_counts()
    assert after[("fn_a", "duplicate")] - before[("fn_a", "duplicate")] == 2


# A fresh process: the meter provider is set once per process. It exports to a loopback stand-in of
# Application Insights' ingestion endpoint, through the app's own root (function_app.root).
_EXPORT = """
import gzip, json, threading, http.server, os, sys
got = []
class Ingest(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        got.append(gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body)
        reply = json.dumps({"itemsReceived": 1, "itemsAccepted": 1, "errors": []}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(reply))); self.end_headers()
        self.wfile.write(reply)
    def log_message(self, *args): pass
server = http.server.HTTPServer(("127.0.0.1", 0), Ingest)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["APPLICATIONINSIGHTS_CONNECTION_STRING"] = (
    "InstrumentationKey=00000000-0000-0000-0000-000000000000;"
    f"IngestionEndpoint=http://127.0.0.1:{server.server_port}/")
import function_app
assert "azure.monitor.opentelemetry.exporter" not in sys.modules, "imported while the host indexes"
function_app.root()
from opentelemetry import metrics
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.telemetry import record_delivery
record_delivery("process_order", InboundMessage(message_id="m-1", body=None), Result(Outcome.CREATED), 1.0)
metrics.get_meter_provider().force_flush()
sent = b"".join(got).decode()
found = "consumer.deliveries" in sent and '"outcome": "created"' in sent.replace('":"', '": "')
print("deliveries" if found else sent[:300])
"""


def test_the_counters_reach_application_insights_from_the_first_invocation() -> None:
    env = {"PATH": "/usr/bin:/bin", "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true"}
    out = subprocess.run([sys.executable, "-c", _EXPORT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "deliveries", out.stdout


def test_without_application_insights_nothing_is_exported() -> None:
    assert export_to_azure_monitor({}) is False
