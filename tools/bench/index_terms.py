"""Write RU of the happy paths under Cosmos DB's default indexing policy and under the orders container's
policy, estimated with the published cost model from the documents the app really writes.

RU cannot be measured here: the local server charges a flat 1 RU a request, and the Linux emulator
implements neither RU nor custom indexing policies. So this runs the app (``shared.bootstrap.build``)
over the in-memory store, records every write with the document before and after it, and counts
index terms: one per leaf value (each array item's leaves too), plus ``id`` and ``_ts``, which Cosmos
always indexes; under an opt-in policy, each explicitly included path a document lacks adds one
"undefined" term. The model (Microsoft's, "Understand request units consumption"): a 1 KB create
costs about 5 RU + 0.2 per indexed term; a replace about 10 RU + 0.4 per changed indexed term (each
removed and inserted); a patch is charged like a replace (plus a base charge, not counted here); a delete
5 RU + 0.2 per indexed term it removes. The figures are estimates.

The happy paths: a new order with two items (its batch of order and reservation claim; the claim completed
after the fulfilment call, with its outbox entry and the reservation on the order; the outbox entry deleted
after the send), and an event applied in turn (its identity's create, then its batch of inbox
marker, the order's conditional patch and the event's record), once for a captured payment and once for a
shipment.

    python -m bench.index_terms            # the table docs/performance.md quotes
    python -m bench.index_terms --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from idempotent_consumer.errors import NotFound
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ports.store import (
    MAX_PAGE_ITEMS,
    BatchOperation,
    Create,
    Delete,
    Document,
    Patch,
    Replace,
    query_all,
)
from idempotent_consumer.records import SYSTEM_PROPERTIES
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ORDERS_POLICY = ROOT / "infra" / "orders-indexing-policy.json"
# What a container gets without an indexing policy: every path, but the etag.
DEFAULT_POLICY: dict[str, Any] = {"indexingMode": "consistent", "automatic": True,
                                  "includedPaths": [{"path": "/*"}], "excludedPaths": [{"path": '/"_etag"/?'}]}
ALWAYS_INDEXED = ("/id/?", "/_ts/?")
UNDEFINED = object()  # what an explicitly included path that a document lacks is indexed as
_ABSENT = object()
CREATE_BASE, CREATE_PER_TERM = 5.0, 0.2
REPLACE_BASE, REPLACE_PER_TERM = 10.0, 0.4
DELETE_BASE, DELETE_PER_TERM = 5.0, 0.2
NOW = datetime(2026, 11, 30, 9, 15, 1, tzinfo=UTC)
ORDER_ID = "ord-3f2a9c1e-7b4d-4e61-9a0f-2d8c5b7e1a44"
ORDER: dict[str, Any] = {
    "orderId": ORDER_ID, "customerId": "cust-04217", "currency": "EUR",
    "items": [{"sku": "BOOK-0451", "quantity": 2, "unitPrice": "19.99"},
              {"sku": "CABLE-USBC", "quantity": 1, "unitPrice": "5.00"}],
    "total": "44.98", "placedAt": "2026-11-30T09:15:00Z",
}
EVENTS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("captured payment", "com.example.orders.PaymentCaptured", "2026-11-30T10:02:41Z",
     {"sequence": 2, "paymentId": "pay-8d1e4b2a-55c3-4f0e-b6a9-71c2d3e4f5a6", "amount": "44.98", "currency": "EUR"}),
    ("shipment", "com.example.orders.OrderShipped", "2026-11-30T16:40:05Z",
     {"sequence": 3, "shipmentId": "shp-2b7c9e0d-13a4-4c8f-9e21-6f5a4b3c2d1e", "carrier": "DHL",
      "trackingNumber": "JD014600006281234567"}),
]


@dataclass(frozen=True)
class Policy:
    """An indexing policy's included and excluded paths, and which leaf paths it indexes."""

    included: tuple[str, ...]
    excluded: tuple[str, ...]

    @classmethod
    def of(cls, policy: Mapping[str, Any]) -> Policy:
        return cls(tuple(p["path"] for p in policy["includedPaths"]), tuple(p["path"] for p in policy["excludedPaths"]))

    def indexes(self, path: str) -> bool:
        """Whether a leaf path (``/items/[]/sku/?``) is indexed: the most precise matching rule decides."""
        if path in ALWAYS_INDEXED:
            return True
        rules = [(_precision(p), True) for p in self.included if _matches(p, path)]
        rules += [(_precision(p), False) for p in self.excluded if _matches(p, path)]
        return max(rules)[1] if rules else False

    def explicit_leaves(self) -> tuple[str, ...]:
        """Included scalar paths: each adds an "undefined" term to a document that lacks it."""
        return tuple(p for p in self.included if p.endswith("/?"))


