"""RU of every path a message can take, under Cosmos DB's default indexing policy and under the orders container's
policy, estimated with the published cost model from the documents the app really writes.

RU cannot be measured here: the local server charges a flat 1 RU a request, and the Linux emulator
implements neither RU nor custom indexing policies. So this runs the app (``shared.bootstrap.build``)
over the in-memory store, records every write with the document before and after it, every point read,
query page and refused write, and counts index terms: one per leaf value (each array item's leaves too),
plus ``id`` and ``_ts``, which Cosmos always indexes; under an opt-in policy, each explicitly included path
a document lacks adds one "undefined" term. The model (Microsoft's, "Understand request units consumption"):
a create costs a size charge (5 RU up to 1 KB, the page's size table above) + 0.2 per indexed term; a
replace twice the size charge + 0.4 per changed indexed term (each removed and inserted); a patch the same
plus its base charge, 0.4 per property it sets (a column apart); a delete the size charge + 0.2 per indexed
term it removes; a point read 1 RU up to 1 KB. A refused write and a query page are counted, not priced (no
price is published); the change feed's reads are priced as a point read of each document a write leaves, and
on serverless each document carrying a ttl as a delete of it when it expires. The figures are estimates.

The paths, each walked on its own store: a new order with two items, accepted and refused; a copy of a
finished order; each event in turn (a captured payment, a shipment); a duplicate event; an early event
parked and its release; an event before its order and the order that releases it; one run of each timer.

    python -m bench.index_terms            # the table docs/performance.md quotes
    python -m bench.index_terms --json
    python -m bench.index_terms --policy candidate.json   # a candidate policy priced in the orders policy's place
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from idempotent_consumer.errors import NotFound, StoreError
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ports.store import (
    MAX_PAGE_ITEMS,
    BatchOperation,
    Create,
    Delete,
    Document,
    DocumentStore,
    Patch,
    Replace,
    query_all,
)
from idempotent_consumer.records import SYSTEM_PROPERTIES
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.ports.fulfilment import Reply
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ORDERS_POLICY = ROOT / "infra" / "orders-indexing-policy.json"
# What a container gets without an indexing policy: every path, but the etag.
DEFAULT_POLICY: dict[str, Any] = {"indexingMode": "consistent", "automatic": True,
                                  "includedPaths": [{"path": "/*"}], "excludedPaths": [{"path": '/"_etag"/?'}]}
ALWAYS_INDEXED = ("/id/?", "/_ts/?")
UNDEFINED = object()  # what an explicitly included path that a document lacks is indexed as
_ABSENT = object()
CREATE_PER_TERM, REPLACE_PER_TERM, DELETE_PER_TERM, PATCH_BASE_PER_PROPERTY = 0.2, 0.4, 0.2, 0.4
# Microsoft's size table: (KB, point read RU, write RU); up to 1 KB the page's examples' 1 and 5 are used.
SIZE_TABLE = ((2, 1.04, 6.29), (4, 1.14, 6.67), (8, 1.33, 7.04), (16, 1.67, 9.52), (32, 2.19, 11.23),
              (64, 4.76, 22.67), (128, 9.95, 48.19), (256, 20.28, 98.29), (512, 40.95, 184.57),
              (1024, 145.90, 625.00), (2048, 291.80, 1250.00))
EVENTS_PER_ORDER = 1.87  # events per order in the measured traffic (docs/performance.md, the events path)
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
    patched: int = 0  # the properties a patch sets: its base charge is 0.4 RU each

    @property
    def document(self) -> Document:
        return self.after if self.after is not None else self.before or {}

    def terms(self, policy: Policy) -> int:
        """Indexed terms written (a create), changed (a replace or patch) or removed (a delete)."""
        if self.before is None:
            return len(terms(self.after or {}, policy))
        if self.after is None:
            return len(terms(self.before, policy))
        return changed_terms(self.before, self.after, policy)

    def ru(self, policy: Policy) -> float:
        """The published model's estimate for this write, a patch's base charge apart (``patch_base``)."""
        base = write_base(size(self.document))
        if self.before is None:
            return base + CREATE_PER_TERM * self.terms(policy)
        if self.after is None:
            return base + DELETE_PER_TERM * self.terms(policy)
        return 2 * base + REPLACE_PER_TERM * self.terms(policy)

    @property
    def patch_base(self) -> float:
        """A patch's base charge: 0.4 RU per property it sets, by the same page ("0.4 * 2 (base for patch)")."""
        return PATCH_BASE_PER_PROPERTY * self.patched

    @property
    def expires(self) -> bool:
        """Whether the document it leaves carries a ttl, so that its expiry deletes it later (charged on serverless)."""
        ttl = (self.after or {}).get("ttl")
        return isinstance(ttl, int) and ttl > 0


