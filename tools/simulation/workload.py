"""One run's traffic, built from its seed with sbctl's generator, and what must become of each message.

Per order: the OrderPlaced message; sometimes exact copies and reformatted copies (a retrying
producer: same MessageId, inside or past the queue's detection window); sometimes a copy with other
content under the same id, sent only once the original has left the queue, so that "first content"
is well defined; and its lifecycle events on the order's session, often out of sequence and sometimes
before the order itself. Besides: invalid messages (bad JSON, a missing field, MessageId other than
orderId, an event whose MessageId is not its id).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec

from sbctl import generate
from shared.delivery import SETTLEMENTS
from shared.domain.lifecycle import KINDS
from shared.domain.orders import OrderPlaced
from shared.domain.outcomes import Outcome
from shared.settings import Settings
from simulation.scheduler import Clock

INVALID = SETTLEMENTS[Outcome.INVALID].reason
MISMATCH = SETTLEMENTS[Outcome.PAYLOAD_MISMATCH].reason


@dataclass(frozen=True)
class Outgoing:
    """A message a producer sends, and the dead-letter reason it must end with (None: it must be completed)."""

    tag: int
    queue: str
    label: str
    message_id: str | None
    body: bytes
    session_id: str | None
    correlation_id: str | None
    expect: str | None = None


@dataclass(frozen=True)
class Send:
    """Send ``message`` ``at`` seconds into the run; with ``after``, not before that message left its queue
    and its detection window passed."""

    at: float
    message: Outgoing
    after: int | None = None


@dataclass(frozen=True)
class EventPlan:
    """A valid lifecycle event of an order."""

    event_id: str
    sequence: int
    type: str


@dataclass(frozen=True)
class OrderPlan:
    """A valid order: its first content's hash, and its events in sequence."""

    order_id: str
    request_hash: str
    events: tuple[EventPlan, ...]

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
    """The traffic of one run: 3 to 8 orders with their copies and events, and up to 3 invalid messages."""
    builder = _Builder(rng, settings, clock, window)
    for _ in range(rng.randint(3, 8)):
        builder.order()
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

    def message(self, queue: str, label: str, message_id: str | None, body: bytes, *, session_id: str | None = None,
                expect: str | None = None) -> Outgoing:
        outgoing = Outgoing(len(self.messages), queue, label, message_id, body, session_id,
                            f"corr-{session_id or message_id}", expect)
        self.messages.append(outgoing)
        return outgoing

    def copy_time(self, sent: float) -> float:
        """When a producer's retry goes out: inside the detection window (dropped) or past it (delivered)."""
        if self.rng.random() < 0.5:
            return sent + self.rng.uniform(1.0, self.window * 0.9)
        return sent + self.window + self.rng.uniform(1.0, 300.0)

    def order(self) -> None:
        rng, orders = self.rng, self.settings.orders_queue
        body = generate.order(rng, self.now)
        order_id = body["orderId"]
        sent = rng.uniform(60.0, 400.0)
        original = self.message(orders, "order", order_id, msgspec.json.encode(body))
        script = [Send(sent, original)]
        if rng.random() < 0.3:
            script.append(Send(self.copy_time(sent), self.message(orders, "exact copy", order_id, original.body)))
        if rng.random() < 0.3:
            copy = self.message(orders, "reformatted copy", order_id, reformatted(rng, body))
            script.append(Send(self.copy_time(sent), copy))
        if rng.random() < 0.2:
            altered = self.message(orders, "altered copy", order_id, msgspec.json.encode(generate.altered(rng, body)),
                                   expect=MISMATCH)
            script.append(Send(sent + self.window + rng.uniform(1.0, 300.0), altered, after=original.tag))
        self.scripts.append(tuple(sorted(script, key=lambda s: s.at)))
        events = generate.order_events(rng, body) if rng.random() < 0.8 else []
        self.orders.append(OrderPlan(order_id, msgspec.convert(body, OrderPlaced).request_hash(), tuple(
            EventPlan(e["id"], e["data"]["sequence"], e["type"]) for e in events)))
        self.bodies.append(body)
        if events:
            self.events(order_id, sent, events)

    def events(self, order_id: str, order_sent: float, events: list[dict[str, Any]]) -> None:
        """The order's events on its session: spaced out, shuffled half the time, early a third of the time."""
        rng, queue = self.rng, self.settings.order_events_queue
        start = order_sent - rng.uniform(1.0, 60.0) if rng.random() < 0.3 else order_sent + rng.uniform(1.0, 120.0)
        times = sorted(start + rng.uniform(0.0, 60.0) for _ in events)
        if rng.random() < 0.5:
            rng.shuffle(times)
        script = []
        for event, at in zip(events, times, strict=True):
            label = f"event v{event['data']['sequence']}"
            sent = self.message(queue, label, event["id"], msgspec.json.encode(event), session_id=order_id)
            script.append(Send(at, sent))
            if rng.random() < 0.15:
                copy = self.message(queue, f"{label} exact copy", event["id"], sent.body, session_id=order_id)
                script.append(Send(self.copy_time(at), copy))
            if rng.random() < 0.1:
                altered = self.message(queue, f"{label} altered copy", event["id"],
                                       msgspec.json.encode(generate.altered(rng, event)), session_id=order_id,
                                       expect=MISMATCH)
                script.append(Send(at + self.window + rng.uniform(1.0, 300.0), altered, after=sent.tag))
        self.scripts.append(tuple(sorted(script, key=lambda s: s.at)))

    def invalid(self) -> None:
        """One invalid message: each is dead-lettered InvalidMessage and leaves no trace in the store."""
        rng, orders, events = self.rng, self.settings.orders_queue, self.settings.order_events_queue
        body = generate.order(rng, self.now)
        order_id = body["orderId"]
        kind = rng.choice(("bad json", "missing field", "id mismatch", "event id mismatch"))
        if kind == "bad json":
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
