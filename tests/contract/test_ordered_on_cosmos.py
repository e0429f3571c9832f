"""The ordered mode of a library consumer on the real SDK and the local Cosmos server, in a container partitioned by
``/parcelId``: events before their parcel parked and counted on its placeholder, released in the first event's
batch, the placeholder's foreign fields kept; copies and other content under an event's id. The same machine as
tests/unit/test_ordered_consumer.py, which runs it on the in-memory store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.cosmos import ContainerProxy, PartitionKey

from idempotent_consumer.adapters.cosmos import CosmosStore
from idempotent_consumer.functions import Consumer
from idempotent_consumer.outcomes import Outcome
from shared.settings import Settings
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client
from tests.unit.test_ordered_consumer import FIELD, Parcels, tracked


@pytest.fixture(scope="module")
def parcels_container(cosmos_endpoint: CosmosEndpoint,
                      loop: asyncio.Runner) -> Iterator[tuple[ContainerProxy, CosmosStore]]:
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"ordered-{uuid.uuid4().hex[:8]}")
    container = database.create_container_if_not_exists("parcels", PartitionKey(path=f"/{FIELD}"), default_ttl=-1)
    store = CosmosStore.from_settings(Settings(
        cosmos_endpoint=cosmos_endpoint.url, cosmos_key=cosmos_endpoint.key,
        cosmos_verify_tls=cosmos_endpoint.verify_tls, cosmos_database=database.id, cosmos_container="parcels"))
    yield container, store
    loop.run(store.close())
    client.delete_database(database.id)


@pytest.fixture
def consumer(parcels_container: tuple[ContainerProxy, CosmosStore]) -> tuple[Consumer, str]:
    parcels = Consumer("parcel-tracker", container="parcels", partition_key=f"/{FIELD}", env={})
    parcels.ordered("tracking", Parcels(), sessions=True)
    parcels.runtime(store=parcels_container[1])
    return parcels, "parcel_tracker_tracking"


def of(container: ContainerProxy, parcel: str, type_: str) -> list[dict[str, Any]]:
    return [d for d in container.query_items("SELECT * FROM c", partition_key=parcel) if d.get("type") == type_]


def test_events_before_their_parcel_wait_and_the_first_releases_them_keeping_foreign_fields(
    consumer: tuple[Consumer, str], parcels_container: tuple[ContainerProxy, CosmosStore], loop: asyncio.Runner,
) -> None:
    parcels, function = consumer
    container, parcel = parcels_container[0], f"p-{uuid.uuid4().hex[:8]}"

    def deliver(sequence: int, type_: str, where: str = "depot") -> Outcome:
        return loop.run(parcels.apply(function, tracked(sequence, type_, parcel=parcel, where=where))).outcome

    assert deliver(3, "Delivered") is Outcome.PARKED
    assert deliver(2, "Dispatched") is Outcome.PARKED
    [pending] = of(container, parcel, "parcel-pending")
    assert pending["parked"] == 2
    container.patch_item(parcel, parcel, [{"op": "add", "path": "/insuredBy", "value": "another writer"}])
    assert deliver(1, "Accepted") is Outcome.APPLIED
    assert deliver(1, "Accepted") is Outcome.DUPLICATE
    assert deliver(2, "Dispatched", where="elsewhere") is Outcome.PAYLOAD_MISMATCH
    [stored] = of(container, parcel, "parcel")
    assert (stored["status"], stored["version"], stored["parked"]) == ("delivered", 3, 0)
    assert stored["insuredBy"] == "another writer" and stored["dispatched"]["where"] == "depot"
    assert not of(container, parcel, "parcel-pending") and not of(container, parcel, "parked-event")
    assert sorted(d["sequence"] for d in of(container, parcel, "scan")) == [1, 2, 3]
    # The library's records hold their partition key under the container's own field.
    for record in of(container, parcel, "inbox"):
        assert record[FIELD] == parcel and "orderId" not in record


def test_in_turn_events_are_unread_patches_and_a_terminal_parcel_takes_no_more(
    consumer: tuple[Consumer, str], parcels_container: tuple[ContainerProxy, CosmosStore], loop: asyncio.Runner,
) -> None:
    parcels, function = consumer
    container, parcel = parcels_container[0], f"p-{uuid.uuid4().hex[:8]}"

    def deliver(sequence: int, type_: str) -> Outcome:
        return loop.run(parcels.apply(function, tracked(sequence, type_, parcel=parcel))).outcome

    assert [deliver(1, "Accepted"), deliver(2, "Lost")] == [Outcome.APPLIED, Outcome.APPLIED]
    assert deliver(3, "Delivered") is Outcome.INVALID_TRANSITION
    [stored] = of(container, parcel, "parcel")
    assert (stored["status"], stored["version"], stored["parked"]) == ("lost", 2, 0)