@dataclass(frozen=True)
class Other:
    """A request that writes nothing: a point read (``read``, 404 when nothing stood), a query page (``query``),
    or a write refused whole (``refused``, with its status: 409, 412, 404)."""

    step: str
    operation: str
    kind: str
    status: int = 200
    bytes: int = 0
    items: int = 0

    @property
    def ru(self) -> float:
        """A read's price by the published size table; a query's and a refused write's are not published: 0 here."""
        return read_price(self.bytes) if self.operation == "read" else 0.0


def size(document: Mapping[str, Any]) -> int:
    """A stored document's bytes, as JSON."""
    return len(json.dumps(document, separators=(",", ":")).encode())


def write_base(nbytes: int) -> float:
    """A write's document-size charge: 5 RU up to 1 KB (the page's examples), the size table's write column above."""
    return 5.0 if nbytes <= 1024 else next(w for kb, _, w in SIZE_TABLE if nbytes <= kb * 1024)


def read_price(nbytes: int) -> float:
    """A point read's charge: 1 RU up to 1 KB, the size table's read column above."""
    return 1.0 if nbytes <= 1024 else next(r for kb, r, _ in SIZE_TABLE if nbytes <= kb * 1024)


class RecordingStore:
    """The in-memory store, recording each write with the document as it was before and as written, and each
    read, query page and refused write apart (``others``). Nothing is recorded while ``step`` is empty."""

    def __init__(self) -> None:
        self._store = InMemoryStore(default_ttl=-1)
        self.step = ""
        self.writes: list[Write] = []
        self.others: list[Other] = []

    def _other(self, operation: str, kind: str, status: int = 200, nbytes: int = 0, items: int = 0) -> None:
        if self.step:
            self.others.append(Other(self.step, operation, kind, status, nbytes, items))

    def _write(self, write: Write) -> None:
        if self.step:
            self.writes.append(write)

    async def create(self, document: Document) -> Document:
        try:
            written = await self._store.create(document)
        except StoreError as exc:
            self._other("refused", f"create {document.get('type')}", exc.status or 0)
            raise
        self._write(Write(self.step, "create", str(written.get("type")), None, written))
        return written

    async def read(self, doc_id: str, partition_key: str) -> Document:
        try:
            found = await self._store.read(doc_id, partition_key)
        except NotFound:
            self._other("read", "(none)", 404)
            raise
        self._other("read", str(found.get("type")), 200, size(found))
        return found

    async def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                          before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
                          ) -> AsyncIterator[list[Document]]:
        kind = str(conditions.get("type", "any"))
        async for page in self._store.query_pages(conditions, partition_key=partition_key, before=before,
                                                  page_size=page_size):
            self._other("query", f"{kind}{'' if partition_key else ', all partitions'}", items=len(page))
            yield page

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        before = [await self._current(partition_key, op) for op in operations]
        try:
            written = await self._store.execute_batch(partition_key, operations)
        except StoreError as exc:
            named = ", ".join(_verb(op, old) for op, old in zip(operations, before, strict=True))
            self._other("refused", f"batch of {named}", exc.status or 0)
            raise
        for op, old, answer in zip(operations, before, written, strict=True):
            if isinstance(op, Delete):
                if old is not None:
                    self._write(Write(self.step, "delete", str(old.get("type")), old, None))
                continue
            operation = "create" if isinstance(op, Create) else "patch" if isinstance(op, Patch) else "replace"
            # An etag_only patch answers with its id and etag alone: the document written is the one stored.
            new = await self._store.read(op.doc_id, partition_key) if isinstance(op, Patch) else answer
            patched = len(op.set_fields) if isinstance(op, Patch) else 0
            self._write(Write(self.step, operation, str(new.get("type")), old, new, patched))
        return written

    async def _current(self, partition_key: str, op: BatchOperation) -> Document | None:
        if isinstance(op, Create):
            return None
        doc_id = op.document["id"] if isinstance(op, Replace) else op.doc_id  # a Patch's or a Delete's
        try:
            return await self._store.read(doc_id, partition_key)
        except NotFound:
            return None


