"""The simulation kit: the deterministic simulator pointed at your own consumer.

One seed is one run of your ``Consumer`` against a simulated queue, store, sender and downstream services, on
simulated time, with the faults Service Bus and Cosmos DB produce in production:

- competing consumers, interleaved at every port call in an order the seed decides;
- a process that dies at a port call (no settlement: its lock runs out and the message comes back);
- a delivery that stalls past its lock (another consumer gets the message while the first still runs);
- a settlement lost on the way to the broker, before or after the broker applied it;
- a store that refuses a request, or applies it and then fails to answer; a sender that does the same;
- a downstream that is down for a while, refuses a call, or does it and loses the answer;
- a producer that sends a message twice (under a new MessageId, or the same one), a copy of a message with other
  content under its key, a body that is not JSON, and another writer that has taken a document's id.

At the end, after the queue and the outbox have drained, the generic invariants are checked, and yours:

- **nothing lost**: every message the queue took was completed or dead-lettered; every key was taken by one
  content, whose documents are stored as its plan declares them;
- **one effect per key**: each effect of a key was made under the key the library derives and no other (the
  simulated services, like real ones, make a key's effect once), and none for a key whose message was refused;
- **one message per name**: each message a plan declares (or its effects' announcements declare) was sent, under
  its derived MessageId, with the body declared, and no other message was sent;
- **the right reasons**: a message is dead-lettered only for what was wrong with it: a body that is not the model
  (``InvalidMessage``), other content under a key that was taken (``PayloadMismatch``);
- **nothing left waiting**: no effect in progress, no outbox entry pending.

A ``function`` registered with ``Consumer.ordered`` is driven the same way, and its invariants are the ordered
mode's, for a machine that ``creates`` its subjects:

- **in order, once**: each subject stands where the accepted events (the content that took each event's identity)
  take it when applied in sequence by the machine itself, from the first, up to the first gap or the first the
  machine refuses;
- **nothing left waiting**: no event stays parked once its subject stands at its predecessor, and each subject's
  parked count is what still waits, counted;
- **nothing lost**, with **the right reasons**: every message completed, or dead-lettered ``InvalidMessage``
  (not an event), ``PayloadMismatch`` (other content under an event's identity), ``InvalidTransition`` or
  ``LimitExceeded`` (the machine's refusals; an accepted event's only).

A run replays step for step from its seed. Concurrency is cooperative: each actor is an asyncio task that gives up
control only at a port call or a simulated sleep, and the seeded scheduler chooses which waiting actor goes next.
So a violation names its seed, and the seed reproduces it.

    spec = Spec(consumer=ledger, function="payment_received", messages=payments, services={"credit": decide},
                wire=lambda world: setattr(bank, "post", world.services["credit"].post))
    report = simulate(spec, seeds=range(2000))
    assert not report.violations
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import inspect
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from idempotent_consumer import identity, retries
from idempotent_consumer.delivery import Action, Settlement
from idempotent_consumer.errors import DownstreamUnavailable, PublishError, StoreError, TransientStoreError
from idempotent_consumer.http import JsonReply
from idempotent_consumer.messages import Headers, InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.plan import Answer, Plan
from idempotent_consumer.ports.sender import OutgoingMessage
from idempotent_consumer.ports.store import BatchOperation, Document
from idempotent_consumer.records import TYPE_FIELD
from idempotent_consumer.testing.memory import InMemoryStore

if TYPE_CHECKING:
    from idempotent_consumer.functions.consumer import Consumer
    from idempotent_consumer.ordered import Machine, Ordered

T = TypeVar("T")
#: 2026-12-01T00:00:00Z: every run starts here, so that a trace reads the same whatever day it is replayed.
EPOCH = 1_796_083_200.0
MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"


class Crash(BaseException):
    """Raised into an actor at a port call: its process died there. Not an Exception, so no handler catches it."""


class LockLost(Exception):
    """A settlement on a lock that ran out, or that another delivery holds now."""


@dataclass(frozen=True)
class Faults:
    """How often each fault happens, per port call (or per step, for a crash and a stall)."""

    crash: float = 0.002
    stall: float = 0.004  # a step that takes ``stall_seconds``: past the lock, so the message is delivered again
    stall_seconds: float = 75.0
    store_refused: float = 0.02
    store_unanswered: float = 0.01  # applied, then no answer
    send_refused: float = 0.02
    send_unanswered: float = 0.01
    settle_lost: float = 0.02  # the broker never saw it
    settle_unanswered: float = 0.01  # applied, then no answer
    service_refused: float = 0.03  # a 503
    service_unanswered: float = 0.02  # done, then the answer is lost
    outage_seconds: tuple[float, float] = (0.0, 120.0)  # each service is down once, for up to this long


class Scheduler:
    """Simulated time and cooperative actors: one seeded RNG decides which waiting actor runs next."""

    def __init__(self, rng: random.Random, faults: Faults) -> None:
        self.now, self.rng, self.faults = EPOCH, rng, faults
        self._ready: list[tuple[asyncio.Future[None], bool]] = []  # each waiting actor, and whether it may die there
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = 0
        self._running = 0
        self._idle = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def clock(self) -> float:
        """The current simulated time."""
        return self.now

    def utc(self, moment: float | None = None) -> datetime:
        """A simulated moment (now by default) as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now if moment is None else moment, UTC)

    def spawn(self, actor: Awaitable[None]) -> None:
        """Start an actor; it runs until its first port call or sleep."""
        self._running += 1
        self._idle.clear()
        task = asyncio.ensure_future(actor)
        task.add_done_callback(self._finished)
        self.tasks.append(task)

    async def turn(self, *, may_crash: bool = True) -> None:
        """A port call: give up control until the scheduler picks this actor again (which may kill it there)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ready.append((future, may_crash))
        self._block()
        await future

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of simulated time."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._count += 1
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), self._count, future))
        self._block()
        await future

    async def run(self, done: Callable[[], bool], deadline: float) -> bool:
        """Run the actors until ``done`` or the simulated ``deadline``; whether ``done`` came first."""
        await self._idle.wait()
        while not done():
            if self._ready:
                future, crashable = self._ready.pop(self.rng.randrange(len(self._ready)))
                self.now += self.rng.expovariate(50.0)  # a port call takes 20 ms on average
                if self.rng.random() < self.faults.stall:
                    self.now += self.faults.stall_seconds
                crash = crashable and self.rng.random() < self.faults.crash
                await self._wake(future, Crash() if crash else None)
            elif self._timers:
                when, _, future = heapq.heappop(self._timers)
                self.now = max(self.now, when)
                await self._wake(future, None)
            else:
                return done()
            if self.now > deadline:
                return False
        return True

    def stop(self) -> None:
        """Cancel every actor still waiting."""
        for task in self.tasks:
            task.cancel()

    async def _wake(self, future: asyncio.Future[None], error: BaseException | None) -> None:
        self._running += 1
        self._idle.clear()
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
        await self._idle.wait()

    def _block(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._block()


@dataclass(eq=False)
class Queued:
    """One message in a simulated queue."""

    sequence_number: int
    message: OutgoingMessage
    available_at: float
    state: str = "available"  # available, locked, completed, dead-lettered
    locked_until: float = 0.0
    token: int = 0
    delivery_count: int = 0
    enqueued_at: float = 0.0
    reason: str | None = None
    description: str | None = None


class Broker:
    """Service Bus queues as a consumer meets them: PeekLock with a lock that runs out, delivery counts,
    MaxDeliveryCount, scheduled messages, and duplicate detection by MessageId."""

    def __init__(self, scheduler: Scheduler, *, lock_seconds: float = 60.0, max_delivery_count: int = 10,
                 detection_seconds: float = 600.0) -> None:
        self._scheduler = scheduler
        self.lock_seconds, self.max_delivery_count, self.detection_seconds = (lock_seconds, max_delivery_count,
                                                                              detection_seconds)
        self.queues: dict[str, list[Queued]] = {}
        self._first: dict[tuple[str, str], float] = {}
        self._sequence = 0

    def send(self, queue: str, message: OutgoingMessage) -> bool:
        """Enqueue ``message``; False when duplicate detection dropped it."""
        now = self._scheduler.now
        first = self._first.get((queue, message.message_id))
        if first is not None and now - first < self.detection_seconds:
            return False
        self._first[(queue, message.message_id)] = now
        self._sequence += 1
        due = message.scheduled_enqueue_time.timestamp() if message.scheduled_enqueue_time else now
        self.queues.setdefault(queue, []).append(Queued(self._sequence, message, max(now, due), enqueued_at=now))
        return True

    def receive(self, queue: str) -> Queued | None:
        """Lock the first message available now, counting a delivery; None when there is none."""
        now = self._scheduler.now
        for queued in self.queues.get(queue, []):
            if queued.state == "locked" and queued.locked_until <= now:
                self._returned(queued)
            if queued.state == "available" and queued.available_at <= now:
                queued.state, queued.locked_until = "locked", now + self.lock_seconds
                queued.token += 1
                queued.delivery_count += 1
                return queued
        return None

    def settle(self, queued: Queued, token: int, settlement: Settlement, description: str) -> None:
        """Carry out a settlement made under ``token``; LockLost when that lock no longer holds."""
        if queued.state != "locked" or queued.token != token or queued.locked_until <= self._scheduler.now:
            raise LockLost(f"message {queued.message.message_id}: the lock is lost")
        if settlement.action is Action.COMPLETE:
            queued.state = "completed"
        elif settlement.action is Action.DEADLETTER:
            queued.state, queued.reason, queued.description = "dead-lettered", settlement.reason, description
        else:
            self._returned(queued)

    def busy(self, queue: str) -> bool:
        """Whether the queue still holds a message to deliver, or one locked."""
        return any(q.state in ("available", "locked") for q in self.queues.get(queue, []))

    def _returned(self, queued: Queued) -> None:
        if queued.delivery_count >= self.max_delivery_count:
            queued.state, queued.reason = "dead-lettered", MAX_DELIVERY_COUNT_EXCEEDED
            queued.description = f"{queued.delivery_count} deliveries"
        else:
            queued.state, queued.available_at = "available", self._scheduler.now


class _Store:
    """The in-memory store behind the scheduler's turns, with the store's faults."""

    def __init__(self, store: InMemoryStore, scheduler: Scheduler) -> None:
        self.inner, self._scheduler = store, scheduler

    async def _fault(self) -> bool:
        """A port call: may refuse it (raised), or return True for one to apply and then not answer."""
        await self._scheduler.turn()
        faults, rng = self._scheduler.faults, self._scheduler.rng
        if rng.random() < faults.store_refused:
            raise TransientStoreError("simulated: 503 from the store", status=503)
        return rng.random() < faults.store_unanswered

    async def create(self, document: Document) -> Document:
        lost = await self._fault()
        written = await self.inner.create(document)
        if lost:
            raise TransientStoreError("simulated: the create's answer was lost", status=408)
        return written

    async def read(self, doc_id: str, partition_key: str) -> Document:
        await self._fault()
        return await self.inner.read(doc_id, partition_key)

    async def query_pages(self, conditions: Mapping[str, Any], **options: Any) -> Any:
        await self._fault()
        async for page in self.inner.query_pages(conditions, **options):
            yield page

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        lost = await self._fault()
        written = await self.inner.execute_batch(partition_key, operations)
        if lost:
            raise TransientStoreError("simulated: the batch's answer was lost", status=408)
        return written


class _Sender:
    """The broker's sending side, with the sender's faults."""

    def __init__(self, broker: Broker, scheduler: Scheduler) -> None:
        self._broker, self._scheduler = broker, scheduler
        self.sent: list[tuple[str, OutgoingMessage]] = []

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        await self._scheduler.turn()
        faults, rng = self._scheduler.faults, self._scheduler.rng
        if rng.random() < faults.send_refused:
            raise PublishError(f"simulated: send to {destination} refused")
        for message in messages:
            self.sent.append((destination, message))
            self._broker.send(destination, message)
        if rng.random() < faults.send_unanswered:
            raise PublishError(f"simulated: the send to {destination} was not answered")


class _Settlement:
    """One delivery's settlement port over the broker, with lost settlements."""

    def __init__(self, broker: Broker, scheduler: Scheduler, queued: Queued) -> None:
        self._broker, self._scheduler, self._queued, self._token = broker, scheduler, queued, queued.token

    async def settle(self, settlement: Settlement, result: Result) -> None:
        await self._scheduler.turn()
        faults, rng = self._scheduler.faults, self._scheduler.rng
        if rng.random() < faults.settle_lost:
            raise LockLost("simulated: the settlement never reached the broker")
        self._broker.settle(self._queued, self._token, settlement, result.description)
        if rng.random() < faults.settle_unanswered:
            raise LockLost("simulated: the settlement's answer was lost")

    async def renew_session_lock(self) -> datetime | None:
        return None


