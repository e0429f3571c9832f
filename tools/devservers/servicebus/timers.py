"""Deadlines: the store's timers (message locks, session locks, TTLs, scheduled messages).

The store has no clock of its own: a deadline is only noticed when its owner checks it with the
caller's ``now``, on access or on the protocol layer's periodic tick.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

K = TypeVar("K", int, str, uuid.UUID)


class Deadlines(Generic[K]):
    """Keys that fall due at given times, earliest first.

    A key stays until it falls due even if what it stands for has changed (a lock renewed, a
    message settled), so whoever takes a due key checks that it still applies.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, K]] = []

    def add(self, at: float, key: K) -> None:
        """``key`` falls due at ``at`` (seconds since the epoch)."""
        heapq.heappush(self._heap, (at, key))

    def pop_due(self, now: float) -> Iterator[tuple[float, K]]:
        """Remove and yield ``(at, key)`` for every key due by ``now``, including any added meanwhile."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)
