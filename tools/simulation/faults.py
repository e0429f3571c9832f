"""Fault injection at every port call: interleave, crash, fail before or after the effect, stall, jump the clock;
and an outage, which takes the fulfilment service or the store away for a long stretch.

Each fault costs the delivery it hits at most one attempt, and each subject (a message id, the
publisher, the sweeper) gets at most ``per_subject`` faults; faults stop at ``until``, after which
the run drains quietly. So a valid message always succeeds before MaxDeliveryCount, and what the
invariants find is the code's doing, not the budget's. An outage is the exception, on purpose: for
its whole stretch every call to its dependency fails, longer than MaxDeliveryCount deliveries with
their waits, and only the delayed retries carry the messages over it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from idempotent_consumer.errors import BatchFailed, ConsumerError
from simulation.scheduler import Crash, Scheduler

T = TypeVar("T")


class Fault(StrEnum):
    """What the scheduler can do to a port call besides letting it through."""

    CRASH = "crash"  # the process dies before the call: the delivery stops, its lock runs out
    FAIL_BEFORE = "fail_before"  # the call fails transiently and takes no effect
    FAIL_AFTER = "fail_after"  # the call takes effect, then fails: a lost response
    SLOW = "slow"  # the call stalls past the message lock, then goes through
    CLOCK = "clock"  # everyone's time jumps forward: leases and locks run out
    # The session is let go while its message is being processed (azure-sdk-for-python #42187): the
    # session's lock and the message's end now, and another receiver takes the message while this
    # delivery runs on (drawn only in a session delivery that still holds its lock).
    RELEASE = "release_session"


PORT_FAULTS = tuple(Fault)
# A settlement cannot fail transiently in a way that matters: failed or lost, the lock runs out.
SETTLE_FAULTS = (Fault.CRASH, Fault.SLOW, Fault.CLOCK, Fault.RELEASE)
CLOCK_SUBJECT = "clock"


@dataclass
class Outage:
    """A dependency down from ``start`` to ``end``: every call to it fails before it takes effect. ``refused``
    counts the calls it received meanwhile, which the breaker is there to keep down."""

    dependency: str  # the port's prefix in a call's name: "fulfilment" or "store"
    start: float
    end: float
    refused: int = 0
    long: bool = False  # longer than the run's RETRY_TOTAL_SECONDS: chains reach their last delivery while it lasts

    def covers(self, call: str, now: float) -> bool:
        """Whether ``call`` at ``now`` goes to the dependency while it is down."""
        return self.start <= now < self.end and call.startswith(f"{self.dependency}.")


@dataclass(frozen=True)
class ChaosProfile:
    """How hard one run is shaken: rates per port call, the fault budget, and when faults stop."""

    fault_rate: float
    switch_rate: float
    until: float
    per_subject: int = 3
    clock_jumps: int = 3
    stall_seconds: float = 90.0
    jump_seconds: float = 120.0
    outage: Outage | None = None


class Chaos:
    """Decides, at each port call, whether to switch actors and which fault (if any) to inject."""

    def __init__(self, scheduler: Scheduler, profile: ChaosProfile, lock_seconds: float,
                 release: Callable[[object], bool] = lambda actor: False,
                 releasable: Callable[[object], bool] = lambda actor: False) -> None:
        self._sched = scheduler
        self._profile = profile
        self._lock_seconds = lock_seconds
        self._release = release  # lets the actor's session go mid-delivery
        self._releasable = releasable  # whether the actor runs a session delivery whose session it can let go
        self._spent: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.steps = 0

    def checkpoint(self, call: str, kinds: tuple[Fault, ...] = PORT_FAULTS) -> Fault | None:
        """One step: maybe let another actor run, then maybe inject a fault into ``call``.

        Crash raises here; a stall or a clock jump happens here; FAIL_BEFORE and FAIL_AFTER are
        returned for the port's proxy to carry out, since only it knows its error and its effect.
        """
        sched, profile, rng = self._sched, self._profile, self._sched.rng
        self.steps += 1
        if rng.random() < profile.switch_rate:
            sched.pause()
        fault = self._pick(kinds)
        if sched.trace_lines is not None:
            sched.trace(f"{call}{f' !{fault}' if fault else ''}")
        if fault is Fault.CRASH:
            raise Crash(call)
        if fault is Fault.SLOW:
            sched.sleep(self._lock_seconds + rng.uniform(1.0, profile.stall_seconds - self._lock_seconds))
        elif fault is Fault.CLOCK:
            sched.clock.now += rng.uniform(1.0, profile.jump_seconds)
        return fault

    @property
    def outage(self) -> Outage | None:
        """The run's outage, if it has one."""
        return self._profile.outage

    @property
    def tracing(self) -> bool:
        """Whether the run keeps a trace, so that proxies spend time naming their calls only then."""
        return self._sched.trace_lines is not None

    async def through(
        self, call: str, perform: Callable[[], Awaitable[T]], *, refuse: Callable[[str], T],
        lose: Callable[[str], BaseException],
    ) -> T:
        """Make one port call under chaos: ``refuse`` answers instead of it (FAIL_BEFORE, or its dependency's
        outage); ``lose`` is raised after it took effect (FAIL_AFTER); errors of the port itself pass through,
        noted in the trace."""
        outage = self._profile.outage
        if outage is not None and outage.covers(call, self._sched.clock.now):
            outage.refused += 1
            if self._sched.trace_lines is not None:
                self._sched.trace(f"{call} !outage")
            self._sched.pause()
            return refuse(f"{call}: {outage.dependency} is down")
        fault = self.checkpoint(call)
        if fault is Fault.FAIL_BEFORE:
            return refuse(f"{call} failed before it took effect")
        try:
            result = await perform()
        except ConsumerError as exc:
            if self._sched.trace_lines is not None:
                self._sched.trace(f"  -> {_name(exc)}")
            raise
        if fault is Fault.FAIL_AFTER:
            raise lose(f"{call} took effect, then its response was lost")
        return result

    def coin(self) -> bool:
        """A fair coin from the run's RNG, for a proxy choosing between two ways to fail."""
        return self._sched.rng.random() < 0.5

    def _pick(self, kinds: tuple[Fault, ...]) -> Fault | None:
        sched, profile, rng = self._sched, self._profile, self._sched.rng
        if sched.clock.now >= profile.until or rng.random() >= profile.fault_rate:
            return None
        subject = sched.current.subject if sched.current else "-"
        if self._spent[subject] >= profile.per_subject:
            return None
        if Fault.RELEASE in kinds and not self._releasable(sched.current):
            kinds = tuple(k for k in kinds if k is not Fault.RELEASE)  # drawn only where it applies
        fault = kinds[rng.randrange(len(kinds))]
        if fault is Fault.RELEASE:
            self._release(sched.current)
        if fault is Fault.CLOCK:
            if self._spent[CLOCK_SUBJECT] >= profile.clock_jumps:
                return None
            self._spent[CLOCK_SUBJECT] += 1
        self._spent[subject] += 1
        self.injected[fault.value] += 1
        return fault


def _name(error: ConsumerError) -> str:
    """An error as the trace shows it: its type, and for a batch which operation failed as what."""
    if isinstance(error, BatchFailed):
        return f"BatchFailed(operation {error.index}: {type(error.error).__name__})"
    return type(error).__name__