class Service:
    """A downstream that makes each idempotency key's effect once: a repeat under a key is answered as the first
    was, and makes nothing. ``decide`` answers a key's first request (status and JSON body); a 2xx made the
    effect, and its body's ``reference`` is made up when it has none. Down once, for a while; sometimes a 503;
    sometimes the answer is lost after the effect was made."""

    def __init__(self, name: str, scheduler: Scheduler,
                 decide: Callable[[Mapping[str, Any]], tuple[int, dict[str, Any]]]) -> None:
        self.name, self._scheduler, self._decide = name, scheduler, decide
        low, high = scheduler.faults.outage_seconds
        start = EPOCH + scheduler.rng.uniform(0, 600)
        self.outage = (start, start + scheduler.rng.uniform(low, high))
        self.made: dict[str, Mapping[str, Any]] = {}  # by idempotency key: the request that made it
        self.answers: dict[str, JsonReply] = {}
        self.calls: list[str] = []

    async def call(self, idempotency_key: str, request: Mapping[str, Any]) -> JsonReply:
        """One request under ``idempotency_key``."""
        await self._scheduler.turn()
        faults, rng, now = self._scheduler.faults, self._scheduler.rng, self._scheduler.now
        self.calls.append(idempotency_key)
        if self.outage[0] <= now < self.outage[1] or rng.random() < faults.service_refused:
            return JsonReply(503, {"reason": "simulated: unavailable"})
        if idempotency_key in self.answers:
            first = self.answers[idempotency_key]
            return JsonReply(200 if first.status == 201 else first.status, first.body)
        status, body = self._decide(request)
        if 200 <= status < 300:
            self.made[idempotency_key] = dict(request)
            body = {"reference": f"{self.name}-{len(self.made)}", **body}
        self.answers[idempotency_key] = JsonReply(status, body)
        if rng.random() < faults.service_unanswered:
            raise DownstreamUnavailable(f"simulated: {self.name}'s answer was lost", slow=True)
        return self.answers[idempotency_key]

    async def post(self, path: str, body: Mapping[str, Any], *, idempotency_key: str) -> JsonReply:
        """``JsonHttp.post``'s shape, so that a client of that kind can be stood in for by this service."""
        return await self.call(idempotency_key, body)


