"""sbctl parked against the local Cosmos server: list, drop and release what the consumer parked.

The tests set up and read back through the app's async Cosmos adapter, on the session's loop; sbctl
runs each command on an event loop of its own (asyncio.run), as it does from the shell.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from azure.cosmos import PartitionKey

from idempotent_consumer.adapters.cosmos import CosmosStore
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ports.store import Replace, query_all
from idempotent_consumer.reports import report_stuck
from sbctl.cli import main
from shared.domain.documents import OrderDocument
from shared.domain.lifecycle import ORDER_CANCELLED, ORDER_SHIPPED, PAYMENT_CAPTURED
from shared.domain.orders import parse_order
from shared.handlers.apply_event import apply_order_event
from shared.settings import Settings
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body

T = TypeVar("T")


@dataclass
class Target:
    """The database sbctl is pointed at, and the app's adapter on its container, used on ``loop``."""

    endpoint: CosmosEndpoint
    database: str
    store: CosmosStore
    loop: asyncio.Runner

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)


@pytest.fixture(scope="module")
def target(cosmos_endpoint: CosmosEndpoint, loop: asyncio.Runner) -> Iterator[Target]:
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"parked-{uuid.uuid4().hex[:8]}")
    database.create_container_if_not_exists("orders", PartitionKey(path="/orderId"), default_ttl=-1)
    store = CosmosStore.from_settings(Settings(
        cosmos_endpoint=cosmos_endpoint.url, cosmos_key=cosmos_endpoint.key,
        cosmos_verify_tls=cosmos_endpoint.verify_tls, cosmos_database=database.id, cosmos_container="orders",
    ))
    try:
        yield Target(cosmos_endpoint, database.id, store, loop)
    finally:
        loop.run(store.close())
        client.delete_database(database.id)


def cli(target: Target, *args: str, command: str = "parked") -> int:
    endpoint = target.endpoint
    options = ["--cosmos-endpoint", endpoint.url, "--cosmos-key", endpoint.key, "--database", target.database]
    if not endpoint.verify_tls:
        options.append("--no-verify-tls")
    return main([command, *args, *options])


def park(target: Target, order_id: str, sequence: int, event_type: str) -> str:
    body = event_body(order_id, sequence, event_type)
    message = InboundMessage(message_id=body["id"], body=encode_event(body), session_id=order_id)
    assert target.run(apply_order_event(message, target.store, Settings())).outcome.value == "parked"
    return str(body["id"])


def parked_and_rewritten(target: Target, order_id: str, rewrite: Callable[[dict[str, Any]], dict[str, Any]]
                         ) -> dict[str, Any]:
    """An OrderShipped parked against the order, then its document rewritten on its etag, as another version would
    write it (``rewrite`` of its body, the store's fields left out); the parked document as this release wrote it."""
    park(target, order_id, 3, ORDER_SHIPPED)
    [parked] = target.run(query_all(target.store, {"type": "parked-event"}, partition_key=order_id))
    body = {k: v for k, v in parked.items() if not k.startswith("_")}
    target.run(target.store.execute_batch(order_id, [Replace(rewrite(body), parked["_etag"])]))
    return dict(parked)


def placed(target: Target) -> str:
    order_id = f"ord-{uuid.uuid4()}"
    message = inbound(order_body(order_id))
    target.run(target.store.create(OrderDocument.placed(parse_order(message), message, "h").to_document()))
    return order_id


