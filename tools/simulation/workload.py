"""One run's traffic, built from its seed with sbctl's generator, and what must become of each message.

Per order: the OrderPlaced message; sometimes exact copies and reformatted copies (a retrying
producer: same MessageId, inside or past the queue's detection window); sometimes a copy with other
content under the same id, sent only once the original has left the queue, so that "first content"
is well defined; and its lifecycle events on the order's session, often out of sequence and sometimes
before the order itself. Besides: invalid messages (bad JSON, a missing field, MessageId other than
orderId, an event whose MessageId is not its id).

In a quarter of the runs one order is a storm, the platform's limits its input: its OrderPlaced is held
back (half the time with a body near 256 KB, a thousand lines) while a producer that rebuilds its events
on every retry sends each of them tens to a hundred and twenty times, each copy under a new id, and
tens of out-of-turn events follow that can never apply (versions past the order's last). The release
that comes then passes a transactional batch's 100 operations, and a query page many times over.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec

from idempotent_consumer.delivery import SETTLEMENTS
from idempotent_consumer.outcomes import Outcome
from sbctl import generate
from shared.domain.lifecycle import KINDS
from shared.domain.orders import MAX_ITEMS, OrderPlaced
from shared.domain.rules import MAX_BODY_BYTES
from shared.settings import Settings
from simulation.scheduler import Clock

INVALID = SETTLEMENTS[Outcome.INVALID].reason
MISMATCH = SETTLEMENTS[Outcome.PAYLOAD_MISMATCH].reason
FORBIDDEN = SETTLEMENTS[Outcome.INVALID_TRANSITION].reason
STORM_RATE = 0.25  # the share of runs with a storm order
STORM_COPIES = (10, 120)  # copies of each event rebuilt under new ids
STORM_OUT_OF_TURN = (10, 80)  # events past the order's last version
SOLD_OUT_RATE = 0.15  # orders holding a sku the fulfilment fake is out of stock of
NEWER_PRODUCER_RATE = 0.3  # events sent by a newer producer, with fields in their data this version does not model
PRODUCER_PROPERTIES_RATE = 0.3  # messages whose producer sets application properties of its own
ELSEWHERE_RATE = 0.5  # of the altered copies of events, those sent for another order (another subject)
SHARED_ID_RATE = 0.1  # orders whose shipment, from another source, reuses the id of their payment
WAREHOUSE = "/warehouse"  # that other source: an id is unique within its source only (CloudEvents)


@dataclass(frozen=True)
class Outgoing:
    """A message a producer sends, and the dead-letter reason it must end with (None: it must be completed);
    with ``or_dead_lettered``, it may instead end dead-lettered with that reason."""

    tag: int
    queue: str
    label: str
    message_id: str | None
    body: bytes | None  # None: an AMQP value body, which the consumer cannot read
    session_id: str | None
    correlation_id: str | None
    expect: str | None = None
    or_dead_lettered: str | None = None
    properties: tuple[tuple[str, str], ...] = ()  # the producer's own application properties


@dataclass(frozen=True)
class Send:
    """Send ``message`` ``at`` seconds into the run; with ``after``, not before that message left its queue
    and its detection window passed."""

    at: float
    message: Outgoing
    after: int | None = None


@dataclass(frozen=True)
class EventPlan:
    """A valid lifecycle event of an order; ``aliases``, the ids of its copies rebuilt under new ids, of which
    (with its own) exactly one applies; ``newer``, the fields a newer producer added to its ``data``, which its
    record and its order's sub-object must keep."""

    event_id: str
    sequence: int
    type: str
    aliases: tuple[str, ...] = ()
    newer: tuple[tuple[str, Any], ...] = ()
    source: str = generate.EVENT_SOURCE

    @property
    def keys(self) -> tuple[tuple[str, str], ...]:
        """The identities (source, id) of the event and of its rebuilt copies."""
        return tuple((self.source, i) for i in (self.event_id, *self.aliases))


