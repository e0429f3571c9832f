"""Message locks of one entity: which message each lock token holds, until when, and for whom.

A lock that is not bound to a session expires here, at its ``locked_until``. A session message's
lock lasts as long as its session's lock; when that ends its token is remembered, so that settling
it is answered with session-lock-lost rather than message-lock-lost.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterator

from devservers.servicebus.errors import MESSAGE_LOCK_LOST, BrokerError, session_lock_lost
from devservers.servicebus.messages import StoredMessage
from devservers.servicebus.timers import Alarm, Deadlines

__all__ = ["LockTable"]

# Bounds the memory of revoked tokens; a settlement arriving later than that is told message-lock-lost.
REVOKED_TOKENS_KEPT = 10_000


def _lock_lost() -> BrokerError:
    return BrokerError(
        MESSAGE_LOCK_LOST,
        "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the "
        "queue, or was received by a different receiver instance.",
        410,
    )


class LockTable:
    """The message locks held in one entity, by lock token."""

    def __init__(self, alarm: Alarm | None = None) -> None:
        self._held: dict[uuid.UUID, StoredMessage] = {}
        self._expiry: Deadlines[uuid.UUID] = Deadlines(alarm)
        self._revoked: OrderedDict[uuid.UUID, str] = OrderedDict()

    def lock(self, message: StoredMessage, owner: object, until: float, *, expires: bool) -> None:
        """Lock ``message`` for ``owner`` under a new token; ``expires`` is false for locks a session lock bounds."""
        token = uuid.uuid4()
        message.lock_token = token
        message.lock_owner = owner
        message.locked_until = until
        if expires:
            self._expiry.add(until, token)
        self._held[token] = message

    def extend(self, token: uuid.UUID, until: float) -> float:
        """Renew the lock under ``token`` (which must be held) until ``until``."""
        self._held[token].locked_until = until
        self._expiry.add(until, token)
        return until

    def unlock(self, message: StoredMessage) -> None:
        """Release ``message``'s lock, if it has one."""
        if message.lock_token is not None:
            self._held.pop(message.lock_token, None)
        message.lock_token = None
        message.lock_owner = None
        message.locked_until = None

    def revoke(self, message: StoredMessage, session_id: str) -> None:
        """Release a lock because its session's lock ended, remembering the token for later settlements."""
        if message.lock_token is not None:
            self._revoked[message.lock_token] = session_id
            while len(self._revoked) > REVOKED_TOKENS_KEPT:
                self._revoked.popitem(last=False)
        self.unlock(message)

    def held(self, token: uuid.UUID) -> StoredMessage:
        """The message locked under ``token``; raises lock-lost (or session-lock-lost) otherwise."""
        message = self._held.get(token)
        if message is None:
            session_id = self._revoked.get(token)
            if session_id is not None:
                raise session_lock_lost(session_id)
            raise _lock_lost()
        return message

    def held_by(self, owner: object, session_id: str) -> list[StoredMessage]:
        """The messages of session ``session_id`` that ``owner`` holds locked."""
        return [m for m in self._held.values() if m.session_id == session_id and m.lock_owner is owner]

    def expire(self, now: float) -> Iterator[StoredMessage]:
        """Release the locks that ran out by ``now``, yielding each message as its lock is released."""
        for _, token in self._expiry.pop_due(now):
            message = self._held.get(token)
            if message is not None and message.locked_until is not None and message.locked_until <= now:
                self.unlock(message)
                yield message
