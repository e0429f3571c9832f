"""The project's own CPU per message: the app's handlers over ports that answer at once, with no SDK and no copy.

What ``this project`` costs beyond the requests it sends: decode and validate the body, hash it,
build the documents and the batch, read the answers. The store answers each batch with its documents
as written; the fulfilment service answers 201. The figure is CPU per message over N messages after
a warm-up, in this process.

    python -m bench.own_code [--messages 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from bench import throughput
from idempotent_consumer.ports.store import BatchOperation, Create, Document, Patch, Replace
from shared import bootstrap
from shared.settings import Settings

WARM_UP = 500


class AnsweringStore:
    """A DocumentStore whose creates and batches succeed at once: the happy paths' only calls."""

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        # A patch's answer is what an etag_only patch returns, all that the happy path reads of one.
        return [{**op.document, "_etag": '"1"', "_ts": 1} if isinstance(op, Create | Replace)
                else {"id": op.doc_id, "_etag": '"2"'} if isinstance(op, Patch) else {} for op in operations]

    async def create(self, document: Document) -> Document:
        return {**document, "_etag": '"1"', "_ts": 1}  # an event's identity, taken before its batch

    async def read(self, doc_id: str, partition_key: str) -> Document:
        raise NotImplementedError("the happy path reads nothing")

    async def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                          before: tuple[str, Any] | None = None, page_size: int = 100,
                          ) -> AsyncIterator[list[Document]]:
        yield []


async def _measure(messages: int, warm_up: int) -> dict[str, Any]:
    settings = Settings(fulfillment_url="http://fulfilment.invalid")
    app = bootstrap.build(settings, store=AnsweringStore(), fulfilment=throughput.Reserved())
    orders = [u[0].inbound for u in throughput.workload(throughput.NEW, messages + warm_up, seed=3).units]
    events = [m.inbound for u in throughput.workload(throughput.EVENTS, messages, seed=3).units for m in u]
    outcomes: Counter[str] = Counter()
    for message in orders[:warm_up]:
        await app.handle_order(message)
    started = time.process_time()
    for message in orders[warm_up:]:
        outcomes[(await app.handle_order(message)).outcome.value] += 1
    order_ms = (time.process_time() - started) * 1000 / (len(orders) - warm_up)
    started = time.process_time()
    for message in events:
        outcomes[(await app.handle_event(message)).outcome.value] += 1
    event_ms = (time.process_time() - started) * 1000 / len(events)
    return {"new order ms": round(order_ms, 3), "applied event ms": round(event_ms, 3),
            "outcomes": dict(outcomes)}


def measure(messages: int = 4000, warm_up: int = WARM_UP) -> dict[str, Any]:
    """CPU milliseconds per new order and per applied event spent in the project's own code, and the
    outcomes (all ``created`` and ``applied``: the happy path is what is measured)."""
    return asyncio.run(_measure(messages, warm_up))


def main() -> None:
    """Print the figures as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=4000, help="messages per path (default 4000)")
    print(json.dumps(measure(parser.parse_args().messages)))


if __name__ == "__main__":
    main()
