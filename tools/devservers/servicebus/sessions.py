"""Sessions of a session-enabled entity: who holds each session's lock, until when, and its state.

A session exists while it has messages, state or an owner. Its messages are delivered in
sequence-number order from its own ready queue, and only to the receiver holding its lock; their
message locks last as long as the session's lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from devservers.servicebus.config import ReceiverSettings
from devservers.servicebus.errors import SESSION_CANNOT_BE_LOCKED, BrokerError, session_lock_lost
from devservers.servicebus.locks import LockTable
from devservers.servicebus.messages import ReadyQueue, StoredMessage
from devservers.servicebus.timers import Alarm, Deadlines

__all__ = ["Session", "SessionRegistry"]


@dataclass(eq=False)
class Session:
    """One session: its ready messages, its state, and the receiver holding its lock (if any)."""

    session_id: str
    ready: ReadyQueue
    state: bytes | None = None
    owner: object | None = None
    locked_until: float = 0.0
    message_count: int = 0


class _SessionHost(Protocol):
    """What a session registry needs of its entity."""

    @property
    def messages(self) -> Mapping[int, StoredMessage]: ...

    @property
    def settings(self) -> ReceiverSettings: ...

    @property
    def requires_session(self) -> bool: ...

    @property
    def locks(self) -> LockTable: ...

    def process_timers(self, now: float) -> None: ...

    def fail_delivery(self, message: StoredMessage, now: float) -> None: ...

    def undo_delivery(self, message: StoredMessage, now: float) -> None: ...


class SessionRegistry:
    """The sessions of one entity, by id; every operation that takes ``now`` runs the entity's timers first."""

    def __init__(self, entity: _SessionHost, alarm: Alarm | None = None) -> None:
        self._entity = entity
        self._sessions: dict[str, Session] = {}
        self._expiry: Deadlines[str] = Deadlines(alarm)

    # -- the messages of a session ------------------------------------------------------------

    def key(self, message: StoredMessage) -> str | None:
        """The session a message belongs to here; messages are grouped only where sessions are required."""
        return message.session_id if self._entity.requires_session else None

    def of(self, message: StoredMessage) -> Session | None:
        """The session ``message`` belongs to here (created if new), or None outside sessions."""
        session_id = self.key(message)
        return None if session_id is None else self._session(session_id)

    def track(self, message: StoredMessage) -> None:
        """Count a message stored here in its session."""
        session = self.of(message)
        if session is not None:
            session.message_count += 1

    def untrack(self, message: StoredMessage) -> None:
        """Stop counting a message removed from here; an idle session is forgotten."""
        session = self.of(message)
        if session is not None:
            session.message_count -= 1
            self._forget_if_idle(session.session_id)

    # -- session locks ------------------------------------------------------------------------

    def accept(self, session_id: str | None, owner: object, now: float) -> Session | None:
        """Lock a session for ``owner``: the named one, or (None) the next with available messages.

        Raises session-cannot-be-locked when the named session is locked by another receiver;
        returns None when no unlocked session has messages (the caller waits, then times out).
        """
        self._entity.process_timers(now)
        session = self._next_available() if session_id is None else self._session(session_id)
        if session is None:
            return None
        if session.owner is not None and session.owner is not owner:
            raise BrokerError(
                SESSION_CANNOT_BE_LOCKED,
                f"The requested session '{session.session_id}' cannot be accepted. It may be locked by another "
                "receiver.",
                410,
            )
        session.owner = owner
        self._lock_until(session, now + self._entity.settings.lock_duration)
        return session

    def held(self, session_id: str | None, owner: object) -> Session | None:
        """The session named ``session_id`` if ``owner`` holds its lock."""
        session = None if session_id is None else self._sessions.get(session_id)
        return session if session is not None and session.owner is owner else None

    def owned(self, session_id: str, owner: object | None, now: float) -> Session:
        """The session if it is locked (by ``owner`` when given); raises session-lock-lost otherwise."""
        self._entity.process_timers(now)
        session = self._sessions.get(session_id)
        if session is None or session.owner is None or (owner is not None and session.owner is not owner):
            raise session_lock_lost(session_id)
        return session

    def renew(self, session_id: str, owner: object | None, now: float) -> float:
        """Extend the session's lock, and with it the locks of its messages; returns the new expiry."""
        session = self.owned(session_id, owner, now)
        self._lock_until(session, now + self._entity.settings.lock_duration)
        for message in self._entity.locks.held_by(session.owner, session_id):
            message.locked_until = session.locked_until
        return session.locked_until

    def set_state(self, session_id: str, owner: object | None, state: bytes | None, now: float) -> None:
        """Replace the session's state (which outlives its lock)."""
        self.owned(session_id, owner, now).state = state

    def release(self, session_id: str, owner: object, now: float, *, expired: bool = False) -> None:
        """End ``owner``'s lock on a session. Its unsettled messages come back: as failed deliveries when the
        lock ``expired``, uncounted when the receiver closed the session, as Service Bus does ("Impact of
        delivery count" in its message-sessions documentation: a session closed with messages not completed
        does not increment their delivery count; one whose lock expires does)."""
        session = self._sessions.get(session_id)
        if session is None or session.owner is not owner:
            return
        expired = expired or session.locked_until <= now  # closed after its lock ran out, before a timer saw it
        session.owner = None
        session.locked_until = 0.0
        for message in self._entity.locks.held_by(owner, session_id):
            self._entity.locks.revoke(message, session_id)
            if expired:
                self._entity.fail_delivery(message, now)
            else:
                self._entity.undo_delivery(message, now)
        self._forget_if_idle(session_id)

    def expire(self, now: float) -> list[tuple[str, object]]:
        """Release the session locks that ran out by ``now``; returns each as ``(session id, former owner)``."""
        ended = []
        for _, session_id in self._expiry.pop_due(now):
            session = self._sessions.get(session_id)
            if session is not None and session.owner is not None and session.locked_until <= now:
                ended.append((session_id, session.owner))
                self.release(session_id, session.owner, now, expired=True)
        return ended

    def ids(self) -> list[str]:
        """Sessions that have messages or state (Service Bus's get-message-sessions)."""
        return sorted(s.session_id for s in self._sessions.values() if s.message_count > 0 or s.state is not None)

    # -- internals ----------------------------------------------------------------------------

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = Session(session_id, ReadyQueue(self._entity.messages))
        return session

    def _next_available(self) -> Session | None:
        """The unlocked session whose oldest available message is oldest, as a fair "next available"."""
        best: tuple[int, Session] | None = None
        for candidate in self._sessions.values():
            first = candidate.ready.first() if candidate.owner is None else None
            if first is not None and (best is None or first < best[0]):
                best = (first, candidate)
        return None if best is None else best[1]

    def _lock_until(self, session: Session, until: float) -> None:
        session.locked_until = until
        self._expiry.add(until, session.session_id)

    def _forget_if_idle(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None and session.owner is None and session.state is None and session.message_count <= 0:
            del self._sessions[session_id]