@dataclass(frozen=True)
class Sent:
    """One message the workload sent to the consumer's queue; ``kind`` says what the producer did."""

    body: bytes
    message_id: str
    kind: str  # original, copy (a new MessageId), resend (the same one), altered (other content), garbage


@dataclass
class World:
    """What one run left: the store's documents, the queues, the services and the workload; what your
    invariants read."""

    seed: int
    scheduler: Scheduler
    consumer: Consumer
    function: str
    queue: str
    store: InMemoryStore
    broker: Broker
    services: dict[str, Service]
    workload: list[Sent]
    taken: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # by key: a foreign writer's document
    results: list[Result] = field(default_factory=list)
    deliveries: list[tuple[str | None, Result]] = field(default_factory=list)  # each delivery's MessageId and result

    def record(self, message: InboundMessage, result: Result) -> None:
        """Keep one delivery's result."""
        self.results.append(result)
        self.deliveries.append((message.message_id, result))

    def documents(self, doc_type: str | None = None) -> list[Document]:
        """The store's documents (of ``doc_type``)."""
        return [d for d in self.store.documents() if doc_type is None or d.get(TYPE_FIELD) == doc_type]

    def delivered(self, destination: str) -> list[OutgoingMessage]:
        """The messages a destination queue took (duplicate detection applied)."""
        return [q.message for q in self.broker.queues.get(destination, [])]


