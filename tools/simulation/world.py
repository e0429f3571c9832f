"""Everything one run is made of, built from its seed: clock, scheduler, chaos, broker, fakes, proxies, workload."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.adapters.memory import InMemoryFulfilment, InMemoryStore, RecordingSender
from shared.domain.documents import OutboxEntry
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Result
from shared.handlers.apply_event import apply_order_event
from shared.handlers.outbox import OutboxPublisher
from shared.handlers.place_order import OrderServices, place_order
from shared.ports.fulfilment import FulfilmentService
from shared.ports.store import DocumentStore
from shared.settings import Settings
from simulation.broker import Broker, BrokerMessage, Queue
from simulation.faults import Chaos, ChaosProfile
from simulation.proxies import FaultyFulfilment, FaultySender, FaultyStore, History
from simulation.scheduler import EPOCH, Clock, Scheduler, Signal, drive
from simulation.workload import Workload, build_workload

OrderHandler = Callable[[InboundMessage, OrderServices], Coroutine[Any, Any, Result]]
Handler = Callable[[InboundMessage], Coroutine[Any, Any, Result]]
T = TypeVar("T")

# duplicateDetectionWindow, on the queues and on order-accepted: Bicep's default PT10M, and a short one
# under which a producer's retry can meet its original still being processed.
DETECTION_WINDOWS_SECONDS = (60.0, 600.0)
SETTINGS = Settings(fulfillment_url="http://fulfilment.simulated", abandon_delay_seconds=10.0)


def _unchanged(value: T) -> T:
    return value


@dataclass(frozen=True)
class Wiring:
    """What a run drives: the real handler and ports, each passed through a wrapper, where tests plant bugs."""

    store: Callable[[DocumentStore], DocumentStore] = _unchanged
    fulfilment: Callable[[FulfilmentService], FulfilmentService] = _unchanged
    place_order: Callable[[OrderHandler], OrderHandler] = _unchanged


def chaos_profile(rng: random.Random) -> ChaosProfile:
    """How hard this seed shakes the system: some seeds are calm, some rough, all drain in the end."""
    return ChaosProfile(
        fault_rate=rng.choice((0.0, 0.03, 0.08, 0.15, 0.25)),
        switch_rate=rng.choice((0.05, 0.25, 0.6)),
        until=EPOCH + rng.uniform(300.0, 1500.0),
    )


class World:
    """One run's system under test and its surroundings; the actors share it."""

    def __init__(self, seed: int, wiring: Wiring, *, trace: bool) -> None:
        settings = SETTINGS
        self.settings = settings
        rng = random.Random(seed)  # noqa: S311 - a simulation, reproducible by seed; not security
        self.clock = Clock()
        self.sched = Scheduler(rng, self.clock, [] if trace else None)
        self.consumers = rng.randint(2, 4)
        self.detection_window = rng.choice(DETECTION_WINDOWS_SECONDS)
        self.chaos = Chaos(self.sched, chaos_profile(rng), settings.servicebus_lock_duration_seconds)
        self.broker = Broker(self.sched, settings, detection_window=self.detection_window)
        self.store = InMemoryStore(default_ttl=-1, clock=self.clock)
        self.fulfilment = InMemoryFulfilment()
        self.sender = RecordingSender(detection_window_seconds=self.detection_window, clock=self.clock,
                                      destinations=[settings.outbox_destination])
        self.feed = Signal()
        self.history = History(lambda: self.sched.notify(self.feed))
        store_port = wiring.store(FaultyStore(self.store, self.chaos, self.history))
        services = OrderServices(store_port, wiring.fulfilment(FaultyFulfilment(self.fulfilment, self.chaos)),
                                 settings, self.clock)
        order_handler = wiring.place_order(place_order)
        self.handlers: dict[str, Handler] = {
            settings.orders_queue: lambda message: order_handler(message, services),
            settings.order_events_queue: lambda message: apply_order_event(message, store_port, settings, self.clock),
        }
        self.outbox = OutboxPublisher(store_port, FaultySender(self.sender, self.chaos),
                                      dispatched_ttl_seconds=settings.outbox_dispatched_ttl_seconds, clock=self.clock)
        self.workload: Workload = build_workload(rng, settings, self.clock, self.detection_window)
        self.accepted: dict[int, BrokerMessage] = {}  # workload tag -> the broker message it became
        self.producing = len(self.workload.scripts)
        self.busy = 0  # deliveries and publisher runs under way
        self.deliveries = 0
        self.outcomes: Counter[str] = Counter()
        self.settlements: Counter[str] = Counter()
        self.creators: Counter[str] = Counter()  # message id -> deliveries that reported creating the order
        self.errors: list[str] = []  # deliveries a handler failed with an unexpected exception

    def queue(self, name: str) -> Queue:
        """A queue by name."""
        return self.broker.queues[name]

    def drained(self) -> bool:
        """Whether everything is done: sent, settled, published; nothing under way."""
        return (self.producing == 0 and self.busy == 0 and self.broker.unsettled() == 0
                and not self.history.outbox_changes and not self.pending_outbox())

    def pending_outbox(self) -> int:
        """How many outbox entries are still pending in the store."""
        conditions, before = OutboxEntry.pending_before(float("inf"))
        return len(drive(self.store.query(conditions, before=before)))
