"""The demo's traffic, planned from one seed, and what must become of each message.

Orders and their lifecycle events come from ``sbctl.generate``. On top of them: producer retries sent
right after their original (inside the queue's duplicate-detection window, so the broker drops
them), late copies sent after the window (they reach the consumer, which absorbs them), reused ids
with other content (sent late too: inside the window the broker would drop them as duplicates),
malformed messages, and events shuffled within their session.

A storm (chaos's storm phase) is an order whose OrderPlaced is held back while a producer that rebuilds
its events on every retry sends each of them many times, each under a new id, and events past the
order's last version follow that can never apply; the order goes once everything else was sent.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sbctl import generate

EARLY_COPY_RATE = 0.05
LATE_COPY_RATE = 0.03
REUSED_ID_RATE = 0.01
MALFORMED_RATE = 0.01
SHUFFLED_RATE = 0.2
SOLD_OUT_RATE = 0.03  # orders holding a sku the warehouse is out of stock of: refused, announced OrderRejected
# An event past its order's last version: it ends rejected, kept with the reason (parked before the order
# ended), or dead-lettered InvalidTransition (it came after).
NEVER_APPLIES = "rejected-or-InvalidTransition"


@dataclass(frozen=True)
class Planned:
    """One message to send: where, its ids and body, and what must become of it."""

    queue: str
    message_id: str
    body: bytes
    session_id: str | None = None
    # applied | absorbed-by-broker | absorbed-by-consumer | InvalidMessage | PayloadMismatch | NEVER_APPLIES
    expect: str = "applied"


@dataclass
class Scenario:
    """The whole run: what is sent first, what is sent after the window, and the expected end state."""

    first: list[Planned] = field(default_factory=list)  # orders, early copies, malformed: in send order
    events: list[Planned] = field(default_factory=list)  # lifecycle events, each session in its planned order
    late: list[Planned] = field(default_factory=list)  # sent once the detection window has passed
    held: list[Planned] = field(default_factory=list)  # storms' orders: sent once everything else was sent
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    lifecycles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Sent after the rest has drained, at a steady rate below capacity, in order, with no trouble: what the
    # latency on the report's first screen is measured on. Part of the scenario once ``take_steady`` ran.
    steady: list[Planned] = field(default_factory=list)
    _steady_orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    _steady_lifecycles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def take_steady(self) -> list[Planned]:
        """The steady phase's messages (each order, then its events), now counted in the scenario."""
        self.orders.update(self._steady_orders)
        self.lifecycles.update(self._steady_lifecycles)
        self.first += [p for p in self.steady if p.queue == "orders"]
        self.events += [p for p in self.steady if p.queue != "orders"]
        self._steady_orders, self._steady_lifecycles = {}, {}
        return self.steady

    @property
    def rejected(self) -> set[str]:
        """The orders the fulfilment service refuses (out of stock): each must end with OrderRejected, no reservation
        and no OrderAccepted."""
        return {order_id for order_id, body in self.orders.items() if generate.is_sold_out(body)}

    def everything(self) -> list[Planned]:
        """Every planned message."""
        return [*self.first, *self.events, *self.held, *self.late]

    def planned_dead_letters(self) -> Counter[str]:
        """Dead letters by reason, as planned."""
        return Counter(p.expect for p in self.everything() if p.expect in ("InvalidMessage", "PayloadMismatch"))

    def count(self, expect: str) -> int:
        """How many messages are planned to end a given way."""
        return sum(1 for p in self.everything() if p.expect == expect)


def _encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def plan(orders: int, seed: int, steady_orders: int = 0, *, storms: int = 0, storm_copies: int = 120) -> Scenario:
    """The scenario for ``orders`` orders from ``seed``, and ``steady_orders`` more for the steady phase. The
    first ``storms`` orders are storms, each event rebuilt ``storm_copies`` times and half as many events past
    the order's last version."""
    rng = random.Random(seed)  # noqa: S311 - test traffic, reproducible by seed
    scenario = Scenario()
    for index in range(orders):
        body = generate.order(rng)
        if index >= storms and rng.random() < SOLD_OUT_RATE:
            body = generate.sold_out(body)
        order_id = body["orderId"]
        scenario.orders[order_id] = body
        if index < storms:
            _storm(rng, scenario, body, storm_copies)
            continue
        scenario.first.append(Planned("orders", order_id, _encoded(body)))
        if rng.random() < EARLY_COPY_RATE:
            scenario.first.append(Planned("orders", order_id, _encoded(body), expect="absorbed-by-broker"))
        late_copy = rng.random() < LATE_COPY_RATE
        if late_copy:
            scenario.late.append(Planned("orders", order_id, _encoded(body), expect="absorbed-by-consumer"))
        if rng.random() < REUSED_ID_RATE:
            # Sent right after a late copy of the same id, it is inside that copy's detection window.
            scenario.late.append(Planned("orders", order_id, _encoded(generate.altered(rng, body)),
                                         expect="absorbed-by-broker" if late_copy else "PayloadMismatch"))
        lifecycle = generate.order_events(rng, body)
        scenario.lifecycles[order_id] = lifecycle
        sent = list(lifecycle)
        if len(sent) > 1 and rng.random() < SHUFFLED_RATE:
            sent.reverse()  # a later version first: it is parked until its predecessor comes
        scenario.events += [Planned("order-events", e["id"], _encoded(e), session_id=order_id) for e in sent]
        if rng.random() < MALFORMED_RATE:
            bad_id = f"bad-{uuid.UUID(int=rng.getrandbits(128))}"
            scenario.first.append(Planned("orders", bad_id, b'{"orderId": "' + bad_id.encode() + b'", "items": [',
                                          expect="InvalidMessage"))
    for _ in range(steady_orders):
        body = generate.order(rng)
        order_id = body["orderId"]
        lifecycle = generate.order_events(rng, body)
        scenario._steady_orders[order_id], scenario._steady_lifecycles[order_id] = body, lifecycle
        scenario.steady += [Planned("orders", order_id, _encoded(body)),
                            *(Planned("order-events", e["id"], _encoded(e), session_id=order_id) for e in lifecycle)]
    return scenario


def _storm(rng: random.Random, scenario: Scenario, body: dict[str, Any], copies: int) -> None:
    """A storm on one order: its events, each with ``copies`` rebuilt under new ids, and ``copies // 2`` past its
    last version, shuffled on its session; the order itself held back."""
    order_id = body["orderId"]
    lifecycle = generate.order_events(rng, body)
    scenario.lifecycles[order_id] = lifecycle
    scenario.held.append(Planned("orders", order_id, _encoded(body)))
    storm = []
    for event in lifecycle:
        storm.append(Planned("order-events", event["id"], _encoded(event), session_id=order_id))
        for _ in range(copies):
            copy = {**event, "id": f"evt-{generate.uuid_from(rng)}"}
            storm.append(Planned("order-events", copy["id"], _encoded(copy), session_id=order_id,
                                 expect="absorbed-by-consumer"))
    last = lifecycle[-1]["data"]["sequence"]
    for sequence in range(last + 1, last + 1 + copies // 2):
        junk = {**rng.choice(lifecycle), "id": f"evt-{generate.uuid_from(rng)}"}
        junk["data"] = {**junk["data"], "sequence": sequence}
        storm.append(Planned("order-events", junk["id"], _encoded(junk), session_id=order_id, expect=NEVER_APPLIES))
    rng.shuffle(storm)
    scenario.events += storm
