"""Deadlines: the store's timers (message locks, session locks, TTLs, scheduled messages).

The store has no clock of its own: a deadline is only noticed when its owner checks it with the
caller's ``now``, on access or on the protocol layer's tick. A namespace's deadlines share one Alarm, which tells
the tick when the earliest of them falls due, so that the broker wakes for it rather than on a fixed beat.
"""

from __future__ import annotations

import heapq
import math
import uuid
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Alarm", "Deadlines"]

K = TypeVar("K", int, str, uuid.UUID)


class Deadlines(Generic[K]):
    """Keys that fall due at given times, earliest first.

    A key stays until it falls due even if what it stands for has changed (a lock renewed, a
    message settled), so whoever takes a due key checks that it still applies.
    """

    def __init__(self, alarm: Alarm | None = None) -> None:
        self._heap: list[tuple[float, K]] = []
        self._alarm = alarm
        if alarm is not None:
            alarm.watch(self)

    def add(self, at: float, key: K) -> None:
        """``key`` falls due at ``at`` (seconds since the epoch)."""
        heapq.heappush(self._heap, (at, key))
        if self._alarm is not None:
            self._alarm.at(at)

    def next_at(self) -> float:
        """When the earliest key falls due (infinity when none is kept)."""
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> Iterator[tuple[float, K]]:
        """Remove and yield ``(at, key)`` for every key due by ``now``, including any added meanwhile."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)


class Alarm:
    """When the broker must next look at a namespace's deadlines: the earliest of them, lowered as soon as one is
    added (on the reactor thread, within the event that adds it)."""

    def __init__(self) -> None:
        self._watched: list[Deadlines[Any]] = []
        self.earliest = math.inf

    def watch(self, deadlines: Deadlines[Any]) -> None:
        self._watched.append(deadlines)

    def at(self, when: float) -> None:
        """Something falls due at ``when``."""
        self.earliest = min(self.earliest, when)

    def reset(self) -> float:
        """After the due keys were taken: the earliest key still kept, which becomes what the alarm says."""
        self.earliest = min((d.next_at() for d in self._watched), default=math.inf)
        return self.earliest