def test_list_shows_parked_events_and_exits_3_when_none(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id = placed(target)
    assert cli(target, "list", "--order", order_id) == 3
    event_id = park(target, order_id, 3, ORDER_SHIPPED)
    assert cli(target, "list", "--order", order_id) == 0
    out = capsys.readouterr().out
    assert order_id in out and event_id in out and "OrderShipped" in out and "parked" in out


def test_drop_keeps_the_event_marked_dropped_and_uncounted(target: Target) -> None:
    store = target.store
    order_id = placed(target)
    event_id = park(target, order_id, 3, ORDER_CANCELLED)
    assert cli(target, "drop", "--order", order_id, "--event", event_id) == 0
    [dropped] = [d for d in target.run(query_all(store, {"type": "parked-event"}, partition_key=order_id))]
    assert (dropped["status"], dropped["eventId"]) == ("dropped", event_id)
    assert target.run(store.read(order_id, order_id))["parked"] == 0


def test_release_applies_the_event_past_its_missing_predecessor_then_what_waits_behind_it(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id = placed(target)
    third = park(target, order_id, 3, PAYMENT_CAPTURED)
    park(target, order_id, 4, ORDER_SHIPPED)
    assert cli(target, "release", "--order", order_id, "--event", third) == 0
    assert "released versions [3, 4]" in capsys.readouterr().out
    order = target.run(target.store.read(order_id, order_id))
    assert (order["version"], order["status"], order["parked"]) == (4, "shipped", 0)


def test_release_of_an_event_not_parked_is_one_clear_error(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id = placed(target)
    assert cli(target, "release", "--order", order_id, "--event", "nope") == 1
    err = capsys.readouterr().err
    assert err.startswith("sbctl: error: ") and "no event nope waits parked" in err and "Traceback" not in err


def test_a_parked_event_this_version_cannot_decode_is_one_line_naming_it_and_the_schema_versions(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id = placed(target)
    parked = parked_and_rewritten(target, order_id, lambda d: d | {"schemaVersion": 2, "sequence": "third"})
    assert cli(target, "list", "--order", order_id) == 1
    err = one_line_error(capsys)
    assert parked["id"] in err and "schemaVersion 2" in err and "newer version" in err


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("sbctl: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_tls_against_the_plain_http_server_is_one_line_saying_use_http(
    cosmos_endpoint: CosmosEndpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    if not cosmos_endpoint.local:
        pytest.skip("the local server speaks plain HTTP; another endpoint may not")
    https = cosmos_endpoint.url.replace("http://", "https://")
    assert main(["parked", "list", "--cosmos-endpoint", https, "--cosmos-key", cosmos_endpoint.key]) == 1
    err = one_line_error(capsys)
    assert f"Cosmos DB at {https}" in err and f"use {cosmos_endpoint.url}" in err


def test_a_server_that_is_not_running_and_a_bad_key_are_one_line_each(
    cosmos_endpoint: CosmosEndpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    assert main(["parked", "list", "--cosmos-endpoint", closed, "--cosmos-key", cosmos_endpoint.key]) == 1
    assert "connection refused, nothing listens there" in one_line_error(capsys)
    assert main(["parked", "list", "--cosmos-endpoint", cosmos_endpoint.url, "--cosmos-key", "not-base64!"]) == 1
    assert "the account key (--cosmos-key) is not valid base64" in one_line_error(capsys)


def test_index_backfill_sets_due_on_what_the_release_before_wrote_and_the_stuck_report_then_finds_it(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id = placed(target)
    # As the release before wrote it: no due. The stuck report, which asks by type and due, misses it.
    parked = parked_and_rewritten(target, order_id, lambda d: {k: v for k, v in d.items() if k != "due"})
    assert parked["due"] == parked["parkedAt"]  # this release's park set it
    later = parked["parkedAt"] + 10 ** 6
    report = target.run(report_stuck(target.store, consumer="order-projection", now=later, parked_after=1,
                                      stuck_after=1))
    assert parked["id"] not in {event.id for event in report.parked}
    assert cli(target, "backfill", command="index") == 0
    assert "parked-event set: 1" in capsys.readouterr().out
    [after] = target.run(query_all(target.store, {"type": "parked-event"}, partition_key=order_id))
    assert after["due"] == parked["parkedAt"] and after["status"] == "parked"
    report = target.run(report_stuck(target.store, consumer="order-projection", now=later, parked_after=1,
                                      stuck_after=1))
    assert parked["id"] in {event.id for event in report.parked}
    assert cli(target, "backfill", command="index") == 0  # once is enough: nothing left to set
    assert "parked-event set" not in capsys.readouterr().out
