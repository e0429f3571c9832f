"""In-memory Service Bus entities: queues, topics, subscriptions, dead-letter queues, the namespace.

An entity that messages are received from composes a lock table (``locks.py``), a session registry
(``sessions.py``) and a browser for peek (``browse.py``); their timers are ``timers.Deadlines``.
Pure Python and free of any AMQP library, so it can be unit-tested directly. Every operation takes
``now`` (seconds since the epoch) from its caller; timers are therefore just checks run at access
time and by the protocol layer's periodic tick.

Conventions follow Service Bus as the ``azure-servicebus`` SDK observes it:

* Sequence numbers are per queue or topic, start at 1 and are never reused; a topic's subscriptions
  share the topic's number for a message, and a dead-lettered message keeps its number.
* ``delivery_count`` counts deliveries (lock acquisitions), as Service Bus's DeliveryCount does. The
  AMQP header carries ``delivery_count - 1`` on a delivery (prior attempts: 0 the first time), which
  is what Service Bus puts there and what the Python SDK reports as ``delivery_count``.
* A message is dead-lettered with ``MaxDeliveryCountExceeded`` when a delivery fails (abandon or
  lock expiry) and ``delivery_count`` has reached MaxDeliveryCount, i.e. when another delivery would
  exceed it.
* Locks of a non-session message outlive the link and the connection that received it: Service Bus
  keeps them until they expire, so a crashed consumer's messages come back only after LockDuration.
  Session messages are locked by their session's lock, which ends with the receiver's link: a session
  closed with unsettled messages gives them back uncounted, one whose lock expires counts a delivery.
* Duplicate detection remembers a MessageId for a fixed window from its first send; a repeat within
  the window is accepted by the broker and dropped.
"""

from __future__ import annotations

import enum
import itertools
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from devservers.servicebus.browse import MessageBrowser
from devservers.servicebus.config import (
    CorrelationFilter,
    NamespaceConfig,
    QueueConfig,
    ReceiverSettings,
    SubscriptionConfig,
    TopicConfig,
)
from devservers.servicebus.errors import (
    MESSAGE_LOCK_LOST,
    MESSAGE_NOT_FOUND,
    NOT_ALLOWED,
    NOT_FOUND,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    BrokerError,
    message_size_exceeded,
)
from devservers.servicebus.locks import LockTable
from devservers.servicebus.messages import Envelope, MessageState, ReadyQueue, StoredMessage
from devservers.servicebus.sessions import Session, SessionRegistry
from devservers.servicebus.timers import Alarm, Deadlines

__all__ = [
    "DEAD_LETTER_QUEUE",
    "MESSAGE_LOCK_LOST",
    "SESSION_CANNOT_BE_LOCKED",
    "SESSION_LOCK_LOST",
    "BrokerError",
    "Envelope",
    "MessageState",
    "Namespace",
    "Outcome",
    "Queue",
    "ReceivableEntity",
    "Session",
    "SessionLockExpired",
    "StoredMessage",
    "Subscription",
    "Topic",
]

DEAD_LETTER_QUEUE = "$DeadLetterQueue"
TRANSFER_DEAD_LETTER_QUEUE = "$Transfer/$DeadLetterQueue"
MAX_FORWARD_HOPS = 4  # Service Bus dead-letters a message that would take a fifth auto-forwarding hop
#: Service Bus refuses a batch over 1 MB even where an entity takes larger messages (Premium, large messages).
MAX_BATCH_SIZE = 1024 * 1024


class Outcome(enum.Enum):
    COMPLETE = "complete"
    ABANDON = "abandon"
    DEFER = "defer"
    DEAD_LETTER = "dead-letter"
    #: AMQP ``released``: the client gives the message back unprocessed (the SDK does this for
    #: messages that arrive when no receive call is waiting). Unlike abandon it is not a failed
    #: delivery, so the delivery count is restored.
    RELEASE = "release"


@dataclass(frozen=True)
class SessionLockExpired:
    """Reported by :meth:`Namespace.tick`: the owner's link must be detached with session-lock-lost."""

    entity: ReceivableEntity
    session_id: str
    owner: object


