"""The chaos suite's faults on the real stack: per host, a Cosmos proxy and a fulfilment proxy that fail
requests at random, and a killer that SIGKILLs hosts or workers at random moments or at chosen ones.

Every host runs in a *slot*: its own local.settings.json pointing at its own two fault proxies, so a
proxy knows whose request it sees and a tap can kill exactly the process that made it. A killed host
is replaced in its slot; a killed worker is restarted by its host.

The chosen moments (``Moment``) are reached through the taps: the next matching exchange at any slot
kills that slot's process, and its connection is reset there, so the process never sees the answer. The
exchange must be on behalf of an order that has not met ``KILLS_PER_ORDER`` chosen kills yet: as a run
drains, the few messages still in flight would otherwise take every kill (and each kill of a worker holds
the messages its host receives meanwhile past their 6 s lock), until one is dead-lettered
MaxDeliveryCountExceeded for having met ten crashes in a row. That is Service Bus's rule for a poison message
doing what it should, not a finding; what a run proves is that a message survives the crashes it meets.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from bench.wire import finishes_sent_outbox
from demo.stack import HostProcess, Stack, pause, settings_file, sigkill
from devservers.faultproxy import FaultProxy, Kind, RandomFaults, Tap
from devservers.host.servicebus import RELEASE_RATE_SETTING, RELEASED_MID_INVOCATION

# Per request, at every host's Cosmos proxy: throttling, outages, resets, latency, and lost answers to
# requests that took effect.
COSMOS_RATES = {Kind.THROTTLE: 0.03, Kind.UNAVAILABLE: 0.01, Kind.RESET: 0.01, Kind.DELAY: 0.03,
                Kind.LOSE_RESPONSE: 0.01}
COSMOS_DELAY_SECONDS = 0.5
# Per call, at every host's fulfilment proxy: the service fails (503), stalls past the client's read
# timeout (then reserves), and loses its answer after it reserved.
FULFILMENT_RATES = {Kind.UNAVAILABLE: 0.04, Kind.DELAY: 0.04, Kind.LOSE_RESPONSE: 0.04}
FULFILMENT_READ_TIMEOUT_SECONDS = 2
LOCK_SECONDS = 6  # the input queues' lock; renewal is off, so a slow delivery loses its lock mid-processing
# Per session message, at every host: the slot lets the session go while the function runs
# (azure-sdk-for-python #42187), so that another slot or host runs the same event in parallel.
SESSION_RELEASE_RATE = 0.02
KILL_EVERY_SECONDS = 4.0  # mean pause between two kills
# A slow instance: a host and its worker stopped (SIGSTOP) for a while, then let go on (SIGCONT), while the others run;
# on average every 15 s, for 2 to 10 s, so that it holds locks past their 6 s about half the time.
SLOW_EVERY_SECONDS = 15.0
SLOW_FOR_SECONDS = (2.0, 10.0)
# How long an outage after the first waits for the rolled-back host to be forward again, at most (a rollback stays
# back three times its length at most, 45 s by default and 180 s at the most, and a host takes seconds to start under
# load).
ROLLBACK_WAIT_LIMIT_SECONDS = 600.0
ARMED_FOR_SECONDS = 15.0  # a chosen moment not reached by then is given up (counted as missed)
KILLS_PER_ORDER = 2  # chosen kills on behalf of one order (its messages, copies and events alike), at most
_BATCH = "x-ms-cosmos-is-batch-request"
_PARTITION_KEY = "x-ms-documentdb-partitionkey"


class Moment(StrEnum):
    """When a process is killed."""

    RANDOM = "at a random moment"
    BEFORE_WRITE = "before a write"
    AFTER_WRITE = "between a write and the settlement"
    FULFILMENT = "during the fulfilment call"
    OUTBOX = "in the outbox publisher, between send and delete"


@dataclass
class Slot:
    """One competing host's place: its proxies, its settings, and the host running there."""

    index: int
    cosmos: FaultProxy
    fulfilment: FaultProxy
    settings: Path
    app_dir: Path
    host: HostProcess | None = None
    upgrading: bool = False  # its host is being replaced by one on the next version


