"""sbctl reads a queue's duplicate detection from the namespace's administration endpoint, as on the emulator.

The Service Bus emulator serves the administration API (ATOM over plain HTTP) on port 5300 of its host;
the local broker serves none. Here a small stand-in for that endpoint answers GET <queue> with the
queue's description, on 127.0.0.N:5300 (N = 2 + the xdist worker's number, so that workers do not
collide), beside a broker on the same address, so that the connection string is the emulator's kind.
What sbctl then does is observed through its command line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from devservers.servicebus import start_broker
from sbctl.cli import main
from tests.sbctl.queues import config, dead_letter, drain, queue, where

DESCRIPTIONS = {"dedup": ("true", "PT7M"), "plain": ("false", "PT10M")}
ENTRY = """<entry xmlns="http://www.w3.org/2005/Atom"><title type="text">{name}</title>
<content type="application/xml"><QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
xmlns:i="http://www.w3.org/2001/XMLSchema-instance"><LockDuration>PT30S</LockDuration>
<RequiresDuplicateDetection>{detects}</RequiresDuplicateDetection>
<DuplicateDetectionHistoryTimeWindow>{window}</DuplicateDetectionHistoryTimeWindow>
</QueueDescription></content></entry>"""


class _Administration(BaseHTTPRequestHandler):
    """GET /<queue>: the queue's description, as the emulator's administration endpoint answers it."""

    def do_GET(self) -> None:
        name = urlsplit(self.path).path.strip("/")
        detects, window = DESCRIPTIONS[name]
        body = ENTRY.format(name=name, detects=detects, window=window).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/atom+xml;type=entry;charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def conn(worker_id: str) -> Iterator[str]:
    host = f"127.0.0.{2 + (int(worker_id.removeprefix('gw')) if worker_id.startswith('gw') else 0)}"
    try:
        administration = ThreadingHTTPServer((host, 5300), _Administration)
    except OSError as exc:
        pytest.skip(f"cannot listen on {host}:5300 for the emulator's administration endpoint: {exc}")
    threading.Thread(target=administration.serve_forever, daemon=True).start()
    brokered = config(queue("dedup", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT7M"),
                      queue("plain"))
    try:
        with start_broker(brokered, host=host) as broker:
            yield broker.connection_string
    finally:
        administration.shutdown()
        administration.server_close()


def test_the_window_is_read_from_the_queue(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "--queue", "dedup", "--generate", "2", "--duplicates", "1", "--connection-string", conn]) == 0
    [warning] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sbctl: warning:")]
    assert "within PT7M (the queue's properties)" in warning and "assumed" not in warning
    assert len(drain(conn, "dedup")) == 2


def test_a_queue_without_duplicate_detection_holds_nothing_back(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "--queue", "plain", "--generate", "2", "--duplicates", "1", "--connection-string", conn]) == 0
    assert "warning" not in capsys.readouterr().err
    drain(conn, "plain")
    dead_letter(conn, "plain", [("p-1", "DownstreamRejected")])
    assert main(["dlq", "resubmit", "--queue", "plain", "--connection-string", conn]) == 0
    assert "note" not in capsys.readouterr().err
    assert where(conn, "plain", "p-1") == ["queue"]


def test_the_queue_s_own_window_overrules_the_option(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "resubmit", "--queue", "dedup", "--dry-run", "--detection-window", "PT1S",
                 "--connection-string", conn]) == 3
    assert "'dedup' has duplicate detection PT7M (the queue's properties); that is used" in capsys.readouterr().err
