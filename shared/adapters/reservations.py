"""The fulfilment service's reservation rule, written once: the in-memory fake and the stand-in server share it.

The first request for an Idempotency-Key reserves and answers 201 with a new reservation id; a
repeat with the same request answers 200 with the stored reply; the same key with another request
answers 422. That is the contract the consumer relies on to call again safely after a lost reply.

The service is out of stock of every sku that starts with ``SOLDOUT-``: a request holding one is refused
for good, 422 with ``{"refusal": "out-of-stock", "reason": ...}``, and the refusal is stored under the key
like a reservation, so that a repeat is refused alike (however the stock changes meanwhile). That is how
tests and proofs place orders the warehouse refuses.

Two behaviours of real services can be switched on, so that the proofs meet them:

- **A key in flight** (the IETF Idempotency-Key draft, and Stripe): while a request under a key is
  still being processed, another request under the same key is answered 409, not processed beside it.
  The stand-in server brackets each request with ``begin`` and ``end``; with ``conflict_in_flight``
  false (the default) requests under one key are answered one at a time, each by the rule above.
- **Keys that are forgotten**: with ``forget_after_seconds``, a key older than that is forgotten, and a
  request under it reserves again. Every reservation made is kept for counting all the same
  (``reservations``), so that a second one under a forgotten key shows.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.ports.fulfilment import Reply

KEY_REUSED = "Idempotency-Key reused with a different request"
KEY_IN_FLIGHT = "a request with this Idempotency-Key is still being processed"
SOLD_OUT_PREFIX = "SOLDOUT-"
OUT_OF_STOCK = "out-of-stock"


@dataclass(frozen=True)
class _Stored:
    request: dict[str, Any]
    reply: Reply
    made_at: float


def refusal(request: Mapping[str, Any]) -> Reply | None:
    """The service's refusal of a request for good (a sku it is out of stock of), or None when it reserves."""
    items = request.get("items")
    for item in items if isinstance(items, list) else []:
        sku = item.get("sku") if isinstance(item, Mapping) else None
        if isinstance(sku, str) and sku.startswith(SOLD_OUT_PREFIX):
            return Reply(422, {"refusal": OUT_OF_STOCK, "reason": f"{sku} is out of stock"})
    return None


class ReservationLedger:
    """Reservations by idempotency key, safe to share between threads."""

    def __init__(self, *, conflict_in_flight: bool = False, forget_after_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conflict_in_flight = conflict_in_flight
        self.forget_after_seconds = forget_after_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, _Stored] = {}
        self._made: list[dict[str, Any]] = []
        self._in_flight: Counter[str] = Counter()
        self._forgotten = 0

    def begin(self, idempotency_key: str) -> Reply | None:
        """Start processing a request under the key: a 409 when another request under it is still in flight
        and ``conflict_in_flight`` is on, else None (then ``end`` must follow)."""
        with self._lock:
            if self.conflict_in_flight and idempotency_key in self._in_flight:
                return Reply(409, {"reason": KEY_IN_FLIGHT})
            self._in_flight[idempotency_key] += 1
            return None

    def end(self, idempotency_key: str) -> None:
        """The request that ``begin`` let through under the key is answered."""
        with self._lock:
            self._in_flight[idempotency_key] -= 1
            if self._in_flight[idempotency_key] <= 0:
                del self._in_flight[idempotency_key]

    def remembers(self, idempotency_key: str) -> bool:
        """Whether a reservation is stored under the key (and not yet forgotten)."""
        with self._lock:
            stored = self._keys.get(idempotency_key)
            return stored is not None and not self._expired(stored)

    def _expired(self, stored: _Stored) -> bool:
        return self.forget_after_seconds is not None and self._clock() - stored.made_at >= self.forget_after_seconds

    def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Apply the rule: 201 and a new reservation, 200 and the stored reply, 422 and the stored refusal, or 422
        for another request under the key."""
        with self._lock:
            stored = self._keys.get(idempotency_key)
            if stored is not None and self._expired(stored):
                del self._keys[idempotency_key]
                self._forgotten += 1
                stored = None
            if stored is None:
                refused = refusal(request)
                # Unique per reservation made, and the same in every run of the same inputs (the simulator's pins).
                made = uuid.uuid5(uuid.NAMESPACE_URL, f"{idempotency_key}#{len(self._made)}")
                body = {"reservationId": f"res-{made}", "orderId": request.get("orderId")}
                reply = refused or Reply(201, body)
                self._keys[idempotency_key] = _Stored(copy.deepcopy(dict(request)), reply, self._clock())
                if refused is None:
                    self._made.append({**body, "key": idempotency_key})
                return Reply(reply.status, dict(reply.body))
            if stored.request != dict(request):
                return Reply(422, {"reason": KEY_REUSED})
            return Reply(200 if stored.reply.status == 201 else stored.reply.status, dict(stored.reply.body))

    def reservations(self) -> list[dict[str, Any]]:
        """Every reservation made, oldest first (``reservationId``, ``orderId``, ``key``), a forgotten key's too."""
        with self._lock:
            return [dict(made) for made in self._made]

    def count(self) -> int:
        """How many reservations were made."""
        with self._lock:
            return len(self._made)

    def forgotten(self) -> int:
        """How many keys were forgotten (``forget_after_seconds``) and then asked for again."""
        with self._lock:
            return self._forgotten

    def clear(self) -> None:
        """Forget every reservation."""
        with self._lock:
            self._keys.clear()
            self._made.clear()
            self._in_flight.clear()
            self._forgotten = 0
