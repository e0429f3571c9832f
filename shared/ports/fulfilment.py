"""The fulfilment-service port: reserve stock for an order, idempotently.

Adapters: ``shared.adapters.http.HttpFulfilment`` (aiohttp, explicit timeouts) and
``shared.adapters.memory.InMemoryFulfilment``. ``tests/contract/test_fulfilment.py`` runs one suite
against both, the HTTP one against the stand-in server on loopback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.domain.orders import OrderPlaced

RESERVATIONS_PATH = "/reservations"
IDEMPOTENCY_HEADER = "Idempotency-Key"
REFUSED = 422  # Unprocessable Content: with a ``refusal`` code in its body, the service refuses the order for good
MAX_REFUSAL_CHARS = 64


@dataclass(frozen=True)
class Reply:
    """The service's answer: HTTP status and JSON body (empty when the body was not a JSON object).

    A 2xx reserved the stock (``reservationId``); a status ``is_transient_under_key`` says so may succeed
    later (409 among them: the key held by a concurrent request); a 422 that names a ``refusal`` is the
    service's refusal of the order for good (out of stock, say), with its ``reason``; any other answer says
    that the call itself is wrong (a 4xx: the URL, the credentials, the request's shape), not the order.
    """

    status: int
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def reference(self) -> str | None:
        """The reservation's id, on success."""
        value = self.body.get("reservationId")
        return str(value) if value else None

    @property
    def reason(self) -> str | None:
        """Why the service refused, when it says."""
        return str(self.body.get("reason", "")) or None

    @property
    def refusal(self) -> str | None:
        """The service's code for why it refuses the order for good, on a 422 that names one; None otherwise
        (the IETF draft's 422 for a key reused with another request names none, and is no refusal of the order)."""
        code = self.body.get("refusal")
        return code[:MAX_REFUSAL_CHARS] if self.status == REFUSED and isinstance(code, str) and code else None


def reservation_request(order: OrderPlaced) -> dict[str, Any]:
    """The reservation the service is asked for: the order id and its lines' quantities."""
    return {"orderId": order.order_id, "items": [{"sku": i.sku, "quantity": i.quantity} for i in order.items]}


class FulfilmentService(Protocol):
    """Reserve stock for an order."""

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """POST the reservation with the Idempotency-Key header and return the reply, whatever its status.

        Raise DownstreamUnavailable when the call timed out or could not connect.
        """
        ...
