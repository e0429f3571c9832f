"""What effectively-once costs: the project's processing path against the designs used instead, in one run.

Each *cell* is one strategy on one workload at one concurrency, on a fresh container of the local
Cosmos server (or ``COSMOS_TEST_ENDPOINT``), through one async CosmosClient whose transport counts
requests. Concurrency N is N asyncio tasks on one event loop, as the Functions worker runs ``async
def`` functions; every strategy uses the same client. The cells of one workload and concurrency run
back to back, in an order that rotates, so that each ratio compares runs on the same machine state.

Strategies (``STRATEGIES``):

- ``raw create``: create the business document; a 409 is ignored. No dedup at all: the upper bound.
- ``this project``: the function's own path, ``handle_order`` / ``handle_event`` of the app that
  ``shared.bootstrap.build`` makes, with an in-memory fulfilment fake; ``this project + stand-in``
  calls the local fulfilment stand-in.
- ``check-then-write``: read the id; create when it is absent. Racy under competing consumers.
- ``two-phase record``: create an in-progress record, write the business document, mark the record
  completed (the shape of the Lambda idempotency utility and of inbox tables); a copy finds the record.

Workloads: new orders; 30% duplicates (the copies go after all originals are processed); lifecycle
events (their orders are placed first, unmeasured; one worker applies one order's events in order).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import PartitionKey
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import CosmosResourceExistsError, CosmosResourceNotFoundError

from bench.wire import CountingTransport
from idempotent_consumer.adapters.cosmos import CosmosStore
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from sbctl import generate
from shared import bootstrap
from shared.adapters.http import HttpFulfilment
from shared.adapters.memory import InMemoryFulfilment
from shared.ports.fulfilment import FulfilmentService, Reply
from shared.settings import Settings

NEW, DUPLICATES, EVENTS = "new orders", "30% duplicates", "lifecycle events"
WORKLOADS = (NEW, DUPLICATES, EVENTS)
RAW, PROJECT, PROJECT_STANDIN, CHECK_THEN_WRITE, TWO_PHASE = (
    "raw create", "this project", "this project + stand-in", "check-then-write", "two-phase record")
DUPLICATE_SHARE = 0.3
PARTITION = PartitionKey(path="/orderId")
_FAILED = (Outcome.TRANSIENT, Outcome.ERROR, Outcome.INVALID, Outcome.PAYLOAD_MISMATCH)


@dataclass(frozen=True)
class Message:
    """One message of a workload, with its business document for the alternatives."""

    inbound: InboundMessage
    document: dict[str, Any]
    phase: int = 0  # 1: a copy, sent after every original was processed


@dataclass
class Workload:
    """The messages of one workload; ``units`` are what one worker takes at a time, in order."""

    name: str
    units: list[list[Message]]
    setup: list[Message] = field(default_factory=list)  # placed first, unmeasured (the events' orders)


@dataclass
class Cell:
    """What one strategy did on one workload at one concurrency."""

    strategy: str
    workload: str
    concurrency: int
    messages: int
    seconds: float
    requests: int
    request_units: float | None
    latencies_ms: list[float]
    copies: int = 0
    copy_requests: int = 0
    cpu_seconds: float = 0.0  # this process's CPU over the cell: the client's (the Cosmos server is another)

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_seconds * 1000 / self.requests if self.requests else 0.0

    @property
    def requests_per_message(self) -> float:
        return self.requests / self.messages if self.messages else 0.0

    @property
    def requests_per_copy(self) -> float | None:
        return self.copy_requests / self.copies if self.copies else None

    def percentile(self, pct: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else 0.0
        return statistics.quantiles(self.latencies_ms, n=100)[pct - 1]


def _inbound(message_id: str, body: bytes, sequence: int, session: str | None = None) -> InboundMessage:
    return InboundMessage(message_id=message_id, body=body, session_id=session, delivery_count=1,
                          enqueued_time_utc=datetime.now(UTC), sequence_number=sequence,
                          locked_until_utc=datetime.now(UTC) + timedelta(hours=1))


def _order_message(body: dict[str, Any], sequence: int, phase: int = 0) -> Message:
    return Message(_inbound(body["orderId"], _encode(body), sequence), {**body, "id": body["orderId"]}, phase)


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def new_orders(messages: int, seed: int) -> Iterator[Message]:
    """``messages`` new orders, made one at a time (the memory run holds none of them)."""
    rng = random.Random(seed)  # noqa: S311 - benchmark traffic
    for sequence in range(1, messages + 1):
        yield _order_message(generate.order(rng), sequence)


def workload(name: str, messages: int, seed: int) -> Workload:
    """``messages`` messages of workload ``name``, reproducible by ``seed``."""
    rng = random.Random(seed)  # noqa: S311 - benchmark traffic
    sequence = iter(range(1, 10**9))
    if name == NEW:
        return Workload(name, [[m] for m in new_orders(messages, seed)])
    if name == DUPLICATES:
        originals = [generate.order(rng) for _ in range(messages - int(messages * DUPLICATE_SHARE))]
        copies = [rng.choice(originals) for _ in range(messages - len(originals))]
        return Workload(name, [[_order_message(b, next(sequence))] for b in originals]
                        + [[_order_message(b, next(sequence), phase=1)] for b in copies])
    orders: list[Message] = []
    units: list[list[Message]] = []
    while sum(len(u) for u in units) < messages:
        body = generate.order(rng)
        orders.append(_order_message(body, next(sequence)))
        events = generate.order_events(rng, body)
        units.append([Message(_inbound(e["id"], _encode(e), next(sequence), body["orderId"]),
                              {**e, "orderId": body["orderId"]}) for e in events])
    return Workload(name, units, orders)


class Reserved:
    """A fulfilment fake that answers 201 and keeps nothing (the in-memory fake's ledger grows with a
    run, and that growth or its cost would be the harness's, not the path's)."""

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        return Reply(201, {"reservationId": f"res-{idempotency_key[-12:]}"})


# A strategy handles one message; it returns False when the message was not processed (to be reported).
Handler = Callable[[Message], Awaitable[bool]]


def raw_create(container: ContainerProxy) -> Handler:
    async def handle(message: Message) -> bool:
        with suppress(CosmosResourceExistsError):
            await container.create_item(message.document)
        return True
    return handle


def check_then_write(container: ContainerProxy) -> Handler:
    async def handle(message: Message) -> bool:
        doc = message.document
        try:
            await container.read_item(doc["id"], partition_key=doc["orderId"])
            return True
        except CosmosResourceNotFoundError:
            pass
        with suppress(CosmosResourceExistsError):
            await container.create_item(doc)
        return True
    return handle


def two_phase(container: ContainerProxy) -> Handler:
    """In-progress record, business write, completed record; a copy reads the record (a 409 carries no body)."""
    async def handle(message: Message) -> bool:
        doc = message.document
        record = {"id": f"idempotency-{doc['id']}", "orderId": doc["orderId"], "status": "INPROGRESS",
                  "expiration": time.time() + 3600}
        try:
            written = await container.create_item(record)
        except CosmosResourceExistsError:
            stored = await container.read_item(record["id"], partition_key=doc["orderId"])
            return bool(stored["status"] == "COMPLETED")
        await container.upsert_item(doc)
        await container.replace_item(record["id"], {**record, "status": "COMPLETED"}, etag=written["_etag"],
                                     match_condition=MatchConditions.IfNotModified)
        return True
    return handle


def this_project(workload_name: str, container: ContainerProxy, settings: Settings,
                 fulfilment: FulfilmentService) -> Handler:
    """The function's handler, from the app ``bootstrap.build`` makes over this container and ``fulfilment``."""
    app = bootstrap.build(settings, store=CosmosStore(container), fulfilment=fulfilment)
    handler = app.handle_event if workload_name == EVENTS else app.handle_order

    async def handle(message: Message) -> bool:
        result: Result = await handler(message.inbound)
        return result.outcome not in _FAILED

    return handle


