"""The binding's side of settlement: the core's ``Settlement`` carried out by ServiceBusMessageActions.

The binding's settlement calls are blocking gRPC calls, so they run on threads of their own (not the
loop's default pool, which aiohttp's DNS look-ups share), and the loop keeps serving other
deliveries meanwhile. A failed call comes back to the loop, where ``run_delivery`` logs it with the
invocation.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

from idempotent_consumer.delivery import Action, Settlement
from idempotent_consumer.outcomes import Result

# Service Bus caps dead-letter descriptions; keep ours well inside and never include payloads.
MAX_DESCRIPTION_CHARS = 1024
# As many as the host runs deliveries at once (host.json: maxConcurrentCalls 16 + maxConcurrentSessions 32),
# so that no settlement waits for a thread.
SETTLEMENT_THREADS = 48
_settling = ThreadPoolExecutor(SETTLEMENT_THREADS, thread_name_prefix="settle")


class MessageActions(Protocol):
    """The settlement calls of the binding's ServiceBusMessageActions that we use."""

    def complete(self, message: Any) -> None:
        """Complete: the message is removed from the queue."""

    def abandon(self, message: Any) -> None:
        """Abandon: the lock is released and the message is redelivered."""

    def deadletter(
        self, message: Any, deadletter_reason: str | None = None, deadletter_error_description: str | None = None
    ) -> None:
        """Move the message to the dead-letter queue with a reason and description."""

    def renew_session_lock(self, session_id: str) -> Any:
        """Renew the session's lock; when it now ends (a protobuf Timestamp)."""


class ActionsSettlement:
    """The settlement port of one delivery: its message and the binding's message actions."""

    def __init__(self, message: Any, actions: MessageActions, *, sessions: bool = False) -> None:
        self.message = message
        self.actions = actions
        self.sessions = sessions  # whether the trigger is a session trigger: only then is there a lock to renew

    async def settle(self, settlement: Settlement, result: Result) -> None:
        """Make the one settlement call on a settlement thread; a failed call raises here, on the loop."""
        await asyncio.get_running_loop().run_in_executor(_settling, self._call, settlement, result)

    async def renew_session_lock(self) -> datetime | None:
        """Renew the lock of the message's session through the host; when it now ends."""
        session_id = getattr(self.message, "session_id", None)
        if not self.sessions or not session_id:  # a plain queue's message may carry a SessionId too
            return None
        until = await asyncio.get_running_loop().run_in_executor(_settling, self.actions.renew_session_lock,
                                                                 session_id)
        moment: datetime = until.ToDatetime(tzinfo=UTC) if hasattr(until, "ToDatetime") else until
        return moment

    def _call(self, settlement: Settlement, result: Result) -> None:
        if settlement.action is Action.COMPLETE:
            self.actions.complete(self.message)
        elif settlement.action is Action.ABANDON:
            self.actions.abandon(self.message)
        else:
            self.actions.deadletter(
                self.message, deadletter_reason=settlement.reason,
                deadletter_error_description=result.description[:MAX_DESCRIPTION_CHARS] or settlement.reason,
            )