def _segments(path: str) -> list[str]:
    return [s.strip('"') for s in path.strip("/").split("/")]


def _matches(rule: str, path: str) -> bool:
    rule_parts, path_parts = _segments(rule), _segments(path)
    if rule_parts[-1] == "*":
        return path_parts[:len(rule_parts) - 1] == rule_parts[:-1]
    return rule_parts == path_parts


def _precision(rule: str) -> tuple[int, int]:
    """Deeper is more precise; at the same depth, ``/?`` beats ``/*`` (the indexing-policy docs' rules)."""
    parts = _segments(rule)
    return len(parts) - 1, parts[-1] == "?"


def leaves(document: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(position, policy path, value) for each leaf of a stored document, ``_ts`` included, the store's
    other system properties left out. The position tells array items apart (``/items/0/sku``)."""
    def walk(value: Any, position: str, path: str) -> Iterator[tuple[str, str, Any]]:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                yield from walk(item, f"{position}/{key}", f"{path}/{key}")
        elif isinstance(value, list) and value:
            for index, item in enumerate(value):
                yield from walk(item, f"{position}/{index}", f"{path}/[]")
        else:
            yield position, f"{path}/?", value

    for key, value in document.items():
        if key not in SYSTEM_PROPERTIES or key == "_ts":
            yield from walk(value, f"/{key}", f"/{key}")


def terms(document: Mapping[str, Any], policy: Policy) -> dict[str, Any]:
    """The document's index terms under ``policy``, by position: its indexed leaves, and a marker for
    each explicitly included path it lacks."""
    found = {position: value for position, path, value in leaves(document) if policy.indexes(path)}
    paths = {path for _, path, _ in leaves(document)}
    found.update({path.removesuffix("/?"): UNDEFINED for path in policy.explicit_leaves() if path not in paths})
    return found


def changed_terms(before: Mapping[str, Any], after: Mapping[str, Any], policy: Policy) -> int:
    """Index terms a replace or patch changes: added, removed or with a new value; ``_ts`` always changes."""
    old, new = terms(before, policy), terms(after, policy)
    changed = {p for p in old.keys() | new.keys() if p != "/_ts" and old.get(p, _ABSENT) != new.get(p, _ABSENT)}
    return len(changed) + 1


@dataclass(frozen=True)
class Write:
    """One document written: its kind, the operation, and the document before (None for a create) and after
    (None for a delete)."""

    step: str
    operation: str
    kind: str
    before: Document | None
    after: Document | None

    def terms(self, policy: Policy) -> int:
        """Indexed terms written (a create), changed (a replace or patch) or removed (a delete)."""
        if self.before is None:
            return len(terms(self.after or {}, policy))
        if self.after is None:
            return len(terms(self.before, policy))
        return changed_terms(self.before, self.after, policy)

    def ru(self, policy: Policy) -> float:
        """The published model's estimate for this write."""
        if self.before is None:
            return CREATE_BASE + CREATE_PER_TERM * self.terms(policy)
        if self.after is None:
            return DELETE_BASE + DELETE_PER_TERM * self.terms(policy)
        return REPLACE_BASE + REPLACE_PER_TERM * self.terms(policy)


class RecordingStore:
    """The in-memory store, recording each write with the document as it was before and as written."""

    def __init__(self) -> None:
        self._store = InMemoryStore(default_ttl=-1)
        self.step = ""
        self.writes: list[Write] = []

    async def create(self, document: Document) -> Document:
        written = await self._store.create(document)
        self.writes.append(Write(self.step, "create", str(written.get("type")), None, written))
        return written

    async def read(self, doc_id: str, partition_key: str) -> Document:
        return await self._store.read(doc_id, partition_key)

    def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                    before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
                    ) -> AsyncIterator[list[Document]]:
        return self._store.query_pages(conditions, partition_key=partition_key, before=before,
                                         page_size=page_size)

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        before = [await self._current(partition_key, op) for op in operations]
        written = await self._store.execute_batch(partition_key, operations)
        for op, old, answer in zip(operations, before, written, strict=True):
            if isinstance(op, Delete):
                if old is not None:
                    self.writes.append(Write(self.step, "delete", str(old.get("type")), old, None))
                continue
            operation = "create" if isinstance(op, Create) else "patch" if isinstance(op, Patch) else "replace"
            # An etag_only patch answers with its id and etag alone: the document written is the one stored.
            new = await self._store.read(op.doc_id, partition_key) if isinstance(op, Patch) else answer
            self.writes.append(Write(self.step, operation, str(new.get("type")), old, new))
        return written

    async def _current(self, partition_key: str, op: BatchOperation) -> Document | None:
        if isinstance(op, Create):
            return None
        doc_id = op.document["id"] if isinstance(op, Replace) else op.doc_id  # a Patch's or a Delete's
        try:
            return await self._store.read(doc_id, partition_key)
        except NotFound:
            return None