@dataclass(frozen=True)
class OrderPlan:
    """A valid order: its first content's hash, its events in sequence, and whether the fulfilment service refuses
    its reservation (out of stock): then it ends with OrderRejected, else with its reservation and OrderAccepted."""

    order_id: str
    request_hash: str
    events: tuple[EventPlan, ...]
    refused: bool = False

    @property
    def final_version(self) -> int:
        """The order's version once every event is applied."""
        return 1 + len(self.events)

    @property
    def final_status(self) -> str:
        """The order's status once every event is applied, by the state machine."""
        return KINDS[self.events[-1].type].status_after if self.events else "placed"


@dataclass(frozen=True)
class Workload:
    """Producer scripts (each sent in order by one producer), every message by tag, and the valid orders."""

    scripts: tuple[tuple[Send, ...], ...]
    messages: tuple[Outgoing, ...]
    orders: tuple[OrderPlan, ...]


def build_workload(rng: random.Random, settings: Settings, clock: Clock, window: float) -> Workload:
    """The traffic of one run: 3 to 8 orders with their copies and events, up to 3 invalid messages, and in a
    quarter of the runs a storm on one order."""
    builder = _Builder(rng, settings, clock, window)
    count = rng.randint(3, 8)
    storm = rng.randrange(count) if rng.random() < STORM_RATE else None
    for index in range(count):
        builder.order(storm=index == storm)
    for _ in range(rng.randint(0, 3)):
        builder.invalid()
    return Workload(tuple(builder.scripts), tuple(builder.messages), tuple(builder.orders))