class _DuplicateDetector:
    """MessageIds seen within a fixed window from their first send (Service Bus does not slide it)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._first_seen: OrderedDict[str, float] = OrderedDict()

    def is_duplicate(self, message_id: str | None, now: float) -> bool:
        while self._first_seen:
            oldest_id, seen = next(iter(self._first_seen.items()))
            if now - seen < self.window:
                break
            del self._first_seen[oldest_id]
        if message_id is None:
            return False
        if message_id in self._first_seen:
            return True
        self._first_seen[message_id] = now
        return False


def _effective_ttl(message_ttl: float | None, *defaults: float) -> float:
    """A message's TTL is capped by every entity default on its way (Service Bus adjusts it silently)."""
    candidates = [*defaults] + ([message_ttl] if message_ttl is not None and message_ttl > 0 else [])
    return min(candidates)


def correlation_matches(rule: CorrelationFilter, envelope: Envelope) -> bool:
    """True when every field the filter sets equals the message's (Service Bus's correlation filter)."""
    pairs = (
        (rule.correlation_id, envelope.correlation_id),
        (rule.message_id, envelope.message_id),
        (rule.to, envelope.to),
        (rule.reply_to, envelope.reply_to),
        (rule.label, envelope.subject),
        (rule.session_id, envelope.session_id),
        (rule.reply_to_session_id, envelope.reply_to_session_id),
        (rule.content_type, envelope.content_type),
    )
    if any(wanted is not None and wanted != actual for wanted, actual in pairs):
        return False
    for key, wanted in rule.properties.items():
        if key not in envelope.application_properties:
            return False
        actual = envelope.application_properties[key]
        if isinstance(wanted, bool) != isinstance(actual, bool) or wanted != actual:
            return False
    return True