@dataclass
class Bench:
    """The client, its counting transport, the settings and the stand-in's URL, shared by every cell."""

    client: CosmosClient
    transport: CountingTransport
    settings: Settings
    database: str
    fulfilment_url: str | None = None
    # The local server answers a flat charge of 1 per request: request units are read only from a
    # configured endpoint (the emulator, a real account).
    request_units: bool = False
    failures: list[str] = field(default_factory=list)

    @asynccontextmanager
    async def container(self) -> AsyncIterator[ContainerProxy]:
        """A fresh container for one cell, deleted afterwards."""
        database = self.client.get_database_client(self.database)
        name = f"bench-{uuid.uuid4().hex[:12]}"
        container = await database.create_container(name, partition_key=PARTITION)
        try:
            yield container
        finally:
            await database.delete_container(name)

    def strategies(self, workload_name: str) -> list[str]:
        """The strategies compared on a workload (the stand-in only on orders, where the call happens)."""
        full = [PROJECT_STANDIN] if self.fulfilment_url and workload_name != EVENTS else []
        return [RAW, PROJECT, *full, CHECK_THEN_WRITE, TWO_PHASE]

    async def run_cell(self, strategy: str, work: Workload, concurrency: int) -> Cell:
        """Run one cell on a fresh container and measure it."""
        async with self.container() as container:
            fulfilment = self._fulfilment(strategy)
            handle = self._handler(strategy, work.name, container, fulfilment)
            try:
                for message in work.setup:  # the events' orders, placed by the project's path, unmeasured
                    await self._setup(container, message)
                return await self._measure(strategy, work, concurrency, handle)
            finally:
                if isinstance(fulfilment, HttpFulfilment):
                    await fulfilment.close()

    def _fulfilment(self, strategy: str) -> FulfilmentService:
        if strategy == PROJECT_STANDIN and self.fulfilment_url:
            return HttpFulfilment(self.fulfilment_url, connect_timeout=3, read_timeout=10,
                                  proxy_from_environment=self.settings.http_proxy_from_environment)
        return InMemoryFulfilment()

    def _handler(self, strategy: str, workload_name: str, container: ContainerProxy,
                 fulfilment: FulfilmentService) -> Handler:
        if strategy in (PROJECT, PROJECT_STANDIN):
            return this_project(workload_name, container, self.settings, fulfilment)
        make = {RAW: raw_create, CHECK_THEN_WRITE: check_then_write, TWO_PHASE: two_phase}[strategy]
        return make(container)

    async def _setup(self, container: ContainerProxy, message: Message) -> None:
        app = bootstrap.build(self.settings, store=CosmosStore(container), fulfilment=InMemoryFulfilment())
        await app.handle_order(message.inbound)

    async def _measure(self, strategy: str, work: Workload, concurrency: int, handle: Handler) -> Cell:
        latencies: list[float] = []
        failed: list[str] = []

        async def worker(units: Iterator[list[Message]]) -> None:
            # Like a thread of a pool: takes the next unit when it is free; a unit's messages in order.
            for unit in units:
                for message in unit:
                    started = time.perf_counter()
                    if not await handle(message):
                        failed.append(str(message.inbound.message_id))
                    latencies.append((time.perf_counter() - started) * 1000)

        async def run_phase(units: list[list[Message]]) -> None:
            shared = iter(units)
            await asyncio.gather(*(worker(shared) for _ in range(concurrency)))

        phases = [[u for u in work.units if u[0].phase == phase] for phase in (0, 1)]
        requests_before, units_before = self.transport.snapshot()
        started, cpu_started = time.perf_counter(), time.process_time()
        await run_phase(phases[0])
        between, _ = self.transport.snapshot()
        await run_phase(phases[1])
        copy_requests = self.transport.snapshot()[0] - between
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        requests_after, units_after = self.transport.snapshot()
        if failed:
            self.failures.append(f"{strategy} on {work.name} at c{concurrency}: {len(failed)} messages not processed")
        return Cell(strategy, work.name, concurrency, len(latencies), seconds, requests_after - requests_before,
                    units_after - units_before if self.request_units and self.transport.charged else None,
                    latencies,
                    copies=sum(len(u) for u in phases[1]), copy_requests=copy_requests, cpu_seconds=cpu_seconds)


def rotated(items: list[str], turn: int) -> list[str]:
    """``items`` starting at position ``turn`` (so that no strategy always runs first)."""
    turn %= len(items)
    return items[turn:] + items[:turn]
