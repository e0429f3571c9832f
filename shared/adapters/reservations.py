"""The fulfilment service's reservation rule, written once: the in-memory fake and the stand-in server share it.

The first request for an Idempotency-Key reserves and answers 201 with a new reservation id; a
repeat with the same request answers 200 with the stored reply; the same key with another request
answers 422. That is the contract the consumer relies on to call again safely after a lost reply.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from shared.ports.fulfilment import Reply

KEY_REUSED = "Idempotency-Key reused with a different request"


class ReservationLedger:
    """Reservations by idempotency key, safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reservations: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Apply the rule: 201 and a new reservation, 200 and the stored reply, or 422."""
        with self._lock:
            stored = self._reservations.get(idempotency_key)
            if stored is None:
                body = {"reservationId": f"res-{uuid.uuid4()}", "orderId": request.get("orderId")}
                self._reservations[idempotency_key] = (copy.deepcopy(dict(request)), body)
                return Reply(201, dict(body))
            if stored[0] != dict(request):
                return Reply(422, {"reason": KEY_REUSED})
            return Reply(200, dict(stored[1]))

    def reservations(self) -> dict[str, dict[str, Any]]:
        """Each key's stored reply (``reservationId``, ``orderId``)."""
        with self._lock:
            return {key: dict(reply) for key, (_, reply) in self._reservations.items()}

    def count(self) -> int:
        """How many distinct reservations were made."""
        with self._lock:
            return len(self._reservations)

    def clear(self) -> None:
        """Forget every reservation."""
        with self._lock:
            self._reservations.clear()
