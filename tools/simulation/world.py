"""Everything one run is made of, built from its seed: clock, scheduler, chaos, broker, fakes, proxies, workload."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from idempotent_consumer.delivery import SETTLEMENTS, Handler
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered.writes import Releases
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.sender import MessageSender
from idempotent_consumer.ports.store import DocumentStore, query_all
from idempotent_consumer.records import OutboxEntry
from idempotent_consumer.retries import RETRY_LIMIT_EXCEEDED
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.ports.fulfilment import FulfilmentService
from shared.settings import Settings
from simulation.broker import Broker, BrokerMessage, Delivery, Namespace, Queue
from simulation.faults import Chaos, ChaosProfile, Outage
from simulation.proxies import FaultyFulfilment, FaultySender, FaultyStore, History
from simulation.scheduler import EPOCH, Clock, Scheduler, Signal, drive
from simulation.workload import Workload, build_workload

T = TypeVar("T")

# duplicateDetectionWindow, on the queues and on order-accepted: Bicep's default PT10M, and a short one
# under which a producer's retry can meet its original still being processed.
DETECTION_WINDOWS_SECONDS = (60.0, 600.0)
CLAIM_FORMS = ("of its own", "in the order", "both")
SETTINGS = Settings(fulfillment_url="http://fulfilment.simulated", abandon_delay_seconds=10.0)
PAGE_ITEMS = (1, 2, 3)
# The fulfilment fake draws reservation ids from uuid4, outside the seed: masked, so that traces replay alike.
_RANDOM_IDS = re.compile(r"res-[0-9a-f-]{36}")


def _unchanged(value: T) -> T:
    return value


@dataclass(frozen=True)
class Instance:
    """One process of the app: its App (and so its breakers) and its handlers by queue."""

    app: bootstrap.App
    handlers: dict[str, Handler]


@dataclass(frozen=True)
class Wiring:
    """What a run drives: the app's ports and its order handler, each passed through a wrapper, where tests
    plant bugs."""

    store: Callable[[DocumentStore], DocumentStore] = _unchanged
    fulfilment: Callable[[FulfilmentService], FulfilmentService] = _unchanged
    handle_order: Callable[[Handler], Handler] = _unchanged
    releases: type[Releases] = Releases
    sender: Callable[[MessageSender], MessageSender] = _unchanged


# An outage in a third of the seeds, of the fulfilment service or of the store: from 5 to 40 minutes, far
# longer than MaxDeliveryCount (10) deliveries with their waits (about 100 s), well inside RETRY_TOTAL_SECONDS.
OUTAGE_SHARE = 1 / 3
OUTAGE_SECONDS = (300.0, 2400.0)
# A quarter of those outages are long: 50 to 80 minutes, past the run's RETRY_TOTAL_SECONDS, there 40 minutes (a
# setting, here shorter than Azure's 4 hours, and long enough that a chain's back-off reaches its 15-minute ceiling):
# the chains begun early in it reach their last delivery while it lasts, and are dead-lettered RetryLimitExceeded,
# which an operator resubmits once it is over (docs/operations.md, "In an outage").
LONG_OUTAGE_SHARE = 1 / 4
LONG_OUTAGE_SECONDS = (3000.0, 4800.0)
LONG_RETRY_TOTAL_SECONDS = 2400


def chaos_profile(rng: random.Random) -> ChaosProfile:
    """How hard this seed shakes the system: some seeds are calm, some rough, some meet an outage; all drain."""
    outage = None
    if rng.random() < OUTAGE_SHARE:
        start = EPOCH + rng.uniform(10.0, 600.0)
        long = rng.random() < LONG_OUTAGE_SHARE
        outage = Outage(rng.choice(("fulfilment", "store")), start,
                        start + rng.uniform(*(LONG_OUTAGE_SECONDS if long else OUTAGE_SECONDS)), long=long)
    return ChaosProfile(
        fault_rate=rng.choice((0.0, 0.03, 0.08, 0.15, 0.25)),
        switch_rate=rng.choice((0.05, 0.25, 0.6)),
        until=EPOCH + rng.uniform(300.0, 1500.0),
        outage=outage,
    )


class World:
    """One run's system under test and its surroundings; the actors share it."""

    def __init__(self, seed: int, wiring: Wiring, *, trace: bool) -> None:
        rng = random.Random(seed)  # noqa: S311 - a simulation, reproducible by seed; not security
        self.clock = Clock()
        self.sched = Scheduler(rng, self.clock, [] if trace else None)
        self.consumers = rng.randint(2, 4)
        # Half the seeds run the events queue without sessions (ORDER_EVENTS_SESSIONS false): any consumer takes
        # any event, so two of one order's may run at once, and the resequencer alone keeps them in order.
        self.events_sessions = rng.random() < 0.5
        settings = msgspec.structs.replace(SETTINGS, order_events_sessions=self.events_sessions)
        self.settings = settings
        self.concurrent_events = 0  # event deliveries that began while another of the same order's ran
        self.events_in_flight: Counter[str] = Counter()  # order (session) id -> its event deliveries running
        self.detection_window = rng.choice(DETECTION_WINDOWS_SECONDS)
        # A third of the seeds write each new order's reservation claim as a document of its own, a third inside the
        # order (RESERVATION_CLAIM_IN_ORDER), and a third both at once, each process with one of the two, as while
        # the setting rolls out: every process reads both. By the seed, so that the rest of the run draws as before.
        self.claim_form = CLAIM_FORMS[seed % len(CLAIM_FORMS)]
        self.in_hand: dict[object, Delivery] = {}  # actor -> the delivery it is running
        profile = chaos_profile(rng)
        # A fifth of the seeds without an outage run with DELAYED_RETRIES false: a transient failure abandons, as
        # it does when a copy cannot be sent, and MaxDeliveryCount bounds it.
        if profile.outage is None and rng.random() < 0.2:
            settings = msgspec.structs.replace(settings, delayed_retries=False)
            self.settings = settings
        if profile.outage is not None and profile.outage.long:
            settings = msgspec.structs.replace(settings, retry_total_seconds=LONG_RETRY_TOTAL_SECONDS)
            self.settings = settings
        self.chaos = Chaos(self.sched, profile, settings.servicebus_lock_duration_seconds,
                           release=self._release_session, releasable=self._holds_session)
        self.broker = Broker(self.sched, settings, detection_window=self.detection_window)
        # Query pages far smaller than Cosmos DB's 100, and in half the runs an empty page before the first
        # documents (as Cosmos DB answers across partition ranges), so that releases and sweeps cross pages in
        # most runs, as they do on Azure once a backlog passes a page.
        self.page_items = rng.choice(PAGE_ITEMS)
        self.store = InMemoryStore(default_ttl=-1, clock=self.clock, page_items=self.page_items,
                                   empty_first_page=rng.random() < 0.5)
        self.fulfilment = InMemoryFulfilment()
        self.sender = RecordingSender(detection_window_seconds=self.detection_window, clock=self.clock,
                                      destinations=[settings.outbox_destination,
                                                    settings.outbox_rejected_destination])
        self.feed = Signal()
        self.changed = Signal()  # the app wrote: what the enrichment job waits for
        self.history = History(lambda: self.sched.notify(self.feed), lambda: self.sched.notify(self.changed),
                               actor=lambda: self.sched.current)
        self.store_proxy = FaultyStore(self.store, self.chaos, self.history)
        # The app as production builds it, over the faulty ports, on simulated time: one per process (each
        # consumer's, made again when it restarts after a crash, as a Functions instance's is), so that each
        # instance keeps breakers of its own; and one for the publisher and the sweeper.
        self.wiring = wiring
        self._store = wiring.store(self.store_proxy)
        self._fulfilment = wiring.fulfilment(FaultyFulfilment(self.fulfilment, self.chaos, self.history))
        self._app_sender = self._sender(wiring)
        self.instances: list[Instance] = []
        self.app = self.instance().app
        self.outbox = self.app.publisher()
        self.workload: Workload = build_workload(rng, settings, self.clock, self.detection_window)
        self.storm = any(plan.events and plan.events[0].aliases for plan in self.workload.orders)
        self.accepted: dict[int, BrokerMessage] = {}  # workload tag -> the broker message it became
        self.producing = len(self.workload.scripts)
        self.busy = 0  # deliveries and publisher runs under way
        self.deliveries = 0
        self.outcomes: Counter[str] = Counter()
        self.settlements: Counter[str] = Counter()
        self.creators: Counter[str] = Counter()  # message id -> deliveries that reported creating the order
        self.errors: list[str] = []  # deliveries a handler failed with an unexpected exception
        self.foreign_writes: Counter[str] = Counter()  # kind -> writes of the other writers (simulation.foreign)
        self.foreign_stats: Counter[str] = Counter()  # their own 412s, writes given up, documents gone first
        self.resubmitted = 0  # dead letters the operator sent again

    def instance(self) -> Instance:
        """A new process of the app: the app as production builds it over the run's ports, and its handlers by
        queue, through the wiring's wrapper."""
        in_order = self.claim_form == "in the order" or (self.claim_form == "both" and len(self.instances) % 2 == 1)
        settings = msgspec.structs.replace(self.settings, reservation_claim_in_order=in_order)
        app = bootstrap.build(settings, store=self._store, fulfilment=self._fulfilment, sender=self._app_sender,
                              clock=self.clock, sleep=self._sleep, record=self._record, releases=self.wiring.releases)
        handlers: dict[str, Handler] = {self.settings.orders_queue: self.wiring.handle_order(app.handle_order),
                                        self.settings.order_events_queue: app.handle_event}
        self.instances.append(Instance(app, handlers))
        return self.instances[-1]

    @property
    def breakers_opened(self) -> int:
        """How many times any instance's breaker opened."""
        return sum(b.opened for instance in self.instances for b in instance.app.breakers)

    def _sender(self, wiring: Wiring) -> MessageSender:
        """The app's sender: the namespace under chaos, through the wiring's wrapper. A wrapper with an
        ``after_settle`` method has it called after each settlement (a planted bug sends there)."""
        self.namespace = Namespace(self.broker, self.sender, self.settings.retry_backoff_ceiling_seconds)
        sender = wiring.sender(FaultySender(self.namespace, self.chaos))
        self.after_settle: Callable[[], None] | None = getattr(sender, "after_settle", None)
        return sender

    def _holds_session(self, actor: object) -> bool:
        """Whether ``actor`` runs a session delivery that still holds its lock."""
        delivery = self.in_hand.get(actor)
        return delivery is not None and delivery.queue.holds_lock(delivery)

    def _release_session(self, actor: object) -> bool:
        """Let the session of ``actor``'s delivery go now, mid-processing; False when it runs none."""
        delivery = self.in_hand.get(actor)
        if delivery is None or not delivery.queue.release_session(delivery):
            return False
        if self.sched.trace_lines is not None:
            self.sched.trace(f"session {delivery.message.session_id} released mid-processing")
        return True

    async def _sleep(self, seconds: float) -> None:
        """The wait before an abandon, on simulated time: the actor blocks, and the coroutine never suspends."""
        self.sched.sleep(seconds)

    def _record(self, function: str, message: InboundMessage, result: Result, duration_ms: float) -> None:
        """What the app records of each delivery, counted and traced; ``function`` is the queue's name."""
        self.outcomes[result.outcome.value] += 1
        if result.outcome is Outcome.CREATED and message.message_id:
            self.creators[message.message_id] += 1
        if result.outcome is Outcome.ERROR:
            self.errors.append(f"{function}#{message.sequence_number} {message.message_id}: {result.description}")
        if self.sched.trace_lines is not None:
            settlement = SETTLEMENTS[result.outcome]
            description = _RANDOM_IDS.sub("res-*", result.description[:160])
            self.sched.trace(f"outcome {result.outcome} -> {settlement.action} {settlement.reason or ''}"
                             f" {description}".rstrip())

    def queue(self, name: str) -> Queue:
        """A queue by name."""
        return self.broker.queues[name]

    def drained(self) -> bool:
        """Whether everything is done: sent, settled, published, every dead letter an operator resubmits resubmitted;
        nothing under way."""
        return (self.producing == 0 and self.busy == 0 and self.broker.unsettled() == 0
                and not self.history.outbox_changes and not self.pending_outbox() and not self.to_resubmit())

    def to_resubmit(self) -> list[tuple[Queue, BrokerMessage]]:
        """The messages dead-lettered RetryLimitExceeded, which the operator resubmits once the outage is over,
        that are not resubmitted yet."""
        done = {id(m.resubmission_of) for q in self.broker.queues.values() for m in q.messages if m.resubmission_of}
        return [(q, m) for q in self.broker.queues.values() for m in q.messages
                if m.reason == RETRY_LIMIT_EXCEEDED and id(m) not in done]

    def pending_outbox(self) -> int:
        """How many outbox entries are still pending in the store."""
        conditions, before = OutboxEntry.pending_before(float("inf"))
        return len(drive(query_all(self.store, conditions, before=before)))
