"""One contract for the fulfilment port: the in-memory fake and the HTTP adapter against a real server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devservers.fulfilment import FulfilmentServer
from shared.adapters.http import HttpFulfilment
from shared.adapters.memory import InMemoryFulfilment
from shared.errors import DownstreamUnavailable
from shared.handlers.place_order import effect_reply
from shared.handlers.side_effects import ReplyKind
from shared.ports.fulfilment import FulfilmentService


@pytest.fixture(scope="module")
def server() -> Iterator[FulfilmentServer]:
    with FulfilmentServer() as running:
        yield running


@pytest.fixture(params=["memory", "http"])
def service(request: pytest.FixtureRequest) -> FulfilmentService:
    if request.param == "memory":
        return InMemoryFulfilment()
    url = request.getfixturevalue("server").url
    return HttpFulfilment(url, connect_timeout=2, read_timeout=2)


def request_for(order_id: str) -> dict:
    return {"orderId": order_id, "items": [{"sku": "SKU-1", "quantity": 2}]}


def test_first_reservation_is_created_with_an_id(service: FulfilmentService) -> None:
    reply = service.reserve(f"key-{uuid.uuid4()}", request_for("o-1"))
    assert reply.status == 201 and effect_reply(reply).kind is ReplyKind.SUCCEEDED
    assert reply.body["reservationId"]


def test_repeat_with_the_same_key_returns_the_same_reservation(service: FulfilmentService) -> None:
    key = f"key-{uuid.uuid4()}"
    first = service.reserve(key, request_for("o-1"))
    again = service.reserve(key, request_for("o-1"))
    assert effect_reply(again).kind is ReplyKind.SUCCEEDED
    assert again.body["reservationId"] == first.body["reservationId"]


def test_same_key_with_another_request_is_refused_permanently(service: FulfilmentService) -> None:
    key = f"key-{uuid.uuid4()}"
    service.reserve(key, request_for("o-1"))
    reply = service.reserve(key, request_for("o-2"))
    assert reply.status == 422 and effect_reply(reply).kind is ReplyKind.REJECTED
    assert reply.body["reason"]


def test_unreachable_service_raises_downstream_unavailable() -> None:
    with FulfilmentServer() as closing:
        url = closing.url
    with pytest.raises(DownstreamUnavailable):
        HttpFulfilment(url, connect_timeout=1, read_timeout=1).reserve("k", request_for("o"))


def test_slow_service_times_out_as_downstream_unavailable(server: FulfilmentServer) -> None:
    server.stall_next(1.5)
    with pytest.raises(DownstreamUnavailable):
        HttpFulfilment(server.url, connect_timeout=1, read_timeout=0.3).reserve(f"k-{uuid.uuid4()}", request_for("o"))