class _Builder:
    def __init__(self, rng: random.Random, settings: Settings, clock: Clock, window: float) -> None:
        self.rng = rng
        self.settings = settings
        self.now = clock.utc()
        self.window = window
        self.scripts: list[tuple[Send, ...]] = []
        self.messages: list[Outgoing] = []
        self.orders: list[OrderPlan] = []
        self.bodies: list[dict[str, Any]] = []

    def message(self, queue: str, label: str, message_id: str | None, body: bytes | None, *,
                session_id: str | None = None, expect: str | None = None,
                or_dead_lettered: str | None = None) -> Outgoing:
        """One message a producer sends; now and then with application properties of its own, a ``retryAttempt``
        (its resend counter, a name the consumer once took for its own) among them, which the consumer must neither
        read nor lose."""
        properties: tuple[tuple[str, str], ...] = ()
        if self.rng.random() < PRODUCER_PROPERTIES_RATE:
            properties = (("retryAttempt", str(self.rng.randint(0, 3))), ("tenant", self.rng.choice(("eu", "us"))))
        outgoing = Outgoing(len(self.messages), queue, label, message_id, body, session_id,
                            f"corr-{session_id or message_id}", expect, or_dead_lettered, properties)
        self.messages.append(outgoing)
        return outgoing

    def copy_time(self, sent: float) -> float:
        """When a producer's retry goes out: inside the detection window (dropped) or past it (delivered)."""
        if self.rng.random() < 0.5:
            return sent + self.rng.uniform(1.0, self.window * 0.9)
        return sent + self.window + self.rng.uniform(1.0, 300.0)

    def order(self, *, storm: bool = False) -> None:
        rng, orders = self.rng, self.settings.orders_queue
        body = generate.order(rng, self.now)
        if storm and rng.random() < 0.5:
            body = large(rng, body)
        if rng.random() < SOLD_OUT_RATE:
            body = generate.sold_out(body)
        order_id = body["orderId"]
        # A storm's order is held back while its events are rebuilt and resent ahead of it.
        sent = rng.uniform(400.0, 900.0) if storm else rng.uniform(60.0, 400.0)
        encoded = msgspec.json.encode(body)
        original = self.message(orders, "order", order_id, encoded)
        script = [Send(sent, original)]
        if rng.random() < 0.3:
            script.append(Send(self.copy_time(sent), self.message(orders, "exact copy", order_id, encoded)))
        if rng.random() < 0.3 and len(encoded) < MAX_BODY_BYTES // 2:  # reformatted, it grows
            copy = self.message(orders, "reformatted copy", order_id, reformatted(rng, body))
            script.append(Send(self.copy_time(sent), copy))
        if rng.random() < 0.2:
            altered = self.message(orders, "altered copy", order_id, msgspec.json.encode(generate.altered(rng, body)),
                                   expect=MISMATCH)
            script.append(Send(sent + self.window + rng.uniform(1.0, 300.0), altered, after=original.tag))
        self.scripts.append(tuple(sorted(script, key=lambda s: s.at)))
        events = [newer(rng, e) for e in generate.order_events(rng, body)] if storm or rng.random() < 0.8 else []
        shared = not storm and len(events) == 2 and rng.random() < SHARED_ID_RATE
        if shared:  # the warehouse's shipment under the payment system's id: another event
            events[1] = {**events[1], "id": events[0]["id"], "source": WAREHOUSE}
        plans = [EventPlan(e["id"], e["data"]["sequence"], e["type"], newer=tuple(_newer_fields(e)), source=e["source"])
                 for e in events]
        if events:
            self.events(order_id, sent, events, storm=storm, shared=shared)
        if storm:
            plans = self.storm(order_id, sent, events, plans)
        self.orders.append(OrderPlan(order_id, msgspec.convert(body, OrderPlaced).request_hash(), tuple(plans),
                                     generate.is_sold_out(body)))
        self.bodies.append(body)

    def events(self, order_id: str, order_sent: float, events: list[dict[str, Any]], *, storm: bool = False,
               shared: bool = False) -> None:
        """The order's events on its session: spaced out, shuffled half the time, early a third of the time (a
        storm's always). An altered copy goes, half the time, for another order: the same source and id under
        that order's subject, which must be dead-lettered and never touch it. With ``shared``, the second event
        has the first's id from another source: it goes once the first left its queue and the queue's detection
        window (which keys on the MessageId alone) passed, and neither has copies under that MessageId."""
        rng, queue = self.rng, self.settings.order_events_queue
        early = storm or rng.random() < 0.3
        start = order_sent - rng.uniform(1.0, 60.0) if early else order_sent + rng.uniform(1.0, 120.0)
        times = sorted(start + rng.uniform(0.0, 60.0) for _ in events)
        if rng.random() < 0.5 and not shared:
            rng.shuffle(times)
        script: list[Send] = []
        for event, at in zip(events, times, strict=True):
            label = f"event v{event['data']['sequence']}"
            sent = self.message(queue, label, event["id"], msgspec.json.encode(event), session_id=order_id)
            script.append(Send(at, sent, after=script[0].message.tag if shared and script else None))
            if shared:
                continue
            if rng.random() < 0.15:
                copy = self.message(queue, f"{label} exact copy", event["id"], sent.body, session_id=order_id)
                script.append(Send(self.copy_time(at), copy))
            if not storm and rng.random() < 0.1:  # in a storm another may take its version: then it is stale
                subject = rng.choice(self.bodies)["orderId"] if self.bodies and rng.random() < ELSEWHERE_RATE \
                    else order_id
                altered = self.message(queue, f"{label} altered copy" + (" for another order" if subject != order_id
                                                                          else ""), event["id"],
                                       msgspec.json.encode(generate.altered(rng, event, subject=subject)),
                                       session_id=subject, expect=MISMATCH)
                script.append(Send(at + self.window + rng.uniform(1.0, 300.0), altered, after=sent.tag))
        self.scripts.append(tuple(sorted(script, key=lambda s: s.at)))

    def storm(self, order_id: str, order_sent: float, events: list[dict[str, Any]],
              plans: list[EventPlan]) -> list[EventPlan]:
        """A producer that rebuilds each event under a new id on every retry, mostly while the order is held
        back, and events past the order's last version, which can never apply: the order ends shipped or
        cancelled, so each is rejected when it is released, or dead-lettered InvalidTransition if it comes
        after. The plans, with each event's rebuilt copies as its aliases."""
        rng, queue = self.rng, self.settings.order_events_queue
        window = (order_sent - 380.0, order_sent + 60.0)
        script, aliases = [], []
        for event in events:
            label = f"event v{event['data']['sequence']} rebuilt"
            copies = [{**event, "id": f"evt-{generate.uuid_from(rng)}"} for _ in range(rng.randint(*STORM_COPIES))]
            for copy in copies:
                message = self.message(queue, label, copy["id"], msgspec.json.encode(copy), session_id=order_id)
                script.append(Send(rng.uniform(*window), message))
            aliases.append(tuple(c["id"] for c in copies))
        last = events[-1]["data"]["sequence"]
        for sequence in range(last + 1, last + 1 + rng.randint(*STORM_OUT_OF_TURN)):
            junk = {**rng.choice(events), "id": f"evt-{generate.uuid_from(rng)}"}
            junk = {**junk, "data": {**junk["data"], "sequence": sequence}}
            message = self.message(queue, f"event v{sequence} out of turn for good", junk["id"],
                                   msgspec.json.encode(junk), session_id=order_id, or_dead_lettered=FORBIDDEN)
            script.append(Send(rng.uniform(*window), message))
        self.scripts.append(tuple(sorted(script, key=lambda s: s.at)))
        return [replace(plan, aliases=copies) for plan, copies in zip(plans, aliases, strict=True)]

    def invalid(self) -> None:
        """One invalid message: each is dead-lettered InvalidMessage and leaves no trace in the store."""
        rng, orders, events = self.rng, self.settings.orders_queue, self.settings.order_events_queue
        body = generate.order(rng, self.now)
        order_id = body["orderId"]
        kind = rng.choice(("bad json", "missing field", "id mismatch", "event id mismatch", "amqp value"))
        if kind == "amqp value":  # a JMS producer's: no data section to read
            message = self.message(orders, kind, order_id, None, expect=INVALID)
        elif kind == "bad json":
            message = self.message(orders, kind, order_id, msgspec.json.encode(body)[:-7], expect=INVALID)
        elif kind == "missing field":
            del body[rng.choice(("customerId", "items", "total", "placedAt"))]
            message = self.message(orders, kind, order_id, msgspec.json.encode(body), expect=INVALID)
        elif kind == "id mismatch":
            message = self.message(orders, kind, f"{order_id}-other", msgspec.json.encode(body), expect=INVALID)
        else:  # on a valid order's session, which it must not hold up
            owner = rng.choice(self.bodies)
            event = generate.order_events(rng, owner)[0]
            message = self.message(events, kind, f"{event['id']}-other", msgspec.json.encode(event),
                                   session_id=owner["orderId"], expect=INVALID)
        self.scripts.append((Send(rng.uniform(0.0, 600.0), message),))