def _message(message_id: str, body: Mapping[str, Any], sequence: int) -> InboundMessage:
    return InboundMessage(message_id=message_id, body=json.dumps(body).encode(), correlation_id="corr-7f3e1d2c",
                          session_id=ORDER_ID if sequence > 1 else None, delivery_count=0,
                          enqueued_time_utc=NOW, sequence_number=sequence)


async def _record() -> list[Write]:
    store = RecordingStore()
    app = bootstrap.build(Settings(fulfillment_url="http://fulfilment.invalid"), store=store,
                          fulfilment=InMemoryFulfilment(), sender=RecordingSender(), clock=NOW.timestamp)
    store.step = "new order"
    await app.handle_order(_message(ORDER_ID, ORDER, 1))
    await app.publisher().publish(await query_all(store, {}, partition_key=ORDER_ID))  # the change feed's batch
    for number, (step, event_type, time, data) in enumerate(EVENTS, start=2):
        store.step = step
        event = {"specversion": "1.0", "id": f"evt-{number}-5c1d9e7a-4b2f-4d3e-8a6b", "source": "/orders/checkout",
                 "type": event_type, "subject": ORDER_ID, "time": time,
                 "datacontenttype": "application/json", "data": data}
        await app.handle_event(_message(str(event["id"]), event, number))
    return store.writes


def writes() -> list[Write]:
    """Every write of the happy paths, in order."""
    return asyncio.run(_record())


def estimate() -> dict[str, Any]:
    """Terms and RU per write and per path, under the default policy and the orders container's."""
    policies = {"default": Policy.of(DEFAULT_POLICY), "orders": Policy.of(json.loads(ORDERS_POLICY.read_text()))}
    rows: list[dict[str, Any]] = [{"step": w.step, "write": f"{w.operation} {w.kind}",
             **{f"terms {name}": w.terms(p) for name, p in policies.items()},
             **{f"RU {name}": round(w.ru(p), 1) for name, p in policies.items()}} for w in writes()]
    totals = {}
    for step in dict.fromkeys(r["step"] for r in rows):
        mine = [r for r in rows if r["step"] == step]
        totals[step] = {name: round(sum(r[f"RU {name}"] for r in mine), 1) for name in policies}
    return {"writes": rows, "per path": totals}


def markdown(figures: Mapping[str, Any]) -> str:
    """The two tables docs/performance.md quotes."""
    lines = ["| path | write | terms, default policy | terms, orders policy | RU, default | RU, orders policy |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['step']} | {r['write']} | {r['terms default']} | {r['terms orders']} | {r['RU default']} |"
              f" {r['RU orders']} |" for r in figures["writes"]]
    lines += ["", "| path | RU, default policy | RU, orders policy | saved |", "| --- | --- | --- | --- |"]
    paths = figures["per path"]
    whole = {name: round(sum(ru[name] for ru in paths.values()), 1) for name in ("default", "orders")}
    rows = [(step, ru, ".1f") for step, ru in paths.items()]
    rows.append(("an order and its two events, per 1,000", {k: v * 1000 for k, v in whole.items()}, ",.0f"))
    for step, ru, number in rows:
        saved = 1 - ru["orders"] / ru["default"]
        lines.append(f"| {step} | {ru['default']:{number}} | {ru['orders']:{number}} | {saved:.0%} |")
    return "\n".join(lines)


def main() -> None:
    """Print the tables (or the figures as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    figures = estimate()
    print(json.dumps(figures, indent=2) if parser.parse_args().json else markdown(figures))


if __name__ == "__main__":
    main()