def _verb(op: BatchOperation, old: Document | None) -> str:
    kind = op.document.get("type") if isinstance(op, Create | Replace) else (old or {}).get("type", "(absent)")
    return f"{type(op).__name__.lower()} {kind}"


class Refusing:
    """The fulfilment service refusing every order for good: out of stock (a 422 naming its refusal)."""

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        return Reply(422, {"refusal": "out-of-stock", "reason": "BOOK-0451 is out of stock"})


def _message(message_id: str, body: Mapping[str, Any], sequence: int) -> InboundMessage:
    return InboundMessage(message_id=message_id, body=json.dumps(body).encode(), correlation_id="corr-7f3e1d2c",
                          session_id=ORDER_ID if sequence > 1 else None, delivery_count=0,
                          enqueued_time_utc=NOW, sequence_number=sequence)


def _event(number: int) -> InboundMessage:
    _, event_type, time, data = EVENTS[number - 2]
    event = {"specversion": "1.0", "id": f"evt-{number}-5c1d9e7a-4b2f-4d3e-8a6b", "source": "/orders/checkout",
             "type": event_type, "subject": ORDER_ID, "time": time,
             "datacontenttype": "application/json", "data": data}
    return _message(str(event["id"]), event, number)


class Run:
    """One app over a store of its own, and the steps of one walk through it: ``steps`` names the step the store's
    requests belong to ("" for those not counted)."""

    def __init__(self, store: DocumentStore, steps: Callable[[str], None], fulfilment: Any = None, *,
                 claim_in_order: bool = False) -> None:
        self.store, self._steps = store, steps
        settings = Settings(fulfillment_url="http://fulfilment.invalid", reservation_claim_in_order=claim_in_order)
        self.app = bootstrap.build(settings, store=store,
                                   fulfilment=fulfilment or InMemoryFulfilment(), sender=RecordingSender(),
                                   clock=NOW.timestamp)

    async def order(self, step: str = "") -> None:
        """OrderPlaced, then the change feed's batch of what it wrote (the publisher sends and deletes the entry)."""
        self._steps(step)
        await self.app.handle_order(_message(ORDER_ID, ORDER, 1))
        self._steps("")
        documents = await query_all(self.store, {}, partition_key=ORDER_ID)  # what the feed hands over: not counted
        self._steps(step)
        await self.app.publisher().publish(documents)
        self._steps("")

    async def event(self, number: int, step: str = "") -> None:
        self._steps(step)
        await self.app.handle_event(_event(number))
        self._steps("")

    async def timers(self) -> None:
        self._steps("outbox sweep, per run")
        await self.app.publisher().sweep(stuck_after_seconds=120)
        self._steps("stuck report, per run")
        await self.app.report_stuck(NOW.timestamp())
        self._steps("")