class ReceivableEntity:
    """A queue, a subscription, or the dead-letter queue of either: something messages are received from.

    It owns the messages' lifecycle (arrival, delivery, settlement, redelivery, dead-lettering,
    expiry) and composes the rest: ``locks`` (message locks), ``sessions`` (session locks and state)
    and ``browser`` (peek and look-up by sequence number).
    """

    def __init__(
        self,
        namespace: Namespace,
        path: str,
        settings: ReceiverSettings,
        *,
        dead_letter_parent: ReceivableEntity | None = None,
    ) -> None:
        self.namespace = namespace
        self.path = path
        self.settings = settings
        self.dead_letter_parent = dead_letter_parent
        self.messages: dict[int, StoredMessage] = {}
        self.locks = LockTable(namespace.alarm)
        self.sessions = SessionRegistry(self, namespace.alarm)
        self.browser = MessageBrowser(self)
        self._ready = ReadyQueue(self.messages)
        self._expiries: Deadlines[int] = Deadlines(namespace.alarm)
        self._session_losses: list[SessionLockExpired] = []
        self.dead_letter_queue: ReceivableEntity | None = None
        self.transfer_dead_letter_queue: ReceivableEntity | None = None
        if dead_letter_parent is None:
            # A dead-letter queue never expires, dead-letters, forwards or requires sessions.
            dlq_settings = ReceiverSettings(
                lock_duration=settings.lock_duration,
                max_delivery_count=settings.max_delivery_count,
                default_message_ttl=settings.default_message_ttl,
            )
            self.dead_letter_queue = ReceivableEntity(
                namespace, f"{path}/{DEAD_LETTER_QUEUE}", dlq_settings, dead_letter_parent=self
            )
            # Transfers (auto-forwarding) never fail here, so this one exists but stays empty.
            self.transfer_dead_letter_queue = ReceivableEntity(
                namespace, f"{path}/{TRANSFER_DEAD_LETTER_QUEUE}", dlq_settings, dead_letter_parent=self
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path}>"

    @property
    def is_dead_letter_queue(self) -> bool:
        return self.dead_letter_parent is not None

    @property
    def requires_session(self) -> bool:
        return self.settings.requires_session and not self.is_dead_letter_queue

    # -- arrival ------------------------------------------------------------------------------

    def accept(self, message: StoredMessage, now: float) -> None:
        """A message arrives (sent, activated, or dead-lettered here): forward it if configured, else store it."""
        if self.settings.forward_to and not self.is_dead_letter_queue:
            self.namespace.forward(message, self.settings.forward_to, self, now)
        else:
            self.store(message)

    def store(self, message: StoredMessage) -> None:
        """Keep ``message`` here, counted in its session and timed for expiry; available unless deferred."""
        self.messages[message.sequence_number] = message
        self.sessions.track(message)
        if message.expires_at is not None:
            self._expiries.add(message.expires_at, message.sequence_number)
        if message.state is not MessageState.DEFERRED:
            self._make_available(message)

    def _make_available(self, message: StoredMessage) -> None:
        self.namespace.made_available = True
        session = self.sessions.of(message)
        (session.ready if session is not None else self._ready).push(message)

    # -- delivery -----------------------------------------------------------------------------

    def next_message(
        self, owner: object, now: float, *, peek_lock: bool, session: Session | None = None
    ) -> StoredMessage | None:
        """Take the next available message (lowest sequence number) for a receiver, or None.

        PeekLock locks it for ``owner``; ReceiveAndDelete removes it. Either way it counts as a delivery.
        """
        self.process_timers(now)
        if session is not None and session.owner is not owner:
            return None  # the session lock just ended; the receiver is about to be detached
        message = (session.ready if session is not None else self._ready).pop()
        if message is not None:
            self._hand_out(message, owner, now, peek_lock=peek_lock, session=session)
        return message

    def receive_deferred(
        self,
        sequence_numbers: Iterable[int],
        owner: object,
        now: float,
        *,
        peek_lock: bool,
        session_id: str | None = None,
    ) -> list[StoredMessage]:
        """Lock (or remove) deferred messages by sequence number; all must exist or none is taken."""
        found = self.browser.deferred(sequence_numbers, now, session_id=session_id)
        session = self.sessions.held(session_id, owner)
        for message in found:
            self._hand_out(message, owner, now, peek_lock=peek_lock, session=session)
        return found

    def _hand_out(
        self, message: StoredMessage, owner: object, now: float, *, peek_lock: bool, session: Session | None
    ) -> None:
        """Count a delivery; PeekLock locks the message (for as long as ``session``'s lock, if given)."""
        message.delivery_count += 1
        if not peek_lock:
            self._remove(message)
        elif session is not None:
            self.locks.lock(message, owner, session.locked_until, expires=False)
        else:
            self.locks.lock(message, owner, now + self.settings.lock_duration, expires=True)

    def _remove(self, message: StoredMessage) -> None:
        self.locks.unlock(message)
        if self.messages.pop(message.sequence_number, None) is not None:
            self.sessions.untrack(message)

    # -- settlement ---------------------------------------------------------------------------

    def settle(
        self,
        token: uuid.UUID,
        outcome: Outcome,
        now: float,
        *,
        dead_letter_reason: str | None = None,
        dead_letter_description: str | None = None,
    ) -> StoredMessage:
        """Apply a receiver's outcome to the message locked under ``token``; raises lock-lost if it is not."""
        self.process_timers(now)
        message = self.locks.held(token)
        self.locks.unlock(message)
        if outcome is Outcome.COMPLETE:
            self._remove(message)
        elif outcome is Outcome.ABANDON:
            self.fail_delivery(message, now)
        elif outcome is Outcome.RELEASE:
            self.undo_delivery(message, now)
        elif outcome is Outcome.DEFER:
            message.state = MessageState.DEFERRED
            self._return(message, now)
        else:
            self._dead_letter(message, dead_letter_reason, dead_letter_description, now)
        return message

    def renew_lock(self, token: uuid.UUID, now: float) -> float:
        """Extend the lock of a non-session message by LockDuration; returns the new expiry."""
        self.process_timers(now)
        message = self.locks.held(token)
        if self.sessions.key(message) is not None:
            raise BrokerError(
                NOT_ALLOWED, "Renewing a message lock is not supported for session messages; renew the session lock."
            )
        return self.locks.extend(token, now + self.settings.lock_duration)

    def fail_delivery(self, message: StoredMessage, now: float) -> None:
        """A delivery failed (abandon, lock expiry, session lost): redeliver, or dead-letter at the limit."""
        limit = self.settings.max_delivery_count
        if not self.is_dead_letter_queue and message.delivery_count >= limit:
            self._dead_letter(
                message,
                "MaxDeliveryCountExceeded",
                f"Message could not be consumed after {limit} delivery attempts.",
                now,
            )
        else:
            self._return(message, now)

    def undo_delivery(self, message: StoredMessage, now: float) -> None:
        """A delivery that does not count (a released message, a session closed under it): back, uncounted."""
        message.delivery_count = max(0, message.delivery_count - 1)
        self._return(message, now)

    def _return(self, message: StoredMessage, now: float) -> None:
        """An unlocked message goes back: expired, still deferred, or available again."""
        if message.expires_at is not None and message.expires_at <= now:
            self._expire(message, now)
        elif message.state is not MessageState.DEFERRED:
            self._make_available(message)
        # A deferred message stays deferred: only receive-by-sequence-number reaches it.

    def _dead_letter(self, message: StoredMessage, reason: str | None, description: str | None, now: float) -> None:
        if self.is_dead_letter_queue:
            # There is no dead-letter queue of a dead-letter queue: the message stays where it is.
            self._return(message, now)
            return
        self._remove(message)
        message.dead_letter_reason = reason
        message.dead_letter_description = description
        message.dead_letter_source = self.path
        copy = message.copy_for()
        copy.expires_at = None  # messages in a dead-letter queue do not expire
        target = self.settings.forward_dead_lettered_to
        if target:
            self.namespace.forward(copy, target, self, now)
        else:
            assert self.dead_letter_queue is not None
            self.dead_letter_queue.store(copy)

    def _expire(self, message: StoredMessage, now: float) -> None:
        if self.settings.dead_lettering_on_message_expiration and not self.is_dead_letter_queue:
            self._dead_letter(message, "TTLExpiredException", "The message expired and was dead lettered.", now)
        else:
            self._remove(message)

    # -- timers -------------------------------------------------------------------------------

    def process_timers(self, now: float) -> None:
        """Expire message locks, session locks and TTLs that are due.

        Runs on every access as well as on the periodic tick, so a session lock that ends here is
        queued for :meth:`take_session_losses` rather than returned to whichever caller noticed it.
        """
        for message in self.locks.expire(now):
            self.fail_delivery(message, now)
        for session_id, owner in self.sessions.expire(now):
            self._session_losses.append(SessionLockExpired(self, session_id, owner))
        for _, sequence_number in self._expiries.pop_due(now):
            due = self.messages.get(sequence_number)
            if due is None or due.locked or due.expires_at is None or due.expires_at > now:
                continue  # a locked message expires when its lock ends (see _return)
            self._expire(due, now)

    def take_session_losses(self) -> list[SessionLockExpired]:
        """Session locks that expired since the last call (their receivers must be detached)."""
        losses, self._session_losses = self._session_losses, []
        return losses


