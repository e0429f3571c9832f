"""``python -m devservers.cosmos`` as a process: one line per request with --verbose, one-line errors."""

from __future__ import annotations

import select
import signal
import subprocess
import sys

import pytest
from azure.cosmos import CosmosClient, PartitionKey, exceptions

from devservers.cosmos import EMULATOR_KEY
from tests.devservers.helptext import REPO_ROOT, options_without_help, run_module, run_on_taken_port


def test_verbose_logs_one_line_per_request_and_never_a_body() -> None:
    with subprocess.Popen([sys.executable, "-m", "devservers.cosmos", "--port", "0", "--verbose"], cwd=REPO_ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready, "no ready line within 30 s"
        endpoint = process.stdout.readline().removeprefix("listening on ").strip()
        client = CosmosClient(endpoint, credential=EMULATOR_KEY, enable_endpoint_discovery=False)
        container = client.create_database("logged").create_container("orders", PartitionKey(path="/orderId"))
        container.create_item({"id": "o-1", "orderId": "o-1", "secret": "payload-text"})
        list(container.query_items("SELECT * FROM c", partition_key="o-1"))
        with pytest.raises(exceptions.CosmosResourceNotFoundError):
            container.read_item("missing", partition_key="missing")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    lines = stderr.splitlines()
    for operation, method, path, status in [("create", "POST", "/dbs", "201"),
                                            ("create", "POST", "/dbs/logged/colls/orders/docs", "201"),
                                            ("query", "POST", "/dbs/logged/colls/orders/docs", "200"),
                                            ("read", "GET", "/dbs/logged/colls/orders/docs/missing", "404")]:
        assert any(line.split()[1:5] == [operation, method, path, status] for line in lines), lines
    assert "payload-text" not in stderr


def test_a_port_in_use_is_one_line_naming_the_port() -> None:
    port, result = run_on_taken_port("devservers.cosmos")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"error: port {port} on 127.0.0.1 is in use (another Cosmos server, or the "
                             "emulator?); stop that, or choose another --port (0 = any free)\n")


def test_every_option_has_help_and_an_example() -> None:
    result = run_module("devservers.cosmos", "--help")
    assert result.returncode == 0 and "example:\n  python -m devservers.cosmos --port" in result.stdout
    assert options_without_help(result.stdout) == []


def test_measure_prints_ms_per_operation_for_each_size() -> None:
    result = run_module("devservers.cosmos.measure", "--sizes", "0,40", "--budget", "1")
    assert result.returncode == 0, result.stderr
    header, rule, *rows = result.stdout.splitlines()
    assert header == "| ms per operation | 0 docs | 40 docs |" and rule == "| --- | ---: | ---: |"
    assert [row.split(" | ")[0] for row in rows] == [
        "| point read", "| create", "| batch of 3", "| partition query", "| cross-partition targeted query",
        "| SELECT VALUE COUNT(1) ... type = 'order'", "| full read, pages of 1,000"]
    assert all(float(cell) >= 0 for row in rows for cell in row.strip("| ").split(" | ")[1:])
    assert options_without_help(run_module("devservers.cosmos.measure", "--help").stdout) == []