def newer(rng: random.Random, event: dict[str, Any]) -> dict[str, Any]:
    """The event as a newer producer sends it, now and then: fields in its ``data`` this version does not model
    (a value and an object), which it must store as written, never drop."""
    if rng.random() >= NEWER_PRODUCER_RATE:
        return event
    extra = {"channel": rng.choice(("web", "app", "store")), "trace": {"producer": "v2", "hop": rng.randint(1, 9)}}
    return {**event, "data": {**event["data"], **extra}}


def _newer_fields(event: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in event["data"].items() if k in ("channel", "trace")]


def large(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """The order with as many lines as an order may hold (1,000), its skus as long as its body may grow to
    just under 256 KB: the largest order the app takes, near the message's limit."""
    items = [{"sku": "", "quantity": 1, "unitPrice": "1"} for _ in range(MAX_ITEMS)]
    bare = len(msgspec.json.encode({**body, "items": items, "total": str(MAX_ITEMS)}))
    length = min(255, (MAX_BODY_BYTES - bare) // MAX_ITEMS - rng.randint(0, 8))
    for n, item in enumerate(items):
        item["sku"] = f"SKU-{n:04d}-".ljust(length, "x")
    return {**body, "items": items, "total": str(MAX_ITEMS)}


def reformatted(rng: random.Random, body: dict[str, Any]) -> bytes:
    """The same order in another JSON spelling: key order, whitespace, trailing zeros, currency case, time offset."""
    offset = timezone(timedelta(hours=rng.randint(-5, 5)))
    items = [_shuffled(rng, {**item, "unitPrice": _padded(item["unitPrice"])}) for item in body["items"]]
    value = {**body, "items": items, "total": _padded(body["total"]), "currency": body["currency"].lower(),
             "placedAt": datetime.fromisoformat(body["placedAt"]).astimezone(offset).isoformat()}
    return json.dumps(_shuffled(rng, value), indent=rng.choice((None, 1, 4))).encode()


def _padded(money: str) -> str:
    return f"{money}0" if "." in money else f"{money}.0"


def _shuffled(rng: random.Random, value: dict[str, Any]) -> dict[str, Any]:
    keys = list(value)
    rng.shuffle(keys)
    return {key: value[key] for key in keys}
