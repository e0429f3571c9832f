"""One contract for the fulfilment port: the in-memory fake and the HTTP adapter against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from devservers.fulfilment import FulfilmentServer
from idempotent_consumer.errors import DownstreamUnavailable
from idempotent_consumer.outcomes import is_transient
from shared.adapters.http import HttpFulfilment
from shared.adapters.memory import InMemoryFulfilment
from shared.ports.fulfilment import FulfilmentService


@pytest.fixture(scope="module")
def server() -> Iterator[FulfilmentServer]:
    with FulfilmentServer() as running:
        yield running


@pytest.fixture
def http(loop: asyncio.Runner) -> Iterator[Callable[[str, float, float], HttpFulfilment]]:
    """Make HTTP adapters (url, connect timeout, read timeout); their sessions are closed after the test."""
    made: list[HttpFulfilment] = []

    def make(url: str, connect_timeout: float, read_timeout: float) -> HttpFulfilment:
        made.append(HttpFulfilment(url, connect_timeout=connect_timeout, read_timeout=read_timeout))
        return made[-1]

    yield make
    for client in made:
        loop.run(client.close())


@pytest.fixture(params=["memory", "http"])
def service(request: pytest.FixtureRequest) -> FulfilmentService:
    if request.param == "memory":
        return InMemoryFulfilment()
    make: Callable[[str, float, float], HttpFulfilment] = request.getfixturevalue("http")
    return make(request.getfixturevalue("server").url, 2, 2)


def request_for(order_id: str) -> dict:
    return {"orderId": order_id, "items": [{"sku": "SKU-1", "quantity": 2}]}


def test_first_reservation_is_created_with_an_id(service: FulfilmentService, loop: asyncio.Runner) -> None:
    reply = loop.run(service.reserve(f"key-{uuid.uuid4()}", request_for("o-1")))
    assert reply.status == 201 and not is_transient(reply.status)
    assert reply.reference and reply.reference == reply.body["reservationId"]


def test_repeat_with_the_same_key_returns_the_same_reservation(
    service: FulfilmentService, loop: asyncio.Runner
) -> None:
    key = f"key-{uuid.uuid4()}"
    first = loop.run(service.reserve(key, request_for("o-1")))
    again = loop.run(service.reserve(key, request_for("o-1")))
    assert 200 <= again.status < 300
    assert again.reference == first.reference is not None


def test_same_key_with_another_request_is_refused_permanently(service: FulfilmentService, loop: asyncio.Runner) -> None:
    key = f"key-{uuid.uuid4()}"
    loop.run(service.reserve(key, request_for("o-1")))
    reply = loop.run(service.reserve(key, request_for("o-2")))
    assert reply.status == 422 and not is_transient(reply.status)
    assert reply.reason and reply.reason == reply.body["reason"]
    assert reply.refusal is None  # a refusal of the key, not of the order


def test_an_order_out_of_stock_is_refused_for_good_and_a_repeat_is_refused_alike(
    service: FulfilmentService, loop: asyncio.Runner
) -> None:
    key, request = f"key-{uuid.uuid4()}", {"orderId": "o-1", "items": [{"sku": "SOLDOUT-1", "quantity": 1}]}
    first = loop.run(service.reserve(key, request))
    again = loop.run(service.reserve(key, request))
    assert (first.status, first.refusal, first.reason) == (422, "out-of-stock", "SOLDOUT-1 is out of stock")
    assert (again.status, again.refusal, again.reason) == (first.status, first.refusal, first.reason)
    assert first.reference is None


def test_unreachable_service_raises_downstream_unavailable(
    http: Callable[[str, float, float], HttpFulfilment], loop: asyncio.Runner
) -> None:
    with FulfilmentServer() as closing:
        url = closing.url
    with pytest.raises(DownstreamUnavailable) as raised:
        loop.run(http(url, 1, 1).reserve("k", request_for("o")))
    assert not raised.value.slow  # a sign of an outage, which the breaker counts


def test_slow_service_times_out_as_downstream_unavailable(
    server: FulfilmentServer, http: Callable[[str, float, float], HttpFulfilment], loop: asyncio.Runner
) -> None:
    server.stall_next(1.5)
    with pytest.raises(DownstreamUnavailable) as raised:
        loop.run(http(server.url, 1, 0.3).reserve(f"k-{uuid.uuid4()}", request_for("o")))
    assert raised.value.slow  # it took the request: up, and perhaps still working on it


def test_a_lost_answer_raises_downstream_unavailable(
    server: FulfilmentServer, http: Callable[[str, float, float], HttpFulfilment], loop: asyncio.Runner
) -> None:
    server.lose_next()
    with pytest.raises(DownstreamUnavailable) as raised:
        loop.run(http(server.url, 1, 1).reserve(f"k-{uuid.uuid4()}", request_for("o")))
    assert not raised.value.slow


@contextlib.contextmanager
def answering(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback listener whose one connection, once the request is read, gets ``answer``; its URL."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            with contextlib.suppress(OSError):
                connection, _ = listener.accept()
                with connection:
                    connection.recv(65536)
                    answer(connection)

        threading.Thread(target=serve, daemon=True).start()
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def not_http(connection: socket.socket) -> None:
    connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")


def trickle(connection: socket.socket) -> None:
    """201, then the body one byte every 0.1 s, for 10 s."""
    body = b'{"reservationId": "res-1"}'.ljust(100)
    connection.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                       % len(body))
    for byte in body:
        connection.sendall(bytes([byte]))
        time.sleep(0.1)


def test_an_answer_that_is_not_http_raises_downstream_unavailable(
    http: Callable[[str, float, float], HttpFulfilment], loop: asyncio.Runner
) -> None:
    with answering(not_http) as url, pytest.raises(DownstreamUnavailable) as raised:
        loop.run(http(url, 1, 1).reserve("k", request_for("o")))
    assert not raised.value.slow


def test_an_answer_that_trickles_past_both_timeouts_raises_downstream_unavailable(
    http: Callable[[str, float, float], HttpFulfilment], loop: asyncio.Runner
) -> None:
    # Each byte comes well inside the read timeout, so only a bound on the whole call ends it: without
    # one the call would answer 201 after 10 s, long past connect + read.
    with answering(trickle) as url, pytest.raises(DownstreamUnavailable) as raised:
        loop.run(http(url, 0.2, 0.3).reserve("k", request_for("o")))
    assert raised.value.slow
