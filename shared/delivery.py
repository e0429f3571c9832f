"""The delivery policy: run one PeekLock delivery (translate, decide, record) and settle it exactly once.

The Functions and the simulator run this one policy. Each brings its side of the broker as a
``SettlementPort`` (the binding's message actions, the simulated queue), and its own ``sleep`` and
``clock``, so the policy that ships is the policy the simulator proves. ``SETTLEMENTS`` is the one
table from outcome to complete, abandon or dead-letter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Outcome, Result, abandon_wait
from shared.telemetry import record_delivery

logger = logging.getLogger("idempotent_consumer.delivery")


class Action(StrEnum):
    """The three explicit settlements a PeekLock delivery can end in."""

    COMPLETE = "complete"
    ABANDON = "abandon"
    DEADLETTER = "deadletter"


@dataclass(frozen=True)
class Settlement:
    """What to do with a delivery; ``reason`` is the dead-letter reason operators alert on."""

    action: Action
    reason: str | None = None


SETTLEMENTS: dict[Outcome, Settlement] = {
    Outcome.CREATED: Settlement(Action.COMPLETE),
    Outcome.APPLIED: Settlement(Action.COMPLETE),
    Outcome.DUPLICATE: Settlement(Action.COMPLETE),
    Outcome.STALE: Settlement(Action.COMPLETE),
    Outcome.PAYLOAD_MISMATCH: Settlement(Action.DEADLETTER, "PayloadMismatch"),
    Outcome.UNREADABLE: Settlement(Action.DEADLETTER, "UnreadableDocument"),
    Outcome.INVALID: Settlement(Action.DEADLETTER, "InvalidMessage"),
    Outcome.INVALID_TRANSITION: Settlement(Action.DEADLETTER, "InvalidTransition"),
    Outcome.LIMIT_EXCEEDED: Settlement(Action.DEADLETTER, "LimitExceeded"),
    Outcome.PARKED: Settlement(Action.COMPLETE),
    Outcome.REJECTED: Settlement(Action.COMPLETE),
    Outcome.IN_PROGRESS: Settlement(Action.COMPLETE),
    Outcome.DOWNSTREAM_REJECTED: Settlement(Action.DEADLETTER, "DownstreamRejected"),
    Outcome.TRANSIENT: Settlement(Action.ABANDON),
    Outcome.ERROR: Settlement(Action.ABANDON),
}


class SettlementPort(Protocol):
    """The broker's side of one delivery: where its one settlement call goes."""

    async def settle(self, settlement: Settlement, result: Result) -> None:
        """Complete, abandon or dead-letter the delivery as ``settlement`` says (a dead-letter carries
        ``result.description``); raise if the broker refused the call, a lost lock say."""

    async def renew_session_lock(self) -> datetime | None:
        """Renew the lock of the session the delivery came from; when it now ends (None when this side
        cannot renew it); raise if the broker refused, a lost session lock say."""


Handler = Callable[[InboundMessage], Awaitable[Result]]
Recorder = Callable[[str, InboundMessage, Result, float], None]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


async def run_delivery(
    function: str, read: Callable[[], InboundMessage], handler: Handler, port: SettlementPort, *,
    abandon_delay: float = 0.0, clock: Clock = time.time, sleep: Sleep = asyncio.sleep,
    record: Recorder = record_delivery,
) -> Settlement:
    """Process one PeekLock delivery and settle it exactly once; returns the settlement made.

    ``read`` translates the delivery. Any exception from it or from the handler becomes outcome
    ``error`` (abandon, logged with its stack, ids only); only a failed settlement call is raised, for
    the host to log. ``record`` logs and counts the delivery; if it fails, the delivery is still
    settled. Before an abandon the delivery waits inside its lock (``abandon_wait`` at ``clock()``),
    so that retries are spread out in time.
    """
    started = time.perf_counter()
    inbound = InboundMessage(message_id=None, body=None)
    try:
        inbound = read()
        result = await handler(inbound)
    except asyncio.CancelledError:
        # Only when the worker stops: no settlement now, so the lock runs out and the broker redelivers.
        logger.warning("%s messageId=%s cancelled before its settlement; redelivered once its lock runs out",
                       function, inbound.message_id, extra={"messageId": inbound.message_id, "function": function})
        raise
    except Exception as exc:
        logger.exception("unexpected %s in %s messageId=%s; abandoning for redelivery", type(exc).__name__,
                         function, inbound.message_id, extra={"messageId": inbound.message_id, "function": function})
        result = Result(Outcome.ERROR, f"unexpected {type(exc).__name__}")
    try:
        record(function, inbound, result, (time.perf_counter() - started) * 1000)
    except Exception:
        # Telemetry must never cost a settlement: the delivery is still settled below.
        logger.exception("recording delivery %s messageId=%s failed", function, inbound.message_id)
    settlement = SETTLEMENTS[result.outcome]
    if settlement.action is Action.ABANDON:
        await sleep(await _wait_before_abandon(function, inbound, port, abandon_delay, clock))
    try:
        await port.settle(settlement, result)
    except Exception:
        # Typically a lost lock. The broker will redeliver; the create absorbs it as a duplicate.
        logger.error("settlement %s failed messageId=%s outcome=%s", settlement.action.value, inbound.message_id,
                     result.outcome.value, extra={"messageId": inbound.message_id, "outcome": result.outcome.value,
                                                  "settlement": settlement.action.value})
        raise
    return settlement


async def _wait_before_abandon(function: str, inbound: InboundMessage, port: SettlementPort, delay: float,
                               clock: Clock) -> float:
    """How long to wait inside the lock before abandoning.

    A session's messages share the session's lock, and an abandoned one comes straight back to the same
    receiver. So a wait that the lock cuts short would spin the message through MaxDeliveryCount in a
    second. When the session lock cannot hold the whole wait, it is renewed first; if that is refused
    (the lock is lost), the abandon fails too and the broker redelivers once the lock has run out.
    """
    wait = abandon_wait(delay, inbound.lock_deadline, clock())
    if wait >= delay or inbound.session_id is None:
        return wait  # a plain queue's redelivery comes with a lock of its own
    try:
        locked_until = await port.renew_session_lock()
    except Exception as exc:
        logger.warning("%s messageId=%s: renewing the session lock before the abandon failed (%s)", function,
                       inbound.message_id, type(exc).__name__,
                       extra={"messageId": inbound.message_id, "function": function})
        return wait
    return wait if locked_until is None else abandon_wait(delay, locked_until, clock())
