"""Service Bus queues as the consumer meets them: PeekLock, lock expiry, delivery counts, sessions, duplicate detection.

- A send gets the entity's next sequence number; a MessageId seen within the detection window of its
  first accepted send is dropped. A message is available as soon as it is sent, or, sent with a
  scheduled enqueue time, once that time comes: it then joins the queue behind what is there (and its
  session behind that session's messages), as Service Bus enqueues a scheduled message when it is due.
- A receive locks a message for ``lock_seconds`` and counts a delivery. Complete removes it,
  dead-letter moves it aside with a reason, abandon makes it available at once. A lock that runs out
  makes it available again, while the old delivery may still be running: its settlement then fails
  (LockLost). A message returned after its MaxDeliveryCount-th delivery is dead-lettered
  ``MaxDeliveryCountExceeded``.
- On a session queue, one receiver holds a session (its lock renewed with each message it takes) and
  gets the session's messages strictly in sequence order, one at a time: an abandoned message comes
  back before anything behind it. A receiver whose session lock ran out loses the session to the next;
  so does one whose session is let go mid-processing (a chaos fault), while its delivery runs on; a
  session let go (closed) does not count the delivery of its unsettled message, a lock that ran out does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from idempotent_consumer import retries
from idempotent_consumer.delivery import Action
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ports.sender import MessageSender, OutgoingMessage
from shared.settings import Settings
from simulation.scheduler import Clock, Scheduler, Signal

MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"


class State(StrEnum):
    """Where a message is."""

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    LOCKED = "locked"
    COMPLETED = "completed"
    DEAD_LETTERED = "dead-lettered"


@dataclass(eq=False)
class BrokerMessage:
    """One message in a queue; ``tag`` names the workload message it was sent as."""

    queue: str
    sequence_number: int
    message_id: str | None
    body: bytes | None  # None: an AMQP value body, no data section (a JMS producer's, say)
    session_id: str | None
    correlation_id: str | None
    enqueued_at: float
    tag: int
    deliveries: int = 0
    state: State = State.AVAILABLE
    lock_token: int = 0
    locked_until: float = 0.0
    reason: str | None = None
    description: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    settled_at: float | None = None  # when it left the queue
    resubmission_of: BrokerMessage | None = None  # the dead letter an operator sent this again for

    @property
    def settled(self) -> bool:
        """Whether it has left the queue, completed or dead-lettered."""
        return self.state in (State.COMPLETED, State.DEAD_LETTERED)

    def __str__(self) -> str:
        return f"{self.queue}#{self.sequence_number} {self.message_id}"


@dataclass(frozen=True)
class Delivery:
    """One delivery of a message to a receiver, under a lock token."""

    queue: Queue
    message: BrokerMessage
    receiver: int
    token: int
    locked_until: float

    def inbound(self, clock: Clock) -> InboundMessage:
        """The delivery as the core sees it; the delivery count is the prior attempts, as Python reports it."""
        message = self.message
        return InboundMessage(
            message_id=message.message_id, body=message.body, correlation_id=message.correlation_id,
            session_id=message.session_id, delivery_count=message.deliveries - 1,
            enqueued_time_utc=clock.utc(message.enqueued_at), locked_until_utc=clock.utc(self.locked_until),
            sequence_number=message.sequence_number, application_properties=message.properties,
        )


class LockLost(Exception):
    """A settlement whose lock ran out or was taken over: Service Bus refuses it (MessageLockLost)."""


@dataclass
class _SessionLock:
    receiver: int
    locked_until: float


class Queue:
    """One queue, with or without sessions."""

    def __init__(
        self, name: str, scheduler: Scheduler, ready: Signal, settled: Signal, *, sessions: bool, lock_seconds: float,
        max_deliveries: int, detection_window: float,
    ) -> None:
        self.name = name
        self.sessions = sessions
        self.messages: list[BrokerMessage] = []  # every accepted message, in sequence order
        self.dropped = 0  # sends dropped by duplicate detection
        self._sched = scheduler
        self._ready = ready
        self._settled = settled
        self._lock_seconds = lock_seconds
        self._max_deliveries = max_deliveries
        self._window = detection_window
        self._active: list[BrokerMessage] = []  # not yet settled, in sequence order
        self._first_sent: dict[str, float] = {}
        self._session_locks: dict[str, _SessionLock] = {}
        self._held: dict[int, str] = {}  # receiver -> the session it last took
        self._tokens = 0
        self._scheduled = 0  # messages sent to come later, not yet due
        # What ``processed`` looks up, kept as messages are sent (scanning every message for each was an eighth of
        # a simulation's CPU): the copies delayed retries made under each chain, and each dead letter's resubmission.
        self._copies: dict[str, list[BrokerMessage]] = {}
        self._resubmissions: dict[int, BrokerMessage] = {}

    def resubmit(self, dead: BrokerMessage) -> BrokerMessage | None:
        """What ``sbctl dlq resubmit`` does with a dead letter: the message sent again, a copy under its original
        MessageId, without its chain's properties; the dead letter removed only once it is sent."""
        chain = retries.chain_of(dead.properties)
        again = self.send(message_id=chain.original_message_id if chain else dead.message_id, body=dead.body,
                          session_id=dead.session_id, correlation_id=dead.correlation_id, tag=dead.tag,
                          properties=retries.originals(dead.properties))
        if again is not None:
            again.resubmission_of = dead
            self._resubmissions.setdefault(id(dead), again)
        return again

    def send(
        self, *, message_id: str | None, body: bytes | None, session_id: str | None, correlation_id: str | None,
        tag: int, properties: Mapping[str, str] | None = None, due: float | None = None,
    ) -> BrokerMessage | None:
        """Enqueue a message, or schedule it for ``due``; None when duplicate detection drops it."""
        now = self._sched.clock.now
        if message_id is not None:
            first = self._first_sent.get(message_id)
            if first is not None and now - first < self._window:
                self.dropped += 1
                return None
            self._first_sent[message_id] = now
        message = BrokerMessage(self.name, len(self.messages) + 1, message_id, body, session_id, correlation_id,
                                now, tag, properties=dict(properties or {}))
        self.messages.append(message)
        if (chain := message.properties.get(retries.CHAIN)) is not None:
            self._copies.setdefault(chain, []).append(message)
        if due is not None and due > now:
            message.state = State.SCHEDULED
            self._scheduled += 1
            self._sched.call_at(due, lambda: self._enqueue(message))
        else:
            self._enqueue(message)
        return message

    def _enqueue(self, message: BrokerMessage) -> None:
        if message.state is State.SCHEDULED:
            self._scheduled -= 1
            message.state = State.AVAILABLE
            message.enqueued_at = self._sched.clock.now
        self._active.append(message)
        self._sched.notify(self._ready)

    def receive(self, receiver: int) -> Delivery | None:
        """Lock and return the next message for ``receiver``, or None when there is none for it now."""
        self._expire()
        if not self.sessions:
            head = next((m for m in self._active if m.state is State.AVAILABLE), None)
            return self._lock(head, receiver) if head else None
        held = self._held.get(receiver)
        if held is not None:
            lock = self._session_locks.get(held)
            if lock is not None and lock.receiver == receiver:
                head = self._head(held)
                if head is not None and head.state is State.AVAILABLE:
                    return self._lock(head, receiver)
                del self._session_locks[held]  # nothing more in it for now: close the session
                self._sched.notify(self._ready)
            del self._held[receiver]
        free = [m for m in self._heads() if m.state is State.AVAILABLE and m.session_id not in self._session_locks]
        if not free:
            return None
        head = free[self._sched.rng.randrange(len(free))]
        self._held[receiver] = head.session_id or ""
        return self._lock(head, receiver)

    def holds_session(self, receiver: int) -> bool:
        """Whether ``receiver`` took a session and may still hold it."""
        return receiver in self._held

    def settle(self, delivery: Delivery, action: Action, reason: str | None, description: str | None) -> None:
        """Complete, abandon or dead-letter a delivery; LockLost if its lock is no longer held."""
        self._expire()
        message = delivery.message
        if message.state is not State.LOCKED or message.lock_token != delivery.token:
            raise LockLost(f"{message}: lock of delivery {delivery.token} was lost")
        if action is Action.COMPLETE:
            self._leave(message, State.COMPLETED)
        elif action is Action.ABANDON:
            self._return(message)
        else:
            self._leave(message, State.DEAD_LETTERED, reason, description)
        self._sched.notify(self._ready)

    def holds_lock(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` is a session delivery whose message is still locked to it."""
        message = delivery.message
        return self.sessions and message.state is State.LOCKED and message.lock_token == delivery.token

    def release_session(self, delivery: Delivery) -> bool:
        """Let the delivery's session go while the delivery runs on: the session's lock and the message's
        end now, so another receiver takes the session and the message; False when it holds neither."""
        message, lock = delivery.message, self._session_locks.get(delivery.message.session_id or "")
        if not self.holds_lock(delivery):
            return False
        if lock is not None and lock.receiver == delivery.receiver:
            del self._session_locks[message.session_id or ""]
        # A session closed under an unsettled message does not count its delivery (Service Bus, "Impact of
        # delivery count"; the local broker does the same): the message comes back as it was, uncounted.
        message.deliveries -= 1
        message.state = State.AVAILABLE
        self._sched.notify(self._ready)
        return True

    def detects_until(self, message_id: str | None) -> float:
        """Until when a send under ``message_id`` would be dropped (its last accepted send and the window)."""
        first = self._first_sent.get(message_id) if message_id is not None else None
        return first + self._window if first is not None else 0.0

    def processed(self, message: BrokerMessage) -> bool:
        """Whether ``message`` has left the queue for good: settled, and so is every copy delayed retries made of
        it (a message handed on has left the queue, not yet been processed); a copy dead-lettered
        RetryLimitExceeded is processed once the operator's resubmission of it is."""
        copies = [message, *(m for m in self._copies.get(str(message.sequence_number), ())
                             if m.sequence_number > message.sequence_number)]
        if not all(m.settled for m in copies):
            return False
        for dead in (m for m in copies if m.reason == retries.RETRY_LIMIT_EXCEEDED):
            again = self._resubmissions.get(id(dead))
            if again is None or not self.processed(again):
                return False
        return True

    def unsettled(self) -> int:
        """How many messages are still in the queue, scheduled, available or locked."""
        return len(self._active) + self._scheduled

    def _lock(self, message: BrokerMessage, receiver: int) -> Delivery:
        now = self._sched.clock.now
        message.deliveries += 1
        message.state = State.LOCKED
        self._tokens += 1
        message.lock_token = self._tokens
        message.locked_until = now + self._lock_seconds
        if self.sessions:  # taking a session's message takes (or renews) the session lock
            self._session_locks[message.session_id or ""] = _SessionLock(receiver, message.locked_until)
        self._sched.call_at(message.locked_until, self._on_lock_timer)
        return Delivery(self, message, receiver, message.lock_token, message.locked_until)

    def _heads(self) -> list[BrokerMessage]:
        """The first unsettled message of each session, in sequence order."""
        seen: dict[str | None, BrokerMessage] = {}
        for message in self._active:
            seen.setdefault(message.session_id, message)
        return list(seen.values())

    def _head(self, session: str) -> BrokerMessage | None:
        return next((m for m in self._active if m.session_id == session), None)

    def _on_lock_timer(self) -> None:
        if self._expire():
            self._sched.notify(self._ready)

    def _expire(self) -> bool:
        """Release every lock that has run out; whether anything became available."""
        now = self._sched.clock.now
        expired = [s for s, lock in self._session_locks.items() if lock.locked_until <= now]
        for session in expired:
            del self._session_locks[session]
        returned = [m for m in self._active if m.state is State.LOCKED and m.locked_until <= now]
        for message in returned:
            self._return(message)
        return bool(expired or returned)

    def _return(self, message: BrokerMessage) -> None:
        """Back in the queue after an abandon or a lost lock, unless that was its last allowed delivery."""
        if message.deliveries >= self._max_deliveries:
            self._leave(message, State.DEAD_LETTERED, MAX_DELIVERY_COUNT_EXCEEDED,
                        f"delivered {message.deliveries} times")
            return
        message.state = State.AVAILABLE

    def _leave(self, message: BrokerMessage, state: State, reason: str | None = None,
               description: str | None = None) -> None:
        message.state = state
        message.reason = reason
        message.description = description
        message.settled_at = self._sched.clock.now
        self._active.remove(message)
        self._sched.notify(self._settled)


class Broker:
    """The namespace: the orders queue and the order-events queue (session-enabled unless ORDER_EVENTS_SESSIONS
    is false), configured from the settings."""

    def __init__(self, scheduler: Scheduler, settings: Settings, *, detection_window: float) -> None:
        self.ready = Signal()  # a message or a session may have become available
        self.settled = Signal()  # a message left its queue
        self._sched = scheduler
        self._receivers = 0

        def queue(name: str, sessions: bool) -> Queue:
            return Queue(name, scheduler, self.ready, self.settled, sessions=sessions,
                         lock_seconds=settings.servicebus_lock_duration_seconds,
                         max_deliveries=settings.servicebus_max_delivery_count, detection_window=detection_window)

        self.orders = queue(settings.orders_queue, sessions=False)
        self.events = queue(settings.order_events_queue, sessions=settings.order_events_sessions)
        self.queues = {q.name: q for q in (self.orders, self.events)}

    @property
    def now(self) -> float:
        """The simulated time."""
        return self._sched.clock.now

    def new_receiver(self) -> int:
        """An id for a receiver; a restarted process gets a new one, and holds no session."""
        self._receivers += 1
        return self._receivers

    def receive(self, receiver: int) -> Delivery | None:
        """The next delivery for ``receiver``: from the session it holds first, else from either queue."""
        if self.events.holds_session(receiver) or self._sched.rng.random() < 0.5:
            order = (self.events, self.orders)
        else:
            order = (self.orders, self.events)
        for queue in order:
            delivery = queue.receive(receiver)
            if delivery is not None:
                return delivery
        return None

    def unsettled(self) -> int:
        """How many messages are still in the queues."""
        return sum(q.unsettled() for q in self.queues.values())


class Namespace:
    """The app's sender as the namespace takes it: a send to one of the broker's queues (a delayed retry's
    copy) lands there, scheduled as it says, under the workload tag of the message it copies; a send anywhere
    else goes on to ``outside`` (the OrderAccepted and OrderRejected destinations)."""

    def __init__(self, broker: Broker, outside: MessageSender, ceiling_seconds: float = float("inf")) -> None:
        self._broker = broker
        self._outside = outside
        self._ceiling = ceiling_seconds
        self.at_ceiling = 0  # copies scheduled the back-off's ceiling after their hand-on

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Send, as the namespace does; see MessageSender."""
        queue = self._broker.queues.get(destination)
        if queue is None:
            await self._outside.send(destination, messages)
            return
        for message in messages:
            chain = message.application_properties.get(retries.CHAIN, "")
            root = queue.messages[int(chain) - 1] if chain.isdigit() and 0 < int(chain) <= len(queue.messages) \
                else None
            due = message.scheduled_enqueue_time
            if due is not None and due.timestamp() - self._broker.now >= self._ceiling - 1e-6:
                self.at_ceiling += 1
            queue.send(message_id=message.message_id, body=message.body, session_id=message.session_id,
                       correlation_id=message.correlation_id, tag=root.tag if root else -1,
                       properties=message.application_properties, due=due.timestamp() if due else None)