async def walk(new_run: Callable[[Any, bool], Awaitable[Run]]) -> None:
    """Every path a message can take, each on a store of its own (``new_run(fulfilment, claim_in_order)``): the steps
    before a path are not counted. The paths a new order's claim changes are walked again with the claim kept in
    the order (RESERVATION_CLAIM_IN_ORDER), named with ``IN_ORDER``."""
    run = await new_run(None, False)
    await run.order("new order")
    for number, (step, *_) in enumerate(EVENTS, start=2):
        await run.event(number, step)
    await run.order("copy of a finished order")
    await run.event(2, "duplicate event")
    kept = await new_run(None, True)
    await kept.order(f"new order{IN_ORDER}")
    for number, (step, *_) in enumerate(EVENTS, start=2):
        await kept.event(number, f"{step}{IN_ORDER}")
    await kept.order(f"copy of a finished order{IN_ORDER}")
    await (await new_run(Refusing(), False)).order("new order, refused")
    early = await new_run(None, False)
    await early.order()
    await early.event(3, "early event, parked")
    await early.event(2, "event in turn, releasing the parked one")
    first = await new_run(None, False)
    await first.event(2, "event before its order, parked")
    await first.order("order after its event, releasing it")
    timers = await new_run(None, False)
    await timers.order()
    await timers.timers()


async def _record() -> tuple[list[Write], list[Other]]:
    """Every path, on recording in-memory stores."""
    writes: list[Write] = []
    others: list[Other] = []
    stores: list[RecordingStore] = []

    async def new_run(fulfilment: Any, claim_in_order: bool) -> Run:
        store = RecordingStore()
        stores.append(store)
        return Run(store, functools.partial(setattr, store, "step"), fulfilment, claim_in_order=claim_in_order)

    await walk(new_run)
    for store in stores:
        writes.extend(store.writes)
        others.extend(store.others)
    return writes, others


def writes() -> list[Write]:
    """Every write of every path, in order."""
    return asyncio.run(_record())[0]


PATHS_PER_ORDER = ("new order", "captured payment", "shipment")
IN_ORDER = ", claim in the order"  # a path walked with RESERVATION_CLAIM_IN_ORDER true


def estimate(policy: Path = ORDERS_POLICY) -> dict[str, Any]:
    """Terms and RU per write and per path, under the default policy and the orders container's (or ``policy``, a
    candidate's), and each path's reads, refused writes, query pages, change-feed reads and TTL deletes."""
    policies = {"default": Policy.of(DEFAULT_POLICY), "orders": Policy.of(json.loads(policy.read_text()))}
    recorded, others = asyncio.run(_record())
    rows: list[dict[str, Any]] = [{"step": w.step, "write": f"{w.operation} {w.kind}", "bytes": size(w.document),
             **{f"terms {name}": w.terms(p) for name, p in policies.items()},
             **{f"RU {name}": round(w.ru(p), 1) for name, p in policies.items()},
             "patch base": round(w.patch_base, 1)} for w in recorded]
    steps = list(dict.fromkeys([*(w.step for w in recorded), *(o.step for o in others)]))
    paths: dict[str, dict[str, Any]] = {}
    for step in steps:
        mine = [w for w in recorded if w.step == step]
        theirs = [o for o in others if o.step == step]
        orders = policies["orders"]
        paths[step] = {
            "default": round(sum(w.ru(policies["default"]) for w in mine), 1),
            "orders": round(sum(w.ru(orders) for w in mine), 1),
            "patch base": round(sum(w.patch_base for w in mine), 1),
            "reads": round(sum(o.ru for o in theirs), 1),
            "refused": ", ".join(f"{o.kind} ({o.status})" for o in theirs if o.operation == "refused") or "-",
            "query pages": sum(1 for o in theirs if o.operation == "query"),
            # The change feed reads each document a write leaves (a delete shows no change), about as a point read.
            "feed reads": round(sum(read_price(size(w.after)) for w in mine if w.after is not None), 1),
            # Serverless charges the expiry of what carries a ttl, about as a delete of it.
            "ttl deletes": round(sum(write_base(size(w.document)) + DELETE_PER_TERM * len(terms(w.document, orders))
                                     for w in _survivors(mine, recorded) if w.expires), 1),
        }
    for values in paths.values():
        values["provisioned"] = round(values["orders"] + values["patch base"] + values["reads"]
                                      + values["feed reads"], 1)
        values["serverless"] = round(values["provisioned"] + values["ttl deletes"], 1)
    return {"writes": rows, "per path": paths, "per order": _per_order(paths),
            "per order, claim in the order": _per_order(paths, IN_ORDER)}


