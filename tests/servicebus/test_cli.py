"""``python -m devservers.servicebus`` as a process: the ready line, serving the SDK, clean exit on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from devservers.servicebus import start_broker_process

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"UserConfig": {"Namespaces": [{"Name": "cli", "Queues": [{"Name": "orders"}]}]}}


def test_cli_prints_the_ready_line_serves_the_sdk_and_exits_zero_on_sigterm() -> None:
    with start_broker_process(CONFIG) as broker:
        assert broker.host == "127.0.0.1" and broker.port > 0
        with ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as client:
            with client.get_queue_sender("orders", keep_alive=0) as sender:
                sender.send_messages(ServiceBusMessage("over the wire"))
            [peeked] = client.get_queue_receiver("orders").peek_messages(1)
            assert str(peeked) == "over the wire"
        assert broker.process.stdout is not None
        assert broker.stop() == 0
        assert broker.process.stdout.closed or broker.process.stdout.read() == ""  # nothing after the line


def test_cli_exits_on_sigint_too(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    config.write_text(json.dumps(CONFIG))
    with subprocess.Popen(
        [sys.executable, "-m", "devservers.servicebus", "--config", str(config), "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:")
        process.send_signal(signal.SIGINT)
        stdout, _ = process.communicate(timeout=10)
        assert process.returncode == 0
        assert stdout == ""


def test_cli_rejects_an_invalid_config_with_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    bad = {
        "UserConfig": {"Namespaces": [{"Name": "x", "Queues": [{"Name": "q", "Properties": {"LockDuration": "1m"}}]}]}
    }
    config.write_text(json.dumps(bad))
    result = subprocess.run(
        [sys.executable, "-m", "devservers.servicebus", "--config", str(config), "--port", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Queues[0].Properties.LockDuration" in result.stderr and "ISO 8601" in result.stderr
