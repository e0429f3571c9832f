"""The fulfilment-service port: reserve stock for an order, idempotently, over HTTP.

Adapters: ``shared.http_fulfilment.HttpFulfilment`` (requests, explicit timeouts) and
``InMemoryFulfilment`` below (for unit tests). ``tests/contract/test_fulfilment.py`` runs one suite
against both, the HTTP one against a real server on loopback.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

RESERVATIONS_PATH = "/reservations"
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class Reply:
    """The service's answer: HTTP status and JSON body (empty when the body was not JSON)."""

    status: int
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        """2xx."""
        return 200 <= self.status < 300

    @property
    def transient(self) -> bool:
        """408, 429 or 5xx: the same request may succeed later."""
        return self.status in (408, 429) or self.status >= 500


class FulfilmentService(Protocol):
    """Reserve stock for an order."""

    def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """POST the reservation with the Idempotency-Key header and return the reply, whatever its status.

        Raise DownstreamUnavailable when the call timed out or could not connect.
        """
        ...


class InMemoryFulfilment:
    """A fulfilment service in memory that deduplicates by idempotency key, as the real one must."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reservations: dict[str, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        self.calls: list[str] = []

    def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """First call per key reserves (201); a repeat returns the stored answer (200)."""
        with self._lock:
            self.calls.append(idempotency_key)
            stored = self._reservations.get(idempotency_key)
            if stored is None:
                body = {"reservationId": f"res-{uuid.uuid4()}", "orderId": request.get("orderId")}
                self._reservations[idempotency_key] = (dict(request), body)
                return Reply(201, body)
            if stored[0] != dict(request):
                return Reply(422, {"reason": "Idempotency-Key reused with a different request"})
            return Reply(200, stored[1])

    def reservation_count(self) -> int:
        """How many distinct reservations were made."""
        with self._lock:
            return len(self._reservations)