class _IntakeOwner(Protocol):
    path: str

    def validate_incoming(self, envelope: Envelope) -> None: ...

    def message_ttl(self, envelope: Envelope) -> float: ...

    def deliver(self, message: StoredMessage, now: float) -> None: ...


class Intake:
    """What queues and topics share as send targets: size limit, sequence numbers, duplicate detection, scheduling."""

    def __init__(
        self, owner: _IntakeOwner, requires_duplicate_detection: bool, window: float, max_message_size: int,
        alarm: Alarm | None = None,
    ) -> None:
        self._owner = owner
        self.max_message_size = max_message_size
        self._next_sequence_number = itertools.count(1)
        self._duplicates = _DuplicateDetector(window) if requires_duplicate_detection else None
        self.scheduled: dict[int, StoredMessage] = {}
        self._due: Deadlines[int] = Deadlines(alarm)

    def check_size(self, size: int, *, batch: bool = False) -> None:
        """Refuse (message-size-exceeded) an encoded message or batch transfer of ``size`` bytes over the limit."""
        limit = min(self.max_message_size, MAX_BATCH_SIZE) if batch else self.max_message_size
        if size > limit:
            raise message_size_exceeded(size, limit, self._owner.path)

    def new_message(self, envelope: Envelope, now: float) -> StoredMessage:
        ttl = self._owner.message_ttl(envelope)
        return StoredMessage(
            envelope=envelope,
            sequence_number=next(self._next_sequence_number),
            enqueued_time=now,
            ttl=ttl,
            expires_at=now + ttl,
        )

    def send(self, envelopes: list[Envelope], now: float) -> list[int]:
        """Enqueue (or schedule) messages; a batch is validated as a whole before any is stored.

        Returns the sequence numbers assigned; a duplicate within the detection window is accepted
        but dropped and gets 0.
        """
        self.activate_due(now)
        for envelope in envelopes:
            self._owner.validate_incoming(envelope)
        numbers = []
        for envelope in envelopes:
            if self._duplicates is not None and self._duplicates.is_duplicate(envelope.message_id, now):
                numbers.append(0)
                continue
            message = self.new_message(envelope, now)
            numbers.append(message.sequence_number)
            at = envelope.scheduled_enqueue_time
            if at is not None and at > now:
                message.state = MessageState.SCHEDULED
                message.enqueued_time = at
                message.expires_at = at + message.ttl if message.ttl is not None else None
                self.scheduled[message.sequence_number] = message
                self._due.add(at, message.sequence_number)
            else:
                self._owner.deliver(message, now)
        return numbers

    def cancel(self, sequence_numbers: Iterable[int], now: float) -> None:
        self.activate_due(now)
        numbers = list(sequence_numbers)
        for number in numbers:
            if number not in self.scheduled:
                raise BrokerError(
                    MESSAGE_NOT_FOUND,
                    f"The scheduled message with sequence number {number} was not found; it may have been "
                    "enqueued or cancelled already.",
                    404,
                )
        for number in numbers:
            del self.scheduled[number]

    def activate_due(self, now: float) -> None:
        for at, number in self._due.pop_due(now):
            message = self.scheduled.pop(number, None)
            if message is not None:
                message.state = MessageState.ACTIVE
                message.enqueued_time = at
                self._owner.deliver(message, now)