@dataclass(frozen=True)
class Spec:
    """What to simulate: your ``consumer`` and the ``function`` (a queue's handler) to drive; ``messages``, the
    bodies a run sends (from the seed's RNG); ``services``, how each effect's downstream answers a first request,
    by effect name; ``wire``, how your effects' clients reach the run's services (called at the start of each
    run); ``alter``, a copy of a body with other content under the same key; ``foreign``, a document another
    writer has put where a message's plan writes (its key is then taken, so it must be at an id every content of
    the key writes); your own ``invariants``. A run gives the consumer back the runtime it had; what ``wire``
    changed stays as the last run left it."""

    consumer: Consumer
    function: str
    messages: Callable[[random.Random], Sequence[bytes]]
    services: Mapping[str, Callable[[Mapping[str, Any]], tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    wire: Callable[[World], None] = lambda world: None
    alter: Callable[[bytes, random.Random], bytes] | None = None
    foreign: Callable[[bytes], Mapping[str, Any]] | None = None
    invariants: Sequence[Callable[[World], Iterable[str]]] = ()
    consumers: int = 3
    faults: Faults = Faults()
    # The MessageId a producer gives a body (an event's id, say); a new random one for each body when None.
    message_id: Callable[[bytes], str] | None = None


@dataclass
class Report:
    """What a set of runs found: the violations by seed, and the outcomes counted."""

    seeds: int = 0
    violations: dict[int, list[str]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    messages: int = 0

    def summary(self) -> str:
        """One paragraph: seeds, messages, outcomes, violations (the first few, with their seeds)."""
        lines = [f"{self.seeds} seeds, {self.messages} messages, {sum(map(len, self.violations.values()))} "
                 f"violations in {len(self.violations)} seeds",
                 "outcomes: " + ", ".join(f"{k} {v:,}" for k, v in self.outcomes.most_common())]
        for seed, found in list(self.violations.items())[:5]:
            lines += [f"seed {seed}: {v}" for v in found[:3]]
        return "\n".join(lines)


def simulate(spec: Spec, seeds: Iterable[int], *, first_violation: bool = False) -> Report:
    """Run ``spec`` once per seed; the report of every run (or, with ``first_violation``, of the runs up to the
    first that broke an invariant: how a test shows that the kit finds a planted bug)."""
    report = Report()
    for seed in seeds:
        world, violations = run(spec, seed)
        report.seeds += 1
        report.messages += len(world.workload)
        report.outcomes.update(result.outcome.value for result in world.results)
        if violations:
            report.violations[seed] = violations
            if first_violation:
                break
    return report


def run(spec: Spec, seed: int) -> tuple[World, list[str]]:
    """One run of ``spec`` from ``seed``: the world it left and the invariants it broke. The library's own log
    records (a settlement lost, a takeover) are the faults the run injects: they are held back meanwhile."""
    library = logging.getLogger("idempotent_consumer")
    level, library.level = library.level, logging.CRITICAL + 1
    runtime = spec.consumer._runtime  # the run's own, meanwhile: the consumer is given back the one it had
    try:
        return asyncio.run(_run(spec, seed))
    finally:
        library.setLevel(level)
        spec.consumer._runtime = runtime


async def _run(spec: Spec, seed: int) -> tuple[World, list[str]]:
    rng = random.Random(seed)  # noqa: S311 - a simulation's seeded choices, not security
    scheduler = Scheduler(rng, spec.faults)
    consumer, ordered = spec.consumer, spec.consumer.ordered_queues.get(spec.function)
    if ordered is not None and not ordered[1].machine.creates:
        raise ValueError(f"{spec.function}: the kit's ordered invariants replay a machine that creates its subjects"
                         " by their first event (creates true)")
    queue = ordered[0] if ordered is not None else consumer.queues[spec.function].queue
    store = InMemoryStore(partition_field=consumer.partition_field, clock=scheduler.clock, default_ttl=-1)
    broker = Broker(scheduler, lock_seconds=consumer.settings.servicebus_lock_duration_seconds,
                    max_delivery_count=consumer.settings.servicebus_max_delivery_count)
    services = {name: Service(name, scheduler, decide) for name, decide in spec.services.items()}
    world = World(seed, scheduler, consumer, spec.function, queue, store, broker, services, _workload(spec, rng))
    spec.wire(world)
    for sent in world.workload if ordered is None else ():  # another writer was first, where some plans write
        decoded = _decoded(world, sent.body, sent.message_id)
        if sent.kind == "original" and decoded is not None and spec.foreign is not None and rng.random() < 0.05:
            document = dict(spec.foreign(sent.body))
            await store.create(document)
            world.taken[decoded[0]] = document
    actors = _Actors(spec, world)
    scheduler.spawn(actors.produce())
    for _ in range(spec.consumers):
        scheduler.spawn(actors.consume())
    scheduler.spawn(actors.publish())
    finished = await scheduler.run(actors.drained, deadline=EPOCH + 12 * 3600)
    scheduler.stop()
    await asyncio.gather(*scheduler.tasks, return_exceptions=True)
    violations = [] if finished else [f"not drained after 12 simulated hours: {_left(world)}"]
    violations += await _invariants(world) if ordered is None else _ordered_invariants(world, ordered[1])
    for invariant in spec.invariants:
        violations += [f"{getattr(invariant, '__name__', 'invariant')}: {v}" for v in invariant(world)]
    return world, violations


class _Actors:
    """A run's actors: the producer, the competing consumers, and the outbox's publisher."""

    def __init__(self, spec: Spec, world: World) -> None:
        self.spec, self.world, self.producing = spec, world, True
        scheduler = world.scheduler
        self.runtime = spec.consumer.runtime(store=_Store(world.store, scheduler), sender=_Sender(world.broker,
                                                                                                   scheduler),
                                             clock=scheduler.clock, sleep=scheduler.sleep,
                                             record=lambda f, message, result, ms: world.record(message, result))

    async def produce(self) -> None:
        world = self.world
        for sent in world.workload:
            await world.scheduler.sleep(world.scheduler.rng.expovariate(2.0))
            world.broker.send(world.queue, OutgoingMessage(sent.message_id, sent.body))
        self.producing = False

    async def consume(self) -> None:
        world, function, consumer = self.world, self.spec.function, self.spec.consumer
        scheduler = world.scheduler
        while True:
            queued = world.broker.receive(world.queue)
            if queued is None:
                await scheduler.sleep(0.5)
                continue
            message = _inbound(queued, scheduler)
            ordered = consumer.ordered_queues.get(function)
            handler = functools.partial(consumer.handle if ordered is None else consumer.apply, function)
            check = functools.partial(consumer.check, function) if ordered is None else ordered[1].check
            try:
                await self.runtime.deliver(function, functools.partial(_same, message), handler,
                                           _Settlement(world.broker, scheduler, queued), queue=world.queue,
                                           check=check)
            except Crash:
                await scheduler.sleep(scheduler.rng.uniform(1.0, 10.0))  # the host starts a new worker
            except LockLost:
                pass  # run_delivery logged it; the lock runs out and the message comes back

    async def publish(self) -> None:
        """The change feed (the container's documents as stored, handed to the publisher as the trigger hands
        them), and the sweep behind it, for what the feed missed."""
        scheduler, world = self.world.scheduler, self.world
        while True:
            await scheduler.sleep(scheduler.rng.uniform(0.5, 3.0))
            with contextlib.suppress(Crash, StoreError, PublishError):
                if scheduler.rng.random() < 0.5:
                    await self.runtime.publish([d for d in world.store.documents() if d.get(TYPE_FIELD) == "outbox"])
                else:
                    await self.runtime.publisher().sweep(stuck_after_seconds=0)

    def drained(self) -> bool:
        return not self.producing and not self.world.broker.busy(self.world.queue) and not _pending(self.world)


def _same(message: InboundMessage) -> InboundMessage:
    return message


def _workload(spec: Spec, rng: random.Random) -> list[Sent]:
    """The messages a run sends: each body once, and some again as a producer sends them (a copy under a new
    MessageId, a resend under the same one, a copy with other content), with some bodies that are not JSON."""
    sent: list[Sent] = []
    for body in spec.messages(rng):
        message_id = f"m-{rng.getrandbits(48):012x}" if spec.message_id is None else spec.message_id(body)
        sent.append(Sent(body, message_id, "original"))
        if rng.random() < 0.15:
            sent.append(Sent(body, f"m-{rng.getrandbits(48):012x}", "copy"))
        if rng.random() < 0.05:
            sent.append(Sent(body, message_id, "resend"))
        if spec.alter is not None and rng.random() < 0.05:
            sent.append(Sent(spec.alter(body, rng), f"m-{rng.getrandbits(48):012x}", "altered"))
        if rng.random() < 0.02:
            sent.append(Sent(b"{not json", f"m-{rng.getrandbits(48):012x}", "garbage"))
    rng.shuffle(sent)
    return sent


def _inbound(queued: Queued, scheduler: Scheduler) -> InboundMessage:
    message = queued.message
    return InboundMessage(
        message_id=message.message_id, body=message.body, correlation_id=message.correlation_id,
        delivery_count=queued.delivery_count, enqueued_time_utc=scheduler.utc(queued.enqueued_at),
        locked_until_utc=scheduler.utc(queued.locked_until), sequence_number=queued.sequence_number,
        application_properties=dict(message.application_properties),
        headers=Headers(subject=message.subject, content_type=message.content_type))


def _decoded(world: World, body: bytes, message_id: str | None) -> tuple[str, str, str, Any] | None:
    """A message's key, partition and request hash as the consumer reads them (its MessageId is the key of a
    consumer keyed by it), and its model; None if it does not decode."""
    entry = world.consumer.queues[world.function]
    found = world.consumer.decode(entry, InboundMessage(message_id, body))
    if isinstance(found, Result):
        return None
    model, key, partition, request_hash = found
    return key, partition, request_hash, model


def _pending(world: World) -> bool:
    return any(d.get("status") == "pending" for d in world.documents("outbox"))


def _left(world: World) -> str:
    queued = Counter(q.state for q in world.broker.queues.get(world.queue, []))
    pending = sum(1 for d in world.documents("outbox") if d["status"] == "pending")
    return f"queue {dict(queued)}, outbox pending {pending}"


async def _plan(world: World, model: Any, key: str, partition: str) -> Plan:
    """The plan the handler declares for the content that took ``key``."""
    from idempotent_consumer.functions.consumer import Context  # noqa: PLC0415 - the blueprint's, for its type

    entry = world.consumer.queues[world.function]
    plan = entry.handler(model, Context(world.consumer.name, key, partition, InboundMessage("?", b""), EPOCH))
    if inspect.isawaitable(plan):
        plan = await plan
    if not isinstance(plan, Plan):
        raise TypeError(f"the handler returned {type(plan).__name__}, not a Plan")
    return plan


@dataclass
class _Expected:
    """What the accepted messages' plans say the run must have left: the key each content took, the effects made
    under their derived keys, and the messages sent by MessageId (destination, body)."""

    accepted: dict[str, str] = field(default_factory=dict)
    effects: set[str] = field(default_factory=set)
    sends: dict[str, tuple[str, bytes]] = field(default_factory=dict)


async def _invariants(world: World) -> list[str]:
    """The generic invariants over what a run left."""
    found: list[str] = []
    contents: dict[str, tuple[str, dict[str, Any]]] = {}  # key -> partition, {request hash: model}
    for sent in world.workload:
        if (decoded := _decoded(world, sent.body, sent.message_id)) is not None:
            key, partition, request_hash, model = decoded
            contents.setdefault(key, (partition, {}))[1].setdefault(request_hash, model)
    expected = _Expected()
    for key, (partition, models) in sorted(contents.items()):
        found += await _key(world, key, partition, models, expected)
    for name, service in world.services.items():
        found += [f"service {name} made an effect under {effect_key}, which no accepted message derives (one effect"
                  " per key)" for effect_key in service.made.keys() - expected.effects]
    found += _sends(world, expected.sends)
    found += _queue(world, expected.accepted)
    found += [f"effect record {d['id']} is still in progress (nothing left waiting)"
              for d in world.documents("side-effect") if d["status"] == "in_progress"]
    found += [f"outbox entry {d['id']} is still pending (nothing left waiting)"
              for d in world.documents("outbox") if d["status"] == "pending"]
    return found


async def _key(world: World, key: str, partition: str, models: Mapping[str, Any], expected: _Expected) -> list[str]:
    """One key: taken by one content (or left to another writer), whose plan is stored and whose effects are made
    and announced; what it must have sent goes in ``expected``."""
    field_ = world.consumer.partition_field
    markers = [d for d in world.documents("key") if d.get("key") == key and d.get(field_) == partition]
    if key in world.taken:
        theirs = world.taken[key]
        stored = [{k: v for k, v in d.items() if not k.startswith("_")} for d in world.documents()
                  if d.get("id") == theirs.get("id") and d.get(field_) == partition]
        return ([f"key {key}: a document of it was another writer's, yet the key was taken"] if markers else []) + \
            ([f"key {key}: another writer's document was changed"] if stored != [dict(theirs)] else [])
    if len(markers) != 1:
        return [f"key {key}: {len(markers)} markers (nothing lost: one content takes each key)"]
    taken = expected.accepted[key] = markers[0]["requestHash"]
    if taken not in models:
        return [f"key {key}: taken by a content no message had"]
    plan = await _plan(world, models[taken], key, partition)
    found = [f"key {key}: document {document.get('id')} is not stored as the plan declares it"
             for document in plan.create if not _stored_as(world, document, partition)]
    consumer = world.consumer.name
    for send in plan.send:
        expected.sends[identity.outgoing_message_id(consumer, send.name, key)] = (send.to, _json(send.body))
    for effect in plan.all_effects():
        record = next((d for d in world.documents("side-effect")
                       if d["id"] == identity.side_effect_id(consumer, effect.name, key)), None)
        if record is None or record["status"] not in ("completed", "rejected"):
            found.append(f"key {key}: effect {effect.name} is {'missing' if record is None else record['status']}"
                         " (nothing left waiting)")
            continue
        effect_key = identity.effect_key(consumer, effect.name, key)
        expected.effects.add(effect_key)
        service = world.services.get(effect.name)
        if service is not None and (effect_key in service.made) != (record["status"] == "completed"):
            found.append(f"key {key}: effect {effect.name} recorded {record['status']}, but the service "
                         f"{'made' if effect_key in service.made else 'did not make'} it")
        answer = Answer(record.get("responseStatus") or 0, record.get("reference"), record.get("reason"),
                        record.get("refusal"))
        declared = effect.on_done if record["status"] == "completed" else effect.on_refused
        for send in declared(answer) if declared is not None else ():
            expected.sends[identity.outgoing_message_id(consumer, send.name, key)] = (send.to, _json(send.body))
    return found


def _stored_as(world: World, document: Mapping[str, Any], partition: str) -> bool:
    stored = [d for d in world.documents() if d.get("id") == document.get("id")
              and d.get(world.consumer.partition_field) == partition]
    return len(stored) == 1 and all(stored[0].get(k) == v for k, v in document.items())


def _sends(world: World, expected: Mapping[str, tuple[str, bytes]]) -> list[str]:
    """One message per name: each expected one delivered once, where and as declared; nothing else sent."""
    destinations = sorted(set(world.broker.queues) - {world.queue})
    counted = Counter(m.message_id for d in destinations for m in world.delivered(d))
    found = [f"message {message_id} was delivered {n} times (one message per name)"
             for message_id, n in counted.items() if n > 1]
    delivered = {m.message_id: (d, m.body) for d in destinations for m in world.delivered(d)}
    for message_id, (destination, body) in expected.items():
        if message_id not in delivered:
            found.append(f"message {message_id} to {destination} was never sent (one message per name)")
        elif delivered[message_id] != (destination, body):
            found.append(f"message {message_id} was sent to {delivered[message_id][0]} with another body")
    found += [f"message {message_id} to {delivered[message_id][0]} was sent, and no plan declares it"
              for message_id in delivered.keys() - expected.keys()]
    return found


def _queue(world: World, accepted: Mapping[str, str]) -> list[str]:
    """Every message of the consumer's queue settled, for its reason. A message handed on was completed, or, its
    completion lost, delivered again and decided as the last copy of its chain was: the last decides."""
    found: list[str] = []
    for chain in _chains(world).values():
        *handed_on, last = chain
        found += _settled_for_its_reason(world, last, accepted)
        found += [f"message {q.message.message_id} was handed on, yet ended {q.state} {q.reason}" for q in handed_on
                  if q.state != "completed" and (q.reason != last.reason or last.state != "dead-lettered")]
    return found


def _settled_for_its_reason(world: World, queued: Queued, accepted: Mapping[str, str]) -> list[str]:
    """A message of the consumer's queue ended completed when it was fit, or dead-lettered for what was wrong."""
    label = f"message {queued.message.message_id}"
    if queued.state not in ("completed", "dead-lettered"):
        return [f"{label} is {queued.state} (nothing lost)"]
    original, _ = retries.unwrap(_inbound(queued, world.scheduler))  # a copy handed on is read as its original
    decoded = _decoded(world, queued.message.body, original.message_id)
    if decoded is None:
        expected = "InvalidMessage"
    elif decoded[0] in world.taken or accepted.get(decoded[0]) != decoded[2]:
        expected = "PayloadMismatch"
    else:
        expected = None
    reason = queued.reason if queued.state == "dead-lettered" else None
    if reason != expected:
        return [f"{label} ended {queued.state}{f' {reason}' if reason else ''} ({queued.description or ''});"
                f" expected {'completed' if expected is None else f'dead-lettered {expected}'}"]
    return []


def _ordered_invariants(world: World, mode: Ordered) -> list[str]:
    """The ordered mode's invariants over what a run left."""
    from idempotent_consumer.ordered import Subject  # noqa: PLC0415 - the mode's, for a replay

    machine, found = mode.machine, []
    identities = {(d["eventSource"], d["eventId"]): d["requestHash"] for d in world.documents("event-identity")}
    chains = _chains(world)
    completed = {_identity(mode, world, chain[-1]) for chain in chains.values() if chain[-1].state == "completed"}
    # Each subject's accepted events (the content that took its identity, and was completed at least once: one
    # dead-lettered for its subject's parked limit took its identity, and was never applied), by sequence.
    accepted: dict[str, dict[int, list[Any]]] = {}
    for sent in world.workload:
        if mode.check(InboundMessage(sent.message_id, sent.body)) is not None:
            continue
        event = machine.parse(InboundMessage(sent.message_id, sent.body))
        if identities.get((event.source, event.id)) == event.request_hash() and \
                (event.source, event.id) in completed:
            events = accepted.setdefault(event.subject, {}).setdefault(event.sequence, [])
            if all(e.request_hash() != event.request_hash() for e in events):
                events.append(event)
    stored = {d["id"]: d for d in world.documents() if d.get("id") in accepted and machine.read(d) is not None}
    applied: set[tuple[str, str]] = set()
    for key, by_sequence in sorted(accepted.items()):
        if any(len(events) > 1 for events in by_sequence.values()):
            continue  # two events at one version: the first applied decides, which the replay cannot know
        subject = Subject(machine, key)
        for sequence in range(1, max(by_sequence) + 1):
            [event] = by_sequence.get(sequence) or [None]
            if event is None or subject.decide(event) is not Outcome.APPLIED:
                break
            subject = subject.apply(event)
            applied.add((event.source, event.id))
        state = machine.read(stored[key]) if key in stored else None
        where = (None, 0) if state is None else (state.status, state.version)
        if where != (subject.status, subject.version):
            found.append(f"{machine.noun} {key} stands at {where[0]} v{where[1]}; its events, applied in sequence,"
                         f" take it to {subject.status} v{subject.version} (in order, once)")
    return found + _ordered_parked(world, machine, stored) + _ordered_queue(world, mode, chains, identities, applied)


def _ordered_parked(world: World, machine: Machine[Any], stored: Mapping[str, Document]) -> list[str]:
    """Nothing left waiting: no event parked once its subject stands at its predecessor (or in a terminal status),
    and each subject's parked count what still waits, counted."""
    found: list[str] = []
    parked = [d for d in world.documents("parked-event") if d.get("status") == "parked"]
    field_ = world.consumer.partition_field
    for document in parked:
        state = machine.read(stored[document[field_]]) if document[field_] in stored else None
        if state is not None and state.status is not None and (
                state.version >= document["sequence"] - 1 or state.status in machine.terminal):
            found.append(f"event {document['eventId']} v{document['sequence']} is still parked, and {machine.noun}"
                         f" {document[field_]} stands at {state.status} v{state.version} (nothing left waiting)")
    for key, document in stored.items():
        state = machine.read(document)
        counted = sum(1 for d in parked if d[field_] == key and d.get("counted", True))
        if state is not None and state.parked != counted:
            found.append(f"{machine.noun} {key} counts {state.parked} parked, and {counted} wait (nothing left"
                         " waiting)")
    return found


def _chains(world: World) -> dict[str | None, list[Queued]]:
    """The consumer's queue as chains: a message and the copies it was handed on to, in order."""
    chains: dict[str | None, list[Queued]] = {}
    for queued in world.broker.queues.get(world.queue, []):
        original, _ = retries.unwrap(_inbound(queued, world.scheduler))
        chains.setdefault(original.message_id, []).append(queued)
    return chains


def _identity(mode: Ordered, world: World, queued: Queued) -> tuple[str, str] | None:
    """The event identity (source, id) of a queued message; None for one that is no event."""
    original, _ = retries.unwrap(_inbound(queued, world.scheduler))
    message = InboundMessage(original.message_id, queued.message.body)
    if mode.check(message) is not None:
        return None
    event = mode.machine.parse(message)
    return event.source, event.id


def _ordered_queue(world: World, mode: Ordered, chains: Mapping[str | None, list[Queued]],
                   identities: Mapping[tuple[str, str], str], applied: set[tuple[str, str]]) -> list[str]:
    """Every message of an ordered queue settled, for its reason: an event the replay applied, completed (or
    refused at its subject's parked limit, a copy of it applied later); one that took its identity and was not
    applied, completed or refused by the machine (``InvalidTransition``, its subject's ``LimitExceeded``); other
    content under a taken identity, ``PayloadMismatch``; no event, ``InvalidMessage``. A chain handed on is
    decided by its last copy, and each before it was completed."""
    found: list[str] = []
    for chain in chains.values():
        *handed_on, last = chain
        label = f"message {last.message.message_id}"
        found += [f"message {q.message.message_id} was handed on, yet ended {q.state} {q.reason}" for q in handed_on
                  if q.state != "completed" and (q.reason != last.reason or last.state != "dead-lettered")]
        if last.state not in ("completed", "dead-lettered"):
            found.append(f"{label} is {last.state} (nothing lost)")
            continue
        original, _ = retries.unwrap(_inbound(last, world.scheduler))
        message = InboundMessage(original.message_id, last.message.body)
        if (key := _identity(mode, world, last)) is None:
            allowed: tuple[str | None, ...] = ("InvalidMessage",)
        elif identities.get(key) != mode.machine.parse(message).request_hash():
            allowed = ("PayloadMismatch",)
        elif key in applied:  # or refused at its subject's parked limit, while a copy of it waited its turn
            allowed = (None, "LimitExceeded")
        else:
            allowed = (None, "InvalidTransition", "LimitExceeded")
        reason = last.reason if last.state == "dead-lettered" else None
        if reason not in allowed:
            found.append(f"{label} ended {last.state}{f' {reason}' if reason else ''} ({last.description or ''});"
                         f" expected {' or '.join('completed' if a is None else a for a in allowed)}")
    return found


def _json(body: Any) -> bytes:
    import msgspec  # noqa: PLC0415 - as the outbox stores and sends a payload

    return msgspec.json.encode(msgspec.to_builtins(body))


__all__ = ["Broker", "Crash", "Faults", "Report", "Scheduler", "Sent", "Service", "Spec", "World", "run", "simulate"]
