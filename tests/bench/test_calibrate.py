"""``python -m bench.calibrate`` against the local Cosmos server: every row measured and priced, the written
documents removed, and a server that charges a flat 1 RU said to be no calibration. On an account the same
command prints the charges the model does not publish beside its own."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from azure.cosmos import PartitionKey

from bench import calibrate
from tests.devservers.helptext import run_module
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client


@pytest.fixture
def container(cosmos_endpoint: CosmosEndpoint) -> Iterator[tuple[CosmosEndpoint, str]]:
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists("calibrate-tests")
    database.create_container_if_not_exists("orders", partition_key=PartitionKey(path=calibrate.PARTITION))
    yield cosmos_endpoint, "orders"


def test_every_operation_is_measured_beside_the_model_and_nothing_is_left(
        container: tuple[CosmosEndpoint, str], capsys: pytest.CaptureFixture[str]) -> None:
    endpoint, name = container
    assert calibrate.main(["--endpoint", endpoint.url, "--key", endpoint.key, "--database", "calibrate-tests",
                           "--container", name]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == [
        "create, 5 terms by default", "create, 9 terms by default", "create, 23 terms by default",
        "replace, one property changed", "patch, 1 property", "patch, 2 properties", "point read",
        "batch refused whole (409)", "delete, create-3", "delete, create-7", "delete, create-21"]
    # The model: 5 RU + 0.2 a term for a create up to 1 KB; a patch is the replace plus 0.4 a property set.
    assert "| create, 9 terms by default | 9 | 6.80 |" in table
    assert "| patch, 1 property | 2 | 11.20 |" in table and "| batch refused whole (409) | - | not published |" in table
    if endpoint.local:
        assert "a local server's flat charge, not a calibration" in table
    left = make_cosmos_client(endpoint).get_database_client("calibrate-tests").get_container_client(name)
    assert not list(left.query_items("SELECT * FROM c WHERE STARTSWITH(c.orderId, 'calibrate-')",
                                     enable_cross_partition_query=True))


def test_a_temporary_container_is_removed_after(cosmos_endpoint: CosmosEndpoint) -> None:
    run = run_module("bench.calibrate", "--endpoint", cosmos_endpoint.url, "--key", cosmos_endpoint.key,
                     "--database", "calibrate-temporary")
    assert run.returncode == 0, run.stderr
    assert "a temporary container (default policy)" in run.stdout
    database = make_cosmos_client(cosmos_endpoint).get_database_client("calibrate-temporary")
    assert not [c["id"] for c in database.list_containers() if c["id"].startswith("calibrate-")]


def test_failures_are_one_line_and_bad_usage_exit_2() -> None:
    with socket.socket() as held:  # bound, not listening: refuses every connection
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        unreachable = run_module("bench.calibrate", "--endpoint", url, "--key", "a2V5")
    assert unreachable.returncode == 1 and unreachable.stderr.count("\n") == 1
    assert f"cannot reach Cosmos DB at {url}" in unreachable.stderr and "Traceback" not in unreachable.stderr
    bad_key = run_module("bench.calibrate", "--endpoint", url, "--key", "x")
    assert bad_key.returncode == 1 and "check --key" in bad_key.stderr and "Traceback" not in bad_key.stderr
    usage = run_module("bench.calibrate", "--endpoint", url)
    assert usage.returncode == 2 and "name an existing --container" in usage.stderr
