"""The fulfilment service in memory, beside the real adapter (``shared.adapters.http``): it passes the same
contract suite (``tests/contract``). The library's fakes of the store and the sender are in
``idempotent_consumer.testing.memory``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.adapters.reservations import ReservationLedger
from shared.ports.fulfilment import Reply


class InMemoryFulfilment:
    """The fulfilment service in memory, deduplicating by idempotency key with the shared reservation rule."""

    def __init__(self) -> None:
        self.ledger = ReservationLedger()
        self.calls: list[str] = []

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Apply the reservation rule: 201 first, 200 for a repeat, 422 for another request under the key."""
        self.calls.append(idempotency_key)
        return self.ledger.reserve(idempotency_key, request)

    def reservation_count(self) -> int:
        """How many distinct reservations were made."""
        return self.ledger.count()