class Queue(ReceivableEntity):
    def __init__(self, namespace: Namespace, config: QueueConfig) -> None:
        super().__init__(namespace, config.name, config.settings)
        self.name = config.name
        self.intake = Intake(
            self, config.requires_duplicate_detection, config.duplicate_detection_window, config.max_message_size,
            namespace.alarm,
        )
        # Peek shows scheduled messages too, as Service Bus's does.
        self.browser = MessageBrowser(self, self.intake.scheduled)

    def validate_incoming(self, envelope: Envelope) -> None:
        if self.requires_session and not envelope.session_id:
            raise _session_id_missing(self.path)

    def message_ttl(self, envelope: Envelope) -> float:
        return _effective_ttl(envelope.ttl, self.settings.default_message_ttl)

    def deliver(self, message: StoredMessage, now: float) -> None:
        self.accept(message, now)

    def process_timers(self, now: float) -> None:
        self.intake.activate_due(now)
        super().process_timers(now)


def _session_id_missing(path: str) -> BrokerError:
    return BrokerError(
        NOT_ALLOWED,
        f"The SessionId was not set on a message, and it cannot be sent to the entity '{path}'. Entities that have "
        "session support enabled can only receive messages that have the SessionId set to a valid value.",
    )


class Subscription(ReceivableEntity):
    def __init__(self, namespace: Namespace, topic: Topic, config: SubscriptionConfig) -> None:
        super().__init__(namespace, f"{topic.name}/Subscriptions/{config.name}", config.settings)
        self.topic = topic
        self.name = config.name
        self.rules = config.rules

    def matches(self, envelope: Envelope) -> bool:
        if self.rules is None:
            return True
        return any(correlation_matches(rule.filter, envelope) for rule in self.rules)


class Topic:
    def __init__(self, namespace: Namespace, config: TopicConfig) -> None:
        self.namespace = namespace
        self.name = self.path = config.name
        self.default_message_ttl = config.default_message_ttl
        self.intake = Intake(
            self, config.requires_duplicate_detection, config.duplicate_detection_window, config.max_message_size,
            namespace.alarm,
        )
        self.subscriptions = {s.name.lower(): Subscription(namespace, self, s) for s in config.subscriptions}

    def __repr__(self) -> str:
        return f"<Topic {self.path}>"

    def validate_incoming(self, envelope: Envelope) -> None:
        if not envelope.session_id:
            for subscription in self.subscriptions.values():
                if subscription.requires_session and subscription.matches(envelope):
                    raise _session_id_missing(subscription.path)

    def message_ttl(self, envelope: Envelope) -> float:
        return _effective_ttl(envelope.ttl, self.default_message_ttl)

    def deliver(self, message: StoredMessage, now: float) -> None:
        """Each matching subscription gets its own copy, under the topic's sequence number."""
        for subscription in self.subscriptions.values():
            if subscription.matches(message.envelope):
                copy = message.copy_for()
                copy.ttl = _effective_ttl(message.ttl, subscription.settings.default_message_ttl)
                copy.expires_at = copy.enqueued_time + copy.ttl
                subscription.accept(copy, now)

    def process_timers(self, now: float) -> None:
        self.intake.activate_due(now)


SendTarget = Queue | Topic


