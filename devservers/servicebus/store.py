"""In-memory Service Bus entities: messages, locks, sequence numbers, sessions, dead-lettering.

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
  Session messages are locked by their session's lock, which ends with the receiver's link.
* Duplicate detection remembers a MessageId for a fixed window from its first send; a repeat within
  the window is accepted by the broker and dropped.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from devservers.servicebus.config import (
    CorrelationFilter,
    NamespaceConfig,
    QueueConfig,
    ReceiverSettings,
    SubscriptionConfig,
    TopicConfig,
)

__all__ = [
    "DEAD_LETTER_QUEUE",
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

# Service Bus error conditions the SDK maps to its exceptions (azure/servicebus/_transport/_pyamqp_transport.py).
NOT_FOUND = "amqp:not-found"
NOT_ALLOWED = "amqp:not-allowed"
NOT_IMPLEMENTED = "amqp:not-implemented"
MESSAGE_LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
ARGUMENT_ERROR = "com.microsoft:argument-error"
TIMEOUT = "com.microsoft:timeout"


class BrokerError(Exception):
    """A request Service Bus would refuse, with the AMQP condition and the management status code."""

    def __init__(self, condition: str, description: str, status_code: int = 400) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
        self.status_code = status_code


def _lock_lost() -> BrokerError:
    return BrokerError(
        MESSAGE_LOCK_LOST,
        "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the "
        "queue, or was received by a different receiver instance.",
        410,
    )


def _session_lock_lost(session_id: str) -> BrokerError:
    return BrokerError(
        SESSION_LOCK_LOST,
        f"The session lock has expired on the MessageSession '{session_id}'. Accept a new MessageSession.",
        410,
    )


class Outcome(enum.Enum):
    COMPLETE = "complete"
    ABANDON = "abandon"
    DEFER = "defer"
    DEAD_LETTER = "dead-letter"
    #: AMQP ``released``: the client gives the message back unprocessed (the SDK does this for
    #: messages that arrive when no receive call is waiting). Unlike abandon it is not a failed
    #: delivery, so the delivery count is restored.
    RELEASE = "release"


class MessageState(enum.IntEnum):
    """Values of the ``x-opt-message-state`` annotation (the SDK's ServiceBusMessageState)."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


@dataclass(frozen=True, eq=False)
class Envelope:
    """A message as sent, reduced to what the broker routes on; ``payload`` is the wire layer's own."""

    payload: Any
    message_id: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    subject: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    application_properties: Mapping[str, Any] = field(default_factory=dict)
    #: The message's own time to live in seconds (AMQP header ``ttl``), if it has one.
    ttl: float | None = None
    #: ``x-opt-scheduled-enqueue-time`` in seconds since the epoch, if set.
    scheduled_enqueue_time: float | None = None


@dataclass(eq=False)
class StoredMessage:
    envelope: Envelope
    sequence_number: int
    enqueued_time: float
    #: Effective time to live (the message's, capped by the entity defaults); None = never expires.
    ttl: float | None
    expires_at: float | None
    state: MessageState = MessageState.ACTIVE
    delivery_count: int = 0
    lock_token: uuid.UUID | None = None
    locked_until: float | None = None
    lock_owner: object | None = None
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    dead_letter_source: str | None = None
    forward_hops: int = 0
    #: Bumped whenever the message becomes available, so stale heap entries can be recognised.
    available_version: int = 0

    @property
    def session_id(self) -> str | None:
        return self.envelope.session_id

    @property
    def locked(self) -> bool:
        return self.lock_token is not None

    def header_delivery_count(self, *, delivering: bool = False) -> int:
        """The AMQP header's delivery-count: deliveries before the one in progress (or the next one).

        ``delivering`` is true when the message is being handed out right now (a ReceiveAndDelete
        delivery is no longer locked, yet its own delivery must not count).
        """
        in_progress = delivering or self.locked
        return max(0, self.delivery_count - 1) if in_progress else self.delivery_count

    def copy_for(self) -> StoredMessage:
        """A copy for another entity (a subscription, a dead-letter queue), keeping the counters."""
        return StoredMessage(
            envelope=self.envelope,
            sequence_number=self.sequence_number,
            enqueued_time=self.enqueued_time,
            ttl=self.ttl,
            expires_at=self.expires_at,
            delivery_count=self.delivery_count,
            dead_letter_reason=self.dead_letter_reason,
            dead_letter_description=self.dead_letter_description,
            dead_letter_source=self.dead_letter_source,
            forward_hops=self.forward_hops,
        )


@dataclass(eq=False)
class Session:
    session_id: str
    state: bytes | None = None
    owner: object | None = None
    locked_until: float = 0.0
    available: list[tuple[int, int]] = field(default_factory=list)
    message_count: int = 0


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
    """A queue, a subscription, or the dead-letter queue of either: something messages are received from."""

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
        self.sessions: dict[str, Session] = {}
        self._available: list[tuple[int, int]] = []
        self._locks: dict[uuid.UUID, StoredMessage] = {}
        self._lock_heap: list[tuple[float, uuid.UUID]] = []
        self._session_lock_heap: list[tuple[float, str]] = []
        self._ttl_heap: list[tuple[float, int]] = []
        self._session_losses: list[SessionLockExpired] = []
        # Tokens of session messages whose session lock ended: settling them is session-lock-lost.
        self._revoked_session_tokens: OrderedDict[uuid.UUID, str] = OrderedDict()
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

    def _session_key(self, message: StoredMessage) -> str | None:
        """The session a message belongs to here; messages are grouped only where sessions are required."""
        return message.session_id if self.requires_session else None

    # -- arrival ------------------------------------------------------------------------------

    def accept(self, message: StoredMessage, now: float) -> None:
        """A message arrives (sent, activated, or dead-lettered here): forward it if configured, else store it."""
        if self.settings.forward_to and not self.is_dead_letter_queue:
            self.namespace.forward(message, self.settings.forward_to, self, now)
        else:
            self.store(message)

    def store(self, message: StoredMessage) -> None:
        self.messages[message.sequence_number] = message
        session_id = self._session_key(message)
        if session_id is not None:
            self._session(session_id).message_count += 1
        if message.expires_at is not None:
            heapq.heappush(self._ttl_heap, (message.expires_at, message.sequence_number))
        if message.state is not MessageState.DEFERRED:
            self._make_available(message)

    def _make_available(self, message: StoredMessage) -> None:
        message.state = MessageState.ACTIVE
        message.available_version += 1
        entry = (message.sequence_number, message.available_version)
        session_id = self._session_key(message)
        heapq.heappush(self._session(session_id).available if session_id is not None else self._available, entry)

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = Session(session_id)
        return session

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
        heap = session.available if session is not None else self._available
        while heap:
            entry = heapq.heappop(heap)
            if not self._is_live_entry(entry):
                continue
            message = self.messages[entry[0]]
            message.delivery_count += 1
            if peek_lock:
                self._lock(message, owner, now, session)
            else:
                self._remove(message)
            return message
        return None

    def _is_live_entry(self, entry: tuple[int, int]) -> bool:
        message = self.messages.get(entry[0])
        return (
            message is not None
            and message.state is MessageState.ACTIVE
            and not message.locked
            and message.available_version == entry[1]
        )

    def _has_available(self, session: Session) -> bool:
        while session.available and not self._is_live_entry(session.available[0]):
            heapq.heappop(session.available)
        return bool(session.available)

    def _lock(self, message: StoredMessage, owner: object, now: float, session: Session | None) -> None:
        token = uuid.uuid4()
        message.lock_token = token
        message.lock_owner = owner
        if session is not None:
            message.locked_until = session.locked_until
        else:
            message.locked_until = now + self.settings.lock_duration
            heapq.heappush(self._lock_heap, (message.locked_until, token))
        self._locks[token] = message

    def _unlock(self, message: StoredMessage) -> None:
        if message.lock_token is not None:
            self._locks.pop(message.lock_token, None)
        message.lock_token = None
        message.lock_owner = None
        message.locked_until = None

    def _remove(self, message: StoredMessage) -> None:
        self._unlock(message)
        if self.messages.pop(message.sequence_number, None) is None:
            return
        session_id = self._session_key(message)
        if session_id is not None:
            self._session(session_id).message_count -= 1
            self._forget_session_if_idle(session_id)

    def _forget_session_if_idle(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None and session.owner is None and session.state is None and session.message_count <= 0:
            del self.sessions[session_id]

    # -- settlement ---------------------------------------------------------------------------

    def locked_message(self, token: uuid.UUID, now: float) -> StoredMessage:
        """The message locked under ``token``; raises lock-lost (or session-lock-lost) otherwise."""
        self.process_timers(now)
        message = self._locks.get(token)
        if message is None:
            session_id = self._revoked_session_tokens.get(token)
            if session_id is not None:
                raise _session_lock_lost(session_id)
            raise _lock_lost()
        return message

    def settle(
        self,
        token: uuid.UUID,
        outcome: Outcome,
        now: float,
        *,
        dead_letter_reason: str | None = None,
        dead_letter_description: str | None = None,
    ) -> StoredMessage:
        message = self.locked_message(token, now)
        self._unlock(message)
        if outcome is Outcome.COMPLETE:
            self._remove(message)
        elif outcome is Outcome.ABANDON:
            self._return_after_failure(message, now)
        elif outcome is Outcome.RELEASE:
            message.delivery_count = max(0, message.delivery_count - 1)
            self._return(message, now)
        elif outcome is Outcome.DEFER:
            message.state = MessageState.DEFERRED
            self._return(message, now)
        else:
            self._dead_letter(message, dead_letter_reason, dead_letter_description, now)
        return message

    def renew_lock(self, token: uuid.UUID, now: float) -> float:
        message = self.locked_message(token, now)
        if self._session_key(message) is not None:
            raise BrokerError(
                NOT_ALLOWED, "Renewing a message lock is not supported for session messages; renew the session lock."
            )
        message.locked_until = now + self.settings.lock_duration
        heapq.heappush(self._lock_heap, (message.locked_until, token))
        return message.locked_until

    def _return_after_failure(self, message: StoredMessage, now: float) -> None:
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
        while self._lock_heap and self._lock_heap[0][0] <= now:
            _, token = heapq.heappop(self._lock_heap)
            message = self._locks.get(token)
            if message is not None and message.locked_until is not None and message.locked_until <= now:
                self._unlock(message)
                self._return_after_failure(message, now)
        while self._session_lock_heap and self._session_lock_heap[0][0] <= now:
            _, session_id = heapq.heappop(self._session_lock_heap)
            session = self.sessions.get(session_id)
            if session is not None and session.owner is not None and session.locked_until <= now:
                self._session_losses.append(SessionLockExpired(self, session_id, session.owner))
                self.release_session(session_id, session.owner, now)
        while self._ttl_heap and self._ttl_heap[0][0] <= now:
            _, sequence_number = heapq.heappop(self._ttl_heap)
            message = self.messages.get(sequence_number)
            if message is None or message.locked or message.expires_at is None or message.expires_at > now:
                continue  # a locked message expires when its lock ends (see _return)
            self._expire(message, now)

    def take_session_losses(self) -> list[SessionLockExpired]:
        """Session locks that expired since the last call (their receivers must be detached)."""
        losses, self._session_losses = self._session_losses, []
        return losses

    # -- deferred, peek -----------------------------------------------------------------------

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
        self.process_timers(now)
        found = []
        for sequence_number in sequence_numbers:
            message = self.messages.get(sequence_number)
            if (
                message is None
                or message.state is not MessageState.DEFERRED
                or message.locked
                or (session_id is not None and message.session_id != session_id)
            ):
                raise BrokerError(
                    MESSAGE_NOT_FOUND,
                    f"Failed to lock one or more specified messages. The message with sequence number "
                    f"{sequence_number} does not exist or is not deferred.",
                    404,
                )
            found.append(message)
        session = self.sessions.get(session_id) if session_id is not None else None
        for message in found:
            message.delivery_count += 1
            if peek_lock:
                self._lock(message, owner, now, session if session is not None and session.owner is owner else None)
            else:
                self._remove(message)
        return found

    def peek(
        self, from_sequence_number: int, count: int, now: float, *, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Messages in sequence-number order from ``from_sequence_number``, whatever their state."""
        self.process_timers(now)
        numbers = sorted(n for n in self.messages if n >= from_sequence_number)
        result = []
        for number in numbers:
            message = self.messages[number]
            if session_id is None or message.session_id == session_id:
                result.append(message)
                if len(result) >= count:
                    break
        return result

    # -- sessions -----------------------------------------------------------------------------

    def accept_session(self, session_id: str | None, owner: object, now: float) -> Session | None:
        """Lock a session for ``owner``: the named one, or (None) the next with available messages.

        Raises session-cannot-be-locked when the named session is locked by another receiver;
        returns None when no unlocked session has messages (the caller waits, then times out).
        """
        self.process_timers(now)
        if session_id is not None:
            session = self._session(session_id)
            if session.owner is not None and session.owner is not owner:
                raise BrokerError(
                    SESSION_CANNOT_BE_LOCKED,
                    f"The requested session '{session_id}' cannot be accepted. It may be locked by another receiver.",
                    410,
                )
        else:
            # The session whose oldest available message is oldest, as a fair "next available".
            best: tuple[int, Session] | None = None
            for candidate in self.sessions.values():
                if candidate.owner is None and self._has_available(candidate):
                    first = candidate.available[0][0]
                    if best is None or first < best[0]:
                        best = (first, candidate)
            if best is None:
                return None
            session = best[1]
        session.owner = owner
        session.locked_until = now + self.settings.lock_duration
        heapq.heappush(self._session_lock_heap, (session.locked_until, session.session_id))
        return session

    def owned_session(self, session_id: str, owner: object | None, now: float) -> Session:
        """The session if it is locked (by ``owner`` when given); raises session-lock-lost otherwise."""
        self.process_timers(now)
        session = self.sessions.get(session_id)
        if session is None or session.owner is None or (owner is not None and session.owner is not owner):
            raise _session_lock_lost(session_id)
        return session

    def renew_session_lock(self, session_id: str, owner: object | None, now: float) -> float:
        session = self.owned_session(session_id, owner, now)
        session.locked_until = now + self.settings.lock_duration
        heapq.heappush(self._session_lock_heap, (session.locked_until, session_id))
        for message in self._locks.values():
            if message.session_id == session_id and message.lock_owner is session.owner:
                message.locked_until = session.locked_until
        return session.locked_until

    def set_session_state(self, session_id: str, owner: object | None, state: bytes | None, now: float) -> None:
        self.owned_session(session_id, owner, now).state = state

    def release_session(self, session_id: str, owner: object, now: float) -> None:
        """End ``owner``'s lock on a session; its unsettled messages count as failed deliveries."""
        session = self.sessions.get(session_id)
        if session is None or session.owner is not owner:
            return
        session.owner = None
        session.locked_until = 0.0
        for token, message in list(self._locks.items()):
            if message.session_id == session_id and message.lock_owner is owner:
                self._revoked_session_tokens[token] = session_id
                while len(self._revoked_session_tokens) > 10_000:
                    self._revoked_session_tokens.popitem(last=False)
                self._unlock(message)
                self._return_after_failure(message, now)
        self._forget_session_if_idle(session_id)

    def session_ids(self) -> list[str]:
        """Sessions that have messages or state (Service Bus's get-message-sessions)."""
        return sorted(s.session_id for s in self.sessions.values() if s.message_count > 0 or s.state is not None)


class _IntakeOwner(Protocol):
    path: str

    def validate_incoming(self, envelope: Envelope) -> None: ...

    def message_ttl(self, envelope: Envelope) -> float: ...

    def deliver(self, message: StoredMessage, now: float) -> None: ...


class Intake:
    """What queues and topics share as send targets: sequence numbers, duplicate detection, scheduling."""

    def __init__(self, owner: _IntakeOwner, requires_duplicate_detection: bool, window: float) -> None:
        self._owner = owner
        self._next_sequence_number = itertools.count(1)
        self._duplicates = _DuplicateDetector(window) if requires_duplicate_detection else None
        self.scheduled: dict[int, StoredMessage] = {}
        self._schedule_heap: list[tuple[float, int]] = []

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
                heapq.heappush(self._schedule_heap, (at, message.sequence_number))
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
        while self._schedule_heap and self._schedule_heap[0][0] <= now:
            at, number = heapq.heappop(self._schedule_heap)
            message = self.scheduled.pop(number, None)
            if message is not None:
                message.state = MessageState.ACTIVE
                message.enqueued_time = at
                self._owner.deliver(message, now)


class Queue(ReceivableEntity):
    def __init__(self, namespace: Namespace, config: QueueConfig) -> None:
        super().__init__(namespace, config.name, config.settings)
        self.name = config.name
        self.intake = Intake(self, config.requires_duplicate_detection, config.duplicate_detection_window)

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

    def peek(
        self, from_sequence_number: int, count: int, now: float, *, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Peek includes scheduled messages, as Service Bus's does."""
        self.process_timers(now)
        candidates = [
            m
            for m in [*self.messages.values(), *self.intake.scheduled.values()]
            if m.sequence_number >= from_sequence_number and (session_id is None or m.session_id == session_id)
        ]
        return sorted(candidates, key=lambda m: m.sequence_number)[:count]


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
        self.intake = Intake(self, config.requires_duplicate_detection, config.duplicate_detection_window)
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
