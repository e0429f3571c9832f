"""``python -m devservers.servicebus`` as a process: the ready line, serving the SDK, clean exit on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from devservers.servicebus import connection_string, start_broker_process
from tests.devservers.helptext import options_without_help

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


def run_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devservers.servicebus", *arguments], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=30, check=False)


def test_a_max_message_size_outside_the_premium_range_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    queue = {"Name": "q", "Properties": {"MaxMessageSizeInKilobytes": 256}}
    config.write_text(json.dumps({"UserConfig": {"Namespaces": [{"Name": "x", "Queues": [queue]}]}}))
    result = run_cli("--config", str(config), "--port", "0")
    assert result.returncode == 2 and result.stdout == ""
    assert "Queues[0].Properties.MaxMessageSizeInKilobytes: expected an integer from 1024 to 102400" in result.stderr


def test_a_port_in_use_is_one_line_naming_the_port(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    config.write_text(json.dumps(CONFIG))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--config", str(config), "--port", str(port))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: port {port} on 127.0.0.1 is in use (another broker, or the Service Bus "
                             "emulator?); stop that, or choose another --port (0 = any free)\n")


def test_a_port_out_of_range_is_bad_usage(tmp_path: Path) -> None:
    result = run_cli("--config", str(tmp_path / "unused.json"), "--port", "70000")
    assert result.returncode == 2 and "70000 is not a port" in result.stderr and "Traceback" not in result.stderr


def test_a_config_that_is_not_utf8_is_one_line_naming_the_line(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    config.write_bytes(b'{"UserConfig": {"Namespaces": [\n{"Name": "caf\xe9", "Queues": []}]}}\n')
    result = run_cli("--config", str(config), "--port", "0")
    assert result.returncode == 2
    assert result.stderr == f"error: {config}:2: not UTF-8 (byte 0xe9); save it as UTF-8\n"


def test_verbose_logs_one_line_per_request_and_never_a_payload(tmp_path: Path) -> None:
    config = tmp_path / "Config.json"
    config.write_text(json.dumps(
        {"UserConfig": {"Namespaces": [{"Name": "cli", "Queues": [
            {"Name": "orders", "Properties": {"RequiresDuplicateDetection": True}}]}]}}))
    with subprocess.Popen(
        [sys.executable, "-m", "devservers.servicebus", "--config", str(config), "--port", "0", "--verbose"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as process:
        assert process.stdout is not None
        address = process.stdout.readline().removeprefix("listening on ").strip()
        host, _, port = address.rpartition(":")
        with ServiceBusClient.from_connection_string(connection_string(host, int(port)), retry_total=0) as client:
            with client.get_queue_sender("orders", keep_alive=0) as sender:
                sender.send_messages([ServiceBusMessage("secret payload", message_id="m-1"),
                                      ServiceBusMessage("secret payload", message_id="m-1")])
            with client.get_queue_receiver("orders") as receiver:
                [message] = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                receiver.dead_letter_message(message, reason="Test")
            with client.get_queue_receiver("orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
                assert len(receiver.peek_messages(max_message_count=5)) == 1
            with pytest.raises(MessagingEntityNotFoundError), client.get_queue_receiver("missing") as receiver:
                receiver.peek_messages(max_message_count=1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    requests = [line.split("devservers.servicebus.requests: ", 1)[1] for line in stderr.splitlines()
                if "devservers.servicebus.requests: " in line]
    for expected in ("attach sender orders: open", "send orders: 1 accepted, 1 duplicate(s) dropped",
                     "attach receiver orders (peek-lock): open", "deliver orders #1 m-1: locked",
                     "dead-letter orders #1 m-1: ok", "peek-message orders/$DeadLetterQueue/$management: 200"):
        assert expected in requests, requests
    assert any(r.startswith("attach receiver missing: refused amqp:not-found") for r in requests), requests
    assert "secret payload" not in stderr


def test_without_verbose_there_are_no_request_lines() -> None:
    with start_broker_process(CONFIG) as broker:
        with (ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as client,
              client.get_queue_sender("orders", keep_alive=0) as sender):
            sender.send_messages(ServiceBusMessage("quiet"))
        assert broker.stop() == 0
        assert "devservers.servicebus.requests" not in broker.stderr_text()


def test_every_option_has_help_and_an_example() -> None:
    result = run_cli("--help")
    assert result.returncode == 0 and "example:\n  python -m devservers.servicebus --config" in result.stdout
    assert options_without_help(result.stdout) == []
