"""Reading an entity's messages without taking them: peek, and deferred messages by sequence number."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Protocol

from devservers.servicebus.errors import MESSAGE_NOT_FOUND, BrokerError
from devservers.servicebus.messages import MessageState, StoredMessage

__all__ = ["MessageBrowser"]


class _Browsable(Protocol):
    @property
    def messages(self) -> Mapping[int, StoredMessage]: ...

    def process_timers(self, now: float) -> None: ...


class MessageBrowser:
    """Finds an entity's messages by sequence number; ``scheduled`` are those a queue holds back until due."""

    def __init__(self, entity: _Browsable, scheduled: Mapping[int, StoredMessage] | None = None) -> None:
        self._entity = entity
        self._scheduled: Mapping[int, StoredMessage] = {} if scheduled is None else scheduled

    def peek(
        self, from_sequence_number: int, count: int, now: float, *, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Up to ``count`` messages in sequence-number order from ``from_sequence_number``, whatever their state."""
        self._entity.process_timers(now)
        candidates = [
            m
            for m in chain(self._entity.messages.values(), self._scheduled.values())
            if m.sequence_number >= from_sequence_number and (session_id is None or m.session_id == session_id)
        ]
        return sorted(candidates, key=lambda m: m.sequence_number)[:count]

    def deferred(self, sequence_numbers: Iterable[int], now: float, *, session_id: str | None) -> list[StoredMessage]:
        """The deferred, unlocked messages with these numbers (of the session, if given); all or message-not-found."""
        self._entity.process_timers(now)
        found = []
        for sequence_number in sequence_numbers:
            message = self._entity.messages.get(sequence_number)
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
        return found
