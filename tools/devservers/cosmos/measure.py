"""What one request costs the local Cosmos server as its container grows: ``python -m devservers.cosmos.measure``.

It fills one container shaped like the app's orders container (partition key ``/orderId``, TTL on with no
default; per partition an order, its outbox entry, its side-effect record and an inbox marker or a parked
event, some with a ``ttl``) and, at each size asked for, times with the azure-cosmos SDK: a point read, a
create, a transactional batch of 3, a partition-scoped query, a targeted cross-partition query, a count, and
a full read of ``SELECT * FROM c`` in pages of 1,000. It prints the median milliseconds per operation as a
Markdown table, one column per size. An operation that runs past ``--budget`` seconds stops early; a paged
read stopped so is extrapolated from the pages it read, and marked ``~``.

    python -m devservers.cosmos.measure [--sizes 0,10000,40000] [--endpoint URL] [--budget 60]

Without ``--endpoint`` it starts its own server (``devservers.cosmos``) and stops it at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from azure.cosmos import ContainerProxy, CosmosClient, PartitionKey

from devservers.cosmos import EMULATOR_KEY, start_cosmos_server

DOCS_PER_PARTITION = 4
WAITING_EVERY = 25
PAGE = 1000  # the demo's and the chaos driver's page size
PARKED_QUERY = ("SELECT * FROM c WHERE c.type = 'parked-event' AND c.consumer = @c AND c.status = 'parked'")
TARGETED_QUERY = ("SELECT c.id, c.type, c.status FROM c WHERE c.type IN ('outbox','side-effect','parked-event')"
                  " AND c.status IN ('pending','in_progress','parked')")
COUNT_QUERY = "SELECT VALUE COUNT(1) FROM c WHERE c.type = 'order'"
CONSUMER = "order-events"


def partition_documents(n: int) -> list[dict[str, Any]]:
    """The documents of partition ``n``: an order and three small ones; one partition in 25 has work waiting
    (an outbox entry pending, a side effect in progress, a parked event)."""
    order_id = f"ord-{n:06d}"
    waiting = n % WAITING_EVERY == 1
    order = {"id": order_id, "orderId": order_id, "type": "order", "customerId": f"c-{n % 997}", "currency": "EUR",
             "items": [{"sku": "A-1", "quantity": 2, "unitPrice": "19.99"}, {"sku": "B-2", "quantity": 1,
                                                                            "unitPrice": "5.00"}],
             "total": "44.98", "placedAt": "2026-12-01T09:00:00Z", "status": "placed", "version": 1,
             "requestHash": uuid.uuid5(uuid.NAMESPACE_OID, order_id).hex, "messageId": order_id, "parked": 0}
    outbox = {"id": f"outbox-{order_id}", "orderId": order_id, "type": "outbox",
              "status": "pending" if waiting else "dispatched", "destination": "order-accepted",
              "messageId": f"accepted-{order_id}", "subject": "OrderAccepted", "createdAt": 1_764_579_600.0,
              "payload": {"orderId": order_id, "total": "44.98"}, **({} if waiting else {"ttl": 86_400})}
    effect = {"id": f"effect-{order_id}", "orderId": order_id, "type": "side-effect", "consumer": "orders",
              "effect": "reserve", "idempotencyKey": uuid.uuid5(uuid.NAMESPACE_URL, order_id).hex,
              "status": "in_progress" if waiting else "completed", "attempt": 1, "leaseUntil": 1_764_579_660.0}
    if n % 2:
        fourth = {"id": f"parked-{order_id}", "orderId": order_id, "type": "parked-event", "consumer": CONSUMER,
                  "sequence": 3, "eventType": "OrderShipped", "status": "parked" if waiting else "rejected",
                  "parkedAt": 1_764_579_600.0, "event": {"id": f"e-{n}", "sequence": 3}}
    else:
        fourth = {"id": f"inbox-{order_id}", "orderId": order_id, "type": "inbox", "consumer": CONSUMER,
                  "requestHash": order["requestHash"], "ttl": 604_800}
    return [order, outbox, effect, fourth]


def fill(container: ContainerProxy, first: int, last: int) -> None:
    """Write partitions ``first`` to ``last - 1``, one transactional batch each."""
    for n in range(first, last):
        documents = partition_documents(n)
        container.execute_item_batch([("create", (d,)) for d in documents], partition_key=documents[0]["orderId"])


class Timer:
    """Runs one operation again and again until ``budget`` seconds or ``runs`` runs; the median in ms."""

    def __init__(self, budget: float, runs: int = 15) -> None:
        self.budget = budget
        self.runs = runs

    def median(self, operation: Callable[[int], object]) -> str:
        times: list[float] = []
        began = time.perf_counter()
        for run in range(self.runs):
            started = time.perf_counter()
            operation(run)
            times.append((time.perf_counter() - started) * 1000)
            if time.perf_counter() - began > self.budget:
                break
        return f"{statistics.median(times):.1f}"

    def paged_read(self, container: ContainerProxy, expected: int) -> str:
        """One full read in pages of PAGE; extrapolated from the pages read if it outruns the budget."""
        started = time.perf_counter()
        read = 0
        for page in container.query_items("SELECT * FROM c", enable_cross_partition_query=True,
                                          max_item_count=PAGE).by_page():
            read += sum(1 for _ in page)
            if time.perf_counter() - started > self.budget and read < expected:
                elapsed = (time.perf_counter() - started) * 1000
                return f"~{elapsed * expected / read:.0f}"
        return f"{(time.perf_counter() - started) * 1000:.1f}"


def measure(container: ContainerProxy, size: int, timer: Timer) -> dict[str, str]:
    """The median milliseconds of each operation on the container, which holds about ``size`` documents."""
    middle = (size // DOCS_PER_PARTITION) // 2
    known = f"ord-{middle - middle % WAITING_EVERY + 1:06d}" if size >= 2 * WAITING_EVERY * DOCS_PER_PARTITION \
        else None  # a partition in the middle, with a parked event to find
    tag = uuid.uuid4().hex[:8]
    if known is None:  # something to read in a (nearly) empty container
        known = f"ord-empty-{tag}"
        container.create_item({"id": known, "orderId": known, "type": "order", "status": "placed"})
    results: dict[str, str] = {}
    results["point read"] = timer.median(lambda _: container.read_item(known, partition_key=known))
    results["create"] = timer.median(lambda run: container.create_item(
        {"id": f"new-{tag}-{run}", "orderId": f"new-{tag}-{run}", "type": "order", "status": "placed"}))
    results["batch of 3"] = timer.median(lambda run: container.execute_item_batch(
        [("create", (d,)) for d in tagged(partition_documents(run)[:3], f"{tag}-{run}")],
        partition_key=f"ord-{tag}-{run}"))
    results["partition query"] = timer.median(lambda _: list(container.query_items(
        PARKED_QUERY, parameters=[{"name": "@c", "value": CONSUMER}], partition_key=known)))
    results["cross-partition targeted query"] = timer.median(lambda _: list(container.query_items(
        TARGETED_QUERY, enable_cross_partition_query=True, max_item_count=PAGE)))
    results["SELECT VALUE COUNT(1) ... type = 'order'"] = timer.median(lambda _: list(container.query_items(
        COUNT_QUERY, enable_cross_partition_query=True)))
    results[f"full read, pages of {PAGE:,}"] = timer.paged_read(container, max(size, 1))
    return results


def tagged(documents: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """The documents moved to partition ``ord-<tag>``, so that each measured batch writes a new partition."""
    order_id = f"ord-{tag}"
    return [{**d, "id": d["id"].replace(d["orderId"], order_id), "orderId": order_id} for d in documents]


@contextmanager
def endpoint(url: str | None) -> Iterator[str]:
    """The server to measure: ``url``, or one started here for the run."""
    if url:
        yield url
        return
    with start_cosmos_server() as server:
        yield server.endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.cosmos.measure",
        description="Time each kind of request to the local Cosmos server as a container like the app's grows.",
        epilog="example:\n  python -m devservers.cosmos.measure --sizes 0,10000,40000\n\nprints a Markdown table "
               "of median ms per operation; progress goes to stderr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="0,10000,40000", help="documents, comma-separated (default 0,10000,40000)")
    parser.add_argument("--endpoint", help="a running server's URL (default: start one)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per operation at most (default 60)")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    timer = Timer(args.budget)
    table: dict[int, dict[str, str]] = {}
    with endpoint(args.endpoint) as url:
        client = CosmosClient(url, credential=EMULATOR_KEY, enable_endpoint_discovery=False, read_timeout=3600)
        database = client.create_database(f"measure-{uuid.uuid4().hex[:8]}")
        try:
            container = database.create_container("orders", PartitionKey(path="/orderId"), default_ttl=-1)
            partitions = 0
            for size in sizes:
                target = size // DOCS_PER_PARTITION
                started = time.perf_counter()
                fill(container, partitions, target)
                print(f"filled to {size:,} documents in {time.perf_counter() - started:.1f} s", file=sys.stderr)
                partitions = target
                table[size] = measure(container, size, timer)
        finally:
            client.delete_database(database.id)
    operations = list(next(iter(table.values())))
    print("| ms per operation | " + " | ".join(f"{s:,} docs" for s in sizes) + " |")
    print("| --- |" + " ---: |" * len(sizes))
    for operation in operations:
        print(f"| {operation} | " + " | ".join(table[s][operation] for s in sizes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