class Namespace:
    """All entities of the configured namespace, addressed by path as the SDK addresses them."""

    def __init__(self, config: NamespaceConfig) -> None:
        self.name = config.name
        # Set whenever a message becomes available to a receiver, however that came about (a send, a settlement, a
        # lock or a schedule falling due, on a tick or on any access); the broker's tick reads and clears it
        # (take_made_available), so that it delivers only when there may be something new to deliver.
        self.made_available = False
        self.alarm = Alarm()  # every entity's deadlines, for the broker's tick
        self.queues = {q.name.lower(): Queue(self, q) for q in config.queues}
        self.topics = {t.name.lower(): Topic(self, t) for t in config.topics}

    def send_target(self, path: str) -> SendTarget:
        """The queue or topic at ``path`` (e.g. ``orders``); raises not-found."""
        key = path.strip("/").lower()
        target: SendTarget | None = self.queues.get(key) or self.topics.get(key)
        if target is None:
            raise _not_found(path)
        return target

    def receive_source(self, path: str) -> ReceivableEntity:
        """The queue, subscription (``topic/Subscriptions/sub``) or dead-letter queue at ``path``."""
        node = self.node(path)
        if isinstance(node, Topic):
            raise BrokerError(NOT_ALLOWED, f"Cannot receive from topic '{node.path}'; receive from a subscription.")
        if node.settings.forward_to and not node.is_dead_letter_queue:
            raise BrokerError(
                NOT_ALLOWED,
                f"Cannot create a message receiver on an entity with auto-forwarding enabled: '{node.path}'.",
            )
        return node

    def node(self, path: str) -> ReceivableEntity | Topic:
        """Any addressable entity: queue, topic, subscription, or a dead-letter queue of one."""
        lowered = [p.lower() for p in path.strip("/").split("/") if p]
        sub_queue = None
        if lowered[-2:] == ["$transfer", "$deadletterqueue"]:
            sub_queue, lowered = TRANSFER_DEAD_LETTER_QUEUE, lowered[:-2]
        elif lowered[-1:] == ["$deadletterqueue"]:
            sub_queue, lowered = DEAD_LETTER_QUEUE, lowered[:-1]
        entity: ReceivableEntity | Topic | None = None
        if len(lowered) == 1:
            entity = self.queues.get(lowered[0]) or self.topics.get(lowered[0])
        elif len(lowered) == 3 and lowered[1] == "subscriptions" and lowered[0] in self.topics:
            entity = self.topics[lowered[0]].subscriptions.get(lowered[2])
        if entity is None:
            raise _not_found(path)
        if sub_queue is None:
            return entity
        if isinstance(entity, Topic) or entity.dead_letter_queue is None or entity.transfer_dead_letter_queue is None:
            raise _not_found(path)
        if sub_queue == DEAD_LETTER_QUEUE:
            return entity.dead_letter_queue
        return entity.transfer_dead_letter_queue

    def receivable_entities(self) -> list[ReceivableEntity]:
        entities: list[ReceivableEntity] = list(self.queues.values())
        for topic in self.topics.values():
            entities.extend(topic.subscriptions.values())
        return [e for entity in entities for e in (entity, entity.dead_letter_queue) if e is not None]

    def take_made_available(self) -> bool:
        """Whether a message became available since the last call."""
        made, self.made_available = self.made_available, False
        return made

    def tick(self, now: float) -> list[SessionLockExpired]:
        """Run every due timer (scheduled messages, locks, TTLs); returns the session locks that ended."""
        for topic in self.topics.values():
            topic.process_timers(now)
        lost = []
        for entity in self.receivable_entities():
            entity.process_timers(now)
            lost.extend(entity.take_session_losses())
        return lost

    def forward(self, message: StoredMessage, target_name: str, source: ReceivableEntity, now: float) -> None:
        """Auto-forward (ForwardTo / ForwardDeadLetteredMessagesTo) into another queue or topic.

        The target assigns its own sequence number and enqueued time, as Service Bus does. A message
        that would take more than MAX_FORWARD_HOPS hops is dead-lettered where it is.
        """
        target = self.send_target(target_name)
        hops = message.forward_hops + 1
        if hops > MAX_FORWARD_HOPS:
            message.dead_letter_reason = "MaxTransferHopCountExceeded"
            message.dead_letter_description = f"The message exceeded the maximum of {MAX_FORWARD_HOPS} forwarding hops."
            message.dead_letter_source = source.path
            dead_letter_queue = source.dead_letter_queue or source
            copy = message.copy_for()
            copy.expires_at = None
            dead_letter_queue.store(copy)
            return
        forwarded = target.intake.new_message(message.envelope, now)
        forwarded.forward_hops = hops
        forwarded.dead_letter_reason = message.dead_letter_reason
        forwarded.dead_letter_description = message.dead_letter_description
        forwarded.dead_letter_source = message.dead_letter_source
        target.deliver(forwarded, now)


def _not_found(path: str) -> BrokerError:
    return BrokerError(
        NOT_FOUND,
        f"The messaging entity '{path}' could not be found. To know more visit https://aka.ms/sbResourceMgrExceptions.",
        404,
    )