def _survivors(mine: list[Write], recorded: list[Write]) -> list[Write]:
    """The last write of each document of a step that no later write of the walk deleted."""
    last: dict[tuple[str, str], Write] = {}
    for write in mine:
        last[(write.kind, str(write.document.get("id")))] = write
    deleted = {(w.kind, str(w.document.get("id"))) for w in recorded if w.after is None}
    return [w for key, w in last.items() if w.after is not None and key not in deleted]


def _per_order(paths: Mapping[str, Mapping[str, Any]], form: str = "") -> dict[str, float]:
    """An order with its events, EVENTS_PER_ORDER of them on average (each priced as the two events here, averaged);
    with ``form`` ``IN_ORDER``, those paths walked with the claim in the order."""
    events = [paths[step + form] for step in PATHS_PER_ORDER[1:]]
    return {column: round(paths["new order" + form][column] + EVENTS_PER_ORDER * sum(e[column] for e in events)
                          / len(events), 1) for column in ("orders", "provisioned", "serverless")}


def markdown(figures: Mapping[str, Any]) -> str:
    """The tables docs/performance.md quotes: each write, each path's write RU under both policies, and each
    path's every column under the orders policy."""
    lines = ["| path | write | bytes | terms, default policy | terms, orders policy | RU, default | RU, orders policy"
             " | patch base |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['step']} | {r['write']} | {r['bytes']} | {r['terms default']} | {r['terms orders']} |"
              f" {r['RU default']} | {r['RU orders']} | {r['patch base']} |" for r in figures["writes"]]
    lines += ["", "| path | RU, default policy | RU, orders policy | saved |", "| --- | --- | --- | --- |"]
    paths = figures["per path"]
    for step, ru in paths.items():
        saved = f"{1 - ru['orders'] / ru['default']:.0%}" if ru["default"] else "-"
        lines.append(f"| {step} | {ru['default']:.1f} | {ru['orders']:.1f} | {saved} |")
    lines += ["", "| path, orders policy | writes | patch base | reads | refused (unpriced) | query pages (unpriced)"
              " | feed reads | provisioned | TTL deletes | serverless |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {step} | {v['orders']:.1f} | {v['patch base']:.1f} | {v['reads']:.1f} | {v['refused']} |"
              f" {v['query pages']} | {v['feed reads']:.1f} | {v['provisioned']:.1f} | {v['ttl deletes']:.1f} |"
              f" {v['serverless']:.1f} |" for step, v in paths.items()]
    order, kept = figures["per order"], figures["per order, claim in the order"]
    lines += ["", f"An order with its events ({EVENTS_PER_ORDER} on average): writes {order['orders']:.1f} RU,"
              f" provisioned {order['provisioned']:.1f} RU, serverless {order['serverless']:.1f} RU; with the claim"
              f" in the order, writes {kept['orders']:.1f} RU, provisioned {kept['provisioned']:.1f} RU, serverless"
              f" {kept['serverless']:.1f} RU."]
    return "\n".join(lines)


def main() -> None:
    """Print the tables (or the figures as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--policy", type=Path, default=ORDERS_POLICY,
                        help="an indexing policy (JSON) to price in the orders policy's place: a candidate, before"
                             " it ships (default: infra/orders-indexing-policy.json)")
    arguments = parser.parse_args()
    try:
        candidate = json.loads(arguments.policy.read_text())
        Policy.of(candidate)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.exit(2, f"bench.index_terms: --policy {arguments.policy}: not an indexing policy with includedPaths"
                       f" and excludedPaths ({type(exc).__name__}: {exc})\n")
    figures = estimate(arguments.policy)
    print(json.dumps(figures, indent=2) if arguments.json else markdown(figures))


if __name__ == "__main__":
    main()
