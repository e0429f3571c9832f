"""The delivery policy: run one PeekLock delivery (translate, decide, retry, record) and settle it exactly once.

The Functions and the simulator run this one policy. Each brings its side of the broker as a
``SettlementPort`` (the binding's message actions, the simulated queue), and its own ``sleep`` and
``clock``, so the policy that ships is the policy the simulator proves. ``SETTLEMENTS`` is the one
table from outcome to complete, abandon or dead-letter.

A transient failure is tried again inside the lock, ``RETRY_IN_LOCK_ATTEMPTS`` times in all; one that
persists is handed on (``idempotent_consumer.retries``): a copy scheduled on the delivery's own queue, sent
before the delivery is completed, so that a crash between the two leaves the message twice (which the
consumer's key absorbs) and never not at all. The queue's breaker (``idempotent_consumer.breaker``) hands messages
on untried while most attempts fail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from idempotent_consumer import retries
from idempotent_consumer.breaker import Admission, Breaker
from idempotent_consumer.errors import InvalidMessage
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result, abandon_wait
from idempotent_consumer.ports import watched as health
from idempotent_consumer.ports.sender import MessageSender, OutgoingMessage
from idempotent_consumer.retries import Backoff, Chain
from idempotent_consumer.telemetry import record_delivery

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
    Outcome.INVALID_PLAN: Settlement(Action.DEADLETTER, "InvalidPlan"),
    Outcome.PARKED: Settlement(Action.COMPLETE),
    Outcome.REJECTED: Settlement(Action.COMPLETE),
    Outcome.ORDER_CLOSED: Settlement(Action.COMPLETE),
    Outcome.IN_PROGRESS: Settlement(Action.COMPLETE),
    Outcome.DOWNSTREAM_REJECTED: Settlement(Action.DEADLETTER, "DownstreamRejected"),
    Outcome.TRANSIENT: Settlement(Action.ABANDON),
    Outcome.HANDED_ON: Settlement(Action.COMPLETE),
    Outcome.RETRY_LIMIT_EXCEEDED: Settlement(Action.DEADLETTER, retries.RETRY_LIMIT_EXCEEDED),
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
# What needs no dependency to decide: the message's own validity. A final result for a message no dependency
# could help (invalid, past a limit), None for one fit to try.
Check = Callable[[InboundMessage], Result | None]
Recorder = Callable[[str, InboundMessage, Result, float], None]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Retries:
    """How a delivery retries a transient failure: ``attempts`` in all inside its lock, ``wait`` seconds apart
    (also the wait before an abandon), then handed on to ``queue`` through ``sender`` as ``backoff`` says;
    without a backoff, it abandons instead, as with DELAYED_RETRIES false."""

    wait: float = 0.0
    attempts: int = 1
    backoff: Backoff | None = None
    queue: str = ""
    sender: Callable[[], MessageSender] | None = None
    breaker: Breaker | None = None


async def run_delivery(
    function: str, read: Callable[[], InboundMessage], handler: Handler, port: SettlementPort, *,
    retrying: Retries = Retries(), clock: Clock = time.time, sleep: Sleep = asyncio.sleep,
    record: Recorder = record_delivery, check: Check | None = None,
) -> Settlement:
    """Process one PeekLock delivery and settle it exactly once; returns the settlement made.

    ``read`` translates the delivery; a retry copy is read as its original (``retries.unwrap``). Any
    exception from ``read`` or the handler becomes outcome ``error`` (abandon, logged with its stack, ids
    only); only a failed settlement call is raised, for the host to log. A transient outcome is tried again
    and then handed on as ``retrying`` says. ``record`` logs and counts the delivery's final result; if it
    fails, the delivery is still settled. Before an abandon the delivery waits inside its lock. While the
    queue's breaker is open, ``check`` decides first what needs no dependency: an invalid message is
    dead-lettered as it is, never handed on untried (its copy would lose what made it invalid).
    """
    started = time.perf_counter()
    delivered = inbound = InboundMessage(message_id=None, body=None)
    chain: Chain | None = None
    try:
        delivered = inbound = read()
        try:
            inbound, chain = retries.unwrap(delivered)
        except InvalidMessage as exc:
            result = Result(Outcome.INVALID, exc.rule)
        else:
            # The chain's last delivery tries whatever the breaker says: no message is dead-lettered untried.
            last = chain is not None and retrying.backoff is not None and retrying.backoff.next_copy(
                chain, datetime.fromtimestamp(clock(), UTC)) is None
            verdict = check(inbound) if check is not None and retrying.breaker is not None \
                and retrying.breaker.is_open else None
            result = verdict or await _attempts(function, inbound, handler, port, retrying=retrying, clock=clock,
                                                sleep=sleep, last=last)
            if result.outcome is Outcome.TRANSIENT and retrying.backoff is not None:
                result = await _hand_on(function, delivered, inbound, chain, result, retrying=retrying, clock=clock)
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
        await sleep(await _wait_in_lock(function, inbound, port, retrying.wait, clock))
    try:
        await port.settle(settlement, result)
    except Exception:
        # Typically a lost lock. The broker will redeliver; the create absorbs it as a duplicate.
        logger.error("settlement %s failed messageId=%s outcome=%s", settlement.action.value, inbound.message_id,
                     result.outcome.value, extra={"messageId": inbound.message_id, "outcome": result.outcome.value,
                                                  "settlement": settlement.action.value})
        raise
    return settlement


async def _attempts(function: str, inbound: InboundMessage, handler: Handler, port: SettlementPort, *,
                    retrying: Retries, clock: Clock, sleep: Sleep, last: bool = False) -> Result:
    """The handler's result after up to ``retrying.attempts`` tries inside the lock, as the breaker admits (but
    for the ``last`` delivery of a chain, which tries, all its attempts). Only a failure that shows the
    dependency down counts against the breaker: not one where it answered that it is busy or was slow
    (``Result.dependency_up``). What each attempt reached goes with it, for a probe to close the breaker only
    by a call that reached the dependency."""
    breaker = retrying.breaker
    admission = breaker.admit(clock()) if breaker is not None else Admission.TRY
    probe = admission is Admission.PROBE  # the slot is taken, so the attempts say what they found, last or not
    if admission is Admission.HAND_ON and not last:
        return Result(Outcome.TRANSIENT, f"not tried: the {function} breaker is open")
    attempts = 1 if (probe and not last) or retrying.backoff is None else retrying.attempts
    for attempt in range(1, attempts + 1):
        with health.attempt() as reach:
            result = await handler(inbound)
        if breaker is not None:
            breaker.record(result.outcome is Outcome.TRANSIENT and not result.dependency_up, clock(), probe=probe,
                           reach=reach)
        if result.outcome is not Outcome.TRANSIENT or attempt == attempts:
            return result
        wait = await _wait_in_lock(function, inbound, port, retrying.wait, clock)
        if wait < retrying.wait or (breaker is not None and breaker.is_open and not last):
            return result  # the lock cannot hold another wait, or the dependency is down: hand it on now
        await sleep(wait)
    return result


async def _hand_on(function: str, delivered: InboundMessage, inbound: InboundMessage, chain: Chain | None,
                   failure: Result, *, retrying: Retries, clock: Clock) -> Result:
    """Send the message's next copy, scheduled as the backoff says; the delivery is then completed. Past the
    total limit: RETRY_LIMIT_EXCEEDED. A copy that cannot be sent leaves the failure as it was (abandon)."""
    assert retrying.backoff is not None and retrying.sender is not None
    now = datetime.fromtimestamp(clock(), UTC)
    chain = chain or Chain.start(inbound, now)
    due = retrying.backoff.next_copy(chain, now)
    if due is None:
        return Result(Outcome.RETRY_LIMIT_EXCEEDED, retries.limit_description(chain, now, failure.description),
                      failure.request_hash)
    headers = delivered.headers
    copy = OutgoingMessage(
        message_id=retries.copy_message_id(chain), body=delivered.body or b"", correlation_id=delivered.correlation_id,
        session_id=delivered.session_id, subject=headers.subject, content_type=headers.content_type,
        application_properties={**retries.originals(delivered.application_properties),
                                **retries.copy_properties(chain, failure.description)},
        scheduled_enqueue_time=due, reply_to=headers.reply_to, to=headers.to, time_to_live=headers.time_to_live,
    )
    try:
        await retrying.sender().send(retrying.queue, [copy])
    except Exception as exc:
        # Nothing was handed on for sure: the delivery abandons, and the message comes back as it is.
        logger.warning("%s messageId=%s: handing on to %s failed (%s); abandoning instead", function,
                       inbound.message_id, retrying.queue, type(exc).__name__,
                       extra={"messageId": inbound.message_id, "function": function})
        return Result(Outcome.TRANSIENT, f"{failure.description}; handing on failed: {type(exc).__name__}",
                      failure.request_hash)
    return Result(Outcome.HANDED_ON, f"{failure.description}; retry {chain.attempt + 1} due {due.isoformat()}",
                  failure.request_hash)


async def _wait_in_lock(function: str, inbound: InboundMessage, port: SettlementPort, delay: float,
                        clock: Clock) -> float:
    """How long the delivery may wait inside its lock, up to ``delay``: before another attempt or an abandon.

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
        logger.warning("%s messageId=%s: renewing the session lock before waiting failed (%s)", function,
                       inbound.message_id, type(exc).__name__,
                       extra={"messageId": inbound.message_id, "function": function})
        return wait
    return wait if locked_until is None else abandon_wait(delay, locked_until, clock())
