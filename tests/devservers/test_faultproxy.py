"""The fault proxy does to the real azure-cosmos SDK what each fault kind says, and counts it.

Each test checks the outcome at the server behind the proxy (read directly, not through it), so a
kind that forwarded when it should not, or dropped a write it should have made, fails here.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.cosmos import ContainerProxy, PartitionKey, exceptions

from devservers._child import start_until_listening, stop
from devservers.faultproxy import FaultProxy, Kind, RandomFaults, fault_proxy
from tests.devservers.helptext import REPO_ROOT, options_without_help, run_module, run_on_taken_port
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client

pytestmark = pytest.mark.cosmos

DOCS = r"/docs/?$"


@pytest.fixture
def direct(cosmos_endpoint: CosmosEndpoint) -> Iterator[ContainerProxy]:
    if not cosmos_endpoint.url.lower().startswith("http://"):
        pytest.skip("the fault proxy forwards plain HTTP; COSMOS_TEST_ENDPOINT is not http://")
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database(f"proxy-{uuid.uuid4().hex[:8]}")
    database.create_container("orders", partition_key=PartitionKey(path="/orderId"))
    yield database.get_container_client("orders")
    client.delete_database(database)


@pytest.fixture
def proxy(cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy) -> Iterator[FaultProxy]:
    with fault_proxy(cosmos_endpoint.url) as running:
        yield running


def _through(url: str, endpoint: CosmosEndpoint, direct: ContainerProxy, **options: object) -> ContainerProxy:
    """The container ``direct`` names, reached at ``url`` (the proxy) instead of the endpoint."""
    client = make_cosmos_client(dataclasses.replace(endpoint, url=url), **options)
    database_id = direct.container_link.split("/")[1]  # dbs/<database>/colls/orders
    return client.get_database_client(database_id).get_container_client("orders")


def _doc() -> dict[str, str]:
    order_id = uuid.uuid4().hex
    return {"id": order_id, "orderId": order_id}


def _stored(direct: ContainerProxy, doc: dict[str, str]) -> bool:
    try:
        direct.read_item(doc["id"], partition_key=doc["orderId"])
    except exceptions.CosmosResourceNotFoundError:
        return False
    return True


def test_throttle_answers_429_with_retry_after_and_the_sdk_retries(
    proxy: FaultProxy, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    fault = proxy.inject("POST", DOCS, Kind.THROTTLE, count=2)
    doc = _doc()
    _through(proxy.url, cosmos_endpoint, direct).create_item(doc)
    assert fault.hits == 2 and proxy.counts == {"throttle": 2}
    assert _stored(direct, doc)


def test_unavailable_answers_503_and_forwards_nothing(
    proxy: FaultProxy, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    proxy.inject("POST", DOCS, Kind.UNAVAILABLE, count=None)
    doc = _doc()
    with pytest.raises(exceptions.CosmosHttpResponseError) as caught:
        _through(proxy.url, cosmos_endpoint, direct, retry_total=0).create_item(doc)
    assert caught.value.status_code == 503
    assert not _stored(direct, doc)


def test_reset_drops_the_request_before_it_reaches_the_server(
    proxy: FaultProxy, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    proxy.inject("POST", DOCS, Kind.RESET, count=None)
    doc = _doc()
    with pytest.raises((ServiceRequestError, ServiceResponseError)):
        _through(proxy.url, cosmos_endpoint, direct, retry_total=0).create_item(doc)
    assert not _stored(direct, doc)
    assert proxy.counts["reset"] >= 1


def test_lose_response_makes_the_write_and_withholds_the_answer(
    proxy: FaultProxy, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    proxy.inject("POST", DOCS, Kind.LOSE_RESPONSE, count=None)
    doc = _doc()
    with pytest.raises((ServiceRequestError, ServiceResponseError)):
        _through(proxy.url, cosmos_endpoint, direct, retry_total=0).create_item(doc)
    assert _stored(direct, doc)  # it took effect; the client cannot tell


def test_delay_forwards_after_the_pause(
    proxy: FaultProxy, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    fault = proxy.inject("POST", DOCS, Kind.DELAY)
    doc = _doc()
    _through(proxy.url, cosmos_endpoint, direct).create_item(doc)
    assert fault.hits == 1 and _stored(direct, doc)


@pytest.mark.parametrize(("stage", "stored"), [("before", False), ("after", True)])
def test_a_tap_resets_before_the_write_or_after_it_took_effect(
    stage: str, stored: bool, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    seen: list[tuple[str, int | None]] = []

    def tap(method: str, path: str, headers: object, body: bytes, status: int | None) -> bool:
        seen.append((method, status))
        return method == "POST" and (status is None) == (stage == "before")

    doc = _doc()
    with fault_proxy(cosmos_endpoint.url, tap=tap) as running, pytest.raises(
            (ServiceRequestError, ServiceResponseError)):
        _through(running.url, cosmos_endpoint, direct, retry_total=0).create_item(doc)
    assert _stored(direct, doc) is stored
    assert ("POST", None) in seen and (("POST", 201) in seen) is stored
    assert running.counts == {}  # a tap is the caller's doing, not a counted fault


def test_random_faults_follow_the_seed_and_the_rates() -> None:
    rates = {Kind.THROTTLE: 0.2, Kind.LOSE_RESPONSE: 0.1}
    first = RandomFaults(7, rates).draw("POST")
    plan = RandomFaults(7, rates)
    draws = [plan.draw("POST") for _ in range(2000)]
    again = RandomFaults(7, rates)
    assert draws == [again.draw("POST") for _ in range(2000)]
    assert first == draws[0]
    assert 300 <= draws.count(Kind.THROTTLE) <= 500 and 120 <= draws.count(Kind.LOSE_RESPONSE) <= 280
    assert draws.count(None) >= 1200
    posts_only = RandomFaults(7, {Kind.RESET: 1.0}, methods=frozenset({"POST"}))
    assert posts_only.draw("GET") is None and posts_only.draw("POST") is Kind.RESET
    with pytest.raises(ValueError, match="more than 1"):
        RandomFaults(1, {Kind.RESET: 0.7, Kind.DELAY: 0.5})


def test_random_faults_reach_the_wire_and_are_counted(
    cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    plan = RandomFaults(11, {Kind.THROTTLE: 0.5}, methods=frozenset({"POST"}))
    with fault_proxy(cosmos_endpoint.url, random_faults=plan) as running:
        container = _through(running.url, cosmos_endpoint, direct)
        docs = [_doc() for _ in range(20)]
        for doc in docs:
            container.create_item(doc)
    assert all(_stored(direct, doc) for doc in docs)
    assert running.counts["throttle"] >= 3


def test_the_process_injects_random_faults_and_reports_them_by_kind(
    cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    command = [sys.executable, "-m", "devservers.faultproxy", "--upstream", cosmos_endpoint.url,
               "--rate", "throttle=0.5", "--seed", "3", "--writes-only"]
    process, url, stderr = start_until_listening(command, startup_timeout=30, cwd=REPO_ROOT)
    try:
        container = _through(url, cosmos_endpoint, direct)
        docs = [_doc() for _ in range(10)]
        for doc in docs:
            container.create_item(doc)
        assert stop(process, 10) == 0
        stderr.seek(0)
        report = stderr.read().decode()
    finally:
        stop(process, 5)
        stderr.close()
    assert all(_stored(direct, doc) for doc in docs)
    assert re.fullmatch(r"faults injected: throttle=\d+ \(of \d+ requests\)\n", report), report
    assert int(report.split("throttle=")[1].split()[0]) >= 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--rate", "explode=0.1"], "is not KIND=PROBABILITY with KIND one of throttle"),
        (["--rate", "reset=1.5"], "the probability must be between 0 and 1"),
        (["--rate", "reset=0.7", "--rate", "delay=0.5"], "more than 1"),
        (["--upstream", "https://localhost:8081"], "give a plain-HTTP endpoint"),
    ],
)
def test_bad_usage_is_one_line_and_exit_status_2(arguments: list[str], message: str) -> None:
    result = run_module("devservers.faultproxy", "--upstream", "http://127.0.0.1:1", *arguments)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line_naming_the_port() -> None:
    port, result = run_on_taken_port("devservers.faultproxy", "--upstream", "http://127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port} (") and result.stderr.count("\n") == 1


def test_every_option_has_help_and_an_example() -> None:
    result = run_module("devservers.faultproxy", "--help")
    assert result.returncode == 0 and "example:\n  python -m devservers.faultproxy --upstream" in result.stdout
    assert options_without_help(result.stdout) == []


def test_an_outage_refuses_every_request_with_503_for_its_time_then_lets_them_through(
    proxy: FaultProxy, cosmos_endpoint: CosmosEndpoint, direct: ContainerProxy
) -> None:
    container = _through(proxy.url, cosmos_endpoint, direct, retry_total=0)
    doc = _doc()
    proxy.outage(1.5)
    for call in (lambda: container.create_item(doc), lambda: container.read_item("x", partition_key="x")):
        with pytest.raises(exceptions.CosmosHttpResponseError) as caught:
            call()
        assert caught.value.status_code == 503
    assert not _stored(direct, doc) and proxy.counts["outage"] >= 2
    time.sleep(1.6)
    container.create_item(doc)
    assert _stored(direct, doc)
