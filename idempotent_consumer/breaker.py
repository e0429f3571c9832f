"""The health of one queue's dependencies, as its deliveries see it: a circuit breaker per queue and process.

While most recent attempts of a queue's deliveries fail with the dependency down, trying each message
again and again only burns requests against it. The breaker opens when at least ``FAILING_SHARE`` of the
last ``window`` attempts (and at least half a window of them) failed that way; the delivery policy does
not count a transient failure that shows the dependency up (``Result.dependency_up``: busy, or slow to
answer). While it is open, a delivery hands its message on at once, untried, but for one every
``open_seconds``, let through to try (the probe). Only a probe that reached each dependency whose failures
opened the breaker, and found it up, closes it: a probe that reached none of them (a duplicate answered
from Cosmos DB alone while the fulfilment service is down) proves nothing, and the next delivery probes
instead. Every change is logged (a warning when it opens, which the alert in
``infra/modules/alerts.bicep`` reads) and counted (``consumer.breaker``).

What an attempt reached is seen at its ports (``shared.ports.watched``): each dependency that answered
(whatever it answered: a 409 is Cosmos DB up) and each that was down (unreachable, 5xx, 429, a transient
store error), as a ``Reach``.

Each process keeps its own breakers: an instance that sees its dependency fail stops on its own,
with no shared state to fail in turn.
"""

from __future__ import annotations

import logging
from collections import deque
from enum import StrEnum

from opentelemetry import metrics

from idempotent_consumer.ports.watched import Reach
from idempotent_consumer.telemetry import LOGGER_NAME, METER_NAME

FAILING_SHARE = 0.5
BREAKER_COUNTER = "consumer.breaker"

logger = logging.getLogger(f"{LOGGER_NAME}.breaker")
_changes = metrics.get_meter(METER_NAME).create_counter(
    BREAKER_COUNTER, unit="{change}", description="Circuit breaker changes, by function and the state entered."
)


class Admission(StrEnum):
    """What a delivery may do with its message now."""

    TRY = "try"  # closed: try, and retry inside the lock
    PROBE = "probe"  # open for long enough: try once, to see whether the dependency is back
    HAND_ON = "hand_on"  # open: hand the message on untried


class Breaker:
    """One queue's breaker in one process; ``open_seconds`` 0 keeps it closed for good."""

    def __init__(self, function: str, *, window: int, open_seconds: float) -> None:
        self.function = function
        self.window = window
        self.open_seconds = open_seconds
        self._recent: deque[bool] = deque(maxlen=window)  # True: the attempt failed transiently
        self._downs: deque[frozenset[str]] = deque(maxlen=window)  # what each of them found down
        self._opened_at: float | None = None
        self._next_probe = 0.0  # a probe that never reports (its process died) holds up the next one this long only
        self._failing: set[str] = set()  # while open: the dependencies found down, which a probe must reach
        self.opened = 0  # how many times it opened
    @property
    def is_open(self) -> bool:
        """Whether deliveries hand their messages on untried (but for a probe)."""
        return self._opened_at is not None

    def admit(self, now: float) -> Admission:
        """What the delivery starting at ``now`` may do: a probe at most every ``open_seconds`` while open."""
        if self._opened_at is None:
            return Admission.TRY
        if now >= self._next_probe:
            self._next_probe = now + self.open_seconds
            return Admission.PROBE
        return Admission.HAND_ON

    def record(self, failed: bool, now: float, *, probe: bool = False, reach: Reach | None = None) -> None:
        """One attempt's result at ``now``: whether it failed with the dependency down; ``probe`` when it was the
        probe; ``reach``, what it showed of each dependency. A probe that did not fail closes the breaker only if
        it reached every dependency found down in the attempts that opened it; one that did not leaves the next
        delivery to probe, at once."""
        reach = reach or Reach()
        if probe and self._opened_at is not None:
            if failed:
                self._failing |= reach.down
                self._next_probe = now + self.open_seconds
            elif reach.answered >= self._failing and reach.answered:
                self._close(now)
            else:
                self._next_probe = now  # it proved nothing: the next delivery probes
            return
        self._recent.append(failed)
        self._downs.append(frozenset(reach.down) if failed else frozenset())
        failing = sum(self._recent)
        if (self._opened_at is None and self.open_seconds > 0 and len(self._recent) * 2 >= self.window
                and failing >= FAILING_SHARE * len(self._recent)):
            self._opened_at = now
            self._next_probe = now + self.open_seconds
            self._failing = set().union(*self._downs)
            self.opened += 1
            logger.warning("breaker open function=%s failing=%d/%d: handing messages on untried, a probe every %ss",
                           self.function, failing, len(self._recent), self.open_seconds,
                           extra={"function": self.function, "breaker": "open", "failing": failing})
            _changes.add(1, {"function": self.function, "state": "open"})

    def _close(self, now: float) -> None:
        opened = self._opened_at or now
        self._opened_at = None
        self._recent.clear()
        self._downs.clear()
        self._failing.clear()
        logger.info("breaker closed function=%s after %.0fs open", self.function, now - opened,
                    extra={"function": self.function, "breaker": "closed"})
        _changes.add(1, {"function": self.function, "state": "closed"})
