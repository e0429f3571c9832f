"""The fulfilment-service port: reserve stock for an order, idempotently.

Adapters: ``shared.adapters.http.HttpFulfilment`` (aiohttp, explicit timeouts) and
``shared.adapters.memory.InMemoryFulfilment``. ``tests/contract/test_fulfilment.py`` runs one suite
against both, the HTTP one against the stand-in server on loopback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

RESERVATIONS_PATH = "/reservations"
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class Reply:
    """The service's answer: HTTP status and JSON body (empty when the body was not a JSON object)."""

    status: int
    body: Mapping[str, Any] = field(default_factory=dict)


class FulfilmentService(Protocol):
    """Reserve stock for an order."""

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """POST the reservation with the Idempotency-Key header and return the reply, whatever its status.

        Raise DownstreamUnavailable when the call timed out or could not connect.
        """
        ...