# The outage phase's kinds: what goes down, and what it answers meanwhile.
OUTAGE_KINDS = {
    "fulfilment": ("fulfilment", "503"),  # the stand-in refuses every reservation
    "not-allowed": ("fulfilment", "401, then 403"),  # the stand-in refuses the app's identity, half the time each
    "identity": ("identity endpoint", "500"),  # no host gets a token once the one it holds expires
    "cosmos": ("cosmos", "503"),  # every slot's Cosmos proxy refuses every request
}


@dataclass(frozen=True)
class Outage:
    """A dependency down for a stretch of the run, answering every request with a failure."""

    kind: str  # one of OUTAGE_KINDS
    start: float
    end: float

    @property
    def dependency(self) -> str:
        return OUTAGE_KINDS[self.kind][0]

    @property
    def answered(self) -> str:
        return OUTAGE_KINDS[self.kind][1]


@dataclass
class Armed:
    moment: Moment
    worker_only: bool
    until: float


@dataclass
class Chaos:
    """The fault plan of one run, from its seed, and what it did."""

    stack: Stack
    seed: int
    app_dir: Path  # the version every slot starts with
    retry_settings: Mapping[str, str] = field(default_factory=dict)  # the delayed retries' app settings
    # Where each slot's hosts write a new order's reservation claim (RESERVATION_CLAIM_IN_ORDER): "own", "in-order",
    # or "both" (the odd slots inside the order, the even ones a document of its own: the setting's rollout).
    claims: str = "both"
    slots: list[Slot] = field(default_factory=list)
    upgraded: int = 0  # slots whose host was replaced by one on the next version
    rolled_back: int = 0  # slots whose host ran for a while on the release before (versions.PREVIOUS)
    rolled_forward: threading.Event = field(default_factory=threading.Event)  # the rolled-back slot is forward again
    kills: Counter[str] = field(default_factory=Counter)
    failure: str | None = None  # why the killer stopped early, if it did: the run then fails
    # What the operator's sbctl index backfill did once the rollback was over, by kind and outcome.
    backfilled: dict[str, int] = field(default_factory=dict)
    _armed: Armed | None = None
    _killed_for: Counter[str] = field(default_factory=Counter)  # chosen kills by the order they met
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _slots: threading.RLock = field(default_factory=threading.RLock)  # who runs in a slot
    _stop: threading.Event = field(default_factory=threading.Event)
    _halted: bool = False  # the run ended early: no host is started any more
    _thread: threading.Thread | None = None
    _slower: threading.Thread | None = None
    slowed: Counter[str] = field(default_factory=Counter)
    outages: list[Outage] = field(default_factory=list)

    def start_hosts(self, count: int) -> None:
        """Give each of ``count`` slots its proxies and settings, and start its host."""
        cosmos_url, fulfilment_url = self.stack.cosmos.endpoint, self.stack.fulfilment.url
        for index in range(count):
            cosmos = FaultProxy(cosmos_url, random_faults=RandomFaults(self.seed * 1000 + index, COSMOS_RATES),
                                delay_seconds=COSMOS_DELAY_SECONDS, tap=self._cosmos_tap(index))
            fulfilment = FaultProxy(fulfilment_url, random_faults=RandomFaults(self.seed * 1000 + 500 + index,
                                                                               FULFILMENT_RATES),
                                    delay_seconds=FULFILMENT_READ_TIMEOUT_SECONDS + 1,
                                    tap=self._fulfilment_tap(index))
            cosmos.__enter__()
            fulfilment.__enter__()
            values = {**self.stack.values, "COSMOS_ENDPOINT": cosmos.url, "FULFILLMENT_URL": fulfilment.url,
                      "CosmosDBConnection": f"AccountEndpoint={cosmos.url}/;AccountKey={self.stack.cosmos.key};",
                      "FULFILLMENT_READ_TIMEOUT_SECONDS": str(FULFILMENT_READ_TIMEOUT_SECONDS),
                      "AzureFunctionsJobHost__extensions__serviceBus__maxAutoLockRenewalDuration": "00:00:00",
                      RELEASE_RATE_SETTING: str(SESSION_RELEASE_RATE), **self.retry_settings,
                      "RESERVATION_CLAIM_IN_ORDER": str(self.claims_in_order(index)).lower()}
            self.slots.append(Slot(index, cosmos, fulfilment, settings_file(values), self.app_dir))
        for slot in self.slots:
            slot.host = self.stack.start_host(slot.settings, slot.app_dir)

    def claims_in_order(self, slot: int) -> bool:
        """Whether the hosts of ``slot`` write a new order's reservation claim inside the order."""
        return self.claims == "in-order" or (self.claims == "both" and slot % 2 == 1)

    def start(self) -> None:
        """Start killing and slowing hosts down, in the background, until ``stop``."""
        self._thread = threading.Thread(target=self._kill_loop, name="chaos-killer", daemon=True)
        self._thread.start()
        self._slower = threading.Thread(target=self._slow_loop, name="chaos-slower", daemon=True)
        self._slower.start()

    def halt(self) -> None:
        """Stop killing, slowing and replacing hosts for good, bringing none back: a run that ends early (its stack
        could not be observed) stops its stack's hosts next, and none may be started after them."""
        self._halted = True
        self._stop.set()
        for thread in (self._thread, self._slower):
            if thread is not None:
                thread.join()

    def stop(self) -> None:
        """Stop killing and slowing, and bring every slot's host back; the proxies keep failing requests at random."""
        self._stop.set()
        for thread in (self._thread, self._slower):
            if thread is not None:
                thread.join()
        with self._lock:
            self._give_up_armed()
        self._replace_dead()

    def outage_phase(self, plan: list[tuple[str, float]], *, first_after: float, gap: float,
                     after_rollback: threading.Event | None = None) -> threading.Thread:
        """In the background: ``first_after`` seconds from now, each outage of ``plan`` (a kind of OUTAGE_KINDS,
        and its seconds), one after the other, ``gap`` seconds apart. With ``after_rollback``, an outage after the
        first begins only once that is set (the rolled-back host is forward again): the release before has no
        delayed retries, so an outage while it runs would spin its deliveries into MaxDeliveryCountExceeded, which
        is that release's known weakness (docs/proof.md), not what the rollback is there to prove. A kind this
        stack cannot take down is refused here, before anything starts (ValueError)."""
        for kind, _ in plan:
            if kind not in OUTAGE_KINDS or (kind == "identity" and getattr(self.stack, "identity", None) is None):
                raise ValueError(f"no outage of kind {kind!r} on this stack")

        def run() -> None:  # on whether the killing has stopped or not: the drain waits for the phase's end
            time.sleep(first_after)
            for index, (kind, seconds) in enumerate(plan):
                time.sleep(gap if index else 0.0)
                if index and after_rollback is not None:
                    after_rollback.wait(ROLLBACK_WAIT_LIMIT_SECONDS)
                start = time.time()
                outage = Outage(kind, start, start + seconds)
                self._take_down(kind, seconds, begun=functools.partial(self._begun, outage))
                print(f"chaos: {OUTAGE_KINDS[kind][0]} back", flush=True)

        thread = threading.Thread(target=run, name="chaos-outages", daemon=True)
        thread.start()
        return thread

    def _begun(self, outage: Outage) -> None:
        """Record and announce an outage once its dependency is down."""
        self.outages.append(outage)
        print(f"chaos: {outage.dependency} down for {outage.end - outage.start:.0f} s, answering {outage.answered}",
              flush=True)

    def _take_down(self, kind: str, seconds: float, begun: Callable[[], None]) -> None:
        """One outage of ``kind`` (checked by ``outage_phase``) for ``seconds``; ``begun`` once it is down; returns
        once it is over."""
        if kind == "fulfilment":
            self.stack.fulfilment.outage(seconds)
        elif kind == "not-allowed":
            self.stack.fulfilment.outage(seconds / 2, status=401)
            begun()
            time.sleep(seconds / 2)
            self.stack.fulfilment.outage(seconds / 2, status=403)
            time.sleep(seconds / 2)
            return
        elif kind == "identity":
            identity = self.stack.identity
            if identity is None:
                raise ValueError("no identity endpoint on this stack")
            identity.outage(seconds)
        elif kind == "cosmos":
            for slot in self.slots:
                slot.cosmos.outage(seconds)
        else:
            raise ValueError(f"no outage of kind {kind!r}")
        begun()
        time.sleep(seconds)

    def upgrade(self, app_dir: Path, every_seconds: float) -> None:
        """A rolling upgrade: one slot after another, stop its host as the platform does (it finishes what
        it has in hand) and start one on ``app_dir`` in its place, while the other slots run on. A slot
        being upgraded has no host to kill or to replace; the killer goes on with the others meanwhile."""
        for slot in self.slots:
            time.sleep(every_seconds)  # on, even once the killing has stopped
            self._replace(slot, app_dir)
            self.upgraded += 1
            print(f"chaos: slot {slot.index} upgraded to the next version ({self.upgraded} of {len(self.slots)})",
                  flush=True)

    def rollback(self, app_dir: Path, seconds: float, *, met: Callable[[], bool] | None = None,
                 longest: float = 0.0) -> None:
        """A rollback of one slot to ``app_dir`` for ``seconds``, then forward again to the version it ran: what a
        deployment that is rolled back, or two releases that overlap, do to the messages in flight meanwhile.
        With ``met``, it stays back until that says the release before met what it is there to meet, up to
        ``longest`` seconds in all (a host slow to start under load would otherwise meet nothing)."""
        slot = self.slots[-1]
        with self._slots:
            was = slot.app_dir
        try:
            self._replace(slot, app_dir)
            self.rolled_back += 1
            print(f"chaos: slot {slot.index} rolled back to the release before for {seconds:.0f} s", flush=True)
            back = time.time()
            time.sleep(seconds)
            while met is not None and not met() and time.time() < back + longest:
                time.sleep(1)
            self._replace(slot, was)
            print(f"chaos: slot {slot.index} rolled forward again", flush=True)
        finally:
            self.rolled_forward.set()

    def _replace(self, slot: Slot, app_dir: Path) -> None:
        """Stop the slot's host as the platform does (it finishes what it has in hand) and start one on ``app_dir``
        in its place, while the other slots run on. A slot being replaced has no host to kill or to replace."""
        with self._slots:
            slot.app_dir, slot.upgrading = app_dir, True
            host, slot.host = slot.host, None
        if host is not None:
            if host.process.poll() is None:
                self.stack.stop_host(host)
            else:
                self._retire(host)
        if self._halted:
            return
        started = self.stack.start_host(slot.settings, app_dir)
        with self._slots:
            slot.host, slot.upgrading = started, False

    def close(self) -> None:
        """Stop the proxies (the hosts are the stack's to stop)."""
        for slot in self.slots:
            slot.cosmos.__exit__()
            slot.fulfilment.__exit__()

    def faults(self) -> dict[str, int]:
        """Faults injected so far, by where and kind."""
        counts: Counter[str] = Counter()
        for slot in self.slots:
            counts.update({f"cosmos {kind}": n for kind, n in slot.cosmos.counts.items()})
            counts.update({f"fulfilment {kind}": n for kind, n in slot.fulfilment.counts.items()})
        counts.update({f"kill {what}": n for what, n in self.kills.items()})
        counts.update(self.slowed)
        counts["session let go mid-processing"] = self.stack.logs().count(RELEASED_MID_INVOCATION)
        return dict(sorted(counts.items()))

    def _kill_loop(self) -> None:
        try:
            self._kill_until_stopped()
        except Exception as exc:
            self.failure = f"the killer stopped early: {type(exc).__name__}: {exc}"
            print(f"chaos: {self.failure}", flush=True)

    def _kill_until_stopped(self) -> None:
        rng = random.Random(self.seed)  # noqa: S311 - a reproducible fault plan
        while not self._stop.wait(rng.expovariate(1 / KILL_EVERY_SECONDS)):
            self._replace_dead()
            moment = rng.choice(list(Moment))
            worker_only = rng.random() < 0.5
            with self._lock:
                self._give_up_armed()
                if self._armed is not None:
                    continue  # a chosen moment is still awaited
                if moment is Moment.RANDOM:
                    live = [s for s in self.slots if s.host is not None and s.host.process.poll() is None]
                    if live:
                        self._kill(rng.choice(live), moment, worker_only)
                else:
                    self._armed = Armed(moment, worker_only, time.monotonic() + ARMED_FOR_SECONDS)

    def _slow_loop(self) -> None:
        """Now and then stop one live host (and its worker) for a few seconds while the others run: an instance
        starved of CPU. Its invocations stall, its locks run on and may end under it, and it goes on afterwards."""
        rng = random.Random(self.seed * 7919)  # noqa: S311 - a reproducible fault plan
        wait = rng.uniform(2.0, 5.0)  # the first soon, so that even a short run has one
        while not self._stop.wait(wait):
            wait = rng.expovariate(1 / SLOW_EVERY_SECONDS)
            with self._slots:
                live = [s for s in self.slots if not s.upgrading and s.host is not None
                        and s.host.process.poll() is None]
                host = rng.choice(live).host if live else None
            if host is None:
                continue
            seconds = rng.uniform(*SLOW_FOR_SECONDS)
            pause(host, stopped=True)
            try:
                self._stop.wait(seconds)
            finally:
                pause(host, stopped=False)
            self.slowed["slow host (stopped, then resumed)"] += 1

    def _give_up_armed(self) -> None:
        if self._armed is not None and (self._stop.is_set() or time.monotonic() > self._armed.until):
            self.kills[f"missed: {self._armed.moment}"] += 1
            self._armed = None

    def _kill(self, slot: Slot, moment: Moment, worker_only: bool) -> None:
        host = slot.host  # read once: the upgrade may take it away meanwhile
        if host is None or host.process.poll() is not None:
            return
        sigkill(host, worker_only=worker_only)
        if not worker_only:
            host.process.wait(10)  # reaped, so that the slot is seen empty and refilled
        what = f"{'worker' if worker_only else 'host'} {moment}"
        self.kills[what] += 1
        print(f"chaos: killed the {what.replace(' ', f' of slot {slot.index} ', 1)}", flush=True)

    def _take(self, index: int, moment: Moment, order: str | None = None) -> bool:
        """Kill slot ``index``'s process if ``moment`` is armed and ``order`` (whose exchange reached it, when known)
        has met fewer than KILLS_PER_ORDER chosen kills; whether it was killed."""
        with self._lock:
            if self._armed is None or self._armed.moment is not moment or self._stop.is_set():
                return False
            if order is not None and self._killed_for[order] >= KILLS_PER_ORDER:
                return False  # the moment stays armed for another order's exchange
            armed, self._armed = self._armed, None
            if order is not None:
                self._killed_for[order] += 1
            self._kill(self.slots[index], moment, armed.worker_only)
            return True

    def _replace_dead(self) -> None:
        with self._slots:
            for slot in self.slots if not self._halted else ():
                if slot.upgrading:
                    continue
                if slot.host is not None and slot.host.process.poll() is not None:
                    self._retire(slot.host)
                    slot.host = None
                if slot.host is None:
                    slot.host = self.stack.start_host(slot.settings, slot.app_dir)

    def _retire(self, host: HostProcess) -> None:
        host.process.wait()
        self.stack.hosts.remove(host)
        self.stack.retired.append(host)

    def _cosmos_tap(self, index: int) -> Tap:
        def tap(method: str, path: str, headers: Mapping[str, str], body: bytes, status: int | None) -> bool:
            if method != "POST" or str(headers.get(_BATCH, "")).lower() != "true":
                return False
            order = _partition(headers)
            if finishes_sent_outbox(body):
                return status is None and self._take(index, Moment.OUTBOX, order)
            return self._take(index, Moment.BEFORE_WRITE if status is None else Moment.AFTER_WRITE, order)
        return tap

    def _fulfilment_tap(self, index: int) -> Tap:
        def tap(method: str, path: str, headers: Mapping[str, str], body: bytes, status: int | None) -> bool:
            return status is not None and self._take(index, Moment.FULFILMENT, _order_of(body))
        return tap


def _partition(headers: Mapping[str, str]) -> str | None:
    """The partition key a Cosmos DB request names (an order's id here), or None."""
    try:
        value = json.loads(headers.get(_PARTITION_KEY, ""))
    except ValueError:
        return None
    return str(value[0]) if isinstance(value, list) and value else None


def _order_of(body: bytes) -> str | None:
    """The order a fulfilment call is for, or None."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    order = request.get("orderId") if isinstance(request, dict) else None
    return str(order) if order else None
