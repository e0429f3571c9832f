"""Async or sync, decided by measurement: the order path's requests with azure.cosmos.aio against the sync client.

Both prototypes send exactly the project's requests for a new order, built by the project's own
code (the order, outbox entry and reservation claim in one batch; the in-memory fulfilment fake; the
record's finish, a point patch on its etag that asks for no body, as the adapter sends it): the sync
one on threads, as the functions ran before they became ``async def``, the async one as asyncio tasks
on one event loop, as they run now. What differs is the
client model, which was the question (it decided the switch). Each runs on a fresh container; they
alternate. The fulfilment fake's rule is applied directly (its ledger), the same for both.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions

from bench import throughput
from idempotent_consumer.adapters.cosmos import batch_operation, patch_operations
from idempotent_consumer.ports.store import Create, Patch
from idempotent_consumer.records import EffectStatus, SideEffectRecord
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.domain import documents
from shared.domain.documents import OrderDocument
from shared.domain.orders import parse_order
from shared.handlers.place_order import ANNOUNCES_AT_FINISH, RESERVE_STOCK
from shared.ports.fulfilment import reservation_request
from shared.settings import Settings

ROUNDS = 3


def _plan(message: throughput.Message, settings: Settings, fulfilment: InMemoryFulfilment,
          effect: SideEffect) -> tuple[str, list[tuple[Any, ...]], Callable[[dict[str, Any]], dict[str, Any]]]:
    """The partition, the first batch's operations, and how to make the finish from the claim as written."""
    inbound = message.inbound
    order = parse_order(inbound)
    hash_ = order.request_hash()
    placed = OrderDocument.placed(order, inbound, hash_)
    outbox = documents.accepted_entry(order, inbound, consumer=settings.consumer_name,
                                        destination=settings.outbox_destination,
                                        requires_session=settings.outbox_requires_session, now=time.time())
    claim = effect.claim(order.order_id, inbound, hash_)
    first = [batch_operation(Create(d.to_document())) for d in (placed, outbox, claim)]

    def finish(written: dict[str, Any]) -> dict[str, Any]:
        record = SideEffectRecord.from_document(written)
        reply = fulfilment.ledger.reserve(record.idempotency_key, reservation_request(order))
        _, fields = record.with_changes(status=EffectStatus.COMPLETED, response_status=reply.status,
                                        finished_at=time.time())
        # The product's finish: CosmosStore._patch_alone's call for Patch(..., etag_only=True).
        return {"item": record.id, "partition_key": order.order_id,
                "patch_operations": patch_operations(Patch(record.id, fields)), "etag": record.etag,
                "match_condition": MatchConditions.IfNotModified, "no_response": True}

    return order.order_id, first, finish


def _claims(settings: Settings) -> SideEffect:
    """The reservation's side effect, used only to build claims (``claim`` writes nothing to its store)."""
    return SideEffect(InMemoryStore(), settings.consumer_name, RESERVE_STOCK, 60, announces=ANNOUNCES_AT_FINISH)


def _sync(container: Any, work: list[throughput.Message], concurrency: int, settings: Settings) -> list[float]:
    fulfilment, effect = InMemoryFulfilment(), _claims(settings)
    latencies: list[float] = []

    def one(message: throughput.Message) -> None:
        started = time.perf_counter()
        partition, first, finish = _plan(message, settings, fulfilment, effect)
        written = container.execute_item_batch(batch_operations=first, partition_key=partition)
        container.patch_item(**finish(written[2]["resourceBody"]))
        latencies.append((time.perf_counter() - started) * 1000)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, work))
    return latencies


async def _async(container: Any, work: list[throughput.Message], concurrency: int, settings: Settings) -> list[float]:
    fulfilment, effect = InMemoryFulfilment(), _claims(settings)
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(message: throughput.Message) -> None:
        async with gate:
            started = time.perf_counter()
            partition, first, finish = _plan(message, settings, fulfilment, effect)
            written = await container.execute_item_batch(batch_operations=first, partition_key=partition)
            await container.patch_item(**finish(written[2]["resourceBody"]))
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(one(m) for m in work))
    return latencies


def measure(settings: Settings, levels: list[int], seed: int, messages: int = 2000) -> dict[str, Any]:
    """Per concurrency: median messages/s and p99 of the sync and async prototypes, and their ratios."""
    from azure.core.pipeline.transport import RequestsTransport  # noqa: PLC0415
    from azure.cosmos import CosmosClient  # noqa: PLC0415

    endpoint, key = settings.need("cosmos_endpoint"), settings.cosmos_key or ""
    options: dict[str, Any] = {"connection_verify": settings.cosmos_verify_tls,
                               "enable_endpoint_discovery": not endpoint.startswith("http://")}
    # As the product runs: no proxy look-up per request (HTTP_PROXY_FROM_ENVIRONMENT off), on both sides.
    sync_client = CosmosClient(endpoint, credential=key, transport=RequestsTransport(use_env_settings=False),
                               **options)
    database = sync_client.get_database_client(settings.cosmos_database)
    found: dict[str, Any] = {}
    for level in levels:
        work = [u[0] for u in throughput.workload(throughput.NEW, messages, seed).units]
        runs: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
        for turn in range(ROUNDS):
            for kind in (("sync", "async") if turn % 2 == 0 else ("async", "sync")):
                name = f"aio-{uuid.uuid4().hex[:10]}"
                database.create_container(name, partition_key=throughput.PARTITION)
                try:
                    if kind == "sync":
                        started = time.perf_counter()
                        latencies = _sync(database.get_container_client(name), work, level, settings)
                        seconds = time.perf_counter() - started
                    else:
                        latencies, seconds = asyncio.run(_run_async(endpoint, key, options, settings, name=name,
                                                                    work=work, level=level))
                finally:
                    database.delete_container(name)
                runs[kind].append((len(work) / seconds, statistics.quantiles(latencies, n=100)[98]))
        sync_speed = statistics.median(r[0] for r in runs["sync"])
        async_speed = statistics.median(r[0] for r in runs["async"])
        sync_p99 = statistics.median(r[1] for r in runs["sync"])
        async_p99 = statistics.median(r[1] for r in runs["async"])
        found[f"c{level}"] = {"sync messages/s": round(sync_speed, 1), "async messages/s": round(async_speed, 1),
                              "async / sync": round(async_speed / sync_speed, 3),
                              "p99 async / sync": round(async_p99 / sync_p99, 3)}
    return found


async def _run_async(endpoint: str, key: str, options: dict[str, Any], settings: Settings, *, name: str,
                     work: list[throughput.Message], level: int) -> tuple[list[float], float]:
    """Latencies and seconds; the timer starts once the client has connected, as the sync one has."""
    from azure.core.pipeline.transport import AioHttpTransport  # noqa: PLC0415
    from azure.cosmos.aio import CosmosClient as AsyncCosmosClient  # noqa: PLC0415

    async with AsyncCosmosClient(endpoint, credential=key, transport=AioHttpTransport(use_env_settings=False),
                                 **options) as client:
        container = client.get_database_client(settings.cosmos_database).get_container_client(name)
        await container.read()  # connected and warm before the timer, like the sync client
        started = time.perf_counter()
        latencies = await _async(container, work, level, settings)
        return latencies, time.perf_counter() - started
